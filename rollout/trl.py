"""TRL: an environment's tools as the ``environment_factory`` of TRL's ``GRPOTrainer``.

TRL (>= 1.16) trains on environments through ``GRPOTrainer(environment_factory=...)``: a
callable returning an object whose public methods are the model's tools (their names, type
hints and Google-style docstrings become the tool schemas in the prompt), with ``reset(**row)``
called before each rollout and ``get_reward()`` once after it. :class:`TRLEnvironments` is that
callable for an aenv-ray environment: each object it makes (a :class:`TRLEpisode`) plays its
rollouts on instances of the environment, one fresh instance per rollout, and returns the
environment's own reward (its ``call_reward``, read by :func:`rollout.rewards.split_reward`).

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from rollout.trl import TRLEnvironments

    with TRLEnvironments("mini-terminal@1.0.0") as environments:
        dataset = Dataset.from_list(environments.rows(tasks))
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                              train_dataset=dataset, environment_factory=environments)
        trainer.train()

A task (see :mod:`rollout.synthesis`: ``prompt`` or ``messages``, ``setup``,
``reward_arguments``) becomes a dataset row by :meth:`TRLEnvironments.rows`: its ``prompt``
column is what the model is given, built from :func:`rollout.task_view.policy_view` (no
``reward_arguments``, no reference solution); its ``task`` column (JSON) keeps
:func:`rollout.task_view.record_view`, which TRL hands back to ``reset`` and the model never
sees. ``reset`` starts a fresh instance in the background and runs the task's ``setup``; each
tool call waits for it, runs on that instance, and answers the model with the result's text (an
error the agent caused, such as a wrong argument, is answered as ``error: ...``);
``get_reward`` calls the environment's reward with the task's ``reward_arguments`` and gives the
instance back. An instance that cannot be started is retried on a fresh one (``max_retries``);
an infrastructure failure the episode cannot get past (the instance broke under a tool call, no
instance could be had) makes ``get_reward`` raise :class:`~rollout.areal.EpisodeFailedError`,
which stops the training, rather than score the model 0 for it.

The tool methods are made from the environment's tool list (read once, from a first instance,
when the factory is built): each schema type maps to a Python hint (``string`` -> ``str``,
``integer`` -> ``int``, an ``enum`` -> ``Literal``, ...; what has no hint, such as a nested
object's own properties, becomes ``dict`` or ``Any``), each argument's description goes into
the docstring. The method's name is the environment's tool name (``execute_command``); a name
that is no Python identifier, or that TRL reserves (``reset``, ``get_reward``), is changed
(:attr:`TRLEnvironments.tool_names` maps them back). TRL calls tools one rollout after another
from its training loop; calls run on this factory's own event loop (a thread), so the
asynchronous SDK is never shared between loops.

May import: ``aenv_ray``, ``rollout``. Must not import: trl, transformers, torch (TRL is
duck-typed: this module works, and is tested, without it), kubernetes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import itertools
import json
import keyword
import re
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar

from aenv_ray.errors import AEnvError, ConfigurationError
from rollout.areal import EpisodeFailedError
from rollout.failures import EpisodeOutcome, classify
from rollout.rewards import split_reward
from rollout.sources import InstanceHandle, InstanceSource, SDKSource
from rollout.task_view import policy_view, record_view

__all__ = ["EpisodeFailedError", "TRLEnvironments", "TRLEpisode", "TRLEpisodeRecord"]

T = TypeVar("T")

RESERVED = ("reset", "get_reward")
"""The method names TRL gives a meaning of its own: a tool of that name is renamed."""

_NOT_IDENTIFIER = re.compile(r"\W")


@dataclass
class TRLEpisodeRecord:
    """One rollout as the environment saw it: its instance, the tool calls that reached it
    (the name the model used, the environment's tool, the arguments, the text answered, whether
    it was an error) and the reward the environment gave."""

    episode_id: str
    task_id: str
    instance_id: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    reward_components: dict[str, Any] | None = None
    failure: str | None = None


class _Loop:
    """An event loop on a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()


