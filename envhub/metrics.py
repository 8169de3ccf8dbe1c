"""The hub's Prometheus metrics, answered at ``GET /metrics`` (docs/observability.md).

:class:`HubMetrics` holds one registry per app (several hubs may share a process: the tests'),
updated where the work happens, each update a few dictionary look-ups and additions off the
store and the network:

==============================================  ==============================================
``aenv_hub_instances{state}``                   instance records by state (counted at scrape)
``aenv_hub_instance_creates_total``             creates begun (a retried idempotent create
                                                that finds its instance is none)
``aenv_hub_instance_create_failures_total``     creates that failed, by ``kind`` (the
                                                ``aenv_ray.errors`` class)
``aenv_hub_instance_create_duration_seconds``   successful creates' time, by ``source``
                                                (``engine``: started; ``warm``: claimed)
``aenv_hub_warm_claims_total{result}``          claims of a warm pool: ``claimed``, ``empty``
``aenv_hub_warm_instances{env,state}``          free warm instances (``ready``, ``starting``)
``aenv_hub_warm_target{env}``                   free instances asked for (``--warm REF=N``)
``aenv_hub_proxy_requests_total``               requests through the proxy, by ``target``
                                                (instance, service) and ``endpoint``
``aenv_hub_proxy_request_duration_seconds``     their time to the runtime's answer's headers
``aenv_hub_errors_total{kind}``                 error answers by ``aenv_ray.errors`` class
==============================================  ==============================================

Without ``prometheus_client`` (the ``metrics`` extra) every update is a no-op and ``/metrics``
answers 501 with one line saying what to install; the rest of the hub works as before.

May import: the standard library, ``aenv_ray``, ``envhub``; lazily, inside functions:
prometheus_client.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aenv_ray.prometheus import MetricSet

__all__ = ["CALL_BUCKETS", "HubMetrics", "endpoint_of", "scrape_allowed"]

CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
"""Seconds: the bucket bounds of calls (a fast-path echo to a long tool)."""

_ENDPOINTS = (
    ("aenv/v1/call", "call"),
    ("aenv/v1/tools", "tools"),
    ("mcp", "mcp"),
    ("task/reward", "reward"),
    ("functions/", "functions"),
    ("health", "health"),
)


def endpoint_of(path: str) -> str:
    """Which of the runtime's endpoints a proxied ``path`` is (a bounded label: any other
    path is ``other``).

    >>> endpoint_of("aenv/v1/call"), endpoint_of("mcp/"), endpoint_of("x/y")
    ('call', 'mcp', 'other')
    """
    for prefix, name in _ENDPOINTS:
        if path.startswith(prefix):
            return name
    return "other"


def scrape_allowed(token: str | None, authorization: str | None) -> bool:
    """Whether ``authorization`` (the request's header) carries the scrape ``token``
    (``Bearer TOKEN``), compared in constant time."""
    if token is None or not authorization:
        return False
    scheme, _, given = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token)


class HubMetrics(MetricSet):
    """One hub's metrics (see the module docstring); ``available`` is False without
    prometheus_client, and then every update is a no-op."""

    def __init__(self) -> None:
        super().__init__("the hub's")
        self.instances = self.gauge(
            "aenv_hub_instances", "Instance records of the hub by state.", ["state"]
        )
        self.creates = self.counter(
            "aenv_hub_instance_creates", "Instance creates begun by the hub."
        )
        self.create_failures = self.counter(
            "aenv_hub_instance_create_failures",
            "Instance creates that failed, by error kind (the aenv_ray.errors class).",
            ["kind"],
        )
        self.create_seconds = self.histogram(
            "aenv_hub_instance_create_duration_seconds",
            "Seconds a successful create took, by source (engine: started; warm: claimed).",
            ["source"],
        )
        self.warm_claims = self.counter(
            "aenv_hub_warm_claims",
            "Claims of a free warm instance, by result (claimed, empty).",
            ["result"],
        )
        self.warm_instances = self.gauge(
            "aenv_hub_warm_instances",
            "Free instances of a warm pool, by environment and state (ready, starting).",
            ["env", "state"],
        )
        self.warm_target = self.gauge(
            "aenv_hub_warm_target", "Free instances a warm pool is kept at (--warm REF=N).", ["env"]
        )
        self.errors = self.counter(
            "aenv_hub_errors",
            "Error answers of the hub, by kind (the aenv_ray.errors class).",
            ["kind"],
        )
        self.proxied = self.counter(
            "aenv_hub_proxy_requests",
            "Requests through the hub's proxy, by target (instance, service) and endpoint.",
            ["target", "endpoint"],
        )
        self.proxy_seconds = self.histogram(
            "aenv_hub_proxy_request_duration_seconds",
            "Seconds from a proxied request to its runtime's answer's headers, by endpoint.",
            ["endpoint"],
            buckets=CALL_BUCKETS,
        )

    # -- updates -------------------------------------------------------------------------------
    def error(self, exc: BaseException) -> None:
        """Count an error answer of the hub."""
        self.errors.labels(type(exc).__name__).inc()

    def proxied_request(self, target: str, path: str, seconds: float) -> None:
        """Count a request through the proxy and its time to the runtime's answer."""
        endpoint = endpoint_of(path)
        self.proxied.labels(target, endpoint).inc()
        self.proxy_seconds.labels(endpoint).observe(seconds)

    def set_instances(self, states: Mapping[str, int], known: tuple[str, ...]) -> None:
        """The instance records by state (every state in ``known`` shown, 0 when none)."""
        for state in {*known, *states}:
            self.instances.labels(state).set(states.get(state, 0))
