"""The filesystem and namespace recipe of isolated templates and instances, root or not.

Five steps, in four kinds of process (``zygote.py`` says who runs which):

0. :func:`enter_own_user_namespace` (the zygote, first thing, **unprivileged only**): root of a
   user namespace of its own, where only the invoking user is mapped (to root), then pid 1 of a
   pid namespace owned by that user namespace. The calling process stays outside and only waits.
   Everything below then works as it does for root.
1. :func:`enter_template_root` (the zygote, once): a private mount namespace whose root is a small
   tmpfs holding read-only binds of what the runtime needs (``/usr``, ``/etc``, the Python
   installation, the virtual environment, the environment project, the packages' sources), a
   ``/proc`` of the zygote's own pid namespace, empty ``/tmp``, ``/workspace`` (and the
   definition's ``deployConfig.workspace``, when it names another directory), ``/data`` and
   ``/storage``, and ``/dev`` (null, zero, full, random, urandom). The host's root stays
   reachable at ``/.host`` for the next step only. **No environment code has run yet, and none
   ever runs in the zygote.**
2. :func:`enter_template_sandbox` (a template, forked by the zygote, still privileged): new
   mount, ipc, uts and (unless the definition asks for network) network namespaces; a private
   **copy** of the project (read-only; the template's user can read it whatever the host's
   modes); a small private ``/tmp``; the datasource bound read-only on ``/data``, the storage
   directory read-write (nosuid, nodev) on ``/storage``; ``/.host`` detached.
   Then :func:`drop_to_new_user_namespace`: root of a new user namespace whose root is
   :func:`instance_root` outside (``nobody`` for a root engine), every mount locked, no new
   privileges. Only now does the template import the environment's modules.
3. :func:`enter_instance_sandbox` (an instance, forked by its template into a new pid
   namespace): its own mount, ipc, uts and network namespaces, size-limited tmpfs on ``/tmp``
   and its workspace, its own ``/proc``; then :func:`drop_to_new_user_namespace` again (its
   template maps it): the instance has no capability over its template's namespaces, its
   siblings' or the host's.
4. A fork of a running instance repeats step 3 from inside that instance (``_instance.py``),
   with copies of the workspace and ``/tmp``.

Paths the runtime needs that live under ``/tmp`` (a virtual environment there, a project
there) stay visible: every private ``/tmp`` binds them again (:func:`private_tmp`).

Unprivileged, mounting a ``/proc`` needs a fully visible one already in the mount namespace (the
kernel refuses to reveal what an overmount hides): the host's in step 1, the template's in
steps 2 and 3.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from local_backend import _linux as L

__all__ = [
    "HOST",
    "MAX_PROJECT_BYTES",
    "NOBODY",
    "ProjectTooLarge",
    "check_workspace_free",
    "copy_tree",
    "drop_to_new_user_namespace",
    "enter_instance_sandbox",
    "enter_own_user_namespace",
    "enter_template_root",
    "enter_template_sandbox",
    "instance_root",
    "mount_own_proc",
    "namespaces_available",
    "private_tmp",
    "runtime_paths",
    "under_tmp",
    "write_id_maps",
]

HOST = "/.host"
INIT = "/.aenv-init"
NOBODY = 65534
_ROOT_DIRS = ("proc", "dev", "tmp", "workspace", "data", "storage", HOST.lstrip("/"))
_DEVICES = ("null", "zero", "full", "random", "urandom")
_PROC_FLAGS = L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC
MAX_PROJECT_BYTES = 512 << 20
"""Bytes of a project a template copies (its sources and data files); more is an error."""
_TEMPLATE_TMP = 32 << 20  # the template's own /tmp (import-time scratch)
_PR_SET_DUMPABLE = 4


class ProjectTooLarge(OSError):
    """The project directory holds more than :data:`MAX_PROJECT_BYTES`."""


def instance_root(privileged: bool) -> int:
    """The uid (and gid) an instance's root has in the zygote's user namespace.

    Root mode: ``nobody``. Unprivileged: the zygote's own root, which is the invoking user on the
    host (the one id its user namespace maps).
    """
    return NOBODY if privileged else 0


def _write_maps(proc_pid: str, uid: int, gid: int) -> None:
    """Map root of the user namespace of ``proc_pid`` (a ``/proc/PID`` path) to ``uid:gid``."""
    maps = (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1"))
    for name, text in maps:
        with open(f"{proc_pid}/{name}", "w") as handle:
            handle.write(text)


def enter_own_user_namespace() -> None:
    """Step 0, unprivileged: become root of an own user namespace and pid 1 of an own pid namespace.

    Returns in a child that is pid 1 of the new pid namespace and dies (``SIGKILL``) with this
    process. This process never returns: it closes its descriptors, waits for that child and exits
    with its status, so stopping it (``SIGTERM``) stops the child as well.
    """
    uid, gid = os.geteuid(), os.getegid()
    L.unshare(L.CLONE_NEWUSER)
    _write_maps("/proc/self", uid, gid)
    L.unshare(L.CLONE_NEWPID)
    child = os.fork()
    if child == 0:
        L.set_parent_death_signal(signal.SIGKILL)
        return
    # the control socket among them: the engine sees its end close when the child exits
    os.closerange(3, 1 << 16)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def runtime_paths(project: Path, extra: Iterable[str] = ()) -> list[Path]:
    """Host paths the instance must see read-only: system, Python, packages, the project, and
    ``extra`` (a built-in's host data: ``builtin_envs.host_data``)."""
    wanted = {Path("/usr"), Path("/etc"), project.resolve(), *(Path(p).resolve() for p in extra)}
    for prefix in {sys.base_prefix, sys.prefix, sys.exec_prefix}:
        wanted.add(Path(prefix).resolve())
    for entry in sys.path:
        if entry and Path(entry).is_dir():
            wanted.add(Path(entry).resolve())
    import aenv_ray
    import builtin_envs
    import sandbox_runtime

    wanted.add(Path(__file__).resolve().parent.parent)  # this package's (local_backend's)
    for module in (aenv_ray, sandbox_runtime, builtin_envs):
        wanted.add(Path(module.__file__ or "").resolve().parent.parent)
    # keep the outermost of nested paths; /usr and /etc cover their subtrees
    kept: list[Path] = []
    for path in sorted(wanted, key=lambda p: len(p.parts)):
        if str(path) == "/" or any(path.is_relative_to(k) for k in kept):
            continue
        kept.append(path)
    return kept


def _mkdirs(root: str, path: str) -> str:
    target = root + path
    os.makedirs(target, exist_ok=True)
    return target


def check_workspace_free(workspace: str, binds: Iterable[Path]) -> None:
    """Refuse a workspace (``deployConfig.workspace``, one directory right under ``/``) that
    would cover or sit inside what the instances must see (:func:`runtime_paths`)."""
    top = Path(workspace)
    for path in binds:
        if path == top or path.is_relative_to(top) or top.is_relative_to(path):
            raise ValueError(
                f"deployConfig.workspace `{workspace}` would hide {path}, which the runtime "
                "needs on this machine; choose another directory such as /app"
            )


def enter_template_root(
    binds: Iterable[Path],
    *,
    init: Path | None = None,
    workspace: str = "/workspace",
    owner: str = "",
) -> str | None:
    """Step 1: pivot this process (root of its user namespace) into a new template root.

    Its mount point on the host, ``/tmp/aenv-root-OWNER-*`` for the engine ``owner``, lives
    until the pivot: what names no engine would be nobody's to clean up.

    ``init``, the compiled pid 1 of instances, is copied in; returns its path inside (or None).
    ``workspace`` (:func:`check_workspace_free`) gets an empty directory, where instances mount
    theirs.
    """
    L.unshare(L.CLONE_NEWNS)
    L.mount(None, "/", None, L.MS_REC | L.MS_PRIVATE)
    prefix = f"aenv-root-{owner}-" if owner else "aenv-root-"
    root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # a mount point on the host, no more
    L.mount("tmpfs", root, "tmpfs", L.MS_NOSUID | L.MS_NODEV, "mode=755,size=4m")
    for path in binds:
        if path.is_dir():
            L.bind_mount(str(path), _mkdirs(root, str(path)))
    for name in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), f"{root}/{name}")
        elif host.is_dir() and not any(host.is_relative_to(str(b)) for b in binds):
            L.bind_mount(str(host), _mkdirs(root, str(host)))
    for name in (*_ROOT_DIRS, workspace.lstrip("/")):
        os.makedirs(f"{root}/{name}", exist_ok=True)
    if init is not None:
        shutil.copyfile(init, f"{root}{INIT}")
        os.chmod(f"{root}{INIT}", 0o555)
    os.chmod(f"{root}/tmp", 0o1777)
    # this process's pid namespace, where its children's pids mean something (unprivileged: not
    # the host's); mounted while the host's /proc is still visible
    L.mount("proc", f"{root}/proc", "proc", _PROC_FLAGS)
    L.mount("tmpfs", f"{root}/dev", "tmpfs", L.MS_NOSUID | L.MS_NOEXEC, "mode=755,size=64k")
    for device in _DEVICES:
        target = f"{root}/dev/{device}"
        Path(target).touch()
        L.mount(f"/dev/{device}", target, None, L.MS_BIND)
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(to, f"{root}/dev/{link}")
    os.symlink("/proc/self/fd/1", f"{root}/dev/stdout")
    os.symlink("/proc/self/fd/2", f"{root}/dev/stderr")
    os.chdir(root)
    L.pivot_root(".", HOST.lstrip("/"))
    os.chdir("/")
    with contextlib.suppress(OSError):  # the now unused mount point on the host
        os.rmdir(HOST + root)
    # the root tmpfs itself becomes read-only: nothing new appears at the top level
    L.mount(None, "/", None, L.MS_REMOUNT | L.MS_BIND | L.MS_RDONLY | L.MS_NOSUID | L.MS_NODEV)
    return INIT if init is not None else None