def _hint(schema: Any) -> Any:
    """The Python type hint that ``transformers.utils.get_json_schema`` turns back into (the
    closest it can express of) the JSON schema ``schema``."""
    if not isinstance(schema, Mapping):
        return Any
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        values = schema["enum"]
        if all(isinstance(v, str | int | float | bool) for v in values):
            return Literal[tuple(values)]
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and options:
        hints = tuple(dict.fromkeys(_hint(option) for option in options))
        return Any if Any in hints else (hints[0] if len(hints) == 1 else _union(hints))
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        hints = tuple(dict.fromkeys(_hint({**schema, "type": k}) for k in kind))
        return Any if Any in hints else (hints[0] if len(hints) == 1 else _union(hints))
    if kind == "array":
        items = schema.get("items")
        return list[_hint(items)] if isinstance(items, Mapping) and items else list  # type: ignore[misc]
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping) and values and not schema.get("properties"):
            return dict[str, _hint(values)]  # type: ignore[misc]
        return dict
    simple = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}
    return simple.get(str(kind), Any)


def _union(hints: tuple[Any, ...]) -> Any:
    import functools
    import operator

    return functools.reduce(operator.or_, hints)


def _one_line(text: Any) -> str:
    return " ".join(str(text or "").split())


def _method_name(tool: str, taken: set[str]) -> str:
    name = _NOT_IDENTIFIER.sub("_", tool) or "tool"
    if name[0].isdigit() or keyword.iskeyword(name) or name in RESERVED or name.startswith("_"):
        name = f"tool_{name.lstrip('_')}"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _tool_method(method_name: str, tool: Mapping[str, Any]) -> Callable[..., str]:
    """A method named ``method_name`` whose signature and docstring describe ``tool`` (an
    aenv-ray tool spec: ``name``, ``description``, ``inputSchema``) and which calls it."""
    schema = tool.get("inputSchema") or {}
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    described = []
    ordered = sorted(properties, key=lambda name: name not in required)  # required ones first
    for name in ordered:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ConfigurationError(
                f"tool `{tool['name']}` has an argument `{name}`, which is no Python identifier: "
                "TRL passes arguments as keywords of a method, so it cannot offer this tool"
            )
        spec = properties[name] if isinstance(properties[name], Mapping) else {}
        hint = _hint(spec)
        default: Any = inspect.Parameter.empty
        if name not in required:
            default = spec.get("default")
            if default is None:
                hint = hint | None if hint is not Any else Any
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint
            )
        )
        annotations[name] = hint
        described.append(f"    {name}: {_one_line(spec.get('description')) or name}")
    annotations["return"] = str
    description = str(tool.get("description") or tool["name"]).strip()
    # transformers reads the first paragraph as the description and a Google "Args:" section
    summary = description.split("\n\nArgs:")[0].strip() or str(tool["name"])
    doc = summary + ("\n\nArgs:\n" + "\n".join(described) if described else "")
    tool_name = str(tool["name"])

    def call(self: TRLEpisode, **arguments: Any) -> str:
        return self._call_tool(method_name, tool_name, arguments)

    call.__name__ = call.__qualname__ = method_name
    call.__doc__ = doc
    call.__annotations__ = annotations
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    return call


