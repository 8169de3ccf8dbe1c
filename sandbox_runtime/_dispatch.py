"""Validate, run and report every call into an environment: one code path for all transports.

Both the lean fast path and MCP end in :meth:`Dispatcher.call_tool`; functions, the reward and the
health check end in :meth:`Dispatcher.call_function`. Sync code runs on the :class:`SyncRunner`
(interruptible), async code on the event loop under ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pydantic
import pydantic_core

from aenv_ray._signature import format_validation_error
from aenv_ray.protocol import ToolErrorKind, ToolResult
from aenv_ray.registry import Kind, Registered, Registry
from sandbox_runtime._runner import (
    DeadlineExceeded,
    ExitAttemptError,
    SyncRunner,
    WorkerStuckError,
)

__all__ = ["STUCK_GRACE", "CallFailed", "Dispatcher"]

STUCK_GRACE = 2.0  # seconds a sync job may take to stop after its deadline before it is "stuck"

log = logging.getLogger("sandbox_runtime.dispatch")


@dataclass
class CallFailed(Exception):
    """A function/reward/health call that did not produce a value. ``status`` is the HTTP code."""

    status: int
    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


def _suggest(name: str, known: list[str], what: str, owner: str) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    if close:
        return f"{what} `{name}` not found in `{owner}`; did you mean `{close[0]}`?"
    if known:
        return f"{what} `{name}` not found in `{owner}`; it has: {', '.join(sorted(known))}"
    return f"{what} `{name}` not found in `{owner}`, which has no {what}s"


def _to_content(value: Any) -> tuple[list[dict[str, Any]], Any]:
    """A tool's return value -> (MCP content items, structured value or None)."""
    if value is None:
        return [], None
    if isinstance(value, str):
        return [{"type": "text", "text": value}], None
    if isinstance(value, pydantic.BaseModel):
        data = value.model_dump(mode="json")
    else:
        data = pydantic_core.to_jsonable_python(value)  # TypeError/ValueError if not JSON-able
    text = orjson.dumps(data).decode()
    return [{"type": "text", "text": text}], data