def under_tmp(paths: Iterable[Path | str]) -> list[str]:
    """The ``paths`` below ``/tmp``: what a private ``/tmp`` must bind again."""
    return sorted({str(p) for p in paths if Path(p).is_relative_to("/tmp") and str(p) != "/tmp"})


def private_tmp(size: int, *, keep: Iterable[str] = (), owner: int = 0) -> None:
    """Mount a fresh tmpfs of ``size`` bytes on ``/tmp`` (mode 1777, owned by ``owner`` as this
    user namespace sees it), then bind the paths in ``keep`` (below ``/tmp``) again, read-only,
    from what the new mount hides."""
    hidden = []
    for path in keep:
        with contextlib.suppress(OSError):
            hidden.append((path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    try:
        opts = f"mode=1777,size={size},uid={owner},gid={owner}"
        L.mount("tmpfs", "/tmp", "tmpfs", L.MS_NOSUID | L.MS_NODEV, opts)
        for path, fd in hidden:
            os.makedirs(path, exist_ok=True)
            L.bind_mount(f"/proc/self/fd/{fd}", path, read_only=True)
    finally:
        for _, fd in hidden:
            os.close(fd)


def copy_tree(source_fd: int, target: str, *, limit: int = MAX_PROJECT_BYTES) -> int:
    """Copy the directory open as ``source_fd`` into ``target``; return the bytes copied.

    Never follows a link (symbolic links are copied as links; a name swapped for a link during
    the copy is refused by ``O_NOFOLLOW``), copies regular files and directories only (no
    devices, fifos or sockets), skips hidden entries and ``__pycache__``, and gives everything
    world-readable modes (executables stay executable): the copy is for a less privileged user.
    """
    copied = 0

    def walk(dir_fd: int, into: str) -> None:
        nonlocal copied
        os.makedirs(into, mode=0o755, exist_ok=True)
        with os.scandir(dir_fd) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            if name.startswith(".") or name == "__pycache__":
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            path = os.path.join(into, name)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=dir_fd), path)
            elif stat.S_ISDIR(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    walk(fd, path)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode):
                copied += st.st_size
                if copied > limit:
                    raise ProjectTooLarge(
                        f"the project holds more than {limit >> 20} MiB; keep large data "
                        "out of it (give it as a datasource)"
                    )
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                fd = os.open(name, flags, dir_fd=dir_fd)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        continue
                    mode = 0o755 if st.st_mode & 0o111 else 0o644
                    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                    try:
                        while chunk := os.read(fd, 1 << 20):
                            os.write(out, chunk)
                    finally:
                        os.close(out)
                finally:
                    os.close(fd)

    walk(source_fd, target)
    return copied


