"""Gymnasium wrappers: an environment's instances as a ``gymnasium.Env`` or ``VectorEnv``.

    >>> import gymnasium
    >>> import rollout.gym
    >>> env = rollout.gym.make_env(
    ...     "mini-terminal@1.0.0",
    ...     tasks=[{"prompt": "Write 42 into out.txt",
    ...             "reward_arguments": {"path": "out.txt", "expected": "42"}}],
    ... )
    >>> obs, info = env.reset(seed=0)
    >>> obs
    'Write 42 into out.txt'
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     '{"tool": "execute_command", "arguments": {"command": "echo 42 > out.txt"}}')
    >>> env.step({"tool": "submit"})[1:3]
    (1.0, True)
    >>> env.close()
    >>> gymnasium.make("aenv/mini-terminal.1.0.0").spec.id  # registered ids
    'aenv/mini-terminal.1.0.0'

The episode protocol:

- **Spaces.** Observations and actions are :class:`AnyText`, a ``Text`` space that contains
  every ``str``.
- **reset(seed=, options=).** Picks a task: ``options["task"]`` (an index into ``tasks``, a
  :class:`Task`, a dict or a prompt), else one drawn with the env's seeded ``np_random``
  (none given: an empty task). The first episode gets a new instance; later ones reuse it when
  the environment registers a ``reset`` function, else get a new one (``reset_mode=
  ResetMode.FRESH_INSTANCE``: always new). A ``reset`` function is called as
  ``reset(seed=S, **task.reset_arguments)``, ``S`` drawn from ``np_random``. The first
  observation is the task's ``prompt``; info is ``{"task_id": task.id}``.
- **step(action).** An action is ``{"tool": NAME, "arguments": {...}}`` as a dict or JSON text
  (``arguments`` optional; it may be JSON text, as OpenAI tool calls carry it). The observation
  is the tool result's text, error results included. A malformed action is the agent's error:
  its observation says what is wrong and lists the tools; it counts as a step. Info:
  ``{"tool", "is_error", "error_kind"}`` (``error_kind``: a ``ToolErrorKind`` value,
  ``"invalid_action"`` or ``""``).
- **Termination.** A call to ``submit_tool`` (default ``"submit"``; the environment's own tool
  of that name runs first if it has one, else the observation is ``""``), or a tool whose JSON
  result is an object with ``"done": true``. **Truncation**: the ``max_steps``-th step (default
  50) that did not terminate.
- **Reward.** 0.0 on every step but the last; on the last (terminated or truncated), the
  environment's reward called with ``task.reward_arguments``, as a float. It takes every form
  ``aenv rollout`` takes (:func:`rollout.rewards.split_reward`: a number, ``{"reward": x,
  ...components}``, AEnvironment's ``{"score": x, ...}``); the last step's info adds
  ``"reward_components"`` (the object's other keys, or None) and ``"scored"`` (False for
  ``{"reward": null}``, an episode the environment does not score: its reward is 0.0). A task
  without ``reward_arguments`` (no tasks: the empty task) asks the reward with none; where the
  reward needs some (mini-terminal's does), or there is no reward, the episode ends unscored
  the same way instead of failing.
- **close()** releases the instance and stops the private event-loop thread. Infrastructure
  failures (a dead instance, a timeout) raise typed :mod:`aenv_ray.errors`.

Registered ids: ``aenv/NAME.VERSION`` and ``aenv/NAME`` (its newest version) for the built-in
environments and those on ``AENV_ENV_PATH``. Gymnasium ids admit no ``@`` and read ``:`` as
``module:name``; names have no ``.``, so the first ``.`` marks the version: :func:`gym_id` and
:func:`env_ref` map between the two. Vector ids: ``gymnasium.make_vec(id, num_envs=N,
vectorization_mode="vector_entry_point")``.

May import: ``aenv_ray``, gymnasium, numpy (the arrays of gymnasium's vector API).
Must not import: ray, kubernetes (engines are injected).
"""

from __future__ import annotations

import asyncio
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
from gymnasium.spaces import Text
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, iterate

