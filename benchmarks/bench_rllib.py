"""RLlib benchmark: PPO (new API stack, torch on CPU) on ``examples/corridor``, on aenv-ray and
on a plain gymnasium twin of it, in one run.

    .venv/bin/python benchmarks/bench_rllib.py                 # about 5 minutes on 2 loaded cores
    .venv/bin/python benchmarks/bench_rllib.py --iterations 4  # shorter

- **Learning.** PPO trains ``--iterations`` times on ``corridor@1.0.0`` (the agent must walk to
  the end its task names; a random walk gets it right about half the time, a policy that reads
  the goal always does): one env runner, a Ray actor whose 2 environments lease instances of a
  :class:`~rollout.pool.RolloutPool`, actions a menu of the two tools (``Discrete(2)``),
  observations the UTF-8 bytes of the text. The mean episode return per iteration shows
  whether it learns.
- **The environment side's cost.** The same PPO config trains, in the same run, on
  :class:`PlainCorridor`, the same walk as a plain ``gymnasium.Env`` in the env runner's process
  (same spaces, same texts). RLlib's own ``env_step_timer`` (one step of the env runner's vector
  env, its 2 environments one after the other) and the iterations' wall time compare the two;
  then each environment is stepped alone from the driver (random actions) for a per-step figure
  without RLlib around it.

Joins the Ray that ``RAY_ADDRESS`` names, else starts one (``rollout.init_local``). A
measurement, not a test: the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium import spaces  # noqa: E402

import rollout  # noqa: E402
from rollout.rllib import ByteCodec, register  # noqa: E402

CORRIDOR = ROOT / "examples" / "corridor"
TASKS = [
    {"id": goal, "prompt": f"goal {goal}, at 3", "reset_arguments": {"goal": goal}}
    for goal in ("left", "right")
]
ACTIONS = [{"tool": "left"}, {"tool": "right"}]
MAX_STEPS = 12
OBS_LEN = 48
LAST = 6


class PlainCorridor(gymnasium.Env[np.ndarray, int]):
    """``corridor@1.0.0`` as a plain gymnasium env in the caller's process: the same spaces,
    texts (bytes / 255), episode protocol (a task drawn per reset, ``max_steps`` truncation,
    the reward on the last step)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.observation_space = spaces.Box(0, 1, (OBS_LEN,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.codec = ByteCodec()
        self.goal, self.position, self.steps = "right", LAST // 2, 0

    def _obs(self, text: str) -> np.ndarray:
        return self.codec.encode(text, OBS_LEN).astype(np.float32) / np.float32(255)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        task = TASKS[int(self.np_random.integers(len(TASKS)))]
        self.goal, self.position, self.steps = str(task["id"]), LAST // 2, 0
        return self._obs(str(task["prompt"])), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        self.position = min(LAST, max(0, self.position + (1 if int(action) else -1)))
        done = self.position in (0, LAST)
        text = json.dumps({"text": f"goal {self.goal}, at {self.position}", "done": done})
        truncated = not done and self.steps >= MAX_STEPS
        end = 0 if self.goal == "left" else LAST
        reward = float(self.position == end) if done or truncated else 0.0
        return self._obs(text), reward, done, truncated, {}


def ppo(env: Any, seed: int) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        PPOConfig()
        .environment(env)
        .framework("torch")
        .env_runners(num_env_runners=1, num_envs_per_env_runner=2)
        .learners(num_learners=0)
        .fault_tolerance(restart_failed_env_runners=False)
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=4, lr=3e-3)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32]))
        .debugging(seed=seed)
    )


def train(env: Any, iterations: int, seed: int) -> dict[str, Any]:
    """Build PPO on ``env`` and train; per iteration: return mean, wall s, env step timer."""
    started = time.perf_counter()
    algo = ppo(env, seed).build_algo()
    built = time.perf_counter() - started
    rows = []
    try:
        for _ in range(iterations):
            t0 = time.perf_counter()
            result = algo.train()
            runners = result["env_runners"]
            rows.append(
                {
                    "return": float(runners.get("episode_return_mean", math.nan)),
                    "seconds": time.perf_counter() - t0,
                    "env_step_s": float(runners.get("env_step_timer", math.nan)),
                    "steps": int(runners["num_env_steps_sampled_lifetime"]),
                    "episodes": int(runners["num_episodes_lifetime"]),
                }
            )
    finally:
        algo.stop()
    return {"build_s": built, "iterations": rows}


def step_alone(env: gymnasium.Env[Any, Any], steps: int) -> float:
    """Seconds per step of ``env`` stepped with random actions (resets excluded)."""
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    spent = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        spent += time.perf_counter() - t0
        if terminated or truncated:
            env.reset()
    return spent / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300, help="steps of each env stepped alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()

    rollout.init_local()  # joins RAY_ADDRESS when set
    figures: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    }
    with rollout.RolloutPool(project=CORRIDOR, size=3, name="bench-rllib") as pool:
        name = register(
            "corridor@1.0.0",
            pool=pool,
            tasks=TASKS,
            max_steps=MAX_STEPS,
            actions=ACTIONS,
            max_observation_len=OBS_LEN,
        )
        figures["aenv"] = train(name, args.iterations, args.seed)
        figures["plain"] = train(PlainCorridor, args.iterations, args.seed)
        from rollout.gym import make_env
        from rollout.rllib import NumericToolEnv
        from rollout.sources import PoolSource

        leased = NumericToolEnv(
            make_env("corridor@1.0.0", source=PoolSource(pool), tasks=TASKS, max_steps=MAX_STEPS),
            actions=ACTIONS,
            max_observation_len=OBS_LEN,
        )
        try:
            figures["aenv_step_alone_s"] = step_alone(leased, args.steps)
        finally:
            leased.close()
        stats = pool.stats()
        figures["pool_tool_call_p50_s"] = stats.phases["tool_call"].p50
    figures["plain_step_alone_s"] = step_alone(PlainCorridor(), args.steps)
    report(figures)
    if args.json:
        print(json.dumps(figures))


def report(f: dict[str, Any]) -> None:
    print(f"machine: {f['machine']}")
    print("iteration | return aenv | return plain | s/iter aenv | s/iter plain")
    for i, (a, p) in enumerate(zip(f["aenv"]["iterations"], f["plain"]["iterations"], strict=True)):
        print(
            f"{i + 1:9d} | {a['return']:11.2f} | {p['return']:12.2f} | "
            f"{a['seconds']:11.1f} | {p['seconds']:12.1f}"
        )
    a_last, p_last = f["aenv"]["iterations"][-1], f["plain"]["iterations"][-1]
    print(f"build_algo: aenv {f['aenv']['build_s']:.1f} s, plain {f['plain']['build_s']:.1f} s")
    print(
        f"steps sampled: aenv {a_last['steps']} ({a_last['episodes']} episodes), "
        f"plain {p_last['steps']} ({p_last['episodes']} episodes)"
    )
    print(
        "RLlib env_step_timer (one vector step, 2 envs): "
        f"aenv {a_last['env_step_s'] * 1e3:.2f} ms, plain {p_last['env_step_s'] * 1e3:.3f} ms"
    )
    print(
        f"one env stepped alone: aenv {f['aenv_step_alone_s'] * 1e3:.2f} ms, "
        f"plain {f['plain_step_alone_s'] * 1e3:.4f} ms; "
        f"pool tool call p50 (inside the pool actor) {f['pool_tool_call_p50_s'] * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
