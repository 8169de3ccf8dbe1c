"""The filesystem and namespace recipe of an isolated instance.

Three steps, in three processes (see ``zygote.py`` for who runs which):

1. :func:`enter_template_root` (the zygote, once): a private mount namespace whose root is a small
   tmpfs holding read-only binds of what the runtime needs (``/usr``, ``/etc``, the Python
   installation, the virtual environment, the environment project, the packages' sources) and
   empty ``/tmp``, ``/workspace``, ``/data``, ``/proc`` and ``/dev`` (null, zero, random, urandom).
   The host's root stays reachable at ``/.host`` for the next step only.
2. :func:`enter_instance_namespaces` (the instance's pid 1, forked by the zygote into a new pid
   namespace, still host root): new mount, network, ipc and uts namespaces; a size-limited tmpfs
   on ``/tmp`` and ``/workspace``; the datasource bound read-only on ``/data``; ``/.host``
   detached; loopback up (unless the network is allowed: then the host's network namespace is
   kept).
3. :func:`become_instance_root` (the instance's pid 1): ``/proc`` of its own pid namespace, then a
   user namespace whose root is ``nobody`` on the host and a mount namespace owned by it, so every
   mount made so far is locked (cannot be unmounted or made writable from inside).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from sandbox_runtime.local import _linux as L

__all__ = [
    "HOST",
    "NOBODY",
    "become_instance_root",
    "enter_instance_namespaces",
    "enter_template_root",
    "namespaces_available",
    "runtime_paths",
    "write_id_maps",
]

HOST = "/.host"
INIT = "/.aenv-init"
NOBODY = 65534
_ROOT_DIRS = ("proc", "dev", "tmp", "workspace", "data", HOST.lstrip("/"))
_DEVICES = ("null", "zero", "full", "random", "urandom")


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


def enter_template_root(
    root: str, binds: Iterable[Path], *, init: Path | None = None
) -> str | None:
    """Step 1: pivot this process (root, in no sandbox yet) into the template root at ``root``.

    ``init``, the compiled pid 1 of instances, is copied in; returns its path inside (or None).
    """
    L.unshare(L.CLONE_NEWNS)
    L.mount(None, "/", None, L.MS_REC | L.MS_PRIVATE)
    os.makedirs(root, exist_ok=True)
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
) -> None:
    """Step 2 (pid 1 of a new pid namespace, still host root): namespaces and mounts."""
    flags = L.CLONE_NEWNS | L.CLONE_NEWIPC | L.CLONE_NEWUTS
    if not network:
        flags |= L.CLONE_NEWNET
    L.unshare(flags)
    opts = f"uid={NOBODY},gid={NOBODY}"
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
    L.umount(HOST)
    if not network:
        L.loopback_up()
    L.sethostname(hostname)


def become_instance_root(wait_for_maps: object) -> None:
    """Step 3 (the instance's pid 1): own ``/proc``, then drop to a user namespace.

    ``wait_for_maps()`` must return once the parent namespace has written this process's
    ``uid_map``/``gid_map`` (``0 -> nobody``); only a process outside can do that.
    """
    L.mount("proc", "/proc", "proc", L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC)
    L.unshare(L.CLONE_NEWUSER | L.CLONE_NEWNS)
    wait_for_maps()  # type: ignore[operator]
    os.setgid(0)  # root inside, nobody outside (supplementary groups: denied by the map)
    os.setuid(0)
    L.set_no_new_privs()


def write_id_maps(pid: int) -> None:
    """From the parent user namespace: map root in ``pid``'s new user namespace to nobody."""
    proc = HOST + "/proc" if os.path.isdir(HOST + "/proc/self") else "/proc"  # zygote: host's
    maps = (("setgroups", "deny"), ("uid_map", f"0 {NOBODY} 1"), ("gid_map", f"0 {NOBODY} 1"))
    for name, text in maps:
        with open(f"{proc}/{pid}/{name}", "w") as handle:
            handle.write(text)


def namespaces_available() -> str | None:
    """``None`` when this process can build sandboxes, else why not (one sentence)."""
    if not sys.platform.startswith("linux"):
        return f"namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "the local engine's namespaces need root (unprivileged user namespaces: not yet)"
    with contextlib.suppress(OSError):
        if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
            return "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)"
    return None
