"""RLlib: an environment's instances as an RLlib environment, through a numeric view of text.

RLlib's episodes treat a ``str`` observation as a sequence and split it into characters, and its
models need arrays. :class:`NumericToolEnv` wraps :class:`rollout.gym.ToolEnv` so that
observations and actions are fixed-length arrays: UTF-8 bytes (:class:`ByteCodec`, the
default) or token ids of any tokenizer (:class:`TokenCodec`): a float32 ``Box`` observation
(the values divided by the largest, by default) and either a ``Discrete`` action over a menu
of tool calls (``actions=``) or a ``MultiDiscrete`` one (one choice per position). An action
array is decoded to text and handed to the text environment (a JSON tool call, see
:mod:`rollout.gym`); what does not decode to a valid action is the agent's error, answered as
an observation.

    from ray.rllib.algorithms.ppo import PPOConfig
    import rollout.rllib
    name = rollout.rllib.register("mini-terminal@1.0.0", max_observation_len=2048)
    config = PPOConfig().environment(name, env_config={"max_steps": 20})

    # what PPO learns in a few iterations: an actions menu (Discrete), RLlib's env runners
    # leasing warm instances of a RolloutPool (docs/training.md#rllib)
    name = rollout.rllib.register("corridor@1.0.0", pool=pool, actions=[{"tool": "left"},
                                  {"tool": "right"}], max_observation_len=48)

:func:`register` calls ``ray.tune.register_env(name, creator)``; the creator merges RLlib's
``env_config`` into the options of :func:`rollout.gym.make_env`. Training needs torch, which
the extra leaves out (docs/training.md#rllib). Needs ``ray[rllib]``
(``pip install 'aenv-ray[rllib]'``, from a checkout ``pip install -e '.[rllib]'``), which
pins gymnasium 1.2.2.

May import: ``aenv_ray``, ``rollout``, gymnasium, numpy; lazily, inside functions: ray.tune.
Must not import: kubernetes (engines are injected).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium
import numpy as np
from gymnasium import spaces

from aenv_ray.extras import require_extra
from rollout.gym import ToolEnv, make_env

__all__ = ["ByteCodec", "Codec", "NumericToolEnv", "TokenCodec", "register", "rllib_name"]


class Codec(Protocol):
    """Text <-> a fixed-length integer array (``pad`` fills the tail)."""

    @property
    def high(self) -> int:
        """The largest value an element takes."""

    @property
    def dtype(self) -> Any:
        """The arrays' numpy dtype."""

    @property
    def pad(self) -> int:
        """The value that fills an array's tail."""

    def encode(self, text: str, length: int) -> np.ndarray: ...

    def decode(self, array: np.ndarray) -> str: ...


