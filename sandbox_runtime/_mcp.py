"""Tools over standard MCP (streamable HTTP) with FastMCP, through our dispatcher.

Each registered tool becomes a FastMCP ``Tool`` that carries our input schema and whose ``run``
calls :meth:`Dispatcher.call_tool`, so an MCP client gets exactly the validation, timeouts and
error messages of the fast path, and its result passes the same checks
(:meth:`Dispatcher.encode_tool_result`: no NaN, no lone surrogate, not over the size limit).
MCP's JSON parser lets NaN and infinity through, so the arguments are checked for them too. A
middleware answers calls to unknown tools with our "did you mean" message instead of FastMCP's
generic one.

Imported by the first MCP request only (:mod:`sandbox_runtime._lazy_mcp`): a runtime only called
on the fast path never imports FastMCP or the MCP SDK.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.middleware import Middleware, MiddlewareContext
from fastmcp.tools import Tool
from fastmcp.tools import ToolResult as MCPToolResult
from mcp.types import ContentBlock
from pydantic import PrivateAttr, TypeAdapter

from aenv_ray.protocol import ToolResult
from aenv_ray.registry import Registered
from sandbox_runtime._dispatch import Dispatcher
from sandbox_runtime._runner import WorkerStuckError

__all__ = ["build_mcp_app"]

_CONTENT = TypeAdapter(ContentBlock)

_SERVING_MODULES = (
    "anyio._backends._asyncio",
    "anyio.streams.stapled",
    "anyio.streams.tls",
    "fastmcp.server.context",
    "fastmcp.server.elicitation",
    "fastmcp.server.providers.prefab_payload",
    "fastmcp.server.providers.prefab_synthesis",
    "fastmcp.server.transforms.catalog",
    "key_value.aio.adapters.pydantic",
    "key_value.aio.stores.memory",
)
"""What FastMCP imports lazily while it serves its first requests (found by comparing
``sys.modules`` before and after a first session): imported with the app, under the build's
lock, so that a fork of the running instance never catches one half-imported."""


def _to_mcp(result: ToolResult) -> MCPToolResult:
    structured = result.structured
    if structured is not None and not isinstance(structured, dict):
        structured = {"result": structured}
    blocks = [_CONTENT.validate_python(item) for item in result.content]
    return MCPToolResult(content=blocks, structured_content=structured, is_error=result.is_error)


class _DispatchedTool(Tool):
    """A FastMCP tool whose execution is our dispatcher's."""

    _dispatcher: Dispatcher = PrivateAttr()

    async def run(self, arguments: dict[str, Any]) -> MCPToolResult:
        dispatcher = self._dispatcher
        try:
            result = await dispatcher.call_tool(self.name, arguments, check_json=True)
        except WorkerStuckError as exc:
            return MCPToolResult(content=str(exc), is_error=True)
        checked, _ = dispatcher.encode_tool_result(self.name, result)
        return _to_mcp(checked)


class _UnknownTools(Middleware):
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        name = context.message.name
        if name not in self.dispatcher.registry.tools:
            return _to_mcp(await self.dispatcher.call_tool(name, context.message.arguments))
        return await call_next(context)


def _tool(entry: Registered, dispatcher: Dispatcher) -> _DispatchedTool:
    tool = _DispatchedTool(
        name=entry.name,
        description=entry.description or None,
        parameters=entry.signature.input_schema,
    )
    tool._dispatcher = dispatcher
    return tool


def build_mcp_app(dispatcher: Dispatcher, *, name: str, version: str) -> Any:
    """The ASGI app serving ``/mcp`` for the dispatcher's tools (run its lifespan).

    ``name`` and ``version`` are the environment's: what a client's ``initialize`` reads as
    ``serverInfo`` (not FastMCP's own version).
    """
    # One schema for every client: the fast path and MCP list the same JSON schema, so FastMCP
    # must not inline `$defs` on its side only.
    for module in _SERVING_MODULES:
        with contextlib.suppress(ImportError):  # another FastMCP version: imported when used
            importlib.import_module(module)
    server = FastMCP(name=name, version=version, dereference_schemas=False)
    server.add_middleware(_UnknownTools(dispatcher))
    for entry in dispatcher.registry.tools.values():
        server.add_tool(_tool(entry, dispatcher))
    return server.http_app(path="/mcp", stateless_http=True)
