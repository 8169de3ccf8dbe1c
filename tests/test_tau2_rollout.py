"""tau2@1.0.0 in real instances of the local engine: ``TAU2_*`` at creation, and ``aenv rollout``
end to end with the demo policy (gold replays) reaching reward 1.0."""

from __future__ import annotations

import json
from pathlib import Path

from aenv_ray import Environment
from aenv_ray.engine import SandboxEngine
from builtin_envs.tau2 import get_domain
from tests._cli import aenv as run_cli
from tests._demo_solutions import assert_given_no_grader_fields
from tests._tau2 import require_tau2_data

require_tau2_data()  # before the demo module, which reads the data at import

from builtin_envs.demos import tau2 as demo  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


async def test_variables_at_creation_in_a_local_instance(warm_engine: SandboxEngine) -> None:
    """The template loaded the data once; the instance's variables choose airline task 1."""
    variables = {"TAU2_DOMAIN": "airline", "TAU2_TASK_ID": "1"}
    engine = warm_engine  # the session's: the template may be warm from another file
    async with Environment("tau2@1.0.0", engine=engine, environment_variables=variables) as env:
        tools = await env.list_tools()
        expected = type(get_domain("airline").new_environment().tools).openai_schemas()
        assert [t["name"] for t in tools] == [
            f"tau2@1.0.0/{s['function']['name']}" for s in expected
        ]
        result = await env.call_tool("get_reservation_details", {"reservation_id": "Q69X3R"})
        assert not result.is_error
        assert json.loads(result.text)["reservation_id"] == "Q69X3R"
        status = await env.call_function("tau2_get_status", {"hashes": False})
        assert (status["domain"], status["task_id"], status["step"]) == ("airline", "1", 3)


def test_aenv_rollout_replays_gold_actions_to_reward_one(tmp_path: Path) -> None:
    picked = ["airline-1", "airline-5", "retail-0", "retail-9"]
    tasks = [t for t in demo.TASKS if t["id"] in picked]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    done = run_cli(
        "rollout", "tau2@1.0.0", "--tasks", str(path), "-n", str(len(tasks)), "-c", "2",
        "--no-ray", "--policy", "tests._demo_solutions:watched_tau2",
        "--out", str(tmp_path / "out"), cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted(r["task_id"] for r in rows) == sorted(picked)
    assert [(r["task_id"], r["outcome"], r["reward"]) for r in rows] == [
        (r["task_id"], "ok", 1.0) for r in rows
    ]
    for row in rows:
        assert row["reward_components"]["termination_reason"] in ("user_stop", "agent_stop")
        assert row["reward_components"]["components"] == {"DB": 1.0, "COMMUNICATE": 1.0}

    # the task the policy got: no reward arguments, no gold actions, nothing to say; the
    # record's: its reward arguments (the grading below reads the records), no solution
    assert_given_no_grader_fields("tau2", tasks, rows)

    # `aenv tau2 grade` reads the run's own records: its directory, JSONL and Parquet alike
    run = tmp_path / "out"
    for given in (run, run / "trajectories.jsonl", run / "trajectories.parquet"):
        graded = run_cli("tau2", "grade", str(given))
        assert graded.returncode == 0, graded.stderr
        assert graded.stderr == "graded 4, failed 0, mean reward 1.0000\n"
        results = [json.loads(line) for line in graded.stdout.splitlines()]
        assert sorted((r["domain"], r["task_id"], r["reward"]) for r in results) == sorted(
            (t.split("-")[0], t.split("-")[1], 1.0) for t in picked
        )
        assert all(r["recorded_reward"] == r["reward"] for r in results)
        assert {r["episode_id"] for r in results} == {r["episode_id"] for r in rows}
    # graded again, not read back: the same trajectory cut by the step limit scores 0; an
    # episode that failed before tau2 graded it is named, not skipped
    cut, failed = dict(rows[0]), dict(rows[1])
    cut["reward_components"] = {**cut["reward_components"], "termination_reason": "max_steps"}
    failed.update(outcome="agent_error", reason="PolicyError: boom", reward_components=None)
    edited = tmp_path / "edited.jsonl"
    edited.write_text(json.dumps(cut) + "\n" + json.dumps(failed) + "\n")
    graded = run_cli("tau2", "grade", str(edited))
    assert graded.returncode == 1
    first, second = (json.loads(line) for line in graded.stdout.splitlines())
    assert (first["reward"], first["recorded_reward"]) == (0.0, 1.0)
    assert first["info"]["note"].endswith("Termination reason: max_steps")
    assert second["error_type"] == "NoTrajectory"
    assert "ended `agent_error` (PolicyError: boom) before tau2 graded it" in second["error"]
