"""What the hub's and the engine daemon's Prometheus metrics share (docs/observability.md): a
registry of their own, metrics made through it, and no-ops without ``prometheus_client`` (the
``metrics`` extra), so that a process without it updates nothing and its ``/metrics`` answers
501 with one line saying what to install.

Lazily, inside functions: prometheus_client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aenv_ray.errors import MissingExtraError
from aenv_ray.extras import require_extra

__all__ = ["CREATE_BUCKETS", "MetricSet", "unavailable_line"]

CREATE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: the bucket bounds of instance creates (a warm claim to a cold image pull)."""


def unavailable_line(what: str) -> str | None:
    """The one line ``what``'s ``/metrics`` answers without ``prometheus_client`` (HTTP 501,
    the :class:`~aenv_ray.errors.MissingExtraError`'s); ``None`` when it is installed."""
    try:
        require_extra("metrics", f"{what} /metrics")
    except MissingExtraError as exc:
        return str(exc)
    return None


class _Null:
    """What every metric is without prometheus_client: accepts every update, keeps nothing."""

    def labels(self, *_: Any, **__: Any) -> _Null:
        return self

    def inc(self, amount: float = 1.0) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


_NULL = _Null()


class MetricSet:
    """A registry of one server's metrics; ``available`` is False without prometheus_client,
    and then :meth:`counter`, :meth:`gauge` and :meth:`histogram` give metrics that ignore
    every update (and :meth:`exposition` is not to be called).

    >>> metrics = MetricSet("a test's")
    >>> calls = metrics.counter("aenv_test_calls", "Calls.", ["tool"])
    >>> calls.labels("echo").inc()
    >>> body = metrics.exposition(None)[0] if metrics.available else b""
    >>> not metrics.available or b'aenv_test_calls_total{tool="echo"} 1.0' in body
    True
    """

    def __init__(self, what: str) -> None:
        self.unavailable = unavailable_line(what)
        self.available = self.unavailable is None
        self.registry: Any = None
        if self.available:
            from prometheus_client import CollectorRegistry

            self.registry = CollectorRegistry(auto_describe=True)

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Any:
        """A counter (``name`` without ``_total``, which the exposition adds)."""
        if not self.available:
            return _NULL
        from prometheus_client import Counter

        return Counter(name, documentation, list(labels), registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Any:
        """A gauge."""
        if not self.available:
            return _NULL
        from prometheus_client import Gauge

        return Gauge(name, documentation, list(labels), registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float] = CREATE_BUCKETS,
    ) -> Any:
        """A histogram of seconds with ``buckets`` (their upper bounds)."""
        if not self.available:
            return _NULL
        from prometheus_client import Histogram

        return Histogram(
            name, documentation, list(labels), buckets=tuple(buckets), registry=self.registry
        )

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The registry in the format ``accept`` asks for (Prometheus' text by default,
        OpenMetrics when asked): the body and its content type."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
