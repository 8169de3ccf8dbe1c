"""Tool descriptions for OpenAI-style function calling.

Chat Completions requires function names matching ``^[a-zA-Z0-9_-]{1,64}$``, which
``mini-terminal@1.0.0/execute_command`` does not. :class:`OpenAINames` maps both ways:
``mini-terminal_1_0_0__execute_command``; names past 64 characters keep a hash suffix so they
stay unique.

    >>> names = OpenAINames("mini-terminal@1.0.0")
    >>> names.to_openai("execute_command")
    'mini-terminal_1_0_0__execute_command'
    >>> names.from_openai("mini-terminal_1_0_0__execute_command", {"execute_command"})
    'execute_command'
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from aenv_ray.environment import Environment

__all__ = ["OPENAI_NAME", "OpenAINames", "to_agents_tools", "to_openai_tools"]

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


class OpenAINames:
    """The reversible naming of one environment's tools for OpenAI function calling."""

    def __init__(self, env_name: str) -> None:
        self.env_name = env_name
        self._prefix = _UNSAFE.sub("_", env_name)

    def to_openai(self, tool: str) -> str:
        """``env@ver/tool`` -> a name matching :data:`OPENAI_NAME`."""
        name = f"{self._prefix}__{_UNSAFE.sub('_', tool)}"
        if len(name) > 64:
            digest = hashlib.sha256(f"{self.env_name}/{tool}".encode()).hexdigest()[:8]
            name = f"{name[:55]}_{digest}"
        return name

    def from_openai(self, name: str, tools: set[str]) -> str | None:
        """The plain tool name behind an OpenAI name, if one of ``tools`` maps to it."""
        for tool in tools:
            if self.to_openai(tool) == name:
                return tool
        return None


def to_openai_tools(env_ref: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool specs (``{"name": "env@ver/tool" or "tool", "description", "inputSchema"}``) as
    Chat Completions ``{"type": "function", "function": {...}}`` dicts of ``env_ref``."""
    names = OpenAINames(env_ref)
    prefix = f"{env_ref}/"
    return [
        {
            "type": "function",
            "function": {
                "name": names.to_openai(tool["name"].removeprefix(prefix)),
                "description": tool.get("description", ""),
                "parameters": tool.get("inputSchema", {"type": "object", "properties": {}}),
            },
        }
        for tool in tools
    ]


def to_agents_tools(env: Environment, openai_tools: list[dict[str, Any]]) -> list[Any]:
    """Wrap Chat Completions tool dicts as OpenAI Agents SDK ``FunctionTool``s bound to ``env``."""
    try:
        from agents import FunctionTool
    except ImportError as exc:  # pragma: no cover - depends on the optional package
        raise ImportError(
            "list_agents_tools() needs the OpenAI Agents SDK: pip install openai-agents"
        ) from exc

    def make(spec: dict[str, Any]) -> Any:
        name = spec["function"]["name"]

        async def invoke(ctx: Any, input: str) -> str:
            try:
                arguments = orjson.loads(input) if input else {}
            except orjson.JSONDecodeError as exc:
                return f"invalid JSON arguments for `{name}`: {exc}"
            result = await env.call_tool(name, arguments)
            return result.text if result.content else ""

        return FunctionTool(
            name=name,
            description=spec["function"]["description"],
            params_json_schema=spec["function"]["parameters"],
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    return [make(spec) for spec in openai_tools]
