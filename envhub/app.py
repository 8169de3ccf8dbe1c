"""EnvHub's HTTP API (FastAPI): the registry, the control plane, and a proxy to instances.

Every route but ``/v1/health``, the OpenAPI document (``/openapi.json``, browsable at
``/docs``) and an instance's preview (whose path holds its capability: ``GET``/``HEAD`` of
``.../proxy/aenv/v1/preview/...``, :mod:`envhub.routes.proxy`) needs
``Authorization: Bearer KEY`` unless the hub runs with ``auth=False``. Errors
are :func:`aenv_ray.errors.encode_error`'s envelope, ``{"error": "MESSAGE", "type":
"<aenv_ray.errors class>", "retryable": BOOL, ...typed fields}``, with the status of their
kind (401, 403, 404, 409, 410, 413, 415, 429, 400, 502, 503, 500), so a client re-raises the same
class (:func:`aenv_ray.errors.decode_error`); no answer shows a path of the hub's own
(:func:`hub_paths`: its data directory, store, Python installation, home), each is ``<hub>``.
Before any route,
:class:`envhub.guard.RequestGuard` refuses what a web page could make a browser send (415 for a
body that is not JSON; without auth, 403 for a foreign ``Host`` or ``Origin``). A client past
its failed authentications gets 429 (:mod:`envhub.defences`); the server's read timeouts and
connection caps are :mod:`envhub.connections`'.

=======================================================  =========================================
``POST   /v1/envs``                                      publish a bundle (body: its bytes)
``GET    /v1/envs?q=&tag=&deprecated=``                  search: one summary per name
``GET    /v1/envs/{name}``                               every version of a name
``GET    /v1/envs/{name}/{version}``                     one version (``latest``: the current one)
``GET    /v1/envs/{name}/{version}/bundle``              the bundle's bytes
``PATCH  /v1/envs/{name}/{version}``                     deprecate / undeprecate
``DELETE /v1/envs/{name}/{version}``                     delete (a tombstone: never reused)
``GET    /v1/resolve/{env}``                             what a create of ``env`` would resolve to
``GET    /v1/tags``                                      tag -> how many names carry it
``POST   /v1/instances`` ...                             create, list, get, delete, renew, fork
``/v1/instances/{id}/proxy/{path}``                      the instance's runtime, through the hub
``GET    /v1/instances/{id}/proxy/aenv/v1/preview/{p}``  a preview, for a browser: no key
``POST   /v1/services`` ...                              create, list, get, update, delete
``/v1/services/{id}/proxy/{path}``                       a running replica, round-robin
``POST   /v1/runs``                                      register a rollout run (``id``: take it up)
``GET    /v1/runs``                                      the tenant's rollout runs
``GET    /v1/runs/{id}``                                 one run: live, its driver, bytes received
``POST   /v1/runs/{id}/records``                         its records from an offset; a heartbeat
``PATCH  /v1/runs/{id}``                                 end it
``DELETE /v1/runs/{id}``                                 delete it and its records
``GET    /v1/defences``                                  what the defences against abuse hold
=======================================================  =========================================

Beside them, out of the OpenAPI document, Prometheus' ``GET /metrics`` (:mod:`envhub.metrics`,
who may scrape: :mod:`envhub.routes.metrics`).

This module assembles the app: the routers (:mod:`envhub.routes`, one per concern, sharing one
:class:`envhub.routes.context.Hub`), the guard, the error envelope and the lifespan (the control
plane's upkeep and the proxy's client).

May import: the standard library, ``aenv_ray``, ``envhub``, fastapi/starlette, pydantic.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import site
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

import aenv_ray
from aenv_ray import __version__
from aenv_ray.engine import SandboxEngine
from aenv_ray.errors import (
    AEnvError,
    ArtifactError,
    ArtifactTooLargeError,
    AuthenticationError,
    CapacityError,
    ConfigurationError,
    EnvironmentNotFoundError,
    InstanceExpiredError,
    InstanceNotFoundError,
    InstanceUnreachableError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    RunNotFoundError,
    ServiceNotFoundError,
    StoreError,
    VersionConflictError,
    encode_error,
)
from aenv_ray.loadcheck import scrub_paths
from envhub.control import ControlPlane
from envhub.defences import FailureThrottle
from envhub.guard import RequestGuard
from envhub.metrics import HubMetrics
from envhub.registry import VersionRegistry
from envhub.routes import instances, meta, metrics, proxy, registry, runs, services
from envhub.routes.context import Hub, HubOptions
from envhub.routes.forward import Forwarder
from envhub.runs import RunStore
from envhub.seal import SealedStore, TokenSeal, check_secret, hub_secret
from envhub.store import Store

__all__ = ["HubOptions", "create_app"]

log = logging.getLogger("envhub.app")


# -- the error envelope ----------------------------------------------------------------------


class ErrorBody(BaseModel):
    """Every error's body (:func:`aenv_ray.errors.encode_error`): the class's typed fields
    follow (``existing_digest``, ``limit``, ``instance_id``, ...)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="what happened and what to do")
    type: str = Field(description="the aenv_ray.errors class")
    retryable: bool = Field(description="whether running the work again may succeed")


