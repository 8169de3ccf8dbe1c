"""Pool metrics: per-phase latency histograms that merge across actors, counters, Ray metrics.

A :class:`LatencyHistogram` counts samples in log-spaced buckets (4 % wide), so the histograms of
every pool actor add up exactly and p50/p99 of the merge are as good as those of one actor.

    >>> h = LatencyHistogram()
    >>> for ms in range(1, 101):
    ...     h.observe(ms / 1000)
    >>> 48 <= h.quantile(0.5) * 1000 <= 52  # the true median is 50 ms; a bucket is 4 % wide
    True
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COUNTERS", "LatencyHistogram", "Phase", "PhaseSummary", "PoolStats", "RayMetrics"]

_RATIO = 1.04
_LOG_RATIO = math.log(_RATIO)
_SMALLEST = 1e-6  # seconds: the first bucket holds everything up to a microsecond

COUNTERS = ("created", "broken", "expired", "retried", "reclaimed", "released", "acquired")
"""Counter names every pool actor reports (events since it started)."""


class Phase(enum.Enum):
    """What a latency sample measures."""

    ACQUIRE = "acquire"  # from the acquire request reaching the actor to a lease
    CREATE = "create"  # an instance created and healthy
    FIRST_CALL = "first_call"  # the first call on a new lease
    TOOL_CALL = "tool_call"  # every tool call
    REWARD = "reward"  # every reward call


def _middle(index: int) -> float:
    """The middle of bucket ``index`` (> 0), seconds."""
    return _SMALLEST * math.pow(_RATIO, index - 0.5)


class LatencyHistogram:
    """Seconds in log buckets; mergeable (:meth:`merge`), picklable, O(1) per sample."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Add one sample."""
        index = 0 if seconds <= _SMALLEST else 1 + int(math.log(seconds / _SMALLEST) / _LOG_RATIO)
        self.buckets[index] = self.buckets.get(index, 0) + 1
        self.count += 1
        self.total += seconds

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s samples to this one."""
        for index, n in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + n
        self.count += other.count
        self.total += other.total

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (nearest rank, the bucket's middle), seconds; 0.0 when empty."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                if index == 0:
                    return _SMALLEST
                return _middle(index)
        return _middle(max(self.buckets))

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for shipping between processes."""
        return {"buckets": dict(self.buckets), "count": self.count, "total": self.total}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyHistogram:
        """The inverse of :meth:`to_dict`."""
        h = cls()
        h.buckets = {int(k): int(v) for k, v in data["buckets"].items()}
        h.count = int(data["count"])
        h.total = float(data["total"])
        return h


@dataclass(frozen=True)
class PhaseSummary:
    """Latency of one phase: samples, p50, p99 and mean, in seconds."""

    count: int
    p50: float
    p99: float
    mean: float

    @classmethod
    def of(cls, h: LatencyHistogram) -> PhaseSummary:
        """Summarize a histogram."""
        mean = h.total / h.count if h.count else 0.0
        return cls(h.count, h.quantile(0.5), h.quantile(0.99), mean)


@dataclass(frozen=True)
class PoolStats:
    """What :meth:`RolloutPool.stats` reports, summed over the pool's actors.

    ``phases`` maps each :class:`Phase` value (``"acquire"``, ``"tool_call"``, ...) to its
    :class:`PhaseSummary`; ``counters`` holds :data:`COUNTERS`; the gauges are instances now.
    """

    actors: int
    idle: int
    leased: int
    creating: int
    phases: dict[str, PhaseSummary] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    actor_restarts: int = 0

    @classmethod
    def merge(cls, reports: Iterable[Mapping[str, Any]], *, actor_restarts: int = 0) -> PoolStats:
        """Sum the per-actor reports of :meth:`InstancePool.report`."""
        reports = list(reports)
        phases: dict[str, LatencyHistogram] = {p.value: LatencyHistogram() for p in Phase}
        counters = dict.fromkeys(COUNTERS, 0)
        for report in reports:
            for name, data in report["phases"].items():
                phases[name].merge(LatencyHistogram.from_dict(data))
            for name, n in report["counters"].items():
                counters[name] = counters.get(name, 0) + int(n)
        return cls(
            actors=len(reports),
            idle=sum(int(r["idle"]) for r in reports),
            leased=sum(int(r["leased"]) for r in reports),
            creating=sum(int(r["creating"]) for r in reports),
            phases={name: PhaseSummary.of(h) for name, h in phases.items()},
            counters=counters,
            actor_restarts=actor_restarts,
        )


class RayMetrics:
    """The same figures as Ray metrics (``ray.util.metrics``), tagged with the pool's name.

    Counters are exported as they grow; phase quantiles as gauges, refreshed by :meth:`publish`
    (the pool actor calls it once a second, so a busy pool pays nothing per call).
    """

    def __init__(self, pool: str) -> None:
        from ray.util import metrics

        tags = ("pool", "phase")
        self._tags = {"pool": pool}
        self._p50 = metrics.Gauge(
            "aenv_rollout_latency_p50_seconds", "p50 latency by phase", tag_keys=tags
        )
        self._p99 = metrics.Gauge(
            "aenv_rollout_latency_p99_seconds", "p99 latency by phase", tag_keys=tags
        )
        self._events = metrics.Counter(
            "aenv_rollout_events_total", "pool events by kind", tag_keys=("pool", "event")
        )
        self._instances = metrics.Gauge(
            "aenv_rollout_instances", "instances by state", tag_keys=("pool", "state")
        )
        self._published = dict.fromkeys(COUNTERS, 0)

    def publish(self, report: Mapping[str, Any]) -> None:
        """Export one actor's :meth:`InstancePool.report`."""
        pool = self._tags["pool"]
        for name, data in report["phases"].items():
            summary = PhaseSummary.of(LatencyHistogram.from_dict(data))
            if summary.count:
                self._p50.set(summary.p50, tags={"pool": pool, "phase": name})
                self._p99.set(summary.p99, tags={"pool": pool, "phase": name})
        for name, n in report["counters"].items():
            grown = int(n) - self._published.get(name, 0)
            if grown > 0:
                self._events.inc(grown, tags={"pool": pool, "event": name})
                self._published[name] = int(n)
        for state in ("idle", "leased", "creating"):
            self._instances.set(float(report[state]), tags={"pool": pool, "state": state})
