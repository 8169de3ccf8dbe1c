"""The user of a tau2 episode: an LLM behind an OpenAI-compatible endpoint, or a script.

:class:`LLMUser` is tau2's ``UserSimulator``: its system prompt is the original's (the global
simulation guidelines, the tools variant when the domain gives the user tools, then the task's
scenario rendered as ``str(task.user_scenario)``), the conversation is sent with the roles
flipped (the user's own messages as ``assistant``, the agent's text as ``user``, the results of
the user's tool calls as ``tool``), at temperature 0 unless ``TAU2_USER_LLM_ARGS`` says
otherwise. A reply holding ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` ends the
episode (``user_stop``).

:class:`ScriptedUser` is deterministic, for tests and demos: it says its lines in order (a line
is a text, or ``{"tool_calls": [{"name", "arguments"}]}`` for the user's own tools), then
``###STOP###``. Without lines it opens with the scenario's reason for calling.

The API key is sent in the ``Authorization`` header only: never logged, never part of an error.
"""

from __future__ import annotations

import json
import logging
import textwrap
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "STOP_TOKENS",
    "LLMUser",
    "ScriptedUser",
    "UserReply",
    "UserSimulatorError",
    "is_stop",
    "render_scenario",
    "user_system_prompt",
]

log = logging.getLogger("tau2.user")

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
_MAX_EMPTY_REPLIES = 3


class UserSimulatorError(RuntimeError):
    """The user simulator could not answer (its endpoint failed or answered nonsense)."""


def is_stop(text: str | None) -> bool:
    """tau2's ``UserSimulator.is_stop`` for a text reply."""
    return text is not None and any(token in text for token in STOP_TOKENS)


def _indent(text: str) -> str:
    return textwrap.indent(text, "\t")


def _render_instructions(instructions: Any) -> str:
    if not isinstance(instructions, Mapping):
        return str(instructions)
    lines = [f"Domain: {instructions['domain']}"]
    lines.append(f"Reason for call:\n{_indent(instructions['reason_for_call'])}")
    if instructions.get("known_info") is not None:
        lines.append(f"Known info:\n{_indent(instructions['known_info'])}")
    if instructions.get("unknown_info") is not None:
        lines.append(f"Unknown info:\n{_indent(instructions['unknown_info'])}")
    lines.append(f"Task instructions:\n{_indent(instructions['task_instructions'])}")
    return "\n".join(lines)


def render_scenario(scenario: Mapping[str, Any]) -> str:
    """``str(task.user_scenario)`` as tau2 renders it (persona, then the instructions)."""
    lines = []
    if scenario.get("persona") is not None:
        lines.append("Persona:")
        lines.append(_indent(scenario["persona"]))
    lines.append("Instructions:")
    lines.append(_indent(_render_instructions(scenario["instructions"])))
    return "\n".join(lines)


def user_system_prompt(guidelines_dir: Path, scenario: Mapping[str, Any], with_tools: bool) -> str:
    """tau2's user-simulator system prompt for ``scenario``."""
    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    guidelines = (guidelines_dir / name).read_text(encoding="utf-8")
    # tau2 strips its template before filling it in, not the result
    return f"{guidelines}\n\n<scenario>\n{render_scenario(scenario)}\n</scenario>"


@dataclass
class UserReply:
    """What the user said: text, or calls of its own tools (``[{"id", "name", "arguments"}]``)."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


def _flipped(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The user's view of the conversation (tau2's ``UserState.flip_roles``), in wire form."""
    out: list[dict[str, Any]] = []
    for message in history:
        role = message.get("role")
        if role == "user":
            flipped: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            calls = message.get("tool_calls")
            if calls is not None:
                flipped["tool_calls"] = [
                    {
                        "id": call["id"],
                        "name": call["name"],
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"]),
                        },
                        "type": "function",
                    }
                    for call in calls
                ]
            out.append(flipped)
        elif role == "assistant" and message.get("tool_calls") is None:
            out.append({"role": "user", "content": message.get("content")})
        elif role == "tool" and message.get("requestor") == "user":
            out.append(
                {"role": "tool", "content": message.get("content"), "tool_call_id": message["id"]}
            )
    return out


