"""Keep tool and agent code away from the runtime's process; end what each call starts.

Environment code runs *in* the runtime's process; agent code reaches the machine through the
processes the environment's tools start (a Python snippet, a shell). Those processes run as the
same user as the runtime, root of the instance's user namespace with every capability there, so
the kernel's ordinary checks (same uid) would let them trace, read and signal the runtime.
:func:`protect`, called once before the runtime serves, closes that:

- **not dumpable** (``PR_SET_DUMPABLE`` 0): ``ptrace`` (attach, seize), ``/proc/<runtime>/mem``,
  ``environ``, ``fd/``, ``process_vm_readv``/``writev`` and ``pidfd_getfd`` then need
  ``CAP_SYS_PTRACE`` in the user namespace the runtime's memory belongs to, which is the one the
  engine started the runtime's program in (the host's, or the pod's), never the instance's: tool
  code holds no such capability. Programs a tool starts are dumpable again (``execve``), so they
  can still trace one another.
- **a seccomp filter** (inherited by every process started afterwards, irrevocably; ``no new
  privileges`` is set first) that refuses, with ``EPERM``: ``kill``, ``rt_sigqueueinfo``,
  ``tgkill`` and ``rt_tgsigqueueinfo`` aimed at the runtime's pid; without Landlock (below)
  also ``kill`` of the runtime's process group, of process group 0 (the caller's own group,
  which a child that did not start a session of its own shares with the runtime) and of -1
  (every process), and ``setpgid`` into the runtime's group; ``tkill`` (obsolete; it names
  threads, and a signal to any thread of the runtime reaches the runtime); ``ptrace``,
  ``process_vm_readv``/``writev`` and ``pidfd_open`` of the runtime's pid.
  ``pidfd_send_signal`` answers ``ENOSYS`` (a pidfd can come from opening ``/proc/<pid>``,
  which no filter can tell apart), so programs fall back to ``kill``. The runtime itself is
  bound by the filter too: it never signals itself.
- **a Landlock domain** (Linux 6.12+) scoping signals, entered by every process the runtime
  starts through the standard library before it runs anything (:func:`confine_self`): it and
  its descendants can signal nothing outside the domain, so no thread of the runtime by its id
  (``kill`` of any thread id reaches the whole process, and ``/proc/<runtime>/task`` lists them).
- **what a call starts ends with the call** (:class:`Calls`): when a call returns, every process
  that started while it ran, and whose ancestors all started while it ran, is killed
  (``SIGKILL``) before the result goes back, whether it detached itself (``setsid``, a double
  fork) or not. Spared: processes a call kept with :func:`aenv_ray.keep_processes` (a pid, and
  what it starts; or everything its call starts), processes started while another call was
  running (they end when the last such call ends: concurrent calls never kill each other's
  processes), and processes started outside any call. At the end of the episode everything
  ends: the local engine ends the instance's pid namespace, Kubernetes deletes the pod, and a
  stopping runtime kills every process it can see (:meth:`Calls.end_all`).

Where processes are looked for: in the runtime's own pid namespace when the runtime is pid 1 or
2 there (a pod; a local instance, whose pid 1 reaps orphans), else among the runtime's
descendants only (a runtime started by hand, or as a host process): there an orphan (a double
fork) goes to an init outside the runtime's reach and is not found. The runtime is no child
subreaper: it would have to reap every orphan, and reaping a child that a ``Popen`` waits for
would give that ``Popen`` a wrong exit status.

What does not hold: without Landlock's signal scoping, or for a process started around the
standard library (``os.posix_spawn``, ``ctypes``), ``kill`` of the id of one of the runtime's
*other* threads still reaches the runtime (a static filter cannot know thread ids made later):
a denial of service of the agent's own instance, not a way into the runtime's memory. See
``docs/security.md``.

May import: the standard library and ``aenv_ray.processes``.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import functools
import logging
import os
import platform
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Call",
    "Calls",
    "calls",
    "process_stat",
    "protect",
    "runtime_fork",
    "seccomp_program",
    "wait_gone",
    "within",
]

log = logging.getLogger("sandbox_runtime.contain")

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_TICKS = os.sysconf("SC_CLK_TCK")
_KILL_PASSES = 20
_DEATH_WAIT = 5.0  # seconds a killed process may take to die before the call returns anyway

# -- the seccomp filter ------------------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000
# name -> number, per architecture (the kernel's tables)
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "kill": 62,
        "tkill": 200,
        "tgkill": 234,
        "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297,
        "pidfd_send_signal": 424,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "pidfd_open": 434,
        "setpgid": 109,
    },
    "i386": {
        "kill": 37,
        "tkill": 238,
        "tgkill": 270,
        "rt_sigqueueinfo": 178,
        "rt_tgsigqueueinfo": 335,
        "pidfd_send_signal": 424,
        "ptrace": 26,
        "process_vm_readv": 347,
        "process_vm_writev": 348,
        "pidfd_open": 434,
        "setpgid": 57,
    },
    "aarch64": {
        "kill": 129,
        "tkill": 130,
        "tgkill": 131,
        "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240,
        "pidfd_send_signal": 424,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "pidfd_open": 434,
        "setpgid": 154,
    },
}
# which architectures a process of each machine can call the kernel as
_ARCHES = {"x86_64": ("x86_64", "i386"), "aarch64": ("aarch64",)}

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000


def _rules(pid: int, group: int, *, groups: bool) -> dict[str, list[tuple[int, int]] | None]:
    """syscall -> the (argument, 32-bit value) pairs it is refused for; None: always.
    ``groups``: also ``kill`` of -1, 0 and the runtime's group, and ``setpgid`` into it (needed
    without Landlock; with it, a signal to a group skips the runtime, the others get it)."""

    def low(value: int) -> int:
        return value & 0xFFFFFFFF

    kill_targets = sorted({low(pid), low(-pid), low(-group), low(-1), 0} if groups else {pid})
    return {
        "kill": [(0, v) for v in kill_targets],
        "rt_sigqueueinfo": [(0, low(pid))],
        "tgkill": [(0, low(pid)), (1, low(pid))],
        "rt_tgsigqueueinfo": [(0, low(pid)), (1, low(pid))],
        "tkill": None,
        "pidfd_send_signal": None,  # ENOSYS (see the module's docstring)
        "ptrace": [(1, low(pid))],
        "process_vm_readv": [(0, low(pid))],
        "process_vm_writev": [(0, low(pid))],
        "pidfd_open": [(0, low(pid))],
        "setpgid": [(1, low(group))] if groups else [],
    }


def seccomp_program(
    pid: int, group: int, machine: str | None = None, *, groups: bool = True
) -> bytes:
    """The classic BPF program (``struct sock_filter[]``) of :func:`protect`'s filter for the
    runtime ``pid`` in process group ``group``, for ``machine`` (default: this one); ``groups``:
    see :func:`_rules`."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for machine {machine}")
    rules = {name: r for name, r in _rules(pid, group, groups=groups).items() if r != []}
    program: list[tuple[int, int, int, int | str]] = []  # (code, jt, jf, k | label)
    labels: dict[str, int] = {}
    jumps: list[tuple[int, str, str]] = []  # (index, true label, false label)

    def emit(code: int, k: int | str = 0) -> None:
        program.append((code, 0, 0, k))

    def jump(code: int, k: int, true: str, false: str) -> None:
        jumps.append((len(program), true, false))
        program.append((code, 0, 0, k))

    def label(name: str) -> None:
        labels[name] = len(program)

    emit(_LD_W_ABS, 4)  # seccomp_data.arch
    arches = _ARCHES[machine]
    for index, arch in enumerate(arches):
        jump(_JEQ_K, _AUDIT_ARCH[arch], f"arch-{arch}", f"next-arch-{index}")
        label(f"next-arch-{index}")
    emit(_RET_K, _RET_ALLOW)  # an architecture this machine has no such calls for
    for arch in arches:
        label(f"arch-{arch}")
        emit(_LD_W_ABS, 0)  # seccomp_data.nr
        if arch == "x86_64":
            jump(_JSET_K, _X32_BIT, "deny", f"{arch}-0")
            label(f"{arch}-0")
        numbers = _NUMBERS[arch]
        for index, (name, refused) in enumerate(rules.items()):
            here, after = f"{arch}-{name}", f"{arch}-after-{index}"
            jump(_JEQ_K, numbers[name], here, after)
            label(here)
            if name == "pidfd_send_signal" or refused is None:
                emit(_RET_K, "nosys" if name == "pidfd_send_signal" else "deny")
            else:
                for argument, value in refused:
                    emit(_LD_W_ABS, 16 + 8 * argument)  # the low 32 bits (little-endian)
                    nxt = f"{arch}-{name}-{argument}-{value}"
                    jump(_JEQ_K, value, "deny", nxt)
                    label(nxt)
                emit(_RET_K, _RET_ALLOW)
            label(after)
        emit(_RET_K, _RET_ALLOW)
    label("deny")
    emit(_RET_K, _RET_ERRNO | errno.EPERM)
    label("nosys")
    emit(_RET_K, _RET_ERRNO | errno.ENOSYS)
    out = bytearray()
    for index, (code, _, _, k) in enumerate(program):
        jt = jf = 0
        for at, true, false in jumps:
            if at == index:
                jt = labels[true] - index - 1
                jf = labels[false] - index - 1
                if not (0 <= jt <= 255 and 0 <= jf <= 255):
                    raise AssertionError("seccomp program: jump out of range")
        value = k if isinstance(k, int) else _RET_ERRNO | errno.EPERM
        if k == "nosys":
            value = _RET_ERRNO | errno.ENOSYS
        out += struct.pack("=HBBI", code, jt, jf, value)
    return bytes(out)


