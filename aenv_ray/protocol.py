"""What crosses the wire between the SDK and an instance's runtime.

Paths, the tool result and the error kinds. The runtime serves the seeds' routes
(``/health``, ``/task/reward``, ``/functions/NAME``, ``/functions/list``, MCP at ``/mcp``) and our
lean fast path under ``/aenv/v1``; both paths run the same validation and the same tool code.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import pydantic

from aenv_ray.errors import (
    ToolArgumentError,
    ToolError,
    ToolExecutionError,
    ToolNotFoundError,
    ToolResourceLimitError,
    ToolTimeoutError,
)

__all__ = [
    "BUNDLE_KEY_ENV",
    "DEFAULT_FUNCTIONS_PORT",
    "DEFAULT_MCP_PORT",
    "FAST_CALL_PATH",
    "FAST_INFO_PATH",
    "FAST_TOOLS_PATH",
    "FUNCTIONS_LIST_PATH",
    "FUNCTIONS_PREFIX",
    "HEALTH_PATH",
    "IDEMPOTENCY_HEADER",
    "MAX_PREVIEW_FILE_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_RESPONSE_BYTES",
    "MAX_TIMEOUT",
    "MCP_PATH",
    "PREVIEW_PATH",
    "PREVIEW_PREFIX",
    "READY_PATH",
    "REWARD_PATH",
    "TIMEOUT_HEADER",
    "TOKEN_ENV",
    "TOKEN_SHA256_ENV",
    "JudgeReport",
    "ToolErrorKind",
    "ToolResult",
    "json_problem",
]

DEFAULT_FUNCTIONS_PORT = 8080
DEFAULT_MCP_PORT = 8081

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The header naming a create, so that the hub answers its retries with the same instance
(sent by :class:`aenv_ray.hub.RemoteEngine`, read by EnvHub: here, so that the hub need not
import the client and its HTTP library)."""

MCP_PATH = "/mcp"
HEALTH_PATH = "/health"
REWARD_PATH = "/task/reward"
FUNCTIONS_PREFIX = "/functions/"
FUNCTIONS_LIST_PATH = "/functions/list"
FAST_CALL_PATH = "/aenv/v1/call"
FAST_TOOLS_PATH = "/aenv/v1/tools"
FAST_INFO_PATH = "/aenv/v1/info"
READY_PATH = "/aenv/v1/ready"  # no token needed, no environment code run: for probes
PREVIEW_PATH = "/aenv/v1/preview"
"""``GET``: where this instance's preview is (its capability path); needs the token."""
PREVIEW_PREFIX = "/aenv/v1/preview/"
"""``GET PREVIEW_PREFIX + CAPABILITY + "/" + FILE``: a file of the preview, for a browser (no
token: the capability in the path is the authority; see :mod:`aenv_ray.preview`)."""
MAX_PREVIEW_FILE_BYTES = 16 * 1024 * 1024
"""A preview file larger than this is not served (HTTP 413)."""
TOKEN_ENV = (
    "AENV_RUNTIME_TOKEN"  # the instance token, for a runtime an engine starts in a container
)
TOKEN_SHA256_ENV = "AENV_RUNTIME_TOKEN_SHA256"
"""The SHA-256 of the instance token (64 hex digits), for a runtime that must not be given the
token itself (a Kubernetes pod: its spec is readable by whoever may read pods); the runtime
accepts a request whose token has this digest. Not a secret: the digest is no token."""
BUNDLE_KEY_ENV = "AENV_BUNDLE_KEY"
"""The hub key a runtime started with ``--bundle`` fetches with (removed before anything else)."""
TIMEOUT_HEADER = b"x-aenv-timeout"
"""Seconds a function, reward or health call may run (their bodies are the arguments)."""

MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""A request body over this many bytes is refused (HTTP 400)."""
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""The runtime never answers with a body over this many bytes: a tool result or function value
whose JSON is larger becomes an error result (or envelope). The SDK reads no more than this of
any answer (:class:`~aenv_ray.errors.ResponseTooLargeError`). Both sides use this constant; the
SDK does not advertise a limit of its own."""
MAX_TIMEOUT = 24 * 3600.0
"""The longest limit, in seconds, a call may run under (``timeout=`` of a decorator, the
``timeout`` of a request, ``X-AEnv-Timeout``)."""


class ToolErrorKind(enum.Enum):
    """Why a tool call came back with ``is_error=True``."""

    NOT_FOUND = "not_found"
    INVALID_ARGUMENTS = "invalid_arguments"
    EXECUTION = "execution"
    TIMEOUT = "timeout"
    RESOURCE_LIMIT = "resource_limit"
    """The call hit the instance's memory or process limit; the message names the limit."""


_ERROR_CLASSES: dict[ToolErrorKind, type[ToolError]] = {
    ToolErrorKind.NOT_FOUND: ToolNotFoundError,
    ToolErrorKind.INVALID_ARGUMENTS: ToolArgumentError,
    ToolErrorKind.EXECUTION: ToolExecutionError,
    ToolErrorKind.TIMEOUT: ToolTimeoutError,
    ToolErrorKind.RESOURCE_LIMIT: ToolResourceLimitError,
}


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call, as the agent should see it.

    ``content`` is a list of MCP content items (``{"type": "text", "text": ...}``). An error the
    agent caused or can react to (unknown tool, bad arguments, the tool raised, the tool timed
    out, the call hit the instance's memory or process limit) is a result with ``is_error=True``,
    not an exception; ``error_kind`` says which. Call :meth:`raise_for_error` to turn it into the
    typed exception instead.

        >>> ToolResult([{"type": "text", "text": "hi"}]).text
        'hi'
    """

    content: list[dict[str, Any]] = field(default_factory=list)
    is_error: bool = False
    error_kind: ToolErrorKind | None = None
    structured: Any = None

    @property
    def text(self) -> str:
        """The text items joined by newlines (what most agents feed back to the model)."""
        return "\n".join(str(c.get("text", "")) for c in self.content if c.get("type") == "text")

    def raise_for_error(self, *, tool: str | None = None) -> ToolResult:
        """Return ``self`` when it succeeded, else raise the :class:`ToolError` subclass."""
        if not self.is_error:
            return self
        cls = _ERROR_CLASSES.get(self.error_kind or ToolErrorKind.EXECUTION, ToolExecutionError)
        raise cls(self.text or "tool call failed", tool=tool)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object the fast path sends."""
        out: dict[str, Any] = {"content": self.content, "is_error": self.is_error}
        if self.error_kind is not None:
            out["error_kind"] = self.error_kind.value
        if self.structured is not None:
            out["structured"] = self.structured
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ToolResult:
        """Read the fast path's JSON object back (``KeyError``/``ValueError`` if malformed)."""
        kind = data.get("error_kind")
        content = data["content"]
        if not isinstance(content, list):
            raise ValueError("content is not a list")
        return cls(
            content=content,
            is_error=bool(data["is_error"]),
            error_kind=ToolErrorKind(kind) if kind else None,
            structured=data.get("structured"),
        )


def json_problem(value: Any) -> str | None:
    """What in ``value`` has no exact JSON form, and where; None when all of it has one.

    Two things do not survive the wire: a NaN or infinite float (JSON has no such number; orjson
    silently writes ``null``) and a string holding a lone surrogate (not Unicode text; orjson
    refuses it; ``os.fsdecode`` makes them from undecodable bytes).

        >>> json_problem({"scores": [1.0, float("nan")]})
        'NaN at `scores[1]`'
        >>> json_problem({"name": "ok"}) is None
        True
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                kind = "NaN" if math.isnan(item) else "infinity"
                return f"{kind} at `{path or '(the value)'}`"
        elif isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:
                    where = path or "(the value)"
                    return f"a lone surrogate {item[exc.start]!r} in the string at `{where}`"
        elif isinstance(item, dict):
            for key, sub in reversed(item.items()):
                name = str(key)
                if isinstance(key, str) and not key.isascii() and json_problem(key) is not None:
                    return f"a lone surrogate in the key {key!r} of `{path or '(the value)'}`"
                stack.append((sub, f"{path}.{name}" if path else name))
        elif isinstance(item, list | tuple):
            for index in range(len(item) - 1, -1, -1):
                stack.append((item[index], f"{path}[{index}]"))
    return None


class JudgeReport(pydantic.BaseModel):
    """What the judge did before and around a reward registered with ``judge=True``
    (docs/environments.md): a judge reward's envelope carries it as ``judge``, and so does its
    value when that is a JSON object without a ``judge`` key of its own.

        >>> JudgeReport.model_validate({"killed": 1, "scope": "pid namespace",
        ...     "seed": "forked", "processes": [{"pid": 7, "command": "sleep 100"}]}).killed
        1
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    killed: int = 0
    """How many processes of the instance were ended before the judge ran."""
    processes: list[dict[str, Any]] = pydantic.Field(default_factory=list)
    """``{"pid", "command"}`` of the first 100 of them."""
    scope: str = "pid namespace"
    """Where they were looked for: ``pid namespace`` (every process of the instance) or
    ``descendants`` (a runtime started by hand: only its own descendants)."""
    seed: str = "forked"
    """What the judge was forked from: ``forked`` (the runtime's state before any call), or a
    ``fresh interpreter`` that loaded the project again (a fork of a running instance, or a
    seed that was gone)."""
    judge_pid: int | None = None
    workspace_files: int = 0
    """Regular files copied into the judge's workspace."""
    workspace_bytes: int = 0
    """Their apparent size (a sparse file's holes count)."""
    workspace_allocated: int = 0
    """What the copy occupies on disk (the holes of sparse files stay holes)."""
    over_limit: dict[str, Any] | None = None
    """``{"limit", "cap", "found", "path"}`` when the workspace was past one of the judge's
    limits (``config.json``'s ``"reward"``: ``maxWorkspaceFiles``, ``maxWorkspaceBytes``,
    ``maxWorkspaceDepth``): the reward did not run, the episode is graded 0 with a ``reason``
    naming the limit (the agent's doing, never an infrastructure failure)."""
    removed: list[dict[str, str]] = pydantic.Field(default_factory=list)
    """``{"path", "type"}``: FIFOs, sockets and device nodes of the workspace, not copied."""
    links_out: list[dict[str, str]] = pydantic.Field(default_factory=list)
    """``{"path", "target"}``: links whose target resolves outside the workspace, removed."""
    ignored: list[dict[str, str]] = pydantic.Field(default_factory=list)
    """``{"path", "type", "why"}``: what of the instance's environment the judge did not take:
    a ``variable`` (``path`` is its name: ``LD_PRELOAD``, ``PYTHONPATH``, ``XDG_CONFIG_HOME``...)
    or a ``PATH directory`` in a place the agent writes (its home, ``/tmp``, the workspace)."""
    fresh_places: list[str] = pydantic.Field(default_factory=list)
    """The places every agent may write that the judge got fresh and empty (a tmpfs of its
    own, in a mount namespace of its own): ``/tmp``, ``/var/tmp``, ``/dev/shm`` (those that
    exist)."""
    fresh_kept: list[str] = pydantic.Field(default_factory=list)
    """What of the covered places the judge still shows, each at its own path: its own
    directory (``rw``), the project and Python's directories (read-only)."""
    fresh_refused: str | None = None
    """Why the judge got no fresh places (the host refuses user namespaces): it graded on the
    instance's own ``/tmp``, where the agent may have planted files (docs/security.md)."""
    seconds: float = 0.0
    """From the first process ended to the reward's answer."""
    error_type: str | None = None
    """The exception's class name when the reward raised."""
