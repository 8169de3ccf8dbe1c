"""The local engine as a small daemon: instances that outlive the processes asking for them.

``aenv instance ...`` calls share instances through it, and EnvHub keeps its local instances in
it across restarts (:class:`local_backend.client.DaemonEngine` is its client).
``python -m local_backend.daemon --state-dir DIR`` runs one :class:`LocalEngine` and
answers JSON over a Unix socket ``DIR/engine.sock`` (mode 0600: only its user):

==========================================  =================================================
``POST   /v1/instances``                    ``{"env", "project"?, "ttl"?, "timeout"?,
                                            "environment_variables"?, "arguments"?,
                                            "datasource"?, "storage"?, "owner"?,
                                            "labels"?}`` -> instance (201); header
                                            ``Idempotency-Key``? (see below)
``GET    /v1/instances[?env=REF]``          ``{"instances": [...]}``, newest first
``GET    /v1/instances/{id}``               instance
``DELETE /v1/instances/{id}``               instance, terminated
``POST   /v1/instances/{id}/renew``         ``{"ttl"}`` -> instance
``POST   /v1/instances/{id}/fork``          ``{"n", "timeout"?}`` -> ``{"instances": [...]}``
``POST   /v1/inspect``                      ``{"env", "project"?, "timeout"?}`` -> the manifest
                                            of the project loaded in a sandbox
``GET    /metrics``                         Prometheus metrics (:mod:`local_backend._metrics`;
                                            501 without the ``metrics`` extra)
==========================================  =================================================

Prometheus cannot scrape a Unix socket: ``--metrics-port PORT`` (or ``AENV_DAEMON_METRICS_PORT``
in the environment of whoever starts the daemon) serves ``GET /metrics``, and nothing else, on
``127.0.0.1:PORT`` as well (docs/observability.md).

``env`` is a name (``NAME`` or ``NAME@VERSION``, found as ``aenv`` finds them: ``--env-path``,
then the built-ins) unless ``project`` is given: an absolute project directory used as it is,
``env`` then only its reference. :class:`~local_backend.client.DaemonEngine` looks names up
in its caller's process (the caller's ``AENV_ENV_PATH``) and sends ``project``, so
``--env-path`` (fixed when the daemon starts) only serves requests that name ``env`` alone.
``ttl`` is seconds or a duration (``"30m"``); ``timeout`` is
seconds to wait for the instance to start (default 60). An instance is
:func:`~aenv_ray.engine.info_to_json`'s document.

**No instance outlives a create its caller gave up.** A create whose caller is gone by the time
the instance runs (it closed the connection: its task was cancelled, its process ended) has the
instance deleted at once. A create sent with an ``Idempotency-Key`` header (8 to 128
characters) is answered, for :data:`KEPT` seconds after it ends, by that create's outcome when
sent again with the same key, waiting for it if it is still under way: the client of a cancelled
create sends it again and deletes what it answers
(:meth:`~local_backend.client.DaemonEngine.create`), which covers an answer lost after it was
sent too.

Errors are :func:`aenv_ray.errors.encode_error`'s envelope (``{"error", "type", "retryable",
...}``, ``type`` the name of the :mod:`aenv_ray.errors` class), with 400 (configuration), 404
(unknown instance or environment), 503 (capacity), 504 (a start timed out), 500. The daemon
owns its instances: they die with it. It exits after ``--idle-exit`` seconds with neither a
running instance nor a request (default 600), or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from aenv_ray.config import parse_duration
from aenv_ray.engine import InstanceInfo, InstanceSpec, InstanceState, info_to_json
from aenv_ray.errors import (
    AEnvError,
    AEnvTimeoutError,
    CapacityError,
    ConfigurationError,
    EnvironmentNotFoundError,
    InstanceNotFoundError,
    encode_error,
)
from local_backend._metrics import EngineMetrics
from local_backend.engine import LocalEngine

__all__ = ["IDEMPOTENCY_HEADER", "KEPT", "METRICS_PORT_ENV", "SOCKET_NAME", "main", "make_app"]

log = logging.getLogger("local_backend.daemon")

SOCKET_NAME = "engine.sock"
PID_NAME = "engine.pid"
_DEFAULT_TIMEOUT = 60.0
IDEMPOTENCY_HEADER = "Idempotency-Key"  # as the hub's (aenv_ray.hub)
METRICS_PORT_ENV = "AENV_DAEMON_METRICS_PORT"
"""The variable naming the loopback port a daemon serves ``GET /metrics`` on (also
``--metrics-port``); unset or empty: the Unix socket only."""
KEPT = 600.0  # seconds a create's outcome answers a create sent again with its idempotency key


def _status(exc: AEnvError) -> int:
    if isinstance(exc, InstanceNotFoundError | EnvironmentNotFoundError):
        return 404
    if isinstance(exc, ConfigurationError):
        return 400
    if isinstance(exc, CapacityError):
        return 503
    if isinstance(exc, AEnvTimeoutError):
        return 504
    return 500


def _error(exc: AEnvError) -> web.Response:
    return web.json_response(encode_error(exc), status=_status(exc))


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except AEnvError as exc:
        return _error(exc)
    except (ValueError, KeyError, TypeError) as exc:
        return _error(ConfigurationError(f"bad request: {exc!r}"))
    except web.HTTPException:
        raise  # aiohttp's own answers (no such route, wrong method)
    except Exception as exc:
        log.exception("request failed", extra={"path": request.path})
        return _error(AEnvError(f"the engine daemon failed: {exc!r}"))


@dataclass
class _Activity:
    """Requests in flight and when the last one ended: the daemon is not idle while asked."""

    busy: int = 0
    last: float = field(default_factory=time.monotonic)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.busy += 1
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            self.busy -= 1
            self.last = time.monotonic()


@dataclass
class _Creates:
    """Creates by idempotency key: the one under way (or done, for :data:`KEPT` seconds) that a
    create sent again with the same key answers."""

    tasks: dict[str, tuple[float, asyncio.Task[InstanceInfo]]] = field(default_factory=dict)

    def start(
        self, key: str, create: Callable[[], Coroutine[Any, Any, InstanceInfo]]
    ) -> asyncio.Task[InstanceInfo]:
        """The create of ``key``: the one under way or kept, else ``create()`` started."""
        if not 8 <= len(key) <= 128:
            raise ConfigurationError(
                f"{IDEMPOTENCY_HEADER} `{key[:40]}`: send 8 to 128 characters (a random one per "
                "create, the same when it is sent again)"
            )
        now = time.monotonic()
        for old, (started, task) in list(self.tasks.items()):
            if task.done() and now - started > KEPT:
                del self.tasks[old]
        found = self.tasks.get(key)
        if found is None:
            task = asyncio.ensure_future(create())
            task.add_done_callback(_retrieved)  # its error is its callers'
            found = self.tasks[key] = (now, task)
        return found[1]


def _retrieved(task: asyncio.Task[InstanceInfo]) -> None:
    if not task.cancelled():
        task.exception()


def _gone(request: web.Request) -> bool:
    """Whether the caller of ``request`` closed its connection (it gave up on the answer)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _strings(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"`{key}` must be an object of strings, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _seconds(body: Mapping[str, Any], key: str) -> float | None:
    """``body[key]`` as seconds (a number or a duration such as ``"30m"``), None if absent."""
    value = body.get(key)
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"`{key}`: {exc}") from exc