def _install_filter(program: bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    number = _SYS_SECCOMP.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"seccomp on {platform.machine()}")
    filters = ctypes.create_string_buffer(program, len(program))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(program) // 8, ctypes.cast(filters, ctypes.c_void_p))
    result = libc.syscall(
        ctypes.c_long(number),
        ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(prog),
    )
    if result != 0:
        code = ctypes.get_errno() or errno.EINVAL
        raise OSError(code, f"seccomp(SET_MODE_FILTER): {os.strerror(code)}")


def _prctl(option: int, value: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), what)


def protect(*, filter_signals: bool = True) -> list[str]:
    """In the runtime's process, once, before it serves (and before any call): not dumpable,
    the seccomp filter (unless ``filter_signals`` is false), and a fresh :func:`calls` tracker.
    Returns what could not be applied, one sentence each (also logged); never raises for a
    kernel that lacks a feature."""
    problems: list[str] = []
    try:
        _prctl(_PR_SET_DUMPABLE, 0, "prctl(PR_SET_DUMPABLE)")
    except OSError as exc:
        problems.append(f"the runtime stays dumpable ({exc}): tool code can trace it")
    me = os.getpid()
    whole = me <= 2
    _own_fork.active = False  # a fork of an instance starts as the runtime's own fork did
    if filter_signals:
        scoped = _landlock_abi() >= _LANDLOCK_SIGNAL_ABI
        try:
            _install_filter(seccomp_program(me, os.getpgrp(), groups=not scoped))
        except OSError as exc:
            problems.append(f"no seccomp filter ({exc}): tool code can signal the runtime")
        if (why := _confine_spawns()) is not None:
            problems.append(why)
    global _CALLS
    _CALLS = Calls(whole_namespace=whole)
    from aenv_ray import processes

    processes._set_keeper(_CALLS.keep)
    processes._set_unconfined(runtime_fork)
    for problem in problems:
        log.warning("containment incomplete", extra={"problem": problem})
    return problems


