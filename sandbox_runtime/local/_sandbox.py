"""The filesystem and namespace recipe of an isolated instance, as root or unprivileged.

Up to four steps, in three processes (see ``zygote.py`` for who runs which):

0. :func:`enter_own_user_namespace` (the zygote, first thing, **unprivileged only**): root of a
   user namespace of its own, where only the invoking user is mapped (to root), then pid 1 of a
   pid namespace owned by that user namespace. The calling process stays outside and only waits.
   Everything below then works as it does for root: the zygote holds every capability over the
   namespaces it creates, and may return to its own pid namespace after starting an instance in
   a new one (``setns`` needs ``CAP_SYS_ADMIN`` in the user namespace owning the target: the host's
   pid namespace is out of reach, its own is not).
1. :func:`enter_template_root` (the zygote, once): a private mount namespace whose root is a small
   tmpfs holding read-only binds of what the runtime needs (``/usr``, ``/etc``, the Python
   installation, the virtual environment, the environment project, the packages' sources), a
   ``/proc`` of the zygote's own pid namespace (its children's pids are read there), empty
   ``/tmp``, ``/workspace``, ``/data`` and ``/storage``, and ``/dev`` (null, zero, random,
   urandom). The host's root stays reachable at ``/.host`` for the next step only.
2. :func:`enter_instance_namespaces` (the instance's pid 1 or runtime, forked by the zygote into a
   new pid namespace, still the zygote's root): new mount, network, ipc and uts namespaces; a
   size-limited tmpfs on ``/tmp`` and ``/workspace``, owned by the instance's root; the
   datasource bound read-only on ``/data``, the storage directory read-write (nosuid, nodev)
   on ``/storage``; ``/.host`` detached; loopback up (unless the network is allowed: then the
   host's network namespace is kept).
3. :func:`become_instance_root` (the same process): ``/proc`` of its own pid namespace, then a
   user namespace and a mount namespace owned by it, so every mount made so far is locked
   (cannot be unmounted or made writable from inside). Its root is :func:`instance_root` outside:
   ``nobody`` when the engine runs as root; unprivileged, the invoking user (the only id mapped).

Unprivileged, mounting a ``/proc`` needs a fully visible one already in the mount namespace (the
kernel refuses to reveal what an overmount hides): the host's in step 1, the zygote's in step 3.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sandbox_runtime.local import _linux as L

__all__ = [
    "HOST",
    "NOBODY",
    "become_instance_root",
    "enter_instance_namespaces",
    "enter_own_user_namespace",
    "enter_template_root",
    "instance_root",
    "namespaces_available",
    "runtime_paths",
    "write_id_maps",
]

HOST = "/.host"
INIT = "/.aenv-init"
NOBODY = 65534
_ROOT_DIRS = ("proc", "dev", "tmp", "workspace", "data", "storage", HOST.lstrip("/"))
_DEVICES = ("null", "zero", "full", "random", "urandom")
_PROC_FLAGS = L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC


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


def runtime_paths(project: Path) -> list[Path]:
    """Host paths the instance must see read-only: system, Python, packages, the project."""
    wanted = {Path("/usr"), Path("/etc"), project.resolve()}
    for prefix in {sys.base_prefix, sys.prefix, sys.exec_prefix}:
        wanted.add(Path(prefix).resolve())
    for entry in sys.path:
        if entry and Path(entry).is_dir():
            wanted.add(Path(entry).resolve())
    import aenv_ray
    import builtin_envs
    import sandbox_runtime

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


def enter_template_root(binds: Iterable[Path], *, init: Path | None = None) -> str | None:
    """Step 1: pivot this process (root of its user namespace) into a new template root.

    ``init``, the compiled pid 1 of instances, is copied in; returns its path inside (or None).
    """
    L.unshare(L.CLONE_NEWNS)
    L.mount(None, "/", None, L.MS_REC | L.MS_PRIVATE)
    root = tempfile.mkdtemp(prefix="aenv-root-", dir="/tmp")  # a mount point on the host, no more
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
    for name in _ROOT_DIRS:
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


def enter_instance_namespaces(
    *,
    hostname: str,
    network: bool,
    tmp_bytes: int,
    workspace_bytes: int,
    datasource: str | None,
    root_uid: int,
    storage: str | None = None,
) -> None:
    """Step 2 (in a new pid namespace, still the zygote's root): namespaces and mounts.

    ``root_uid`` (:func:`instance_root`) owns ``/tmp`` and ``/workspace``; ``datasource`` and
    ``storage`` are absolute host paths (or None).
    """
    flags = L.CLONE_NEWNS | L.CLONE_NEWIPC | L.CLONE_NEWUTS
    if not network:
        flags |= L.CLONE_NEWNET
    L.unshare(flags)
    opts = f"uid={root_uid},gid={root_uid}"
    L.mount(
        "tmpfs", "/tmp", "tmpfs", L.MS_NOSUID | L.MS_NODEV, f"mode=1777,size={tmp_bytes},{opts}"
    )
    L.mount(
        "tmpfs",
        "/workspace",
        "tmpfs",
        L.MS_NOSUID | L.MS_NODEV,
        f"mode=755,size={workspace_bytes},{opts}",
    )
    if datasource:
        L.bind_mount(HOST + str(Path(datasource).resolve()), "/data", read_only=True)
    if storage:
        _bind_writable(HOST + str(Path(storage).resolve()), "/storage")
    L.umount(HOST)
    if not network:
        L.loopback_up()
    L.sethostname(hostname)


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


def become_instance_root(wait_for_maps: object) -> None:
    """Step 3 (the instance's pid 1 or runtime): own ``/proc``, then drop to a user namespace.

    ``wait_for_maps()`` must return once the zygote has written this process's ``uid_map`` and
    ``gid_map`` (:func:`write_id_maps`); only a process outside can do that.
    """
    L.mount("proc", "/proc", "proc", _PROC_FLAGS)  # over the zygote's: locked there from now on
    L.unshare(L.CLONE_NEWUSER | L.CLONE_NEWNS)
    wait_for_maps()  # type: ignore[operator]
    os.setgid(0)  # root inside (supplementary groups: denied by the map)
    os.setuid(0)
    L.set_no_new_privs()


def write_id_maps(pid: int, root_uid: int) -> None:
    """From the zygote: map root in ``pid``'s new user namespace to ``root_uid`` (and gid).

    ``pid`` is as the zygote's ``fork`` returned it: read in the zygote's own ``/proc``.
    """
    _write_maps(f"/proc/{pid}", root_uid, root_uid)


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
