"""The one retry loop: jittered exponential backoff with a deadline, sync and async.

Everything in aenv-ray that tries again after a transient failure goes through :func:`retry`
(threads: the Kubernetes API wrapper, the runtime's bundle fetch) or :func:`aretry` (the event
loop: the SDK's transport to an instance). What differs between them is data, a
:class:`Backoff`, and one predicate, ``retryable``, that says which errors another try may fix
(the caller's knowledge: a refused connection, HTTP 429 or 5xx, a read that lost its
connection). Anything else is raised at once; when the tries or the deadline run out, the last
error is raised as it was, traceback and all, so the caller translates it once into its typed
error (:mod:`aenv_ray.errors`).

    >>> from aenv_ray.retry import Backoff, retry
    >>> answers = iter([ConnectionRefusedError("down"), ConnectionRefusedError("down"), "ok"])
    >>> def call() -> str:
    ...     answer = next(answers)
    ...     if isinstance(answer, Exception):
    ...         raise answer
    ...     return answer
    >>> slept: list[float] = []
    >>> retry(call, Backoff(first=0.1, jitter=0, tries=5),
    ...       retryable=lambda exc: isinstance(exc, ConnectionError), sleep=slept.append)
    'ok'
    >>> slept
    [0.1, 0.2]

Time is injected (``sleep``, ``clock``, ``rng``), so the tests of every user of this module run
on a virtual clock and never wait.

May import: the standard library only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "OnRetry", "aretry", "retry"]

T = TypeVar("T")

OnRetry = Callable[[Exception, int, float], None]
"""Called before each pause with the error, the number of the retry (1 for the second try) and
the pause in seconds: where a caller logs."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """How to wait between tries: ``first`` seconds, times ``factor`` after each retry, at most
    ``most``; each pause scaled by a random factor in ``[1 - jitter, 1 + jitter]`` so that many
    clients that failed together do not retry together.

    Two budgets, either or both: ``tries`` (the first try included) and ``within`` (seconds
    from the first try; a pause that would end past it is not taken). With neither, retries go
    on until ``retryable`` says no.

        >>> Backoff(first=0.5, most=8.0, jitter=0).pause(5)
        8.0
    """

    first: float = 0.05
    factor: float = 2.0
    most: float = 2.0
    jitter: float = 0.2
    tries: int | None = None
    within: float | None = None

    def __post_init__(self) -> None:
        if self.first < 0 or self.most < 0 or self.factor < 1:
            raise ValueError(f"{self}: pauses must be >= 0 and the factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"{self}: jitter is a fraction between 0 and 1")
        if self.tries is not None and self.tries < 1:
            raise ValueError(f"{self}: tries counts the first try, so it is at least 1")

    def pause(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1: before the second try)."""
        base = min(self.first * self.factor ** (retry - 1), self.most)
        if self.jitter and base:
            base *= (rng or _RNG).uniform(1 - self.jitter, 1 + self.jitter)
        return base


_RNG = random.Random()


def _next_pause(
    backoff: Backoff,
    exc: Exception,
    retries: int,
    started: float,
    now: float,
    retryable: Callable[[Exception], bool],
    wait_hint: Callable[[Exception], float | None] | None,
    rng: random.Random | None,
) -> float | None:
    """The pause before the next try, or None: give up and raise ``exc``."""
    if not retryable(exc):
        return None
    if backoff.tries is not None and retries + 1 >= backoff.tries:
        return None
    hint = wait_hint(exc) if wait_hint is not None else None
    pause = hint if hint is not None else backoff.pause(retries + 1, rng)
    if backoff.within is not None and now + pause - started > backoff.within:
        return None
    return pause


def retry(
    call: Callable[[], T],
    backoff: Backoff,
    *,
    retryable: Callable[[Exception], bool],
    wait_hint: Callable[[Exception], float | None] | None = None,
    on_retry: OnRetry | None = None,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """``call()``, tried again after each error ``retryable`` accepts while ``backoff``'s
    budgets allow; then its last error is raised unchanged. ``wait_hint`` may name the pause
    an error asks for (an HTTP ``Retry-After``), which replaces the computed one.

        >>> retry(lambda: 1 // 0, Backoff(tries=3), retryable=lambda e: False)
        Traceback (most recent call last):
        ...
        ZeroDivisionError: integer division or modulo by zero
    """
    started = clock()
    retries = 0
    while True:
        try:
            return call()
        except Exception as exc:
            pause = _next_pause(backoff, exc, retries, started, clock(), retryable, wait_hint, rng)
            if pause is None:
                raise
            retries += 1
            if on_retry is not None:
                on_retry(exc, retries, pause)
        sleep(pause)


async def aretry(
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retryable: Callable[[Exception], bool],
    wait_hint: Callable[[Exception], float | None] | None = None,
    on_retry: OnRetry | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """The async twin of :func:`retry`: ``await call()``, the pauses on the event loop."""
    started = clock()
    retries = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            pause = _next_pause(backoff, exc, retries, started, clock(), retryable, wait_hint, rng)
            if pause is None:
                raise
            retries += 1
            if on_retry is not None:
                on_retry(exc, retries, pause)
        await sleep(pause)