_STATUS: list[tuple[type[AEnvError], int]] = [
    (AuthenticationError, 401),
    (RateLimitedError, 429),
    (QuotaExceededError, 403),  # not 429: retrying the same request does not help
    (PermissionDeniedError, 403),
    (EnvironmentNotFoundError, 404),
    (InstanceNotFoundError, 404),
    (ServiceNotFoundError, 404),
    (RunNotFoundError, 404),
    (VersionConflictError, 409),
    (InstanceExpiredError, 410),
    (ArtifactTooLargeError, 413),
    (ArtifactError, 400),
    (ConfigurationError, 400),
    (CapacityError, 503),
    (StoreError, 503),
    (InstanceUnreachableError, 502),
]
# every status an error travels with is documented (410 and 502 come from the proxy routes,
# 415 from the request guard)
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in sorted({status for _, status in _STATUS} | {415, 500})
}


def status_of(exc: AEnvError) -> int:
    """The HTTP status an error kind travels with."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


HIDDEN = "<hub>"
"""What an error's answer shows in place of a path of the hub's own."""


def hub_paths(options: HubOptions, store: Store) -> dict[str, str]:
    """The hub's own paths no answer shows, each told as :data:`HIDDEN`: its data directory
    (where bundles are unpacked), its store's directory, its Python installation and sources,
    its working directory and its user's home. The datasource root stays as it is: users name
    datasources below it."""
    found: list[str | Path] = [
        options.data_dir,
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *site.getsitepackages(),
        site.getusersitepackages(),
        Path(aenv_ray.__file__).parent.parent,  # a source checkout, or site-packages
        Path(__file__).parent.parent,
        Path.home(),
        Path.cwd(),
    ]
    store_path = getattr(store, "path", None)
    if isinstance(store_path, str) and store_path not in ("", ":memory:"):
        found.append(Path(store_path).parent)
    hidden: dict[str, str] = {}
    for path in found:
        hidden[str(path)] = HIDDEN
        hidden[os.path.realpath(path)] = HIDDEN
    if options.datasource_root is not None:
        hidden[str(options.datasource_root)] = str(options.datasource_root)
    return hidden


def _error(exc: AEnvError, hidden: dict[str, str] | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
    if isinstance(exc, RateLimitedError) and exc.retry_after is not None:
        headers = {"Retry-After": str(math.ceil(exc.retry_after))}
    body = encode_error(exc)
    if hidden:  # no answer shows the hub's own paths (an import error's, the store's file)
        body = {k: scrub_paths(v, hidden) if isinstance(v, str) else v for k, v in body.items()}
    status = status_of(exc)
    if status >= 500:
        log.warning("error answered", extra={"status": status, "error": exc.message})
    return JSONResponse(body, status_code=status, headers=headers)


async def _aenv_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AEnvError)  # registered for AEnvError only
    request.app.state.hub.metrics.error(exc)
    return _error(exc, request.app.state.hidden_paths)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)  # registered for it only
    problems = "; ".join(
        f"`{'.'.join(str(p) for p in e['loc'] if p != 'body')}`: {e['msg']}" for e in exc.errors()
    )
    error = ConfigurationError(f"invalid request: {problems}")
    request.app.state.hub.metrics.error(error)
    return _error(error)


# -- the app ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Tidy the registry, run the control plane's upkeep and the proxy's client while the app
    serves; close the store after, when the options say so."""
    hub: Hub = app.state.hub
    removed = await hub.registry.collect_garbage()
    if removed:
        log.info("removed bundles of crashed pushes", extra={"count": len(removed)})
    adopted = await hub.registry.adopt_names()
    if adopted:
        log.info("names now guarded against lookalikes", extra={"count": adopted})
    if isinstance(hub.store, SealedStore):
        await check_secret(hub.store.inner, hub.store.seal)
    await hub.control.start()
    await hub.forwarder.open()
    try:
        yield
    finally:
        await hub.control.stop()
        await hub.forwarder.aclose()
        if hub.options.close_store:
            await hub.store.aclose()


def create_app(store: Store, engine: SandboxEngine, options: HubOptions | None = None) -> FastAPI:
    """The hub's ASGI app over ``store`` and ``engine``; its lifespan runs the control plane's
    upkeep (sync with the engine, reap expired instances, keep services at their replicas)."""
    options = options or HubOptions()
    # instance tokens are kept sealed: a reader of the store learns none (envhub.seal)
    secret = options.secret if options.secret is not None else hub_secret(options.data_dir)
    store = SealedStore(store, TokenSeal(secret))
    versions = VersionRegistry(store, max_bundle=options.max_bundle, limits=options.limits)
    hub_metrics = HubMetrics()
    control = ControlPlane(
        store,
        engine,
        versions,
        options.data_dir,
        reap_interval=options.reap_interval,
        sync_interval=options.sync_interval,
        limits=options.limits,
        warm=dict(options.warm),
        metrics=hub_metrics,
    )
    app = FastAPI(
        title="EnvHub",
        version=__version__,
        summary="aenv-ray's registry of environment definitions and its control plane",
        lifespan=_lifespan,
        responses=_ERRORS,
    )
    throttle = FailureThrottle(options.defences.auth_failures, window=options.defences.auth_window)
    app.state.hub = Hub(
        options,
        store,
        versions,
        control,
        Forwarder(),
        throttle,
        RunStore(options.data_dir / "runs", options.limits),
        hub_metrics,
    )
    app.state.hidden_paths = hub_paths(options, store)
    app.add_middleware(RequestGuard, auth=options.auth)
    app.add_exception_handler(AEnvError, _aenv_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    # in this order: the OpenAPI document lists the paths as the table above does
    for module in (meta, registry, instances, services, runs, proxy, metrics):
        app.include_router(module.router)
    return app
