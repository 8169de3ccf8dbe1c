"""What every router shares: the hub's parts (:class:`Hub`), how it behaves
(:class:`HubOptions`), and who sent a request (``Who``, the auth dependency).

:func:`envhub.app.create_app` builds one :class:`Hub` and puts it in ``app.state.hub``; a handler
receives it by declaring ``hub: HubDep``; the proxy's handlers, on the path of every tool call
sent through the hub, and the auth dependency call :func:`serving` instead (one dependency less
for FastAPI to solve per request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from aenv_ray.errors import AuthenticationError
from envhub.control import ControlPlane
from envhub.defences import Defences, FailureThrottle, peer_of
from envhub.keys import LOCAL_TENANT, Caller, authenticate
from envhub.limits import Limits
from envhub.metrics import HubMetrics
from envhub.registry import DEFAULT_MAX_BUNDLE, VersionRegistry
from envhub.routes.forward import Forwarder
from envhub.runs import RunStore
from envhub.store import Store

__all__ = ["Hub", "HubDep", "HubOptions", "Who", "caller", "hub_of", "serving"]


@dataclass(frozen=True)
class HubOptions:
    """How a hub behaves (``aenv serve``'s options)."""

    auth: bool = True
    data_dir: Path = Path(".")
    max_bundle: int = DEFAULT_MAX_BUNDLE
    datasource_root: Path | None = None  # datasources are directories under this, else refused
    reap_interval: float = 1.0
    sync_interval: float = 5.0
    close_store: bool = True  # the app closes the store when it stops
    limits: Limits = field(default_factory=Limits)  # quotas and caps per tenant
    warm: Mapping[str, int] = field(default_factory=dict)  # ref -> free instances kept started
    # seals the instance tokens the store keeps (envhub.seal); None: AENV_HUB_SECRET's value is
    # not given, the hub keeps its own in data_dir/hub-secret
    secret: bytes | None = field(default=None, repr=False)
    defences: Defences = field(default_factory=Defences)  # timeouts, connection caps, auth throttle
    # the bearer token a scraper of /metrics sends (docs/observability.md); None: any API key
    metrics_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Hub:
    """One hub's parts, shared by its routers: built once by :func:`envhub.app.create_app`."""

    options: HubOptions
    store: Store
    registry: VersionRegistry
    control: ControlPlane
    forwarder: Forwarder  # the proxy's client to runtimes (opened by the app's lifespan)
    throttle: FailureThrottle  # failed authentications per client
    runs: RunStore  # the rollout runs drivers push (/v1/runs), in DATA_DIR/runs
    metrics: HubMetrics = field(default_factory=HubMetrics)  # GET /metrics (envhub.metrics)


def serving(request: Request) -> Hub:
    """The hub serving ``request`` (for handlers on the proxy's path, where each dependency
    FastAPI solves costs some microseconds per call)."""
    hub: Hub = request.app.state.hub
    return hub


async def hub_of(request: Request) -> Hub:
    """The hub serving ``request``, as a dependency (async: FastAPI would run a plain function
    in a thread)."""
    return serving(request)


HubDep = Annotated[Hub, Depends(hub_of)]


async def caller(request: Request) -> Caller:
    """Who sent the request (every route but health and the OpenAPI document needs a key).
    A client past its failed authentications (:class:`~envhub.defences.FailureThrottle`: keys
    sent that did not authenticate; a request without a key costs nothing and is not counted)
    gets :class:`~aenv_ray.errors.RateLimitedError` (429) without its key being looked at."""
    hub = serving(request)  # not through HubDep: one dependency less to solve per request
    if not hub.options.auth:
        return Caller(tenant=LOCAL_TENANT)
    client = peer_of(request.scope)
    refusal = hub.throttle.refusal(client)
    if refusal is not None:  # guessing: its keys are not even looked at
        raise refusal
    authorization = request.headers.get("authorization")
    try:
        return await authenticate(hub.store, authorization)
    except AuthenticationError:
        if authorization:  # a key that failed: a guess, or a wrong or revoked key
            hub.throttle.failed(client)
        raise


Who = Annotated[Caller, Depends(caller)]
