"""One agent instance's conversation: the chat loop, its inner environment, its counters.

:meth:`AgentSession.chat` adds the user's message, asks the model, runs the tool calls it makes
in the inner environment and feeds their results back, until the model answers without a tool
call or ``AGENT_MAX_TURNS`` replies have asked for tools. Every failure is an error
:class:`~aenv_ray.ToolResult` whose ``structured["error"]`` names it (:class:`ChatFailure`);
everything that enters the conversation or leaves the instance is scrubbed of secrets first.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from typing import Any

from aenv_ray import ToolErrorKind, ToolResult
from builtin_envs.agent.inner import InnerEnvironment, InnerEnvironmentError
from builtin_envs.agent.model import ModelError, complete
from builtin_envs.agent.settings import AgentSettings

__all__ = ["AgentSession", "ChatFailure"]

log = logging.getLogger("builtin_envs.agent")


class ChatFailure(enum.Enum):
    """Why a chat gave no answer (``structured["error"]`` of its error result)."""

    NOT_CONFIGURED = "not_configured"
    MODEL_UNREACHABLE = "model_unreachable"
    MODEL_TIMEOUT = "model_timeout"
    MODEL_HTTP_ERROR = "model_http_error"
    MODEL_BAD_REPLY = "model_bad_reply"
    ENVIRONMENT_ERROR = "environment_error"
    MAX_TURNS = "max_turns"


class _Exchange:
    """What one chat did: its model turns, tool calls and tokens."""

    def __init__(self) -> None:
        self.turns = 0
        self.calls: list[dict[str, Any]] = []
        self.usage: dict[str, int] = {}
        self.started = time.monotonic()

    def summary(self, inner: InnerEnvironment | None) -> dict[str, Any]:
        where = {"env": inner.ref, "instance_id": inner.instance_id} if inner else None
        return {
            "turns": self.turns,
            "tool_calls": self.calls,
            "usage": self.usage,
            "environment": where,
            "seconds": round(time.monotonic() - self.started, 3),
        }


class AgentSession:
    """The conversation and the inner instance of one agent instance (module state: an instance
    is its own process, so one session per instance)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.usage: dict[str, int] = {}
        self.turns = 0
        self.inner: InnerEnvironment | None = None
        self._lock: asyncio.Lock | None = None

    def after_fork(self) -> None:
        """In a fork of this instance: the conversation is copied; the inner instance stays the
        parent's, so the fork's next chat starts an inner instance of its own."""
        if self.inner is not None:
            self.inner.abandon()
        self.inner = None
        self._lock = None

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def chat(self, settings: AgentSettings, message: str) -> ToolResult:
        """One user message in, the agent's answer (or the failure) out."""
        if settings.problem is not None:
            return _failed(ChatFailure.NOT_CONFIGURED, settings.problem, {})
        async with self._guard():  # one chat at a time: a conversation is a sequence
            exchange = _Exchange()
            if not self.messages and settings.system_prompt:
                self.messages.append({"role": "system", "content": settings.system_prompt})
            self.messages.append({"role": "user", "content": settings.scrub(message)})
            try:
                return await self._run(settings, exchange)
            except ModelError as exc:
                log.warning(
                    "the model failed",
                    extra={
                        "error": exc.kind.value,
                        "model": settings.model,
                        "turn": exchange.turns,
                    },
                )
                failure = ChatFailure(exc.kind.value)
                return _failed(failure, settings.scrub(str(exc)), exchange.summary(self.inner))
            except InnerEnvironmentError as exc:
                log.warning("the inner environment failed", extra={"env": settings.environment})
                summary = exchange.summary(self.inner)
                await self._drop_inner()
                text = f"{exc}; the next chat starts a new instance of it"
                return _failed(ChatFailure.ENVIRONMENT_ERROR, text, summary)

    async def _run(self, settings: AgentSettings, exchange: _Exchange) -> ToolResult:
        inner = await self.environment(settings)
        tools = inner.tools if inner is not None else []
        for _ in range(settings.max_turns):
            reply = await complete(settings, self.messages, tools)
            exchange.turns += 1
            self.turns += 1
            for key, value in reply.usage.items():
                exchange.usage[key] = exchange.usage.get(key, 0) + value
                self.usage[key] = self.usage.get(key, 0) + value
            kept = dict(reply.message)
            if isinstance(kept.get("content"), str):
                kept["content"] = settings.scrub(kept["content"])
            calls = [self._with_id(call, i) for i, call in enumerate(reply.tool_calls)]
            if calls:
                kept["tool_calls"] = calls
            self.messages.append(kept)
            if not calls:
                answer = str(kept.get("content") or "")
                structured = {"reply": answer, **exchange.summary(inner)}
                return ToolResult([{"type": "text", "text": answer}], structured=structured)
            await self._answer_calls(settings, inner, calls, exchange)
        text = (
            f"no answer after {settings.max_turns} model turns (AGENT_MAX_TURNS): each asked for "
            "tools; the conversation is kept, so chat again to go on, or call reset"
        )
        return _failed(ChatFailure.MAX_TURNS, text, exchange.summary(inner))

    async def _answer_calls(
        self,
        settings: AgentSettings,
        inner: InnerEnvironment | None,
        calls: list[dict[str, Any]],
        exchange: _Exchange,
    ) -> None:
        """A ``role: tool`` message for each call, in order. When the inner instance fails (or
        the chat is interrupted) the calls not run get one saying so: a conversation whose tool
        calls lack answers is one no endpoint takes again."""
        answered = 0
        try:
            for call in calls:
                self.messages.append(await self._tool_message(settings, inner, call, exchange))
                answered += 1
        finally:
            for call in calls[answered:]:
                name = call["function"]["name"]
                text = (
                    f"`{name}` was not run: the chat ended (its environment failed, or a timeout)"
                )
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})

    def _with_id(self, call: dict[str, Any], index: int) -> dict[str, Any]:
        if call.get("id"):
            return call
        return {**call, "id": f"call_{len(self.messages)}_{index}"}

    async def _tool_message(
        self,
        settings: AgentSettings,
        inner: InnerEnvironment | None,
        call: dict[str, Any],
        exchange: _Exchange,
    ) -> dict[str, Any]:
        """Run one tool call; the ``role: tool`` message that answers it."""
        name = call["function"]["name"]
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
            if not isinstance(arguments, dict):
                raise ValueError(f"expected a JSON object, got {type(arguments).__name__}")
        except ValueError as exc:
            text, is_error = f"invalid JSON arguments for `{name}`: {exc}", True
            arguments = None
        else:
            if inner is None:
                text = f"there is no tool `{name}`: this agent has no environment (AGENT_ENV)"
                is_error = True
            else:
                result = await inner.call(name, arguments)
                text, is_error = settings.scrub(result.text), result.is_error
        exchange.calls.append({"tool": name, "arguments": arguments, "is_error": is_error})
        return {"role": "tool", "tool_call_id": call["id"], "content": text}

    async def environment(self, settings: AgentSettings) -> InnerEnvironment | None:
        """The inner instance, created on first use (None: this agent has no environment)."""
        if settings.environment is None:
            return None
        if self.inner is not None and self.inner.ref != settings.environment:
            await self._drop_inner()
        if self.inner is None:
            self.inner = await InnerEnvironment.open(settings)
        return self.inner

    async def _drop_inner(self) -> str | None:
        inner, self.inner = self.inner, None
        if inner is None:
            return None
        await inner.aclose()
        return inner.instance_id

    async def reset(self, new_environment: bool) -> dict[str, Any]:
        """Clear the conversation and its counters; ``new_environment``: release the inner
        instance too (the next chat starts a fresh one)."""
        async with self._guard():
            cleared = len(self.messages)
            self.messages, self.usage, self.turns = [], {}, 0
            released = await self._drop_inner() if new_environment else None
        return {"cleared_messages": cleared, "released_instance": released}

    async def reward(self, settings: AgentSettings, arguments: dict[str, Any]) -> Any:
        """The inner environment's reward on its instance (created first if no chat did)."""
        if settings.problem is not None:
            raise ValueError(settings.problem)
        try:
            inner = await self.environment(settings)
        except InnerEnvironmentError as exc:
            raise RuntimeError(str(exc)) from None
        if inner is None:
            raise ValueError(
                "this agent has no environment (AGENT_ENV), so it has no reward to ask for"
            )
        return await inner.reward(arguments)

    def history(self, settings: AgentSettings) -> dict[str, Any]:
        """The conversation so far, in the OpenAI chat shape, with its counters."""
        text = settings.scrub(json.dumps(self.messages))
        return {"messages": json.loads(text), "turns": self.turns, "usage": dict(self.usage)}

    def health(self, settings: AgentSettings) -> dict[str, Any]:
        """Healthy while it serves; what it is configured with (never a key) and holds."""
        return {
            "status": "healthy",
            **settings.describe(),
            "inner_instance": self.inner.instance_id if self.inner else None,
            "messages": len(self.messages),
            "turns": self.turns,
            "usage": dict(self.usage),
        }


def _failed(kind: ChatFailure, text: str, summary: dict[str, Any]) -> ToolResult:
    message = f"agent: {text}"
    return ToolResult(
        [{"type": "text", "text": message}],
        is_error=True,
        error_kind=ToolErrorKind.EXECUTION,
        structured={"error": kind.value, "message": message, **summary},
    )
