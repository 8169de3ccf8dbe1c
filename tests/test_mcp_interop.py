"""Standard MCP clients against real runtimes: the official Python SDK, FastMCP's client and the
official TypeScript SDK list and call the tools over streamable HTTP, and every MCP answer equals
the fast path's for the same call (one validation, one tool code path)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fastmcp
import httpx
import pytest
from fastmcp.exceptions import ToolError
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from aenv_ray import Environment
from aenv_ray.testing import RuntimeProcess

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE_CLIENT = NODE_DIR / "mcp_client.mjs"

TYPED_OK = {
    "count": 3,
    "ratio": 0.25,
    "flag": True,
    "tags": ["a", "b"],
    "meta": {"k": [1, 2]},
    "mode": "slow",
    "color": "blue",
    "note": "n",
    "point": {"x": 1},
}
TYPED_OUT = {**TYPED_OK, "point": {"x": 1, "y": 0}}


@asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[ClientSession]:
    """An initialized session of the official `mcp` Python client."""
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def texts(result: CallToolResult) -> list[str]:
    """The text of every content block (failing on any other kind of block)."""
    out = []
    for block in result.content:
        assert block.type == "text", block
        out.append(block.text)
    return out


async def fast_path_tools(runtime: RuntimeProcess) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{runtime.url}/aenv/v1/tools")
    response.raise_for_status()
    tools: list[dict[str, Any]] = response.json()["tools"]
    return tools


# -- the official Python SDK ------------------------------------------------------------------


async def test_lists_tools_with_the_fast_paths_schemas(probe_runtime: RuntimeProcess) -> None:
    fast = await fast_path_tools(probe_runtime)
    async with mcp_session(probe_runtime.mcp_url) as session:
        listed = (await session.list_tools()).tools
    assert [t.name for t in listed] == [t["name"] for t in fast]
    assert {t.name: t.input_schema for t in listed} == {t["name"]: t["inputSchema"] for t in fast}
    assert {t.name: t.description or "" for t in listed} == {
        t["name"]: t.get("description", "") for t in fast
    }
    echo = next(t for t in listed if t.name == "echo")
    assert echo.input_schema["properties"]["text"] == {
        "type": "string",
        "description": "what to say.",
    }
    assert echo.input_schema["required"] == ["text"]


def probe_version() -> str:
    """The version in probe_runtime's config.json: what MCP's ``serverInfo`` reports."""
    config = Path(__file__).resolve().parent / "envs" / "probe" / "config.json"
    return str(json.loads(config.read_text())["version"])


@pytest.mark.parametrize("port", ["fast path port", "MCP port"])
async def test_every_port_serves_mcp(probe_runtime: RuntimeProcess, port: str) -> None:
    url = probe_runtime.mcp_url if port == "MCP port" else f"{probe_runtime.url}/mcp"
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        names = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("echo", {"text": port})
    # the environment's name and version (its config.json), not FastMCP's
    assert (init.server_info.name, init.server_info.version) == ("probe", probe_version())
    assert init.capabilities.tools is not None
    assert "echo" in names
    assert texts(result) == [port]


async def test_calls_tools(probe_runtime: RuntimeProcess) -> None:
    async with mcp_session(probe_runtime.mcp_url) as session:
        echo = await session.call_tool("echo", {"text": "héllo ✓ 😀"})
        assert not echo.is_error
        assert texts(echo) == ["héllo ✓ 😀"]
        assert echo.structured_content is None

        async_echo = await session.call_tool("async_echo", {"text": "ab", "times": 3})
        assert not async_echo.is_error
        assert texts(async_echo) == ["ababab"]

        typed = await session.call_tool("typed", TYPED_OK)
        assert not typed.is_error, texts(typed)
        assert typed.structured_content == TYPED_OUT
        assert json.loads(texts(typed)[0]) == TYPED_OUT

        model = await session.call_tool("returns_model", {"x": 4})
        assert not model.is_error
        assert model.structured_content == {"x": 4, "y": 8}
        assert json.loads(texts(model)[0]) == {"x": 4, "y": 8}

        listed = await session.call_tool("returns_list", {"n": 3})
        assert not listed.is_error
        assert json.loads(texts(listed)[0]) == [0, 1, 2]
        assert listed.structured_content == {"result": [0, 1, 2]}  # MCP wants an object

        nothing = await session.call_tool("returns_none")  # no arguments at all
        assert not nothing.is_error
        assert nothing.content == []
        assert nothing.structured_content is None


async def test_bad_arguments_name_the_argument_and_type(probe_runtime: RuntimeProcess) -> None:
    async with mcp_session(probe_runtime.mcp_url) as session:
        wrong_type = await session.call_tool("typed", {**TYPED_OK, "count": "many"})
        missing = await session.call_tool("echo", {})
        extra = await session.call_tool("echo", {"text": "x", "loud": True})
        literal = await session.call_tool("typed", {**TYPED_OK, "mode": "medium"})
    assert wrong_type.is_error
    (message,) = texts(wrong_type)
    assert "`count`" in message
    assert "integer" in message
    assert "many" in message
    assert missing.is_error
    assert "missing required argument `text`" in texts(missing)[0]
    assert extra.is_error
    assert "unexpected argument `loud`" in texts(extra)[0]
    assert literal.is_error
    assert "`mode`" in texts(literal)[0]


async def test_unknown_tool_suggests_the_closest(probe_runtime: RuntimeProcess) -> None:
    async with mcp_session(probe_runtime.mcp_url) as session:
        result = await session.call_tool("ecoh", {"text": "hi"})
    assert result.is_error
    (message,) = texts(result)
    assert "`ecoh`" in message
    assert "did you mean `echo`?" in message


async def test_raising_tool_reports_type_and_message(probe_runtime: RuntimeProcess) -> None:
    async with mcp_session(probe_runtime.mcp_url) as session:
        failed = await session.call_tool("fail", {"message": "boom at line 3"})
        exited = await session.call_tool("sys_exit", {})
        after = await session.call_tool("echo", {"text": "still here"})
    assert failed.is_error
    assert "ValueError: boom at line 3" in texts(failed)[0]
    assert exited.is_error
    assert "SystemExit" in texts(exited)[0]
    assert texts(after) == ["still here"]


async def test_timeout_is_an_error_and_the_next_call_works(fresh_probe: RuntimeProcess) -> None:
    async with mcp_session(fresh_probe.mcp_url) as session:
        looped = await session.call_tool("busy_loop", {})
        after = await session.call_tool("echo", {"text": "next"})
    assert looped.is_error
    assert "timed out after 0.5 s" in texts(looped)[0]
    assert not after.is_error
    assert texts(after) == ["next"]


async def test_the_same_process_serves_mcp_and_the_fast_path(
    probe_runtime: RuntimeProcess,
) -> None:
    async with mcp_session(probe_runtime.mcp_url) as session:
        over_mcp = await session.call_tool("pid", {})
    async with Environment.attach(probe_runtime.url) as env:
        over_fast_path = await env.call_tool("pid", {})
    assert over_mcp.structured_content == {"result": probe_runtime.pid}
    assert over_fast_path.structured == probe_runtime.pid


async def test_mini_terminal_over_mcp(terminal_runtime: RuntimeProcess) -> None:
    async with mcp_session(terminal_runtime.mcp_url) as session:
        names = [t.name for t in (await session.list_tools()).tools]
        ok = await session.call_tool("execute_command", {"command": "echo hello-over-mcp"})
        failing = await session.call_tool("execute_command", {"command": "false"})
        bad = await session.call_tool("execute_command", {"command": "true", "timeout": "soon"})
    assert "execute_command" in names
    assert not ok.is_error, texts(ok)
    assert ok.structured_content is not None
    assert ok.structured_content["returncode"] == 0
    assert "hello-over-mcp" in ok.structured_content["output"]
    assert json.loads(texts(ok)[0]) == ok.structured_content
    assert not failing.is_error
    assert failing.structured_content is not None
    assert failing.structured_content["returncode"] == 1
    assert bad.is_error
    assert "`timeout`" in texts(bad)[0]


# -- MCP and the fast path give the same answers ----------------------------------------------

DIFFERENTIAL_CASES: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"text": "hi"}),
    ("echo", {"text": ""}),
    ("echo", {"text": "héllo ✓ 😀\nline two"}),
    ("async_echo", {"text": "ab", "times": 3}),
    ("async_echo", {"text": "ab"}),
    ("typed", TYPED_OK),
    ("typed", {"count": 1, "ratio": 1, "flag": False, "tags": [], "meta": {}}),
    ("typed", {**TYPED_OK, "count": "many"}),
    ("typed", {**TYPED_OK, "count": 1.5}),
    ("typed", {**TYPED_OK, "mode": "medium"}),
    ("typed", {**TYPED_OK, "color": "green"}),
    ("typed", {**TYPED_OK, "tags": "a"}),
    ("typed", {**TYPED_OK, "point": {"y": 2}}),
    ("typed", {"count": 1}),
    ("returns_model", {"x": 5}),
    ("returns_model", {"x": "five"}),
    ("returns_none", {}),
    ("returns_list", {"n": 4}),
    ("returns_unserializable", {}),
    ("fail", {"message": "boom"}),
    ("fail", {}),
    ("sys_exit", {}),
    ("echo", {}),
    ("echo", {"text": "x", "loud": True}),
    ("ecoh", {"text": "x"}),
    ("no_such_tool_at_all", {}),
]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    DIFFERENTIAL_CASES,
    ids=[f"{i}-{name}" for i, (name, _) in enumerate(DIFFERENTIAL_CASES)],
)
async def test_mcp_answers_like_the_fast_path(
    probe_runtime: RuntimeProcess, tool: str, arguments: dict[str, Any]
) -> None:
    async with mcp_session(probe_runtime.mcp_url) as session:
        over_mcp = await session.call_tool(tool, arguments)
    async with Environment.attach(probe_runtime.url) as env:
        over_fast_path = await env.call_tool(tool, arguments)
    assert over_mcp.is_error == over_fast_path.is_error
    assert [b.model_dump(mode="json", exclude_none=True) for b in over_mcp.content] == (
        over_fast_path.content
    )
    structured = over_fast_path.structured
    if structured is not None and not isinstance(structured, dict):
        structured = {"result": structured}
    assert over_mcp.structured_content == structured


# -- FastMCP's client ---------------------------------------------------------------------------


async def test_fastmcp_client_lists_and_calls(probe_runtime: RuntimeProcess) -> None:
    fast = await fast_path_tools(probe_runtime)
    async with fastmcp.Client(probe_runtime.mcp_url) as client:
        tools = await client.list_tools()
        echo = await client.call_tool("echo", {"text": "hi"})
        model = await client.call_tool("returns_model", {"x": 2})
        failed = await client.call_tool_mcp("fail", {"message": "boom"})
        unknown = await client.call_tool_mcp("ecoh", {"text": "hi"})
        with pytest.raises(ToolError, match="ValueError: boom"):
            await client.call_tool("fail", {"message": "boom"})
        after = await client.call_tool("echo", {"text": "after"})
    assert {t.name: t.input_schema for t in tools} == {t["name"]: t["inputSchema"] for t in fast}
    assert not echo.is_error
    assert echo.content[0].text == "hi"
    assert model.structured_content == {"x": 2, "y": 4}
    assert failed.is_error
    assert "ValueError: boom" in failed.content[0].text
    assert unknown.is_error
    assert "did you mean `echo`?" in unknown.content[0].text
    assert after.content[0].text == "after"


# -- the official TypeScript SDK, from npm ------------------------------------------------------


def _node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("`node` is not on PATH; install Node.js >= 20 to run the TypeScript SDK test")
    if not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.skip(
            f"the MCP TypeScript SDK is not installed in {NODE_DIR / 'node_modules'}; "
            "run `npm ci --prefix tests/node`"
        )
    return node


def run_node_client(url: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    node = _node_or_skip()
    completed = subprocess.run(
        [node, str(NODE_CLIENT), url, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert completed.returncode == 0, (completed.stdout, completed.stderr)
    out: dict[str, Any] = json.loads(completed.stdout)
    return out


@pytest.mark.node
def test_typescript_sdk_lists_and_calls(probe_runtime: RuntimeProcess) -> None:
    calls = [
        {"name": "echo", "arguments": {"text": "hi from node ✓"}},
        {"name": "typed", "arguments": TYPED_OK},
        {"name": "returns_model", "arguments": {"x": 7}},
        {"name": "typed", "arguments": {**TYPED_OK, "count": "many"}},
        {"name": "fail", "arguments": {"message": "boom"}},
        {"name": "ecoh", "arguments": {"text": "hi"}},
        {"name": "echo", "arguments": {"text": "after"}},
    ]
    out = run_node_client(probe_runtime.mcp_url, calls)

    assert (out["server"]["name"], out["server"]["version"]) == ("probe", probe_version())
    with httpx.Client() as http:
        fast = http.get(f"{probe_runtime.url}/aenv/v1/tools").json()["tools"]
    assert {t["name"]: t["inputSchema"] for t in out["tools"]} == {
        t["name"]: t["inputSchema"] for t in fast
    }

    echo, typed, model, bad, failed, unknown, after = out["results"]
    assert echo.get("isError", False) is False
    assert echo["content"] == [{"type": "text", "text": "hi from node ✓"}]
    assert typed.get("isError", False) is False
    assert typed["structuredContent"] == TYPED_OUT
    assert model["structuredContent"] == {"x": 7, "y": 14}
    assert json.loads(model["content"][0]["text"]) == {"x": 7, "y": 14}
    assert bad["isError"] is True
    assert "`count`" in bad["content"][0]["text"]
    assert "integer" in bad["content"][0]["text"]
    assert failed["isError"] is True
    assert "ValueError: boom" in failed["content"][0]["text"]
    assert unknown["isError"] is True
    assert "did you mean `echo`?" in unknown["content"][0]["text"]
    assert after["content"] == [{"type": "text", "text": "after"}]
