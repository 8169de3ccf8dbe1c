"""Batch trajectory synthesis: tasks x policy -> trajectories on disk, resumable.

An *episode* takes one task, gets a fresh instance, runs the policy against it, asks the
environment's reward and records everything (:class:`~rollout.trajectories.Trajectory`): the
whole conversation in the OpenAI chat shape, every tool call with its arguments, result and
timings, each model turn's token usage and log-probabilities, the reward and its components,
the policy and its settings, and how the episode ended (:class:`~rollout.failures.
EpisodeOutcome`). A programming error of the policy (:func:`rollout.failures.
is_programming_error`) or a reward or setup call the environment refuses stops the run instead.
Retryable failures (:func:`rollout.failures.is_retryable`: an instance that broke, went silent
or could not be reached or created) are retried on a fresh instance up to ``max_retries``;
every other failure is recorded once, with its reason. No episode is lost or doubled: each
one ends as one line of ``trajectories.jsonl``, written and synced as it finishes, by the one
driver that holds the directory's lock (:mod:`rollout.run_directory`), and
``trajectories.parquet`` is rewritten from it at the end (the same rows:
:func:`read_trajectories` reads either). A rerun into the
same directory skips the episodes already recorded (``retry_failed=True``: all but the failed
ones) and reruns the one whose line a killed driver left torn.

    summary = run_synthesis("mini-terminal@1.0.0", episodes=8, concurrency=4, out="runs/a")
    summary.outcomes
    # {'ok': 8}

A **policy** is ``async def policy(task: dict, env: AgentEnv) -> str | None``: it calls tools
through ``env`` (recorded) and may return a final answer. Without one, the environment's scripted
demo policy is used (built-in environments ship one: ``builtin_envs.demos.<env>``), or an
:class:`OpenAIPolicy` talks to any OpenAI-compatible chat-completions endpoint.

May import: ``aenv_ray``, ``rollout``, aiohttp (the OpenAI-compatible policy), httpx (lazily:
the errors of an httpx client the policy is given), pyarrow (Parquet output); lazily, inside
functions: ``builtin_envs`` (demo tasks and policies). Must not import:
kubernetes (engines are injected).

A **task** is a dict: ``id`` (default: its position), ``prompt`` (what an agent is told),
``setup`` (optional list of ``{"function": NAME, "arguments": {...}}`` called before the
policy), ``reward_arguments`` (the arguments of the environment's reward; absent: no reward
call); other keys are the policy's own. The policy is given the task without its
``reward_arguments`` and without any reference solution (``solution``, ``patch``, ...); the
record keeps the ``reward_arguments``, never a reference solution
(:mod:`rollout.task_view`). ``id``, ``prompt`` and ``reward_arguments`` mean the same in
:class:`rollout.gym.Task`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aenv_ray import ToolResult
from aenv_ray.errors import (
    AEnvError,
    AEnvTimeoutError,
    CapacityError,
    ConfigurationError,
    EnvironmentNotFoundError,
    FunctionError,
    FunctionErrorKind,
    FunctionNotFoundError,
)
from aenv_ray.extras import install_hint, missing_modules, require_extra
from aenv_ray.openai_tools import to_openai_tools
from aenv_ray.retry import Backoff, aretry
from aenv_ray.settings import get_settings
from rollout import records
from rollout._endpoint import ContextFull, context_full, error_message, refusal_advice
from rollout.failures import (
    EpisodeOutcome,
    ModelEndpointDownError,
    ModelEndpointError,
    PolicyCodeError,
    TaskCallError,
    classify,
    is_programming_error,
    is_retryable,
)
from rollout.rewards import split_reward
from rollout.run_directory import JSONL, RunDirectory, TornRecord, read_records
from rollout.sources import InstanceHandle, InstanceSource, SDKSource
from rollout.task_view import policy_view, record_view
from rollout.trajectories import (
    Step,
    ToolNaming,
    Trajectory,
    Turn,
    conversation_from_steps,
    sum_usage,
    usage_of,
)

__all__ = [
    "AgentEnv",
    "Dialogue",
    "OpenAIPolicy",
    "Policy",
    "Step",
    "SynthesisSummary",
    "Trajectory",
    "Turn",
    "check_data",
    "check_demo",
    "demo_dialogue",
    "demo_policy",
    "describe_policy",
    "load_policy",
    "load_tasks",
    "pending_episodes",
    "play_episode",
    "read_trajectories",
    "require_demo",
    "run_synthesis",
    "synthesize",
]

log = logging.getLogger("rollout.synthesis")

PARQUET = "trajectories.parquet"


# -- what a policy sees ------------------------------------------------------------------------
class AgentEnv:
    """The instance as a policy sees it: every tool call is recorded as a :class:`Step`.

    A policy that talks to a model keeps the conversation here too: :meth:`add_message` for
    the messages it sends, :meth:`add_turn` for each reply of the model (with its usage,
    log-probabilities and token ids), all as the model saw them (the tool names it was offered:
    the record keeps them, and the map to the environment's beside them). A policy that keeps
    none gets a conversation built from its tool calls.

    A policy that stops at a cap of its own (turns, tokens) before the agent finished sets
    :attr:`truncated`: the record says so (``truncated``, gymnasium's sense: cut, not ended).
    """

    def __init__(
        self,
        instance: InstanceHandle,
        env_name: str,
        task: dict[str, Any],
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.instance = instance
        self.env_name = env_name
        self.task = task
        self.steps: list[Step] = []
        self.messages: list[dict[str, Any]] = []
        self.turns: list[Turn] = []
        self._tools = tools
        self.offered: list[dict[str, Any]] | None = None  # what list_openai_tools gave
        self.naming = ToolNaming(tools or [])
        self.truncated = False
        self._started = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the episode started (what :meth:`add_turn` takes as ``started``)."""
        return time.perf_counter() - self._started

    async def list_tools(self) -> list[dict[str, Any]]:
        """The tools, as ``{"name": "env@version/tool", "description", "inputSchema"}`` dicts."""
        if self._tools is None:
            self._tools = await self.instance.list_tools()
            self.naming = ToolNaming(self._tools)
        return [dict(tool) for tool in self._tools]

    async def list_openai_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI chat-completions form (names ``^[a-zA-Z0-9_-]{1,64}$``): the
        record's ``tools``, the tools the model was offered."""
        tools = await self.list_tools()
        self.offered = to_openai_tools(self.naming.env_ref or self.env_name, tools)
        return [dict(tool) for tool in self.offered]

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        tool_call_id: str | None = None,
    ) -> ToolResult:
        """Call a tool by plain, real (``env@version/tool``) or OpenAI name; tool-level errors
        come back as ``is_error`` results (recorded). ``tool_call_id``: the id of the model's
        tool call this answers, kept with the step."""
        if arguments is not None and not isinstance(arguments, Mapping):
            raise TypeError(
                f"env.call_tool({name!r}, arguments): arguments must be a dict, "
                f"got {type(arguments).__name__}"
            )
        arguments = dict(arguments or {})
        began = time.perf_counter()
        result = await self.instance.call_tool(name, arguments)
        self.steps.append(
            Step(
                tool=self.naming.real(name),
                arguments=arguments,
                text=result.text,
                is_error=result.is_error,
                started=round(began - self._started, 6),
                seconds=round(time.perf_counter() - began, 6),
                structured=_jsonable(result.structured),
                tool_call_id=tool_call_id,
            )
        )
        return result

    async def call_function(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        """Call one of the environment's functions (not recorded as a step)."""
        return await self.instance.call_function(name, dict(arguments or {}))

    def add_message(self, message: Mapping[str, Any]) -> None:
        """Add a message the policy sent or received (system, user, ``role: tool``) to the
        recorded conversation."""
        self.messages.append(_jsonable(dict(message)))

    def add_turn(
        self,
        message: Mapping[str, Any],
        *,
        started: float,
        usage: Mapping[str, Any] | None = None,
        logprobs: Any = None,
        finish_reason: str | None = None,
        prompt_token_ids: list[int] | None = None,
        token_ids: list[int] | None = None,
    ) -> None:
        """Add the assistant ``message`` a model replied, asked at :meth:`elapsed` ``started``,
        with the reply's ``usage``, the choice's ``logprobs`` (as the endpoint returned them:
        ``{"content": [...]}``) and ``finish_reason``, and the token ids of the prompt and of
        the completion where the server returned them (:func:`rollout.records.token_ids_of`)."""
        self.add_message(message)
        self.turns.append(
            Turn(
                message_index=len(self.messages) - 1,
                started=round(started, 6),
                seconds=round(self.elapsed() - started, 6),
                usage=usage_of(usage),
                logprobs=records.stored_logprobs(logprobs),
                finish_reason=finish_reason if isinstance(finish_reason, str) else None,
                prompt_token_ids=None if prompt_token_ids is None else list(prompt_token_ids),
                token_ids=None if token_ids is None else list(token_ids),
            )
        )


Policy = Callable[[dict[str, Any], AgentEnv], Awaitable[str | None]]


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


# -- policies ----------------------------------------------------------------------------------
def load_policy(spec: str) -> Policy:
    """``"package.module:callable"`` -> the callable (a :data:`Policy`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"a policy is MODULE:CALLABLE, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import policy module {module_name!r}: {exc}") from exc
    policy = getattr(module, attribute, None)
    if not callable(policy):
        raise ConfigurationError(f"{module_name} has no callable {attribute!r}")
    return policy  # type: ignore[no-any-return]


_POLICY_OPTIONS = "--policy MODULE:CALLABLE (or --base-url/--model)"
_TASKS_OPTION = "--tasks FILE"


def _demo_module(env_name: str, missing: str = f"{_POLICY_OPTIONS} and {_TASKS_OPTION}") -> Any:
    """The demo module of the built-in ``env_name``; for any other environment a
    :class:`ConfigurationError` that says to pass ``missing`` instead (what the run lacks)."""
    from builtin_envs import builtin_path

    project = "/" in env_name or env_name.startswith(".")  # a project's directory
    path = None if project else builtin_path(env_name)
    if path is None:
        if not project and not get_settings().system_url:
            from aenv_ray.resolve import resolve_environment

            resolve_environment(env_name, None)  # an unknown name: say so, with the closest
        raise ConfigurationError(
            f"{env_name} is not a built-in environment, so it has no demo policy or tasks: "
            f"pass {missing}"
        )
    try:
        return importlib.import_module(f"builtin_envs.demos.{path.name}")
    except ImportError as exc:
        raise ConfigurationError(f"{env_name} ships no demo policy ({exc})") from exc


def demo_policy(env_name: str) -> Policy:
    """The scripted demo policy a built-in environment ships (``builtin_envs.demos``)."""
    return _demo_module(env_name, _POLICY_OPTIONS).policy  # type: ignore[no-any-return]


def require_demo(env_name: str, *, tasks: bool, policy: bool) -> None:
    """A run that takes its ``tasks`` and/or its ``policy`` from ``env_name``'s demo can: the
    environment is a built-in. Else a :class:`ConfigurationError` names the options to pass
    instead, those of what is missing only (``--tasks`` given: ``--policy`` alone).

    >>> require_demo("mini-terminal", tasks=True, policy=True)  # a built-in: both are there
    >>> require_demo("./my-project", tasks=False, policy=False)  # given both: nothing needed
    >>> try:
    ...     require_demo("./my-project", tasks=False, policy=True)
    ... except ConfigurationError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    pass --policy MODULE:CALLABLE (or --base-url/--model)
    """
    wanted = [
        option for option, needed in ((_POLICY_OPTIONS, policy), (_TASKS_OPTION, tasks)) if needed
    ]
    if wanted:
        _demo_module(env_name, " and ".join(wanted))


def demo_dialogue(env_name: str) -> Dialogue | None:
    """The :class:`Dialogue` a built-in environment with a simulated user ships (its demo
    module's ``DIALOGUE``: tau2's), else ``None``: a model's answer ends its episode."""
    from builtin_envs import builtin_path

    if "/" in env_name or env_name.startswith(".") or builtin_path(env_name) is None:
        return None
    return getattr(_demo_module(env_name), "DIALOGUE", None)


def check_demo(env_name: str, environment_variables: Mapping[str, str]) -> None:
    """The built-in environment's demo can run with these instance variables: a demo module
    that needs some (``builtin_envs.demos.agent``: a model, a hub) says which are missing, as a
    :class:`~aenv_ray.errors.ConfigurationError`."""
    check = getattr(_demo_module(env_name, _POLICY_OPTIONS), "check", None)
    if check is not None:
        check(dict(environment_variables))


def check_data(
    env_name: str,
    tasks: Sequence[Mapping[str, Any]],
    environment_variables: Mapping[str, str],
    datasource: Path | None,
    *,
    given: str | None = None,
) -> None:
    """The data the tasks need is where the instances will look (before any instance starts):
    the variables a built-in names its data with (its demo module's ``DATA_VARIABLES``) name
    paths under the datasource's mount (:func:`rollout.precheck.check_data_paths`), and, with
    the datasource on this machine (``datasource``; None on a hub, ``given`` then), every task
    the tasks start is in it (the demo module's ``check_dataset``). A
    :class:`~aenv_ray.errors.ConfigurationError` names the paths on this machine and in the
    instance."""
    from builtin_envs import builtin_path

    if "/" in env_name or env_name.startswith(".") or builtin_path(env_name) is None:
        return
    from rollout.precheck import check_data_paths

    module = _demo_module(env_name)
    names = getattr(module, "DATA_VARIABLES", ())
    check_data_paths(names, environment_variables, datasource, given=given)
    check = getattr(module, "check_dataset", None)
    if check is not None and (datasource is not None or given is None):
        check([dict(t) for t in tasks], datasource, dict(environment_variables))


def load_tasks(
    path: str | Path | None, env_name: str, *, datasource: Path | None = None
) -> list[dict[str, Any]]:
    """Tasks from a JSON-lines (or JSON list) file, else the tasks of ``datasource`` (a
    built-in's dataset on this machine, when its demo module reads one: ``dataset_tasks``),
    else the built-in environment's demo tasks."""
    if path is None:
        module = _demo_module(env_name, _TASKS_OPTION)
        read = getattr(module, "dataset_tasks", None) if datasource is not None else None
        tasks = read(datasource) if read is not None else list(module.TASKS)
    else:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeError) as exc:  # a directory, unreadable, not text
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise ConfigurationError(
                f"cannot read the tasks file {path}: {reason}; --tasks takes a file of JSON "
                "lines (or a JSON list)"
            ) from None
        try:
            if text.lstrip().startswith("["):
                tasks = json.loads(text)
            else:
                tasks = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{path}: not JSON lines or a JSON list: {exc}") from exc
    if not tasks:
        raise ConfigurationError(f"no tasks for {env_name}")
    normalized = []
    for index, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise ConfigurationError(f"task {index} is not an object: {task!r}")
        normalized.append({**task, "id": str(task.get("id", index))})
    return normalized


class Dialogue(Protocol):
    """The user's side of an episode whose environment simulates the user (tau2's does:
    ``builtin_envs.demos.tau2.DIALOGUE``). :class:`OpenAIPolicy` opens the conversation with
    :meth:`opening` instead of the task's prompt, and hands every text answer of the model to
    :meth:`reply`; the user's reply is the next user message, until it is ``None``."""

    async def opening(self, task: dict[str, Any], env: AgentEnv) -> list[dict[str, Any]]:
        """The messages before the model's first turn: a system prompt, a greeting, the
        user's first message (chat-completions messages)."""
        ...

    async def reply(self, answer: str, task: dict[str, Any], env: AgentEnv) -> str | None:
        """The user's reply to the agent's text ``answer``; ``None`` when the episode is over."""
        ...


class OpenAIPolicy:
    """An agent over any OpenAI-compatible ``/chat/completions`` endpoint, with tools.

    The task's ``prompt`` is the user message (after ``system_prompt``, if any); each tool call
    the model makes is executed and its result sent back, until the model answers without a
    tool call (its answer) or ``max_turns``. With a ``dialogue`` (an environment that simulates
    the user), the conversation opens with the dialogue's messages and each answer goes to the
    user, whose reply continues it, until the dialogue says the episode is over (or
    ``max_turns``); ``system_prompt`` then replaces the opening's system message.
    ``logprobs=True`` asks the endpoint for the log-probabilities of each reply's tokens,
    ``token_ids=True`` for the token ids of each prompt and reply (``return_token_ids``: vLLM
    and SGLang; OpenAI's own API refuses it). Every message as sent and received, and each
    reply's ``usage``, ``logprobs`` and token ids go into the episode's record. An
    episode cut at ``max_turns`` is marked truncated (:attr:`AgentEnv.truncated`).

    The endpoint's failures are not the agent's: a request that gets no answer, or 5xx or 429,
    is sent again up to ``retries`` times (:mod:`aenv_ray.retry`: 0.5 s, 1 s, 2 s, ... at most
    8 s apart; a ``Retry-After`` is honoured), then the episode ends with
    :class:`~rollout.failures.ModelEndpointError` (an ``infrastructure_error``), as it does at
    once on any other 4xx (a wrong key, URL or model, a request the endpoint cannot take: ours
    to fix, not the agent's), its message naming the endpoint, the status and the endpoint's own
    error message. A 4xx saying the conversation is over the model's context (OpenAI's
    ``context_length_exceeded``, vLLM's "maximum context length") ends the episode as a cap
    does: the agent's trajectory so far, marked truncated.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_turns: int = 20,
        temperature: float | None = None,
        system_prompt: str | None = None,
        logprobs: bool = False,
        token_ids: bool = False,
        http_client: Any = None,
        dialogue: Dialogue | None = None,
        retries: int = 5,
    ) -> None:
        if retries < 0:
            raise ConfigurationError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = Backoff(first=0.5, factor=2.0, most=8.0, tries=retries + 1)
        self.dialogue = dialogue
        self.http_client = http_client  # an httpx.AsyncClient to use (AReaL passes one)
        self.model = model
        self.api_key = api_key
        self.max_turns = max_turns
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.logprobs = logprobs
        self.token_ids = token_ids

    def settings(self) -> dict[str, Any]:
        """What a record says of this policy (never the API key)."""
        return {
            "name": "OpenAIPolicy",
            "model": self.model,
            "base_url": self.base_url,
            "system_prompt": self.system_prompt,
            "temperature": self.temperature,
            "max_turns": self.max_turns,
            "logprobs": self.logprobs,
            "token_ids": self.token_ids,
        } | ({} if self.dialogue is None else {"dialogue": type(self.dialogue).__name__})

    async def _opening(self, task: dict[str, Any], env: AgentEnv) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if self.dialogue is None:
            return [*system, {"role": "user", "content": str(task.get("prompt", ""))}]
        opening = [dict(m) for m in await self.dialogue.opening(task, env)]
        if system:
            opening = system + [m for m in opening if m.get("role") != "system"]
        return opening

    async def __call__(self, task: dict[str, Any], env: AgentEnv) -> str | None:
        tools = await env.list_openai_tools()
        messages: list[dict[str, Any]] = []

        def say(message: dict[str, Any]) -> None:
            messages.append(message)
            env.add_message(message)

        for message in await self._opening(task, env):
            say(message)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with contextlib.AsyncExitStack() as stack:
            post = await self._poster(stack, headers)
            for _ in range(self.max_turns):
                body: dict[str, Any] = {"model": self.model, "messages": messages, "tools": tools}
                if self.temperature is not None:
                    body["temperature"] = self.temperature
                if self.logprobs:
                    body["logprobs"] = True
                if self.token_ids:
                    body["return_token_ids"] = True
                started = env.elapsed()
                try:
                    reply = await post(f"{self.base_url}/chat/completions", body)
                except ContextFull as full:  # the model's context, not the agent, ended it
                    log.info(
                        "episode truncated: the conversation is over the model's context",
                        extra={"endpoint": self.base_url, "error": str(full)},
                    )
                    env.truncated = True
                    return None
                choice, message, calls = _read_reply(reply)
                messages.append(message)
                prompt_ids, completion_ids = records.token_ids_of(reply, choice)
                env.add_turn(
                    message,
                    started=started,
                    usage=reply.get("usage"),
                    logprobs=choice.get("logprobs"),
                    finish_reason=choice.get("finish_reason"),
                    prompt_token_ids=prompt_ids,
                    token_ids=completion_ids,
                )
                if not calls:
                    answer = str(message.get("content") or "")
                    if self.dialogue is None:
                        return answer
                    user = await self.dialogue.reply(answer, task, env)
                    if user is None:
                        return answer
                    say({"role": "user", "content": user})
                    continue
                for call in calls:
                    function = call["function"]
                    try:
                        arguments = json.loads(function.get("arguments") or "{}")
                    except (json.JSONDecodeError, TypeError):
                        arguments = None
                    if not isinstance(arguments, dict):
                        content = "error: the arguments must be a JSON object"
                    else:
                        result = await env.call_tool(
                            function["name"], arguments, tool_call_id=call.get("id")
                        )
                        content = result.text
                    say({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
        env.truncated = True  # the turn cap, not the agent, ended it
        return None

    async def _poster(
        self, stack: contextlib.AsyncExitStack, headers: dict[str, str]
    ) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
        """A ``post(url, body) -> reply`` over the given httpx client, or a new aiohttp one,
        retried and its failures told apart (:meth:`_retried`)."""
        if self.http_client is not None:
            import httpx

            client = self.http_client

            async def post_httpx(url: str, body: dict[str, Any]) -> dict[str, Any]:
                response = await client.post(url, json=body, headers=headers)
                if response.status_code != 200:
                    raise _Answered(response.status_code, response.text, response.headers)
                return response.json()  # type: ignore[no-any-return]

            return self._retried(post_httpx, (httpx.TransportError,))
        import aiohttp

        session = await stack.enter_async_context(aiohttp.ClientSession(headers=headers))

        async def post_aiohttp(url: str, body: dict[str, Any]) -> dict[str, Any]:
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    text = await response.text()
                    raise _Answered(response.status, text, response.headers)
                return await response.json()  # type: ignore[no-any-return]

        return self._retried(post_aiohttp, (aiohttp.ClientConnectionError,))

    def _retried(
        self,
        post: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]],
        unanswered: tuple[type[BaseException], ...],
    ) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
        """``post`` sent again while the endpoint does not answer (``unanswered``, a refused or
        lost connection, a timeout) or answers 5xx or 429; then :class:`ModelEndpointError`.
        Another 4xx is that error at once, unless it says the conversation is over the model's
        context (:class:`ContextFull`)."""
        no_answer: tuple[type[BaseException], ...] = (*unanswered, OSError, TimeoutError)

        def transient(exc: Exception) -> bool:
            if isinstance(exc, _Answered):
                return exc.status >= 500 or exc.status == 429
            return isinstance(exc, no_answer)

        def on_retry(exc: Exception, retry: int, pause: float) -> None:
            log.info(  # the run's line, if it comes to that, is the error that stops it
                "model endpoint request retried",
                extra={
                    "endpoint": self.base_url,
                    "retry": retry,
                    "pause": round(pause, 3),
                    "error": _said(exc),
                },
            )

        async def post_retried(url: str, body: dict[str, Any]) -> dict[str, Any]:
            tries = f"{self.retries + 1} tries" if self.retries else "1 try"
            try:
                return await aretry(
                    lambda: post(url, body),
                    self.backoff,
                    retryable=transient,
                    wait_hint=_retry_after,
                    on_retry=on_retry,
                )
            except _Answered as exc:
                said = error_message(exc.text)
                if transient(exc):
                    raise ModelEndpointError(
                        f"the model endpoint {self.base_url} answered {exc.status} ({tries}): "
                        f"{said}",
                        endpoint=self.base_url,
                        status=exc.status,
                        kind=f"HTTP {exc.status}",
                    ) from exc
                if context_full(exc.status, exc.text):
                    raise ContextFull(said) from exc
                raise ModelEndpointError(
                    f"the model endpoint {self.base_url} answered {exc.status}: {said}; "
                    f"{refusal_advice(exc.status)} (a configuration failure, not the agent's)",
                    endpoint=self.base_url,
                    status=exc.status,
                    kind=f"HTTP {exc.status}",
                ) from exc
            except no_answer as exc:
                raise ModelEndpointError(
                    f"the model endpoint {self.base_url} did not answer ({tries}): {_said(exc)}",
                    endpoint=self.base_url,
                    kind="no answer",
                ) from exc

        return post_retried


class _Answered(Exception):
    """The model endpoint answered with another status than 200."""

    def __init__(self, status: int, text: str, headers: Mapping[str, str]) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status
        self.text = text
        self.headers = headers


def _retry_after(exc: Exception) -> float | None:
    """The pause a 429 or 503's ``Retry-After: SECONDS`` asks for (at most a minute)."""
    if not isinstance(exc, _Answered):
        return None
    try:
        return min(60.0, max(0.0, float(exc.headers.get("Retry-After", ""))))
    except ValueError:
        return None


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _read_reply(
    reply: Any,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """``(choice, message, tool calls)`` of a chat-completions reply; :class:`PolicyError` (the
    agent's failure, not a bug of the policy) when the endpoint answered something else."""
    try:
        choice = reply["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        if not all(
            isinstance(call, dict)
            and isinstance(call.get("function"), dict)
            and isinstance(call["function"].get("name"), str)
            for call in calls
        ):
            raise TypeError("a tool call without a function name")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise PolicyError(
            f"the model endpoint's reply is not a chat completion ({exc}): {str(reply)[:200]}"
        ) from None
    return choice, message, calls


class PolicyError(Exception):
    """The policy (the agent) failed: recorded as an agent error, not retried."""


class _InfrastructureFailure(CapacityError):
    """No instance could be had for a reason that is not an aenv error: the source (an engine,
    a pool) failed; like a full engine, retryable."""


# -- the job -----------------------------------------------------------------------------------
@dataclass
class SynthesisSummary:
    """What a synthesis run did.

    Two means, since failures count one way or the other: ``mean_reward`` over the ``scored``
    episodes (those with a reward: a failed episode has none), ``mean_reward_with_failures``
    over the ``counted`` ones, where each failed episode whose task asks for a reward counts
    as 0. An episode the environment does not score (``"reward": null``) is in neither.
    """

    out: Path
    episodes: int  # asked for
    skipped: int  # already recorded by an earlier run
    outcomes: dict[str, int]  # this run's episodes by outcome
    retries: int
    tool_calls: int
    seconds: float  # from the first episode started to the last ended
    mean_reward: float | None  # over the ``scored`` episodes: the ones that have a reward
    torn: TornRecord | None = None  # a torn last line an earlier, killed driver left (dropped)
    scored: int = 0  # episodes of this run with a reward
    mean_reward_with_failures: float | None = None  # over ``counted``: a failed episode is 0
    counted: int = 0  # the scored episodes and the failed ones whose task asks for a reward
    truncated: int = 0  # episodes a cap (``max_turns``) cut (``ok`` among the outcomes)

    @property
    def ok(self) -> bool:
        """Every episode of this run ended ``ok``."""
        return set(self.outcomes) <= {EpisodeOutcome.OK.value}


def write_parquet(jsonl: Path, target: Path) -> None:
    """Rewrite ``target`` from every row of ``jsonl`` (records of any format): the same rows,
    with real nested columns (:func:`rollout.records.arrow_schema`). Needs the ``parquet``
    extra (pyarrow)."""
    require_extra("parquet", "writing trajectories.parquet")
    records.write_parquet(list(read_records(jsonl)[0].values()), target)


def read_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """The records of ``trajectories.jsonl`` or ``trajectories.parquet`` (or of the run
    directory holding them: the JSONL file), as dicts in this format's shape (an older record
    upgraded: :func:`rollout.records.as_record`): both files read back equal."""
    path = Path(path)
    if path.is_dir():
        path = path / JSONL
    if path.suffix != ".parquet":
        return [records.as_record(row) for row in read_records(path)[0].values()]
    require_extra("parquet", "reading trajectories.parquet")
    return records.read_parquet(path)


def describe_policy(
    policy: Any, *, name: str | None = None, system_prompt: str | None = None
) -> dict[str, Any]:
    """What a record says of ``policy``: its name (``module:callable``) and settings."""
    if isinstance(policy, OpenAIPolicy):
        return policy.settings()
    if name is None:
        target = policy if hasattr(policy, "__qualname__") else type(policy)
        name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"
    return {
        "name": name,
        "model": None,
        "base_url": None,
        "system_prompt": system_prompt,
        "temperature": None,
        "max_turns": None,
        "logprobs": None,
        "token_ids": None,
    }


async def play_episode(
    source: InstanceSource,
    env_name: str,
    episode_id: str,
    task: dict[str, Any],
    policy: Policy,
    *,
    max_retries: int,
    episode_timeout: float | None,
    system_prompt: str | None = None,
    policy_info: dict[str, Any] | None = None,
) -> Trajectory:
    """Play one episode of ``task`` with ``policy`` on instances from ``source``; retry it on a
    fresh instance after a retryable failure (:func:`rollout.failures.is_retryable`), at most
    ``max_retries`` times. Never raises for the episode's failure: the :class:`Trajectory`
    says how it ended. Raises for what no episode can survive: :class:`~rollout.failures.
    PolicyCodeError` (the policy's code is wrong), :class:`~rollout.failures.TaskCallError`
    (the task's reward or setup call was refused), a :class:`ConfigurationError`, an unknown
    environment. ``system_prompt`` opens the conversation built for a policy that keeps none;
    ``policy_info`` is the record's ``policy`` (default: :func:`describe_policy`)."""
    trajectory, _ = await _play_episode(
        source,
        env_name,
        episode_id,
        task,
        policy,
        max_retries=max_retries,
        episode_timeout=episode_timeout,
        system_prompt=system_prompt,
        policy_info=policy_info,
    )
    return trajectory


async def _play_episode(
    source: InstanceSource,
    env_name: str,
    episode_id: str,
    task: dict[str, Any],
    policy: Policy,
    *,
    max_retries: int,
    episode_timeout: float | None,
    system_prompt: str | None = None,
    policy_info: dict[str, Any] | None = None,
) -> tuple[Trajectory, BaseException | None]:
    """:func:`play_episode`, and the error its last attempt failed with (``None``: none)."""
    info = policy_info or describe_policy(policy, system_prompt=system_prompt)
    attempts = 0
    retried: list[str] = []
    while True:
        attempts += 1
        trajectory, retryable, error = await _attempt(
            source,
            env_name,
            episode_id,
            task,
            policy,
            episode_timeout=episode_timeout,
            system_prompt=system_prompt,
            policy_name=str(info.get("name")),
        )
        trajectory.attempts = attempts
        trajectory.retried = list(retried)
        trajectory.policy = dict(info)
        if not retryable or attempts > max_retries:
            return trajectory, error
        retried.append(trajectory.reason or "")
        log.warning(
            "episode retried on a fresh instance",
            extra={"episode": episode_id, "attempt": attempts, "reason": trajectory.reason},
        )


async def _attempt(
    source: InstanceSource,
    env_name: str,
    episode_id: str,
    task: dict[str, Any],
    policy: Policy,
    *,
    episode_timeout: float | None,
    system_prompt: str | None,
    policy_name: str,
) -> tuple[Trajectory, bool, BaseException | None]:
    """One attempt: its trajectory, whether its failure is retryable, and the failure."""
    started = time.perf_counter()
    retryable = False
    error: BaseException | None = None
    trajectory = Trajectory(
        episode_id, str(task["id"]), env_name, EpisodeOutcome.OK.value, task=record_view(task)
    )
    instance: InstanceHandle | None = None
    broken = False
    agent: AgentEnv | None = None
    clock = _Clock(trajectory.timings)
    try:
        async with asyncio.timeout(episode_timeout):
            try:
                instance = await source.acquire()
            except (AEnvError, TimeoutError):
                raise  # classified below; a ConfigurationError aborts the whole run
            except Exception as exc:  # the engine or pool itself failed
                raise _InfrastructureFailure(f"{type(exc).__name__}: {exc}") from exc
            trajectory.instance_id = instance.instance_id
            clock.lap("acquire")
            for call in task.get("setup") or []:
                await _task_call(
                    instance.call_function(call["function"], call.get("arguments") or {}),
                    call["function"],
                    task,
                )
            # the tools as the policy meets them: a setup call may change them (a reset to
            # another task's domain)
            given = policy_view(task)  # no reward_arguments, no reference solution
            agent = AgentEnv(instance, env_name, given, tools=await instance.list_tools())
            trajectory.env_ref = agent.naming.env_ref
            clock.lap("setup")
            try:
                answer = await policy(given, agent)
            except (AEnvError, TimeoutError):
                raise
            except Exception as exc:
                if is_programming_error(exc):  # the policy's code is wrong: stop the run
                    raise PolicyCodeError.of(
                        exc, policy=policy_name, episode_id=episode_id
                    ) from exc
                if classify(exc) is EpisodeOutcome.AGENT_ERROR:  # the policy gave up, failed
                    raise PolicyError(f"{type(exc).__name__}: {exc}") from exc
                raise  # Ray lost an actor under the policy, an instance's error it wrapped, ...
            finally:
                clock.lap("policy")
            trajectory.answer = None if answer is None else str(answer)
            if task.get("reward_arguments") is not None:
                value = await _task_call(
                    instance.call_reward(dict(task["reward_arguments"])), "reward", task
                )
                trajectory.reward, trajectory.reward_components = _reward_of(value, task)
                clock.lap("reward")
    except (ConfigurationError, EnvironmentNotFoundError):
        raise  # the environment, the task or the policy cannot work at all: no episode can
    except Exception as exc:
        error = exc
        outcome = EpisodeOutcome.AGENT_ERROR if isinstance(exc, PolicyError) else classify(exc)
        retryable = not isinstance(exc, PolicyError) and is_retryable(exc)
        broken = outcome is EpisodeOutcome.INFRASTRUCTURE_ERROR
        trajectory.outcome = outcome.value
        trajectory.reason = _reason(exc, episode_timeout)
    finally:
        if agent is not None:
            _record_conversation(trajectory, agent, system_prompt)
        if instance is not None:
            with contextlib.suppress(Exception):
                await source.release(instance, broken=broken)
        trajectory.seconds = round(time.perf_counter() - started, 6)
    return trajectory, retryable, error


class _Clock:
    """Seconds of each phase of an attempt, into the record's ``timings``."""

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = round(now - self.last, 6)
        self.last = now


def _record_conversation(
    trajectory: Trajectory, agent: AgentEnv, system_prompt: str | None
) -> None:
    """The agent's steps, turns, the tools it was offered and its conversation, as the model
    saw them, into the record; the map of the offered names to the environment's beside."""
    naming = agent.naming
    trajectory.truncated = agent.truncated
    trajectory.steps = agent.steps
    trajectory.turns = agent.turns
    trajectory.tools = agent.offered if agent.offered is not None else naming.offered()
    trajectory.tool_names = naming.pairs()
    if agent.messages:
        trajectory.messages = list(agent.messages)
    else:
        trajectory.messages = conversation_from_steps(
            agent.steps, agent.task, trajectory.answer, system_prompt, naming
        )
    trajectory.usage = sum_usage(agent.turns)


async def _task_call(call: Awaitable[Any], function: str, task: dict[str, Any]) -> Any:
    """Await a call the task asks for (its reward, a setup function); a refusal of the call
    itself (no such function, arguments it does not take) is :class:`TaskCallError`."""
    try:
        return await call
    except FunctionError as exc:
        if isinstance(exc, FunctionNotFoundError) or exc.kind in _REFUSED:
            what = "reward" if function == "reward" else f"setup function `{function}`"
            raise TaskCallError(
                f"task {task['id']}: the environment refused its {what} call: {exc}; fix the "
                f"task's {'reward_arguments' if function == 'reward' else 'setup'} (or the "
                "environment) and run again",
                function=function,
                task_id=str(task["id"]),
                env_name=exc.env_name,
                instance_id=exc.instance_id,
            ) from exc
        raise


_REFUSED = (FunctionErrorKind.NOT_FOUND, FunctionErrorKind.INVALID_ARGUMENTS)


def _reward_of(value: Any, task: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """:func:`rollout.rewards.split_reward` of what the task's reward returned; a value that is
    no reward form is :class:`TaskCallError` (the run stops)."""
    try:
        return split_reward(value)
    except ValueError as exc:
        raise TaskCallError(
            f"task {task['id']}: {exc}; fix the reward",
            function="reward",
            task_id=str(task["id"]),
        ) from None


def _reason(exc: BaseException, episode_timeout: float | None) -> str:
    if isinstance(exc, TimeoutError) and not isinstance(exc, AEnvTimeoutError):
        return f"the episode ran past its {episode_timeout} s limit"
    return f"{type(exc).__name__}: {exc}"


ProgressCallback = Callable[[Trajectory], None]


def pending_episodes(
    task_list: list[dict[str, Any]],
    episodes: int,
    records: dict[str, dict[str, Any]],
    *,
    retry_failed: bool = False,
) -> list[tuple[str, dict[str, Any]]]:
    """``(episode id, task)`` of the ``episodes`` episodes not yet in ``records`` (with
    ``retry_failed``: nor recorded as anything but ``ok``), in order. Episode ``i`` plays task
    ``i mod len(task_list)`` and has the id ``"{i:06d}-{task id}"``."""
    todo = []
    for i in range(episodes):
        task = task_list[i % len(task_list)]
        episode_id = f"{i:06d}-{task['id']}"
        record = records.get(episode_id)
        if record is None or (retry_failed and record.get("outcome") != EpisodeOutcome.OK.value):
            todo.append((episode_id, task))
    return todo


def _task_list(
    tasks: Iterable[dict[str, Any]] | str | Path | None, env_name: str
) -> list[dict[str, Any]]:
    if tasks is None or isinstance(tasks, str | Path):
        return load_tasks(tasks, env_name)
    task_list = [{**t, "id": str(t.get("id", i))} for i, t in enumerate(tasks)]
    if not task_list:
        raise ConfigurationError(f"no tasks for {env_name}")
    return task_list


async def synthesize(
    env_name: str,
    *,
    episodes: int,
    out: str | Path | RunDirectory,
    concurrency: int = 8,
    tasks: Iterable[dict[str, Any]] | str | Path | None = None,
    policy: Policy | str | None = None,
    source: InstanceSource | None = None,
    max_retries: int = 2,
    episode_timeout: float | None = 600.0,
    retry_failed: bool = False,
    on_episode: ProgressCallback | None = None,
    on_skip: Callable[[int], None] | None = None,
    system_prompt: str | None = None,
    endpoint_failures: int = 3,
) -> SynthesisSummary:
    """Run ``episodes`` episodes (tasks cycled in order), ``concurrency`` at a time, into ``out``.

    Episode ``i`` has the id ``"{i:06d}-{task id}"``; ids already recorded in ``out`` are skipped.
    ``system_prompt`` opens the conversation recorded for a policy that keeps none (an
    :class:`OpenAIPolicy` takes its own). The first :class:`~rollout.failures.PolicyCodeError` or
    :class:`~rollout.failures.TaskCallError` stops the run and is raised (the records written so
    far stay, and the Parquet file is rewritten from them), as does the
    :class:`~rollout.failures.ModelEndpointDownError` of ``endpoint_failures`` episodes in a
    row lost to the same failure of the model endpoint (0: never stop for it; each such
    episode is recorded as ``infrastructure_error``). A run cancelled (Ctrl-C) writes the
    Parquet file of what it recorded too.
    ``out`` is a directory, whose lock is taken first (:class:`~rollout.run_directory.
    RunDirectoryLockedError` if another driver holds it) and released at the end, or a
    :class:`~rollout.run_directory.RunDirectory` already open (left open).
    """
    if episodes < 0 or concurrency < 1 or endpoint_failures < 0:
        raise ConfigurationError(
            "episodes must be >= 0, concurrency >= 1 and endpoint_failures >= 0"
        )
    job = functools.partial(
        _synthesize,
        env_name,
        episodes=episodes,
        concurrency=concurrency,
        tasks=tasks,
        policy=policy,
        source=source,
        max_retries=max_retries,
        episode_timeout=episode_timeout,
        retry_failed=retry_failed,
        on_episode=on_episode,
        on_skip=on_skip,
        system_prompt=system_prompt,
        endpoint_failures=endpoint_failures,
    )
    if isinstance(out, RunDirectory):
        return await job(out)
    with RunDirectory.open(out) as run:
        return await job(run)


def _chosen_policy(policy: Policy | str | None, env_name: str) -> Policy:
    """``policy`` itself, the policy a ``module:attribute`` string names, or (``None``) the
    environment's demo policy."""
    from rollout.precheck import check_policy, import_policy

    if policy is None:
        return demo_policy(env_name)
    if isinstance(policy, str):
        return import_policy(policy)  # type: ignore[no-any-return]
    check_policy(policy, describe_policy(policy)["name"])
    return policy


@dataclass
class _Tally:
    """What this run's episodes did so far: the counts of its :class:`SynthesisSummary`."""

    outcomes: Counter[str] = field(default_factory=Counter)
    rewards: list[float] = field(default_factory=list)
    with_failures: list[float] = field(default_factory=list)
    retries: int = 0
    tool_calls: int = 0
    truncated: int = 0

    def add(self, trajectory: Trajectory) -> None:
        """Count one recorded episode."""
        self.outcomes[trajectory.outcome] += 1
        self.retries += trajectory.attempts - 1
        self.tool_calls += len(trajectory.steps)
        self.truncated += trajectory.truncated
        if trajectory.reward is not None:
            self.rewards.append(trajectory.reward)
            self.with_failures.append(trajectory.reward)
        elif (
            trajectory.outcome != EpisodeOutcome.OK.value
            and trajectory.task.get("reward_arguments") is not None
        ):
            self.with_failures.append(0.0)  # it failed before its reward: counts as 0

    def summary(
        self, run: RunDirectory, *, episodes: int, skipped: int, seconds: float
    ) -> SynthesisSummary:
        """The run's summary, from the counts."""
        return SynthesisSummary(
            out=run.path,
            episodes=episodes,
            skipped=skipped,
            outcomes=dict(self.outcomes),
            retries=self.retries,
            tool_calls=self.tool_calls,
            seconds=seconds,
            mean_reward=_mean(self.rewards),
            torn=run.torn,
            scored=len(self.rewards),
            mean_reward_with_failures=_mean(self.with_failures),
            counted=len(self.with_failures),
            truncated=self.truncated,
        )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class _EndpointWatch:
    """Stops a run whose episodes keep losing their model endpoint the same way: ``limit``
    episodes in a row (0: never) failed with the same :class:`ModelEndpointError` signature,
    no episode between them having had a model reply."""

    limit: int
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)

    def saw(self, trajectory: Trajectory, error: BaseException | None) -> None:
        """Count an episode's end; raise :class:`ModelEndpointDownError` at the limit."""
        failure = _endpoint_failure(error, set())
        if failure is None:
            if trajectory.turns:  # the model answered: the endpoint works
                self.failures.clear()
            return
        self.failures[failure.signature] += 1
        count = self.failures[failure.signature]
        if self.limit and count >= self.limit:
            said = str(failure).removeprefix(f"the model endpoint {failure.endpoint} ")
            retried = failure.status is None or failure.status >= 500 or failure.status == 429
            how = "each after its retries" if retried else "refused each time"
            raise ModelEndpointDownError(
                f"the model endpoint {failure.endpoint} failed {count} episodes in a row, {how} "
                f"(it {said}); the run stopped, its records are kept (these "
                "episodes as infrastructure_error, none as the agent's): check the endpoint "
                "(the URL, the server, its key), then run again into the same directory with "
                "--retry-failed (retry_failed=True) to play them again",
                endpoint=failure.endpoint,
                status=failure.status,
                kind=failure.kind,
                count=count,
            ) from error


def _endpoint_failure(exc: BaseException | None, seen: set[int]) -> ModelEndpointError | None:
    """The :class:`ModelEndpointError` ``exc`` is, was raised from, or holds (a group)."""
    if exc is None or id(exc) in seen:
        return None
    seen.add(id(exc))
    if isinstance(exc, ModelEndpointError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _endpoint_failure(inner, seen)
            if found is not None:
                return found
    return _endpoint_failure(exc.__cause__, seen)


async def _play_all(
    todo: list[tuple[str, dict[str, Any]]],
    play: Callable[[str, dict[str, Any]], Coroutine[Any, Any, None]],
) -> None:
    """``play(episode_id, task)`` for every episode of ``todo``, all in one task group; the
    first error (a bad task, a full disk) stops them all and is raised alone."""
    try:
        async with asyncio.TaskGroup() as group:
            for episode_id, task in todo:
                group.create_task(play(episode_id, task))
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def _synthesize(
    env_name: str,
    run: RunDirectory,
    *,
    episodes: int,
    concurrency: int,
    tasks: Iterable[dict[str, Any]] | str | Path | None,
    policy: Policy | str | None,
    source: InstanceSource | None,
    max_retries: int,
    episode_timeout: float | None,
    retry_failed: bool,
    on_episode: ProgressCallback | None,
    on_skip: Callable[[int], None] | None,
    system_prompt: str | None,
    endpoint_failures: int,
) -> SynthesisSummary:
    task_list = _task_list(tasks, env_name)
    chosen = _chosen_policy(policy, env_name)
    policy_info = describe_policy(
        chosen, name=policy if isinstance(policy, str) else None, system_prompt=system_prompt
    )
    todo = pending_episodes(task_list, episodes, run.records, retry_failed=retry_failed)
    skipped = episodes - len(todo)
    if on_skip is not None:
        on_skip(skipped)
    instances = source or SDKSource(env_name)
    limit = asyncio.Semaphore(concurrency)
    tally = _Tally()
    watch = _EndpointWatch(endpoint_failures)

    async def one(episode_id: str, task: dict[str, Any]) -> None:
        async with limit:
            trajectory, error = await _play_episode(
                instances,
                env_name,
                episode_id,
                task,
                chosen,
                max_retries=max_retries,
                episode_timeout=episode_timeout,
                system_prompt=system_prompt,
                policy_info=policy_info,
            )
        await run.append(trajectory.to_json())
        tally.add(trajectory)
        if on_episode is not None:
            on_episode(trajectory)
        watch.saw(trajectory, error)

    # trajectories.jsonl is the record; its Parquet copy needs pyarrow (the `parquet` extra)
    with_parquet = not missing_modules("parquet")
    if not with_parquet:
        log.warning(
            "trajectories.parquet is not written: pyarrow is not installed "
            f"({install_hint('parquet')}); trajectories.jsonl holds every record",
            extra={"run": str(run.path)},
        )
    started = time.perf_counter()
    try:
        await _play_all(todo, one)
    except BaseException:  # an error that stops the run, or Ctrl-C: what is done is written
        if with_parquet:
            with contextlib.suppress(Exception):  # the run's own error is the one to tell
                write_parquet(run.jsonl, run.path / PARQUET)
        raise
    seconds = time.perf_counter() - started  # the episodes' time, not the Parquet file's
    run.compact()  # an episode run again leaves one line, as it leaves one Parquet row
    parquet = run.path / PARQUET
    stale = not parquet.is_file() or parquet.stat().st_mtime_ns < run.jsonl.stat().st_mtime_ns
    if with_parquet and (todo or stale):
        write_parquet(run.jsonl, parquet)  # (nothing new: the file already says it all)
    return tally.summary(run, episodes=episodes, skipped=skipped, seconds=seconds)


def run_synthesis(env_name: str, **kwargs: Any) -> SynthesisSummary:
    """:func:`synthesize` from synchronous code (its own event loop)."""
    return asyncio.run(synthesize(env_name, **kwargs))
