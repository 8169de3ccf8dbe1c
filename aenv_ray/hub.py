"""The client of an EnvHub server (``aenv serve``): registry, instances, services.

:class:`HubClient` speaks the hub's HTTP API and turns each error back into the
:mod:`aenv_ray.errors` class the server raised; :class:`RemoteEngine` is a
:class:`~aenv_ray.engine.SandboxEngine` over it, which is how ``Environment("name@ver")`` runs
in remote mode (``AENV_SYSTEM_URL`` or ``aenv_url=``).

    async with HubClient("http://hub:8000", api_key="aenv_...") as hub:
        print(await hub.search(tags=["terminal"]))
        info = await hub.create_instance("mini-terminal@1.0.0", ttl="10m")
        await hub.delete_instance(info["id"])

It speaks HTTP with httpx (a pooled, keep-alive ``AsyncClient``): the control plane makes a
few calls per instance, where a standard, well-understood client is worth more than CPU. Calls
to the instances themselves, many per second, go over :mod:`aenv_ray._wire` instead
(docs/performance.md, "The client's HTTP"). Nothing is pooled across event loops: a client
belongs to the loop that first uses it.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import secrets
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

import httpx
import orjson

from aenv_ray.bundle import digest_of
from aenv_ray.engine import InstanceInfo, InstanceSpec, Route, info_from_json
from aenv_ray.errors import (
    AEnvError,
    ArtifactError,
    ClosedError,
    ConfigurationError,
    HubUnreachableError,
    ProtocolError,
    decode_error,
)
from aenv_ray.protocol import IDEMPOTENCY_HEADER

__all__ = [
    "CREATE_ATTEMPTS",
    "DIGEST_HEADER",
    "IDEMPOTENCY_HEADER",
    "HubClient",
    "RemoteEngine",
    "reachable",
]

DIGEST_HEADER = "X-Aenv-Digest"
CREATE_ATTEMPTS = 4
"""How many times :meth:`RemoteEngine.create` sends a create whose answer was lost."""
_ABANDONED_WAIT = 60.0  # seconds aclose waits for the deletions of cancelled creates' instances

log = logging.getLogger("aenv_ray.hub")


class HubClient:
    """An async client of one hub. Use as ``async with`` or call :meth:`aclose`.

    Args:
        url: the hub's base URL, e.g. ``http://127.0.0.1:8000``.
        api_key: sent as ``Authorization: Bearer KEY`` (omit for a ``--no-auth`` hub).
        timeout: seconds for one request (creating an instance waits for it to start).
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 300.0) -> None:
        if not url or "://" not in url:
            raise ConfigurationError(
                f"hub URL `{url}` is not a URL; write e.g. http://127.0.0.1:8000 "
                "(AENV_SYSTEM_URL, `aenv config set url`)"
            )
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._http: httpx.AsyncClient | None = None
        self._closed = False

    async def __aenter__(self) -> HubClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections. Idempotent; requests after it raise
        :class:`~aenv_ray.errors.ClosedError`."""
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    @property
    def headers(self) -> dict[str, str]:
        """The headers every request carries (the key, when there is one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _get_http(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClosedError(f"the hub client of {self.url} is closed; create a new HubClient")
        if self._http is None or self._http.is_closed:
            self._http = httpx.AsyncClient(
                headers=self.headers,
                # connect within 10 s; each read or write within the request's whole timeout,
                # which :meth:`request` also bounds as a total
                timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)),
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
                follow_redirects=False,
                trust_env=False,  # the hub's URL is the address: no proxy from the environment
            )
        return self._http

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        raw: bool = False,
        answers: tuple[int, ...] = (),
    ) -> Any:
        """One request; the parsed JSON answer (``raw``: ``(bytes, headers)``), or the error
        the hub raised, re-raised as its :mod:`aenv_ray.errors` class. A status in ``answers``
        is an answer, not an error."""
        http = self._get_http()
        body = orjson.dumps(json) if json is not None else data
        send_headers = dict(headers or {})
        if json is not None:
            send_headers["Content-Type"] = "application/json"
        try:
            async with asyncio.timeout(self.timeout):
                reply = await http.request(
                    method,
                    self.url + path,
                    content=body,
                    headers=send_headers,
                    params=_params(params),
                )
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise HubUnreachableError(
                f"{self.url} did not answer {method} {path} within {self.timeout:g} s"
            ) from exc
        except httpx.DecodingError as exc:
            raise ProtocolError(
                f"{method} {self.url}{path} answered a body that does not decode as its "
                f"Content-Encoding says ({exc}); is this an EnvHub (`aenv serve`)?"
            ) from exc
        except httpx.TransportError as exc:  # refused, reset, not HTTP, a proxy that failed
            raise HubUnreachableError(
                f"nothing answers at {self.url} ({type(exc).__name__}: {exc}); start the hub "
                "with `aenv serve`, or fix AENV_SYSTEM_URL / `aenv config set url URL`"
            ) from exc
        payload = reply.content
        if reply.status_code < 400 or reply.status_code in answers:
            if raw:
                return payload, dict(reply.headers)
            return orjson.loads(payload) if payload else None
        raise self._error(reply.status_code, payload, method, path)

    def _error(self, status: int, payload: bytes, method: str, path: str) -> AEnvError:
        try:
            detail = orjson.loads(payload)
        except orjson.JSONDecodeError:
            detail = None
        if not (isinstance(detail, dict) and isinstance(detail.get("error"), str)):
            return ProtocolError(
                f"{method} {self.url}{path} answered HTTP {status} with {payload[:120]!r}; "
                "is this an EnvHub (`aenv serve`)?"
            )
        return decode_error(detail, status)

    # -- meta ------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """The hub's health (no key needed): ``{"status": "ok"|"degraded", "store": {"ok",
        "detail"}, ...}``; a degraded hub (its store fails; HTTP 503) is an answer too."""
        result: dict[str, Any] = await self.request("GET", "/v1/health", answers=(503,))
        return result

    async def whoami(self) -> dict[str, Any]:
        """``{"tenant", "key_id"}`` of this client's key."""
        result: dict[str, Any] = await self.request("GET", "/v1/whoami")
        return result

    # -- registry --------------------------------------------------------------------------------
    async def push(self, data: bytes, *, digest: str | None = None) -> dict[str, Any]:
        """Publish a bundle; the version's record. The digest travels along and is checked."""
        digest = digest or digest_of(data)
        result: dict[str, Any] = await self.request(
            "POST",
            "/v1/envs",
            data=data,
            headers={"Content-Type": "application/gzip", DIGEST_HEADER: digest},
        )
        return result

    async def search(
        self, query: str = "", *, tags: list[str] | None = None, deprecated: bool = False
    ) -> list[dict[str, Any]]:
        """One summary per name matching ``query`` and every tag."""
        params = {"q": query, "tag": tags or [], "deprecated": deprecated}
        result = await self.request("GET", "/v1/envs", params=params)
        return list(result["environments"])

    async def versions(self, name: str) -> list[dict[str, Any]]:
        """Every version of ``name``, oldest first."""
        return list((await self.request("GET", f"/v1/envs/{name}"))["versions"])

    async def get_version(self, name: str, version: str = "latest") -> dict[str, Any]:
        """One version's record."""
        result: dict[str, Any] = await self.request("GET", f"/v1/envs/{name}/{version}")
        return result

    async def resolve(self, env: str) -> dict[str, Any]:
        """What ``env`` means for this key's tenant, as a create would run it: ``{"ref",
        "publisher", "warnings", "calls"}`` (``calls``: what its reward, functions and tools take).
        Raises :class:`~aenv_ray.errors.EnvironmentNotFoundError` naming what exists."""
        result: dict[str, Any] = await self.request("GET", f"/v1/resolve/{env}")
        return result

    async def pull(self, name: str, version: str = "latest") -> tuple[dict[str, Any], bytes]:
        """A version's record and its bundle, whose digest is checked."""
        record = await self.get_version(name, version)
        data, _ = await self.request("GET", f"/v1/envs/{name}/{record['version']}/bundle", raw=True)
        if digest_of(data) != record["digest"]:
            raise ArtifactError(
                f"the bundle of `{record['ref']}` arrived corrupted (digest {digest_of(data)}, "
                f"expected {record['digest']}); pull again"
            )
        return record, data

    async def tags(self) -> dict[str, int]:
        """Every tag and how many names carry it."""
        return dict((await self.request("GET", "/v1/tags"))["tags"])

    async def deprecate(
        self, name: str, version: str, *, message: str = "", deprecated: bool = True
    ) -> dict[str, Any]:
        """Deprecate a version (``deprecated=False``: undo)."""
        body = {"deprecated": deprecated, "message": message}
        result: dict[str, Any] = await self.request(
            "PATCH", f"/v1/envs/{name}/{version}", json=body
        )
        return result

    async def delete_version(self, name: str, version: str) -> dict[str, Any]:
        """Delete a version (its number is never reused)."""
        result: dict[str, Any] = await self.request("DELETE", f"/v1/envs/{name}/{version}")
        return result

    # -- instances -------------------------------------------------------------------------------
    async def create_instance(
        self,
        env: str,
        *,
        ttl: str | float | None = None,
        environment_variables: Mapping[str, str] | None = None,
        arguments: list[str] | None = None,
        datasource: str | None = None,
        owner: str | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Start an instance; its record once it serves calls. ``idempotency_key`` (8 to 128
        letters, digits, ``-_.:``): the hub answers a create of this tenant with a key it saw
        before with the instance that one started, so sending it again after a lost reply
        neither leaks nor duplicates an instance (:class:`RemoteEngine` does so)."""
        body = {
            "env": env,
            "ttl": ttl,
            "environment_variables": dict(environment_variables or {}),
            "arguments": list(arguments or []),
            "datasource": datasource,
            "owner": owner,
            "labels": dict(labels or {}),
        }
        headers = {IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key else None
        result: dict[str, Any] = await self.request(
            "POST", "/v1/instances", json=body, headers=headers
        )
        return result

    async def list_instances(
        self, *, env: str | None = None, include_terminated: bool = False
    ) -> list[dict[str, Any]]:
        """This key's instances, newest first."""
        params = {"env": env, "all": include_terminated}
        return list((await self.request("GET", "/v1/instances", params=params))["instances"])

    async def get_instance(self, instance_id: str) -> dict[str, Any]:
        """One instance."""
        result: dict[str, Any] = await self.request("GET", f"/v1/instances/{instance_id}")
        return result

    async def delete_instance(self, instance_id: str) -> dict[str, Any]:
        """Terminate an instance."""
        result: dict[str, Any] = await self.request("DELETE", f"/v1/instances/{instance_id}")
        return result

    async def renew_instance(self, instance_id: str, ttl: str | float) -> dict[str, Any]:
        """Expire ``ttl`` from now."""
        result: dict[str, Any] = await self.request(
            "POST", f"/v1/instances/{instance_id}/renew", json={"ttl": ttl}
        )
        return result

    async def fork_instance(self, instance_id: str, n: int) -> list[dict[str, Any]]:
        """``n`` copies of a running instance."""
        result = await self.request("POST", f"/v1/instances/{instance_id}/fork", json={"n": n})
        return list(result["instances"])

    # -- services --------------------------------------------------------------------------------
    async def create_service(
        self,
        env: str,
        *,
        name: str | None = None,
        replicas: int = 1,
        storage: bool = False,
        environment_variables: Mapping[str, str] | None = None,
        arguments: list[str] | None = None,
    ) -> dict[str, Any]:
        """Start a service of ``replicas`` instances."""
        body = {
            "env": env,
            "name": name,
            "replicas": replicas,
            "storage": storage,
            "environment_variables": dict(environment_variables or {}),
            "arguments": list(arguments or []),
        }
        result: dict[str, Any] = await self.request("POST", "/v1/services", json=body)
        return result

    async def list_services(self) -> list[dict[str, Any]]:
        """This key's services."""
        return list((await self.request("GET", "/v1/services"))["services"])

    async def get_service(self, service_id: str) -> dict[str, Any]:
        """One service and its replicas."""
        result: dict[str, Any] = await self.request("GET", f"/v1/services/{service_id}")
        return result

    async def update_service(
        self,
        service_id: str,
        *,
        replicas: int | None = None,
        env: str | None = None,
        environment_variables: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Scale a service or move it to another version or variables."""
        body: dict[str, Any] = {}
        if replicas is not None:
            body["replicas"] = replicas
        if env is not None:
            body["env"] = env
        if environment_variables is not None:
            body["environment_variables"] = dict(environment_variables)
        result: dict[str, Any] = await self.request(
            "PATCH", f"/v1/services/{service_id}", json=body
        )
        return result

    async def delete_service(
        self, service_id: str, *, keep_storage: bool | None = None
    ) -> dict[str, Any]:
        """Stop a service. Its storage: kept when ``keep_storage``, removed when False; when
        not said, the hub's rule (a Kubernetes volume kept, a directory on the hub removed)."""
        result: dict[str, Any] = await self.request(
            "DELETE", f"/v1/services/{service_id}", params={"keep_storage": keep_storage}
        )
        return result

    # -- rollout runs (aenv_ray.hubruns) ------------------------------------------------------
    async def open_run(
        self,
        name: str,
        *,
        settings: Mapping[str, Any] | None = None,
        driver: Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """Register a rollout run with the hub (this key's tenant), live from now; with
        ``run_id``, take up one registered before. Its record: ``id``, ``received`` (the bytes
        of its records the hub holds: send from there), ``live``, ``settings``, ..."""
        body: dict[str, Any] = {
            "name": name,
            "settings": dict(settings or {}),
            "driver": dict(driver or {}),
        }
        if run_id is not None:
            body["id"] = run_id
        result: dict[str, Any] = await self.request("POST", "/v1/runs", json=body)
        return result

    async def send_run_records(
        self, run_id: str, offset: int, data: bytes, *, reset: bool = False
    ) -> dict[str, Any]:
        """Send ``data``, the run's ``trajectories.jsonl`` from byte ``offset`` (whole lines; a
        heartbeat when empty); ``reset``: the hub's copy starts again. ``{"received",
        "accepted"}``: the next post starts at ``received``."""
        body = {"offset": offset, "data": data.decode(), "reset": reset}
        result: dict[str, Any] = await self.request("POST", f"/v1/runs/{run_id}/records", json=body)
        return result

    async def end_run(self, run_id: str) -> dict[str, Any]:
        """Mark a run finished."""
        result: dict[str, Any] = await self.request(
            "PATCH", f"/v1/runs/{run_id}", json={"state": "finished"}
        )
        return result

    async def delete_run(self, run_id: str) -> dict[str, Any]:
        """Delete a run and its records from the hub."""
        result: dict[str, Any] = await self.request("DELETE", f"/v1/runs/{run_id}")
        return result

    async def list_runs(self) -> list[dict[str, Any]]:
        """This key's tenant's runs, the newest first."""
        return list((await self.request("GET", "/v1/runs"))["runs"])


def _params(params: Mapping[str, Any] | None) -> httpx.QueryParams | None:
    if params is None:
        return None
    out: list[tuple[str, str | int | float | bool | None]] = []
    for key, value in params.items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if item is None or item == "":
                continue
            out.append((key, str(item).lower() if isinstance(item, bool) else str(item)))
    return httpx.QueryParams(out)


class RemoteEngine:
    """A :class:`~aenv_ray.engine.SandboxEngine` whose instances a hub creates.

    The definition is resolved by the hub (its registry, then its built-ins), so specs name
    ``env_ref`` only; ``project`` and ``storage`` are the hub's business and are ignored.
    """

    name = "envhub"
    closes_instances = False  # the hub keeps them until released or expired

    def __init__(
        self, client: HubClient, *, route: str = "auto", connect_timeout: float = 5.0
    ) -> None:
        if route not in ("auto", "direct", "proxy"):
            raise ConfigurationError(f"route `{route}`: use auto, direct or proxy")
        self.client = client
        self.routing = route  # AENV_HUB_ROUTE: how calls reach the instances
        self.connect_timeout = connect_timeout
        self.proxy_urls: dict[str, str] = {}  # instance id -> the hub's proxy for it
        self._abandoned: set[asyncio.Task[None]] = set()  # deletions of given-up creates

    def _info(self, doc: Mapping[str, Any]) -> InstanceInfo:
        if doc.get("proxy_url"):
            self.proxy_urls[str(doc["id"])] = str(doc["proxy_url"])
        return info_from_json(doc)

    async def create(self, spec: InstanceSpec, *, timeout: float = 60.0) -> InstanceInfo:
        """Ask the hub for an instance of ``spec.env_ref``. A create whose answer is lost (the
        connection dropped, the hub did not answer in time, it restarted) is sent again, up
        to :data:`CREATE_ATTEMPTS` times in all, with the same idempotency key: the hub
        answers the instance the first one started, never a second one. A create cancelled
        while under way (the hub finishes it all the same) has its instance deleted in the
        background, found by that key; :meth:`aclose` waits for those deletions."""
        key = secrets.token_hex(16)
        try:
            return await self._create(spec, key)
        except asyncio.CancelledError:
            task = asyncio.get_running_loop().create_task(self._delete_abandoned(spec, key))
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
            raise

    async def _create(self, spec: InstanceSpec, key: str) -> InstanceInfo:
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                doc = await self._send_create(spec, key)
            except HubUnreachableError as exc:
                if attempt == CREATE_ATTEMPTS:
                    raise
                log.warning(
                    "create sent again with its idempotency key after a lost answer",
                    extra={"env": spec.env_ref, "attempt": attempt, "error": str(exc)},
                )
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))
                continue
            return self._info(doc)
        raise AssertionError("not reached")  # pragma: no cover

    async def _send_create(self, spec: InstanceSpec, key: str) -> dict[str, Any]:
        return await self.client.create_instance(
            spec.env_ref,
            ttl=spec.ttl,
            environment_variables=spec.environment_variables,
            arguments=list(spec.arguments),
            datasource=spec.datasource,
            owner=spec.owner,
            labels=spec.labels,
            idempotency_key=key,
        )

    async def _delete_abandoned(self, spec: InstanceSpec, key: str) -> None:
        """Delete the instance a cancelled create with idempotency key ``key`` made: the same
        create sent again answers that instance (or, if the first never reached the hub,
        makes one, deleted as well)."""
        try:
            doc = await self._send_create(spec, key)
            await self.client.delete_instance(str(doc["id"]))
        except AEnvError as exc:
            log.warning(
                "the instance of a cancelled create could not be deleted; it ends at its TTL",
                extra={"env": spec.env_ref, "error": str(exc)},
            )

    async def get(self, instance_id: str) -> InstanceInfo:
        """The instance's state, as the hub knows it."""
        return self._info(await self.client.get_instance(instance_id))

    async def route(self, info: InstanceInfo) -> Route:
        """The runtime's own address when this process can reach it (no hop through the hub on
        the hot path), else the hub's proxy for it, with the hub's key (``route`` forces
        either)."""
        direct = Route.direct(info) if info.url else None
        if direct is not None and (
            self.routing == "direct"
            or (
                self.routing == "auto" and await reachable(direct.url, timeout=self.connect_timeout)
            )
        ):
            return direct
        proxy = self.proxy_urls.get(info.id)
        if proxy is None:
            raise ProtocolError(f"the hub gave no proxy address for instance {info.id}")
        log.info("calls go through the hub", extra={"instance": info.id, "proxy": proxy})
        return Route(proxy, self.client.headers)

    async def list(self, *, env_ref: str | None = None) -> builtins.list[InstanceInfo]:
        """This key's live instances."""
        return [self._info(d) for d in await self.client.list_instances(env=env_ref)]

    async def delete(self, instance_id: str) -> InstanceInfo:
        """Terminate the instance."""
        return self._info(await self.client.delete_instance(instance_id))

    async def renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        """Expire ``ttl`` seconds from now."""
        return self._info(await self.client.renew_instance(instance_id, ttl))

    async def fork(
        self, instance_id: str, n: int, *, timeout: float = 60.0
    ) -> builtins.list[InstanceInfo]:
        """``n`` copies, made by the hub's engine."""
        return [self._info(d) for d in await self.client.fork_instance(instance_id, n)]

    async def aclose(self) -> None:
        """Close the client (instances live on at the hub until released or expired), once the
        deletions of cancelled creates' instances are done (at most a create's time)."""
        if self._abandoned:
            await asyncio.wait(set(self._abandoned), timeout=_ABANDONED_WAIT)
        await self.client.aclose()


async def reachable(url: str, *, timeout: float = 1.0) -> bool:
    """True when a TCP connection to ``url``'s host and port opens within ``timeout``."""
    parsed = urlparse(url)
    if not parsed.hostname:
        return False
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parsed.hostname, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