from aenv_ray.envref import EnvRef
from aenv_ray.errors import ConfigurationError
from rollout._gym_episode import (
    Episode,
    EpisodeConfig,
    ResetMode,
    ResetNeededError,
    StepResult,
    Task,
)
from rollout._gym_loop import LoopThread
from rollout.sources import InstanceSource, SDKSource

if TYPE_CHECKING:
    from aenv_ray.engine import SandboxEngine

__all__ = [
    "AnyText",
    "ResetMode",
    "ResetNeededError",
    "Task",
    "ToolEnv",
    "ToolVectorEnv",
    "env_ref",
    "gym_id",
    "make_env",
    "make_vector_env",
    "register_envs",
]

NAMESPACE = "aenv"
_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "
_GYM_NAME = re.compile(r"^[\w.-]+$")


class AnyText(Text):
    """A ``Text`` space that contains every ``str`` (tool output is any length, any Unicode).

    ``min_length``, ``max_length`` and ``charset`` only shape :meth:`sample`; strings are not
    flattenable to a fixed-size array.

    >>> space = AnyText()
    >>> "anything at all: ∑ ✓ \\n" * 1000 in space, b"bytes" in space
    (True, False)
    """

    def __init__(
        self,
        max_length: int = 64,
        *,
        min_length: int = 0,
        charset: str = _SAMPLE_CHARSET,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # like Text: equal spaces, no hash

    def __repr__(self) -> str:
        return f"AnyText(samples of {self.min_length}-{self.max_length} chars)"


# -- ids ----------------------------------------------------------------------------------------


def gym_id(ref: str) -> str:
    """The gymnasium id of ``name@version`` (or ``name``): ``aenv/name.version``.

    >>> gym_id("mini-terminal@1.0.0"), gym_id("mini-terminal")
    ('aenv/mini-terminal.1.0.0', 'aenv/mini-terminal')
    """
    parsed = EnvRef.parse(ref)
    name, version = parsed.name, parsed.version
    joined = f"{name}.{version}" if version else name
    if (
        parsed.tenant is not None
        or "." in name
        or not _GYM_NAME.fullmatch(joined)
        or re.search(r"-v\d+$", joined)
    ):
        raise ConfigurationError(
            f"`{ref}` has no gymnasium id: an id is `aenv/NAME[.VERSION]` in letters, digits, "
            "`_ . -`, not ending in `-v<digits>` (gymnasium's own version suffix)"
        )
    return f"{NAMESPACE}/{joined}"


def env_ref(env_id: str) -> str:
    """The inverse of :func:`gym_id`.

    >>> env_ref("aenv/mini-terminal.1.0.0")
    'mini-terminal@1.0.0'
    """
    prefix = NAMESPACE + "/"
    if not env_id.startswith(prefix):
        raise ConfigurationError(f"`{env_id}` is not an aenv id (`{prefix}NAME[.VERSION]`)")
    name, dot, version = env_id[len(prefix) :].partition(".")
    return str(EnvRef(name, version if dot else None))


def register_envs(refs: Iterable[str] | None = None) -> list[str]:
    """Register ``aenv/...`` ids for ``refs`` (default: the built-ins and ``AENV_ENV_PATH``,
    each as ``aenv/NAME.VERSION`` and ``aenv/NAME``); return the ids added now."""
    if refs is None:
        from aenv_ray import available_environments

        found = list(available_environments())
        refs = [*found, *dict.fromkeys(EnvRef.parse(ref).name for ref in found)]
    added = []
    for ref in refs:
        env_id = gym_id(ref)
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            env_id,
            entry_point=f"{__name__}:make_env",
            vector_entry_point=f"{__name__}:make_vector_env",
            kwargs={"env_name": ref},
        )
        added.append(env_id)
    return added


# -- the single environment ---------------------------------------------------------------------


