"""The UI's server over run directories (``aenv ui DIR``): the pages, their JSON API, the token.

``DIR`` is one run directory (``aenv rollout --out DIR``) or a directory of them; runs that
appear in it later are listed at the next request. Each run gets a :class:`~aenv_ui.index.RunIndex`,
refreshed at most once a second while pages ask (so a live run's pages follow it).

Who may look: the server listens on loopback unless told otherwise, and every API request needs
the token of the URL it printed (``http://127.0.0.1:PORT/?token=T``): opening that URL sets a
cookie (``HttpOnly``, ``SameSite=Strict``) and drops the token from the address bar; a program
sends ``Authorization: Bearer T``. A request without it is 401, with a wrong one 403, each with
the hub's error body (``{"error": ..., "type": ...}``) saying what to do. The assets (the
front-end's code, plotly.js) hold no data and are served to anyone who reaches the port.

The API is :class:`aenv_ui.runs.RunSet`'s under ``/api`` (``GET /api/runs``,
``/api/runs/{run}``, ``.../episodes``, ``.../episodes/{id}``, ``.../rewards``,
``/api/compare?a=RUN&b=RUN``); every list is paged on the server (``offset``, ``limit`` up to
500).

May import: the standard library, ``aenv_ray``, aiohttp, :mod:`aenv_ui.runs`,
:mod:`aenv_ui.assets`.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from aenv_ray.errors import (
    AEnvError,
    AuthenticationError,
    ConfigurationError,
    PermissionDeniedError,
    RunNotFoundError,
    encode_error,
)
from aenv_ui.assets import asset, page
from aenv_ui.runs import RunSet

__all__ = ["COOKIE", "UiServer", "create_app", "serve"]

COOKIE = "aenv_ui_token"
_STATUS = {
    AuthenticationError: 401,
    PermissionDeniedError: 403,
    RunNotFoundError: 404,
    ConfigurationError: 400,
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(exc: AEnvError) -> web.Response:
    status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 500)
    return web.json_response(encode_error(exc), status=status)


class UiServer(RunSet):
    """The runs under ``root`` and their indexes (in ``index_dir``), behind ``token``."""

    def __init__(self, root: Path, *, token: str | None = None, index_dir: Path | None = None):
        super().__init__(root, index_dir=index_dir)
        self.token = token or secrets.token_urlsafe(24)

    # -- who may look --------------------------------------------------------------------------
    def _given(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return request.cookies.get(COOKIE)

    def check(self, request: web.Request) -> None:
        """Raise unless ``request`` carries the token (401 without one, 403 with a wrong one)."""
        given = self._given(request)
        if not given:
            raise AuthenticationError(
                "this UI needs its token: open the URL `aenv ui` printed (it carries "
                "?token=...), or send `Authorization: Bearer TOKEN`"
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise PermissionDeniedError(
                "this token is not this UI's (an older `aenv ui`'s?): open the URL the running "
                "`aenv ui` printed"
            )


def create_app(ui: UiServer) -> web.Application:
    """The aiohttp application of ``ui``: the page, its assets and the API."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path.startswith("/api/"):
                ui.check(request)
            return await handler(request)
        except AEnvError as exc:
            return _error(exc)

    async def index_page(request: web.Request) -> web.StreamResponse:
        token = request.query.get("token")
        if token is not None:
            if not hmac.compare_digest(token.encode(), ui.token.encode()):
                return _error(
                    PermissionDeniedError(
                        "this token is not this UI's: open the URL the running `aenv ui` printed"
                    )
                )
            response = web.HTTPFound("/")
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            raise response
        return web.Response(text=page(mode="runs", base=""), content_type="text/html")

    async def assets(request: web.Request) -> web.StreamResponse:
        body, kind = asset(request.match_info["name"])
        return web.Response(body=body, content_type=kind, headers={"Cache-Control": "max-age=3600"})

    async def runs(request: web.Request) -> web.StreamResponse:
        return web.json_response(await ui.list_runs())

    async def run(request: web.Request) -> web.StreamResponse:
        return web.json_response(await ui.run(request.match_info["run"]))

    async def episodes(request: web.Request) -> web.StreamResponse:
        return web.json_response(await ui.episodes(request.match_info["run"], request.query))

    async def episode(request: web.Request) -> web.StreamResponse:
        found = await ui.episode(request.match_info["run"], request.match_info["episode"])
        return web.json_response(found)

    async def rewards(request: web.Request) -> web.StreamResponse:
        return web.json_response(await ui.rewards(request.match_info["run"], request.query))

    async def compare_runs(request: web.Request) -> web.StreamResponse:
        return web.json_response(await ui.compare(request.query))

    app = web.Application(middlewares=[errors])
    app.router.add_get("/", index_page)
    app.router.add_get("/assets/{name}", assets)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/runs/{run}", run)
    app.router.add_get("/api/runs/{run}/episodes", episodes)
    app.router.add_get("/api/runs/{run}/episodes/{episode}", episode)
    app.router.add_get("/api/runs/{run}/rewards", rewards)
    app.router.add_get("/api/compare", compare_runs)

    async def closing(app: web.Application) -> None:
        ui.close()

    app.on_cleanup.append(closing)
    return app


async def serve(
    ui: UiServer,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``ui`` on ``host:port`` (0: a free port) until cancelled, SIGINT or SIGTERM;
    ``on_ready`` gets the URL to open (with the token) once the socket listens."""
    import contextlib
    import signal

    from aenv_ray.net import bind_socket

    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise ConfigurationError(f"{exc.strerror} (--port)") from exc
    runner = web.AppRunner(create_app(ui), access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{sock.getsockname()[1]}/?token={ui.token}"
        if on_ready is not None:
            on_ready(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        sock.close()
