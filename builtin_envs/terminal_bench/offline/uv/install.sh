#!/bin/sh
# uv's installer, offline (aenv-ray, terminal-bench@1.0.0): installs the offline uv, which
# runs the instance's own Python and its pytest, into ~/.local/bin, with the `env` file that
# puts it on PATH, as uv's installer does.
set -e
dir="${UV_INSTALL_DIR:-${XDG_BIN_HOME:-$HOME/.local/bin}}"
mkdir -p "$dir"
ln -sf "$TB_OFFLINE/uv/uv" "$dir/uv"
cat > "$dir/env" <<ENV
#!/bin/sh
# add binaries to PATH if they aren't added yet
case ":\${PATH}:" in
    *:"$dir":*) ;;
    *) export PATH="$dir:\$PATH" ;;
esac
ENV
echo "downloading uv (aenv-ray offline: the instance's Python and its pytest stand in)"
echo "no checksums to verify"
echo "installing to $dir"
echo "  uv"
echo "everything's installed!"