@dataclass
class LLMUser:
    """tau2's user simulator over an OpenAI-compatible chat-completions endpoint."""

    model: str
    api_base: str
    system_prompt: str
    api_key: str | None = field(default=None, repr=False)
    tools: list[dict[str, Any]] | None = None
    llm_args: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0})
    timeout: float = 120.0

    def _url(self) -> str:
        base = self.api_base.rstrip("/")
        return base if base.endswith("/chat/completions") else f"{base}/chat/completions"

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self._url(), data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode("utf-8", "replace")
            raise UserSimulatorError(
                f"the user simulator's endpoint {self._url()} answered HTTP {exc.code}: "
                f"{_scrub(detail, self.api_key)}; check TAU2_USER_LLM and its endpoint"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserSimulatorError(
                f"the user simulator's endpoint {self._url()} failed: "
                f"{_scrub(f'{type(exc).__name__}: {exc}', self.api_key)}; check "
                "TAU2_USER_LLM_API_BASE"
            ) from None
        if not isinstance(data, dict):
            raise UserSimulatorError(
                f"the user simulator's endpoint {self._url()} answered {str(data)[:200]!r}, "
                "not a chat completion"
            )
        return data

    def reply(self, history: Sequence[Mapping[str, Any]]) -> UserReply:
        """The user's next message after ``history`` (the episode's messages so far)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": self.system_prompt}, *_flipped(history)],
            **self.llm_args,
        }
        if self.tools:
            body["tools"] = self.tools
            body["tool_choice"] = "auto"
        for _ in range(_MAX_EMPTY_REPLIES):
            data = self._post(body)
            try:
                message = data["choices"][0]["message"]
            except (KeyError, IndexError, TypeError):
                raise UserSimulatorError(
                    f"the user simulator's endpoint {self._url()} answered without "
                    f"choices[0].message: {_scrub(json.dumps(data)[:300], self.api_key)}"
                ) from None
            content = message.get("content")
            calls = message.get("tool_calls") or []
            if calls:
                return UserReply(content=content or None, tool_calls=_calls(calls))
            if content is not None and content.strip():
                return UserReply(content=content)
            log.warning("user simulator answered an empty message; asking again")
        raise UserSimulatorError(
            f"the user simulator ({self.model}) answered {_MAX_EMPTY_REPLIES} empty messages in "
            "a row"
        )


def _calls(raw: list[Any]) -> list[dict[str, Any]]:
    calls = []
    for call in raw:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as exc:
            raise UserSimulatorError(
                f"the user simulator called {function.get('name')!r} with arguments that are "
                f"not JSON ({exc})"
            ) from None
        calls.append(
            {"id": str(call.get("id") or ""), "name": function.get("name"), "arguments": parsed}
        )
    return calls


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


@dataclass
class ScriptedUser:
    """A deterministic user: its lines in order, then ``###STOP###``."""

    lines: list[Any]
    position: int = 0

    @classmethod
    def for_scenario(cls, scenario: Mapping[str, Any], lines: Sequence[Any] | None) -> ScriptedUser:
        """The script ``lines``, or an opening with the scenario's reason for calling."""
        if lines:
            return cls(list(lines))
        instructions = scenario.get("instructions")
        if isinstance(instructions, Mapping) and instructions.get("reason_for_call"):
            opening = str(instructions["reason_for_call"]).strip()
        else:
            opening = str(instructions or "Hi.").strip()
        return cls([opening])

    def reply(self, history: Sequence[Mapping[str, Any]]) -> UserReply:
        """The next line (``###STOP###`` once the script is over)."""
        if self.position >= len(self.lines):
            return UserReply(content=STOP_TOKENS[0])
        line = self.lines[self.position]
        self.position += 1
        if isinstance(line, Mapping) and line.get("tool_calls"):
            calls = [
                {
                    "id": str(call.get("id") or f"user_call_{self.position}_{i}"),
                    "name": call["name"],
                    "arguments": dict(call.get("arguments") or {}),
                }
                for i, call in enumerate(line["tool_calls"])
            ]
            return UserReply(content=None, tool_calls=calls)
        if isinstance(line, Mapping):
            return UserReply(content=str(line.get("content", "")))
        return UserReply(content=str(line))
