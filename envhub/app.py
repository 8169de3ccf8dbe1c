"""EnvHub's HTTP API (FastAPI): the registry, the control plane, and a proxy to instances.

Every route but ``/v1/health`` and the OpenAPI document (``/openapi.json``, browsable at
``/docs``) needs ``Authorization: Bearer KEY`` unless the hub runs with ``auth=False``. Errors
are :func:`aenv_ray.errors.encode_error`'s envelope, ``{"error": "MESSAGE", "type":
"<aenv_ray.errors class>", "retryable": BOOL, ...typed fields}``, with the status of their
kind (401, 403, 404, 409, 410, 413, 415, 400, 502, 503, 500), so a client re-raises the same
class (:func:`aenv_ray.errors.decode_error`). Before any route,
:class:`envhub.guard.RequestGuard` refuses what a web page could make a browser send (415 for a
body that is not JSON; without auth, 403 for a foreign ``Host`` or ``Origin``).

==============================================  ============================================
``POST   /v1/envs``                             publish a bundle (body: its bytes)
``GET    /v1/envs?q=&tag=&deprecated=``         search: one summary per name
``GET    /v1/envs/{name}``                      every version of a name
``GET    /v1/envs/{name}/{version}``            one version (``latest``: the current one)
``GET    /v1/envs/{name}/{version}/bundle``     the bundle's bytes
``PATCH  /v1/envs/{name}/{version}``            deprecate / undeprecate
``DELETE /v1/envs/{name}/{version}``            delete (a tombstone: never reused)
``GET    /v1/tags``                             tag -> how many names carry it
``POST   /v1/instances`` ...                    create, list, get, delete, renew, fork
``/v1/instances/{id}/proxy/{path}``             the instance's runtime, through the hub
``POST   /v1/services`` ...                     create, list, get, update, delete
``/v1/services/{id}/proxy/{path}``              a running replica, round-robin
==============================================  ============================================

May import: the standard library, ``aenv_ray``, ``envhub``, fastapi/starlette, pydantic,
aiohttp (the proxy's client).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import aiohttp
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect

from aenv_ray import __version__
from aenv_ray.config import parse_duration
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
    ServiceNotFoundError,
    StoreError,
    VersionConflictError,
    encode_error,
)
from envhub.control import ControlPlane
from envhub.guard import RequestGuard
from envhub.keys import LOCAL_TENANT, Caller, authenticate
from envhub.limits import Limits
from envhub.registry import DEFAULT_MAX_BUNDLE, VersionRegistry
from envhub.store import Store

__all__ = ["HubOptions", "create_app"]

log = logging.getLogger("envhub.app")

DIGEST_HEADER = "X-Aenv-Digest"
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "content-length",
    }
)


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


# -- request and response bodies (the OpenAPI document's schemas) -------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class CreateInstance(_Model):
    """What to start."""

    env: str = Field(description="name@version, or name for its current version")
    ttl: str | float | None = Field(None, description='lifetime: seconds or "30m", "2h"')
    environment_variables: dict[str, str] = Field(default_factory=dict)
    arguments: list[str] = Field(default_factory=list)
    datasource: str | None = Field(
        None, description="a directory under the hub's --datasource-root, mounted at /data"
    )
    owner: str | None = Field(None, description="who holds it (free text, e.g. a job id)")
    labels: dict[str, str] = Field(default_factory=dict)


class Renew(_Model):
    """A new lifetime, counted from now."""

    ttl: str | float


class Fork(_Model):
    """How many copies."""

    n: int = Field(ge=1, le=64)


class CreateService(_Model):
    """A long-running deployment."""

    env: str
    name: str | None = None
    replicas: int = Field(1, ge=0, le=64)
    storage: bool = Field(False, description="persistent storage mounted at /storage")
    environment_variables: dict[str, str] = Field(default_factory=dict)
    arguments: list[str] = Field(default_factory=list)


class UpdateService(_Model):
    """What to change; absent fields stay."""

    replicas: int | None = Field(None, ge=0, le=64)
    env: str | None = None
    environment_variables: dict[str, str] | None = None


class Deprecation(_Model):
    """Deprecate (or undeprecate) a version."""

    deprecated: bool = True
    message: str = ""


class Instance(_Out):
    """An instance's record."""

    id: str
    env_ref: str
    state: str = Field(description="pending, running or terminated")
    url: str | None = Field(description="the runtime's own address (direct calls)")
    proxy_url: str = Field("", description="the same runtime through the hub")
    created_at: float
    expires_at: float | None
    reason: str | None = None
    detail: str = ""
    owner: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    tenant: str
    service: str | None = None
    warnings: list[str] = Field(default_factory=list)
    token: str | None = Field(
        None,
        description="the runtime's secret (send `Authorization: Bearer TOKEN` to `url`); "
        "shown to the instance's own tenant only",
    )
    publisher: str | None = Field(
        None, description="the tenant whose code it runs; null: built into the hub"
    )
    source: str | None = Field(
        None, description="what `env` resolved to (`tenant/name@version`: another tenant's)"
    )


