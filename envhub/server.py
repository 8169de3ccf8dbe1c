"""Running a hub: open the store, build the app over an engine, serve it with uvicorn, whose
connections :mod:`envhub.connections` guards (read timeouts, caps per client and in all).

``aenv serve`` calls :func:`serve`; tests call it in a subprocess (``python -m envhub``) or
build the app with :func:`envhub.app.create_app` directly.

May import: the standard library, ``aenv_ray``, ``envhub``, uvicorn.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import uvicorn

from aenv_ray.engine import SandboxEngine
from aenv_ray.errors import ConfigurationError
from aenv_ray.net import bind_socket
from envhub.app import HubOptions, create_app
from envhub.connections import (
    ConnectionGate,
    accept_backlog,
    connection_cap,
    guarded_protocol,
    raise_fd_limit,
)
from envhub.keys import LOCAL_TENANT
from envhub.limits import Limits
from envhub.store import open_store

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["check_exposure", "is_loopback", "serve"]

log = logging.getLogger("envhub.server")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.1``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, auth: bool, limits: Limits | None = None) -> None:
    """Refuse to serve without auth anywhere but loopback (anyone on the network could run
    code), and without auth with networked instances (their code could call the hub)."""
    if not auth and not is_loopback(host):
        raise ConfigurationError(
            f"--no-auth on {host} would let anyone who reaches it start instances and publish "
            "code; serve on 127.0.0.1 or keep auth on (create keys with `aenv keys create`)"
        )
    if not auth and limits is not None and limits.for_tenant(LOCAL_TENANT).network:
        raise ConfigurationError(
            "--no-auth with instances on the network (--allow-network, or `network` for tenant "
            f"`{LOCAL_TENANT}` in --limits) would let the code in an instance call this hub as "
            "you; keep auth on (create keys with `aenv keys create`) or leave the network off"
        )


async def serve(
    *,
    host: str,
    port: int,
    store_url: str | None,
    engine: SandboxEngine,
    options: HubOptions,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
    extend: Callable[[FastAPI], None] | None = None,
) -> None:
    """Serve the hub until SIGINT/SIGTERM. ``port=0`` picks a free one; ``on_ready`` gets the
    URL once the socket listens and the control plane has synced with the engine; ``extend``
    gets the app before it serves (``aenv serve`` adds the UI's page with it)."""
    check_exposure(host, options.auth, options.limits)
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise ConfigurationError(f"{exc.strerror} (--port)") from exc
    try:
        store = await open_store(store_url)
    except BaseException:
        sock.close()
        raise
    app = create_app(store, engine, options)
    if extend is not None:
        extend(app)
    bound = sock.getsockname()[1]
    defences = options.defences
    fd_limit = raise_fd_limit()
    gate = ConnectionGate(defences, connection_cap(defences, fd_limit))
    app.state.gate = gate  # for /v1/defences
    config = uvicorn.Config(
        app,
        http=guarded_protocol(gate),
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        backlog=accept_backlog(fd_limit, gate.max_connections),
        timeout_keep_alive=max(1, min(5, math.ceil(defences.header_timeout))),
    )
    log.info(
        "connections: at most %s, %s per client; headers within %g s, body pauses %g s; "
        "%s failed authentications per %g s per client",
        gate.max_connections or "no limit",
        defences.client_connections or "any",
        defences.header_timeout,
        defences.body_timeout,
        defences.auth_failures or "any number of",
        defences.auth_window,
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.02)
        if on_ready is not None:
            on_ready(url)

    watcher = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        sock.close()
    if not server.started:
        log.error("the hub did not start; see the log above")
