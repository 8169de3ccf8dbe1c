"""What a forked process keeps of its parent's open files.

A fork inherits every descriptor of its parent: a template's control socket, an instance's
listening socket, files open in the parent's workspace. Kept, they would let the child talk
to the zygote as its parent, answer the parent's calls, or write into the parent's files.
:func:`neutralize` gives the child only what it may keep:

- descriptors named in ``keep`` and the standard streams;
- files on read-only mounts (the project, the system, ``/data``), character devices (``/dev``),
  and files on the shared ``/storage``;
- files on a mount the child replaced with a copy (its workspace and ``/tmp`` after a fork),
  reopened at the same path in the copy, with the same flags and offset;
- anything else (sockets, pipes, epoll and event descriptors, other writable files) becomes
  ``/dev/null``: ``dup2`` keeps the number taken, so the Python objects that own those numbers
  close ``/dev/null`` later, never a descriptor the child opened since.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable

__all__ = ["neutralize", "open_fds"]


def open_fds() -> list[int]:
    """This process's open descriptors."""
    return sorted(int(name) for name in os.listdir("/proc/self/fd") if name.isdigit())


def _flags_and_offset(fd: int) -> tuple[int, int]:
    flags, offset = os.O_RDONLY, 0
    with contextlib.suppress(OSError), open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            key, _, value = line.partition(":")
            if key == "flags":
                flags = int(value.strip(), 8)
            elif key == "pos":
                offset = int(value.strip())
    return flags, offset


def _reopen(fd: int, flags: int, offset: int) -> bool:
    """Reopen what ``fd`` names at its path (in the mount that now covers it) onto ``fd``."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    if not path.startswith("/") or path.endswith(" (deleted)"):
        return False
    keep = os.O_ACCMODE | os.O_APPEND | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fresh = os.open(path, (flags & keep) | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if offset and not stat.S_ISDIR(os.fstat(fresh).st_mode):
            os.lseek(fresh, offset, os.SEEK_SET)
        os.dup2(fresh, fd, inheritable=not flags & os.O_CLOEXEC)
    finally:
        os.close(fresh)
    return True


def neutralize(
    keep: Iterable[int] = (),
    *,
    copied_devices: Iterable[int] = (),
    shared_paths: Iterable[str] = ("/storage",),
) -> None:
    """Give this process only the descriptors it may keep (see the module docstring).

    ``copied_devices``: ``st_dev`` of the mounts this process replaced with copies; files open
    there are reopened in the copies. ``shared_paths``: writable places shared on purpose.
    """
    kept = {0, 1, 2, *keep}
    copied = set(copied_devices)
    shared = tuple(shared_paths)
    null = os.open("/dev/null", os.O_RDWR)
    try:
        for fd in open_fds():
            if fd in kept or fd == null:
                continue
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                flags, offset = _flags_and_offset(fd)
                if st.st_dev in copied and _reopen(fd, flags, offset):
                    continue
                if st.st_dev not in copied and _is_safe_to_share(fd, shared):
                    continue
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _is_safe_to_share(fd: int, shared: tuple[str, ...]) -> bool:
    """A file that cannot carry anything between the two processes: on a read-only mount, or
    in a place shared on purpose."""
    try:
        if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            return True
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in shared)
