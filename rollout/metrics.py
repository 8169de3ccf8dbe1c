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

__all__ = [
    "CALL_BUCKETS",
    "COUNTERS",
    "LatencyHistogram",
    "Phase",
    "PhaseSummary",
    "PoolStats",
    "RayMetrics",
    "count_episode",
]

_RATIO = 1.04
_LOG_RATIO = math.log(_RATIO)
_SMALLEST = 1e-6  # seconds: the first bucket holds everything up to a microsecond

CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
"""Seconds: the bucket bounds of the Prometheus histogram of tool calls (the hub's too)."""

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
        self._calls = metrics.Counter(
            "aenv_rollout_tool_calls_total",
            "tool calls by tool and outcome (ok, a tool error's kind, an exception's class)",
            tag_keys=("pool", "tool", "outcome"),
        )
        self._call_seconds = metrics.Histogram(
            "aenv_rollout_tool_call_duration_seconds",
            "seconds of a tool call in the pool actor, by tool",
            boundaries=list(CALL_BUCKETS),
            tag_keys=("pool", "tool"),
        )
        self._errors = metrics.Counter(
            "aenv_rollout_errors_total",
            "tool calls that failed, by kind (a tool error's kind, an exception's class)",
            tag_keys=("pool", "kind"),
        )
        self._acquires = metrics.Counter(
            "aenv_rollout_acquires_total",
            "acquires by result: warm (an idle instance at once), waited, none (nothing in time)",
            tag_keys=("pool", "result"),
        )
        self._target = metrics.Gauge(
            "aenv_rollout_warm_target", "warm instances the pool actor keeps", tag_keys=("pool",)
        )
        self._published_calls: dict[tuple[str, str], int] = {}
        self._published_buckets: dict[str, list[int]] = {}
        self._published_acquires: dict[str, int] = {}

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
        self._target.set(float(report.get("size", 0)), tags={"pool": pool})
        for tool, outcome, n in report.get("tool_calls", ()):
            grown = int(n) - self._published_calls.get((tool, outcome), 0)
            if grown > 0:
                self._calls.inc(grown, tags={"pool": pool, "tool": tool, "outcome": outcome})
                if outcome != "ok":
                    self._errors.inc(grown, tags={"pool": pool, "kind": outcome})
                self._published_calls[(tool, outcome)] = int(n)
        for tool, counts in report.get("tool_buckets", {}).items():
            before = self._published_buckets.get(tool) or [0] * len(counts)
            tags = {"pool": pool, "tool": tool}
            for index, (now, then) in enumerate(zip(counts, before, strict=True)):
                # Ray's histogram takes one value at a time: a value inside the bucket, once per
                # call counted in it since the last publish (off the call path, once a second)
                value = _inside(index)
                for _ in range(int(now) - int(then)):
                    self._call_seconds.observe(value, tags=tags)
            self._published_buckets[tool] = [int(c) for c in counts]
        for result, n in report.get("acquires", {}).items():
            grown = int(n) - self._published_acquires.get(result, 0)
            if grown > 0:
                self._acquires.inc(grown, tags={"pool": pool, "result": result})
                self._published_acquires[result] = int(n)


def _inside(index: int) -> float:
    """A value inside bucket ``index`` of :data:`CALL_BUCKETS` (the last: past the last bound)."""
    if index >= len(CALL_BUCKETS):
        return CALL_BUCKETS[-1] * 2
    low = CALL_BUCKETS[index - 1] if index else 0.0
    return (low + CALL_BUCKETS[index]) / 2


_episodes: Any = None


def count_episode(pool: str, outcome: str) -> None:
    """Count one episode's outcome (``aenv_rollout_episodes_total{pool,outcome}``, a Ray
    metric of the driver's process) when Ray runs here; nothing otherwise."""
    global _episodes
    import ray

    if not ray.is_initialized():
        return
    if _episodes is None:
        from ray.util import metrics

        _episodes = metrics.Counter(
            "aenv_rollout_episodes_total",
            "episodes by outcome (ok, agent_error, timeout, infrastructure_error)",
            tag_keys=("pool", "outcome"),
        )
    _episodes.inc(1, tags={"pool": pool, "outcome": outcome})
