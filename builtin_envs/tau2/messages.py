"""Trajectory messages: the chat shape of ``grade`` and the CLI, read into tau2's message kinds.

The accepted form (one dict per message)::

    {"role": "assistant", "content": str}                          an agent's text
    {"role": "assistant"|"user", "tool_calls": [{"id", "name", "arguments": {...}}], "content"?}
    {"role": "tool", "id", "requestor": "assistant"|"user", "content": str, "error": bool}
    {"role": "user", "content": str}                                the user's text
    {"role": "system", "content": str}                              ignored by the evaluator

``arguments`` may also be a JSON string (OpenAI's wire form); it must decode to an object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from builtin_envs.tau2.errors import TrajectoryError

__all__ = [
    "Message",
    "ParticipantMessage",
    "Requestor",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "parse_messages",
]

Requestor = Literal["user", "assistant"]


@dataclass(frozen=True)
class ToolCall:
    """A tool call; ``requestor`` says whose tools it calls (the agent's or the user's)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    requestor: Requestor = "assistant"


@dataclass(frozen=True)
class ToolMessage:
    """A tool's result: ``content`` is the output string, ``error`` tau2's error flag."""

    id: str
    content: str | None
    requestor: Requestor = "assistant"
    error: bool = False


@dataclass(frozen=True)
class ParticipantMessage:
    """A message of the agent (``role="assistant"``) or the user: text, tool calls, or both."""

    role: Requestor
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None

    def has_text_content(self) -> bool:
        """Whether the message has non-blank text."""
        return self.content is not None and self.content.strip() != ""

    def is_tool_call(self) -> bool:
        """Whether the message carries tool calls (an empty list counts, as in tau2)."""
        return self.tool_calls is not None


@dataclass(frozen=True)
class SystemMessage:
    """A system message (kept for completeness; nothing grades it)."""

    content: str | None = None


Message = ParticipantMessage | ToolMessage | SystemMessage


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # a dict skips the ABC's check


def _where(index: int) -> str:
    return f"message {index}"


def _arguments(raw: Any, index: int) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TrajectoryError(
                f"{_where(index)}: tool call arguments are not valid JSON ({exc}); "
                "give an object or its JSON text"
            ) from exc
    if not isinstance(raw, dict):
        raise TrajectoryError(
            f"{_where(index)}: tool call arguments must be an object, got {type(raw).__name__}"
        )
    return raw


def _text(raw: Mapping[str, Any], index: int) -> str | None:
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        raise TrajectoryError(
            f"{_where(index)}: content must be a string or null, got {type(content).__name__}"
        )
    return content


def _tool_calls(raw: Any, role: Requestor, index: int) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list):
        raise TrajectoryError(f"{_where(index)}: tool_calls must be a list")
    calls = []
    for call in raw:
        if not _is_mapping(call):
            raise TrajectoryError(f"{_where(index)}: each tool call must be an object")
        function = call.get("function")
        body = function if function is not None and _is_mapping(function) else call
        name = body.get("name")
        if not isinstance(name, str):
            raise TrajectoryError(f"{_where(index)}: a tool call has no string 'name'")
        call_id = call.get("id") or ""
        requestor = call.get("requestor", role)
        if requestor not in ("user", "assistant"):
            raise TrajectoryError(f"{_where(index)}: requestor must be 'assistant' or 'user'")
        arguments = body.get("arguments", {})
        if type(arguments) is not dict:
            arguments = _arguments(arguments, index)
        calls.append(ToolCall(name, arguments, str(call_id), requestor))
    return tuple(calls)


def parse_message(raw: Any, index: int = 0) -> Message:
    """One message of the chat shape above (``TrajectoryError`` if it is none of them)."""
    if type(raw) is not dict and isinstance(raw, (ParticipantMessage, ToolMessage, SystemMessage)):
        return raw
    if not _is_mapping(raw):
        raise TrajectoryError(f"{_where(index)}: expected an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role in ("assistant", "user"):
        calls = raw.get("tool_calls")
        return ParticipantMessage(
            role,
            _text(raw, index),
            None if calls is None else _tool_calls(calls, role, index),
        )
    if role == "tool":
        requestor = raw.get("requestor", "assistant")
        if requestor not in ("user", "assistant"):
            raise TrajectoryError(f"{_where(index)}: requestor must be 'assistant' or 'user'")
        call_id = raw.get("id", raw.get("tool_call_id"))
        if not isinstance(call_id, str):
            raise TrajectoryError(f"{_where(index)}: a tool result needs its call's string 'id'")
        return ToolMessage(call_id, _text(raw, index), requestor, bool(raw.get("error", False)))
    if role == "system":
        return SystemMessage(content=_text(raw, index))
    raise TrajectoryError(
        f"{_where(index)}: unknown role {role!r}; expected assistant, user, tool or system"
    )


def parse_messages(raw: Iterable[Any]) -> list[Message]:
    """Every message of a trajectory, in order."""
    return [parse_message(m, i) for i, m in enumerate(raw)]
