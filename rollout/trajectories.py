"""The trajectory record: one episode as a trainer reads it (docs/rollout.md#the-record-format).

A :class:`Trajectory` keeps the whole episode as the model saw it: the conversation in the OpenAI
chat shape (``messages``: the system prompt, the user's prompt, each assistant turn with its tool
calls under the names the model was offered, each tool result as a ``role: tool`` message), the
tools offered (``tools``) and the map of their names to the environment's (``tool_names``), each
tool call as a timed :class:`Step` (under the environment's name), each model turn as a
:class:`Turn` (its token usage, log-probabilities and token ids when the endpoint returned them),
the reward and its components, the resolved ``name@version`` and instance id, and the policy
with its settings. :meth:`Trajectory.to_json` is the record written to disk
(:mod:`rollout.records`: one type per field).

A policy that talks to a model writes the conversation itself (:class:`rollout.synthesis.
OpenAIPolicy` does, through ``AgentEnv.add_message``); for any other policy the conversation is
built from its tool calls (:func:`conversation_from_steps`): each call an assistant message with
one tool call (under its OpenAI-safe name) and its ``role: tool`` result, after the system prompt
(if any) and the task's prompt, and the policy's answer last.

May import: the standard library, ``aenv_ray``. Must not import: kubernetes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from aenv_ray.openai_tools import OpenAINames
from rollout.records import FORMAT, as_record

__all__ = [
    "FORMAT",
    "Step",
    "ToolNaming",
    "Trajectory",
    "Turn",
    "conversation_from_steps",
    "sum_usage",
]

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass
class Step:
    """One tool call of an episode."""

    tool: str  # the tool's real name: ``name@version/tool`` (what the model called, if unknown)
    arguments: dict[str, Any]
    text: str  # the result's text (what an agent reads)
    is_error: bool
    started: float  # seconds since the episode started
    seconds: float
    structured: Any = None
    tool_call_id: str | None = None  # the id of its tool call in ``messages``


@dataclass
class Turn:
    """One model call of an episode: the assistant message it produced, and what it cost."""

    message_index: int  # of the assistant message in ``messages``
    started: float  # seconds since the episode started
    seconds: float
    usage: dict[str, int] | None = None  # prompt_tokens, completion_tokens, total_tokens
    logprobs: list[dict[str, Any]] | None = None  # rollout.records.stored_logprobs
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None  # the prompt's ids, where the server returned them
    token_ids: list[int] | None = None  # the completion's ids, where the server returned them


@dataclass
class Trajectory:
    """One episode, as written to disk (one line of ``trajectories.jsonl``)."""

    episode_id: str
    task_id: str
    env: str  # as asked: ``name``, ``name@version`` or a project's path
    outcome: str  # an EpisodeOutcome value
    reason: str | None = None
    truncated: bool = False  # a cap (--max-turns), not the agent, ended it (gymnasium's sense)
    reward: float | None = None
    answer: str | None = None
    steps: list[Step] = field(default_factory=list)
    attempts: int = 1
    instance_id: str | None = None
    seconds: float = 0.0
    task: dict[str, Any] = field(default_factory=dict)
    retried: list[str] = field(default_factory=list)  # why each earlier attempt was retried
    env_ref: str | None = None  # the resolved ``name@version`` the instance served
    reward_components: dict[str, Any] | None = None  # what the reward returned beside the number
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI specs, as offered
    tool_names: list[dict[str, str]] = field(default_factory=list)  # {"name", "tool"} pairs
    turns: list[Turn] = field(default_factory=list)
    usage: dict[str, int] | None = None  # summed over the turns that reported it
    timings: dict[str, float] = field(default_factory=dict)  # acquire, setup, policy, reward
    policy: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        """The record: a JSON-ready dict of one type per field (:func:`rollout.records.
        as_record`)."""
        return as_record(asdict(self))


class ToolNaming:
    """The tools of one instance, by real name (``name@version/tool``), and the names a model
    may call them by: the plain name, the real name, the OpenAI-safe name
    (:class:`aenv_ray.openai_tools.OpenAINames`)."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.tools = tools
        real = [str(tool["name"]) for tool in tools]
        self.env_ref: str | None = real[0].rsplit("/", 1)[0] if real and "/" in real[0] else None
        self._plain = {name.rsplit("/", 1)[-1]: name for name in real}
        self._names = OpenAINames(self.env_ref) if self.env_ref else None

    def real(self, name: str) -> str:
        """The real name of the tool a policy or model called ``name`` (``name`` itself when
        no tool of the instance answers to it)."""
        if name in self._plain.values():
            return name
        if name in self._plain:
            return self._plain[name]
        if self._names is not None:
            plain = self._names.from_openai(name, set(self._plain))
            if plain is not None:
                return self._plain[plain]
        return name

    def openai_name(self, real: str) -> str:
        """The name a chat-completions model sees for the tool ``real``."""
        if self._names is None:
            return real
        return self._names.to_openai(real.rsplit("/", 1)[-1])

    def offered(self) -> list[dict[str, Any]]:
        """The tools as Chat Completions specs under the names a model is offered."""
        return [
            {
                "type": "function",
                "function": {
                    "name": self.openai_name(str(tool["name"])),
                    "description": tool.get("description", ""),
                    "parameters": tool.get("inputSchema", {"type": "object", "properties": {}}),
                },
            }
            for tool in self.tools
        ]

    def offered_name(self, name: str) -> str:
        """The name a model is offered for the tool a policy called ``name`` (``name`` itself
        for a tool the instance does not have)."""
        real = self.real(name)
        return self.openai_name(real) if real in self._plain.values() else name

    def pairs(self) -> list[dict[str, str]]:
        """``{"name": offered name, "tool": the environment's name}`` of every tool."""
        return [
            {"name": self.openai_name(str(tool["name"])), "tool": str(tool["name"])}
            for tool in self.tools
        ]


def conversation_from_steps(
    steps: list[Step],
    task: Mapping[str, Any],
    answer: str | None,
    system_prompt: str | None,
    naming: ToolNaming | None = None,
) -> list[dict[str, Any]]:
    """The conversation of a policy that called tools without a model: the system prompt,
    the task's prompt, an assistant tool call and its result per step (under the name
    ``naming`` offers a model, else the step's), the answer last. Each step gets the id of its
    call (``call_0``, ``call_1``, ...) unless it had one."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": str(task.get("prompt", ""))})
    for index, step in enumerate(steps):
        if step.tool_call_id is None:
            step.tool_call_id = f"call_{index}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": step.tool_call_id,
                        "type": "function",
                        "function": {
                            "name": step.tool if naming is None else naming.offered_name(step.tool),
                            "arguments": json.dumps(step.arguments),
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": step.tool_call_id, "content": step.text})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


def sum_usage(turns: list[Turn]) -> dict[str, int] | None:
    """The token usage summed over ``turns`` (None if no turn reported any)."""
    reported = [turn.usage for turn in turns if turn.usage]
    if not reported:
        return None
    return {key: sum(int(usage.get(key) or 0) for usage in reported) for key in USAGE_KEYS}


def usage_of(value: Any) -> dict[str, int] | None:
    """The ``usage`` object of a chat-completions reply as ints (None if absent or not one)."""
    if not isinstance(value, Mapping):
        return None
    usage = {}
    for key in USAGE_KEYS:
        number = value.get(key)
        if isinstance(number, int) and not isinstance(number, bool):
            usage[key] = number
    return usage or None