class TRLEpisode:
    """What TRL holds for one rollout at a time (made by :class:`TRLEnvironments`): ``reset``,
    ``get_reward`` and one method per tool of the environment. TRL reuses it across batches,
    calling ``reset`` before each rollout; every rollout gets a fresh instance."""

    def __init__(self, environments: TRLEnvironments) -> None:
        self._environments = environments
        self._start: concurrent.futures.Future[InstanceHandle] | None = None
        self._task: dict[str, Any] = {}
        self._record: TRLEpisodeRecord | None = None
        self._failure: BaseException | None = None

    def reset(self, task: str | Mapping[str, Any] | None = None, **row: Any) -> str | None:
        """Start a rollout of ``task`` (the row's ``task`` column, :meth:`TRLEnvironments.rows`;
        without it, the row itself is the task): give back the previous rollout's instance if
        TRL never asked for its reward, and start a fresh one (with the task's ``setup``) in the
        background. Returns ``None``: the prompt already holds what the model is told."""
        self._finish()
        if task is None:
            found = {k: v for k, v in row.items() if k != "prompt"}
        elif isinstance(task, str):
            found = json.loads(task)
        else:
            found = dict(task)
        environments = self._environments
        episode = environments._new_episode_id()
        self._task = {**found, "id": str(found.get("id", episode))}
        self._record = TRLEpisodeRecord(episode, self._task["id"])
        self._failure = None
        self._start = environments._begin(self._task, self._record)
        return None

    def get_reward(self) -> float | None:
        """The environment's reward for the rollout (its ``call_reward`` with the task's
        ``reward_arguments``); the instance is given back. ``None`` where the environment does
        not score the episode (``{"reward": null}``: an invalid task). An infrastructure failure
        raises :class:`~rollout.areal.EpisodeFailedError` instead of a made-up reward."""
        record = self._record
        if record is None:
            raise ConfigurationError("get_reward() before reset(): no rollout was started")
        try:
            instance = self._instance()
            arguments = self._task.get("reward_arguments")
            if arguments is None:
                raise ConfigurationError(
                    f"task {self._task['id']} has no reward_arguments: the environment's reward "
                    "cannot be called (give each task its reward_arguments)"
                )
            value = self._environments._run(
                instance.call_reward(dict(arguments), timeout=self._environments.reward_timeout)
            )
            try:
                record.reward, record.reward_components = split_reward(value)
            except ValueError as exc:
                raise ConfigurationError(
                    f"task {self._task['id']}: {exc}; fix the reward"
                ) from None
        except ConfigurationError:
            raise
        except EpisodeFailedError:
            pass  # the failure is recorded: raised below, as the episode's
        except Exception as exc:
            if classify(exc) is not EpisodeOutcome.INFRASTRUCTURE_ERROR:
                raise
            self._fail(exc)
        finally:
            self._finish()
        if self._failure is not None:
            raise EpisodeFailedError(
                f"episode {record.episode_id} (task {record.task_id}) of "
                f"{self._environments.env_name} has no reward: {record.failure}"
            ) from self._failure
        return record.reward

    # -- what the tool methods call ------------------------------------------------------------

    def _instance(self) -> InstanceHandle:
        if self._start is None:
            raise ConfigurationError("a tool was called before reset(): no rollout was started")
        if self._failure is not None:
            raise EpisodeFailedError(f"the episode's instance failed: {self._failure}")
        try:
            return self._start.result()
        except Exception as exc:
            self._fail(exc)
            raise EpisodeFailedError(
                f"no instance of {self._environments.env_name} for the episode: {exc}"
            ) from exc

    def _fail(self, exc: BaseException) -> None:
        self._failure = self._failure or exc
        if self._record is not None and self._record.failure is None:
            self._record.failure = f"{type(exc).__name__}: {exc}"

    def _call_tool(self, method_name: str, tool_name: str, arguments: dict[str, Any]) -> str:
        instance = self._instance()
        call: dict[str, Any] = {"name": method_name, "tool": tool_name, "arguments": arguments}
        if self._record is not None:
            self._record.calls.append(call)
        environments = self._environments
        try:
            result = environments._run(
                instance.call_tool(tool_name, arguments, timeout=environments.tool_timeout)
            )
        except Exception as exc:
            if classify(exc) is EpisodeOutcome.INFRASTRUCTURE_ERROR:
                self._fail(exc)  # not the agent's: get_reward raises
                call.update(text=f"error: {exc}", is_error=True)
                raise EpisodeFailedError(f"`{tool_name}` lost its instance: {exc}") from exc
            call.update(text=f"error: {exc}", is_error=True)
            return str(call["text"])
        text = f"error: {result.text}" if result.is_error else result.text
        call.update(text=text, is_error=result.is_error)
        return text

    def _finish(self) -> None:
        """Give the rollout's instance back (in the background) and keep its record."""
        start, record = self._start, self._record
        self._start = None
        if start is None or record is None:
            return
        self._environments._finish(start, record, broken=self._failure is not None)


