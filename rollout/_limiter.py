"""The creation-rate limit: a token bucket, shared across the cluster through one named actor.

Pool actors ask for tokens in batches (``take(n)`` grants up to ``n`` at once and says when more
will be there), so a refill of 50 instances costs one round trip, not 50.

    >>> bucket = TokenBucket(rate=10.0, burst=5, clock=lambda: 0.0)
    >>> bucket.take(8)
    (5, 0.1)
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["LIMITER_NAME", "TokenBucket"]

LIMITER_NAME = "aenv-rollout-creation-limiter"
"""Name of the limiter actor every pool of a Ray namespace shares."""


class TokenBucket:
    """``rate`` creations per second on average, at most ``burst`` at once.

    ``clock`` (default :func:`time.monotonic`) is injectable so tests need no sleeps.
    """

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"need rate > 0 and burst >= 1, got rate={rate} burst={burst}")
        self.rate = float(rate)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, n: int) -> tuple[int, float]:
        """Grant up to ``n`` tokens now: ``(granted, seconds until the next token)``."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        granted = max(0, min(int(n), int(self._tokens)))
        self._tokens -= granted
        wait = max(0.0, (1.0 - self._tokens) / self.rate)
        return granted, round(wait, 6)

    def configure(self, rate: float, burst: int) -> None:
        """Change the limit (the first pool that created the limiter set it)."""
        self.rate, self.burst = float(rate), int(burst)
