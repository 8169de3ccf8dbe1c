"""An instance's memory and process limits, inside the instance: applied, watched, and named.

An engine puts each instance in a cgroup that limits its memory and processes; inside the
instance, before the runtime serves, it calls :func:`install` with what it set up::

    install(InstanceLimits(memory=512 << 20, pids=128, memory_events=fd1, pids_events=fd2))

From then on, in this process:

- **the processes calls start have a cgroup of their own** when the engine made one
  (``work_procs``: the local engine's ``<instance>/work``, below the instance's limits): every
  process the runtime starts is moved there (an ``os.fork`` child moves itself at once, a
  spawned one is moved as its spawn returns), so the kernel kills inside it, never the runtime;
  its event counters are watched too, and a hit there names both limits. Before each fork or
  spawn the runtime reads the instance's memory in use (``memory_usage``) and refuses the fork
  (``BlockingIOError``) when less than :func:`fork_headroom` is left: a fork's page tables are
  charged to the runtime's group. The ``oom_score_adj`` settings below are then not used;
- otherwise (no such cgroup: a pod's ``--cgroup``, the standalone runtime),
  **the runtime is the last thing the kernel kills**: every process the runtime starts gets a
  higher ``oom_score_adj`` than the runtime's own. A child inherits the value its parent has at
  the fork, and ``subprocess`` runs no Python in the child (no at-fork hook), so the runtime
  raises its own value just around each fork or spawn of the standard library
  (``subprocess``, ``os.fork``, ``os.posix_spawn``, ``os.system``, ``multiprocessing``) and lowers
  it again after; only where a probe at :func:`install` shows it may lower it back (not every
  host allows it: a runtime stuck at 1000 would be the kernel's first pick);
- **an in-process hog gets MemoryError**: ``RLIMIT_DATA`` is set to the memory limit for the
  runtime (when its own data leaves room), lifted again around those forks, so a child is
  limited by the cgroup only, and killed by the kernel, not failed by an rlimit;
- **calls that hit a limit say so**: :class:`LimitWatch` re-reads the cgroup's event counters
  (``oom_kill`` of ``memory.events`` / ``memory.oom_control``, ``max`` of ``pids.events``) with
  ``pread`` at the end of calls that ran a few milliseconds or more and from the watchdog while
  calls run, never on every call; a call reports every hit found while it ran. A process-limit
  hit kills every process of the instance that started since the calls running then began (or,
  found with no call running, since the calls that ended last began): the runtime, pid 1 and
  older processes live on;
- without cgroups (``enforced=False``) the limits become rlimits of the runtime and all its
  children: ``RLIMIT_DATA`` per process, ``RLIMIT_NPROC`` (counted per user namespace, so per
  instance in an unprivileged engine; not enforced for the host's root).

May import: the standard library and ``sandbox_runtime.contain`` (its ``/proc`` readers).
"""

from __future__ import annotations

import _posixsubprocess
import collections
import contextlib
import errno
import functools
import logging
import math
import operator
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_runtime.contain import process_stat, wait_gone

__all__ = [
    "InstanceLimits",
    "LimitHit",
    "LimitWatch",
    "current_watch",
    "data_room",
    "discover",
    "disk_full_message",
    "install",
    "installed",
    "is_disk_full",
    "kill_started_since",
    "memory_error_message",
    "reap_killed",
    "reapply_if_forked",
]

log = logging.getLogger("sandbox_runtime.limits")

