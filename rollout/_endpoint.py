"""What a model endpoint's error answer says: its own message, and whether the conversation is
over the model's context (the policy then ends the episode as truncated, not failed).

May import: the standard library.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["ContextFull", "context_full", "error_message", "refusal_advice"]


class ContextFull(Exception):
    """The model endpoint refused the request: the conversation is over the model's context."""


# how endpoints say a conversation is over the model's context: OpenAI's code, vLLM's and
# SGLang's messages ("This model's maximum context length is 4096 tokens. However, ...", "The
# input (5000 tokens) is longer than the model's context length (4096 tokens).")
_CONTEXT_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
_CONTEXT_WORDS = re.compile(r"maximum context length|context length|context window", re.I)


def _error_body(text: str) -> dict[str, Any]:
    """The error object of an endpoint's error answer: OpenAI's ``{"error": {...}}``, vLLM's
    older top-level ``{"object": "error", "message", ...}``; ``{}`` for anything else."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    inner = doc.get("error")
    if isinstance(inner, dict):
        return inner
    if isinstance(inner, str):
        return {"message": inner}
    return doc


def error_message(text: str) -> str:
    """The endpoint's own error message in its answer ``text`` (the start of the text when it
    has none): what a user reads in the run's line and the record's reason.

    >>> error_message('{"error": {"message": "Invalid model", "code": "model_not_found"}}')
    'Invalid model (model_not_found)'
    >>> error_message('<html>Bad Gateway</html>')
    '<html>Bad Gateway</html>'
    """
    error = _error_body(text)
    message = error.get("message") or error.get("detail")
    if not isinstance(message, str) or not message:
        return text[:200]
    code = error.get("code")
    return f"{message[:300]} ({code})" if isinstance(code, str) and code else message[:300]


def context_full(status: int, text: str) -> bool:
    """Whether a 4xx answer says the conversation is over the model's context.

    >>> context_full(400, '{"error": {"message": "...", "code": "context_length_exceeded"}}')
    True
    >>> context_full(400, '{"object": "error", "message": "The maximum context length is '
    ...     '4096 tokens. However, you requested 5000 tokens."}')
    True
    >>> context_full(400, '{"error": {"message": "Invalid schema for function f"}}')
    False
    """
    if not 400 <= status < 500 or status == 429:
        return False
    error = _error_body(text)
    if error.get("code") in _CONTEXT_CODES:
        return True
    message = error.get("message")
    return isinstance(message, str) and bool(_CONTEXT_WORDS.search(message))


def refusal_advice(status: int) -> str:
    """What to check when the endpoint refused a request with ``status`` (a 4xx)."""
    if status in (401, 403):
        return "check the key: --api-key or OPENAI_API_KEY"
    if status == 404:
        return "check --base-url and --model"
    return "the endpoint refused what aenv-ray sent (the model's parameters, a tool's schema)"
