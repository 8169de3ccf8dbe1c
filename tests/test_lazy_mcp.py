"""The runtime builds its MCP side on the first MCP request (sandbox_runtime._lazy_mcp).

A fresh interpreter (tests/_mcp_side.py, run once for the module) serves the probe on every
fast-path route without importing FastMCP or the MCP SDK, then answers MCP; and for every
built-in environment and every test environment, MCP's ``tools/list`` carries the fast path's
tool schemas and descriptions, as the same JSON. :class:`LazyMCP` itself is checked in this
process: one build for concurrent first users (threads or requests), a failed build retried.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sandbox_runtime import RuntimeServer, load_project
from sandbox_runtime._lazy_mcp import LazyMCP, Receive, Scope, Send

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "envs" / "probe"
# every built-in and every test environment; tests/envs/hostile_import attacks the host from its
# module's import (it is only ever loaded in a sandbox), and its one tool takes no argument
SKIPPED = {"hostile_import"}
PROJECTS = sorted(
    path.parent
    for pattern in ("builtin_envs/*/config.json", "tests/envs/*/config.json")
    for path in ROOT.glob(pattern)
    if path.parent.name not in SKIPPED
)


@pytest.fixture(scope="module")
def side() -> dict[str, Any]:
    """What tests/_mcp_side.py saw, run once in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_mcp_side.py"), str(PROBE), *map(str, PROJECTS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_fast_path_imports_no_mcp(side: dict[str, Any]) -> None:
    lazy = side["lazy"]
    assert set(lazy["answers"].values()) == {200}, lazy["answers"]
    assert lazy["before"] == []  # no fastmcp, no mcp module after every fast-path route
    assert lazy["built_before"] is False


def test_the_first_mcp_request_builds_it(side: dict[str, Any]) -> None:
    lazy = side["lazy"]
    assert lazy["mcp_status"] == 200
    assert lazy["mcp_tools"][:2] == ["echo", "async_echo"]
    assert "fastmcp" in lazy["after"]
    assert "mcp.types" in lazy["after"]


def _canonical(value: Any) -> bytes:
    """JSON with sorted keys: pydantic writes a schema's keys in one order, FastMCP re-emits
    them in another, and the order of an object's members carries no meaning in JSON."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@pytest.mark.parametrize("project", [p.name for p in PROJECTS])
def test_mcp_lists_the_fast_paths_schemas(side: dict[str, Any], project: str) -> None:
    listing = side["listings"][project]
    registered = listing["registered"]
    fast = json.loads(listing["fast"])["tools"]
    mcp = json.loads(listing["mcp"])["result"]["tools"]
    assert registered, f"{project} registers no tool"
    if not listing["dynamic"]:  # an environment's own listing (tau2's) follows its state
        assert fast == registered
    assert [tool["name"] for tool in mcp] == [tool["name"] for tool in registered]
    for ours, theirs in zip(registered, mcp, strict=True):
        name = ours["name"]
        assert _canonical(theirs["inputSchema"]) == _canonical(ours["inputSchema"]), name
        assert theirs.get("description") == (ours["description"] or None), name
        assert "outputSchema" not in theirs, name  # none on either side
        assert set(theirs) <= {"name", "title", "description", "inputSchema", "_meta"}, name


# -- LazyMCP in this process ---------------------------------------------------------------------


class _App:
    """A small ASGI app with a lifespan: answers ``built`` with its number."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.lifespans = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self.lifespans += 1
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return


def test_threads_share_one_build() -> None:
    calls: list[int] = []
    gate = threading.Event()

    def recipe() -> _App:
        calls.append(1)
        gate.wait(30)
        return _App(len(calls))

    lazy = LazyMCP(recipe)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(lazy.build())) for _ in range(8)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(30)
    assert calls == [1]
    assert len(got) == 8
    assert all(app is got[0] for app in got)
    assert lazy.is_built


async def test_concurrent_first_requests_wait_for_one_build() -> None:
    built: list[_App] = []
    main_thread = threading.get_ident()
    where: list[int] = []

    def recipe() -> _App:
        where.append(threading.get_ident())
        built.append(_App(len(built) + 1))
        return built[-1]

    lazy = LazyMCP(recipe)
    apps = await asyncio.gather(*(lazy.app() for _ in range(10)))
    assert len(built) == 1
    assert all(app is built[0] for app in apps)
    assert built[0].lifespans == 1
    assert where != [main_thread]  # built in a worker thread, off the serving loop
    await lazy.shutdown()


async def test_a_failed_build_is_tried_again() -> None:
    attempts: list[int] = []

    def recipe() -> _App:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first build fails")
        return _App(2)

    lazy = LazyMCP(recipe)
    with pytest.raises(RuntimeError, match="first build fails"):
        await lazy.app()
    assert not lazy.is_built
    app = await lazy.app()
    assert isinstance(app, _App)
    assert len(attempts) == 2
    await lazy.shutdown()


def test_a_fork_after_a_build_can_build_again() -> None:
    """The lock os.fork takes is free again in both processes after the fork."""
    LazyMCP(lambda: _App(1)).build()
    pid = os.fork()
    if pid == 0:  # the child: a build must not wait on a lock held across the fork
        code = 1
        try:
            LazyMCP(lambda: _App(2)).build()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert LazyMCP(lambda: _App(3)).build().number == 3


async def test_an_mcp_app_that_does_not_start_is_an_error_answer() -> None:
    server = RuntimeServer(load_project(PROBE), sockets=[])

    def recipe() -> _App:
        raise ValueError("a schema FastMCP refuses")

    server.app.mcp = LazyMCP(recipe)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        answer = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        tools = await http.get("/aenv/v1/tools")
    assert answer.status_code == 500
    body = answer.json()
    assert body["type"] == "ConfigurationError"
    assert "MCP endpoint did not start (ValueError: a schema FastMCP refuses)" in body["error"]
    assert tools.status_code == 200  # the fast path still serves
