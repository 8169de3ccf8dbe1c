"""The watchdog: one thread that ends async calls blocking the event loop past their deadline,
and re-reads the instance's limit counters while calls run.

Async tools run on the HTTP event loop, under ``asyncio.timeout``; that only works while the
loop gets control back. An ``async def`` tool that blocks (``while True: pass``,
``time.sleep(100)``) stalls every request of the instance. Every async call is registered here
with its deadline; when one is still running ``SLACK`` after it, the watchdog posts a no-op to
the loop. If the loop does not run it within ``PING_WAIT``, the loop is blocked: when the task it
is running is that call's (or another overdue call's), the watchdog raises :class:`Interrupted`
inside the loop thread (``PyThreadState_SetAsyncExc``), which ends Python-level busy code, and
the call ends with the usual timeout result; ``time.sleep`` on the loop's thread is
:func:`interruptible_sleep`, which the watchdog wakes, so that ends too. If the loop is still
blocked ``grace`` seconds later (other blocking C code, or code that swallows the exception),
the instance cannot recover: every request still waiting is answered with the reason
(:mod:`sandbox_runtime._last_word`), ``on_broken(reason)`` is called and the process ends
(``os._exit``), so every caller gets ``InstanceBrokenError`` with the reason at once instead of
a hang or a dropped connection.

Cost: nothing while idle (the thread waits on a condition; no periodic wake-up while no call
runs). Per async call: a small list in a dict keyed by its task (no lock: a dict's item
assignment is atomic), and a wake-up of the thread only when the call's deadline is earlier than
the one it already waits for, so about once per deadline period, not per call (about 0.5 us in
all). Sync calls are not registered at all unless limits are watched
(:mod:`sandbox_runtime._limits`): then the counters are read at the end of calls that ran
``CHECK_AFTER`` or longer, every ``POLL_INTERVAL`` while calls run, and once ``QUIET_CHECK``
after the last call ended.

The wake-up protocol without a lock on the fast path: a call first enters the dict, then reads
``_wake_at``; the thread recomputes ``_wake_at`` only under the lock, and sets it to
``_RECOMPUTING`` before it reads the dict. A call that reads a later ``_wake_at`` than its own
deadline, or ``_RECOMPUTING``, takes the lock and lowers it; one that reads an earlier one is
already covered (the thread will look at the dict again by then).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, SupportsIndex, TypeAlias

from sandbox_runtime import _limits
from sandbox_runtime._limits import LimitHit
from sandbox_runtime._runner import Interrupted

__all__ = ["BROKEN_EXIT_CODE", "Call", "Watchdog", "interruptible_sleep"]

log = logging.getLogger("sandbox_runtime.watchdog")

_sleep = time.sleep
_SLEEPERS: dict[int, threading.Event] = {}
"""Per event-loop thread (ident): the event :func:`interruptible_sleep` waits on there."""


def interruptible_sleep(seconds: float | SupportsIndex, /) -> None:
    """``time.sleep``, but on a watched event loop's thread a wait the watchdog can cut short.

    ``time.sleep`` in C cannot be interrupted in a thread other than the main one (a signal
    only retries it), so an ``async def`` tool calling it would block the loop for its whole
    length. Installed as ``time.sleep`` when this module is imported (before an environment's
    modules are, so ``from time import sleep`` there gets it too); elsewhere it is the plain
    ``time.sleep``."""
    event = _SLEEPERS.get(threading.get_ident())
    if event is None:
        _sleep(seconds)
        return
    length = float(seconds)
    if length < 0:
        raise ValueError("sleep length must be non-negative")
    event.clear()
    if event.wait(length):  # woken by the watchdog: its Interrupted is raised right here
        event.clear()


time.sleep = interruptible_sleep

SLACK = 0.05
"""Seconds past an async call's deadline before the watchdog looks at the loop."""
PING_WAIT = 0.2
"""Seconds the loop may take to run a posted no-op before it counts as blocked."""
CHECK_AFTER = 0.005
"""Calls at least this long re-read the limit counters as they end."""
POLL_INTERVAL = 0.1
"""Seconds between reads of the limit counters while calls run."""
QUIET_CHECK = 0.05
"""One more read this long after the last call ended (its processes may still run)."""
BROKEN_EXIT_CODE = 70
"""The exit status of a runtime that ended itself because it was broken (EX_SOFTWARE)."""


