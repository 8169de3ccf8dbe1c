"""Tasks as the evaluator reads them: gold actions, assertions, what to communicate, initial state.

The models keep tau2's field names and order (a check in a reward's result is dumped as tau2
dumps it). ``user_scenario``, ``description`` and ``ticket`` are kept as given, for whoever
renders them (the user simulator's prompt, solo mode's ticket).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Action",
    "EnvAssertion",
    "EnvFunctionCall",
    "EvaluationCriteria",
    "InitialState",
    "RewardType",
    "Task",
]


class RewardType(StrEnum):
    """A component of the reward."""

    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


class Action(BaseModel):
    """A gold action: a tool call the agent (or the user) is expected to make."""

    action_id: str
    requestor: Literal["user", "assistant"] = "assistant"
    name: str
    arguments: dict[str, Any]
    info: str | None = None
    compare_args: list[str] | None = None

    def matches(self, name: str, arguments: dict[str, Any]) -> bool:
        """tau2's ``compare_with_tool_call``: same name, same values of the compared arguments."""
        if self.name != name:
            return False
        keys = arguments.keys() if self.compare_args is None else self.compare_args
        if len(keys) == 0:
            return True
        return {k: v for k, v in arguments.items() if k in keys} == {
            k: v for k, v in self.arguments.items() if k in keys
        }


class EnvFunctionCall(BaseModel):
    """A call of a toolkit method by name (a task's initialization action)."""

    env_type: Literal["user", "assistant"]
    func_name: str
    arguments: dict[str, Any]


class EnvAssertion(EnvFunctionCall):
    """A toolkit method whose boolean result must equal ``assert_value``."""

    assert_value: bool = True
    message: str | None = None


class EvaluationCriteria(BaseModel):
    """What a task's reward checks."""

    actions: list[Action] | None = None
    env_assertions: list[EnvAssertion] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(
        default_factory=lambda: [RewardType.DB, RewardType.COMMUNICATE]
    )


class InitialState(BaseModel):
    """How a task's episode starts: database updates, actions, earlier messages (raw dicts)."""

    initialization_data: dict[str, Any] | None = None
    initialization_actions: list[EnvFunctionCall] | None = None
    message_history: list[dict[str, Any]] | None = None


class Task(BaseModel):
    """One task of a domain."""

    model_config = ConfigDict(extra="allow")

    id: str
    description: dict[str, Any] | None = None
    user_scenario: dict[str, Any]
    ticket: str | None = None
    initial_state: InitialState | None = None
    evaluation_criteria: EvaluationCriteria | None = None