def _project(body: Mapping[str, Any], env_path: str) -> tuple[str, str]:
    """``(env_ref, project directory)``: ``project`` as given, else ``env`` looked up."""
    from aenv_ray.resolve import resolve_environment

    project = body.get("project")
    if project is None:
        ref, found = resolve_environment(str(body["env"]), env_path)
        return ref, str(found)
    path = Path(str(project))
    if not path.is_absolute() or not path.is_dir():
        raise ConfigurationError(
            f"project {project} is not an absolute path of a directory; pass the project "
            "directory's absolute path, or leave `project` out and name the environment in `env`"
        )
    return str(body.get("env") or path.name), str(path)


def _scrape(engine: LocalEngine, metrics: EngineMetrics) -> Callable[..., Awaitable[web.Response]]:
    """The ``GET /metrics`` handler: the instances counted now, then every metric."""

    async def scrape(request: web.Request) -> web.Response:
        if not metrics.available:
            line = metrics.unavailable or "prometheus_client did not load"
            return web.Response(text=line + "\n", status=501)
        infos = await engine.list()
        metrics.set_instances((i.state.value for i in infos), (s.value for s in InstanceState))
        body, content_type = metrics.exposition(request.headers.get("Accept"))
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    return scrape


def metrics_app(engine: LocalEngine, metrics: EngineMetrics) -> web.Application:
    """An app serving ``GET /metrics`` alone (the daemon's loopback port for Prometheus)."""
    app = web.Application()
    app.router.add_get("/metrics", _scrape(engine, metrics))
    return app


