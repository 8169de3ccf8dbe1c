"""Batch trajectory synthesis: tasks x policy -> trajectories on disk, resumable.

An *episode* takes one task, gets a fresh instance, runs the policy against it, asks the
environment's reward and records everything: every tool call with its arguments, result and
timings, the reward, and how the episode ended (:class:`~rollout.failures.EpisodeOutcome`).
Retryable failures (:func:`rollout.failures.is_retryable`: an instance that broke, went silent
or could not be reached or created) are retried on a fresh instance up to ``max_retries``;
every other failure is recorded once, with its reason. No episode is lost or doubled: each
one ends as one line of ``trajectories.jsonl``, written and synced as it finishes, by the one
driver that holds the directory's lock (:mod:`rollout.run_directory`), and
``trajectories.parquet`` is rewritten from it at the end. A rerun into the
same directory skips the episodes already recorded (``retry_failed=True``: all but the failed
ones) and reruns the one whose line a killed driver left torn.

    summary = run_synthesis("mini-terminal@1.0.0", episodes=8, concurrency=4, out="runs/a")
    summary.outcomes
    # {'ok': 8}

A **policy** is ``async def policy(task: dict, env: AgentEnv) -> str | None``: it calls tools
through ``env`` (recorded) and may return a final answer. Without one, the environment's scripted
demo policy is used (built-in environments ship one: ``builtin_envs.demos.<env>``), or an
:class:`OpenAIPolicy` talks to any OpenAI-compatible chat-completions endpoint.

May import: ``aenv_ray``, ``rollout``, aiohttp (the OpenAI-compatible policy), pyarrow (Parquet
output); lazily, inside functions: ``builtin_envs`` (demo tasks and policies). Must not import:
kubernetes (engines are injected).

A **task** is a dict: ``id`` (default: its position), ``prompt`` (what an agent is told),
``setup`` (optional list of ``{"function": NAME, "arguments": {...}}`` called before the
policy), ``reward_arguments`` (the arguments of the environment's reward; absent: no reward
call); other keys are the policy's own (a scripted policy's solution, say). ``id``, ``prompt``
and ``reward_arguments`` mean the same in :class:`rollout.gym.Task`.
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
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aenv_ray import ToolResult
from aenv_ray.errors import (
    AEnvError,
    AEnvTimeoutError,
    CapacityError,
    ConfigurationError,
    EnvironmentNotFoundError,
)
from rollout.failures import EpisodeOutcome, classify, is_retryable
from rollout.run_directory import RunDirectory, TornRecord, read_records
from rollout.sources import InstanceHandle, InstanceSource, SDKSource

__all__ = [
    "AgentEnv",
    "OpenAIPolicy",
    "Policy",
    "Step",
    "SynthesisSummary",
    "Trajectory",
    "demo_policy",
    "load_policy",
    "load_tasks",
    "pending_episodes",
    "play_episode",
    "run_synthesis",
    "synthesize",
]

log = logging.getLogger("rollout.synthesis")

PARQUET = "trajectories.parquet"


# -- records -------------------------------------------------------------------------------------
@dataclass
class Step:
    """One tool call of an episode."""

    tool: str
    arguments: dict[str, Any]
    text: str  # the result's text (what an agent reads)
    is_error: bool
    started: float  # seconds since the episode started
    seconds: float
    structured: Any = None


@dataclass
class Trajectory:
    """One episode, as written to disk."""

    episode_id: str
    task_id: str
    env: str
    outcome: str  # an EpisodeOutcome value
    reason: str | None = None
    reward: float | None = None
    answer: str | None = None
    steps: list[Step] = field(default_factory=list)
    attempts: int = 1
    instance_id: str | None = None
    seconds: float = 0.0
    task: dict[str, Any] = field(default_factory=dict)
    retried: list[str] = field(default_factory=list)  # why each earlier attempt was retried

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (steps as dicts)."""
        return asdict(self)


