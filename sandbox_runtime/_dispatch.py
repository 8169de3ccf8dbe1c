"""Validate, run and report every call into an environment: one code path for all transports.

Both the lean fast path and MCP end in :meth:`Dispatcher.call_tool`; functions, the reward and the
health check end in :meth:`Dispatcher.call_function`. Sync code runs on the :class:`SyncRunner`
(interruptible), async code on the event loop under ``asyncio.timeout`` and the
:class:`~sandbox_runtime._watchdog.Watchdog` (which also cuts an async call that blocks the loop).
A call that hit the instance's memory or process limit (:mod:`sandbox_runtime._limits`) says so.
What goes back is checked by :meth:`Dispatcher.encode_tool_result` and
:meth:`Dispatcher.encode_value`: exact JSON (no NaN, no lone surrogate) of at most
``MAX_RESPONSE_BYTES``, else an error naming the problem.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pydantic
import pydantic_core

from aenv_ray.envref import did_you_mean
from aenv_ray.errors import (
    AEnvError,
    FunctionError,
    FunctionErrorKind,
    FunctionNotFoundError,
    InstanceBrokenError,
    JudgeUnavailableError,
)
from aenv_ray.protocol import MAX_RESPONSE_BYTES, ToolErrorKind, ToolResult, json_problem
from aenv_ray.registry import DefinitionRegistry, Kind, Registered
from aenv_ray.signature import format_validation_error
from sandbox_runtime import _limits, contain
from sandbox_runtime._judge import Judge
from sandbox_runtime._limits import InstanceLimits, LimitHit
from sandbox_runtime._runner import (
    DeadlineExceeded,
    ExitAttemptError,
    Interrupted,
    SyncRunner,
    WorkerStuckError,
)
from sandbox_runtime._watchdog import Watchdog

__all__ = ["STUCK_GRACE", "CallFailed", "Dispatcher"]

STUCK_GRACE = 2.0  # seconds a sync job may take to stop after its deadline before it is "stuck"

log = logging.getLogger("sandbox_runtime.dispatch")


_STATUS = {
    FunctionErrorKind.NOT_FOUND: 404,
    FunctionErrorKind.INVALID_ARGUMENTS: 400,
    FunctionErrorKind.EXECUTION: 500,
    FunctionErrorKind.RESOURCE_LIMIT: 500,
    FunctionErrorKind.TIMEOUT: 504,
}


@dataclass
class CallFailed(Exception):
    """A function/reward/health call that did not produce a value: ``error`` (a
    :class:`FunctionError`, or :class:`InstanceBrokenError` when a sync call is stuck) is
    answered with the HTTP ``status``."""

    status: int
    error: AEnvError

    @property
    def message(self) -> str:
        """The error's message."""
        return self.error.message

    def __str__(self) -> str:
        return self.error.message


def _failed(
    kind: FunctionErrorKind, message: str, function: str | None, error_type: str | None = None
) -> CallFailed:
    """The failure of ``function`` for ``kind``; ``error_type`` is the seeds' string (the
    exception's class name when it raised, else the kind's value)."""
    cls = FunctionNotFoundError if kind is FunctionErrorKind.NOT_FOUND else FunctionError
    error = cls(message, function=function, kind=kind, error_type=error_type or kind.value)
    return CallFailed(_STATUS[kind], error)


def _suggest(name: str, known: list[str], what: str, owner: str) -> str:
    hint = did_you_mean(name, known, cutoff=0.5)
    if hint:
        return f"{what} `{name}` not found in `{owner}`{hint}"
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


def json_size_at_least(value: Any, cap: int = MAX_RESPONSE_BYTES) -> int:
    """A lower bound of the size of ``value``'s JSON, found without serialising it (text
    counts one byte a character), walked only until it passes ``cap``: a result too large to
    send is refused before a serialiser allocates for it (orjson crashes the process when an
    allocation fails, and a copy of a large value may not fit in the instance's memory)."""
    total = 0
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str | bytes | bytearray):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + 2 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + len(item)
            stack.extend(item)
        elif isinstance(item, pydantic.BaseModel):
            stack.append(dict(item))
        else:
            total += 1
    return total


