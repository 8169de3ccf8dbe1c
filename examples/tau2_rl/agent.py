"""tau2 RL: an AReaL-style workflow playing tau2-bench episodes on warm Ray instances.

Each call plays one tau2 task (``{"domain": "airline", "task_id": "1"}``) on a warm instance of
the built-in ``tau2@1.0.0`` leased from a :class:`rollout.RolloutPool`: ``tau2_reset`` starts
the task on the instance (one warm instance serves any task), the model behind an
OpenAI-compatible endpoint plays the agent with tau2's system prompt and tools, talking with
tau2's user simulator (``builtin_envs.demos.tau2.DIALOGUE``) until the episode ends, and the
return value is tau2's reward as a ``float``. ``workflow.play(data, ...)`` returns the whole
episode too (conversation, tool calls, token usage and log-probabilities, reward components).

Two entry points, as trainers call them:

- ``await Tau2Workflow(...).run(data, base_url=..., api_key=..., http_client=...)``: AReaL's
  agent workflow (>= 1.0), with the address of its proxy that records tokens;
- ``await run_agent_return_reward(data)``: AEnvironment's entry point, the model from
  ``OPENAI_BASE_URL`` / ``OPENAI_MODEL`` / ``OPENAI_API_KEY`` (the OpenAI SDK's variables).

The user simulator is an LLM when the instances get ``TAU2_USER_LLM`` (and
``TAU2_USER_LLM_API_BASE``, ``TAU2_USER_LLM_API_KEY``) from this process, else tau2's scripted
user. From the shell, with a local Ray::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_MODEL=my-model \\
        python examples/tau2_rl/agent.py --domain airline --task-id 1 --task-id 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Mapping
from typing import Any

from rollout import RolloutPool
from rollout.areal import AEnvWorkflow
from rollout.sources import PoolSource
from rollout.trajectories import Trajectory

ENV = "tau2@1.0.0"
USER_VARIABLES = ("TAU2_USER_LLM", "TAU2_USER_LLM_API_BASE", "TAU2_USER_LLM_API_KEY")


def tau2_task(data: Mapping[str, Any], *, split: str | None = None) -> dict[str, Any]:
    """The rollout task of tau2 task ``data["task_id"]`` of ``data["domain"]``: its setup resets
    the leased instance to that task; the reward is tau2's (no arguments)."""
    reset: dict[str, Any] = {"domain": str(data.get("domain", "airline"))}
    if data.get("task_id") not in (None, ""):
        reset["task_id"] = str(data["task_id"])
    reset.update({k: data[k] for k in ("solo_mode", "user_mode", "max_steps") if k in data})
    if split is None:
        reset["all_tasks"] = True  # any task of the domain, whatever the split
    else:
        reset["split"] = split
    return {
        "id": f"{reset['domain']}-{reset.get('task_id', 'first')}",
        "prompt": f"tau2 {reset['domain']} task {reset.get('task_id', '')}".strip(),
        "setup": [{"function": "tau2_reset", "arguments": reset}],
        "reward_arguments": {},
    }


class Tau2Workflow(AEnvWorkflow):
    """tau2 episodes on a pool of warm ``tau2@1.0.0`` instances; see the module docstring.

    Args:
        pool: the pool to lease from; default: a new one of ``size`` instances whose
            environment carries this process's ``TAU2_USER_LLM*`` variables.
        size: warm instances of the default pool.
        model, base_url, api_key, temperature, max_turns: the agent's model (AReaL passes
            ``base_url``/``api_key`` to :meth:`run` instead).
        split: look task ids up in this split (``base``, ``train``, ``test``); default: all.
    """

    def __init__(
        self,
        *,
        pool: RolloutPool | None = None,
        size: int = 4,
        model: str = "default",
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = 1.0,
        max_turns: int = 60,
        split: str | None = None,
        episode_timeout: float | None = 900.0,
    ) -> None:
        if pool is None:
            variables = {k: os.environ[k] for k in USER_VARIABLES if os.environ.get(k)}
            pool = RolloutPool(ENV, size=size, environment_variables=variables)
        self.pool = pool
        self.split = split
        super().__init__(
            ENV,
            model=model,
            base_url=base_url,
            api_key=api_key,
            temperature=temperature,
            max_turns=max_turns,
            source=PoolSource(pool),
            episode_timeout=episode_timeout,
        )

    async def play(self, data: dict[str, Any], **extra_kwargs: Any) -> tuple[float, Trajectory]:
        """Play tau2 task ``data`` (``domain``, ``task_id``); return its reward and record
        (``run`` returns the reward alone)."""
        return await super().play(tau2_task(data, split=self.split), **extra_kwargs)

    def close(self) -> None:
        """Close the pool (its instances end)."""
        self.pool.close()


_DEFAULT: Tau2Workflow | None = None


async def run_agent_return_reward(data: dict[str, Any]) -> float:
    """AEnvironment's entry point: one tau2 episode (``{"domain", "task_id"}``) -> its reward,
    played by the model that ``OPENAI_BASE_URL``, ``OPENAI_MODEL`` and ``OPENAI_API_KEY`` name,
    on a pool made on the first call."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Tau2Workflow(
            model=os.environ.get("OPENAI_MODEL", "default"),
            base_url=os.environ.get("OPENAI_BASE_URL"),
            api_key=os.environ.get("OPENAI_API_KEY"),
        )
    return await _DEFAULT.run_agent_return_reward(data)


def main(argv: list[str] | None = None) -> None:
    """Play the tasks named on the command line, concurrently, and print each reward."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="airline", choices=["airline", "retail", "telecom"])
    parser.add_argument("--task-id", action="append", default=None, help="repeat for more")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "default"))
    parser.add_argument("--size", type=int, default=4, help="warm instances")
    args = parser.parse_args(argv)
    if not args.base_url:
        parser.error("give --base-url (or OPENAI_BASE_URL): the model that plays the agent")
    workflow = Tau2Workflow(
        size=args.size,
        model=args.model,
        base_url=args.base_url,
        api_key=os.environ.get("OPENAI_API_KEY"),
    )

    async def play() -> list[float]:
        tasks = [{"domain": args.domain, "task_id": t} for t in args.task_id or ["0"]]
        return await asyncio.gather(*(workflow.run_agent_return_reward(t) for t in tasks))

    try:
        for task_id, reward in zip(args.task_id or ["0"], asyncio.run(play()), strict=True):
            print(f"{args.domain} task {task_id}: reward {reward}")
    finally:
        workflow.close()


if __name__ == "__main__":
    main()
