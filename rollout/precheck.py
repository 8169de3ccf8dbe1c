"""What ``aenv rollout`` checks before it starts Ray or any instance, so a mistake costs a
second and one line, not a pool's start-up and a run of failed episodes.

- :func:`import_policy`: ``MODULE:CALLABLE`` imports (the current directory is importable, as
  for ``python -m``) and :func:`check_policy`: it is an async callable that takes
  ``(task, env)``.
- :func:`environment_calls`: the environment resolves (through the hub when one is
  configured) and, when the tasks call its reward or functions, what those take: from the
  hub's record of the version, else from loading the project in a sandbox of the local engine
  (never in this process: environment code is untrusted).
- :func:`check_tasks`: every task's reward arguments and setup calls are ones the environment
  takes.
- :func:`check_data_paths`: the instance variables that name the environment's data (a
  Terminal-Bench dataset, a task) name what the instances see: the datasource, mounted at
  ``/data``, not a directory of this machine.

Each failure is a :class:`~aenv_ray.errors.ConfigurationError` (or
:class:`~aenv_ray.errors.EnvironmentNotFoundError`) whose message is the one line the CLI
prints.

May import: ``aenv_ray``, ``rollout.synthesis`` (policies, tasks); lazily: ``aenv_ray.engine``
(the local engine, by name), ``aenv_ray.hub``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError, DefinitionError

__all__ = [
    "DATA_MOUNT",
    "CallShape",
    "EnvironmentCalls",
    "check_data_paths",
    "check_policy",
    "check_tasks",
    "environment_calls",
    "import_policy",
]

log = logging.getLogger("rollout.precheck")

DATA_MOUNT = "/data"
"""Where an instance of the local engine sees its datasource (read-only)."""


@contextlib.contextmanager
def _cwd_importable() -> Iterator[None]:
    """The current directory first on ``sys.path`` while a policy imports (``aenv`` is a
    console script: its ``sys.path[0]`` is the script's directory, not the user's)."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def import_policy(spec: str) -> Any:
    """The policy ``MODULE:CALLABLE`` names, imported with the current directory importable and
    checked by :func:`check_policy`.

    >>> import_policy("no_such_module_here:policy")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    aenv_ray.errors.ConfigurationError: cannot import policy module 'no_such_module_here': ...
    """
    from rollout.synthesis import load_policy

    module = spec.partition(":")[0]
    with _cwd_importable():
        try:
            policy = load_policy(spec)
        except ConfigurationError as exc:
            if isinstance(exc.__cause__, ModuleNotFoundError) and exc.__cause__.name == module:
                raise ConfigurationError(
                    f"{exc} (looked in the current directory and the installed packages)"
                ) from None
            raise
        except Exception as exc:  # the module itself raised while it imported
            where = _frame_of(exc)
            raise ConfigurationError(
                f"importing policy module {module!r} failed{where}: {type(exc).__name__}: {exc}"
            ) from exc
    check_policy(policy, spec)
    return policy