class Version(_Out):
    """A published version."""

    name: str
    version: str
    ref: str
    digest: str
    size: int
    description: str
    tags: list[str]
    config: dict[str, Any]
    publisher: str
    published_at: float
    deprecated: bool
    deprecation: str = ""


class Service(_Out):
    """A service and its replicas."""

    id: str
    name: str
    env_ref: str
    replicas: int
    ready: int
    storage: str | None
    instances: list[str]
    endpoints: list[str]
    address: str = Field("", description="the service through the hub (round-robin)")


class ErrorBody(BaseModel):
    """Every error's body (:func:`aenv_ray.errors.encode_error`): the class's typed fields
    follow (``existing_digest``, ``limit``, ``instance_id``, ...)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="what happened and what to do")
    type: str = Field(description="the aenv_ray.errors class")
    retryable: bool = Field(description="whether running the work again may succeed")


_STATUS: list[tuple[type[AEnvError], int]] = [
    (AuthenticationError, 401),
    (QuotaExceededError, 403),  # not 429: retrying the same request does not help
    (PermissionDeniedError, 403),
    (EnvironmentNotFoundError, 404),
    (InstanceNotFoundError, 404),
    (ServiceNotFoundError, 404),
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


def _error(exc: AEnvError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
    return JSONResponse(encode_error(exc), status_code=status_of(exc), headers=headers)


async def _probe(store: Store, timeout: float = 5.0) -> dict[str, Any]:
    """``{"ok": bool, "detail": str}``: whether ``store`` answers a read now."""
    kind = store.url.partition(":")[0]
    try:
        await asyncio.wait_for(store.get("health", "probe"), timeout)
    except StoreError as exc:
        log.warning("health: the store fails", extra={"error": str(exc)})
        return {"ok": False, "detail": str(exc)}
    except TimeoutError:
        log.warning("health: the store does not answer", extra={"timeout": timeout})
        return {"ok": False, "detail": f"the {kind} store did not answer within {timeout:g} s"}
    return {"ok": True, "detail": f"{kind} answers"}


async def _caller(request: Request) -> Caller:
    """Who sent the request (every route but health and the OpenAPI document needs a key)."""
    options: HubOptions = request.app.state.options
    if not options.auth:
        return Caller(tenant=LOCAL_TENANT)
    return await authenticate(request.app.state.store, request.headers.get("authorization"))


Who = Annotated[Caller, Depends(_caller)]


def create_app(store: Store, engine: SandboxEngine, options: HubOptions | None = None) -> FastAPI:
    """The hub's ASGI app over ``store`` and ``engine``; its lifespan runs the control plane's
    upkeep (sync with the engine, reap expired instances, keep services at their replicas)."""
    options = options or HubOptions()
    registry = VersionRegistry(store, max_bundle=options.max_bundle, limits=options.limits)
    control = ControlPlane(
        store,
        engine,
        registry,
        options.data_dir,
        reap_interval=options.reap_interval,
        sync_interval=options.sync_interval,
        limits=options.limits,
    )
    proxy: dict[str, aiohttp.ClientSession] = {}
    turns = itertools.count()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        removed = await registry.collect_garbage()
        if removed:
            log.info("removed bundles of crashed pushes", extra={"count": len(removed)})
        adopted = await registry.adopt_names()
        if adopted:
            log.info("names now guarded against lookalikes", extra={"count": adopted})
        await control.start()
        proxy["session"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False
        )
        try:
            yield
        finally:
            await control.stop()
            await proxy.pop("session").close()
            if options.close_store:
                await store.aclose()

    app = FastAPI(
        title="EnvHub",
        version=__version__,
        summary="aenv-ray's registry of environment definitions and its control plane",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.registry = registry
    app.state.control = control
    app.state.store = store
    app.state.options = options
    app.add_middleware(RequestGuard, auth=options.auth)

    @app.exception_handler(AEnvError)
    async def _aenv_error(request: Request, exc: AEnvError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"`{'.'.join(str(p) for p in e['loc'] if p != 'body')}`: {e['msg']}"
            for e in exc.errors()
        )
        return _error(ConfigurationError(f"invalid request: {problems}"))

    def instance_out(request: Request, doc: dict[str, Any]) -> dict[str, Any]:
        base = str(request.base_url).rstrip("/")
        return {**doc, "proxy_url": f"{base}/v1/instances/{doc['id']}/proxy"}

    def service_out(request: Request, doc: dict[str, Any]) -> dict[str, Any]:
        base = str(request.base_url).rstrip("/")
        return {**doc, "address": f"{base}/v1/services/{doc['id']}/proxy"}

    # -- meta ------------------------------------------------------------------------------------
    @app.get(
        "/v1/health",
        tags=["meta"],
        responses={503: {"description": "the store fails: the same body, status `degraded`"}},
    )
    async def health() -> JSONResponse:
        """Liveness and the store's state, without auth: 200 ``ok``, or 503 ``degraded`` when
        the store does not answer (every route that needs it would fail)."""
        store_state = await _probe(store)
        body = {
            "status": "ok" if store_state["ok"] else "degraded",
            "version": __version__,
            "auth": options.auth,
            "store": store_state,
        }
        return JSONResponse(body, status_code=200 if store_state["ok"] else 503)

    @app.get("/v1/whoami", tags=["meta"])
    async def whoami(who: Who) -> dict[str, Any]:
        """The tenant and key id of the caller."""
        return {"tenant": who.tenant, "key_id": who.key_id}

    # -- registry --------------------------------------------------------------------------------
    @app.post(
        "/v1/envs",
        status_code=201,
        tags=["registry"],
        response_model=Version,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
                "description": "a bundle made by `aenv build`; send its digest in X-Aenv-Digest",
            }
        },
    )
    async def publish(request: Request, who: Who) -> dict[str, Any]:
        """Publish a bundle as its config's name@version (immutable from then on)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > options.max_bundle:
            raise ArtifactTooLargeError(
                f"the bundle is {int(declared)} bytes; this hub accepts at most "
                f"{options.max_bundle} (aenv serve --max-bundle): leave data out of the bundle "
                "and mount it as a datasource"
            )
        chunks = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > options.max_bundle:
                    raise ArtifactTooLargeError(
                        f"the bundle is over {options.max_bundle} bytes, this hub's limit "
                        "(aenv serve --max-bundle): leave data out of the bundle"
                    )
                chunks.append(chunk)
        except ClientDisconnect:
            log.warning("push abandoned mid-upload; nothing was published")
            return {}
        data = b"".join(chunks)
        if not data:
            raise ArtifactError("the upload is empty: send the bundle `aenv build` wrote")
        from aenv_ray.bundle import inspect_bundle

        checked = inspect_bundle(
            data, max_size=options.max_bundle, expected_digest=request.headers.get(DIGEST_HEADER)
        )
        await control.check_loads(data, checked.digest)  # in a sandbox: never in the hub
        record = await registry.publish(
            who, data, expected_digest=request.headers.get(DIGEST_HEADER)
        )
        log.info("published", extra={"ref": record["ref"], "tenant": who.tenant, "size": size})
        return record

    @app.get("/v1/envs", tags=["registry"])
    async def search(
        who: Who,
        q: str = "",
        tag: Annotated[list[str] | None, Query()] = None,
        deprecated: bool = False,
    ) -> dict[str, Any]:
        """One summary per name matching ``q`` (name or description) and every ``tag``."""
        found = await registry.search(q, tags=tag, include_deprecated=deprecated)
        return {"environments": found}

    @app.get("/v1/tags", tags=["registry"])
    async def tags(who: Who) -> dict[str, Any]:
        """Every tag with the number of names that carry it."""
        return {"tags": await registry.tags()}

    @app.get("/v1/envs/{name}", tags=["registry"])
    async def versions(name: str, who: Who) -> dict[str, Any]:
        """Every version of ``name``, oldest first."""
        found = await registry.versions(name)
        if not found:
            await registry.get(name)  # raises the helpful not-found error
        return {"name": name, "versions": found}

    @app.get("/v1/envs/{name}/{version}", tags=["registry"], response_model=Version)
    async def version(name: str, version: str, who: Who) -> dict[str, Any]:
        """One version; ``latest`` is the highest one not deprecated."""
        return await registry.get(name, version)

    @app.get(
        "/v1/envs/{name}/{version}/bundle",
        tags=["registry"],
        response_class=Response,
        responses={200: {"content": {"application/gzip": {}}}},
    )
    async def bundle(name: str, version: str, who: Who) -> Response:
        """The version's bundle; its digest is in the X-Aenv-Digest header."""
        doc, data = await registry.bundle(name, version)
        return Response(
            data,
            media_type="application/gzip",
            headers={
                DIGEST_HEADER: doc["digest"],
                "Content-Disposition": f'attachment; filename="{doc["name"]}-'
                f'{doc["version"]}.aenv.tgz"',
            },
        )

    @app.patch("/v1/envs/{name}/{version}", tags=["registry"], response_model=Version)
    async def deprecate(name: str, version: str, body: Deprecation, who: Who) -> dict[str, Any]:
        """Deprecate a version (or undo it): still usable by name@version, skipped otherwise."""
        return await registry.deprecate(
            who, name, version, deprecated=body.deprecated, message=body.message
        )

    @app.delete("/v1/envs/{name}/{version}", tags=["registry"])
    async def delete_version(name: str, version: str, who: Who) -> dict[str, Any]:
        """Delete a version; its number is never reused."""
        return await registry.delete(who, name, version)

    # -- instances -------------------------------------------------------------------------------
    def datasource_path(value: str | None) -> str | None:
        if not value:
            return None
        root = options.datasource_root
        if root is None:
            raise ConfigurationError(
                "this hub mounts no datasources: start it with --datasource-root DIR and name "
                "a directory under it"
            )
        path = (root / value.lstrip("/")).resolve()
        if not path.is_relative_to(root.resolve()) or not path.is_dir():
            raise ConfigurationError(
                f"datasource `{value}` is not a directory under the hub's datasource root"
            )
        return str(path)

    @app.post("/v1/instances", status_code=201, tags=["instances"], response_model=Instance)
    async def create_instance(body: CreateInstance, request: Request, who: Who) -> dict[str, Any]:
        """Start an instance; answers once it serves calls."""
        doc = await control.create_instance(
            who,
            body.env,
            ttl=parse_duration(body.ttl) if body.ttl is not None else None,
            environment_variables=body.environment_variables,
            arguments=body.arguments,
            datasource=datasource_path(body.datasource),
            owner=body.owner,
            labels=body.labels,
        )
        return instance_out(request, doc)

    @app.get("/v1/instances", tags=["instances"])
    async def list_instances(
        request: Request, who: Who, env: str | None = None, all: bool = False
    ) -> dict[str, Any]:
        """The caller's instances, newest first (``all``: terminated ones too)."""
        docs = await control.list_instances(who, env=env, include_terminated=all)
        return {"instances": [instance_out(request, d) for d in docs]}

    @app.get("/v1/instances/{iid}", tags=["instances"], response_model=Instance)
    async def get_instance(iid: str, request: Request, who: Who) -> dict[str, Any]:
        """One instance, its state fresh from the engine."""
        return instance_out(request, await control.get_instance(who, iid))

    @app.delete("/v1/instances/{iid}", tags=["instances"], response_model=Instance)
    async def delete_instance(iid: str, request: Request, who: Who) -> dict[str, Any]:
        """Terminate an instance (idempotent)."""
        return instance_out(request, await control.delete_instance(who, iid))

    @app.post("/v1/instances/{iid}/renew", tags=["instances"], response_model=Instance)
    async def renew_instance(iid: str, body: Renew, request: Request, who: Who) -> dict[str, Any]:
        """Expire ``ttl`` from now."""
        doc = await control.renew_instance(who, iid, parse_duration(body.ttl))
        return instance_out(request, doc)

    @app.post("/v1/instances/{iid}/fork", status_code=201, tags=["instances"])
    async def fork_instance(iid: str, body: Fork, request: Request, who: Who) -> dict[str, Any]:
        """``n`` copies of a running instance (copy-on-write where the engine can)."""
        docs = await control.fork_instance(who, iid, body.n)
        return {"instances": [instance_out(request, d) for d in docs]}

    # -- services --------------------------------------------------------------------------------
    @app.post("/v1/services", status_code=201, tags=["services"], response_model=Service)
    async def create_service(body: CreateService, request: Request, who: Who) -> dict[str, Any]:
        """Start a service; answers once its replicas serve."""
        doc = await control.create_service(
            who,
            body.env,
            name=body.name,
            replicas=body.replicas,
            storage=body.storage,
            environment_variables=body.environment_variables,
            arguments=body.arguments,
        )
        return service_out(request, doc)

    @app.get("/v1/services", tags=["services"])
    async def list_services(request: Request, who: Who) -> dict[str, Any]:
        """The caller's services, newest first."""
        return {"services": [service_out(request, d) for d in await control.list_services(who)]}

    @app.get("/v1/services/{sid}", tags=["services"], response_model=Service)
    async def get_service(sid: str, request: Request, who: Who) -> dict[str, Any]:
        """One service with its replicas."""
        return service_out(request, await control.get_service(who, sid))

    @app.patch("/v1/services/{sid}", tags=["services"], response_model=Service)
    async def update_service(
        sid: str, body: UpdateService, request: Request, who: Who
    ) -> dict[str, Any]:
        """Scale, change version or variables (replicas are replaced new-first)."""
        doc = await control.update_service(
            who,
            sid,
            replicas=body.replicas,
            env=body.env,
            environment_variables=body.environment_variables,
        )
        return service_out(request, doc)

    @app.delete("/v1/services/{sid}", tags=["services"])
    async def delete_service(
        sid: str, request: Request, who: Who, keep_storage: bool = False
    ) -> dict[str, Any]:
        """Stop a service and its replicas; its storage is removed unless ``keep_storage``."""
        return service_out(
            request, await control.delete_service(who, sid, keep_storage=keep_storage)
        )

    # -- the proxy ---------------------------------------------------------------------------------
    async def forward(request: Request, base: str, path: str, token: str | None) -> Response:
        session = proxy["session"]
        # the caller's hub key never reaches the instance; the instance's own token does
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_BY_HOP and k.lower() != "authorization"
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{base.rstrip('/')}/{path}"
        if request.url.query:
            url += f"?{request.url.query}"
        try:
            upstream = await session.request(
                request.method, url, data=await request.body(), headers=headers
            )
        except aiohttp.ClientError as exc:
            raise InstanceUnreachableError(
                f"the hub cannot reach the instance at {base} ({exc}); it may have ended"
            ) from exc
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            finally:
                upstream.release()

        return StreamingResponse(body(), status_code=upstream.status, headers=out_headers)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]

    @app.api_route("/v1/instances/{iid}/proxy/{path:path}", methods=methods, tags=["instances"])
    async def instance_proxy(iid: str, path: str, request: Request, who: Who) -> Response:
        """The instance's runtime API (tools, MCP at ``mcp``, functions, reward, health)."""
        doc = await control.get_instance(who, iid)
        if doc["state"] != "running" or not doc.get("url"):
            if doc.get("reason") == "expired":
                raise InstanceExpiredError(
                    f"instance {iid} expired; create a new one", instance_id=iid
                )
            raise InstanceNotFoundError(
                f"instance {iid} is {doc['state']} ({doc.get('reason') or 'not ready'})",
                instance_id=iid,
            )
        return await forward(request, doc["url"], path, doc.get("token"))

    @app.api_route("/v1/services/{sid}/proxy/{path:path}", methods=methods, tags=["services"])
    async def service_proxy(sid: str, path: str, request: Request, who: Who) -> Response:
        """One running replica of the service, in turn."""
        targets = await control.service_targets(who, sid)
        if not targets:
            raise CapacityError(f"service {sid} has no running replica now; try again shortly")
        endpoint, token = targets[next(turns) % len(targets)]
        return await forward(request, endpoint, path, token)

    return app
