"""The runtime's MCP side, built by the first MCP request: a runtime that never speaks MCP never
imports FastMCP.

FastMCP and the MCP SDK build ~600 pydantic models at import: ~1.5-2 s of CPU, most of a
runtime's start, paid by every zygote and every standalone runtime (a Kubernetes pod, ``aenv
run``) although most of them are only ever called on the fast path (the SDK's wire protocol:
tools, functions, reward, health), which needs none of it (tool schemas are the runtime's own,
:class:`aenv_ray.signature.CallSignature`'s, and FastMCP only carries them).

:class:`LazyMCP` holds the recipe and builds the app once:

- on the serving loop, :meth:`LazyMCP.app` builds it in a worker thread (the loop keeps
  answering fast-path calls meanwhile, and the watchdog never mistakes the build for a call
  blocking the loop), then starts its lifespan (MCP's session manager) on the loop; every MCP
  request that arrives meanwhile waits for the same build;
- from any thread, :meth:`LazyMCP.build` builds it at once (an engine that wants its first MCP
  client not to wait can call it before it serves, or before it forks).

A build holds a process-wide lock for its imports, and :func:`os.fork` takes that lock first
(``os.register_at_fork``): a fork of a running instance (the local engine's ``fork``), made on
another thread, never starts with FastMCP half-imported by a thread that does not exist in it.
If a build fails, the request that waited for it fails (HTTP 500) and the next MCP request
tries again. The build's memory (~39 MiB of modules) is the instance's own: a local instance
no longer shares it with its template.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "LazyMCP", "Message", "Receive", "Scope", "Send"]

log = logging.getLogger("sandbox_runtime.mcp")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BUILDING = threading.Lock()
"""Held while an MCP app is built (imports included); taken by ``os.fork`` before it forks."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_BUILDING.acquire,
        after_in_parent=_BUILDING.release,
        after_in_child=_BUILDING.release,
    )


class LazyMCP:
    """One runtime's MCP app, built from ``build`` (a function returning the ASGI app) on first
    use, at most once.

        >>> built = []
        >>> mcp = LazyMCP(lambda: built.append(1) or "the app")
        >>> mcp.is_built, built
        (False, [])
        >>> mcp.build(), mcp.build(), built
        ('the app', 'the app', [1])
    """

    def __init__(self, build: Callable[[], ASGIApp]) -> None:
        self._recipe = build
        self._app: ASGIApp | None = None
        self._serving: asyncio.Future[ASGIApp] | None = None  # built and its lifespan started
        self._lifespan: _LazyLifespan | None = None

    @property
    def is_built(self) -> bool:
        """True once the app was built (FastMCP imported)."""
        return self._app is not None

    def build(self) -> ASGIApp:
        """The app, built now if it is not yet (thread-safe: one build, others wait for it)."""
        app = self._app
        if app is None:
            with _BUILDING:
                if self._app is None:
                    self._app = self._recipe()
                app = self._app
        return app

    async def app(self) -> ASGIApp:
        """On the serving loop: the app, built (in a worker thread) and its lifespan started
        by the first caller; raise what the build or the start raised."""
        serving = self._serving
        if serving is None or (
            serving.done() and (serving.cancelled() or serving.exception() is not None)
        ):
            serving = self._serving = asyncio.ensure_future(self._start())
        return await asyncio.shield(serving)

    async def _start(self) -> ASGIApp:
        app = self._app
        if app is None:
            app = await asyncio.to_thread(self.build)
        lifespan = self._lifespan = self._lifespan or _LazyLifespan(app)
        try:
            await lifespan.started()
        except BaseException:
            self._lifespan = None  # the next request starts it again
            raise
        return app

    async def shutdown(self) -> None:
        """Stop the app's lifespan if it started (a few seconds at most)."""
        if self._lifespan is not None:
            await self._lifespan.shutdown()


class _LazyLifespan:
    """Run an ASGI app's lifespan on demand: started by the first caller of :meth:`started`,
    on the serving loop, and kept running until :meth:`shutdown`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._startup: asyncio.Future[None] | None = None
        self._inbox: asyncio.Queue[Message] | None = None
        self._stopped: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def started(self) -> None:
        """Return once the app's startup completed (raise if it failed)."""
        if self._startup is None:
            loop = asyncio.get_running_loop()
            self._startup = loop.create_future()
            self._inbox = asyncio.Queue()
            self._inbox.put_nowait({"type": "lifespan.startup"})
            self._stopped = asyncio.Event()
            scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
            self._task = loop.create_task(self._run(scope))
        await asyncio.shield(self._startup)

    async def _run(self, scope: Scope) -> None:
        inbox, startup, stopped = self._inbox, self._startup, self._stopped
        assert inbox is not None
        assert startup is not None
        assert stopped is not None

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete" and not startup.done():
                startup.set_result(None)
            elif kind == "lifespan.startup.failed" and not startup.done():
                failure = message.get("message")
                startup.set_exception(RuntimeError(f"MCP start-up failed: {failure}"))
            elif kind.startswith("lifespan.shutdown"):
                stopped.set()

        try:
            await self.app(scope, inbox.get, send)
        except Exception as exc:
            log.exception("MCP lifespan failed")
            if not startup.done():
                startup.set_exception(RuntimeError(f"MCP start-up failed: {exc}"))
        finally:
            stopped.set()

    async def shutdown(self) -> None:
        """Ask a started app to shut down and wait (a few seconds at most)."""
        if self._task is None or self._inbox is None or self._stopped is None:
            return
        self._inbox.put_nowait({"type": "lifespan.shutdown"})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), 5)
