"""A driver that trains RLlib's PPO (new API stack) on ``examples/corridor``, run by
tests/test_rollout_rllib.py in a process of its own that joins the session's Ray (``RAY_ADDRESS``):
RLlib's env runner is a Ray actor whose environments lease instances of a
:class:`~rollout.pool.RolloutPool`. Prints one JSON line: what the test checks.

    python -m tests._rllib_train ITERATIONS
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORRIDOR = ROOT / "examples" / "corridor"
TASKS = [
    {"id": goal, "prompt": f"goal {goal}, at 3", "reset_arguments": {"goal": goal}}
    for goal in ("left", "right")
]
ACTIONS = [{"tool": "left"}, {"tool": "right"}]


def main(iterations: int) -> dict[str, Any]:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    import rollout
    from rollout.rllib import register

    rollout.init_local()  # joins the session's Ray (RAY_ADDRESS)
    with rollout.RolloutPool(project=CORRIDOR, size=2, name="rllib-test") as pool:
        name = register(
            "corridor@1.0.0",
            pool=pool,
            tasks=TASKS,
            max_steps=12,
            actions=ACTIONS,
            max_observation_len=48,
        )
        config = (
            PPOConfig()
            .environment(name)
            .framework("torch")
            .env_runners(num_env_runners=1, num_envs_per_env_runner=2)
            .learners(num_learners=0)
            .fault_tolerance(restart_failed_env_runners=False)  # a crash fails the run at once
            .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=2, lr=1e-3)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
        )
        algo = config.build_algo()
        try:
            results = [algo.train() for _ in range(iterations)]
        finally:
            algo.stop()
        stats = pool.stats()
    last = results[-1]
    learner = last["learners"]["default_policy"]
    return {
        "iterations": [int(r["training_iteration"]) for r in results],
        "steps": int(last["env_runners"]["num_env_steps_sampled_lifetime"]),
        "episodes": int(last["env_runners"]["num_episodes_lifetime"]),
        "returns": [float(r["env_runners"].get("episode_return_mean", math.nan)) for r in results],
        "learner": {
            key: float(learner[key]) for key in ("total_loss", "policy_loss", "vf_loss", "entropy")
        },
        "tool_calls": stats.phases["tool_call"].count,
        "rewards": stats.phases["reward"].count,
        "acquired": stats.counters["acquired"],
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