_RECOMPUTING = -1.0
"""``_wake_at`` while the thread recomputes it from the dict (callers take the lock)."""

# a registered call: [kind, name, limit, deadline, started, task, cut]
KIND, NAME, LIMIT, DEADLINE, STARTED, TASK, CUT = range(7)
Call: TypeAlias = list[Any]
"""A registered call (indexed by the constants above); ``cut``: looked at past its deadline."""


def _label(call: Call) -> str:
    return f"{call[KIND]} `{call[NAME]}`"


class Watchdog:
    """Watch the calls of one runtime process; start it on the loop thread (:meth:`start`)."""

    def __init__(
        self,
        *,
        grace: float,
        on_broken: Callable[[str], None],
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.grace = grace
        self._on_broken = on_broken
        self._exit = exit
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._running: dict[object, Call] = {}  # key: the task (async) or a token (sync)
        self._wake_at = math.inf
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._limits = _limits.current_watch()
        self._recent_since: float | None = None  # earliest start of calls that ended lately
        self._last_end = 0.0
        self._last_poll = 0.0
        self._pending: LimitHit | None = None  # noticed with no call running: for the next one

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start watching (call on the loop's thread, in the process that serves)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        _SLEEPERS[self._loop_thread] = threading.Event()
        self._limits = _limits.current_watch()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="aenv-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        _SLEEPERS.pop(self._loop_thread, None)
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # -- the calls' side ---------------------------------------------------------------------
    def enter(
        self, kind: str, name: str, limit: float, deadline: float, *, is_async: bool
    ) -> object | None:
        """Register a call that starts now (async: on the loop, inside its task); the key to
        :meth:`leave` with."""
        watched = self._limits is not None
        if is_async:
            key: object | None = asyncio.current_task()
            if key is None:  # not in a task (a bare coroutine driven by hand): nothing to cut
                return None
            wake = deadline + SLACK
        elif watched:
            key, wake = object(), math.inf
        else:
            return None
        started = deadline - limit
        self._running[key] = [
            kind,
            name,
            limit,
            deadline,
            started,
            key if is_async else None,
            False,
        ]
        if watched:
            wake = min(wake, max(started, self._last_poll) + POLL_INTERVAL)
        at = self._wake_at
        if wake < at or at == _RECOMPUTING:
            self._lower_wake(wake)
        return key

    def _lower_wake(self, wake: float) -> None:
        with self._cond:
            if wake < self._wake_at or self._wake_at == _RECOMPUTING:
                self._wake_at = wake
                self._cond.notify()

    def leave(self, key: object | None) -> LimitHit | None:
        """Unregister a call that ended; the limits hit while it ran, if any (and a hit found
        while no call ran: processes an earlier call left running)."""
        if key is None:
            return None
        call = self._running.pop(key, None)
        watch = self._limits
        if watch is None or call is None:
            return None
        started = call[STARTED]
        with self._lock:
            hit, self._pending = self._pending, None
            now = time.monotonic()
            since = min([started, *(c[STARTED] for c in self._running.values())])
            if self._recent_since is None or started < self._recent_since:
                self._recent_since = started
            self._last_end = now
            if not self._running and now + QUIET_CHECK < self._wake_at:
                self._wake_at = now + QUIET_CHECK
                self._cond.notify()
        if now - started >= CHECK_AFTER:
            watch.check(since)  # waits for a check the watchdog may be making now
        if watch.last_hit_at >= started:
            found = watch.hits_since(started)
            if found is not None:
                hit = found if hit is None else hit | found
        if not self._running:
            watch.refuse_forks = ""  # the calls running at a memory-limit hit have all ended
            if _limits.KILLED_CHILDREN:
                _limits.reap_killed()
        return hit

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    wait = self._wake_at - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(None if wait == math.inf else wait)
                if self._stopped:
                    return
                now = time.monotonic()
                self._wake_at = _RECOMPUTING  # recomputed below, after the work
                calls = list(self._running.values())
                overdue = [
                    c
                    for c in calls
                    if c[TASK] is not None and not c[CUT] and now >= c[DEADLINE] + SLACK
                ]
                poll = self._limits is not None and (bool(calls) or self._recent_since is not None)
                quiet = not calls
                # running calls: a hit is theirs; none: the calls that ended since the last
                # quiet read (processes they left running)
                since = min(c[STARTED] for c in calls) if calls else self._recent_since or 0.0
            try:
                if poll:
                    self._poll(since, quiet=quiet)
                for call in overdue:
                    self._look_at_loop(call)
            except Exception:
                log.exception("watchdog failed")
            with self._cond:
                self._reschedule()

    def _reschedule(self) -> None:
        """Set ``_wake_at`` from the calls registered now (under the lock)."""
        self._wake_at = _RECOMPUTING  # a call entering from here on takes the lock
        now = time.monotonic()
        wake = math.inf
        for call in list(self._running.values()):
            if call[TASK] is not None and not call[CUT]:
                wake = min(wake, call[DEADLINE] + SLACK)
        if self._limits is not None:
            if self._running:
                wake = min(wake, self._last_poll + POLL_INTERVAL)
            elif self._recent_since is not None:
                wake = min(wake, self._last_end + QUIET_CHECK)
        self._wake_at = max(wake, now) if wake != math.inf else wake

    def _poll(self, since: float, *, quiet: bool) -> None:
        watch = self._limits
        assert watch is not None
        self._last_poll = time.monotonic()
        found = watch.check(since, running=not quiet)  # calls see it with hits_since()
        with self._lock:
            if quiet and not self._running:
                self._recent_since = None
            if found is not None and quiet and not self._running:  # no caller: tell the next
                earlier = LimitHit(found.memory, found.pids, found.killed, earlier=True)
                self._pending = earlier if self._pending is None else self._pending | earlier

    # -- a blocked loop ----------------------------------------------------------------------
    def _look_at_loop(self, overdue: Call) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        ping = threading.Event()
        try:
            loop.call_soon_threadsafe(ping.set)
        except RuntimeError:  # the loop closed
            return
        overdue[CUT] = True
        if ping.wait(PING_WAIT):
            return  # the loop runs: asyncio.timeout ends the call (or the call ignores it)
        blocking = self._blocking_call(loop)
        if blocking is not None and time.monotonic() < blocking[DEADLINE]:
            return  # another call holds the loop within its own limit; its deadline is watched
        culprit = blocking or overdue
        label, limit = _label(culprit), culprit[LIMIT]
        if blocking is not None:
            blocking[CUT] = True
            log.warning(
                "async call blocks the event loop past its deadline: interrupting it",
                extra={"call": label, "timeout": limit},
            )
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._loop_thread), ctypes.py_object(Interrupted)
            )
            sleeper = _SLEEPERS.get(self._loop_thread)
            if sleeper is not None:  # in time.sleep: cut it short, Interrupted follows
                sleeper.set()
        if ping.wait(self.grace):
            return
        if blocking is not None:
            reason = (
                f"{label} blocked the event loop past its {limit:g} s timeout "
                "and did not stop when interrupted (blocking C code such as a socket read, or a "
                "loop that swallows the interruption, in an async def); the instance cannot serve "
                f"any call. Use a sync def for blocking work"
            )
        else:
            reason = (
                f"the event loop has been blocked since {label} reached its "
                f"{limit:g} s timeout, by code outside any call (a task an async tool "
                "left running?); the instance cannot serve any call"
            )
        self._broken(reason)

    def _blocking_call(self, loop: asyncio.AbstractEventLoop) -> Call | None:
        """The registered call whose task the loop is running now, if any."""
        task = asyncio.current_task(loop)
        return None if task is None else self._running.get(task)

    def _broken(self, reason: str) -> None:
        try:
            self._on_broken(reason)
        except Exception:
            log.exception("on_broken failed")
        finally:
            with contextlib.suppress(Exception):
                for handler in logging.getLogger().handlers:
                    handler.flush()
            self._exit(BROKEN_EXIT_CODE)