def enter_template_sandbox(
    *,
    project: str,
    network: bool,
    keep_under_tmp: Iterable[str],
    root_uid: int,
    datasource: str | None = None,
    storage: str | None = None,
) -> None:
    """Step 2, before the user namespace: namespaces and mounts of a template.

    ``project`` is covered by a read-only copy of itself (:func:`copy_tree`); ``root_uid``
    (:func:`instance_root`) will own the template's ``/tmp``; ``datasource`` and ``storage``
    are absolute host paths (or None).
    """
    flags = L.CLONE_NEWNS | L.CLONE_NEWIPC | L.CLONE_NEWUTS
    if not network:
        flags |= L.CLONE_NEWNET
    L.unshare(flags)
    source = os.open(project, os.O_RDONLY | os.O_DIRECTORY)  # before /tmp may hide it
    keep = sorted(set(keep_under_tmp) - {project}, key=lambda p: len(Path(p).parts))
    hidden = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep}
    try:
        opts = f"mode=1777,size={_TEMPLATE_TMP},uid={root_uid},gid={root_uid}"
        L.mount("tmpfs", "/tmp", "tmpfs", L.MS_NOSUID | L.MS_NODEV, opts)
        inside = [p for p in keep if Path(p).is_relative_to(project)]
        for path in (p for p in keep if p not in inside):
            os.makedirs(path, exist_ok=True)
            L.bind_mount(f"/proc/self/fd/{hidden[path]}", path, read_only=True)
        with contextlib.suppress(FileExistsError):
            os.makedirs(project)
        L.mount("tmpfs", project, "tmpfs", L.MS_NOSUID | L.MS_NODEV, "mode=755")
        copy_tree(source, project)
        for path in inside:  # e.g. a virtual environment inside the project directory
            os.makedirs(path, exist_ok=True)
            L.bind_mount(f"/proc/self/fd/{hidden[path]}", path, read_only=True)
        L.mount(None, project, None, L.MS_REMOUNT | L.MS_RDONLY | L.MS_NOSUID | L.MS_NODEV)
    finally:
        os.close(source)
        for fd in hidden.values():
            os.close(fd)
    if datasource:
        L.bind_mount(HOST + str(Path(datasource).resolve()), "/data", read_only=True)
    if storage:
        _bind_writable(HOST + str(Path(storage).resolve()), "/storage")
    L.umount(HOST)
    if not network:
        L.loopback_up()
    L.sethostname("aenv-template")