def make_app(
    engine: LocalEngine,
    env_path: str = "",
    *,
    activity: _Activity | None = None,
    metrics: EngineMetrics | None = None,
) -> web.Application:
    """The daemon's HTTP API over ``engine`` (see the module docstring), counting in
    ``metrics`` (a new :class:`~local_backend._metrics.EngineMetrics` when not given)."""
    routes = web.RouteTableDef()
    creates = _Creates()
    metrics = metrics or EngineMetrics()

    @web.middleware
    async def counted(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except (AEnvError, ValueError, KeyError, TypeError) as exc:
            kind = type(exc).__name__ if isinstance(exc, AEnvError) else "ConfigurationError"
            resource = request.match_info.route.resource
            where = resource.canonical if resource is not None else "other"
            metrics.errors.labels(f"{request.method} {where}", kind).inc()
            raise

    @routes.post("/v1/instances")
    async def create(request: web.Request) -> web.Response:
        metrics.creates.inc()
        started = time.perf_counter()
        try:
            response = await start(request)
        except Exception as exc:
            kind = type(exc).__name__ if isinstance(exc, AEnvError) else "ConfigurationError"
            metrics.create_failures.labels(kind).inc()
            raise
        metrics.create_seconds.observe(time.perf_counter() - started)
        return response

    async def start(request: web.Request) -> web.Response:
        body = await request.json()
        ref, project = _project(body, env_path)
        spec = InstanceSpec(
            env_ref=ref,
            project=project,
            ttl=_seconds(body, "ttl"),
            environment_variables=_strings(body, "environment_variables"),
            arguments=tuple(str(a) for a in body.get("arguments") or ()),
            datasource=body.get("datasource"),
            owner=body.get("owner"),
            labels=_strings(body, "labels"),
            storage=body.get("storage"),
        )
        timeout = _seconds(body, "timeout") or _DEFAULT_TIMEOUT
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None:
            info = await engine.create(spec, timeout=timeout)
        else:  # shielded: the first caller's end does not end what a second one waits for
            info = await asyncio.shield(
                creates.start(key, lambda: engine.create(spec, timeout=timeout))
            )
        if _gone(request):  # nobody will learn of this instance: it would run until its TTL
            log.info("create given up by its caller; instance deleted", extra={"id": info.id})
            info = await engine.delete(info.id)
        return web.json_response(info_to_json(info), status=201)

    @routes.get("/v1/instances")
    async def listing(request: web.Request) -> web.Response:
        infos = await engine.list(env_ref=request.query.get("env"))
        return web.json_response({"instances": [info_to_json(i) for i in infos]})

    @routes.get("/v1/instances/{id}")
    async def get(request: web.Request) -> web.Response:
        return web.json_response(info_to_json(await engine.get(request.match_info["id"])))

    @routes.delete("/v1/instances/{id}")
    async def delete(request: web.Request) -> web.Response:
        return web.json_response(info_to_json(await engine.delete(request.match_info["id"])))

    @routes.post("/v1/instances/{id}/renew")
    async def renew(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("ttl") is None:
            raise ConfigurationError('renew needs `ttl`: seconds or a duration such as "1h"')
        ttl = _seconds(body, "ttl") or 0.0
        return web.json_response(info_to_json(await engine.renew(request.match_info["id"], ttl)))

    @routes.post("/v1/instances/{id}/fork")
    async def fork(request: web.Request) -> web.Response:
        body = await request.json()
        n = body["n"]
        if isinstance(n, bool) or not isinstance(n, int):
            raise ConfigurationError(f"fork needs an integer n >= 1, got {n!r}")
        timeout = _seconds(body, "timeout") or _DEFAULT_TIMEOUT
        infos = await engine.fork(request.match_info["id"], n, timeout=timeout)
        return web.json_response({"instances": [info_to_json(i) for i in infos]})

    @routes.post("/v1/inspect")
    async def inspect(request: web.Request) -> web.Response:
        body = await request.json()
        _, project = _project(body, env_path)
        timeout = _seconds(body, "timeout") or _DEFAULT_TIMEOUT
        return web.json_response(await engine.inspect(project, timeout=timeout))

    middlewares = [_errors, counted]
    if activity is not None:
        middlewares.insert(0, activity.middleware)
    app = web.Application(middlewares=middlewares)
    app.add_routes(routes)
    app.router.add_get("/metrics", _scrape(engine, metrics))
    return app


async def _serve(
    state_dir: Path, idle_exit: float, env_path: str, metrics_port: int | None = None
) -> None:
    engine = LocalEngine()
    activity = _Activity()
    metrics = EngineMetrics()
    runner = web.AppRunner(
        make_app(engine, env_path, activity=activity, metrics=metrics), access_log=None
    )
    await runner.setup()
    scraped: web.AppRunner | None = None
    if metrics_port is not None:  # loopback only: the counts, never the instance routes
        scraped = web.AppRunner(metrics_app(engine, metrics), access_log=None)
        await scraped.setup()
        await web.TCPSite(scraped, "127.0.0.1", metrics_port).start()
        log.info("engine daemon metrics", extra={"url": f"http://127.0.0.1:{metrics_port}"})
    path = state_dir / SOCKET_NAME
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    site = web.UnixSite(runner, str(path))
    umask = os.umask(0o177)  # the socket is this user's only from its creation, not from chmod
    try:
        await site.start()
    finally:
        os.umask(umask)
    path.chmod(0o600)
    (state_dir / PID_NAME).write_text(str(os.getpid()))
    log.info("engine daemon ready", extra={"socket": str(path), "pid": os.getpid()})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    idle_since = time.monotonic()
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(idle_exit, 5.0))
            running = [i for i in await engine.list() if i.state is not InstanceState.TERMINATED]
            if running or activity.busy:
                idle_since = time.monotonic()
            elif time.monotonic() - max(idle_since, activity.last) >= idle_exit:
                log.info("engine daemon idle, exiting", extra={"idle_exit": idle_exit})
                break
    finally:
        await runner.cleanup()
        if scraped is not None:
            await scraped.cleanup()
        await engine.aclose()
        for name in (SOCKET_NAME, PID_NAME):
            with contextlib.suppress(FileNotFoundError):
                (state_dir / name).unlink()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m local_backend.daemon``."""
    from aenv_ray.logs import configure_logging
    from aenv_ray.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m local_backend.daemon")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--idle-exit", type=float, default=600.0)
    parser.add_argument(
        "--env-path", default=None, help="where names are looked up (default: AENV_ENV_PATH)"
    )
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help=f"also serve GET /metrics on 127.0.0.1:PORT (default: ${METRICS_PORT_ENV})",
    )
    args = parser.parse_args(argv)
    if args.metrics_port is None and os.environ.get(METRICS_PORT_ENV, "").strip():
        args.metrics_port = int(os.environ[METRICS_PORT_ENV])
    configure_logging(args.log_level)
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = (state_dir / "engine.lock").open("w")
    try:  # one daemon per state directory: a second one started in a race leaves at once
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    env_path = Settings().env_path if args.env_path is None else args.env_path
    asyncio.run(_serve(state_dir, args.idle_exit, env_path, args.metrics_port))
    return 0


def _run_and_exit() -> None:
    """Run :func:`main`, then end without tearing the interpreter down (as a zygote ends):
    the engine, its socket and pid file are closed by then, and the teardown of a process that
    imported the engine and aiohttp only costs CPU while a client's ``shutdown`` waits."""
    from local_backend._launcher import run_then_exit

    run_then_exit(main, last=logging.shutdown)  # the log file's last lines


if __name__ == "__main__":
    _run_and_exit()
