"""The local engine as a small daemon, so that ``aenv instance ...`` calls share instances.

``python -m sandbox_runtime.local.daemon --state-dir DIR`` runs one :class:`LocalEngine` and
answers JSON over a Unix socket ``DIR/engine.sock`` (mode 0600: only its user):

==========================================  =================================================
``POST   /v1/instances``                    ``{"env", "ttl"?, "environment_variables"?,
                                            "arguments"?, "datasource"?}`` -> instance (201)
``GET    /v1/instances``                    ``{"instances": [...]}``
``GET    /v1/instances/{id}``               instance
``DELETE /v1/instances/{id}``               instance, terminated
``POST   /v1/instances/{id}/renew``         ``{"ttl"}`` -> instance
==========================================  =================================================

Errors are ``{"error", "type"}`` with 400 (configuration), 404 (unknown instance or
environment), 503 (capacity), 500. The daemon owns its instances: they die with it. It exits
after ``--idle-exit`` seconds without a running instance (default 600), or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from aenv_ray.config import parse_duration
from aenv_ray.engine import InstanceSpec, InstanceState, info_to_json
from aenv_ray.errors import (
    AEnvError,
    CapacityError,
    ConfigurationError,
    EnvironmentNotFoundError,
    InstanceNotFoundError,
)
from sandbox_runtime.local.engine import LocalEngine

__all__ = ["main", "make_app"]

SOCKET_NAME = "engine.sock"


def _status(exc: AEnvError) -> int:
    if isinstance(exc, InstanceNotFoundError | EnvironmentNotFoundError):
        return 404
    if isinstance(exc, ConfigurationError):
        return 400
    if isinstance(exc, CapacityError):
        return 503
    return 500


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except AEnvError as exc:
        return web.json_response(
            {"error": str(exc), "type": type(exc).__name__}, status=_status(exc)
        )
    except (ValueError, KeyError, TypeError) as exc:
        return web.json_response(
            {"error": f"bad request: {exc}", "type": "ConfigurationError"}, status=400
        )


def make_app(engine: LocalEngine, env_path: str = "") -> web.Application:
    """The daemon's HTTP API over ``engine``."""
    from aenv_ray._resolve import resolve_environment

    routes = web.RouteTableDef()

    @routes.post("/v1/instances")
    async def create(request: web.Request) -> web.Response:
        body = await request.json()
        ref, project = resolve_environment(str(body["env"]), env_path)
        ttl = body.get("ttl")
        spec = InstanceSpec(
            env_ref=ref,
            project=str(project),
            ttl=parse_duration(ttl) if ttl is not None else None,
            environment_variables={
                str(k): str(v) for k, v in (body.get("environment_variables") or {}).items()
            },
            arguments=tuple(str(a) for a in body.get("arguments") or ()),
            datasource=body.get("datasource"),
            owner=body.get("owner"),
        )
        return web.json_response(info_to_json(await engine.create(spec)), status=201)

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
        ttl = parse_duration((await request.json())["ttl"])
        return web.json_response(info_to_json(await engine.renew(request.match_info["id"], ttl)))

    app = web.Application(middlewares=[_errors])
    app.add_routes(routes)
    return app


async def _serve(state_dir: Path, idle_exit: float, env_path: str) -> None:
    engine = LocalEngine()
    runner = web.AppRunner(make_app(engine, env_path), access_log=None)
    await runner.setup()
    path = state_dir / SOCKET_NAME
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    site = web.UnixSite(runner, str(path))
    await site.start()
    path.chmod(0o600)
    (state_dir / "engine.pid").write_text(str(os.getpid()))
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
            if running:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= idle_exit:
                break
    finally:
        await runner.cleanup()
        await engine.aclose()
        for name in (SOCKET_NAME, "engine.pid"):
            with contextlib.suppress(FileNotFoundError):
                (state_dir / name).unlink()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sandbox_runtime.local.daemon``."""
    from aenv_ray.logs import configure_logging
    from aenv_ray.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m sandbox_runtime.local.daemon")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--idle-exit", type=float, default=600.0)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = (state_dir / "engine.lock").open("w")
    try:  # one daemon per state directory: a second one started in a race leaves at once
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    asyncio.run(_serve(state_dir, args.idle_exit, Settings().env_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
