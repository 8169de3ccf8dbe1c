"""Run synchronous environment code so that a timeout really interrupts it.

Sync tools run one at a time on the thread that calls :meth:`SyncRunner.run_forever`, which the
runtime makes the process's main thread while the HTTP servers run on a background event loop.
On the main thread a deadline is enforced with ``SIGALRM``: the handler raises
:class:`Interrupted` into the running code, which stops pure-Python busy loops and blocking calls
such as ``time.sleep`` alike. If the code swallows the exception, the alarm fires again every
``REARM_SECONDS`` until it gives up. On any other thread (an embedding that is not ours) only
Python bytecode can be interrupted, through ``PyThreadState_SetAsyncExc``.

Running sync tools serially also gives a quiescent point for ``fork``: between jobs the main thread
holds no locks of the server's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DeadlineExceeded",
    "ExitAttemptError",
    "Interrupted",
    "SyncRunner",
    "WorkerStuckError",
]

log = logging.getLogger("sandbox_runtime.runner")

_IDLE_WAKE = 5.0
"""Seconds an idle runner waits for a job before it looks again. Python runs signal handlers on
the main thread only, and only when it runs Python: a SIGTERM the kernel hands to another
thread while this one waits would otherwise wait for the next job. The runtime's threads block
those signals, so this is the fallback for a thread that does not (one the environment started);
a wake every 5 s keeps an idle instance's CPU at nothing measurable."""

REARM_SECONDS = 0.2


class Interrupted(BaseException):
    """Raised inside sync code whose deadline passed. A BaseException so that ``except
    Exception`` in user code does not swallow it."""


class DeadlineExceeded(Exception):
    """What a submitted future resolves to when its job hit the deadline (queued or running)."""


class ExitAttemptError(Exception):
    """Sync code raised a BaseException that is not an Exception (``SystemExit``,
    ``KeyboardInterrupt``): reported as the tool's failure, never allowed to stop the server."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {original}")
        self.original_type = type(original).__name__


class WorkerStuckError(Exception):
    """The worker is still inside a job that ignored its interruption: no sync call can run.

    The instance is broken; engines replace it. Cleared if the job ever returns."""


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    kwargs: dict[str, Any]
    deadline: float | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    interrupted: bool = field(default=False)


_STOP = object()


@dataclass(eq=False)
class _Call:
    """A plain callable to run on the worker between jobs (``fork`` uses it)."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]


class SyncRunner:
    """A single worker for synchronous calls with hard deadlines."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Job | _Call | object] = queue.SimpleQueue()
        self._current: _Job | None = None
        self._thread: threading.Thread | None = None
        self._use_signals = False
        self._stopping = False
        self.stuck_in: str | None = None
        self._stuck_future: asyncio.Future[Any] | None = None

    # -- event-loop side ---------------------------------------------------------------------
    def submit(
        self, fn: Callable[..., Any], kwargs: dict[str, Any], *, deadline: float | None
    ) -> asyncio.Future[Any]:
        """Queue ``fn(**kwargs)``; the future resolves to its value or exception.

        A job whose deadline passes while it waits in the queue never starts; it and a job
        interrupted while running both resolve to :class:`DeadlineExceeded`.
        """
        if self.stuck_in is not None:
            raise WorkerStuckError(
                f"the instance is stuck in `{self.stuck_in}`, which ignored its interruption; "
                "no further sync call can run. Replace this instance"
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put(_Job(fn, kwargs, deadline, loop, future))
        return future

    def mark_stuck(self, future: asyncio.Future[Any], name: str) -> None:
        """Declare the job behind ``future`` stuck (it overran its deadline and grace)."""
        if not future.done():
            self.stuck_in = name
            self._stuck_future = future
            future.cancel()

    def call_between_jobs(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn()`` on the worker thread when no job runs (from any thread, no loop needed).

        No deadline: ``fn`` is the runtime's own code (``fork``), not the environment's.
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put(_Call(fn, future))
        return future

    @property
    def is_busy(self) -> bool:
        """True while a job runs."""
        return self._current is not None

    # -- worker side -------------------------------------------------------------------------
    def run_forever(self) -> None:
        """Serve jobs on the calling thread until :meth:`stop`."""
        self._thread = threading.current_thread()
        self._use_signals = self._thread is threading.main_thread()
        watchdog: threading.Thread | None = None
        if self._use_signals:
            signal.signal(signal.SIGALRM, self._on_alarm)
        else:
            log.warning(
                "sync runner is not on the main thread: timeouts interrupt Python code only, "
                "not blocking calls such as time.sleep",
            )
            watchdog = threading.Thread(target=self._watch, name="aenv-watchdog", daemon=True)
            watchdog.start()
        while not self._stopping:
            try:
                item = self._queue.get(timeout=_IDLE_WAKE)
            except queue.Empty:
                continue  # back in Python: a handler for a signal another thread got runs now
            if item is _STOP:
                break
            if isinstance(item, _Call):
                try:
                    item.future.set_result(item.fn())
                except BaseException as exc:  # reported to the caller, never kills the worker
                    item.future.set_exception(exc)
                continue
            assert isinstance(item, _Job)
            self._run(item)

    def stop(self) -> None:
        """Ask :meth:`run_forever` to return; interrupts the running job, if any."""
        self._stopping = True
        self._queue.put(_STOP)
        job = self._current
        if job is not None and self._thread is not None:
            if self._use_signals and threading.current_thread() is self._thread:
                job.interrupted = True
                raise Interrupted
            self._interrupt(job)

    def _run(self, job: _Job) -> None:
        if job.future.cancelled():
            return
        outcome: tuple[bool, Any] | None = None
        try:
            try:
                remaining = None if job.deadline is None else job.deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    outcome = (False, DeadlineExceeded("the deadline passed before it started"))
                else:
                    self._current = job
                    if self._use_signals and remaining is not None:
                        signal.setitimer(signal.ITIMER_REAL, remaining)
                    value = job.fn(**job.kwargs)
                    outcome = (False, _late()) if job.interrupted else (True, value)
            except Interrupted:
                outcome = (False, _late())
            except BaseException as exc:  # SystemExit in a tool must not end the server
                if job.interrupted:
                    outcome = (False, _late())
                else:
                    outcome = (False, exc if isinstance(exc, Exception) else ExitAttemptError(exc))
            finally:
                self._current = None
                if self._stuck_future is job.future:
                    self.stuck_in, self._stuck_future = None, None
                if self._use_signals:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except Interrupted:  # the alarm fired in the gap after the call returned
            if outcome is None:
                outcome = (False, _late())
        assert outcome is not None
        job.loop.call_soon_threadsafe(_resolve, job.future, outcome)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        job = self._current
        if job is None:
            return
        job.interrupted = True
        signal.setitimer(signal.ITIMER_REAL, REARM_SECONDS)
        raise Interrupted

    def _interrupt(self, job: _Job) -> None:
        thread = self._thread
        if thread is None or thread.ident is None:
            return
        job.interrupted = True
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupted)
        )

    def _watch(self) -> None:
        while not self._stopping:
            job = self._current
            if job is not None and job.deadline is not None and time.monotonic() > job.deadline:
                self._interrupt(job)
                time.sleep(REARM_SECONDS)
            else:
                time.sleep(0.02)


def _late() -> DeadlineExceeded:
    return DeadlineExceeded("interrupted at its deadline")


def _resolve(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
