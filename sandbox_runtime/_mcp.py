"""Tools over standard MCP (streamable HTTP) with FastMCP, through our dispatcher.

Each registered tool becomes a FastMCP ``Tool`` that carries our input schema and whose ``run``
calls :meth:`Dispatcher.call_tool`, so an MCP client gets exactly the validation, timeouts and
error messages of the fast path.
"""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from fastmcp.tools import Tool
from fastmcp.tools import ToolResult as MCPToolResult
from pydantic import PrivateAttr

from aenv_ray.registry import Registered
from sandbox_runtime._dispatch import Dispatcher

__all__ = ["build_mcp_app"]


class _DispatchedTool(Tool):
    """A FastMCP tool whose execution is our dispatcher's."""

    _dispatcher: Dispatcher = PrivateAttr()

    async def run(self, arguments: dict[str, Any]) -> MCPToolResult:
        result = await self._dispatcher.call_tool(self.name, arguments)
        structured = result.structured
        if structured is not None and not isinstance(structured, dict):
            structured = {"result": structured}
        return MCPToolResult(
            content=result.content or [],
            structured_content=structured,
            is_error=result.is_error,
        )


def _tool(entry: Registered, dispatcher: Dispatcher) -> _DispatchedTool:
    tool = _DispatchedTool(
        name=entry.name,
        description=entry.description or None,
        parameters=entry.signature.input_schema,
    )
    tool._dispatcher = dispatcher
    return tool


def build_mcp_app(dispatcher: Dispatcher, *, name: str) -> Any:
    """The ASGI app serving ``/mcp`` for the dispatcher's tools (run its lifespan)."""
    server = FastMCP(name=name)
    for entry in dispatcher.registry.tools.values():
        server.add_tool(_tool(entry, dispatcher))
    return server.http_app(path="/mcp", stateless_http=True)
