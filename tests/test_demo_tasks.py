"""No gold solution in a built-in demo task, nor in what its policy is given, nor in its
rollout record's ``task``: every demo module's tasks hold none of their reference solution's
texts (the scripted policies read those on the driver's side, by task id), and an in-process
rollout of the mini-terminal demo, whose policy gets the task without its reward's arguments
and without a solution the task file carried, still reaches 1.0.

The other demos' rollouts (``aenv rollout ... --no-ray``) watch their policies and check their
records the same way in their own files (tests/_demo_solutions.py's ``watched_*``):
test_mini_program, test_terminal_bench_env, test_tau2_rollout, test_reward_exploits_swe.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from aenv_ray.errors import ConfigurationError
from rollout.synthesis import read_trajectories, synthesize
from tests._demo_solutions import (
    assert_given_no_grader_fields,
    assert_holds_no_solution,
    solution_texts,
    watched_mini_terminal,
)
from tests._tau2 import require_tau2_data

DEMOS = ["mini_terminal", "mini_program", "terminal_bench", "tau2", "swe"]


@pytest.mark.parametrize("env", DEMOS)
def test_no_demo_task_holds_its_solution(env: str) -> None:
    if env == "tau2":
        require_tau2_data()
    module = importlib.import_module(f"builtin_envs.demos.{env}")
    assert module.TASKS
    for task in module.TASKS:
        assert_holds_no_solution(env, task)
    # the control: there is a solution to find, on the driver's side
    assert sum(len(solution_texts(env, task)) for task in module.TASKS) >= len(module.TASKS)


@pytest.mark.parametrize("env", ["mini_terminal", "mini_program", "tau2"])
async def test_a_task_the_scripted_policy_has_no_solution_for_is_refused_saying_so(
    env: str,
) -> None:
    """A task of your own with the demo policy: refused before any tool call (the policy has
    nothing to replay), as a ConfigurationError, which stops a run (below)."""
    if env == "tau2":
        require_tau2_data()
    module = importlib.import_module(f"builtin_envs.demos.{env}")
    with pytest.raises(ConfigurationError, match=r"give a policy \(--policy"):
        await module.policy({"id": "mine", "prompt": "p"}, None)


async def test_the_mini_terminal_rollout_gives_its_policy_no_solution_and_reaches_one(
    tmp_path: Path,
) -> None:
    """The policy gets each task without its ``reward_arguments`` (the expected answer) and
    without the reference solution a task file may carry (``solution``, ``patch``: a dataset's
    gold, added here to the demo tasks); the reward still gets its arguments (1.0), and the
    record keeps them, never the solution."""
    from builtin_envs.demos import mini_terminal

    tasks = [
        {
            **task,
            "solution": "\n".join(mini_terminal.reference_solution(task["id"])),
            "patch": mini_terminal.reference_solution(task["id"])[-1],
        }
        for task in mini_terminal.TASKS
    ]
    for task in tasks:  # the control: the tasks as given hold the solution
        with pytest.raises(AssertionError, match="holds"):
            assert_holds_no_solution("mini_terminal", task)
    episodes = len(tasks)
    summary = await synthesize(
        "mini-terminal@1.0.0",
        episodes=episodes,
        concurrency=2,
        out=tmp_path,
        tasks=tasks,
        policy=watched_mini_terminal,
    )
    assert summary.outcomes == {"ok": episodes}
    records = read_trajectories(tmp_path)
    assert sorted(r["task_id"] for r in records) == sorted(t["id"] for t in mini_terminal.TASKS)
    assert_given_no_grader_fields("mini_terminal", tasks, records)
    for record in records:
        assert record["reward"] == 1.0, record["reason"]
        # the control: the solution is what the policy did (its steps), not what it was given
        commands = [json.loads(step["arguments_json"])["command"] for step in record["steps"]]
        assert commands[:2] == mini_terminal.reference_solution(record["task_id"])[:2]

    # a task it has no solution for stops the run before anything is recorded, instead of
    # scoring a policy that did nothing
    with pytest.raises(ConfigurationError, match="task 'mine' is not one of them"):
        await synthesize(
            "mini-terminal@1.0.0", episodes=1, out=tmp_path / "mine", tasks=[{"id": "mine"}]
        )
    assert read_trajectories(tmp_path / "mine") == []
