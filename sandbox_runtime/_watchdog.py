"""The watchdog: one thread that ends async calls blocking the event loop past their deadline,
and re-reads the instance's limit counters while calls run.

Async tools run on the HTTP event loop, under ``asyncio.timeout``; that only works while the
loop gets control back. An ``async def`` tool that blocks (``while True: pass``,
``time.sleep(100)``) stalls every request of the instance. Every async call is registered here
with its deadline; when one is still running ``SLACK`` after it, the watchdog posts a no-op to
the loop. If the loop does not run it within ``PING_WAIT``, the loop is blocked: when the task it
is running is that call's (or another overdue call's), the watchdog raises :class:`Interrupted`
inside the loop thread (``PyThreadState_SetAsyncExc``), which ends Python-level busy code, and
the call ends with the usual timeout result. If the loop is still blocked ``grace`` seconds later
(C code such as ``time.sleep``, or code that swallows the exception), the instance cannot
recover: ``on_broken(reason)`` is called and the process ends (``os._exit``), so every caller
gets ``InstanceBrokenError`` at once instead of a hang.

Cost: nothing while idle (the thread waits on a condition; no periodic wake-up while no call
runs); per async call a small record, a lock and a dict entry, and a wake-up of the thread only
when the call's deadline is earlier than the one it already waits for (so about once per
deadline period, not per call). Sync calls are not registered at all unless limits are watched
(:mod:`sandbox_runtime._limits`): then the counters are read at the end of calls that ran
``CHECK_AFTER`` or longer, every ``POLL_INTERVAL`` while calls run, and once ``QUIET_CHECK``
after the last call ended.
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

from sandbox_runtime import _limits
from sandbox_runtime._limits import LimitHit
from sandbox_runtime._runner import Interrupted

__all__ = ["BROKEN_EXIT_CODE", "Call", "Watchdog"]

log = logging.getLogger("sandbox_runtime.watchdog")

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


class Call:
    """One registered call: what the watchdog knows about it."""

    __slots__ = ("cut", "deadline", "kind", "limit", "name", "started", "task")

    def __init__(
        self,
        kind: str,
        name: str,
        limit: float,
        deadline: float,
        started: float,
        task: asyncio.Task[object] | None,
    ) -> None:
        self.kind = kind  # "tool", "function", "reward", "health"
        self.name = name
        self.limit = limit
        self.deadline = deadline
        self.started = started
        self.task = task  # the asyncio task of an async call, None for a sync one
        self.cut = False  # looked at past its deadline: not again

    @property
    def label(self) -> str:
        """``tool `name```: what messages call it."""
        return f"{self.kind} `{self.name}`"


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
        self._running: dict[Call, None] = {}
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
        self._limits = _limits.current_watch()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="aenv-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # -- the calls' side ---------------------------------------------------------------------
    def enter(
        self, kind: str, name: str, limit: float, deadline: float, *, is_async: bool
    ) -> Call | None:
        """Register a call that starts now (async: on the loop, inside its task)."""
        watched = self._limits is not None
        if not is_async and not watched:
            return None
        now = time.monotonic()
        task = asyncio.current_task() if is_async else None
        call = Call(kind, name, limit, deadline, now, task)
        wake = deadline + SLACK if is_async else math.inf
        if watched:
            wake = min(wake, max(now, self._last_poll) + POLL_INTERVAL)
        with self._lock:
            self._running[call] = None
            if wake < self._wake_at:
                self._wake_at = wake
                self._cond.notify()
        return call

    def leave(self, call: Call | None) -> LimitHit | None:
        """Unregister a call that ended; the limits hit while it ran, if any (and a hit found
        while no call ran: processes an earlier call left running)."""
        if call is None:
            return None
        watch = self._limits
        with self._lock:
            self._running.pop(call, None)
            if watch is None:
                return None
            hit, self._pending = self._pending, None
            now = time.monotonic()
            since = min([call.started, *(c.started for c in self._running)])
            if self._recent_since is None or call.started < self._recent_since:
                self._recent_since = call.started
            self._last_end = now
            if not self._running and now + QUIET_CHECK < self._wake_at:
                self._wake_at = now + QUIET_CHECK
                self._cond.notify()
        if now - call.started >= CHECK_AFTER:
            watch.check(since)  # waits for a check the watchdog may be making now
        if watch.last_hit_at >= call.started:
            found = watch.hits_since(call.started)
            if found is not None:
                hit = found if hit is None else hit | found
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
                calls = list(self._running)
                overdue = [
                    c
                    for c in calls
                    if c.task is not None and not c.cut and now >= c.deadline + SLACK
                ]
                poll = self._limits is not None and (bool(calls) or self._recent_since is not None)
                quiet = not calls
                # running calls: a hit is theirs; none: the calls that ended since the last
                # quiet read (processes they left running)
                since = min(c.started for c in calls) if calls else self._recent_since or 0.0
                self._wake_at = math.inf  # recomputed below, after the work
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
        now = time.monotonic()
        wake = math.inf
        for call in self._running:
            if call.task is not None and not call.cut:
                wake = min(wake, call.deadline + SLACK)
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
        found = watch.check(since)  # running calls see it with hits_since() as they end
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
        overdue.cut = True
        if ping.wait(PING_WAIT):
            return  # the loop runs: asyncio.timeout ends the call (or the call ignores it)
        blocking = self._blocking_call(loop)
        if blocking is not None and time.monotonic() < blocking.deadline:
            return  # another call holds the loop within its own limit; its deadline is watched
        culprit = blocking or overdue
        if blocking is not None:
            blocking.cut = True
            log.warning(
                "async call blocks the event loop past its deadline: interrupting it",
                extra={"call": blocking.label, "timeout": blocking.limit},
            )
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._loop_thread), ctypes.py_object(Interrupted)
            )
        if ping.wait(self.grace):
            return
        if blocking is not None:
            reason = (
                f"{culprit.label} blocked the event loop past its {culprit.limit:g} s timeout "
                f"and did not stop when interrupted (blocking code such as time.sleep, or a loop "
                f"that swallows the interruption, in an async def); the instance cannot serve "
                f"any call. Use a sync def for blocking work"
            )
        else:
            reason = (
                f"the event loop has been blocked since {culprit.label} reached its "
                f"{culprit.limit:g} s timeout, by code outside any call (a task an async tool "
                "left running?); the instance cannot serve any call"
            )
        self._broken(reason)

    def _blocking_call(self, loop: asyncio.AbstractEventLoop) -> Call | None:
        """The registered call whose task the loop is running now, if any."""
        task = asyncio.current_task(loop)
        if task is None:
            return None
        with self._lock:
            for call in self._running:
                if call.task is task:
                    return call
        return None

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