def _frame_of(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of ``exc``, or ``""``."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def check_policy(policy: Any, name: str) -> None:
    """Raise :class:`ConfigurationError` unless ``policy`` is an async callable that takes
    ``(task, env)`` (the documented ``async def policy(task, env) -> str | None``).

    >>> async def takes_one(task): ...
    >>> check_policy(takes_one, "mine:takes_one")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    aenv_ray.errors.ConfigurationError: policy mine:takes_one takes (task), but is called ...
    """
    if not callable(policy):
        raise ConfigurationError(f"policy {name} is not callable: {type(policy).__name__}")
    target = inspect.unwrap(policy)
    call = inspect.getattr_static(type(target), "__call__", None)
    is_async = inspect.iscoroutinefunction(target) or (
        not inspect.isfunction(target)
        and not inspect.ismethod(target)
        and call is not None
        and inspect.iscoroutinefunction(inspect.unwrap(call))
    )
    if not is_async:
        raise ConfigurationError(
            f"policy {name} is not async: define it as `async def policy(task, env) -> str | None`"
        )
    try:
        signature = inspect.signature(policy)
    except (TypeError, ValueError):
        return  # a callable Python cannot describe: its call will tell
    try:
        signature.bind(object(), object())
    except TypeError as exc:
        shown = ", ".join(
            {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(p.kind.name, "") + p.name
            for p in signature.parameters.values()
        )
        raise ConfigurationError(
            f"policy {name} takes ({shown}), but is called as policy(task, env): {exc}"
        ) from None


@dataclass(frozen=True)
class CallShape:
    """The arguments one of the environment's calls (its reward, a function) takes."""

    name: str
    parameters: tuple[str, ...]
    required: frozenset[str]
    open: bool
    """Takes names beyond ``parameters`` (its schema does not forbid them)."""

    @classmethod
    def of(cls, described: Mapping[str, Any]) -> CallShape:
        """From a described call (``{"name", "inputSchema"}``: what an instance's template
        reports; untrusted, so read leniently)."""
        schema = described.get("inputSchema")
        schema = schema if isinstance(schema, Mapping) else {}
        properties = schema.get("properties")
        names = tuple(str(p) for p in properties) if isinstance(properties, Mapping) else ()
        required = schema.get("required")
        return cls(
            name=str(described.get("name")),
            parameters=names,
            required=frozenset(str(r) for r in required)
            if isinstance(required, list)
            else (frozenset()),
            open=schema.get("additionalProperties", True) is not False,
        )

    def problems(self, arguments: Mapping[str, Any]) -> list[str]:
        """What is wrong with calling it with ``arguments`` (empty: nothing)."""
        wrong = []
        unknown = [a for a in arguments if a not in self.parameters]
        if unknown and not self.open:
            takes = ", ".join(f"`{p}`" for p in self.parameters) or "no arguments"
            wrong.append(
                f"argument{'s' if len(unknown) > 1 else ''} {', '.join(f'`{u}`' for u in unknown)}"
                f", which it does not take (it takes {takes})"
            )
        missing = sorted(self.required - set(arguments))
        if missing:
            wrong.append(f"no {', '.join(f'`{m}`' for m in missing)}, which it requires")
        return wrong


@dataclass(frozen=True)
class EnvironmentCalls:
    """What an environment's reward and functions take (``None``: no reward)."""

    ref: str
    reward: CallShape | None
    functions: Mapping[str, CallShape]

    @classmethod
    def from_manifest(cls, ref: str, manifest: Mapping[str, Any]) -> EnvironmentCalls | None:
        """From a template's manifest (``None`` when it does not describe its calls: an older
        runtime, a hub that could not load the version)."""
        calls = manifest.get("calls")
        if not isinstance(calls, Mapping) or not isinstance(calls.get("functions"), list):
            return None
        reward = calls.get("reward")
        functions = [f for f in calls["functions"] if isinstance(f, Mapping)]
        return cls(
            ref=ref,
            reward=CallShape.of(reward) if isinstance(reward, Mapping) else None,
            functions={str(f.get("name")): CallShape.of(f) for f in functions},
        )


def _needs_calls(tasks: Sequence[Mapping[str, Any]]) -> bool:
    return any(t.get("reward_arguments") is not None or t.get("setup") for t in tasks)


def check_tasks(
    tasks: Sequence[Mapping[str, Any]], calls: EnvironmentCalls, *, source: str = "the tasks"
) -> None:
    """Raise :class:`ConfigurationError` for the first task whose reward arguments or setup
    calls the environment would refuse (the message names the task, the call and the fix)."""
    for task in tasks:
        where = f"{source}: task `{task.get('id')}`"
        arguments = task.get("reward_arguments")
        if arguments is not None:
            if not isinstance(arguments, Mapping):
                raise ConfigurationError(
                    f"{where}: reward_arguments must be an object of the reward's arguments, "
                    f"not {type(arguments).__name__}"
                )
            if calls.reward is None:
                raise ConfigurationError(
                    f"{where} gives reward_arguments, but {calls.ref} registers no reward: "
                    "drop them, or add a @register_reward to the environment"
                )
            wrong = calls.reward.problems(arguments)
            if wrong:
                raise ConfigurationError(
                    f"{where} gives the reward `{calls.reward.name}` {'; and '.join(wrong)}: "
                    "fix the task's reward_arguments"
                )
        setup = task.get("setup") or []
        if not isinstance(setup, list):
            raise ConfigurationError(
                f'{where}: setup must be a list of {{"function": NAME, "arguments": {{...}}}}'
            )
        for call in setup:
            name = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(name, str):
                raise ConfigurationError(
                    f'{where}: each setup step is {{"function": NAME, "arguments": {{...}}}}, '
                    f"not {call!r:.80}"
                )
            shape = calls.functions.get(name)
            if shape is None:
                known = ", ".join(sorted(calls.functions)) or "none"
                raise ConfigurationError(
                    f"{where}: setup calls `{name}`, which {calls.ref} does not register "
                    f"(its functions: {known})"
                )
            args = call.get("arguments") or {}
            wrong = (
                shape.problems(args)
                if isinstance(args, Mapping)
                else ["arguments not given as an object"]
            )
            if wrong:
                raise ConfigurationError(
                    f"{where}: setup gives `{name}` {'; and '.join(wrong)}: fix the task's setup"
                )


async def environment_calls(
    env: str,
    tasks: Sequence[Mapping[str, Any]],
    *,
    hub_url: str | None = None,
    api_key: str | None = None,
) -> EnvironmentCalls | None:
    """Resolve ``env`` (a ``name[@version]`` or a project directory) as the run will: through
    the hub at ``hub_url`` when given, else among the built-ins and ``AENV_ENV_PATH``; and,
    when ``tasks`` call its reward or functions, what those take (``None`` when nothing needs
    them, or nothing can say: the check is then left to the first call).

    Raises :class:`~aenv_ray.errors.EnvironmentNotFoundError` (with the names that exist) or
    :class:`ConfigurationError`: a project that does not load names its file and line.
    """
    needed = _needs_calls(tasks)
    if "/" in env or env.startswith("."):
        project = Path(env)
        if not (project / "config.json").is_file():
            raise ConfigurationError(
                f"{env}: not an environment project (no config.json there); give a project "
                "directory or a name@version"
            )
        return await _loaded_calls(env, project) if needed else None
    if hub_url:
        return await _hub_calls(env, hub_url, api_key, needed)
    from aenv_ray.resolve import resolve_environment

    ref, project = resolve_environment(env, None)
    return await _loaded_calls(ref, project) if needed else None


async def _hub_calls(
    env: str, hub_url: str, api_key: str | None, needed: bool
) -> EnvironmentCalls | None:
    from aenv_ray.hub import HubClient

    async with HubClient(hub_url, api_key=api_key, timeout=60.0) as hub:
        found = await hub.resolve(env)
    ref = str(found.get("ref") or env)
    calls = found.get("calls")
    if not needed:
        return None
    if isinstance(calls, Mapping):  # what the hub's sandbox saw when it loaded it
        return EnvironmentCalls.from_manifest(ref, {"calls": calls})
    log.info(
        "the hub cannot say what the environment's calls take; checked at the first call",
        extra={"ref": ref},
    )
    return None


async def _loaded_calls(ref: str, project: Path) -> EnvironmentCalls | None:
    """Load ``project`` in a sandbox of the local engine and read what its calls take."""
    from aenv_ray.engine import new_engine
    from aenv_ray.loadcheck import load_in_sandbox

    try:
        engine = new_engine("local")
    except ConfigurationError as exc:  # no local sandboxes here (not Linux, say)
        log.info("no local engine to check the tasks with", extra={"reason": str(exc)})
        return None
    try:
        manifest = await load_in_sandbox(engine, project, shown=f"{project}/")
    except DefinitionError as exc:
        raise ConfigurationError(f"{ref} does not load: {exc}") from None
    finally:
        await engine.aclose()
    return EnvironmentCalls.from_manifest(ref, manifest) if manifest is not None else None


def check_data_paths(
    names: Sequence[str],
    variables: Mapping[str, str],
    datasource: Path | None,
    *,
    given: str | None = None,
) -> None:
    """Raise :class:`ConfigurationError` when one of the instance variables ``names`` (those
    that name the environment's data in the instance, such as ``TB_DATASET_DIR``) names a
    path the instances cannot see: anything outside the datasource's mount (``/data``; an
    instance sees none of this machine's directories), ``/data`` without a datasource, or, with
    ``datasource`` (its directory on this machine; None on a hub, whose directories this
    machine cannot look at), a path under ``/data`` that is not in it. The message names the
    path on this machine and in the instance. ``given`` is the datasource as given (a hub's).

    >>> check_data_paths(["TB_DATASET_DIR"], {"TB_DATASET_DIR": "/srv/tb"}, None)
    ... # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    aenv_ray.errors.ConfigurationError: -e TB_DATASET_DIR=/srv/tb names /srv/tb, which the
    instances cannot see: ... pass --datasource /srv/tb and drop -e TB_DATASET_DIR ...
    """
    for name in names:
        value = variables.get(name) or ""
        parts = value.split(os.pathsep)  # SWE_REPOS: a list
        for part in parts:
            if part:
                _check_data_path(name, value, part, datasource, given, listed=len(parts) > 1)


def _check_data_path(
    name: str,
    value: str,
    part: str,
    datasource: Path | None,
    given: str | None,
    *,
    listed: bool,
) -> None:
    inside = os.path.normpath(part)
    if inside != DATA_MOUNT and not inside.startswith(DATA_MOUNT + "/"):
        fix = (
            f"write {DATA_MOUNT} for it in {name}"
            if listed
            else f"drop -e {name} (the instances then read it at {DATA_MOUNT})"
        )
        raise ConfigurationError(
            f"-e {name}={value} names {inside}, which the instances cannot see: they see "
            f"none of this machine's directories, only the datasource, mounted at "
            f"{DATA_MOUNT}; pass --datasource {inside} and {fix}, or name a path under "
            f"{DATA_MOUNT}"
        )
    if datasource is None and given is None:
        raise ConfigurationError(
            f"-e {name}={value} names {inside} in the instance, the datasource's mount, "
            "but no --datasource was given: pass --datasource DIR (mounted at "
            f"{DATA_MOUNT})"
        )
    if datasource is None:
        return  # a hub's directory: the hub checks it
    host = datasource / os.path.relpath(inside, DATA_MOUNT)
    if not host.exists():
        raise ConfigurationError(
            f"-e {name}={value}: the instances will not find {inside}: there is no "
            f"{os.path.normpath(host)} on this machine (--datasource {datasource} is "
            f"mounted at {DATA_MOUNT})"
        )