class Dispatcher:
    """Calls into one loaded registry, with validation, deadlines and readable errors."""

    def __init__(
        self,
        registry: Registry,
        *,
        env_ref: str,
        runner: SyncRunner,
        default_timeout: float = 600.0,
        debug: bool = False,
    ) -> None:
        self.registry = registry
        self.env_ref = env_ref
        self.runner = runner
        self.default_timeout = default_timeout
        self.debug = debug

    def _deadline(self, entry: Registered, timeout: float | None) -> tuple[float, float]:
        limits = [t for t in (timeout, entry.timeout) if t is not None and t > 0]
        limit = min(limits) if limits else self.default_timeout
        return limit, time.monotonic() + limit

    async def _invoke(
        self, entry: Registered, kwargs: dict[str, Any], timeout: float | None
    ) -> Any:
        """Run the function; raise DeadlineExceeded past its deadline."""
        limit, deadline = self._deadline(entry, timeout)
        if entry.is_async:
            try:
                async with asyncio.timeout(limit):
                    return await entry.fn(**kwargs)
            except TimeoutError as exc:
                if time.monotonic() >= deadline - 0.001:
                    raise DeadlineExceeded(f"{limit:g} s") from exc
                raise
        future = self.runner.submit(entry.fn, kwargs, deadline=deadline)
        try:
            return await asyncio.wait_for(
                asyncio.shield(future), deadline - time.monotonic() + STUCK_GRACE
            )
        except TimeoutError:
            self.runner.mark_stuck(future, entry.name)
            log.error("sync worker stuck", extra={"function": entry.name})
            raise DeadlineExceeded("stuck") from None

    def _describe_exception(self, exc: BaseException) -> str:
        text = str(exc) if isinstance(exc, ExitAttemptError) else f"{type(exc).__name__}: {exc}"
        if self.debug:
            text += "\n" + "".join(traceback.format_exception(exc))
        return text

    # -- tools -------------------------------------------------------------------------------
    async def call_tool(
        self, name: str, arguments: Any, *, timeout: float | None = None
    ) -> ToolResult:
        """Call a tool; every failure is a ``ToolResult`` with ``is_error`` and an error kind."""
        entry = self.registry.tools.get(name)
        if entry is None:
            message = _suggest(name, list(self.registry.tools), "tool", self.env_ref)
            return _error(ToolErrorKind.NOT_FOUND, message)
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            return _error(
                ToolErrorKind.INVALID_ARGUMENTS,
                f"invalid arguments for tool `{name}`: expected a JSON object of named "
                f"arguments, got {type(arguments).__name__}",
            )
        try:
            kwargs = entry.signature.validate(arguments)
        except pydantic.ValidationError as exc:
            message = format_validation_error(
                exc, what=f"tool `{name}`", parameters=entry.signature.parameters
            )
            return _error(ToolErrorKind.INVALID_ARGUMENTS, message)
        started = time.perf_counter()
        try:
            value = await self._invoke(entry, kwargs, timeout)
        except WorkerStuckError:
            raise
        except DeadlineExceeded as exc:
            limit, _ = self._deadline(entry, timeout)
            log.warning("tool timed out", extra={"tool": name, "timeout": limit})
            return _error(ToolErrorKind.TIMEOUT, _timeout_message(f"tool `{name}`", limit, exc))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit from an async tool must not stop the server
            log.info("tool raised", extra={"tool": name, "error": type(exc).__name__})
            return _error(
                ToolErrorKind.EXECUTION,
                f"tool `{name}` raised {self._describe_exception(exc)}",
            )
        finally:
            log.debug(
                "tool call", extra={"tool": name, "ms": (time.perf_counter() - started) * 1e3}
            )
        if isinstance(value, ToolResult):
            return value
        try:
            content, structured = _to_content(value)
        except (TypeError, ValueError, pydantic_core.PydanticSerializationError) as exc:
            return _error(
                ToolErrorKind.EXECUTION,
                f"tool `{name}` returned a value of type `{type(value).__name__}`, which is not "
                f"JSON ({exc}); "
                "return str, dict, list, a pydantic model or None",
            )
        return ToolResult(content=content, is_error=False, structured=structured)

    # -- functions, reward, health -----------------------------------------------------------
    def find_function(self, kind: Kind, name: str | None = None) -> Registered | None:
        """The registered function of that kind (and name, for plain functions)."""
        if kind is Kind.REWARD:
            return self.registry.reward
        if kind is Kind.HEALTH:
            return self.registry.health
        return self.registry.functions.get(name or "")

    async def call_function(
        self, kind: Kind, name: str | None, arguments: Any, *, timeout: float | None = None
    ) -> Any:
        """Call a function, the reward or the health check; raise :class:`CallFailed`."""
        entry = self.find_function(kind, name)
        if entry is None:
            if kind is Kind.REWARD:
                message = (
                    f"`{self.env_ref}` registers no reward; decorate one with @register_reward"
                )
            else:
                message = _suggest(
                    name or "", list(self.registry.functions), "function", self.env_ref
                )
            raise CallFailed(404, "not_found", message)
        label = f"{kind.value} `{entry.name}`"
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            raise CallFailed(
                400,
                "invalid_arguments",
                f"invalid arguments for {label}: "
                f"expected a JSON object, got {type(arguments).__name__}",
            )
        try:
            kwargs = entry.signature.validate(arguments)
        except pydantic.ValidationError as exc:
            message = format_validation_error(
                exc, what=label, parameters=entry.signature.parameters
            )
            raise CallFailed(400, "invalid_arguments", message) from None
        try:
            value = await self._invoke(entry, kwargs, timeout)
        except WorkerStuckError as exc:
            raise CallFailed(503, "instance_broken", str(exc)) from None
        except DeadlineExceeded as exc:
            limit, _ = self._deadline(entry, timeout)
            raise CallFailed(504, "timeout", _timeout_message(label, limit, exc)) from None
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            raise CallFailed(
                500,
                getattr(exc, "original_type", type(exc).__name__),
                f"{label} raised {self._describe_exception(exc)}",
            ) from None
        try:
            if isinstance(value, pydantic.BaseModel):
                return value.model_dump(mode="json")
            return pydantic_core.to_jsonable_python(value)
        except (TypeError, ValueError, pydantic_core.PydanticSerializationError) as exc:
            raise CallFailed(
                500,
                "execution",
                f"{label} returned a value of type `{type(value).__name__}`, not JSON ({exc})",
            ) from None


def _timeout_message(label: str, limit: float, exc: DeadlineExceeded) -> str:
    if str(exc) == "stuck":
        return (
            f"{label} timed out after {limit:g} s and ignored its interruption; the instance "
            "is broken and should be replaced"
        )
    return f"{label} timed out after {limit:g} s and was interrupted"


def _error(kind: ToolErrorKind, message: str) -> ToolResult:
    return ToolResult(content=[{"type": "text", "text": message}], is_error=True, error_kind=kind)