def _build(
    env_name: str,
    *,
    tasks: Sequence[Task | Mapping[str, Any] | str] = (),
    max_steps: int = 50,
    submit_tool: str = "submit",
    reset_mode: ResetMode | str = ResetMode.AUTO,
    timeout: float | None = None,
    startup_timeout: float | None = None,
    ttl: str | float | None = None,
    environment_variables: Mapping[str, str] | None = None,
    engine: SandboxEngine | None = None,
    source: InstanceSource | None = None,
) -> tuple[InstanceSource, EpisodeConfig, float]:
    """The options of :func:`make_env`, checked: the instance source, the episode protocol's
    knobs and the backstop for one reset or step (the SDK bounds each call; this their sum)."""
    if source is None:
        source = SDKSource(
            str(env_name), timeout, startup_timeout, ttl, environment_variables, engine
        )
    config = EpisodeConfig(
        tuple(Task.coerce(t) for t in tasks), max_steps, submit_tool, ResetMode(reset_mode)
    )
    wait = (startup_timeout or 120.0) + 3 * ((timeout or 60.0) + 5.0) + 30.0
    return source, config, wait


class ToolEnv(gymnasium.Env[str, Any]):
    """One environment instance at a time as a ``gymnasium.Env``; see :func:`make_env`."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (gymnasium's class attribute)

    def __init__(self, env_name: str, **options: Any) -> None:
        source, config, self._wait = _build(env_name, **options)
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self._episode = Episode(source, config)
        self._loop = LoopThread(f"aenv-gym {source.label}")

    @property
    def instance_id(self) -> str | None:
        """The id of the instance the current episode runs on (``None`` before reset)."""
        instance = self._episode.instance
        return instance.instance_id if instance is not None else None

    @property
    def tools(self) -> tuple[str, ...]:
        """The environment's tool names (known after the first reset)."""
        return self._episode.tools

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode: see the protocol in :mod:`rollout.gym`."""
        super().reset(seed=seed)
        return self._loop.run(self._episode.reset(self.np_random, options), timeout=self._wait)

    def step(self, action: Any) -> StepResult:
        """One tool call (or a malformed action): see the protocol in :mod:`rollout.gym`."""
        return self._loop.run(self._episode.step(action), timeout=self._wait)

    def close(self) -> None:
        """Release the instance and stop the event-loop thread. Idempotent."""
        if self._loop.is_closed:
            return
        try:
            self._loop.run(self._episode.aclose(), timeout=self._wait)
        finally:
            self._loop.close()
        super().close()  # type: ignore[no-untyped-call]  # gymnasium: `def close(self):`

    def __repr__(self) -> str:
        return f"ToolEnv({self._episode.source.label!r})"


def make_env(env_name: str, **kwargs: Any) -> ToolEnv:
    """A :class:`ToolEnv` over ``env_name`` (``"name@version"``, ``"name"``, or a project
    directory's path). Keywords: ``tasks``, ``max_steps``, ``submit_tool``, ``reset_mode``,
    ``timeout``, ``startup_timeout``, ``ttl``, ``environment_variables``, ``engine``, and
    ``source``: where instances come from (default: an ``SDKSource``; a
    ``rollout.sources.PoolSource(pool)`` leases them from a Ray pool).

    Its ``spec`` lets ``spec.make()`` build another like it (gymnasium's checker does).
    """
    env = ToolEnv(env_name, **kwargs)
    ref = env_name if "/" not in str(env_name) else _project_ref(str(env_name))
    env.spec = gymnasium.envs.registration.EnvSpec(
        gym_id(ref),
        entry_point=f"{__name__}:make_env",
        vector_entry_point=f"{__name__}:make_vector_env",
        kwargs={"env_name": env_name, **kwargs},
    )
    return env


def _project_ref(path: str) -> str:
    from aenv_ray import EnvConfig

    return EnvConfig.load(path).ref


# -- the vector environment ---------------------------------------------------------------------


class ToolVectorEnv(VectorEnv[tuple[str, ...], Any, np.ndarray]):
    """``num_envs`` environments stepped concurrently on one event loop, autoreset NEXT_STEP.

    Seeded trajectories equal ``gymnasium.vector.SyncVectorEnv`` over :func:`make_env`s with the
    same arguments; see :func:`make_vector_env`.
    """

    def __init__(self, env_name: str, num_envs: int, **options: Any) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigurationError(f"num_envs must be a positive int, got {num_envs!r}")
        source, config, self._wait = _build(env_name, **options)
        self.num_envs = num_envs
        self.metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self.single_observation_space = AnyText()
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.single_action_space = AnyText()
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._episodes = [Episode(source, config) for _ in range(num_envs)]
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)
        self._loop = LoopThread(f"aenv-gym-vector {source.label}")

    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-environment (or those in ``options["reset_mask"]``), seeds as
        ``SyncVectorEnv``'s: ``None``, ``seed + i``, or one per environment."""
        seeds = _seeds(seed, self.num_envs)
        options = dict(options or {})
        mask = _reset_mask(options.pop("reset_mask", None), self.num_envs)
        self._autoreset[mask] = False
        chosen = [i for i in range(self.num_envs) if mask[i]]
        for i in chosen:
            self._rngs[i] = _reseed(self._rngs[i], seeds[i])
        results = self._gather(
            [self._episodes[i].reset(self._rng(i), options or None) for i in chosen]
        )
        infos: dict[str, Any] = {}
        for i, (_, info) in zip(chosen, results, strict=True):
            infos = self._add_info(infos, info, i)
        observations = list(self._last_observations())
        for i, (obs, _) in zip(chosen, results, strict=True):
            observations[i] = obs
        self._observations = tuple(observations)
        return self._observations, infos

    def step(
        self, actions: Any
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-environment at once; one that ended last step is reset instead
        (reward 0.0, not terminated, not truncated)."""
        coros = []
        for i, action in enumerate(iterate(self.action_space, actions)):
            if self._autoreset[i]:
                coros.append(self._reset_as_step(i))
            else:
                coros.append(self._episodes[i].step(action))
        results = self._gather(coros)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, (_, reward, terminated, truncated, info) in enumerate(results):
            rewards[i], terminations[i], truncations[i] = reward, terminated, truncated
            infos = self._add_info(infos, info, i)
        self._observations = tuple(result[0] for result in results)
        self._autoreset = np.logical_or(terminations, truncations)
        return self._observations, rewards, terminations, truncations, infos

    async def _reset_as_step(self, i: int) -> StepResult:
        obs, info = await self._episodes[i].reset(self._rng(i), None)
        return obs, 0.0, False, False, info

    def _rng(self, i: int) -> np.random.Generator:
        rng = self._rngs[i] = _reseed(self._rngs[i], None)
        return rng

    def _last_observations(self) -> tuple[str, ...]:
        return getattr(self, "_observations", ("",) * self.num_envs)

    def _gather(self, coros: list[Any]) -> list[Any]:
        """Run ``coros`` concurrently; all finish, then the first failure (if any) raises."""

        async def together() -> list[Any]:
            return await asyncio.gather(*coros, return_exceptions=True)

        results = self._loop.run(together(), timeout=self._wait)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def close_extras(self, **kwargs: Any) -> None:
        """Release every instance and stop the event-loop thread."""
        if self._loop.is_closed:
            return
        try:
            self._gather([episode.aclose() for episode in self._episodes])
        finally:
            self._loop.close()

    def __repr__(self) -> str:
        return f"ToolVectorEnv({self._episodes[0].source.label!r}, num_envs={self.num_envs})"


def make_vector_env(env_name: str, num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    """A :class:`ToolVectorEnv` of ``num_envs`` environments; keywords as :func:`make_env`."""
    return ToolVectorEnv(env_name, num_envs, **kwargs)


def _reseed(rng: np.random.Generator | None, seed: int | None) -> np.random.Generator:
    """What ``gymnasium.Env.reset(seed=...)`` does to ``np_random``."""
    if seed is not None or rng is None:
        rng, _ = seeding.np_random(seed)
    return rng


def _seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ConfigurationError(f"{len(seeds)} seeds for {n} environments; pass one per env")
    return seeds


def _reset_mask(mask: Any, n: int) -> np.ndarray:
    if mask is None:
        return np.ones(n, dtype=np.bool_)
    if not isinstance(mask, np.ndarray) or mask.shape != (n,) or mask.dtype != np.bool_:
        raise ConfigurationError(f"options['reset_mask'] must be a bool array of shape ({n},)")
    if not mask.any():
        raise ConfigurationError("options['reset_mask'] must select at least one environment")
    return mask


register_envs()
