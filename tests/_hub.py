"""A real EnvHub (``aenv serve``) in a child process on loopback, for the hub's tests, and the
plain HTTP helpers those tests share."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from aenv_ray.protocol import FAST_CALL_PATH
from aenv_ray.testing import free_port
from tests._cli import aenv as run_cli

__all__ = [
    "HUB_SECRET",
    "HubProcess",
    "aenv",
    "call_tool",
    "eventually",
    "free_port",
    "new_key",
    "raw",
    "refused",
    "run",
]


HUB_SECRET = "the tests' hub secret, shared by their hubs"
"""The hub secret every :class:`HubProcess` gets unless its ``env`` names another."""


def aenv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process (tests/_cli.py), without a hub or key unless ``env`` names
    them."""
    return run_cli(*args, env=env, unset=("AENV_SYSTEM_URL", "AENV_API_KEY"))


def new_key(tenant: str, store: str) -> str:
    """A new API key of ``tenant`` in the hub store ``store``, made as an operator does
    (``aenv keys create``)."""
    done = aenv(
        "keys", "create", "--tenant", tenant, "--name", f"{tenant}'s tests", "--store", store
    )
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert re.fullmatch(r"aenv_[0-9a-f]{12}_\S{20,}", key), done.stdout
    assert tenant in done.stderr  # "key ... for tenant alice: shown once"
    return key


class HubProcess:
    """``aenv serve`` on a fixed free port (kept across :meth:`restart`), its own data dir;
    ``nofile`` caps its open files.

    ``engine="daemon"`` runs instances in a local engine daemon under ``data_dir/engine`` that
    outlives the hub (what a restart test needs); :meth:`close` stops that daemon too.
    ``aenv`` is the command that runs aenv (default: this checkout's, ``python -m aenv_cli``;
    another installation's ``bin/aenv``), run in ``cwd`` (default: this process's).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        store: str | None = None,
        auth: bool = True,
        engine: str = "local",
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        nofile: int | None = None,
        aenv: list[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.nofile = nofile  # the hub's RLIMIT_NOFILE, soft and hard (None: inherited)
        self.store = store or f"sqlite:///{data_dir}/hub.db"
        self.auth = auth
        self.engine = engine
        self.extra = list(extra or [])
        # hubs sharing a store share the secret that seals its instance tokens (envhub.seal)
        self.env = {"AENV_HUB_SECRET": HUB_SECRET, **os.environ, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir / "hub.log"
        self.aenv = aenv or [sys.executable, "-m", "aenv_cli"]
        self.cwd = cwd

    def command(self) -> list[str]:
        return [
            *self.aenv,
            "serve",
            "--port",
            str(self.port),
            "--store",
            self.store,
            "--data-dir",
            str(self.data_dir),
            "--engine",
            self.engine,
            "--auth" if self.auth else "--no-auth",
            *self.extra,
        ]

    def start(self, timeout: float = 120.0) -> HubProcess:
        """Start the hub and return once it serves; a hub that does not (it exited, or did not
        say it serves within ``timeout`` s: a generous deadline on a loaded machine) is killed
        before the error is raised, so that no test leaves one running behind it."""
        try:
            return self._start(timeout)
        except BaseException:
            self.kill()
            raise

    def _start(self, timeout: float) -> HubProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:  # a fresh log: "EnvHub on" means this start
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                preexec_fn=self._limit if self.nofile is not None else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the hub exited with {self.proc.returncode}: {self.tail()}")
            if f"EnvHub on {self.url}" in self.log.read_text(errors="replace"):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"the hub did not start within {timeout} s: {self.tail()}")

    def _limit(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: a crash, no cleanup."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM and wait: a clean stop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> HubProcess:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self.engine == "daemon":  # the daemon outlives the hub: stop it and its instances
            from local_backend.client import DaemonEngine

            engine = DaemonEngine(self.data_dir / "engine")
            # close() may run inside a test's event loop: shut down on a loop of its own
            worker = threading.Thread(target=asyncio.run, args=(engine.shutdown(),))
            worker.start()
            worker.join()

    def __enter__(self) -> HubProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def raw(
    method: str, url: str, *, key: str | None = None, body: Any = None
) -> tuple[int, dict[str, str], Any]:
    """One plain HTTP request: status, headers and the JSON (or text) answer."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers, json=body) as reply,
    ):
        text = await reply.text()
        try:
            data: Any = json.loads(text)
        except ValueError:
            data = text
        return reply.status, dict(reply.headers), data


async def call_tool(
    target: str | dict[str, Any], name: str, arguments: dict[str, Any], *, key: str | None = None
) -> dict[str, Any]:
    """Call tool ``name`` at an instance (its record: the runtime, with its token) or at a
    proxy's ``url`` (with the hub ``key``); the result, which must not be an error."""
    if isinstance(target, dict):
        url, key = target["url"], target["token"]
    else:
        url = target
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"name": name, "arguments": arguments}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(url + FAST_CALL_PATH, json=body) as reply,
    ):
        text = await reply.text()
        assert reply.status == 200, text
    result: dict[str, Any] = json.loads(text)
    assert not result["is_error"], result
    return result


async def run(target: str | dict[str, Any], command: str, *, key: str | None = None) -> str:
    """Run ``command`` with mini-terminal's tool (see :func:`call_tool`); its output."""
    result = await call_tool(target, "execute_command", {"command": command}, key=key)
    assert result["structured"]["returncode"] == 0, result
    return str(result["structured"]["output"]).strip()


async def eventually(
    check: Callable[[], Awaitable[Any]], what: str, *, deadline: float = 60.0
) -> Any:
    """Poll ``check`` until it returns something truthy (a generous deadline, not a timing)."""
    end = time.monotonic() + deadline
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < end, f"never happened within {deadline:g} s: {what}"
        await asyncio.sleep(0.1)


async def refused(url: str) -> bool:
    """True once nothing serves ``url`` any more."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url + "/health"),
        ):
            return False
    except (aiohttp.ClientError, TimeoutError):
        return True
