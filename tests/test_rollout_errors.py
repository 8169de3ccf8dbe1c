"""Programming errors are not training data, through ``aenv rollout`` as a user runs it: a policy
whose own code raises a programming error (TypeError, NameError, AttributeError, a wrong
signature) or a task whose reward call the environment refuses stops the run at the first
occurrence (exit 2, the policy's traceback, one line naming it); the agent's behaviour (a policy
that gives up, a tool error) stays an episode outcome."""

from __future__ import annotations

import inspect
import json
import pickle
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollout.failures import PolicyCodeError, TaskCallError, is_programming_error
from rollout.synthesis import read_trajectories, synthesize
from tests._cli import aenv as run_cli

TERMINAL = "mini-terminal@1.0.0"
ROLLOUT = ["rollout", TERMINAL]  # in this process (tests/_cli.py)

POLICIES = """
async def adds_to_a_string(task, env):
    await env.call_tool("execute_command", {"command": "echo 42 > answer.txt"})
    return task["prompt"] + 1


async def misspelt(task, env):
    return helpr(task)


async def no_such_method(task, env):
    return await env.call_tol("execute_command", {})


async def one_argument(task):
    return None


async def gives_up(task, env):
    await env.call_tool("execute_command", {"command": "echo 42 > answer.txt"})
    raise ValueError("the model answered nonsense")
"""


def run(tmp_path: Path, policy: str, *, reward: dict[str, str] | None = None) -> tuple[int, str]:
    (tmp_path / "policies.py").write_text(POLICIES)
    task = {
        "id": "t",
        "prompt": "write 42",
        "reward_arguments": reward or {"path": "answer.txt", "expected": "42"},
    }
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    done = rollout(tmp_path, "-n", "3", "--policy", f"policies:{policy}", "--tasks", str(tasks))
    return done.returncode, done.stderr


