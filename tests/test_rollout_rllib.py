"""RLlib trains on aenv-ray: PPO (the new API stack, torch on CPU) for a few iterations on
``examples/corridor``, its env runner a Ray actor whose environments lease instances from a
:class:`~rollout.pool.RolloutPool`; and episodes without tasks end cleanly.

The training runs in a driver process of its own (tests/_rllib_train.py) that joins the session's
Ray: RLlib's actors and the pool end with that driver's job, and no Ray stays initialized here.
It is small on purpose (a 16-unit layer, 64-step batches, 2 iterations): seconds of training,
proving it runs end to end, not that it learns (benchmarks/bench_rllib.py shows that).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium
import pytest

from rollout.gym import register_envs
from rollout.rllib import register
from tests._session_ray import SessionRay

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = "mini-terminal@1.0.0"
ECHO = {"tool": "execute_command", "arguments": {"command": "true"}}


# -- episodes without tasks ------------------------------------------------------------------


def _ends_unscored(env: gymnasium.Env[Any, Any], action: Any) -> None:
    """20 steps of an episode without a task: truncated at the 20th, unscored, no error."""
    env.reset(seed=0)
    for step in range(1, 21):
        _, reward, terminated, truncated, info = env.step(action)
        if step < 20:
            assert (terminated, truncated) == (False, False), step
    assert truncated
    assert not terminated
    assert reward == 0.0
    assert info["scored"] is False  # mini-terminal's reward needs `path` and `expected`
    assert info["reward_components"] is None
    env.reset(seed=1)  # and the next episode starts as usual


def test_rllib_episodes_without_tasks_end_unscored() -> None:
    from ray.rllib.env.env_context import EnvContext
    from ray.tune.registry import ENV_CREATOR, _global_registry

    name = register(TERMINAL, name="aenv-test-no-tasks", max_observation_len=64, max_action_len=96)
    env = _global_registry.get(ENV_CREATOR, name)(EnvContext({"max_steps": 20}, worker_index=1))
    try:
        _ends_unscored(env, env.encode_action(ECHO))
    finally:
        env.close()


def test_gymnasium_episodes_without_tasks_end_unscored() -> None:
    register_envs([TERMINAL])
    env = gymnasium.make("aenv/mini-terminal.1.0.0", max_steps=20)
    try:
        _ends_unscored(env, ECHO)
    finally:
        env.close()


def test_a_task_whose_reward_arguments_are_refused_still_raises() -> None:
    from aenv_ray.errors import FunctionError
    from rollout.gym import make_env

    task = {"prompt": "p", "reward_arguments": {"path": "x"}}  # `expected` missing: the task's bug
    env = make_env(TERMINAL, tasks=[task], max_steps=1)
    try:
        env.reset(seed=0)
        with pytest.raises(FunctionError) as caught:
            env.step(ECHO)
        assert caught.value.error_type == "invalid_arguments"
    finally:
        env.close()


# -- the spaces ------------------------------------------------------------------------------


def test_an_actions_menu_is_a_discrete_space_and_observations_are_normalized() -> None:
    import numpy as np

    from rollout.gym import make_env
    from rollout.rllib import NumericToolEnv

    env = NumericToolEnv(make_env(TERMINAL), actions=[ECHO, '{"tool": "submit"}'])
    try:
        assert env.action_space == gymnasium.spaces.Discrete(2)
        assert env.observation_space.dtype == np.float32
        assert float(env.observation_space.high.max()) == 1.0
        with pytest.raises(ValueError, match="not in Discrete"):
            env.step(2)  # checked before any instance is asked
    finally:
        env.close()
    text_env = make_env(TERMINAL)
    try:
        with pytest.raises(ValueError, match="float dtype"):
            NumericToolEnv(text_env, observation_dtype=np.uint8)
        with pytest.raises(ValueError, match="at least one"):
            NumericToolEnv(text_env, actions=[])
    finally:
        text_env.close()
    raw = NumericToolEnv(make_env(TERMINAL), observation_dtype=None, normalize=False)
    try:
        assert raw.observation_space.dtype == np.uint8  # the codec's own
        assert float(raw.observation_space.high.max()) == 255
    finally:
        raw.close()


# -- PPO trains ------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_ppo_trains_on_environments_leasing_pool_instances(session_ray: SessionRay) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: scripts/setup installs torch==2.13.0 (CPU)")
    done = subprocess.run(
        [sys.executable, "-m", "tests._rllib_train", "2"],
        cwd=ROOT,
        env={**os.environ, **session_ray.env},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["iterations"] == [1, 2]
    assert report["steps"] >= 2 * 64  # two train batches sampled
    assert report["episodes"] > 0
    # every step RLlib sampled was a tool call on a leased instance, every episode end a reward
    assert report["tool_calls"] == report["steps"]
    assert report["rewards"] == report["episodes"] > 0  # open episodes have not asked yet
    assert report["acquired"] >= 2  # the env runner's two environments leased
    assert all(math.isfinite(value) for value in report["learner"].values()), report["learner"]
    assert all(0.0 <= value <= 1.0 for value in report["returns"]), report["returns"]
