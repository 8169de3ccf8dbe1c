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

The API (every list is paged on the server: ``offset``, ``limit`` up to 500):

==============================================  ==================================================
``GET /api/runs``                               every run: settings (``run.json``) and summary
``GET /api/runs/{run}``                         one run: settings, summary, tools, kinds of end
``GET /api/runs/{run}/episodes``                a page of episodes; filters ``task``, ``kind``
                                                (``ok``, ``failed``, a kind), ``tool``,
                                                ``min_reward``, ``max_reward``, ``q``,
                                                ``errors=1``; ``sort`` (``-reward``, ...)
``GET /api/runs/{run}/episodes/{id}``           one episode's whole record
``GET /api/runs/{run}/rewards``                 histogram, pass rate, kinds, tool and turn
                                                latency, per-task table (``task``, ``passing``)
``GET /api/compare?a=RUN&b=RUN``                two runs per task: better, worse, same
==============================================  ==================================================

May import: the standard library, ``aenv_ray``, aiohttp, :mod:`aenv_ui.index`,
:mod:`aenv_ui.assets`.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

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
from aenv_ui.index import EpisodeQuery, RunIndex, compare, iter_runs

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


class UiServer:
    """The runs under ``root`` and their indexes (in ``index_dir``), behind ``token``."""

    def __init__(self, root: Path, *, token: str | None = None, index_dir: Path | None = None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ConfigurationError(
                f"{root} is not a directory: pass a run directory (`aenv rollout --out DIR`) "
                "or a directory holding run directories"
            )
        self.token = token or secrets.token_urlsafe(24)
        self.index_dir = index_dir
        self._indexes: dict[str, RunIndex] = {}
        self._opening = threading.Lock()

    def runs(self) -> dict[str, Path]:
        """The runs by name (a directory's name; ``.`` when ``root`` is itself a run)."""
        return {("." if path == self.root else path.name): path for path in iter_runs(self.root)}

    def index(self, name: str) -> RunIndex:
        """The refreshed index of run ``name``."""
        with self._opening:  # one index per run, whichever thread asks first
            index = self._indexes.get(name)
            if index is None:
                path = self.runs().get(name)
                if path is None:
                    known = ", ".join(self.runs()) or "none"
                    raise RunNotFoundError(f"no run `{name}` under {self.root}; the runs: {known}")
                index = self._indexes[name] = RunIndex.open(path, self.index_dir)
        index.refresh(at_most_every=1.0)
        return index

    async def aindex(self, name: str) -> RunIndex:
        """:meth:`index` in a worker thread: reading a large run's records the first time
        takes seconds, and the server goes on answering meanwhile."""
        return await asyncio.to_thread(self.index, name)

    def close(self) -> None:
        """Close every index."""
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()

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


def _float(request: web.Request, name: str) -> float | None:
    value = request.query.get(name, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigurationError(f"`{name}` must be a number, not `{value}`") from None


def _int(request: web.Request, name: str, default: int) -> int:
    value = request.query.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ConfigurationError(f"`{name}` must be a whole number >= 0, not `{value}`")
    return int(value)


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
        out: list[dict[str, Any]] = []
        for name in ui.runs():
            index = await ui.aindex(name)
            out.append({"name": name, "settings": index.settings(), "summary": index.summary()})
        return web.json_response({"root": str(ui.root), "runs": out})

    async def run(request: web.Request) -> web.StreamResponse:
        name = request.match_info["run"]
        index = await ui.aindex(name)
        return web.json_response(
            {
                "name": name,
                "path": str(index.run),
                "settings": index.settings(),
                "summary": index.summary(),
                "tools": index.tools(),
                "kinds": index.kinds(),
                "tasks": [t["task_id"] for t in index.tasks()],
            }
        )

    async def episodes(request: web.Request) -> web.StreamResponse:
        index = await ui.aindex(request.match_info["run"])
        q = request.query
        query = EpisodeQuery(
            task=q.get("task") or None,
            kind=q.get("kind") or None,
            tool=q.get("tool") or None,
            min_reward=_float(request, "min_reward"),
            max_reward=_float(request, "max_reward"),
            text=q.get("q") or None,
            errors=q.get("errors") in ("1", "true"),
        )
        page_ = index.episodes(
            query,
            offset=_int(request, "offset", 0),
            limit=_int(request, "limit", 50),
            sort=q.get("sort") or "arrival",
        )
        return web.json_response(page_)

    async def episode(request: web.Request) -> web.StreamResponse:
        index = await ui.aindex(request.match_info["run"])
        return web.json_response(index.episode(request.match_info["episode"]))

    async def rewards(request: web.Request) -> web.StreamResponse:
        index = await ui.aindex(request.match_info["run"])
        passing = _float(request, "passing")
        data = index.rewards(
            passing=1.0 if passing is None else passing, task=request.query.get("task") or None
        )
        return web.json_response(data)

    async def compare_runs(request: web.Request) -> web.StreamResponse:
        a, b = request.query.get("a"), request.query.get("b")
        if not a or not b:
            raise ConfigurationError("compare takes two runs: /api/compare?a=RUN&b=RUN")
        passing = _float(request, "passing")
        data = compare(
            await ui.aindex(a), await ui.aindex(b), passing=1.0 if passing is None else passing
        )
        return web.json_response({"a_name": a, "b_name": b, **data})

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