def _size(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"


def _log_broken(reason: str) -> None:
    log.critical("instance broken", extra={"reason": reason})


class Dispatcher:
    """Calls into one loaded registry, with validation, deadlines and readable errors."""

    def __init__(
        self,
        registry: DefinitionRegistry,
        *,
        env_ref: str,
        runner: SyncRunner,
        default_timeout: float = 600.0,
        debug: bool = False,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.registry = registry
        self.env_ref = env_ref
        self.runner = runner
        self.default_timeout = default_timeout
        self.debug = debug
        self.watchdog = watchdog or Watchdog(grace=STUCK_GRACE, on_broken=_log_broken)
        self.judge: Judge | None = None
        """Where a reward registered with ``judge=True`` runs (:mod:`sandbox_runtime._judge`);
        :class:`~sandbox_runtime.server.RuntimeServer` starts it before it serves."""
        self._judging: asyncio.Event | None = None  # set while a judge reward runs

    def _deadline(self, entry: Registered, timeout: float | None) -> tuple[float, float]:
        limits = [t for t in (timeout, entry.timeout) if t is not None and t > 0]
        limit = min(limits) if limits else self.default_timeout
        return limit, time.monotonic() + limit

    async def _invoke(
        self, entry: Registered, kwargs: dict[str, Any], limit: float, deadline: float
    ) -> Any:
        """Run the function; raise DeadlineExceeded past its deadline. What it starts and does
        not keep ends when it returns (:mod:`sandbox_runtime.contain`)."""
        tracker = contain.calls()
        if tracker is None:
            return await self._invoke_in(entry, entry.fn, kwargs, limit, deadline)
        call = tracker.enter()
        try:
            fn = contain.within(call, entry.fn, entry.is_async)
            return await self._invoke_in(entry, fn, kwargs, limit, deadline)
        finally:
            sweep = tracker.leave(call)
            if sweep is not None and (entry.is_async or self.runner.stuck_in is None):
                await asyncio.to_thread(sweep)  # not while a stuck job still runs

    async def _invoke_in(
        self,
        entry: Registered,
        fn: Any,
        kwargs: dict[str, Any],
        limit: float,
        deadline: float,
    ) -> Any:
        if entry.is_async:
            try:
                async with asyncio.timeout(limit):
                    return await fn(**kwargs)
            except TimeoutError as exc:
                if time.monotonic() >= deadline - 0.001:
                    raise DeadlineExceeded(f"{limit:g} s") from exc
                raise
            except Interrupted:  # the watchdog: it blocked the event loop past its deadline
                raise DeadlineExceeded(f"{limit:g} s") from None
        future = self.runner.submit(fn, kwargs, deadline=deadline)
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
        self, name: str, arguments: Any, *, timeout: float | None = None, check_json: bool = False
    ) -> ToolResult:
        """Call a tool; every failure is a ``ToolResult`` with ``is_error`` and an error kind.

        ``check_json``: the arguments come from a parser that lets NaN or infinity through (MCP's);
        refuse them, as the fast path's parser does.
        """
        while (judging := self._judging) is not None:  # the judge ends processes and grades
            await judging.wait()
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
        if check_json and (problem := json_problem(arguments)) is not None:
            return _error(
                ToolErrorKind.INVALID_ARGUMENTS,
                f"invalid arguments for tool `{name}`: {problem} has no JSON form; "
                "send finite numbers and Unicode text",
            )
        try:
            kwargs = entry.signature.validate(arguments)
        except pydantic.ValidationError as exc:
            message = format_validation_error(
                exc, what=f"tool `{name}`", parameters=entry.signature.parameters
            )
            return _error(ToolErrorKind.INVALID_ARGUMENTS, message)
        limit, deadline = self._deadline(entry, timeout)
        call = self.watchdog.enter("tool", name, limit, deadline, is_async=entry.is_async)
        try:
            value = await self._invoke(entry, kwargs, limit, deadline)
        except (WorkerStuckError, asyncio.CancelledError):
            self.watchdog.leave(call)
            raise
        except BaseException as exc:  # SystemExit from an async tool must not stop the server
            result = self._tool_failure(name, limit, exc)
        else:
            result = value if isinstance(value, ToolResult) else self._tool_result(name, value)
        hit = self.watchdog.leave(call)
        if log.isEnabledFor(logging.DEBUG):
            took = (time.monotonic() - deadline + limit) * 1e3
            log.debug("tool call", extra={"tool": name, "ms": took})
        if hit is not None:
            return _limit_result(f"tool `{name}`", hit, result)
        return result

    def _tool_failure(self, name: str, limit: float, exc: BaseException) -> ToolResult:
        if isinstance(exc, DeadlineExceeded):
            log.warning("tool timed out", extra={"tool": name, "timeout": limit})
            return _error(ToolErrorKind.TIMEOUT, _timeout_message(f"tool `{name}`", limit, exc))
        log.info("tool raised", extra={"tool": name, "error": type(exc).__name__})
        limits = _limits.installed()
        if isinstance(exc, MemoryError) and limits is not None and limits.memory:
            return _error(
                ToolErrorKind.RESOURCE_LIMIT,
                f"tool `{name}` ran out of memory ({self._describe_exception(exc)}): "
                + _limits.memory_error_message(limits),
            )
        if _limits.is_disk_full(exc):
            return _error(
                ToolErrorKind.RESOURCE_LIMIT,
                f"tool `{name}` ran out of disk space ({self._describe_exception(exc)}): "
                + _limits.disk_full_message(),
            )
        return _error(
            ToolErrorKind.EXECUTION, f"tool `{name}` raised {self._describe_exception(exc)}"
        )

    def _tool_result(self, name: str, value: Any) -> ToolResult:
        at_least = json_size_at_least(value)
        if at_least > MAX_RESPONSE_BYTES:
            return _error(ToolErrorKind.EXECUTION, _too_large(f"tool `{name}`", at_least, "result"))
        room = _limits.data_room() if at_least > _ROOM_CHECK else None
        if room is not None and room < _SEND_COPIES * at_least:  # a crash, not an error
            return _error(ToolErrorKind.RESOURCE_LIMIT, _no_room(f"tool `{name}`", at_least, room))
        try:
            content, structured = _to_content(value)
        except (TypeError, ValueError, pydantic_core.PydanticSerializationError) as exc:
            problem = json_problem(value)
            if problem is not None:
                return _error(ToolErrorKind.EXECUTION, _no_json_form(f"tool `{name}`", problem))
            return _error(
                ToolErrorKind.EXECUTION,
                f"tool `{name}` returned a value of type `{type(value).__name__}`, which is not "
                f"JSON ({exc}); "
                "return str, dict, list, a pydantic model or None",
            )
        return ToolResult(content=content, is_error=False, structured=structured)

    def encode_tool_result(self, name: str, result: ToolResult) -> tuple[ToolResult, bytes]:
        """The result as the fast path sends it, checked: a result with no exact JSON form (NaN,
        a lone surrogate) or over ``MAX_RESPONSE_BYTES`` becomes an error result saying so."""
        try:
            body = orjson.dumps(result.to_wire())
        except TypeError as exc:  # orjson refuses lone surrogates (and exotic types)
            label = f"tool `{name}`"
            problem = _result_problem(result)
            result = _error(
                ToolErrorKind.EXECUTION,
                _no_json_form(label, problem)
                if problem
                else f"{label} returned a result that is not JSON ({exc})",
            )
            return result, orjson.dumps(result.to_wire())
        if len(body) > MAX_RESPONSE_BYTES:
            message = _too_large(f"tool `{name}`", len(body), "result")
            result = _error(ToolErrorKind.EXECUTION, message)
            return result, orjson.dumps(result.to_wire())
        if b"null" in body:  # orjson writes NaN and infinity as null: look closer
            problem = _result_problem(result)
            if problem is not None:
                result = _error(ToolErrorKind.EXECUTION, _no_json_form(f"tool `{name}`", problem))
                return result, orjson.dumps(result.to_wire())
        return result, body

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
            raise _failed(FunctionErrorKind.NOT_FOUND, message, name)
        label = f"{kind.value} `{entry.name}`"
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            raise _failed(
                FunctionErrorKind.INVALID_ARGUMENTS,
                f"invalid arguments for {label}: "
                f"expected a JSON object, got {type(arguments).__name__}",
                entry.name,
            )
        try:
            kwargs = entry.signature.validate(arguments)
        except pydantic.ValidationError as exc:
            message = format_validation_error(
                exc, what=label, parameters=entry.signature.parameters
            )
            raise _failed(FunctionErrorKind.INVALID_ARGUMENTS, message, entry.name) from None
        limit, deadline = self._deadline(entry, timeout)
        if entry.judge:
            return await self._judged(entry, label, dict(arguments), limit, deadline)
        while kind is not Kind.HEALTH and (judging := self._judging) is not None:
            await judging.wait()
        call = self.watchdog.enter(kind.value, entry.name, limit, deadline, is_async=entry.is_async)
        try:
            value = await self._run_function(entry, label, kwargs, limit, deadline)
        except CallFailed as failed:
            hit = self.watchdog.leave(call)
            if hit is not None:
                raise _limit_failure(label, entry.name, hit, failed.message) from None
            raise
        hit = self.watchdog.leave(call)
        if hit is not None:
            raise _limit_failure(label, entry.name, hit, None)
        return value

    async def _judged(
        self,
        entry: Registered,
        label: str,
        arguments: dict[str, Any],
        limit: float,
        deadline: float,
    ) -> Any:
        """Run a judge reward in the judge (:mod:`sandbox_runtime._judge`); a JSON object it
        returns gets the judge's report as ``judge`` (unless it set that key itself)."""
        judge = self.judge
        if judge is None:
            raise CallFailed(
                503,
                JudgeUnavailableError(
                    f"{label} of `{self.env_ref}` asks for the judge, but this runtime has none "
                    "(its server never ran: serve the project with `python -m sandbox_runtime`, "
                    "`aenv run` or an engine)",
                    env_name=self.env_ref,
                ),
            )
        tracker = contain.calls()
        call = tracker.enter() if tracker is not None else None
        judging = self._judging = asyncio.Event()  # tool and function calls wait meanwhile
        try:
            outcome = await asyncio.to_thread(judge.run, arguments, deadline=deadline, label=label)
        except JudgeUnavailableError as exc:
            log.error("judge unavailable", extra={"reason": exc.message})
            raise CallFailed(503, exc) from None
        finally:
            if tracker is not None and call is not None:
                sweep = tracker.leave(call)  # what the judge left (its seed is older: spared)
                if sweep is not None:
                    await asyncio.to_thread(sweep)
            if self._judging is judging:
                self._judging = None
            judging.set()
        if outcome.error is not None:
            kind, message = outcome.error
            if kind == "timeout":
                raise _failed(
                    FunctionErrorKind.TIMEOUT,
                    f"{label} timed out after {limit:g} s in the judge, which was ended",
                    entry.name,
                )
            if kind == "invalid":
                raise _failed(
                    FunctionErrorKind.INVALID_ARGUMENTS,
                    f"invalid arguments for {label}: {message}",
                    entry.name,
                )
            raise _failed(
                FunctionErrorKind.EXECUTION,
                f"{label} raised {message} (in the judge)",
                entry.name,
                outcome.report.get("error_type"),
            )
        value = outcome.value
        if isinstance(value, dict) and "judge" not in value:
            return {**value, "judge": outcome.report}
        return value

    async def _run_function(
        self, entry: Registered, label: str, kwargs: dict[str, Any], limit: float, deadline: float
    ) -> Any:
        try:
            value = await self._invoke(entry, kwargs, limit, deadline)
        except WorkerStuckError as exc:
            raise CallFailed(503, InstanceBrokenError(str(exc))) from None
        except DeadlineExceeded as exc:
            message = _timeout_message(label, limit, exc)
            raise _failed(FunctionErrorKind.TIMEOUT, message, entry.name) from None
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            limits = _limits.installed()
            if isinstance(exc, MemoryError) and limits is not None and limits.memory:
                raise _failed(
                    FunctionErrorKind.RESOURCE_LIMIT,
                    f"{label} ran out of memory ({self._describe_exception(exc)}): "
                    + _limits.memory_error_message(limits),
                    entry.name,
                ) from None
            if _limits.is_disk_full(exc):
                raise _failed(
                    FunctionErrorKind.RESOURCE_LIMIT,
                    f"{label} ran out of disk space ({self._describe_exception(exc)}): "
                    + _limits.disk_full_message(),
                    entry.name,
                ) from None
            raise _failed(
                FunctionErrorKind.EXECUTION,
                f"{label} raised {self._describe_exception(exc)}",
                entry.name,
                getattr(exc, "original_type", type(exc).__name__),
            ) from None
        try:
            if isinstance(value, pydantic.BaseModel):
                return value.model_dump(mode="json")
            return pydantic_core.to_jsonable_python(value)
        except (TypeError, ValueError, pydantic_core.PydanticSerializationError) as exc:
            raise _failed(
                FunctionErrorKind.EXECUTION,
                f"{label} returned a value of type `{type(value).__name__}`, not JSON ({exc})",
                entry.name,
            ) from None

    def encode_value(
        self, label: str, envelope: dict[str, Any], *, function: str | None = None
    ) -> bytes:
        """``envelope`` (``{"success": true, "data": VALUE}``) as sent, checked as
        :meth:`encode_tool_result` checks a tool's result; raise :class:`CallFailed` (500,
        ``execution``) naming the problem; ``function`` is the name it names."""
        execution = FunctionErrorKind.EXECUTION
        at_least = json_size_at_least(envelope.get("data"))
        if at_least > MAX_RESPONSE_BYTES:
            raise _failed(execution, _too_large(label, at_least, "value"), function)
        room = _limits.data_room() if at_least > _ROOM_CHECK else None
        if room is not None and room < _SEND_COPIES * at_least:
            limit = FunctionErrorKind.RESOURCE_LIMIT
            raise _failed(limit, _no_room(label, at_least, room), function)
        try:
            body = orjson.dumps(envelope)
        except TypeError as exc:
            problem = json_problem(envelope.get("data"))
            message = _no_json_form(label, problem) if problem else f"{label}: not JSON ({exc})"
            raise _failed(execution, message, function) from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise _failed(execution, _too_large(label, len(body), "value"), function)
        if b"null" in body and (problem := json_problem(envelope.get("data"))) is not None:
            raise _failed(execution, _no_json_form(label, problem), function)
        return body


def _result_problem(result: ToolResult) -> str | None:
    """What in a result has no JSON form: in ``structured`` first (the tool's own value)."""
    if result.structured is not None and (problem := json_problem(result.structured)):
        return problem
    return json_problem({"content": result.content})


def _no_json_form(label: str, problem: str) -> str:
    return (
        f"{label} returned a value with no JSON form: {problem}. JSON has no NaN or infinity "
        "(return None or a string instead) and only Unicode text (decode bytes with "
        "errors='replace', not 'surrogateescape')"
    )


_ROOM_CHECK = 1 << 20
"""Results of at least this many bytes are checked against the memory left to send them."""
_SEND_COPIES = 16
"""How many times its size a result may need while it is serialised: orjson reserves its
output buffer for the worst case of a string's escapes, and a failed allocation there ends the
process (measured: a 20 MiB string needs over 205 MiB free, 65 MiB over 929 MiB)."""


def _no_room(label: str, size: int, room: int) -> str:
    return (
        f"{label} returned a result of {_size(size)}, more than the runtime has the memory left "
        f"to send ({_size(room)} free under the instance's memory limit); return less (write "
        "large data to a file in the workspace and return its path), or give the environment "
        "more memory (deployConfig.memory)"
    )


def _too_large(label: str, size: int, what: str) -> str:
    return (
        f"{label} returned a {what} of {_size(size)} of JSON, over the limit of "
        f"{_size(MAX_RESPONSE_BYTES)} an answer may take; return less (write large data to a "
        "file in the workspace and return its path)"
    )


def _limit_result(label: str, hit: LimitHit, result: ToolResult) -> ToolResult:
    """``result`` (kept after the message) turned into the limit's error result."""
    limits = _limits.installed() or InstanceLimits()
    message = f"{label}: {hit.describe(limits)}"
    return ToolResult(
        content=[{"type": "text", "text": message}, *result.content],
        is_error=True,
        error_kind=ToolErrorKind.RESOURCE_LIMIT,
        structured=result.structured,
    )


def _limit_failure(label: str, function: str, hit: LimitHit, detail: str | None) -> CallFailed:
    limits = _limits.installed() or InstanceLimits()
    message = f"{label}: {hit.describe(limits)}"
    if detail:
        message += f" ({detail})"
    return _failed(FunctionErrorKind.RESOURCE_LIMIT, message, function)


def _timeout_message(label: str, limit: float, exc: DeadlineExceeded) -> str:
    if str(exc) == "stuck":
        return (
            f"{label} timed out after {limit:g} s and ignored its interruption; the instance "
            "is broken and should be replaced"
        )
    return f"{label} timed out after {limit:g} s and was interrupted"


def _error(kind: ToolErrorKind, message: str) -> ToolResult:
    return ToolResult(content=[{"type": "text", "text": message}], is_error=True, error_kind=kind)
