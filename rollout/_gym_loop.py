"""A private asyncio event loop on a thread, so that sync callers (gymnasium) drive the async SDK.

The SDK's connections belong to the loop that opened them: every coroutine of one environment
runs on the same loop, whichever thread calls. Used by :mod:`rollout.gym` only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aenv_ray.errors import CallTimeoutError, InstanceClosedError

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An event loop running on its own daemon thread until :meth:`close`.

    >>> runner = LoopThread("demo")
    >>> async def answer() -> int:
    ...     return 42
    >>> runner.run(answer(), timeout=5)
    42
    >>> runner.close()
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def is_closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def run(self, coro: Coroutine[Any, Any, T], *, timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` seconds for its result.

        Past the timeout the coroutine is cancelled and :class:`CallTimeoutError` raised.
        """
        if self._closed:
            coro.close()
            raise InstanceClosedError(f"`{self.name}` is closed; create a new environment")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise CallTimeoutError(
                f"`{self.name}`: no result within {timeout:g} s; the call was cancelled",
                timeout=timeout,
            ) from exc
        except BaseException:  # KeyboardInterrupt in the caller: do not leave it running
            future.cancel()
            raise

    def close(self, *, timeout: float = 5.0) -> None:
        """Cancel what still runs (waiting at most ``timeout``), stop the loop, join its thread.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        drained = asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self._loop)
        try:
            drained.result(timeout)
        except concurrent.futures.TimeoutError:
            drained.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