CHILD_OOM_SCORE_ADJ = 1000
"""What the runtime's children get: the kernel's first choice when memory runs out."""
DATA_HEADROOM = 32 << 20
"""RLIMIT_DATA is only set when the runtime's data leaves this much room below the limit."""
FORK_HEADROOM = 16 << 20
"""At least this much of an instance's memory is kept free of forks (:func:`fork_headroom`)."""
_KILL_PASSES = 50
REAP_SECONDS = 10.0
"""How long a limit hit waits for the processes it killed to end."""
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class InstanceLimits:
    """What limits this instance, as the engine set it up (``None``: unknown or none)."""

    memory: int | None = None
    """Bytes: the instance's memory limit."""
    pids: int | None = None
    """The instance's process limit."""
    memory_events: int | None = None
    """An fd (``O_RDONLY``) of cgroup v2 ``memory.events`` or v1 ``memory.oom_control``: holds a
    line ``oom_kill N``."""
    pids_events: int | None = None
    """An fd (``O_RDONLY``) of ``pids.events``: holds a line ``max N``."""
    enforced: bool = True
    """False: no cgroup enforces these limits (an unprivileged host); rlimits stand in for them
    where the kernel allows."""
    work_memory: int | None = None
    """Bytes: the limit of the processes calls start, together (their own cgroup, below the
    instance's, so that they hit it before the runtime is at risk)."""
    work_pids: int | None = None
    """The process limit of the processes calls start, together."""
    work_procs: tuple[int, ...] = ()
    """Write-only fds of that cgroup's ``cgroup.procs`` (one per hierarchy): every process the
    runtime starts is moved there. Empty: no such cgroup; children stay in the runtime's."""
    work_memory_events: int | None = None
    """An fd of that cgroup's ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""
    work_pids_events: int | None = None
    """An fd of that cgroup's ``pids.events``."""
    memory_usage: int | None = None
    """An fd of the instance's memory in use (``memory.current`` / ``memory.usage_in_bytes``):
    the runtime starts no process when too little is left (:data:`FORK_HEADROOM`)."""

    def describe(self) -> dict[str, Any]:
        """What ``/aenv/v1/info`` lists under ``"limits"``."""
        described: dict[str, Any] = {
            "memory": self.memory,
            "pids": self.pids,
            "enforced": self.enforced,
        }
        if self.work_procs:
            described["calls"] = {"memory": self.work_memory, "pids": self.work_pids}
        return described


@dataclass(frozen=True)
class LimitHit:
    """What a counter said about one call: the limits it hit and what was done about it."""

    memory: bool = False
    pids: bool = False
    killed: int = 0
    """Processes killed after a process-limit hit."""
    earlier: bool = False
    """Noticed during this call, but possibly caused by an earlier one (processes it left
    running in the background)."""
    work: bool = False
    """The limits hit were those of the processes calls start (their own cgroup), not the
    instance's: the runtime was never at risk."""
    refused: bool = False
    """The runtime refused a fork: the instance's memory was nearly used up."""

    def __or__(self, other: LimitHit) -> LimitHit:
        return LimitHit(
            self.memory or other.memory,
            self.pids or other.pids,
            self.killed + other.killed,
            self.earlier or other.earlier,
            self.work and other.work,
            self.refused or other.refused,
        )

    def describe(self, limits: InstanceLimits) -> str:
        """One sentence per limit hit, naming the limit and what to do."""
        when = "during or shortly before this call" if self.earlier else "during this call"
        killed = f"; the {self.killed} processes started since were killed" * bool(self.killed)
        parts = []
        if self.refused:
            parts.append(
                f"the instance's memory ({_mib(limits.memory)}) was nearly used up {when}: the "
                f"runtime refused to start a process{killed * (not self.pids)}. Start fewer "
                "processes at once (a fork bomb?), use less memory, or give the environment "
                "more (deployConfig.memory)"
            )
        if self.memory:
            if self.work:
                what = (
                    f"the processes started by calls hit their memory limit "
                    f"({_mib(limits.work_memory)} of the instance's {_mib(limits.memory)}) {when}"
                )
            else:
                what = f"the instance hit its memory limit ({_mib(limits.memory)}) {when}"
            parts.append(
                f"{what}: the kernel killed a process that used too much memory"
                f"{killed * (not self.pids and not self.refused)}. Use less memory (work on "
                "the data in pieces), or give the environment more (deployConfig.memory)"
            )
        if self.pids:
            if self.work:
                what = (
                    f"the processes started by calls hit their process limit "
                    f"({limits.work_pids or 'unknown'} of the instance's "
                    f"{limits.pids or 'unknown'}) {when}"
                )
            else:
                what = (
                    f"the instance hit its process limit ({limits.pids or 'unknown'} processes) "
                    f"{when}"
                )
            parts.append(
                f"{what}: a fork failed{killed}. Start fewer processes at once (a fork bomb?), "
                "or raise the limit (deployConfig.pids)"
            )
        return ". ".join(parts)