# -- what a policy sees ------------------------------------------------------------------------
class AgentEnv:
    """The instance as a policy sees it: every tool call is recorded as a :class:`Step`."""

    def __init__(self, instance: InstanceHandle, env_name: str, task: dict[str, Any]) -> None:
        self.instance = instance
        self.env_name = env_name
        self.task = task
        self.steps: list[Step] = []
        self._started = time.perf_counter()

    async def list_tools(self) -> list[dict[str, Any]]:
        """The tools, as ``{"name", "description", "inputSchema"}`` dicts."""
        return await self.instance.list_tools()

    async def list_openai_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI chat-completions form."""
        return await self.instance.list_openai_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Call a tool; tool-level errors come back as ``is_error`` results (recorded)."""
        arguments = dict(arguments or {})
        began = time.perf_counter()
        result = await self.instance.call_tool(name, arguments)
        self.steps.append(
            Step(
                tool=name,
                arguments=arguments,
                text=result.text,
                is_error=result.is_error,
                started=round(began - self._started, 6),
                seconds=round(time.perf_counter() - began, 6),
                structured=_jsonable(result.structured),
            )
        )
        return result

    async def call_function(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        """Call one of the environment's functions (not recorded as a step)."""
        return await self.instance.call_function(name, dict(arguments or {}))


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


def _demo_module(env_name: str) -> Any:
    from builtin_envs import builtin_path

    path = builtin_path(env_name)
    if path is None:
        raise ConfigurationError(
            f"{env_name} is not a built-in environment, so it has no demo policy or tasks: "
            "pass --policy MODULE:CALLABLE (or --base-url/--model) and --tasks FILE"
        )
    try:
        return importlib.import_module(f"builtin_envs.demos.{path.name}")
    except ImportError as exc:
        raise ConfigurationError(f"{env_name} ships no demo policy ({exc})") from exc


def demo_policy(env_name: str) -> Policy:
    """The scripted demo policy a built-in environment ships (``builtin_envs.demos``)."""
    return _demo_module(env_name).policy  # type: ignore[no-any-return]


def load_tasks(path: str | Path | None, env_name: str) -> list[dict[str, Any]]:
    """Tasks from a JSON-lines (or JSON list) file, else the built-in environment's demo tasks."""
    if path is None:
        tasks = list(_demo_module(env_name).TASKS)
    else:
        text = Path(path).read_text()
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


class OpenAIPolicy:
    """An agent over any OpenAI-compatible ``/chat/completions`` endpoint, with tools.

    The task's ``prompt`` is the user message; each tool call the model makes is executed and its
    result sent back, until the model answers without a tool call (its answer) or ``max_turns``.
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
        http_client: Any = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http_client = http_client  # an httpx.AsyncClient to use (AReaL passes one)
        self.model = model
        self.api_key = api_key
        self.max_turns = max_turns
        self.temperature = temperature
        self.system_prompt = system_prompt

    async def __call__(self, task: dict[str, Any], env: AgentEnv) -> str | None:
        tools = await env.list_openai_tools()
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": str(task.get("prompt", ""))})
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with contextlib.AsyncExitStack() as stack:
            post = await self._poster(stack, headers)
            for _ in range(self.max_turns):
                body: dict[str, Any] = {"model": self.model, "messages": messages, "tools": tools}
                if self.temperature is not None:
                    body["temperature"] = self.temperature
                reply = await post(f"{self.base_url}/chat/completions", body)
                message = reply["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    return str(message.get("content") or "")
                for call in calls:
                    function = call["function"]
                    try:
                        arguments = json.loads(function.get("arguments") or "{}")
                    except json.JSONDecodeError:
                        arguments = None
                    if not isinstance(arguments, dict):
                        content = "error: the arguments must be a JSON object"
                    else:
                        content = (await env.call_tool(function["name"], arguments)).text
                    messages.append(
                        {"role": "tool", "tool_call_id": call.get("id", ""), "content": content}
                    )
        return None

    async def _poster(
        self, stack: contextlib.AsyncExitStack, headers: dict[str, str]
    ) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
        """A ``post(url, body) -> reply`` over the given httpx client, or a new aiohttp one."""
        if self.http_client is not None:
            client = self.http_client

            async def post_httpx(url: str, body: dict[str, Any]) -> dict[str, Any]:
                response = await client.post(url, json=body, headers=headers)
                if response.status_code != 200:
                    raise PolicyError(
                        f"model endpoint answered {response.status_code}: {response.text}"
                    )
                return response.json()  # type: ignore[no-any-return]

            return post_httpx
        import aiohttp

        session = await stack.enter_async_context(aiohttp.ClientSession(headers=headers))

        async def post_aiohttp(url: str, body: dict[str, Any]) -> dict[str, Any]:
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    text = await response.text()
                    raise PolicyError(f"model endpoint answered {response.status}: {text}")
                return await response.json()  # type: ignore[no-any-return]

        return post_aiohttp


class PolicyError(Exception):
    """The policy (the agent) failed: recorded as an agent error, not retried."""


class _InfrastructureFailure(CapacityError):
    """No instance could be had for a reason that is not an aenv error: the source (an engine,
    a pool) failed; like a full engine, retryable."""


# -- the job -----------------------------------------------------------------------------------
@dataclass
class SynthesisSummary:
    """What a synthesis run did."""

    out: Path
    episodes: int  # asked for
    skipped: int  # already recorded by an earlier run
    outcomes: dict[str, int]  # this run's episodes by outcome
    retries: int
    tool_calls: int
    seconds: float  # from the first episode started to the last ended
    mean_reward: float | None
    torn: TornRecord | None = None  # a torn last line an earlier, killed driver left (dropped)

    @property
    def ok(self) -> bool:
        """Every episode of this run ended ``ok``."""
        return set(self.outcomes) <= {EpisodeOutcome.OK.value}


def write_parquet(jsonl: Path, target: Path) -> None:
    """Rewrite ``target`` from every row of ``jsonl`` (steps, task, retried: JSON text columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(read_records(jsonl)[0].values())
    columns: dict[str, list[Any]] = {
        "episode_id": [r["episode_id"] for r in rows],
        "task_id": [r["task_id"] for r in rows],
        "env": [r["env"] for r in rows],
        "outcome": [r["outcome"] for r in rows],
        "reason": [r.get("reason") for r in rows],
        "reward": [r.get("reward") for r in rows],
        "answer": [r.get("answer") for r in rows],
        "attempts": [r.get("attempts", 1) for r in rows],
        "instance_id": [r.get("instance_id") for r in rows],
        "seconds": [r.get("seconds", 0.0) for r in rows],
        "num_steps": [len(r.get("steps") or []) for r in rows],
        "steps": [json.dumps(r.get("steps") or []) for r in rows],
        "task": [json.dumps(r.get("task") or {}) for r in rows],
        "retried": [json.dumps(r.get("retried") or []) for r in rows],
    }
    schema = pa.schema(
        [
            ("episode_id", pa.string()),
            ("task_id", pa.string()),
            ("env", pa.string()),
            ("outcome", pa.string()),
            ("reason", pa.string()),
            ("reward", pa.float64()),
            ("answer", pa.string()),
            ("attempts", pa.int32()),
            ("instance_id", pa.string()),
            ("seconds", pa.float64()),
            ("num_steps", pa.int32()),
            ("steps", pa.string()),
            ("task", pa.string()),
            ("retried", pa.string()),
        ]
    )
    table = pa.Table.from_pydict(columns, schema=schema)
    scratch = target.with_suffix(".parquet.tmp")
    pq.write_table(table, scratch)
    scratch.replace(target)


async def play_episode(
    source: InstanceSource,
    env_name: str,
    episode_id: str,
    task: dict[str, Any],
    policy: Policy,
    *,
    max_retries: int,
    episode_timeout: float | None,
) -> Trajectory:
    """Play one episode of ``task`` with ``policy`` on instances from ``source``; retry it on a
    fresh instance after a retryable failure (:func:`rollout.failures.is_retryable`), at most
    ``max_retries`` times. Never raises for the episode's failure: the :class:`Trajectory`
    says how it ended."""
    attempts = 0
    retried: list[str] = []
    while True:
        attempts += 1
        trajectory, retryable = await _attempt(
            source, env_name, episode_id, task, policy, episode_timeout=episode_timeout
        )
        trajectory.attempts = attempts
        trajectory.retried = list(retried)
        if not retryable or attempts > max_retries:
            return trajectory
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
) -> tuple[Trajectory, bool]:
    """One attempt: its trajectory, and whether its failure is retryable."""
    started = time.perf_counter()
    retryable = False
    trajectory = Trajectory(
        episode_id, str(task["id"]), env_name, EpisodeOutcome.OK.value, task=task
    )
    instance: InstanceHandle | None = None
    broken = False
    agent: AgentEnv | None = None
    try:
        async with asyncio.timeout(episode_timeout):
            try:
                instance = await source.acquire()
            except (AEnvError, TimeoutError):
                raise  # classified below; a ConfigurationError aborts the whole run
            except Exception as exc:  # the engine or pool itself failed
                raise _InfrastructureFailure(f"{type(exc).__name__}: {exc}") from exc
            trajectory.instance_id = instance.instance_id
            for call in task.get("setup") or []:
                await instance.call_function(call["function"], call.get("arguments") or {})
            agent = AgentEnv(instance, env_name, task)
            try:
                answer = await policy(task, agent)
            except (AEnvError, TimeoutError):
                raise
            except Exception as exc:
                if classify(exc) is EpisodeOutcome.AGENT_ERROR:  # the policy's own bug or refusal
                    raise PolicyError(f"{type(exc).__name__}: {exc}") from exc
                raise  # Ray lost an actor under the policy, an instance's error it wrapped, ...
            trajectory.answer = None if answer is None else str(answer)
            if task.get("reward_arguments") is not None:
                reward = await instance.call_reward(dict(task["reward_arguments"]))
                trajectory.reward = float(reward)
    except (ConfigurationError, EnvironmentNotFoundError):
        raise  # the environment or the task cannot work at all: no episode can
    except Exception as exc:
        outcome = EpisodeOutcome.AGENT_ERROR if isinstance(exc, PolicyError) else classify(exc)
        retryable = not isinstance(exc, PolicyError) and is_retryable(exc)
        broken = outcome is EpisodeOutcome.INFRASTRUCTURE_ERROR
        trajectory.outcome = outcome.value
        trajectory.reason = _reason(exc, episode_timeout)
    finally:
        if agent is not None:
            trajectory.steps = agent.steps
        if instance is not None:
            with contextlib.suppress(Exception):
                await source.release(instance, broken=broken)
        trajectory.seconds = round(time.perf_counter() - started, 6)
    return trajectory, retryable


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
) -> SynthesisSummary:
    """Run ``episodes`` episodes (tasks cycled in order), ``concurrency`` at a time, into ``out``.

    Episode ``i`` has the id ``"{i:06d}-{task id}"``; ids already recorded in ``out`` are skipped.
    ``out`` is a directory, whose lock is taken first (:class:`~rollout.run_directory.
    RunDirectoryLockedError` if another driver holds it) and released at the end, or a
    :class:`~rollout.run_directory.RunDirectory` already open (left open).
    """
    if episodes < 0 or concurrency < 1:
        raise ConfigurationError("episodes must be >= 0 and concurrency >= 1")
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
    )
    if isinstance(out, RunDirectory):
        return await job(out)
    with RunDirectory.open(out) as run:
        return await job(run)


