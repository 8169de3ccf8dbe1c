"""The engine daemon's Prometheus metrics, answered at ``GET /metrics`` (docs/observability.md).

==============================================  ==============================================
``aenv_engine_instances{state}``                the daemon's instances by state (at scrape)
``aenv_engine_instance_creates_total``          creates begun
``aenv_engine_instance_create_failures_total``  creates that failed, by ``kind`` (the
                                                ``aenv_ray.errors`` class)
``aenv_engine_instance_create_duration_seconds``  successful creates' time
``aenv_engine_errors_total{operation,kind}``    error answers, by route and ``aenv_ray.errors``
                                                class
==============================================  ==============================================

Without ``prometheus_client`` (the ``metrics`` extra) every update is a no-op and ``/metrics``
answers 501 with one line saying what to install.

May import: the standard library, ``aenv_ray``; lazily, inside functions: prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterable

from aenv_ray.prometheus import MetricSet

__all__ = ["EngineMetrics"]


class EngineMetrics(MetricSet):
    """One daemon's metrics; ``available`` is False without prometheus_client (then every
    update is a no-op and :meth:`exposition` is not to be called)."""

    def __init__(self) -> None:
        super().__init__("the engine daemon's")
        self.instances = self.gauge(
            "aenv_engine_instances", "Instances of the engine daemon by state.", ["state"]
        )
        self.creates = self.counter(
            "aenv_engine_instance_creates", "Instance creates begun by the daemon."
        )
        self.create_failures = self.counter(
            "aenv_engine_instance_create_failures",
            "Instance creates that failed, by error kind (the aenv_ray.errors class).",
            ["kind"],
        )
        self.create_seconds = self.histogram(
            "aenv_engine_instance_create_duration_seconds",
            "Seconds a successful create took (the instance started and answering).",
        )
        self.errors = self.counter(
            "aenv_engine_errors",
            "Error answers of the daemon, by operation (method and route) and error kind.",
            ["operation", "kind"],
        )

    def set_instances(self, states: Iterable[str], known: Iterable[str]) -> None:
        """The instances by state (every state in ``known`` shown, 0 when none)."""
        counts: dict[str, int] = dict.fromkeys(known, 0)
        for state in states:
            counts[state] = counts.get(state, 0) + 1
        for state, n in counts.items():
            self.instances.labels(state).set(n)
