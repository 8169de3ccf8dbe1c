"""One tau2 episode in an instance: the orchestrator's bookkeeping around the library's state.

An :class:`Episode` is tau2's ``Orchestrator`` with the agent outside: the agent's tool calls,
its messages to the user and its stop arrive as calls; the user (an LLM or a script, see
:mod:`_tau2_user`) answers inside. It keeps the trajectory the instance saw (the chat shape of
:mod:`builtin_envs.tau2.messages`, graded by the library's evaluator), counts steps and errors
as the orchestrator does (each message one step; ``max_steps`` and ``max_errors`` end the
episode when the turn is not the environment's), and says how the episode ended.

:class:`Settings` are the episode's choices: from ``TAU2_*`` variables at creation, overridden
by ``tau2_reset``'s arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from _tau2_user import STOP_TOKENS, LLMUser, ScriptedUser, UserReply, is_stop, user_system_prompt

from aenv_ray import ToolResult
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import ToolErrorKind
from builtin_envs.tau2 import get_domain
from builtin_envs.tau2.data import data_dir
from builtin_envs.tau2.domain import Domain
from builtin_envs.tau2.environment import Tau2Environment
from builtin_envs.tau2.evaluator import COUNTING_TERMINATIONS, grade
from builtin_envs.tau2.messages import parse_messages
from builtin_envs.tau2.tasks import Task

__all__ = [
    "DONE_SCHEMA",
    "GREETING",
    "Episode",
    "Settings",
    "system_prompt",
]

GREETING = "Hi! How can I help you today?"
STOP = STOP_TOKENS[0]
DONE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "done",
        "description": "Call this function when you are done with the task.",
        "parameters": {"properties": {}, "title": "parameters", "type": "object"},
    },
}
USER_MODES = ("llm", "scripted", "none")

_AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()

_SOLO_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
You will be provided with a ticket that contains the user's request.
You will need to plan and call the appropriate tools to solve the ticket.

You cannot communicate with the user, only make tool calls.
Stop when you consider that you have solved the ticket.
To do so, send a message containing a single tool call to the `done` tool. Do not include any other tool calls in this last message.

Always follow the policy. Always make sure you generate valid JSON only.
""".strip()  # noqa: E501  (tau2's text, line for line)


def system_prompt(policy: str, solo_mode: bool, ticket: str | None) -> str:
    """tau2's agent system prompt: ``LLMAgent``'s, or ``LLMSoloAgent``'s with the ticket."""
    prompt = f"<instructions>\n{_SOLO_INSTRUCTION if solo_mode else _AGENT_INSTRUCTION}\n"
    prompt += f"</instructions>\n<policy>\n{policy}\n</policy>"
    if solo_mode:
        prompt += f"\n<ticket>\n{ticket}\n</ticket>"
    return prompt


def _flag(value: str | None, name: str) -> bool | None:
    if value is None or value == "":
        return None
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name}={value!r} is not a boolean: use true or false")