@dataclass(frozen=True)
class ByteCodec:
    """UTF-8 bytes, zero-padded; longer text keeps its head (a cut character is dropped)."""

    high: int = 255
    dtype: Any = np.uint8
    pad: int = 0

    def encode(self, text: str, length: int) -> np.ndarray:
        data = text.encode("utf-8")[:length]
        array = np.zeros(length, dtype=self.dtype)
        array[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        return array

    def decode(self, array: np.ndarray) -> str:
        data = np.asarray(array, dtype=np.uint8).tobytes().rstrip(b"\0")
        return data.decode("utf-8", errors="ignore")


@dataclass(frozen=True)
class TokenCodec:
    """Token ids of a tokenizer: ``encode(text) -> ids``, ``decode(ids) -> text``, with
    ``vocab_size`` ids and ``pad_id`` for the tail (e.g. a Hugging Face tokenizer's)."""

    tokenize: Callable[[str], Sequence[int]]
    detokenize: Callable[[Sequence[int]], str]
    vocab_size: int
    pad_id: int = 0
    dtype: Any = np.int64

    @property
    def high(self) -> int:
        return self.vocab_size - 1

    @property
    def pad(self) -> int:
        return self.pad_id

    def encode(self, text: str, length: int) -> np.ndarray:
        ids = list(self.tokenize(text))[:length]
        array = np.full(length, self.pad_id, dtype=self.dtype)
        array[: len(ids)] = ids
        return array

    def decode(self, array: np.ndarray) -> str:
        ids = [int(i) for i in np.asarray(array).tolist()]
        while ids and ids[-1] == self.pad_id:
            ids.pop()
        return self.detokenize(ids)


class NumericToolEnv(gymnasium.Env[np.ndarray, Any]):
    """A :class:`~rollout.gym.ToolEnv` whose observations and actions are arrays of integers.

    Observations hold the codec's values as ``observation_dtype`` (default float32, what
    RLlib's torch models take; ``None``: the codec's own dtype), divided by the codec's
    largest value when ``normalize`` (the default: inputs in ``[0, 1]``, as a network wants
    them; a float dtype only). :meth:`decode_observation` gives an observation's text back.

    With ``actions`` (a menu of tool calls, dicts or JSON text) the action space is
    ``Discrete(len(actions))`` and action ``i`` is ``actions[i]``: what a small policy can learn
    in a few iterations. Without it, a ``MultiDiscrete`` array that decodes to the call's text.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (gymnasium's class attribute)

    def __init__(
        self,
        env: ToolEnv,
        *,
        codec: Codec | None = None,
        max_observation_len: int = 4096,
        max_action_len: int = 1024,
        actions: Sequence[str | Mapping[str, Any]] | None = None,
        observation_dtype: Any = np.float32,
        normalize: bool = True,
    ) -> None:
        if max_observation_len < 1 or max_action_len < 1:
            raise ValueError("max_observation_len and max_action_len must be >= 1")
        if actions is not None and not actions:
            raise ValueError("actions, when given, must name at least one tool call")
        self.env = env
        self.codec: Codec = codec or ByteCodec()
        self.max_observation_len = max_observation_len
        self.max_action_len = max_action_len
        high, dtype = self.codec.high, self.codec.dtype
        # float32 by default: RLlib's torch models take float input (its connectors cast nothing)
        self.observation_dtype = np.dtype(observation_dtype or dtype)
        if normalize and self.observation_dtype.kind != "f":
            raise ValueError(f"normalize needs a float dtype, not {self.observation_dtype}")
        self.normalize = normalize
        self.observation_space = spaces.Box(
            0, 1 if normalize else high, (max_observation_len,), dtype=self.observation_dtype.type
        )
        self.actions: tuple[str | Mapping[str, Any], ...] | None = (
            None if actions is None else tuple(actions)
        )
        self.action_space: spaces.Space[Any]
        if self.actions is not None:
            self.action_space = spaces.Discrete(len(self.actions))
        else:
            # one categorical choice per position: what a policy over bytes or tokens emits
            self.action_space = spaces.MultiDiscrete(
                np.full(max_action_len, high + 1, dtype=np.int64)
            )

    def encode_action(self, action: str | dict[str, Any]) -> np.ndarray:
        """The array that decodes to ``action`` (a JSON tool call, or its dict)."""
        import json

        text = action if isinstance(action, str) else json.dumps(action)
        return self.codec.encode(text, self.max_action_len)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        text, info = self.env.reset(seed=seed, options=options)
        return self._observe(text), {**info, "text": text}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step: ``action`` is an index into ``actions``, or an array of the codec."""
        call: Any
        if self.actions is not None:
            if not self.action_space.contains(action):
                raise ValueError(f"action {action!r} is not in {self.action_space}")
            call = self.actions[int(action)]
        else:
            call = self.codec.decode(action)
        text, reward, terminated, truncated, info = self.env.step(call)
        return self._observe(text), float(reward), terminated, truncated, {**info, "text": text}

    def _observe(self, text: str) -> np.ndarray:
        array = self.codec.encode(text, self.max_observation_len).astype(self.observation_dtype)
        return array / self.observation_dtype.type(self.codec.high) if self.normalize else array

    def decode_observation(self, observation: np.ndarray) -> str:
        """The text an observation encodes (its padding dropped)."""
        values = np.asarray(observation, dtype=np.float64)
        if self.normalize:
            values = values * self.codec.high
        return self.codec.decode(np.rint(values).astype(self.codec.dtype))

    def close(self) -> None:
        self.env.close()
        super().close()  # type: ignore[no-untyped-call]  # gymnasium: `def close(self):`


def rllib_name(env_name: str) -> str:
    """The name :func:`register` uses for ``env_name``: ``aenv-NAME-VERSION``."""
    return "aenv-" + env_name.replace("@", "-").replace("/", "-")


def register(
    env_name: str,
    *,
    name: str | None = None,
    codec: Codec | None = None,
    max_observation_len: int = 4096,
    max_action_len: int = 1024,
    actions: Sequence[str | Mapping[str, Any]] | None = None,
    observation_dtype: Any = np.float32,
    normalize: bool = True,
    pool: Any = None,
    **make_env_options: Any,
) -> str:
    """Register ``env_name`` with ``ray.tune.register_env``; return the registered name.

    RLlib calls the creator with its ``env_config`` (an ``EnvContext``, a dict): those keys
    override ``make_env_options`` (``tasks``, ``max_steps``, ...). ``pool``: a
    :class:`~rollout.pool.RolloutPool` whose warm instances every environment leases
    (``source=PoolSource(pool)``; the pool travels to RLlib's env runners with the creator),
    instead of creating its own. ``actions``: a menu of tool calls, the action space
    ``Discrete(len(actions))`` (see :class:`NumericToolEnv`).
    """
    require_extra("rllib", "rollout.rllib.register")
    from ray.tune.registry import register_env

    if pool is not None:
        from rollout.sources import PoolSource

        make_env_options["source"] = PoolSource(pool)

    registered = name or rllib_name(env_name)

    def one(options: dict[str, Any]) -> NumericToolEnv:
        return NumericToolEnv(
            make_env(env_name, **options),
            codec=codec,
            max_observation_len=max_observation_len,
            max_action_len=max_action_len,
            actions=actions,
            observation_dtype=observation_dtype,
            normalize=normalize,
        )

    def creator(env_config: dict[str, Any] | None = None) -> gymnasium.Env[Any, Any] | Any:
        options = {**make_env_options, **dict(env_config or {})}
        num_envs = options.pop("num_envs", None)  # RLlib's vector entry point asks for N
        if num_envs is None:
            return one(options)
        return gymnasium.vector.SyncVectorEnv([lambda: one(options)] * int(num_envs))

    register_env(registered, creator)
    return registered
