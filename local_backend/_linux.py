"""Thin ctypes wrappers over the Linux calls the local engine needs (Python 3.11 has none).

Every wrapper raises :class:`OSError` with the errno and the call that failed, so a refused
``mount`` says which mount. Nothing here decides policy: see ``_sandbox.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct
import sys

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "MS_BIND",
    "MS_NODEV",
    "MS_NOEXEC",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_RDONLY",
    "MS_REC",
    "MS_REMOUNT",
    "bind_mount",
    "loopback_up",
    "mount",
    "pivot_root",
    "reap_children",
    "set_child_subreaper",
    "set_command_line",
    "set_no_new_privs",
    "set_parent_death_signal",
    "sethostname",
    "setns",
    "umount",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _b(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def unshare(flags: int) -> None:
    """Move this process into new namespaces (``CLONE_NEW*`` flags)."""
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    """Join the namespace ``fd`` refers to (``/proc/PID/ns/...``)."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({nstype:#x})")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    """mount(2)."""
    _check(
        _libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
        f"mount {source or fstype} on {target}",
    )


def bind_mount(source: str, target: str, *, read_only: bool = True) -> None:
    """Bind ``source`` (recursively) on ``target``; remount read-only, nosuid, nodev if asked.

    A ``noexec`` of the source is kept: inside a user namespace the kernel refuses a remount
    that would drop it (the flag is locked).
    """
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        kept = MS_NOEXEC if os.statvfs(target).f_flag & os.ST_NOEXEC else 0
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | kept
        mount(None, target, None, flags)


def umount(target: str) -> None:
    """Lazily detach the mount at ``target``."""
    _check(_libc.umount2(_b(target), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2): make ``new_root`` this mount namespace's root."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(38, f"pivot_root: unsupported machine {os.uname().machine}")
    _check(_libc.syscall(ctypes.c_long(number), _b(new_root), _b(put_old)), "pivot_root")


def sethostname(name: str) -> None:
    """Set the hostname of this UTS namespace."""
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def set_parent_death_signal(signum: int) -> None:
    """Receive ``signum`` when the thread that forked this process exits."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0), "prctl(PDEATHSIG)")


def set_child_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init."""
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0), "prctl(SUBREAPER)")


def set_command_line(words: list[str]) -> bool:
    """Show ``words`` as this process's ``/proc/self/cmdline`` (what ``ps`` prints), written
    over the memory of the arguments it was exec'd with; cut to fit that memory. False where
    it cannot be written (the kernel's view then stays the exec'd one).

    A process forked without exec (a zygote forked by its launcher) otherwise shows its
    parent's command line.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
    except (OSError, IndexError, ValueError):
        return False
    size = end - start
    if size <= 1:
        return False
    data = b"\0".join(w.encode(errors="replace") for w in words)[: size - 1]
    ctypes.memmove(start, data.ljust(size, b"\0"), size)  # the last byte stays a NUL
    return True


def set_no_new_privs() -> None:
    """execve can never grant privileges again (setuid binaries, file capabilities)."""
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def reap_children() -> list[int]:
    """Collect every child that has exited (never waits); their pids."""
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)


def loopback_up() -> None:
    """Bring up ``lo`` in this network namespace (a fresh one starts with it down)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


if not sys.platform.startswith("linux"):  # pragma: no cover - imported only on Linux
    raise ImportError("local_backend._linux needs Linux")