class TRLEnvironments:
    """The ``environment_factory`` of TRL's ``GRPOTrainer`` for the environment ``env_name``
    (see the module docstring). ``source``: where instances come from (default
    :class:`~rollout.sources.SDKSource`: the local engine, or the hub when one is configured);
    ``tools``: the environment's tool specs, when you have them (default: read from a first
    instance); ``system_prompt``: a system message at the head of each row's prompt;
    ``keep_records``: how many finished rollouts :attr:`records` keeps.

        >>> environments = TRLEnvironments("mini-terminal@1.0.0")  # doctest: +SKIP
        >>> environments.tool_names  # doctest: +SKIP
        {'execute_command': 'execute_command'}
    """

    def __init__(
        self,
        env_name: str,
        *,
        source: InstanceSource | None = None,
        tools: list[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        max_retries: int = 2,
        tool_timeout: float | None = None,
        reward_timeout: float | None = None,
        keep_records: int = 1024,
    ) -> None:
        self.env_name = env_name
        self.source: InstanceSource = source or SDKSource(env_name)
        self.system_prompt = system_prompt
        self.max_retries = max_retries
        self.tool_timeout = tool_timeout
        self.reward_timeout = reward_timeout
        self.records: collections.deque[TRLEpisodeRecord] = collections.deque(maxlen=keep_records)
        self.started = 0  # instances acquired
        self.released = 0  # instances given back
        self._count = itertools.count()
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._held: set[concurrent.futures.Future[InstanceHandle]] = set()
        self._lock = threading.Lock()
        self._loop = _Loop(f"aenv-trl-{env_name}")
        try:
            specs = tools if tools is not None else self._run(self._read_tools())
            self.tool_names: dict[str, str] = {}
            self.episode_class = self._episode_class(specs)
        except BaseException:
            self._loop.close()
            raise

    # -- TRL's side ----------------------------------------------------------------------------

    def __call__(self) -> TRLEpisode:
        """A new object for TRL to play rollouts with (TRL makes one per concurrent rollout)."""
        return self.episode_class(self)

    @property
    def reward_name(self) -> str:
        """The name TRL logs the environment's reward under (``rewards/NAME/mean``)."""
        return self.episode_class.__name__

    def rows(self, tasks: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Dataset rows of ``tasks``: ``prompt`` (the conversation the model is given: the
        task's ``messages``, or its ``prompt`` as a user message, after
        :func:`~rollout.task_view.policy_view`) and ``task`` (JSON of
        :func:`~rollout.task_view.record_view`, for ``reset``; TRL never shows it to the model).

            >>> (row,) = TRLEnvironments.rows_of([{"prompt": "hi", "reward_arguments": {"x": 1}}])
            >>> row["prompt"]
            [{'role': 'user', 'content': 'hi'}]
            >>> row["task"]
            '{"prompt": "hi", "reward_arguments": {"x": 1}, "id": "0"}'
        """
        return self.rows_of(tasks, system_prompt=self.system_prompt)

    @staticmethod
    def rows_of(
        tasks: Iterable[Mapping[str, Any]], *, system_prompt: str | None = None
    ) -> list[dict[str, Any]]:
        """:meth:`rows` without a factory (``system_prompt`` as its)."""
        rows = []
        for n, task in enumerate(tasks):
            task = {**task, "id": str(task.get("id", n))}
            given = policy_view(task)
            messages = given.get("messages")
            if isinstance(messages, list) and messages:
                prompt = [
                    {"role": str(m.get("role", "user")), "content": str(m.get("content") or "")}
                    for m in messages
                    if isinstance(m, Mapping)
                ]
            else:
                prompt = [{"role": "user", "content": str(given.get("prompt") or "")}]
            if system_prompt and prompt[0]["role"] != "system":
                prompt.insert(0, {"role": "system", "content": system_prompt})
            rows.append({"prompt": prompt, "task": json.dumps(record_view(task))})
        return rows

    # -- the factory's own ---------------------------------------------------------------------

    @property
    def live(self) -> int:
        """Instances acquired and not yet given back (0 after :meth:`close`)."""
        return self.started - self.released

    def close(self) -> None:
        """Give back every instance still held (rollouts whose reward was never asked) and
        stop the factory's event loop. TRL's objects must not be used after this."""
        with self._lock:
            held = list(self._held)
        for start in held:
            self._finish(start, None, broken=False)
        self.wait_released()
        self._loop.close()

    def wait_released(self, timeout: float | None = 120.0) -> None:
        """Wait until every instance given back has been released."""
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending, timeout=timeout)

    def __enter__(self) -> TRLEnvironments:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def _new_episode_id(self) -> str:
        return f"trl-{next(self._count)}"

    async def _read_tools(self) -> list[dict[str, Any]]:
        instance = await self.source.acquire()
        broken = False
        try:
            return await instance.list_tools()
        except BaseException:
            broken = True
            raise
        finally:
            await self.source.release(instance, broken=broken)

    def _episode_class(self, specs: list[dict[str, Any]]) -> type[TRLEpisode]:
        prefix = f"{self.env_name}/"
        taken: set[str] = set()
        methods: dict[str, Any] = {}
        for spec in specs:
            tool = {**spec, "name": str(spec["name"]).removeprefix(prefix)}
            name = _method_name(tool["name"], taken)
            self.tool_names[name] = tool["name"]
            methods[name] = _tool_method(name, tool)
        class_name = "aenv_" + _NOT_IDENTIFIER.sub("_", self.env_name)
        return type(class_name, (TRLEpisode,), {**methods, "__module__": __name__})

    def _begin(
        self, task: dict[str, Any], record: TRLEpisodeRecord
    ) -> concurrent.futures.Future[InstanceHandle]:
        with self._lock:
            start = self._loop.submit(self._start(task, record))
            self._held.add(start)
        return start

    async def _start(self, task: dict[str, Any], record: TRLEpisodeRecord) -> InstanceHandle:
        """A fresh instance with the task's setup done; one whose start failed is given back
        broken and another tried, ``max_retries`` times."""
        attempt = 0
        while True:
            instance: InstanceHandle | None = None
            try:
                instance = await self.source.acquire()
                self.started += 1
                record.instance_id = instance.instance_id
                for call in task.get("setup") or []:
                    await instance.call_function(call["function"], call.get("arguments") or {})
                return instance
            except Exception as exc:
                if instance is not None:
                    await self._release(instance, broken=True)
                infrastructure = classify(exc) is EpisodeOutcome.INFRASTRUCTURE_ERROR
                if not infrastructure or attempt >= self.max_retries:
                    raise
                attempt += 1

    def _finish(
        self,
        start: concurrent.futures.Future[InstanceHandle],
        record: TRLEpisodeRecord | None,
        *,
        broken: bool,
    ) -> None:
        async def finish() -> None:
            try:
                instance = await asyncio.wrap_future(start)
            except Exception:
                return  # it never started (and was given back by _start)
            await self._release(instance, broken=broken)

        with self._lock:
            if start not in self._held:
                return  # given back already
            self._held.discard(start)
            if record is not None:
                self.records.append(record)
            future = self._loop.submit(finish())
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    async def _release(self, instance: InstanceHandle, *, broken: bool) -> None:
        try:
            await self.source.release(instance, broken=broken)
        except AEnvError:
            pass  # an instance that is gone already is released
        finally:
            self.released += 1