# -- tool processes in a Landlock domain of their own --------------------------------------------
_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture
_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_SCOPE_SIGNAL = 1 << 1
_LANDLOCK_SIGNAL_ABI = 6  # the first ABI with scopes (Linux 6.12)
_confining = False
_confined = False  # this process is a confined one
_own_fork = threading.local()


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, 0, _LANDLOCK_CREATE_RULESET_VERSION
    )
    return int(version) if version > 0 else 0


def confine_self() -> None:
    """In a new process the runtime started, before it runs anything: a Landlock domain of its
    own that scopes signals, so that it (and what it starts) can signal no process outside it:
    no thread of the runtime, whatever its id. Raises OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # what Landlock asks of the unprivileged
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    attr = struct.pack("=QQQ", 0, 0, _LANDLOCK_SCOPE_SIGNAL)  # fs, net: not handled
    buffer = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), buffer, len(attr), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        if libc.syscall(ctypes.c_long(_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(int(fd))


def _confine_child() -> None:
    global _confined
    if _confined:  # a confined process's own children share its domain
        return
    try:
        confine_self()
    except OSError:
        os._exit(126)  # never run tool code unconfined where confinement was promised
    _confined = True


def _with_confinement(fork_exec: Callable[..., Any]) -> Callable[..., Any]:
    """``_posixsubprocess.fork_exec`` whose child confines itself (its ``preexec_fn``, index 21
    of the 22 or 23 positional arguments of Python 3.11 to 3.13) before it executes."""

    @functools.wraps(fork_exec)
    def spawn(*args: Any, **kwargs: Any) -> Any:
        unconfined = getattr(_own_fork, "active", False)
        if not _confining or unconfined or kwargs or len(args) not in (22, 23):
            return fork_exec(*args, **kwargs)
        given = args[21]
        if given is None:
            hook: Callable[[], None] = _confine_child
        else:

            def hook() -> None:
                _confine_child()
                given()

        return fork_exec(*args[:21], hook, *args[22:])

    return spawn


def _system(command: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> int:
    """``os.system`` through ``subprocess`` (so its shell is confined): the same wait status."""
    import subprocess

    code = subprocess.call(os.fsdecode(command), shell=True)
    return code << 8 if code >= 0 else -code


def _after_fork_in_child() -> None:
    if _confining and not getattr(_own_fork, "active", False):
        _confine_child()


@contextlib.contextmanager
def runtime_fork() -> Iterator[None]:
    """What this thread starts inside is the runtime's own (a fork of the instance; an
    environment's trusted helper, :func:`aenv_ray.processes.unconfined`): not confined."""
    before = getattr(_own_fork, "active", False)
    _own_fork.active = True
    try:
        yield
    finally:
        _own_fork.active = before


