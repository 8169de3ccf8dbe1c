"""The agent's model: one request to an OpenAI-compatible ``/chat/completions`` endpoint.

Every way the endpoint can fail is a :class:`ModelError` whose ``kind`` names it
(:class:`ModelFailure`) and whose message says what happened and what to do; the key is sent in
the ``Authorization`` header and never appears in a message (the endpoint's own answer is
scrubbed of it before it is quoted).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from builtin_envs.agent.settings import AgentSettings, redact_url

__all__ = ["MAX_REPLY_BYTES", "ModelError", "ModelFailure", "ModelReply", "complete"]

MAX_REPLY_BYTES = 16 * 1024 * 1024
_QUOTE = 300  # characters of an error answer quoted in a message


class ModelFailure(enum.Enum):
    """Why the model gave no reply."""

    UNREACHABLE = "model_unreachable"  # no connection (refused, no such host, dropped)
    TIMEOUT = "model_timeout"  # no whole answer within AGENT_MODEL_TIMEOUT
    HTTP_ERROR = "model_http_error"  # an HTTP error status
    BAD_REPLY = "model_bad_reply"  # an answer that is not a chat completion


class ModelError(Exception):
    """The model endpoint failed; ``kind`` says how."""

    def __init__(self, kind: ModelFailure, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, str(self)))


@dataclass(frozen=True)
class ModelReply:
    """One assistant message, as the conversation keeps it, and the tokens it cost."""

    message: dict[str, Any]
    usage: dict[str, int]
    finish_reason: str | None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])


async def complete(
    settings: AgentSettings, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> ModelReply:
    """Ask the model for the next message of ``messages``, offering ``tools``."""
    url = f"{settings.base_url}/chat/completions"
    where = redact_url(url)
    body: dict[str, Any] = {"model": settings.model, "messages": messages}
    if tools:
        body["tools"] = tools
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    timeout = aiohttp.ClientTimeout(total=settings.model_timeout)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=body, headers=headers) as response,
        ):
            status = response.status
            data = await response.content.read(MAX_REPLY_BYTES + 1)
    except TimeoutError:
        raise ModelError(
            ModelFailure.TIMEOUT,
            f"the model endpoint {where} gave no answer within {settings.model_timeout:g} s "
            "(AGENT_MODEL_TIMEOUT); is it overloaded, or is the model too slow for that limit?",
        ) from None
    except (aiohttp.ClientError, OSError) as exc:
        reason = settings.scrub(str(exc) or type(exc).__name__)
        raise ModelError(
            ModelFailure.UNREACHABLE,
            f"the model endpoint {where} is unreachable ({type(exc).__name__}: {reason}); check "
            "AGENT_BASE_URL and that the server runs (and that this instance has the network: "
            'deployConfig "network": true)',
        ) from None
    if len(data) > MAX_REPLY_BYTES:
        raise ModelError(
            ModelFailure.BAD_REPLY,
            f"the model endpoint {where} answered more than {MAX_REPLY_BYTES >> 20} MiB",
        )
    text = data.decode(errors="replace")
    if status >= 400:
        quoted = settings.scrub(" ".join(text.split()))[:_QUOTE]
        hint = " (check the key in AGENT_API_KEY_VAR's variable)" if status in (401, 403) else ""
        raise ModelError(
            ModelFailure.HTTP_ERROR,
            f"the model endpoint {where} answered HTTP {status}{hint}: {quoted}",
        )
    return _parse(settings, where, text)


def _parse(settings: AgentSettings, where: str, text: str) -> ModelReply:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ModelError(
            ModelFailure.BAD_REPLY,
            f"the model endpoint {where} answered something that is not JSON ({exc}): "
            f"{settings.scrub(text)[:_QUOTE]!r}",
        ) from None
    try:
        choice = data["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
        calls = [_tool_call(c) for c in message.get("tool_calls") or []]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(
            ModelFailure.BAD_REPLY,
            f"the model endpoint {where} answered JSON that is not a chat completion (no "
            f"choices[0].message: {type(exc).__name__}: {exc}): "
            f"{settings.scrub(text)[:_QUOTE]!r}",
        ) from None
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    elif content is not None and not isinstance(content, str):
        content = str(content)
    kept: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        kept["tool_calls"] = calls
    usage = data.get("usage") if isinstance(data, dict) else None
    counts = {
        k: int(v)
        for k, v in (usage or {}).items()
        if k in ("prompt_tokens", "completion_tokens", "total_tokens") and isinstance(v, int)
    }
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return ModelReply(kept, counts, finish if isinstance(finish, str) else None)


def _tool_call(call: Any) -> dict[str, Any]:
    """A tool call as the conversation keeps it: id, type, function name and arguments."""
    function = call["function"]
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise TypeError("a tool call without a function name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
