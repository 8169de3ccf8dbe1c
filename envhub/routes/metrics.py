"""``GET /metrics``: the hub's Prometheus metrics (:mod:`envhub.metrics`).

Who may scrape: with a scrape token (``aenv serve --metrics-token-file FILE``) only a request
sending it (``Authorization: Bearer TOKEN``, Prometheus' ``authorization.credentials_file``);
without one, any API key of the hub (with ``--no-auth``, on loopback, anyone). The figures name
no tenant, key or instance. Without prometheus_client the answer is 501 and one line.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from aenv_ray.engine import InstanceState, WarmPoolEngine
from aenv_ray.errors import AuthenticationError
from envhub.metrics import scrape_allowed
from envhub.routes.context import caller, serving

__all__ = ["router"]

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def scrape(request: Request) -> Response:
    """The hub's metrics in Prometheus' text format (OpenMetrics when the scraper asks)."""
    hub = serving(request)
    token = hub.options.metrics_token
    if token is not None:
        if not scrape_allowed(token, request.headers.get("authorization")):
            raise AuthenticationError(
                "/metrics needs the hub's scrape token: send `Authorization: Bearer TOKEN` "
                "(the token in the file given to `aenv serve --metrics-token-file`)"
            )
    else:
        await caller(request)  # any API key (none asked with --no-auth)
    metrics = hub.metrics
    if not metrics.available:
        line = metrics.unavailable or "prometheus_client did not load"
        return PlainTextResponse(line + "\n", status_code=501)
    states: dict[str, int] = {}
    for doc in (await hub.store.list("instances")).values():
        state = str(doc.get("state"))
        states[state] = states.get(state, 0) + 1
    metrics.set_instances(states, tuple(s.value for s in InstanceState))
    engine = hub.control.engine
    if isinstance(engine, WarmPoolEngine):
        for ref, (spec, count) in hub.control.warm_specs().items():
            counted = await engine.warm_count(spec, pool=hub.control.warm_pool)
            metrics.warm_target.labels(ref).set(count)
            metrics.warm_instances.labels(ref, "ready").set(counted.ready)
            metrics.warm_instances.labels(ref, "starting").set(counted.starting)
    body, content_type = metrics.exposition(request.headers.get("accept"))
    return Response(body, media_type=content_type)