def _chosen_policy(policy: Policy | str | None, env_name: str) -> Policy:
    """``policy`` itself, the policy a ``module:attribute`` string names, or (``None``) the
    environment's demo policy."""
    if policy is None:
        return demo_policy(env_name)
    return load_policy(policy) if isinstance(policy, str) else policy


@dataclass
class _Tally:
    """What this run's episodes did so far: the counts of its :class:`SynthesisSummary`."""

    outcomes: Counter[str] = field(default_factory=Counter)
    rewards: list[float] = field(default_factory=list)
    retries: int = 0
    tool_calls: int = 0

    def add(self, trajectory: Trajectory) -> None:
        """Count one recorded episode."""
        self.outcomes[trajectory.outcome] += 1
        self.retries += trajectory.attempts - 1
        self.tool_calls += len(trajectory.steps)
        if trajectory.reward is not None:
            self.rewards.append(trajectory.reward)

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
            mean_reward=sum(self.rewards) / len(self.rewards) if self.rewards else None,
            torn=run.torn,
        )


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
) -> SynthesisSummary:
    task_list = _task_list(tasks, env_name)
    chosen = _chosen_policy(policy, env_name)
    todo = pending_episodes(task_list, episodes, run.records, retry_failed=retry_failed)
    skipped = episodes - len(todo)
    if on_skip is not None:
        on_skip(skipped)
    instances = source or SDKSource(env_name)
    limit = asyncio.Semaphore(concurrency)
    tally = _Tally()

    async def one(episode_id: str, task: dict[str, Any]) -> None:
        async with limit:
            trajectory = await play_episode(
                instances,
                env_name,
                episode_id,
                task,
                chosen,
                max_retries=max_retries,
                episode_timeout=episode_timeout,
            )
        await run.append(trajectory.to_json())
        tally.add(trajectory)
        if on_episode is not None:
            on_episode(trajectory)

    started = time.perf_counter()
    await _play_all(todo, one)
    seconds = time.perf_counter() - started  # the episodes' time, not the Parquet file's
    run.compact()  # an episode run again leaves one line, as it leaves one Parquet row
    write_parquet(run.jsonl, run.path / PARQUET)
    return tally.summary(run, episodes=episodes, skipped=skipped, seconds=seconds)


def run_synthesis(env_name: str, **kwargs: Any) -> SynthesisSummary:
    """:func:`synthesize` from synchronous code (its own event loop)."""
    return asyncio.run(synthesize(env_name, **kwargs))