_HOOKED = False


def _confine_spawns() -> str | None:
    """From now on every process this runtime starts through the standard library
    (``subprocess``, ``asyncio``'s, ``os.fork``, ``os.system``, ``multiprocessing``) is confined
    (:func:`confine_self`); None, or why not."""
    global _confining, _HOOKED
    abi = _landlock_abi()
    if abi < _LANDLOCK_SIGNAL_ABI:
        return (
            f"no Landlock signal scoping (ABI {abi}, needs {_LANDLOCK_SIGNAL_ABI}: Linux 6.12): "
            "tool code can signal the runtime's other threads by their ids"
        )
    if not _HOOKED:
        import _posixsubprocess
        import subprocess

        _HOOKED = True
        # subprocess._fork_exec (3.11+, private) is absent from typeshed
        subprocess._fork_exec = _with_confinement(subprocess._fork_exec)  # type: ignore[attr-defined]
        _posixsubprocess.fork_exec = _with_confinement(_posixsubprocess.fork_exec)
        os.system = _system
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _confining = True
    return None


# -- what a call starts ------------------------------------------------------------------------
def _now_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def process_stat(pid: str) -> tuple[int, int, bytes] | None:
    """``(parent pid, start time in clock ticks since boot, state)`` of a process, or None once
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _command(pid: int) -> str:
    """A process's command line, as ``ps`` shows it (at most 200 characters)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(4096)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:200]


def wait_gone(pids: Iterable[int], seconds: float, *, interval: float) -> None:
    """Wait (up to ``seconds``, looking every ``interval``) until every process of ``pids`` is
    gone or a zombie. Reaps none."""
    deadline = time.monotonic() + seconds
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            found = process_stat(str(pid))
            if found is None or found[2] in (b"Z", b"X"):
                waiting.discard(pid)
        if waiting:
            time.sleep(interval)


_LAST_PID_FILE: tuple[int, int] | None = None  # (the pid that opened it, its descriptor)


def _last_pid() -> int | None:
    """The last pid this pid namespace handed out. Read twice a call: the file stays open (a
    ``pread`` is an eighth of an open, read and close), opened again in a forked process (whose
    inherited descriptor may have been closed and its number reused) or after a failed read."""
    global _LAST_PID_FILE
    for _ in range(2):
        opened = _LAST_PID_FILE
        try:
            if opened is None or opened[0] != os.getpid():
                flags = os.O_RDONLY | os.O_CLOEXEC
                opened = _LAST_PID_FILE = (
                    os.getpid(),
                    os.open("/proc/sys/kernel/ns_last_pid", flags),
                )
            return int(os.pread(opened[1], 32, 0))
        except (OSError, ValueError):
            _LAST_PID_FILE = None
    return None


@dataclass(eq=False)
class Call:
    """One running (or ended) call, as :class:`Calls` sees it."""

    start: int  # ticks since boot, when it began
    last_pid: int | None  # the pid namespace's last pid then
    keep: bool = False
    end: int | None = None


