"""The runtime's MCP side, seen from a fresh interpreter (run by tests/test_lazy_mcp.py).

``python tests/_mcp_side.py PROBE PROJECT...`` prints one JSON object:

- ``lazy``: a runtime serving ``PROBE`` on loopback is called on every fast-path route (tools,
  call, a function, the reward, health, info, the functions' listing); ``before`` lists the
  ``fastmcp``/``mcp`` modules imported by then (none, if the MCP side is lazy), ``answers`` the
  fast path's statuses; then one MCP ``tools/list`` (``mcp_status``, ``after``: FastMCP imported);
- ``listings``: for each ``PROJECT``, the fast path's ``GET /aenv/v1/tools`` body and the JSON of
  MCP's ``tools/list`` answer (the ``data:`` of its event), both over the runtime's own ASGI app;
  ``registered``, each registered tool's description (what the fast path lists unless the
  environment set a listing of its own: ``dynamic``).

A fresh process, because the test's own has FastMCP imported already and because loading every
project registers their modules and fork handlers in the process that loads them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import httpx

from sandbox_runtime import RuntimeServer, bind_socket, load_project

_MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
_TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def _mcp_modules() -> list[str]:
    return sorted(m for m in sys.modules if m.split(".")[0] in ("fastmcp", "mcp"))


def _event_data(body: bytes) -> str:
    """The JSON-RPC answer of a streamable-HTTP response (an SSE event, or plain JSON)."""
    text = body.decode()
    for line in text.splitlines():
        if line.startswith("data:"):
            return line[len("data:") :].strip()
    return text


def lazy(probe: Path) -> dict[str, Any]:
    server = RuntimeServer(load_project(probe), sockets=[bind_socket("127.0.0.1", 0)])
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    if not server.ready.wait(60):
        raise RuntimeError("the probe runtime did not start")
    base = f"http://127.0.0.1:{server.addresses[0][1]}"

    def ask(
        path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        sent = headers or ({"content-type": "application/json"} if data is not None else {})
        request = urllib.request.Request(base + path, data=data, headers=sent)
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status), bytes(response.read())

    try:
        answers = {
            "tools": ask("/aenv/v1/tools")[0],
            "call": ask("/aenv/v1/call", {"name": "echo", "arguments": {"text": "hi"}})[0],
            "function": ask("/functions/add", {"a": 1})[0],
            "reward": ask("/task/reward", {"answer": "42"})[0],
            "health": ask("/health")[0],
            "info": ask("/aenv/v1/info")[0],
            "functions": ask("/functions/list")[0],
        }
        before = _mcp_modules()
        built_before = server.app.mcp is not None and server.app.mcp.is_built
        status, body = ask("/mcp", _TOOLS_LIST, _MCP_HEADERS)
        listed = [tool["name"] for tool in json.loads(_event_data(body))["result"]["tools"]]
        return {
            "answers": answers,
            "before": before,
            "built_before": built_before,
            "mcp_status": status,
            "mcp_tools": listed,
            "after": _mcp_modules(),
        }
    finally:
        server.stop()
        thread.join(30)


async def listings(project: Path) -> dict[str, Any]:
    loaded = load_project(project)
    server = RuntimeServer(loaded, sockets=[])
    app = server.app
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            fast = await http.get("/aenv/v1/tools")
            mcp = await http.post("/mcp", json=_TOOLS_LIST, headers=_MCP_HEADERS)
        fast.raise_for_status()
        mcp.raise_for_status()
        registry = loaded.registry
        return {
            "fast": fast.text,
            "mcp": _event_data(mcp.content),
            "registered": [entry.describe() for entry in registry.tools.values()],
            "dynamic": registry.tool_listing is not None,
        }
    finally:
        if app.mcp is not None:
            await app.mcp.shutdown()


def main(argv: list[str]) -> int:
    probe, *projects = (Path(arg) for arg in argv)
    out: dict[str, Any] = {"lazy": lazy(probe), "listings": {}}
    for project in projects:
        out["listings"][project.name] = asyncio.run(listings(project))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