def _number(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(f"{name}={value!r} is not an integer") from None
    if number <= 0:
        raise ConfigurationError(f"{name}={value!r} must be positive")
    return number


@dataclass(frozen=True)
class Settings:
    """What an episode runs: domain, task, mode, user, limits. The API key stays out of repr."""

    domain: str = "airline"
    task_id: str | None = None
    split: str | None = "base"
    solo_mode: bool = False
    user_mode: str | None = None  # None: "llm" when a user model is set, else "scripted"
    user_script: tuple[Any, ...] | None = None
    max_steps: int = 100
    max_errors: int = 10
    user_llm: str | None = None
    user_llm_api_base: str | None = None
    user_llm_api_key: str | None = field(default=None, repr=False)
    user_llm_args: dict[str, Any] | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings the ``TAU2_*`` variables give (unset ones keep their defaults)."""
        given: dict[str, Any] = {}
        if environ.get("TAU2_DOMAIN"):
            given["domain"] = environ["TAU2_DOMAIN"]
        if environ.get("TAU2_TASK_ID"):
            given["task_id"] = environ["TAU2_TASK_ID"]
        if "TAU2_SPLIT" in environ:
            given["split"] = environ["TAU2_SPLIT"] or None
        solo = _flag(environ.get("TAU2_SOLO_MODE"), "TAU2_SOLO_MODE")
        if solo is not None:
            given["solo_mode"] = solo
        if environ.get("TAU2_USER_MODE"):
            given["user_mode"] = environ["TAU2_USER_MODE"]
        if environ.get("TAU2_USER_SCRIPT"):
            given["user_script"] = tuple(_json(environ["TAU2_USER_SCRIPT"], "TAU2_USER_SCRIPT"))
        for key, name in (("max_steps", "TAU2_MAX_STEPS"), ("max_errors", "TAU2_MAX_ERRORS")):
            number = _number(environ.get(name), name)
            if number is not None:
                given[key] = number
        for key in ("user_llm", "user_llm_api_base", "user_llm_api_key"):
            value = environ.get(f"TAU2_{key.upper()}")
            if value:
                given[key] = value
        if environ.get("TAU2_USER_LLM_ARGS"):
            args = _json(environ["TAU2_USER_LLM_ARGS"], "TAU2_USER_LLM_ARGS")
            if not isinstance(args, dict):
                raise ConfigurationError("TAU2_USER_LLM_ARGS must be a JSON object")
            given["user_llm_args"] = args
        return cls(**given)

    def with_changes(self, **changes: Any) -> Settings:
        """These settings with the given (non-None) values replaced."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def effective_user_mode(self) -> str:
        """``none`` in solo mode; else as set, ``llm`` with a user model, else ``scripted``."""
        if self.solo_mode:
            return "none"
        if self.user_mode is not None:
            return self.user_mode
        return "llm" if self.user_llm else "scripted"

    def public(self) -> dict[str, Any]:
        """The settings as a status shows them: whether a key is set, never the key."""
        return {
            "domain": self.domain,
            "task_id": self.task_id,
            "split": self.split,
            "solo_mode": self.solo_mode,
            "user_mode": self.effective_user_mode,
            "max_steps": self.max_steps,
            "max_errors": self.max_errors,
            "user_llm": self.user_llm,
            "user_llm_api_base": self.user_llm_api_base,
            "user_llm_api_key_set": bool(self.user_llm_api_key),
        }


def _json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{name} is not valid JSON ({exc})") from None


def _text_result(text: str, error: bool) -> ToolResult:
    kind = ToolErrorKind.EXECUTION if error else None
    return ToolResult(content=[{"type": "text", "text": text}], is_error=error, error_kind=kind)


class Episode:
    """One task's episode: its environment, its user, its trajectory, how it ended."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        domain: Domain = get_domain(settings.domain)
        self.domain = domain
        if settings.solo_mode and not domain.supports_solo:
            raise ConfigurationError(
                f"tau2 domain {domain.name!r} has no solo mode (solo mode needs tickets: telecom)"
            )
        task_ids = domain.task_ids(settings.split)
        task_id = settings.task_id if settings.task_id is not None else next(iter(task_ids), None)
        if task_id is None:
            raise ConfigurationError(
                f"tau2 domain {domain.name!r} has no task in split {settings.split!r}"
            )
        task: Task = domain.task(str(task_id))
        if settings.split is not None and task.id not in task_ids:
            raise ConfigurationError(
                f"task {task.id!r} of tau2 domain {domain.name!r} is not in split "
                f"{settings.split!r}; pass split=None (TAU2_SPLIT='') for every task"
            )
        if settings.solo_mode and task.ticket is None:
            raise ConfigurationError(
                f"task {task.id!r} of tau2 domain {domain.name!r} has no ticket: it cannot run "
                "in solo mode"
            )
        mode = settings.effective_user_mode
        if mode not in USER_MODES:
            raise ConfigurationError(
                f"user mode {mode!r} unknown: use one of {', '.join(USER_MODES)}"
            )
        if mode == "llm" and not (settings.user_llm and settings.user_llm_api_base):
            raise ConfigurationError(
                "user mode 'llm' needs TAU2_USER_LLM (the model) and TAU2_USER_LLM_API_BASE "
                "(an OpenAI-compatible endpoint)"
            )
        self.task = task
        self.settings = settings.with_changes(task_id=task.id)
        self.env: Tau2Environment = domain.initial_environment(task, settings.solo_mode)
        self.messages: list[dict[str, Any]] = []
        self.step_count = 0
        self.num_errors = 0
        self.done = False
        self.termination_reason: str | None = None
        self.last_observation = ""
        self._calls = 0
        self._opened = False
        self._user: LLMUser | ScriptedUser | None = None
        if mode == "llm":
            self._user = LLMUser(
                model=str(settings.user_llm),
                api_base=str(settings.user_llm_api_base),
                api_key=settings.user_llm_api_key,
                system_prompt=self.user_system_prompt(),
                tools=self.user_tool_schemas(),
                llm_args=dict(settings.user_llm_args or {"temperature": 0.0}),
            )
        elif mode == "scripted":
            self._user = ScriptedUser.for_scenario(task.user_scenario, settings.user_script)
        self._history = (
            [dict(m) for m in (task.initial_state.message_history or [])]
            if (task.initial_state is not None)
            else []
        )

    # -- what the agent sees ---------------------------------------------------------------------

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The agent's tools (tau2's ``openai_schema``, in tau2's order; solo: the user's tools
        and ``done`` too)."""
        schemas = type(self.env.tools).openai_schemas()
        if self.settings.solo_mode:
            if self.env.user_tools is not None:
                schemas += type(self.env.user_tools).openai_schemas()
            schemas.append(json.loads(json.dumps(DONE_SCHEMA)))
        return schemas

    def user_tool_schemas(self) -> list[dict[str, Any]] | None:
        """The user's tools (telecom), or None."""
        if self.env.user_tools is None:
            return None
        return type(self.env.user_tools).openai_schemas()

    def system_prompt(self) -> str:
        """tau2's agent system prompt for this domain and mode."""
        return system_prompt(self.env.policy, self.settings.solo_mode, self.task.ticket)

    def user_system_prompt(self) -> str:
        """tau2's user-simulator system prompt for this task."""
        return user_system_prompt(
            data_dir() / "user_simulator",
            self.task.user_scenario,
            with_tools=self.env.user_tools is not None,
        )

    # -- the orchestrator's bookkeeping ---------------------------------------------------------

    def _step(self, to_environment: bool = False) -> None:
        self.step_count += 1
        if to_environment:
            return
        if self.step_count >= self.settings.max_steps:
            self.done, self.termination_reason = True, "max_steps"
        if self.num_errors >= self.settings.max_errors:
            self.done, self.termination_reason = True, "too_many_errors"

    def _record(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def open(self) -> None:
        """Start the conversation as the orchestrator does (once): the task's message history,
        or the agent's greeting and the user's first message (solo: nothing)."""
        if self._opened:
            return
        self._opened = True
        if self._history:
            self.messages.extend(self._history)
            last = self._history[-1]
            content = last.get("content")
            self.last_observation = content if isinstance(content, str) else ""
            if last.get("role") == "assistant" and last.get("tool_calls") is None:
                self._user_turn()
            elif last.get("role") == "user" and is_stop(content):
                self.done, self.termination_reason = True, "user_stop"
            return
        if self.settings.solo_mode:
            return
        self._record({"role": "assistant", "content": GREETING})
        self._user_turn()

    def _user_turn(self) -> None:
        """The user answers (calling its own tools as often as it likes) until it says something."""
        if self._user is None:  # user mode "none": the caller plays the user
            return
        while not self.done:
            reply: UserReply = self._user.reply(self.messages)
            if reply.tool_calls:
                self._user_tool_calls(reply)
                continue
            text = reply.content or ""
            self._record({"role": "user", "content": text})
            self.last_observation = text
            if is_stop(text):
                self.done, self.termination_reason = True, "user_stop"
            self._step()
            return

    def _user_tool_calls(self, reply: UserReply) -> None:
        calls = reply.tool_calls or []
        for call in calls:
            call.setdefault("id", self._next_id("user_call"))
            if not call["id"]:
                call["id"] = self._next_id("user_call")
        self._record({"role": "user", "content": reply.content, "tool_calls": calls})
        self._step(to_environment=True)
        for call in calls:
            result = self.env.respond(
                call["name"], call["arguments"], requestor="user", call_id=call["id"]
            )
            if result.error:
                self.num_errors += 1
            self._record(
                {
                    "role": "tool",
                    "id": call["id"],
                    "requestor": "user",
                    "content": result.content,
                    "error": result.error,
                }
            )
        self._step()  # back to the user

    def _next_id(self, prefix: str) -> str:
        self._calls += 1
        return f"{prefix}_{self._calls}"

    def _over(self) -> str:
        return (
            f"the tau2 episode (domain {self.settings.domain!r}, task {self.task.id!r}) is over "
            f"({self.termination_reason}); call tau2_reset to start another"
        )

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """The agent calls tool ``name``: tau2's output string, with its error flag."""
        self.open()
        if self.done:
            return _text_result(f"Error: {self._over()}", True)
        call_id = self._next_id("call")
        if self.settings.solo_mode and name == "done":  # the solo agent's stop
            self._record({"role": "assistant", "content": STOP})
            self.done, self.termination_reason = True, "agent_stop"
            self._step()
            self.last_observation = STOP
            return _text_result(STOP, False)
        self._record(
            {
                "role": "assistant",
                "tool_calls": [{"id": call_id, "name": name, "arguments": dict(arguments)}],
            }
        )
        self._step(to_environment=True)
        result = self.env.respond(name, arguments, requestor="assistant", call_id=call_id)
        if result.error:
            self.num_errors += 1
        content = result.content if result.content is not None else "null"
        self._record(
            {
                "role": "tool",
                "id": call_id,
                "requestor": "assistant",
                "content": result.content,
                "error": result.error,
            }
        )
        self.last_observation = content
        self._step()
        return _text_result(content, result.error)

    def send_message(self, text: str) -> dict[str, Any]:
        """The agent says ``text`` to the user; the user answers (unless the episode ends)."""
        self.open()
        if self.done:
            raise ConfigurationError(self._over())
        self._record({"role": "assistant", "content": text})
        if STOP in text:
            self.done, self.termination_reason = True, "agent_stop"
        elif self.settings.solo_mode:  # the orchestrator: a solo agent may only call tools
            self.done, self.termination_reason = True, "agent_error"
        self._step()
        if not self.done:
            self._user_turn()
        return self.observation()

    def user_says(self, text: str) -> dict[str, Any]:
        """User mode ``none``: the caller speaks for the user."""
        self.open()
        if self.done:
            raise ConfigurationError(self._over())
        self._record({"role": "user", "content": text})
        self.last_observation = text
        if is_stop(text):
            self.done, self.termination_reason = True, "user_stop"
        self._step()
        return self.observation()

    def stop(self) -> dict[str, Any]:
        """The agent ends the episode (``agent_stop``), as tau2's stop token does."""
        self.open()
        if not self.done:
            self._record({"role": "assistant", "content": STOP})
            self.done, self.termination_reason = True, "agent_stop"
            self._step()
        return self.observation()

    def observation(self) -> dict[str, Any]:
        """What the agent needs next: the last observation, done, and why it ended."""
        return {
            "observation": self.last_observation,
            "done": self.done,
            "termination_reason": self.termination_reason,
            "step": self.step_count,
        }

    def status(self, hashes: bool = True) -> dict[str, Any]:
        """The episode's state (database hashes as tau2 computes them, when asked)."""
        self.open()
        out: dict[str, Any] = {
            **self.settings.public(),
            "done": self.done,
            "termination_reason": self.termination_reason,
            "last_observation": self.last_observation,
            "step": self.step_count,
            "num_errors": self.num_errors,
            "messages": len(self.messages),
        }
        if hashes:
            out["db_hash"] = self.env.get_db_hash()
            out["user_db_hash"] = self.env.get_user_db_hash()
        return out

    def reward(self) -> dict[str, Any]:
        """The original evaluator's reward of this trajectory, with its components, and what
        grades it again offline (``aenv tau2 grade`` reads a rollout's records): ``domain``,
        ``task_id``, ``solo_mode`` and the ``trajectory`` (:meth:`trajectory`)."""
        self.open()
        graded = {
            "domain": self.domain.name,
            "task_id": self.task.id,
            "solo_mode": self.settings.solo_mode,
            "trajectory": self.trajectory(),
        }
        return {**self._reward(), **graded}

    def _reward(self) -> dict[str, Any]:
        reason = self.termination_reason
        if not self.done or reason is None:
            return {
                "reward": 0.0,
                "total_reward": 0.0,
                "components": {},
                "reward_basis": self._basis(),
                "termination_reason": None,
                "done": False,
                "info": {
                    "note": "the episode is not over: end it (tau2_done, or the user's stop) "
                    "before asking its reward"
                },
            }
        result = grade(
            self.domain.name,
            self.task.id,
            parse_messages(self.messages),
            reason,
            solo_mode=self.settings.solo_mode,
        )
        if reason not in COUNTING_TERMINATIONS and result.get("reward_basis") is None:
            result["reward_basis"] = self._basis()
        # total_reward: AEnvironment's tau2-env name for the episode's reward (its agents read it)
        total = result.get("reward", 0.0)
        return {**result, "total_reward": total, "done": True, "steps": self.step_count}

    def _basis(self) -> list[str] | None:
        criteria = self.task.evaluation_criteria
        return None if criteria is None else [b.value for b in criteria.reward_basis]

    def trajectory(self) -> list[dict[str, Any]]:
        """The messages of the episode so far, in the chat shape ``grade`` reads."""
        self.open()
        return [dict(m) for m in self.messages]


def task_summary(episode: Episode, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``tau2_get_task_info``: the task as the agent may know it (not the user's scenario)."""
    task = episode.task
    policy = episode.env.policy
    return {
        **episode.settings.public(),
        "ticket": task.ticket,
        "tools": [t["function"]["name"] for t in tools],
        "policy_preview": policy[:500] + "..." if len(policy) > 500 else policy,
        "reward_basis": episode._basis(),
        "initial_messages": len(episode._history),
    }
