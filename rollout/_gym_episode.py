"""The episode protocol behind :mod:`rollout.gym`, as async code (gymnasium only for an error).

An :class:`Episode` turns gym actions into tool calls on one instance at a time and decides
when the episode ends and what it earned. Where the instances come from is an
:class:`~rollout.sources.InstanceSource` (:mod:`rollout.sources`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium.error

from aenv_ray import ToolResult
from aenv_ray.envref import did_you_mean
from aenv_ray.errors import (
    AEnvError,
    ConfigurationError,
    FunctionError,
    FunctionErrorKind,
    FunctionNotFoundError,
)
from rollout.rewards import split_reward
from rollout.sources import InstanceHandle, InstanceSource

if TYPE_CHECKING:
    from numpy.random import Generator


__all__ = [
    "ACTION_SHAPE",
    "Episode",
    "EpisodeConfig",
    "InvalidAction",
    "ResetMode",
    "ResetNeededError",
    "StepResult",
    "Task",
    "ToolCall",
    "parse_action",
]

ACTION_SHAPE = '{"tool": NAME, "arguments": {...}}'
_ACTION_KEYS = ("tool", "arguments")
_OPTION_KEYS = ("task",)
_TASK_KEYS = ("id", "prompt", "reward_arguments", "reset_arguments")
_SEED_BOUND = 2**31 - 1

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class ResetMode(enum.Enum):
    """How :meth:`Episode.reset` gets a clean state."""

    AUTO = "auto"  # the env's `reset` function on the same instance if it has one, else a new one
    FRESH_INSTANCE = "fresh_instance"  # always a new instance (the `reset` function still runs)


@dataclass(frozen=True)
class Task:
    """One task: what the agent is told and how its result is judged.

    ``prompt`` is the episode's first observation; ``reward_arguments`` go to the environment's
    reward when the episode ends; ``reset_arguments`` go to its ``reset`` function, if any,
    next to ``seed``.
    """

    id: str = ""
    prompt: str = ""
    reward_arguments: Mapping[str, Any] = field(default_factory=dict)
    reset_arguments: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Task | Mapping[str, Any] | str) -> Task:
        """A :class:`Task` from a Task, a dict with the same keys, or a prompt string."""
        if isinstance(value, Task):
            return value
        if isinstance(value, str):
            return cls(prompt=value)
        if not isinstance(value, Mapping):
            raise ConfigurationError(
                f"a task is a Task, a dict or a prompt string, got {type(value).__name__}"
            )
        unknown = sorted(set(value) - set(_TASK_KEYS))
        if unknown:
            raise ConfigurationError(
                f"unknown task key(s) {unknown}{did_you_mean(unknown[0], _TASK_KEYS)}; "
                f"a task has {list(_TASK_KEYS)}"
            )
        for key in ("reward_arguments", "reset_arguments"):
            if not isinstance(value.get(key, {}), Mapping):
                raise ConfigurationError(f"task `{key}` must be a dict, got {value[key]!r}")
        return cls(
            id=str(value.get("id", "")),
            prompt=str(value.get("prompt", "")),
            reward_arguments=dict(value.get("reward_arguments", {})),
            reset_arguments=dict(value.get("reset_arguments", {})),
        )


@dataclass(frozen=True)
class ToolCall:
    """A well-formed action."""

    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class InvalidAction:
    """Why an action is not a tool call (shown to the agent as the observation)."""

    reason: str


def parse_action(action: Any) -> ToolCall | InvalidAction:
    """A :class:`ToolCall` from a JSON string or a dict shaped ``{"tool", "arguments"}``.

    ``arguments`` is optional (default ``{}``) and may itself be a JSON string (as OpenAI tool
    calls carry it). Anything else is an :class:`InvalidAction` saying what is wrong.
    """
    if isinstance(action, str | bytes):
        try:
            action = json.loads(action)
        except ValueError as exc:
            return InvalidAction(f"the action is not JSON ({exc})")
    if not isinstance(action, Mapping):
        return InvalidAction(f"the action must be a JSON object, got {type(action).__name__}")
    unknown = sorted(str(k) for k in set(action) - set(_ACTION_KEYS))
    if unknown:
        hint = did_you_mean(unknown[0], _ACTION_KEYS)
        return InvalidAction(f"unknown key(s) {unknown} in the action{hint}")
    tool = action.get("tool")
    if not isinstance(tool, str) or not tool:
        return InvalidAction('the action needs "tool": the name of a tool, as a string')
    arguments = action.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return InvalidAction(f'"arguments" of `{tool}` is not JSON ({exc})')
    if not isinstance(arguments, Mapping):
        return InvalidAction(f'"arguments" of `{tool}` must be an object')
    return ToolCall(tool, dict(arguments))


@dataclass(frozen=True)
class EpisodeConfig:
    """The knobs of the episode protocol (see :mod:`rollout.gym`)."""

    tasks: tuple[Task, ...] = ()
    max_steps: int = 50
    submit_tool: str = "submit"
    reset_mode: ResetMode = ResetMode.AUTO

    def __post_init__(self) -> None:
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ConfigurationError(f"max_steps must be a positive int, got {self.max_steps!r}")
        if not self.submit_tool:
            raise ConfigurationError("submit_tool must be a non-empty tool name")


class Episode:
    """One environment's episodes, one after another, on instances from ``source``.

    Not thread-safe: one caller (one event loop) at a time.
    """

    def __init__(self, source: InstanceSource, config: EpisodeConfig) -> None:
        self.source = source
        self.config = config
        self.instance: InstanceHandle | None = None
        self.task = Task()
        self.steps = 0
        self.is_over = True  # no episode yet: step() needs a reset() first
        self._has_reset_function: bool | None = None  # unknown until an instance answers
        self._tools: tuple[str, ...] | None = None  # plain names; the same for every instance

    @property
    def tools(self) -> tuple[str, ...]:
        """The environment's tool names (known after the first reset)."""
        return self._tools or ()

    async def reset(
        self, rng: Generator, options: Mapping[str, Any] | None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first observation (the task's prompt) and info."""
        task = self._pick_task(rng, options or {})
        seed = int(rng.integers(_SEED_BOUND))
        if self.instance is not None and (
            self.config.reset_mode is ResetMode.FRESH_INSTANCE or not self._has_reset_function
        ):
            await self._drop_instance()
        if self.instance is None:
            self.instance = await self.source.acquire()
        if self._tools is None:
            listed = await self.instance.list_tools()
            self._tools = tuple(str(t["name"]).rsplit("/", 1)[-1] for t in listed)
        await self._call_reset_function(self.instance, seed, task)
        self.task, self.steps, self.is_over = task, 0, False
        return task.prompt, {"task_id": task.id}

    def _pick_task(self, rng: Generator, options: Mapping[str, Any]) -> Task:
        unknown = sorted(set(options) - set(_OPTION_KEYS))
        if unknown:
            raise ConfigurationError(
                f"unknown reset option(s) {unknown}{did_you_mean(unknown[0], _OPTION_KEYS)}; "
                f"options are {list(_OPTION_KEYS)}"
            )
        tasks = self.config.tasks
        index = int(rng.integers(len(tasks))) if tasks else None  # drawn even when overridden
        chosen = options.get("task")
        if chosen is None:
            return tasks[index] if index is not None else Task()
        if isinstance(chosen, int) and not isinstance(chosen, bool):
            if not 0 <= chosen < len(tasks):
                raise ConfigurationError(
                    f"options['task'] = {chosen} but `{self.source.label}` has {len(tasks)} "
                    "task(s); pass an index below that, or the task itself"
                )
            return tasks[chosen]
        return Task.coerce(chosen)

    async def _call_reset_function(self, instance: InstanceHandle, seed: int, task: Task) -> None:
        if self._has_reset_function is False:
            self._no_reset_arguments(task)
            return
        try:
            await instance.call_function("reset", {"seed": seed, **task.reset_arguments})
        except FunctionNotFoundError:
            self._has_reset_function = False
            self._no_reset_arguments(task)
        else:
            self._has_reset_function = True

    def _no_reset_arguments(self, task: Task) -> None:
        if task.reset_arguments:
            raise ConfigurationError(
                f"task `{task.id}` has reset_arguments but `{self.source.label}` registers no "
                "`reset` function to take them"
            )

    async def step(self, action: Any) -> StepResult:
        """Apply one action; the reward is 0.0 except on the episode's last step."""
        if self.instance is None or self.is_over:
            why = "the episode has ended" if self.instance else "no episode has started"
            raise ResetNeededError(
                f"`{self.source.label}`: {why}; call reset() before step()",
                env_name=self.source.label,
            )
        self.steps += 1
        call = parse_action(action)
        terminated = False
        if isinstance(call, InvalidAction):
            observation = (
                f"invalid action: {call.reason}. An action is {ACTION_SHAPE}{self._listing()}"
            )
            info = {"tool": "", "is_error": True, "error_kind": "invalid_action"}
        elif call.tool == self.config.submit_tool and call.tool not in self.tools:
            observation, terminated = "", True
            info = {"tool": call.tool, "is_error": False, "error_kind": ""}
        else:
            result = await self.instance.call_tool(call.tool, call.arguments)
            observation = result.text
            kind = result.error_kind.value if result.error_kind is not None else ""
            info = {"tool": call.tool, "is_error": result.is_error, "error_kind": kind}
            terminated = call.tool == self.config.submit_tool or _signals_done(result)
        truncated = not terminated and self.steps >= self.config.max_steps
        reward = 0.0
        if terminated or truncated:
            self.is_over = True
            number, components = await self._reward(self.instance)
            reward = 0.0 if number is None else number
            info = {**info, "scored": number is not None, "reward_components": components}
        return observation, reward, terminated, truncated, info

    def _listing(self) -> str:
        names = [*self.tools, self.config.submit_tool] if self.tools else []
        return f"; tools: {', '.join(dict.fromkeys(names))}" if names else ""

    async def _reward(self, instance: InstanceHandle) -> tuple[float | None, dict[str, Any] | None]:
        """``(reward, components)`` of the episode (:func:`rollout.rewards.split_reward`: every
        form ``aenv rollout`` takes); ``None``: the environment does not score it.

        A task without ``reward_arguments`` (no tasks given: the empty task) asks the reward
        with none; a reward that needs some (or no reward at all) leaves the episode unscored
        (``None``) instead of failing it. A task's own arguments refused raise.
        """
        try:
            value = await instance.call_reward(dict(self.task.reward_arguments))
        except FunctionError as exc:
            unanswerable = isinstance(exc, FunctionNotFoundError) or (
                exc.kind is FunctionErrorKind.INVALID_ARGUMENTS
                or exc.error_type == FunctionErrorKind.INVALID_ARGUMENTS.value
            )
            if self.task.reward_arguments or not unanswerable:
                raise
            return None, None
        try:
            return split_reward(value)
        except ValueError as exc:
            raise FunctionError(
                f"`{self.source.label}`: {exc}; fix the reward",
                function="reward",
                error_type="invalid_reward",
                instance_id=instance.instance_id,
            ) from None

    async def _drop_instance(self) -> None:
        instance, self.instance = self.instance, None
        self.is_over = True
        if instance is not None:
            await self.source.release(instance)

    async def aclose(self) -> None:
        """Release the instance. Idempotent."""
        await self._drop_instance()


def _signals_done(result: ToolResult) -> bool:
    """A tool ends the episode by returning a JSON object with ``"done": true``."""
    return isinstance(result.structured, dict) and result.structured.get("done") is True


class ResetNeededError(AEnvError, gymnasium.error.ResetNeeded):
    """step() before reset(), or after the episode ended: call reset() first.

    Both an :class:`~aenv_ray.errors.AEnvError` and gymnasium's ``ResetNeeded``.
    """