def _mib(size: int | None) -> str:
    return "unknown size" if size is None else f"{size / (1 << 20):g} MiB"


def memory_error_message(limits: InstanceLimits) -> str:
    """What to add to a ``MemoryError`` raised inside the runtime."""
    return (
        f"the instance's memory limit is {_mib(limits.memory)}: use less memory (work on the "
        "data in pieces), or give the environment more (deployConfig.memory)"
    )


def data_room() -> int | None:
    """Bytes this process may still allocate under its ``RLIMIT_DATA`` (None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    used = _data_bytes()
    if soft == resource.RLIM_INFINITY or used is None:
        return None
    return max(0, soft - used)


def is_disk_full(exc: BaseException) -> bool:
    """True for the error of a write to a full file system (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_message() -> str:
    """What to add to a call's disk-full error: the sizes of the workspace and ``/tmp``."""
    sizes = []
    workspace = os.environ.get("AENV_WORKSPACE") or os.getcwd()
    for label, path in ((f"the workspace ({workspace})", workspace), ("/tmp", "/tmp")):
        with contextlib.suppress(OSError):
            stat = os.statvfs(path)
            total, free = stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
            sizes.append(f"{label} holds {total >> 20} MiB, {free >> 20} MiB free now")
    held = "; ".join(sizes) or "the instance's disk is full"
    return (
        f"{held}. Delete files no longer needed, write less (or to /storage, if the instance "
        "has one), or give the environment more memory (deployConfig.memory: the workspace "
        "is a tmpfs of half of it, /tmp of an eighth)"
    )


# -- the counters ----------------------------------------------------------------------------
def _counter(fd: int | None, key: bytes) -> int:
    """The number after ``key`` on its line of a cgroup event file (0 when absent)."""
    if fd is None:
        return 0
    data = os.pread(fd, 4096, 0)
    at = data.find(b"\n" + key + b" ")
    if at < 0:
        if not data.startswith(key + b" "):
            return 0
        at = -1
    start = at + 2 + len(key)
    end = data.find(b"\n", start)
    return int(data[start : end if end >= 0 else None])


class LimitWatch:
    """The event counters of one instance's cgroup, and what to do when they move."""

    def __init__(self, limits: InstanceLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._oom, self._max, self._work_oom, self._work_max = self._read()
        self._scope = _scope(_own_cgroup_line(), work=bool(limits.work_procs))
        self._hits: collections.deque[tuple[float, LimitHit]] = collections.deque(maxlen=64)
        self.last_hit_at = -math.inf
        """``time.monotonic()`` when the last hit was found (and dealt with)."""
        self._refusals = 0
        self._refusals_seen = 0
        self.refuse_forks = ""
        """Non-empty (why) after the processes of running calls hit their memory limit: the
        runtime refuses to start more until those calls end (:func:`refused_fork`)."""

    def _read(self) -> tuple[int, int, int, int]:
        limits = self.limits
        return (
            _counter(limits.memory_events, b"oom_kill"),
            _counter(limits.pids_events, b"max"),
            _counter(limits.work_memory_events, b"oom_kill"),
            _counter(limits.work_pids_events, b"max"),
        )

    def check(self, since: float, *, running: bool = True) -> LimitHit | None:
        """Re-read the counters: a limit hit since the last read, or None. On a process-limit hit,
        and on a memory-limit hit of the calls' processes, kill the instance's processes that
        started at ``since`` (``time.monotonic()``) or later."""
        with self._lock:
            try:
                oom, maxed, work_oom, work_max = self._read()
            except (OSError, ValueError):
                log.exception("cannot read the cgroup's event counters")
                return None
            refused = self._refusals > self._refusals_seen
            self._refusals_seen = self._refusals
            in_work = work_oom > self._work_oom or work_max > self._work_max
            memory = oom > self._oom or work_oom > self._work_oom
            pids = maxed > self._max or work_max > self._work_max
            in_instance = oom > self._oom and work_oom == self._work_oom
            in_instance = in_instance or (maxed > self._max and work_max == self._work_max)
            self._oom, self._max, self._work_oom, self._work_max = oom, maxed, work_oom, work_max
            if not (memory or pids or refused):
                return None
            work = in_work and not in_instance
            if memory and work and running:
                self.refuse_forks = (
                    f"the processes started by calls hit their memory limit "
                    f"({_mib(self.limits.work_memory)}); no process starts until the calls "
                    "running then end"
                )
            kill = pids or refused or (memory and work)
            killed = kill_started_since(since, self._scope) if kill else 0
            hit = LimitHit(memory, pids, killed, work=work, refused=refused)
            self.last_hit_at = time.monotonic()
            self._hits.append((self.last_hit_at, hit))
        log.warning(
            "resource limit hit",
            extra={"memory": memory, "pids": pids, "killed": killed},
        )
        return hit

    def refused(self) -> None:
        """The runtime refused a fork for want of memory: a memory-limit hit of the calls
        running (their :meth:`check` finds it and kills what they started)."""
        with self._lock:
            self._refusals += 1

    def hits_since(self, started: float) -> LimitHit | None:
        """Every hit found (and dealt with) at ``started`` or later, combined."""
        with self._lock:
            found = [hit for at, hit in self._hits if at >= started]
        return functools.reduce(operator.or_, found) if found else None


def _own_cgroup_line() -> bytes | None:
    """This process's line of ``/proc/self/cgroup`` for the pids controller (v1) or the unified
    hierarchy (v2), unless it is the root group (which would be every process on the host)."""
    try:
        lines = Path("/proc/self/cgroup").read_bytes().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(b":", 2)
        if path == b"/":
            continue
        if b"pids" in controllers.split(b","):
            return line
        if controllers == b"":
            unified = line
    return unified


def _scope(line: bytes | None, *, work: bool) -> tuple[bytes, ...] | None:
    """The cgroup lines whose processes are the instance's: the runtime's own, and with a
    group for the calls' processes that group's (``<instance>/work``: the runtime is in the
    instance's group on v1, in its ``runtime`` leaf on v2)."""
    if line is None:
        return None
    if not work:
        return (line,)
    if line.endswith(b"/runtime"):
        return (line, line.removesuffix(b"runtime") + b"work")
    return (line, line + b"/work")


def _in_scope(pid: str, scope: bytes | tuple[bytes, ...] | None) -> bool:
    if scope is None:
        return True
    scopes = (scope,) if isinstance(scope, bytes) else scope
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return False
    return any(line == s or line.startswith(s + b"/") for line in lines for s in scopes)


def kill_started_since(since: float, scope: bytes | tuple[bytes, ...] | None) -> int:
    """SIGKILL every process of the instance that started at ``since`` (monotonic) or later,
    but the runtime and pid 1; return how many. "Of the instance": in ``scope`` (the runtime's
    cgroup line) when known, else in the runtime's own pid namespace (the runtime is pid 1 or 2
    there), else the runtime's descendants."""
    offset = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    first_tick = int((since + offset) * _TICKS)
    me = os.getpid()
    whole_namespace = scope is None and me <= 2
    killed: set[int] = set()
    own: set[int] = set()
    for _ in range(_KILL_PASSES):  # a fork bomb forks between the passes; it is capped, though
        table = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in (1, me):
                stat = process_stat(entry)
                if stat is not None and stat[2] != b"Z":
                    table[int(entry)] = stat
        if scope is None and not whole_namespace:
            table = {pid: st for pid, st in table.items() if _descends(pid, me, table)}
        targets = [
            pid
            for pid, (_, started, _) in table.items()
            if started >= first_tick and _in_scope(str(pid), scope)
        ]
        if not targets:
            break
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
            if table[pid][0] == me:
                own.add(pid)
    _wait_dead(killed)
    KILLED_CHILDREN.update(own)
    return len(killed)


KILLED_CHILDREN: set[int] = set()
"""Children of the runtime killed after a limit hit: :func:`reap_killed` reaps those their
tool did not wait for, once no call runs (a zombie's pid counts against the limit)."""


def _wait_dead(pids: set[int], seconds: float = REAP_SECONDS) -> None:
    """Wait (up to ``seconds``) until killed processes have ended (gone, or zombies): their
    memory is free when the call that hit a limit returns (a killed process may take a while to
    end on a busy machine). Reaps none: the tool may still wait for its own children."""
    wait_gone(pids, seconds, interval=0.01)


def reap_killed() -> None:
    """Reap the killed children (:data:`KILLED_CHILDREN`) that are zombies now; call when no
    call runs (none of them waits for its children any more)."""
    for pid in list(KILLED_CHILDREN):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            KILLED_CHILDREN.discard(pid)


def _descends(pid: int, ancestor: int, table: dict[int, tuple[int, int, bytes]]) -> bool:
    seen = 0
    while pid in table and seen < 4096:
        pid = table[pid][0]
        if pid == ancestor:
            return True
        seen += 1
    return False


# -- the process settings --------------------------------------------------------------------
class _SpawnGuard:
    """Raise the runtime's ``oom_score_adj`` (and lift its ``RLIMIT_DATA``) while any thread
    forks, so the child starts with the child's settings; back to the runtime's after."""

    def __init__(
        self,
        low: int | None,
        high: int | None,
        data: tuple[int, int] | None,
        work_procs: tuple[int, ...] = (),
    ) -> None:
        self.low = low  # None: the runtime's oom_score_adj is left alone
        self.high = high
        self.data = data  # (the runtime's soft limit, the children's) or None
        self.work_procs = work_procs
        self._lock = threading.Lock()
        self._forking = 0
        self._fd = None
        if low is not None:
            self._fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)

    def can_lower(self) -> bool:
        """Whether this process may lower its ``oom_score_adj`` back after raising it (not on
        every host: containers may forbid it). Probes by raising it by one; if lowering back
        fails it stays one higher, and the guard must not raise it around forks."""
        if self._fd is None or self.low is None:
            return False
        try:
            os.pwrite(self._fd, b"%d" % (self.low + 1), 0)
        except OSError:
            return False
        try:
            os.pwrite(self._fd, b"%d" % self.low, 0)
        except OSError:
            return False
        return True

    def place(self, pid: int) -> None:
        """Move a process the runtime just started into the calls' cgroup (if there is one)."""
        for fd in self.work_procs:
            with contextlib.suppress(OSError):  # it ended already
                os.write(fd, b"%d" % pid)

    def _set(self, adj: int | None, data: int | None) -> None:
        if adj is not None and self._fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self._fd, b"%d" % adj, 0)
        if data is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_DATA, (data, hard))

    def enter(self) -> None:
        with self._lock:
            self._forking += 1
            if self._forking == 1:
                self._set(self.high, self.data[1] if self.data else None)

    def exit(self) -> None:
        with self._lock:
            self._forking -= 1
            if self._forking == 0:
                self._set(self.low, self.data[0] if self.data else None)

    def in_child(self) -> None:
        """After ``os.fork`` in the child: keep the child's settings, move into the calls'
        cgroup (and close its fds: a child may not move others); no other thread runs."""
        self._lock = threading.Lock()
        self._forking = 0
        for fd in self.work_procs:
            with contextlib.suppress(OSError):
                os.write(fd, b"0")
            with contextlib.suppress(OSError):
                os.close(fd)
        self.work_procs = ()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    @contextlib.contextmanager
    def forking(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.exit()


@dataclass
class _State:
    pid: int  # the process that installed
    limits: InstanceLimits
    guard: _SpawnGuard | None
    watch: LimitWatch | None


_STATE: _State | None = None
_HOOKED = False


def fork_headroom(memory: int) -> int:
    """Memory an instance of ``memory`` bytes keeps free of forks: a fork's page tables (the
    runtime's size) are charged to the instance, not to the calls' cgroup."""
    return max(FORK_HEADROOM, memory // 16)


def _refuse_if_over() -> None:
    """Raise ``BlockingIOError`` (EAGAIN, as a fork over a process limit) while the processes
    of running calls are over their memory limit (:attr:`LimitWatch.refuse_forks`), or when the
    instance has less than :func:`fork_headroom` left; the latter counts as a memory-limit hit
    of the calls running (they are told, the processes they started are killed)."""
    state = _STATE
    if state is None or state.watch is None or state.pid != os.getpid():
        return
    watch = state.watch
    why = watch.refuse_forks
    limits = state.limits
    if not why and limits.memory_usage is not None and limits.memory:
        try:
            used = int(os.pread(limits.memory_usage, 64, 0))
        except (OSError, ValueError):
            used = 0
        if used > limits.memory - fork_headroom(limits.memory):
            why = (
                f"the instance uses {used >> 20} MiB of its memory limit ({_mib(limits.memory)}); "
                "a fork needs more"
            )
            watch.refused()
    if why:
        raise BlockingIOError(errno.EAGAIN, f"fork refused: {why}")


def _guarded(fn: Callable[..., Any], *, returns_pid: bool = False) -> Callable[..., Any]:
    @functools.wraps(fn)
    def spawn(*args: Any, **kwargs: Any) -> Any:
        state = _STATE
        if state is None or state.guard is None or state.pid != os.getpid():
            return fn(*args, **kwargs)
        _refuse_if_over()
        with state.guard.forking():
            result = fn(*args, **kwargs)
        if returns_pid and isinstance(result, int) and result > 0:
            state.guard.place(result)
        return result

    return spawn


def _refusing_fork(fork: Callable[[], int]) -> Callable[[], int]:
    @functools.wraps(fork)
    def checked_fork() -> int:
        _refuse_if_over()
        return fork()

    return checked_fork


def _system(command: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> int:
    """``os.system`` through ``posix_spawn`` (its child is placed like any other): the wait
    status of ``/bin/sh -c command``."""
    argv: list[Any] = ["sh", "-c", os.fspath(command)]
    pid = os.posix_spawn("/bin/sh", argv, os.environ)  # wrapped: placed
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return -1


def _before_fork() -> None:
    state = _STATE
    if state is not None and state.guard is not None and state.pid == os.getpid():
        state.guard.enter()


def _after_fork_in_parent() -> None:
    state = _STATE
    if state is not None and state.guard is not None and state.pid == os.getpid():
        state.guard.exit()


def _after_fork_in_child() -> None:
    state = _STATE
    if state is not None and state.guard is not None:
        state.guard.in_child()


def _hook_spawns() -> None:
    """Wrap the standard library's ways to start a process (once per interpreter)."""
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    # subprocess._fork_exec (3.11+, private) is absent from typeshed
    subprocess._fork_exec = _guarded(  # type: ignore[attr-defined]
        subprocess._fork_exec,  # type: ignore[attr-defined]
        returns_pid=True,
    )
    _posixsubprocess.fork_exec = _guarded(_posixsubprocess.fork_exec, returns_pid=True)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _guarded(getattr(os, name), returns_pid=True))
    os.system = _system
    os.fork = _refusing_fork(os.fork)
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


def _data_bytes() -> int | None:
    """The runtime's data size now (``VmData``), in bytes."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return None


def _set_rlimit(which: int, value: int, *, hard: bool) -> bool:
    _, hard_now = resource.getrlimit(which)
    if hard_now != resource.RLIM_INFINITY and value > hard_now:
        value = hard_now
    try:
        resource.setrlimit(which, (value, value if hard else hard_now))
    except (OSError, ValueError) as exc:
        log.warning("cannot set an rlimit", extra={"rlimit": which, "error": str(exc)})
        return False
    return True


def install(limits: InstanceLimits) -> None:
    """Apply ``limits`` to this process and the processes it starts, and watch them.

    Call it in the instance's runtime process before it serves; in a runtime forked from a
    serving one, call it again with the fork's own limits (without that, a fork keeps its
    parent's process settings but watches nothing). Calling it again replaces what it set.
    """
    global _STATE
    previous = _STATE
    low: int | None = None
    if previous is not None and previous.guard is not None and previous.guard.low is not None:
        low = previous.guard.low  # a fork inherits the children's value: go back to ours
        previous.guard.close()
    else:
        with contextlib.suppress(OSError, ValueError):
            low = int(Path("/proc/self/oom_score_adj").read_text())
    guard = None
    data: tuple[int, int] | None = None
    if limits.memory is not None and limits.enforced:
        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        if previous is not None and previous.guard is not None and previous.guard.data:
            soft = previous.guard.data[1]
        used = _data_bytes()
        if used is not None and used + DATA_HEADROOM <= limits.memory:
            data = (limits.memory, soft)
        else:
            log.warning(
                "memory limit too close to the runtime's own data: no RLIMIT_DATA",
                extra={"limit": limits.memory, "data": used},
            )
    if limits.work_procs:  # the children's own cgroup protects the runtime: no oom_score_adj
        guard = _SpawnGuard(None, None, data, limits.work_procs)
        guard._set(None, data[0] if data else None)
    elif low is not None and low < CHILD_OOM_SCORE_ADJ:
        try:
            guard = _SpawnGuard(low, CHILD_OOM_SCORE_ADJ, data)
        except OSError as exc:
            log.warning("cannot adjust oom_score_adj", extra={"error": str(exc)})
        else:
            if not guard.can_lower():  # raised once, it would stay: the kernel's first pick
                log.warning("oom_score_adj cannot be lowered back here: children get the same")
                guard.close()
                guard = _SpawnGuard(None, None, data)
            guard._set(guard.low, data[0] if data else None)
    elif data is not None:  # no guard: the runtime's limit would be its children's too
        log.warning("oom_score_adj is at its maximum already: no RLIMIT_DATA")
    if not limits.enforced:
        if limits.memory is not None:
            _set_rlimit(resource.RLIMIT_DATA, limits.memory, hard=True)
        if limits.pids is not None:
            _set_rlimit(resource.RLIMIT_NPROC, limits.pids, hard=True)
    watch = None
    events = (
        limits.memory_events,
        limits.pids_events,
        limits.work_memory_events,
        limits.work_pids_events,
    )
    if limits.enforced and any(fd is not None for fd in events):
        watch = LimitWatch(limits)
    _STATE = _State(os.getpid(), limits, guard, watch)
    if guard is not None:
        _hook_spawns()
    log.info(
        "instance limits installed",
        extra={
            "memory": limits.memory,
            "pids": limits.pids,
            "enforced": limits.enforced,
            "rlimit_data": data[0] if data else None,
            "watch": watch is not None,
        },
    )


def reapply_if_forked() -> None:
    """In a runtime forked from one that installed limits, and not installed again since: give
    it back the runtime's process settings (a fork has its children's), without the parent's
    counters, which describe the parent's cgroup. Called when a runtime starts serving."""
    state = _STATE
    if state is None or state.pid == os.getpid():
        return
    limits = state.limits
    install(InstanceLimits(limits.memory, limits.pids, enforced=limits.enforced))


def installed() -> InstanceLimits | None:
    """The limits :func:`install` applied in this process (None: none, or installed in the
    process this one was forked from)."""
    state = _STATE
    return state.limits if state is not None and state.pid == os.getpid() else None


def current_watch() -> LimitWatch | None:
    """The counters to watch in this process, if :func:`install` gave any."""
    state = _STATE
    return state.watch if state is not None and state.pid == os.getpid() else None


def discover(root: str = "/sys/fs/cgroup") -> InstanceLimits:
    """The limits of this process's own cgroup (v1 or v2), its event files opened: what
    ``python -m sandbox_runtime --cgroup`` installs (a pod's container is such a cgroup)."""
    memory = pids = memory_events = pids_events = None
    base = Path(root)
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return InstanceLimits(enforced=False)
    for line in lines:
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",") if controllers else []
        rel = path.lstrip("/")
        if not names:  # v2
            group = base / rel
            if not (group / "cgroup.controllers").exists():
                group = base / "unified" / rel
            memory = memory if memory is not None else _limit(group / "memory.max")
            pids = pids if pids is not None else _limit(group / "pids.max")
            memory_events = memory_events or _open(group / "memory.events")
            pids_events = pids_events or _open(group / "pids.events")
        if "memory" in names:
            group = base / controllers / rel
            memory = _limit(group / "memory.limit_in_bytes")
            memory_events = _open(group / "memory.oom_control")
        if "pids" in names:
            group = base / controllers / rel
            pids = _limit(group / "pids.max")
            pids_events = _open(group / "pids.events")
    enforced = memory_events is not None or pids_events is not None
    return InstanceLimits(memory, pids, memory_events, pids_events, enforced)


def _limit(path: Path) -> int | None:
    """A cgroup limit file's number (None: ``max``, absent, or v1's "unlimited" value)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= 1 << 62:
        return None
    return int(text)


def _open(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
