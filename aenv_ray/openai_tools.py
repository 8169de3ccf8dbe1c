"""Tool descriptions for OpenAI-style function calling.

Chat Completions requires function names matching ``^[a-zA-Z0-9_-]{1,64}$``, which
``mini-terminal@1.0.0/execute_command`` does not. :class:`OpenAINames` maps both ways, and no two
(environment, tool) pairs share a name, so an agent given the tools of several environments can
tell them all apart. A name takes one of two forms:

- **readable**, ``NAME_VERSION__TOOL`` (``NAME__TOOL`` for a reference without a version), where
  the environment's name has no ``_``, its version is digits and dots (each ``.`` written ``_``),
  the tool's name starts with a letter and has only ``[A-Za-z0-9_-]``, and the whole fits 64
  characters. Such a name reads back to exactly one pair (:func:`split_openai_name`): the name
  ends at the first ``_``, the version at the next ``__``.
- **hashed**, for every other pair: a hint (the environment's name and the tool's, squeezed into
  the safe characters, the tool's kept whole where there is room) and 16 hex digits of SHA-256
  over the pair, joined by ``_``, never containing ``__``. A readable name always contains ``__``,
  so the two forms never meet.

    >>> names = OpenAINames("mini-terminal@1.0.0")
    >>> names.to_openai("execute_command")
    'mini-terminal_1_0_0__execute_command'
    >>> names.from_openai("mini-terminal_1_0_0__execute_command", {"execute_command"})
    'execute_command'
    >>> split_openai_name("mini-terminal_1_0_0__execute_command")
    ('mini-terminal@1.0.0', 'execute_command')
    >>> OpenAINames("my_env@1.0.0-rc1").to_openai("run")
    'my_env_run_825e629f4e38d271'
    >>> split_openai_name("my_env_run_825e629f4e38d271") is None  # hashed: no pair to read
    True
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from aenv_ray.environment import Environment

__all__ = ["OPENAI_NAME", "OpenAINames", "split_openai_name", "to_agents_tools", "to_openai_tools"]

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_UNDERSCORES = re.compile(r"_+")
# the parts a readable name is made of; the environment's name has no `_`, so the first `_` ends it
_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")
_TOOL = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_READABLE = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)"
    r"(?:_(?P<version>[0-9]+(?:_[0-9]+)*))?"
    r"__(?P<tool>[A-Za-z][A-Za-z0-9_-]*)"
)
_MAX = 64
_DIGEST = 16  # hex digits: 64 bits, so a collision between two pairs is out of practical reach


def _readable(env_name: str, tool: str) -> str | None:
    """The readable name of the pair, or None where it would not read back to the same pair."""
    name, at, version = env_name.partition("@")
    if not _ENV_NAME.fullmatch(name) or not _TOOL.fullmatch(tool):
        return None
    if at and not _VERSION.fullmatch(version):
        return None
    readable = f"{name}_{version.replace('.', '_')}__{tool}" if at else f"{name}__{tool}"
    return readable if len(readable) <= _MAX else None


def _squash(text: str) -> str:
    """``text`` in the safe alphabet with no run of ``_`` and none at either end."""
    return _UNDERSCORES.sub("_", _UNSAFE.sub("_", text)).strip("_")


def _hashed(env_name: str, tool: str) -> str:
    pair = f"{len(env_name)}:{env_name}/{tool}"  # the length makes the split point unambiguous
    digest = hashlib.sha256(pair.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    room = _MAX - _DIGEST - 1  # for the hint, before `_DIGEST`
    tool_hint = _squash(tool)[:room].rstrip("_")
    env_hint = _squash(env_name.partition("@")[0])[: max(room - len(tool_hint) - 1, 0)]
    hint = "_".join(part for part in (env_hint.rstrip("_"), tool_hint) if part)
    return f"{hint}_{digest}" if hint else digest


def split_openai_name(name: str) -> tuple[str, str] | None:
    """The ``(environment reference, tool)`` a readable OpenAI name stands for; None for a
    hashed name or one this module never makes (a hashed name reads back only through
    :meth:`OpenAINames.from_openai`, which knows the tools)."""
    match = _READABLE.fullmatch(name)
    if match is None:
        return None
    env_name, version, tool = match["name"], match["version"], match["tool"]
    env_ref = f"{env_name}@{version.replace('_', '.')}" if version is not None else env_name
    return (env_ref, tool) if _readable(env_ref, tool) == name else None


class OpenAINames:
    """The naming of one environment's tools for OpenAI function calling: valid, stable across
    processes, and unique across every (environment, tool) pair."""

    def __init__(self, env_name: str) -> None:
        self.env_name = env_name

    def to_openai(self, tool: str) -> str:
        """``env@ver/tool`` -> a name matching :data:`OPENAI_NAME`: the readable form where it
        reads back to this pair, else the hashed form."""
        return _readable(self.env_name, tool) or _hashed(self.env_name, tool)

    def from_openai(self, name: str, tools: set[str]) -> str | None:
        """The plain tool name behind an OpenAI name, if one of ``tools`` maps to it."""
        pair = split_openai_name(name)
        if pair is not None:
            env_name, tool = pair
            return tool if env_name == self.env_name and tool in tools else None
        for tool in tools:
            if _readable(self.env_name, tool) is None and _hashed(self.env_name, tool) == name:
                return tool
        return None


def to_openai_tools(env_ref: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool specs (``{"name": "env@ver/tool" or "tool", "description", "inputSchema"}``) as
    Chat Completions ``{"type": "function", "function": {...}}`` dicts.

    A qualified name is named by its own environment part (what the instance serves, which
    ``env_ref`` may lack: ``mini-terminal`` for ``mini-terminal@1.0.0``); a plain one by
    ``env_ref``.
    """
    specs = []
    for tool in tools:
        env, _, plain = str(tool["name"]).rpartition("/")
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": OpenAINames(env or env_ref).to_openai(plain),
                    "description": tool.get("description", ""),
                    "parameters": tool.get("inputSchema", {"type": "object", "properties": {}}),
                },
            }
        )
    return specs


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