def enter_instance_sandbox(
    *,
    hostname: str,
    own_network: bool,
    tmp_bytes: int,
    workspace_bytes: int,
    keep_under_tmp: Iterable[str],
    workspace: str = "/workspace",
) -> None:
    """Step 3 (an instance, root of its template's user namespace, in a new pid namespace):
    its namespaces, ``/tmp`` and its workspace (``/workspace``, or ``deployConfig.workspace``),
    and a ``/proc`` of its pid namespace."""
    flags = L.CLONE_NEWNS | L.CLONE_NEWIPC | L.CLONE_NEWUTS
    if own_network:
        flags |= L.CLONE_NEWNET
    L.unshare(flags)
    private_tmp(tmp_bytes, keep=keep_under_tmp)
    L.mount(
        "tmpfs",
        workspace,
        "tmpfs",
        L.MS_NOSUID | L.MS_NODEV,
        f"mode=755,size={workspace_bytes},uid=0,gid=0",
    )
    mount_own_proc()
    if own_network:
        L.loopback_up()
    L.sethostname(hostname)


def mount_own_proc() -> None:
    """A ``/proc`` of this process's pid namespace, over the one it sees now."""
    L.mount("proc", "/proc", "proc", _PROC_FLAGS)


def _bind_writable(source: str, target: str) -> None:
    """Bind ``source`` on ``target`` read-write, adding nosuid and nodev.

    The flags the source's mount has and a user namespace may not clear (read-only, noexec;
    its atime flags a remount keeps by itself) are kept: unprivileged, dropping one is EPERM.
    """
    L.mount(source, target, None, L.MS_BIND | L.MS_REC)
    found = os.statvfs(target).f_flag
    kept = (L.MS_NOEXEC if found & os.ST_NOEXEC else 0) | (
        L.MS_RDONLY if found & os.ST_RDONLY else 0
    )
    L.mount(None, target, None, L.MS_BIND | L.MS_REMOUNT | L.MS_NOSUID | L.MS_NODEV | kept)


