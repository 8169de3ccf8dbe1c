"""One episode's environment: the agent's and the user's toolkits; tool responses as tau2's.

:meth:`Tau2Environment.get_response` is tau2's ``Environment.get_response``: it calls the tool
(the user's when ``requestor="user"``; in solo mode the agent may call the user's tools too),
turns an exception into ``"Error: <message>"`` with the error flag set, and renders the result
with :func:`to_json_str`. :meth:`Tau2Environment.set_state` replays a trajectory's tool calls the
way tau2's evaluator does, raising :class:`~builtin_envs.tau2.errors.ReplayMismatchError` where a
stored result differs from the replay.

A domain whose two sides must be kept consistent (telecom: the line and the phone) subclasses
this and overrides :meth:`Tau2Environment.sync_tools`, called after every tool call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any, Self

from pydantic import BaseModel

from builtin_envs.tau2.errors import ReplayMismatchError, TrajectoryError
from builtin_envs.tau2.messages import (
    Message,
    ParticipantMessage,
    Requestor,
    ToolCall,
    ToolMessage,
)
from builtin_envs.tau2.tasks import EnvAssertion, EnvFunctionCall
from builtin_envs.tau2.toolkit import Toolkit

__all__ = ["Tau2Environment", "replay_pairs", "to_json_str"]

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(warnings=False)
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    raise ValueError(f"Unsupported type: {type(value)}")


def to_json_str(value: Any) -> str:
    """A tool's result as tau2 renders it: strings as they are, anything else as JSON.

    Models are dumped as they are; numbers and booleans outside models become strings
    (``{"n": 1}`` renders ``{"n": "1"}``); non-ASCII is escaped as ``json.dumps`` does.
    """
    if isinstance(value, str):
        return value
    return json.dumps(_plain(value), default=str)


def _loads_or_text(content: str | None) -> Any:
    if content is None:
        return None
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return content


class Tau2Environment:
    """A domain's state for one episode: its toolkits over forked databases."""

    def __init__(
        self,
        domain_name: str,
        policy: str,
        tools: Toolkit,
        user_tools: Toolkit | None = None,
        solo_mode: bool = False,
    ) -> None:
        self.domain_name = domain_name
        self.policy = policy
        self.tools = tools
        self.user_tools = user_tools
        self.solo_mode = solo_mode
        if solo_mode:
            self._check_solo_names()
        self.sync_tools()

    def _check_solo_names(self) -> None:
        user_names = set(self.user_tools.tool_names()) if self.user_tools is not None else set()
        overlap = set(self.tools.tool_names()) & user_names
        if overlap:
            raise ValueError(f"Tool names overlap: {overlap}")

    # -- tool calls -------------------------------------------------------------------------------

    def sync_tools(self) -> None:
        """Bring the two sides' state into agreement after a call (nothing to do by default)."""

    def make_tool_call(
        self, tool_name: str, requestor: Requestor, kwargs: Mapping[str, Any]
    ) -> Any:
        """Run tool ``tool_name`` from ``requestor``'s toolkit; the tool's exceptions propagate."""
        if requestor == "user":
            if self.solo_mode:
                raise ValueError("User tool calls are not allowed in solo mode")
            if self.user_tools is None:
                raise ValueError("User tools not available")
            return self.user_tools.use_tool(tool_name, **kwargs)
        if requestor == "assistant":
            user_tools = self.user_tools if self.solo_mode else None
            if user_tools is not None and user_tools.has_tool(tool_name):
                return user_tools.use_tool(tool_name, **kwargs)
            return self.tools.use_tool(tool_name, **kwargs)
        raise ValueError(f"Invalid requestor: {requestor}")

    def get_response(self, call: ToolCall) -> ToolMessage:
        """The result of ``call`` as tau2 reports it (then :meth:`sync_tools`)."""
        content, error = self._response(call)
        return ToolMessage(id=call.id, content=content, requestor=call.requestor, error=error)

    def _response(self, call: ToolCall) -> tuple[str, bool]:
        """:meth:`get_response`'s content and error flag."""
        try:
            result = self.make_tool_call(call.name, call.requestor, _keywords(call.arguments))
            self.sync_tools()
        except Exception as exc:  # every tool failure is the caller's result, as in tau2
            return to_json_str(f"Error: {exc}"), True
        return to_json_str(result), False

    def respond(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        requestor: Requestor = "assistant",
        call_id: str = "",
    ) -> ToolMessage:
        """Shorthand for :meth:`get_response` of a call built from its parts."""
        return self.get_response(ToolCall(name, dict(arguments), call_id, requestor))

    # -- functions and assertions (tasks' initialization and evaluation) -------------------------

    def run_env_function_call(self, call: EnvFunctionCall) -> Any:
        """Call any method (tool or not) of the agent's or the user's toolkit, then sync."""
        if call.env_type == "user":
            toolkit = self.user_tools
        elif call.env_type == "assistant":
            toolkit = self.tools
        else:
            raise ValueError(f"Invalid environment type: {call.env_type}")
        func = getattr(toolkit, call.func_name)
        result = func(**call.arguments)
        self.sync_tools()
        return result

    def run_env_assertion(
        self, assertion: EnvAssertion, raise_assertion_error: bool = True
    ) -> bool:
        """Run an assertion function; whether its result equals ``assert_value``."""
        result = self.run_env_function_call(assertion)
        if not isinstance(result, bool):
            raise ValueError(
                f"Function {assertion.func_name} returned {type(result)} instead of bool"
            )
        passed = result == assertion.assert_value
        if raise_assertion_error and not passed:
            raise AssertionError(assertion.message or f"Assertion failed: {assertion}")
        return passed

    # -- state ------------------------------------------------------------------------------------

    def get_db_hash(self) -> str | None:
        """tau2's hash of the agent's database."""
        return self.tools.get_db_hash()

    def get_user_db_hash(self) -> str | None:
        """tau2's hash of the user's database (None without user tools)."""
        return None if self.user_tools is None else self.user_tools.get_db_hash()

    def same_db_state(self, other: Tau2Environment) -> bool:
        """Whether both databases (agent's and user's) hash as ``other``'s do."""
        return _same(self.tools, other.tools) and _same(self.user_tools, other.user_tools)

    def set_state(
        self,
        initialization_data: Mapping[str, Any] | None,
        initialization_actions: Iterable[EnvFunctionCall] | None,
        message_history: list[Message],
    ) -> None:
        """Initialize as a task says, then replay ``message_history``'s tool calls in order.

        Each replayed result must equal the stored one (compared as parsed JSON when both parse,
        as text otherwise), else :class:`ReplayMismatchError`; a call without its result right
        after it is a :class:`TrajectoryError`. The same rules as tau2's. The three steps are
        :func:`replay_pairs`, :meth:`initialize` and :meth:`replay`.
        """
        pairs = replay_pairs(message_history, self.solo_mode)
        self.initialize(initialization_data, initialization_actions)
        self.replay(pairs)

    def initialize(
        self,
        initialization_data: Mapping[str, Any] | None,
        initialization_actions: Iterable[EnvFunctionCall] | None,
    ) -> None:
        """Apply a task's initialization: its database updates, then its actions in order."""
        if initialization_data is not None:
            if initialization_data.get("agent_data") is not None:
                assert self.tools.db is not None
                self.tools.db = self.tools.db.updated(initialization_data["agent_data"])
            if initialization_data.get("user_data") is not None:
                assert self.user_tools is not None
                assert self.user_tools.db is not None
                self.user_tools.db = self.user_tools.db.updated(initialization_data["user_data"])
        for action in initialization_actions or ():
            self.run_env_function_call(action)

    def replay(self, pairs: Iterable[tuple[ToolCall, ToolMessage]]) -> None:
        """Replay tool calls (from :func:`replay_pairs`), each result checked, then sync."""
        for call, stored in pairs:
            content = self._response(call)[0]
            if content == stored.content:
                continue
            if _loads_or_text(content) != _loads_or_text(stored.content):
                raise ReplayMismatchError(
                    f"replaying tool call {call.name!r} (id {call.id!r}, from {call.requestor}) "
                    f"with arguments {json.dumps(call.arguments, default=str)[:500]} returned "
                    f"{content[:500]!r}, but the trajectory stores "
                    f"{(stored.content or '')[:500]!r}; the trajectory does not come from this "
                    "task's state (tau2 rejects it too)"
                )
        self.sync_tools()

    # -- sharing a state --------------------------------------------------------------------------

    def freeze(self) -> None:
        """Promise that this state no longer changes (a task's initialized state, a gold
        outcome): its databases' forks may share their records, :meth:`fork` is cheap."""
        self.tools.freeze()
        if self.user_tools is not None:
            self.user_tools.freeze()

    def reproducible(self) -> bool:
        """Whether this state came about without chance (no random id drawn): a copy of it is
        then what computing it again would give."""
        return True

    def fork(self) -> Self:
        """A new episode in this state: the toolkits over forks of the databases (no sync: the
        state is copied as it is). Fork a :meth:`frozen <freeze>` state."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.tools = self.tools.fork()
        new.user_tools = None if self.user_tools is None else self.user_tools.fork()
        return new


def replay_pairs(messages: list[Message], solo_mode: bool) -> list[tuple[ToolCall, ToolMessage]]:
    """A trajectory's tool calls, each with its stored result, checked as tau2 checks them.

    :class:`TrajectoryError` for a user message in solo mode, a result that does not follow its
    call, a call without its result.
    """
    if solo_mode and any(isinstance(m, ParticipantMessage) and m.role == "user" for m in messages):
        raise TrajectoryError("User messages are not allowed in solo mode")
    return _call_result_pairs(messages)


def _keywords(arguments: Mapping[str, Any]) -> dict[str, Any]:
    # tau2 calls ``make_tool_call(name, requestor=..., **arguments)``: an argument named after
    # one of that method's own parameters is Python's "multiple values" TypeError there.
    if "requestor" in arguments:
        raise TypeError(
            "tau2.environment.environment.Environment.make_tool_call() got multiple values "
            "for keyword argument 'requestor'"
        )
    for name in arguments:
        if name in ("self", "tool_name"):
            raise TypeError(
                f"Environment.make_tool_call() got multiple values for argument '{name}'"
            )
    return dict(arguments)


def _same(a: Toolkit | None, b: Toolkit | None) -> bool:
    if a is None or b is None or a.db is None or b.db is None:
        return (a.get_db_hash() if a is not None else None) == (
            b.get_db_hash() if b is not None else None
        )
    return a.db.same_state(b.db)


def _call_result_pairs(messages: list[Message]) -> list[tuple[ToolCall, ToolMessage]]:
    pairs = []
    position = 0
    while position < len(messages):
        message = messages[position]
        position += 1
        if isinstance(message, ToolMessage):
            raise TrajectoryError(
                "Tool message not expected. Tool messages should always follow a tool call."
            )
        if not (isinstance(message, ParticipantMessage) and message.tool_calls is not None):
            continue
        for call in message.tool_calls:
            if position >= len(messages):
                raise TrajectoryError("Tool message expected. Got None.")
            result = messages[position]
            position += 1
            if not isinstance(result, ToolMessage):
                raise TrajectoryError(f"Tool message expected. Got {type(result).__name__}")
            if call.id != result.id:
                raise TrajectoryError(f"Tool call id mismatch. Got {call.id} and {result.id}")
            pairs.append((call, result))
    return pairs
