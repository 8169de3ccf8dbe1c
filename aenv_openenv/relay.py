"""Inside an instance: an OpenEnv environment server, and the tools that carry its traffic.

An OpenEnv environment project (``server/app.py`` making ``app = create_app(...)``, its models,
its ``pyproject.toml``) becomes an aenv-ray environment with a ``config.json`` and one module in
``src/`` (the loader imports only ``src/`` when it exists, so the OpenEnv code is never imported
by the runtime)::

    # src/openenv_server.py
    from aenv_openenv.relay import serve_openenv

    serve_openenv("server.app:app")

:func:`serve_openenv` registers the tools below. ``openenv_start`` starts the OpenEnv server
(``PYTHON -m uvicorn APP``, a process kept for the episode) on the instance's own loopback and
waits until its ``/health`` answers; the others carry HTTP requests and WebSocket frames to it.
Nothing listens outside the instance: every byte goes through the runtime's tool calls, on the
local engine and on Kubernetes alike (:class:`aenv_openenv.provider.AenvRayProvider` is the
other end).

The server runs in the project's directory (``project``; by default the one whose ``src/`` the
runtime loaded). ``PYTHON`` must have the OpenEnv server's packages (openenv-core and its pins)
and be visible inside the instance: the argument ``python``, else ``$AENV_OPENENV_PYTHON`` (set
it in ``config.json``'s ``deployConfig.env``), else the runtime's own interpreter. On the
local engine an instance sees the host's Python installation and virtual environment, the
project and ``/data`` (its ``datasource``): a virtual environment made from the same Python and
given as the datasource runs as ``/data/bin/python``. On Kubernetes it is the image's.

May import: ``aenv_ray``, httpx (the HTTP relay), websockets (the WebSocket relay).
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from aenv_ray import keep_processes, register_tool

__all__ = ["serve_openenv"]

_START_TIMEOUT = 120.0
_CALL_TIMEOUT = 600.0  # a request or a step of the OpenEnv server: as long as the runtime's default


class _Inner:
    """The OpenEnv server of this instance and the WebSocket connections to it."""

    def __init__(self, app: str, project: Path | None, python: str | None) -> None:
        self.app = app
        self._project = project
        self.python = python
        self.url: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.sockets: dict[str, ClientConnection] = {}
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / "openenv-server.log"

    @property
    def project(self) -> Path:
        """The OpenEnv project's directory: the one given, else the project whose ``src/`` the
        runtime put on ``sys.path`` (the directory holding it and ``config.json``)."""
        if self._project is not None:
            return self._project
        for entry in sys.path:
            code = Path(entry or ".")
            if code.name == "src" and (code.parent / "config.json").is_file():
                return code.parent
        raise RuntimeError(
            "serve_openenv: no project directory (no src/ beside a config.json on sys.path): "
            "pass project=PATH"
        )

    def interpreter(self) -> str:
        return self.python or os.environ.get("AENV_OPENENV_PYTHON") or sys.executable

    def base(self) -> str:
        if self.url is None:
            raise RuntimeError("the OpenEnv server is not started: call openenv_start first")
        return self.url

    def _spawn(self, env: dict[str, str]) -> tuple[int, list[str]]:
        """Start the server's process on a free port of the instance's loopback (kept for the
        episode); its output goes to a log whose tail says why, should it exit."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        command = [self.interpreter(), "-m", "uvicorn", self.app, "--host", "127.0.0.1"]
        command += ["--port", str(port), "--app-dir", str(self.project), "--log-level", "warning"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=self.project,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        keep_processes(self.proc.pid)
        return port, command

    async def start(self, env: dict[str, str]) -> dict[str, Any]:
        if self.url is not None and self.proc is not None and self.proc.poll() is None:
            return {"url": self.url, "pid": self.proc.pid}
        port, command = await asyncio.to_thread(self._spawn, env)
        url = f"http://127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _START_TIMEOUT
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    tail = self.log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"the OpenEnv server ({' '.join(command[:4])}) exited with code "
                        f"{self.proc.returncode} before it served: {tail}"
                    )
                try:
                    if (await client.get(url + "/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if loop.time() > deadline:
                    raise TimeoutError(f"the OpenEnv server did not serve in {_START_TIMEOUT} s")
                await asyncio.sleep(0.1)  # its interpreter is starting: nothing to wait on
        self.url = url
        return {"url": url, "pid": self.proc.pid}


def serve_openenv(
    app: str = "server.app:app", *, project: Path | str | None = None, python: str | None = None
) -> None:
    """Register the relay tools of the OpenEnv server ``app`` (uvicorn's ``module:attribute``,
    imported from ``project``, the OpenEnv project's directory; see the module) in the project
    being loaded."""
    inner = _Inner(app, Path(project) if project is not None else None, python)

    @register_tool(timeout=_START_TIMEOUT + 10)
    async def openenv_start(env: dict[str, str] | None = None) -> dict[str, Any]:
        """Start this instance's OpenEnv server (once) and wait until it serves.

        Args:
            env: environment variables of the server's process.
        """
        return await inner.start(dict(env or {}))

    @register_tool(timeout=_CALL_TIMEOUT)
    async def openenv_http(
        method: str, path: str, body: str = "", content_type: str = "application/json"
    ) -> dict[str, Any]:
        """One HTTP request to this instance's OpenEnv server.

        Args:
            method: GET or POST.
            path: the path and query, from the leading slash.
            body: the request's body (text).
            content_type: the body's media type.
        """
        if not path.startswith("/"):
            raise ValueError("path starts with /")
        async with httpx.AsyncClient(timeout=_CALL_TIMEOUT - 10) as client:
            response = await client.request(
                method,
                inner.base() + path,
                content=body.encode() if body else None,
                headers={"content-type": content_type} if body else None,
            )
        return {
            "status": response.status_code,
            "content_type": response.headers.get("content-type", "application/json"),
            "body": base64.b64encode(response.content).decode(),
        }

    @register_tool
    async def openenv_ws_open(path: str) -> dict[str, Any]:
        """Open a WebSocket to this instance's OpenEnv server (``/ws``, ``/mcp``).

        Args:
            path: the path and query, from the leading slash.
        """
        if not path.startswith("/"):
            raise ValueError("path starts with /")
        ws_url = "ws://" + inner.base().removeprefix("http://") + path
        socket_id = uuid.uuid4().hex
        inner.sockets[socket_id] = await connect(ws_url, max_size=None, open_timeout=30)
        return {"socket": socket_id}

    @register_tool(timeout=_CALL_TIMEOUT)
    async def openenv_ws_send(
        socket_id: str, text: str = "", wait: float = _CALL_TIMEOUT - 10
    ) -> dict[str, Any]:
        """Send one frame (none when ``text`` is empty) and return the next frame the server
        sends, or that it closed.

        Args:
            socket_id: from openenv_ws_open.
            text: the frame to send.
            wait: how long to wait for the answer, in seconds.
        """
        ws = inner.sockets.get(socket_id)
        if ws is None:
            return {"frames": [], "closed": True}
        try:
            if text:
                await ws.send(text)
        except ConnectionClosed:
            pass  # a refusal (capacity) may be queued before the close: read it below
        try:
            frame = await asyncio.wait_for(ws.recv(), timeout=wait)
        except ConnectionClosed:
            inner.sockets.pop(socket_id, None)
            return {"frames": [], "closed": True}
        except TimeoutError:
            return {"frames": [], "closed": False}
        text_frame = frame if isinstance(frame, str) else frame.decode()
        return {"frames": [text_frame], "closed": False}

    @register_tool
    async def openenv_ws_close(socket_id: str) -> bool:
        """Close a WebSocket to this instance's OpenEnv server.

        Args:
            socket_id: from openenv_ws_open.
        """
        ws = inner.sockets.pop(socket_id, None)
        if ws is not None:
            await ws.close()
        return ws is not None