def drop_to_new_user_namespace(wait_for_maps: Callable[[], None], *, dumpable: bool) -> None:
    """Become root of a new user namespace (and mount namespace: every mount so far is locked,
    it cannot be unmounted or made writable from inside), with no new privileges ever.

    ``wait_for_maps()`` returns once a process outside has written this process's ``uid_map``
    and ``gid_map`` (:func:`write_id_maps`). ``dumpable``: keep ``/proc/self`` owned by this
    user, so that it can write the id maps of the namespaces its children create (a template).
    """
    L.unshare(L.CLONE_NEWUSER | L.CLONE_NEWNS)
    wait_for_maps()
    os.setgid(0)  # root inside (supplementary groups: denied by the map)
    os.setuid(0)
    if dumpable:  # changing uid cleared it
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    L.set_no_new_privs()


def write_id_maps(pid: int, outside_uid: int) -> None:
    """Map root of ``pid``'s new user namespace to ``outside_uid`` (and gid) of ours.

    ``pid`` is as this process's ``fork`` returned it: read in this process's own ``/proc``.
    """
    _write_maps(f"/proc/{pid}", outside_uid, outside_uid)


def namespaces_available() -> str | None:
    """``None`` when this process can build sandboxes, else why not (one sentence).

    Root or not, a short-lived interpreter tries what an instance needs (its user, mount, pid,
    network, ipc and uts namespaces, id maps, a ``/proc`` of its own); the answer is cached.
    """
    if not sys.platform.startswith("linux"):
        return f"namespaces need Linux, this is {sys.platform}"
    with contextlib.suppress(OSError, ValueError):
        if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
            return "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)"
    return _probe()


# run by a fresh interpreter; argv: the CLONE_NEWUSER, CLONE_NEWNS, other namespaces, and mount
# flags for "/" and for /proc
_PROBE = """
import ctypes, os, sys
user, mount, others, private, proc = (int(arg) for arg in sys.argv[1:])
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        print(what + ": " + os.strerror(ctypes.get_errno()), flush=True)
        os._exit(1)
uid, gid = os.geteuid(), os.getegid()
if uid != 0:
    check(libc.unshare(user | mount), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        try:
            with open("/proc/self/" + name, "w") as handle:
                handle.write(text)
        except OSError as exc:
            print(f"writing /proc/self/{name}: {exc.strerror}", flush=True)
            os._exit(1)
check(libc.unshare(mount | others), "unshare(CLONE_NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS)")
child = os.fork()
if child == 0:
    check(libc.mount(None, b"/", None, ctypes.c_ulong(private), None), "making / private")
    check(libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(proc), None), "mounting /proc")
    check(libc.unshare(user | mount), "a nested unshare(CLONE_NEWUSER|CLONE_NEWNS)")
    os._exit(0)
os._exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


@functools.cache
def _probe() -> str | None:
    who = "root" if os.geteuid() == 0 else "an unprivileged user (user namespaces)"
    others = L.CLONE_NEWPID | L.CLONE_NEWNET | L.CLONE_NEWIPC | L.CLONE_NEWUTS
    flags = (L.CLONE_NEWUSER, L.CLONE_NEWNS, others, L.MS_REC | L.MS_PRIVATE, _PROC_FLAGS)
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE, *map(str, flags)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probing for namespaces failed ({exc})"
    if result.returncode == 0:
        return None
    why = result.stdout.strip() or result.stderr.strip() or f"exit {result.returncode}"
    return f"this kernel does not let {who} build the namespaces of an instance ({why[-200:]})"