_CURRENT: contextvars.ContextVar[Call | None] = contextvars.ContextVar("aenv_call", default=None)


class Calls:
    """The calls of one runtime and the processes they start (see the module's docstring)."""

    def __init__(self, *, whole_namespace: bool) -> None:
        self.whole_namespace = whole_namespace
        self.me = os.getpid()
        self._lock = threading.Lock()
        self._running: list[Call] = []
        self._kept_calls: list[Call] = []
        self._kept_pids: set[tuple[int, int]] = set()  # (pid, start ticks)
        self._own_windows: list[Call] = []  # spared(): the runtime's own (forks of the instance)

    def enter(self) -> Call:
        """A call begins (before any of its code runs)."""
        call = Call(start=_now_ticks(), last_pid=_last_pid())
        with self._lock:
            self._running.append(call)
        return call

    def keep(self, pid: int | None) -> None:
        """:func:`aenv_ray.keep_processes`: a pid is kept wherever it is said (a thread of the
        environment's own included); everything a call starts only inside that call."""
        call = _CURRENT.get()
        if pid is None:
            if call is None:
                return
            with self._lock:
                if not call.keep:
                    call.keep = True
                    self._kept_calls.append(call)
            return
        stat = process_stat(str(pid))
        if stat is not None:
            with self._lock:
                self._kept_pids.add((pid, stat[1]))

    def leave(self, call: Call) -> Callable[[], int] | None:
        """A call ended: what kills what it started and did not keep (returning how many
        processes), or None when there is nothing to look for (cheap; run the sweep on a
        thread of its own, it reads ``/proc``)."""
        call.end = _now_ticks()
        with self._lock:
            with contextlib.suppress(ValueError):
                self._running.remove(call)
            if call.keep:
                return None
            others = min((c.start for c in self._running), default=None)
        if call.last_pid is not None and _last_pid() == call.last_pid:
            return None  # nothing was started anywhere while it ran
        return functools.partial(self._sweep, call.start, others)

    @contextlib.contextmanager
    def spared(self) -> Iterator[None]:
        """Processes started inside (the runtime's own, such as a fork of the instance) are
        never a call's."""
        window = Call(start=_now_ticks(), last_pid=None, keep=True)
        with self._lock:
            self._kept_calls.append(window)
            self._own_windows.append(window)
        try:
            yield
        finally:
            window.end = _now_ticks()

    def end_all(self) -> int:
        """Kill every process this runtime can see but pid 1 and itself (the episode ends)."""
        with self._lock:
            self._running.clear()
            self._kept_calls.clear()
            self._kept_pids.clear()
        return self._sweep(0, None)

    def end_for_judge(self, *, spare: Iterable[int] = ()) -> list[tuple[int, str]]:
        """Before a judge reward (:mod:`sandbox_runtime._judge`): end every process this runtime
        can see but pid 1, itself, ``spare`` (the judge's seed) and what started inside
        :meth:`spared` (its forks of the instance, and theirs), kept ones included. Each is
        stopped first (``SIGSTOP``, again until no new one appears: none can start another
        meanwhile), then all are killed. Returns ``(pid, command line)`` of each, by pid."""
        exempt = {int(pid) for pid in spare}
        with self._lock:
            windows = [(c.start, c.end) for c in self._own_windows]
            self._kept_calls = [c for c in self._kept_calls if not c.keep or c in self._own_windows]
            self._kept_pids.clear()
        stopped: dict[int, str] = {}
        parents: dict[int, int] = {}
        for _ in range(_KILL_PASSES * 5):
            table = self._table()
            fresh = [
                pid
                for pid in self._not_own(table, exempt, windows)
                if pid not in stopped and table[pid][2] not in (b"Z", b"X")
            ]
            if not fresh:
                break
            for pid in fresh:
                stopped[pid] = _command(pid)
                parents[pid] = table[pid][0]
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._wait_dead(parents)
        if stopped:
            log.info("ended the agent's processes for the judge", extra={"count": len(stopped)})
        return sorted(stopped.items())

    def _not_own(
        self,
        table: dict[int, tuple[int, int, bytes]],
        exempt: set[int],
        windows: list[tuple[int, int | None]],
    ) -> list[int]:
        """The pids of ``table`` that are neither ``exempt`` nor started inside a window of
        :meth:`spared` (nor descend from one that did)."""

        def own(pid: int, start: int) -> bool:
            return any(s <= start and (e is None or start <= e + 1) for s, e in windows)

        verdict = self._lineage(table, own)
        return [pid for pid in table if not verdict[pid] and pid not in exempt]

    def _lineage(
        self, table: dict[int, tuple[int, int, bytes]], mark: Callable[[int, int], bool]
    ) -> dict[int, bool]:
        """pid -> whether ``mark(pid, start)`` holds for it or one of its ancestors in
        ``table`` (below pid 1 and the runtime); each chain of parents is walked once."""
        verdict: dict[int, bool] = {}
        for first in table:
            chain: list[int] = []
            pid: int | None = first
            result = False
            while pid is not None and pid not in verdict and len(chain) < 4096:
                chain.append(pid)
                ppid, start, _ = table[pid]
                if mark(pid, start):
                    result = True
                    break
                pid = ppid if ppid in table and ppid not in (1, self.me) else None
            else:
                if pid is not None and pid in verdict:
                    result = verdict[pid]
            for member in chain:
                verdict[member] = result
        return verdict

    def _table(self) -> dict[int, tuple[int, int, bytes]]:
        table: dict[int, tuple[int, int, bytes]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in (1, self.me):
                stat = process_stat(entry)
                if stat is not None:
                    table[int(entry)] = stat
        if not self.whole_namespace:
            table = {pid: st for pid, st in table.items() if self._descends(pid, table)}
        return table

    def _descends(self, pid: int, table: dict[int, tuple[int, int, bytes]]) -> bool:
        for _ in range(4096):
            parent = table[pid][0] if pid in table else None
            if parent == self.me:
                return True
            if parent is None or parent not in table:
                return False
            pid = parent
        return False

    def _spared(self, start: int, since: int, others: int | None) -> bool:
        if start < since or (others is not None and start >= others):
            return True
        with self._lock:
            windows = [(c.start, c.end) for c in self._kept_calls]
        return any(s <= start and (e is None or start <= e + 1) for s, e in windows)

    def _targets(self, since: int, others: int | None) -> dict[int, int]:
        """pid -> ppid of every running process to kill: it started at ``since`` or later
        (and before ``others``, the first start of the calls still running), outside every
        kept window, is not kept, and neither is any of its ancestors."""
        table = self._table()
        with self._lock:
            kept = set(self._kept_pids)
        verdict = self._lineage(
            table, lambda pid, start: (pid, start) in kept or self._spared(start, since, others)
        )
        return {
            pid: ppid
            for pid, (ppid, _, state) in table.items()
            if state != b"Z" and not verdict[pid]
        }

    def _sweep(self, since: int, others: int | None) -> int:
        killed: dict[int, int] = {}
        for _ in range(_KILL_PASSES):
            targets = self._targets(since, others)
            if not targets:
                break
            for pid in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(targets)
        self._wait_dead(killed)
        if killed:
            log.info("ended processes a call left", extra={"count": len(killed)})
        return len(killed)

    def _wait_dead(self, killed: dict[int, int]) -> None:
        """Until every killed process is gone or a zombie; as pid 1 (a pod's runtime), reap
        them: orphans come to pid 1, and no one else would."""
        wait_gone(killed, _DEATH_WAIT, interval=0.002)
        if self.me != 1:
            return  # our own children are their Popen's to reap; orphans are pid 1's
        for pid, ppid in killed.items():
            if ppid == self.me:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)


_CALLS: Calls | None = None


def calls() -> Calls | None:
    """The tracker :func:`protect` installed in this process, if any (a fork of a runtime that
    has not protected itself again has none)."""
    tracker = _CALLS
    return tracker if tracker is not None and tracker.me == os.getpid() else None


def within(call: Call | None, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    """``fn`` run as part of ``call``: :func:`aenv_ray.keep_processes` inside it knows its call."""
    if call is None:
        return fn
    if is_async:

        @functools.wraps(fn)
        async def run_async(**kwargs: Any) -> Any:
            token = _CURRENT.set(call)
            try:
                return await fn(**kwargs)
            finally:
                _CURRENT.reset(token)

        return run_async

    @functools.wraps(fn)
    def run(**kwargs: Any) -> Any:
        token = _CURRENT.set(call)
        try:
            return fn(**kwargs)
        finally:
            _CURRENT.reset(token)

    return run
