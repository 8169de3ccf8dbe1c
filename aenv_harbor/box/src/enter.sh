# Run by harbor_box.py inside `unshare --mount` (a mount namespace of this command's own):
# bind the instance's system directories into the box's root, then run the rest (chroot ROOT
# env -i ... bash -c ...).
#   sh enter.sh ROOT DIR... -- CHROOT ROOT COMMAND...
set -e
root=$1
shift
while [ "$1" != "--" ]; do
    mount --rbind "/$1" "$root/$1"
    shift
done
shift
exec "$@"