def rollout(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``aenv rollout`` of the mini-terminal into ``tmp_path/run``, one episode at a time."""
    return run_cli(*ROLLOUT, "-c", "1", "--no-ray", "--out", str(tmp_path / "run"), *args,
                   cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "error", "line"),
    [
        ("adds_to_a_string", 'TypeError: can only concatenate str (not "int") to str', 4),
        ("misspelt", "NameError: name 'helpr' is not defined", 8),
        ("no_such_method", "AttributeError: 'AgentEnv' object has no attribute 'call_tol'", 12),
    ],
)
def test_a_programming_error_in_the_policy_stops_the_run_at_the_first(
    tmp_path: Path, policy: str, error: str, line: int
) -> None:
    code, stderr = run(tmp_path, policy)
    assert code == 2, stderr
    last = stderr.strip().splitlines()[-1]
    source = tmp_path / "policies.py"
    assert last.startswith(
        f"aenv: error: the policy `policies:{policy}` raised {error} at {source}:{line} in {policy}"
        " (episode 000000-t); a programming error in the policy stops the run"
    ), last
    assert "fix it and run again" in last
    # the traceback of the policy's frames comes before it, and nothing of the rollout's (what
    # the run logged before, e.g. an infrastructure failure it retried, is not the policy's)
    assert "Traceback (the policy's frames):" in stderr
    policy_part = stderr[stderr.index("Traceback (the policy's frames):") :]
    assert f'File "{source}", line {line}, in {policy}' in policy_part
    assert "synthesis.py" not in policy_part
    assert read_trajectories(tmp_path / "run") == []  # the first episode stopped it: no data


def test_a_policy_with_the_wrong_signature_stops_the_run(tmp_path: Path) -> None:
    code, stderr = run(tmp_path, "one_argument")
    assert code == 2, stderr
    # found before anything starts (issue 13, point 2): the one line is all there is
    assert stderr == (
        "aenv: error: policy policies:one_argument takes (task), but is called as "
        "policy(task, env): too many positional arguments\n"
    ), stderr
    assert read_trajectories(tmp_path / "run") == []


async def test_a_policy_whose_signature_lies_stops_the_run_at_its_first_call(
    tmp_path: Path,
) -> None:
    """What no check can see before the first call (a signature that lies) still stops the
    run at the first episode, with the documented form in the message."""

    async def policy(task: dict[str, Any]) -> None:
        return None

    policy.__signature__ = inspect.signature(lambda task, env: None)  # type: ignore[attr-defined]
    with pytest.raises(PolicyCodeError, match=r"cannot be called as `await policy\(task, env\)`"):
        await synthesize(
            "mini-terminal@1.0.0",
            episodes=2,
            concurrency=1,
            out=tmp_path / "run",
            tasks=[{"id": "t", "prompt": "p"}],
            policy=policy,
        )
    assert read_trajectories(tmp_path / "run") == []


def test_a_reward_call_with_arguments_it_rejects_stops_the_run(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(
        "async def agent(task, env):\n"
        "    await env.call_tool('execute_command', {'command': 'echo 42 > answer.txt'})\n"
        "    return '42'\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "prompt": "p", "reward_arguments": {"file": "x"}}))
    done = rollout(tmp_path, "-n", "2", "--policy", "ok:agent", "--tasks", str(tasks))
    assert done.returncode == 2, done.stderr
    # found before anything starts (issue 13, point 2), from what the reward takes
    assert done.stderr.startswith(f"aenv: error: {tasks}: task `t` gives the reward"), done.stderr
    assert "`file`, which it does not take" in done.stderr
    assert "fix the task's reward_arguments" in done.stderr
    assert read_trajectories(tmp_path / "run") == []


async def test_a_reward_call_the_environment_refuses_at_run_time_stops_the_run(
    tmp_path: Path,
) -> None:
    """Without the CLI's checks (the library's synthesize), the refusal of the first reward
    call stops the run: nothing is recorded as an episode outcome."""

    async def agent(task: dict[str, Any], env: Any) -> str:
        return "42"

    with pytest.raises(TaskCallError, match="task t: the environment refused its reward call"):
        await synthesize(
            "mini-terminal@1.0.0",
            episodes=2,
            concurrency=1,
            out=tmp_path / "run",
            tasks=[{"id": "t", "prompt": "p", "reward_arguments": {"file": "x"}}],
            policy=agent,
        )
    assert read_trajectories(tmp_path / "run") == []


def test_the_agents_own_failure_stays_an_episode_outcome(tmp_path: Path) -> None:
    code, stderr = run(tmp_path, "gives_up")
    assert code == 1, stderr  # the run ended; an episode did not end ok
    rows = read_trajectories(tmp_path / "run")
    assert [r["outcome"] for r in rows] == ["agent_error"] * 3
    assert all(r["reason"] == "PolicyError: ValueError: the model answered nonsense" for r in rows)
    assert all(len(r["steps"]) == 1 for r in rows)  # what it did before is kept


def test_the_rule_and_its_errors() -> None:
    from aenv_ray.errors import NotSupportedError, ToolArgumentError

    assert is_programming_error(TypeError("x"))
    assert is_programming_error(ModuleNotFoundError("x"))
    assert is_programming_error(UnboundLocalError("x"))
    assert is_programming_error(ExceptionGroup("g", [ValueError("a"), NameError("b")]))
    assert not is_programming_error(ExceptionGroup("g", [ValueError("a")]))
    assert not is_programming_error(ValueError("x"))
    assert not is_programming_error(KeyError("x"))
    assert not is_programming_error(NotSupportedError("x"))  # aenv errors keep their outcome
    assert not is_programming_error(ToolArgumentError("x"))
    for error in (
        PolicyCodeError("m", policy="p:f", error_type="TypeError", location="f.py:1 in f"),
        TaskCallError("m", function="reward", task_id="t"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert copy.__dict__ == error.__dict__
