"""OpenEnv's provider interface on aenv-ray: an OpenEnv environment server in an aenv-ray
instance, reached by OpenEnv's own clients.

:class:`AenvRayProvider` has both of OpenEnv's provider shapes (OpenEnv's ``EnvClient`` calls
them by name): ``ContainerProvider``'s ``start_container(image)``, ``wait_for_ready(base_url)``
and ``stop_container()``, where the image is an aenv-ray environment (``name@version``) made
from an OpenEnv project (:mod:`aenv_openenv.relay`); and ``RuntimeProvider``'s ``start()``,
``wait_for_ready()`` and ``stop()`` for the environment given to the constructor::

    provider = AenvRayProvider("echo-openenv@1.0.0", engine="kubernetes")
    with GenericEnvClient(provider=provider).sync() as env:  # starts, and stops on exit
        env.reset()

``start_container`` creates one instance on the engine (``local``: forked from a warm template
in milliseconds; ``kubernetes``: a pod), starts the OpenEnv server inside it
(``openenv_start``) and serves, on this machine's loopback, a small bridge whose every HTTP
request and WebSocket frame is a tool call of that instance (``openenv_http``,
``openenv_ws_*``): the OpenEnv server itself answers ``/ws``, ``/mcp``, ``/health``,
``/schema``, its sessions and its ``max_concurrent_envs``. ``stop_container`` closes the bridge
and releases the instance (its processes end with it).

The provider's event loop runs on a thread of its own, so its methods are plain calls from sync
and async code alike (OpenEnv calls them synchronously from its client's loop).

May import: ``aenv_ray``, starlette, uvicorn.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from aenv_openenv.process_provider import ProviderFaces
from aenv_openenv.server import require_token
from aenv_ray import Environment
from aenv_ray.engine import SandboxEngine
from aenv_ray.errors import AEnvError, ConfigurationError, InstanceClosedError

__all__ = ["AenvRayProvider", "bridge_app"]

T = TypeVar("T")


async def _tool(env: Environment, name: str, arguments: dict[str, Any]) -> Any:
    result = await env.call_tool(name, arguments)
    result.raise_for_error(tool=name)
    return result.structured if result.structured is not None else json.loads(result.text)


def bridge_app(env: Environment) -> Starlette:
    """An ASGI app that carries every HTTP request and WebSocket of an OpenEnv client to the
    OpenEnv server inside ``env``'s instance (through its relay tools)."""

    async def http(request: Request) -> Response:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        body = (await request.body()).decode()
        answer = await _tool(
            env,
            "openenv_http",
            {
                "method": request.method,
                "path": path,
                "body": body,
                "content_type": request.headers.get("content-type", "application/json"),
            },
        )
        return Response(
            base64.b64decode(answer["body"]),
            status_code=int(answer["status"]),
            media_type=answer["content_type"],
        )

    async def websocket(ws: WebSocket) -> None:
        path = ws.url.path + (f"?{ws.url.query}" if ws.url.query else "")
        await ws.accept()
        socket_id = (await _tool(env, "openenv_ws_open", {"path": path}))["socket"]
        try:
            # a refusal (capacity) the server sent at once is read after the client's first
            # frame, as OpenEnv's client reads it: the answer to what it sent
            while True:
                text = await ws.receive_text()
                answer = await _tool(env, "openenv_ws_send", {"socket_id": socket_id, "text": text})
                for frame in answer["frames"]:
                    await ws.send_text(frame)
                if answer["closed"]:
                    return
        except WebSocketDisconnect:
            pass
        finally:
            with contextlib.suppress(AEnvError):
                await _tool(env, "openenv_ws_close", {"socket_id": socket_id})
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await ws.close()

    return Starlette(
        routes=[
            WebSocketRoute("/{path:path}", websocket),
            Route("/{path:path}", http, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ]
    )


class AenvRayProvider(ProviderFaces):
    """Runs an OpenEnv environment server in an aenv-ray instance (see the module).

    Args:
        env: the aenv-ray environment (``name@version``) ``start()`` and a bare
            ``start_container()`` run.
        engine: the engine's name (``local``, ``daemon``, ``kubernetes``), an engine, or
            ``None`` (the SDK's default).
        datasource: the instance's datasource (on the local engine, a host directory mounted
            at ``/data``: a virtual environment with the OpenEnv server's packages).
        server_env: environment variables of the OpenEnv server's process.
        environment_factory: replaces how the instance's :class:`~aenv_ray.Environment` is made
            (``image, env_vars -> Environment``), e.g. from a project directory.
        token: the bridge then requires ``Authorization: Bearer TOKEN`` (:attr:`headers`; pass
            them to the client: ``GenericEnvClient(base_url, headers=provider.headers)``);
            without one, whoever shares this machine's loopback can use the bridge.

        >>> AenvRayProvider("echo-openenv@1.0.0").base_url is None
        True
    """

    def __init__(
        self,
        env: str | None = None,
        *,
        engine: SandboxEngine | str | None = None,
        datasource: str = "",
        server_env: dict[str, str] | None = None,
        environment_factory: Any = None,
        token: str | None = None,
    ) -> None:
        self.env = env
        self.engine = engine
        self.datasource = datasource
        self.server_env = dict(server_env or {})
        self._factory = environment_factory
        self.token = token
        self.base_url: str | None = None
        self.environment: Environment | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """What an OpenEnv client sends to the bridge (``{}`` without a token)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    # -- OpenEnv's ContainerProvider ------------------------------------------------------------

    def start_container(
        self,
        image: str | None = None,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Create the instance of ``image`` (an aenv-ray ``name@version``; default: ``env``),
        start its OpenEnv server and the bridge; return the bridge's base URL."""
        ref = image or self.env
        if not ref:
            raise ConfigurationError(
                "AenvRayProvider: no environment: pass AenvRayProvider('name@version') or "
                "start_container('name@version')"
            )
        if self.base_url is not None:
            raise ConfigurationError(
                f"AenvRayProvider already runs {self.base_url}: stop_container() first, or use "
                "one provider per server"
            )
        self._ensure_loop()
        return self._run(self._start(ref, port, dict(env_vars or {})))

    def wait_for_ready(self, base_url: str | None = None, timeout_s: float | None = 30.0) -> None:
        """Check that the OpenEnv server answers ``/health`` through the bridge (``start``
        already waited for it); ``TimeoutError`` when it does not."""
        if self.environment is None:
            raise RuntimeError("AenvRayProvider is not started")
        env = self.environment
        timeout = 30.0 if timeout_s is None else timeout_s

        async def check() -> None:
            answer = await _tool(env, "openenv_http", {"method": "GET", "path": "/health"})
            if int(answer["status"]) != 200:
                raise TimeoutError(f"the OpenEnv server answers /health with {answer['status']}")

        self._run(asyncio.wait_for(check(), timeout))

    def stop_container(self) -> None:
        """Close the bridge and release the instance (idempotent)."""
        if self._loop is None:
            return
        with contextlib.suppress(AEnvError):
            self._run(self._stop())
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=30)
        loop.close()

    # -- the loop -------------------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_forever, name="aenv-openenv-provider", daemon=True
        )
        thread.start()
        self._loop, self._thread = loop, thread

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self, ref: str, port: int | None, env_vars: dict[str, str]) -> str:
        if self._factory is not None:
            env = self._factory(ref, env_vars)
        else:
            env = Environment(
                ref, engine=self.engine, datasource=self.datasource, environment_variables=env_vars
            )
        try:
            await env.initialize()
            await _tool(env, "openenv_start", {"env": self.server_env})
            # bound and listening before uvicorn serves it: a client that connects at once waits
            # in the backlog, and a port already taken fails here
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port or 0))
            listener.listen(128)
            port = int(listener.getsockname()[1])
            app = bridge_app(env)
            config = uvicorn.Config(
                require_token(app, self.token) if self.token else app,
                host="127.0.0.1",
                port=port,
                log_level="warning",
                lifespan="off",
            )
            server = uvicorn.Server(config)
            self._serving = asyncio.get_running_loop().create_task(server.serve([listener]))
        except BaseException:
            await env.release()
            raise
        self._server, self.environment = server, env
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    async def _stop(self) -> None:
        server, serving, env = self._server, self._serving, self.environment
        self._server = self._serving = self.environment = None
        self.base_url = None
        if server is not None and serving is not None:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving, 10)
        if env is not None:
            with contextlib.suppress(InstanceClosedError):
                await env.release()
