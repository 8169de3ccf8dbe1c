"""Batch trajectory synthesis on real instances of the local engine: the demo job, resume,
the failure model (agent error, retried infrastructure error, timeout), an OpenAI-compatible
endpoint as the policy (a real HTTP server on loopback that answers like one), and the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from aenv_ray.errors import ConfigurationError, EnvironmentNotFoundError
from rollout.sources import SDKSource
from rollout.synthesis import AgentEnv, OpenAIPolicy, synthesize
from tests._cli import aenv as run_cli
from tests._session_ray import SessionRay

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "tests" / "envs"
TERMINAL = "mini-terminal@1.0.0"


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


@pytest.fixture
def hostile_on_path(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AENV_ENV_PATH", str(ENVS))
    return "hostile@1.0.0"


async def test_the_demo_job_records_every_episode_and_a_rerun_skips_them(tmp_path: Path) -> None:
    summary = await synthesize(TERMINAL, episodes=6, concurrency=3, out=tmp_path)
    assert summary.outcomes == {"ok": 6}
    assert summary.skipped == 0
    recorded = rows(tmp_path)
    assert sorted(r["episode_id"] for r in recorded) == [
        "000000-sum-10",
        "000001-sum-100",
        "000002-count-lines",
        "000003-reverse",
        "000004-tree",
        "000005-sum-10",
    ]
    for row in recorded:
        assert row["reward"] == 1.0
        assert row["steps"], row
        step = row["steps"][0]
        assert step["tool"] == f"{TERMINAL}/execute_command"  # the tool's real name
        assert set(json.loads(step["arguments_json"])) == {"command"}
        assert step["seconds"] > 0
        assert step["is_error"] is False
    assert summary.tool_calls == sum(len(r["steps"]) for r in recorded)
    table = pq.read_table(tmp_path / "trajectories.parquet")
    assert table.num_rows == 6
    assert set(table.column("outcome").to_pylist()) == {"ok"}
    assert table.column("steps")[0].as_py()[0]["tool"] == f"{TERMINAL}/execute_command"

    again = await synthesize(TERMINAL, episodes=8, concurrency=3, out=tmp_path)
    assert again.skipped == 6
    assert again.outcomes == {"ok": 2}
    assert len(rows(tmp_path)) == 8
    assert pq.read_table(tmp_path / "trajectories.parquet").num_rows == 8


async def test_a_failing_policy_is_an_agent_error_recorded_once(tmp_path: Path) -> None:
    async def clumsy(task: dict[str, Any], env: AgentEnv) -> str:
        await env.call_tool("execute_command", {"command": "echo about to fail"})
        raise ValueError("the agent gave up")

    summary = await synthesize(TERMINAL, episodes=2, concurrency=2, out=tmp_path, policy=clumsy)
    assert summary.outcomes == {"agent_error": 2}
    assert summary.retries == 0
    for row in rows(tmp_path):
        assert row["attempts"] == 1
        assert "ValueError: the agent gave up" in row["reason"]
        assert len(row["steps"]) == 1  # what it did before failing is kept


async def test_an_instance_that_dies_is_retried_on_a_fresh_one(
    tmp_path: Path, hostile_on_path: str
) -> None:
    seen: list[str | None] = []

    async def dies_once(task: dict[str, Any], env: AgentEnv) -> str:
        seen.append(env.instance.instance_id)
        if len(seen) == 1:
            await env.call_tool("crash")  # the runtime exits: an infrastructure failure
        return str((await env.call_tool("identity")).structured["uid"])

    summary = await synthesize(
        hostile_on_path,
        episodes=1,
        out=tmp_path,
        tasks=[{"id": "t"}],
        policy=dies_once,
        max_retries=2,
    )
    assert summary.outcomes == {"ok": 1}
    assert summary.retries == 1
    (row,) = rows(tmp_path)
    assert row["attempts"] == 2
    assert len(set(seen)) == 2  # a fresh instance the second time


async def test_retries_stop_at_the_limit_and_say_why(tmp_path: Path, hostile_on_path: str) -> None:
    async def always_dies(task: dict[str, Any], env: AgentEnv) -> None:
        await env.call_tool("crash")

    summary = await synthesize(
        hostile_on_path,
        episodes=1,
        out=tmp_path,
        tasks=[{"id": "t"}],
        policy=always_dies,
        max_retries=1,
    )
    assert summary.outcomes == {"infrastructure_error": 1}
    (row,) = rows(tmp_path)
    assert row["attempts"] == 2
    assert "Instance" in row["reason"]


async def test_an_episode_past_its_time_limit_is_a_timeout(tmp_path: Path) -> None:
    async def slow(task: dict[str, Any], env: AgentEnv) -> None:
        await env.call_tool("execute_command", {"command": "sleep 30"})

    summary = await synthesize(
        TERMINAL, episodes=1, out=tmp_path, policy=slow, episode_timeout=0.5, max_retries=0
    )
    assert summary.outcomes == {"timeout": 1}
    (row,) = rows(tmp_path)
    assert "0.5 s limit" in row["reason"]


async def test_an_unknown_environment_stops_the_run(
    tmp_path: Path,
) -> None:
    async def never(task: dict[str, Any], env: AgentEnv) -> None:
        raise AssertionError("no episode should run")

    with pytest.raises(EnvironmentNotFoundError, match="no-such-env"):
        await synthesize(
            "no-such-env@1.0.0", episodes=2, out=tmp_path, tasks=[{"id": "t"}], policy=never
        )


async def test_an_openai_compatible_endpoint_drives_the_episode(
    tmp_path: Path, chat_endpoint: tuple[str, list[dict[str, Any]]]
) -> None:
    url, requests = chat_endpoint
    policy = OpenAIPolicy(url, "test-model", api_key="k")
    reward = {"path": "answer.txt", "expected": "55"}
    task = {"id": "sum", "prompt": "sum 1..10", "reward_arguments": reward}
    summary = await synthesize(TERMINAL, episodes=1, out=tmp_path, tasks=[task], policy=policy)
    assert summary.outcomes == {"ok": 1}
    (row,) = rows(tmp_path)
    assert row["answer"] == "done"
    assert row["reward"] == 1.0
    assert [s["tool"] for s in row["steps"]] == [f"{TERMINAL}/execute_command"]
    first, second = requests
    assert first["model"] == "test-model"
    assert first["messages"] == [{"role": "user", "content": "sum 1..10"}]
    assert any("execute_command" in t["function"]["name"] for t in first["tools"])
    tool_reply = second["messages"][-1]
    assert tool_reply["role"] == "tool"
    assert tool_reply["tool_call_id"] == "call-1"
    assert '"returncode":0' in tool_reply["content"].replace(" ", "")


async def test_an_explicit_source_is_used_and_left_open(tmp_path: Path) -> None:
    source = SDKSource(TERMINAL, ttl=60)
    summary = await synthesize(TERMINAL, episodes=2, out=tmp_path, source=source)
    assert summary.outcomes == {"ok": 2}


def test_the_cli_runs_writes_and_reports(tmp_path: Path) -> None:
    done = run_cli("rollout", TERMINAL, "-n", "3", "-c", "2", "--no-ray", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "mean reward" in done.stderr
    assert len(rows(tmp_path)) == 3
    both = run_cli("rollout", TERMINAL, "--policy", "m:f", "--base-url", "http://x", "--model", "m")
    assert both.returncode == 2
    assert "not both" in both.stderr


def test_the_cli_runs_on_a_ray_pool_by_default_and_resumes(
    tmp_path: Path, session_ray: SessionRay
) -> None:
    # a subprocess: the driver joins the session's Ray (RAY_ADDRESS), which must not stay
    # initialized in the test process
    command = [sys.executable, "-m", "aenv_cli", "rollout", TERMINAL, "-c", "2"]
    first = subprocess.run(
        [*command, "-n", "4", "--out", str(tmp_path)],
        env={**os.environ, **session_ray.env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert first.returncode == 0, first.stderr
    recorded = rows(tmp_path)
    assert [r["outcome"] for r in recorded] == ["ok"] * 4
    assert all(r["instance_id"] for r in recorded)
    assert len({r["instance_id"] for r in recorded}) == 4  # a fresh instance per episode
    again = run_cli(*command[3:], "-n", "5", "--no-ray", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert len(rows(tmp_path)) == 5  # the 4 recorded episodes were skipped


def test_policies_load_by_module_and_name_and_bad_ones_say_why() -> None:
    from builtin_envs.demos import mini_terminal
    from rollout.synthesis import load_policy

    assert load_policy("builtin_envs.demos.mini_terminal:policy") is mini_terminal.policy
    with pytest.raises(ConfigurationError, match="MODULE:CALLABLE"):
        load_policy("no_colon_here")
    with pytest.raises(ConfigurationError, match="cannot import"):
        load_policy("no.such.module:f")
    with pytest.raises(ConfigurationError, match="no callable"):
        load_policy("builtin_envs.demos.mini_terminal:TASKS_MISSING")


def test_task_files_are_read_and_bad_ones_say_where(tmp_path: Path) -> None:
    from rollout.synthesis import load_tasks

    good = tmp_path / "tasks.jsonl"
    good.write_text('{"id": "a", "prompt": "p"}\n\n{"prompt": "q"}\n')
    assert [t["id"] for t in load_tasks(good, TERMINAL)] == ["a", "1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ConfigurationError, match=r"bad\.jsonl"):
        load_tasks(bad, TERMINAL)
    with pytest.raises(EnvironmentNotFoundError, match=r"no environment `hostile@1\.0\.0`"):
        load_tasks(None, "hostile@1.0.0")  # an unknown name: said so, not "no demo tasks"
    with pytest.raises(ConfigurationError, match="no demo"):
        load_tasks(None, str(tmp_path / "a-project"))  # a user's project ships none


def aenv_rollout(*args: str) -> list[str]:
    """``aenv rollout`` as a child process's command line."""
    return [sys.executable, "-m", "aenv_cli", "rollout", TERMINAL, *args]


def test_a_torn_last_line_is_rerun_and_said_and_a_corrupt_one_stops_the_cli(
    tmp_path: Path,
) -> None:
    command = ["rollout", TERMINAL, "-n", "3", "-c", "2", "--no-ray", "--out", str(tmp_path)]
    first = run_cli(*command, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    jsonl = tmp_path / "trajectories.jsonl"
    whole = jsonl.read_bytes().splitlines(keepends=True)
    torn_id = json.loads(whole[2])["episode_id"]
    jsonl.write_bytes(b"".join(whole[:2]) + whole[2][:70])  # as a driver killed mid-write leaves

    again = run_cli(*command, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert (
        f"dropped the torn last line 3 of trajectories.jsonl (70 bytes, episode {torn_id}" in said
    )
    assert f"torn last line dropped (rerun) │ {torn_id}" in said
    assert "episodes (this run / skipped) │ 1 / 2" in said
    content = jsonl.read_bytes()
    assert content.startswith(b"".join(whole[:2]))  # the records before it are untouched
    recorded = rows(tmp_path)  # each line parses: nothing glued to the torn prefix
    assert sorted(r["episode_id"] for r in recorded) == sorted(
        json.loads(line)["episode_id"] for line in whole
    )
    assert pq.read_table(tmp_path / "trajectories.parquet").num_rows == 3

    lines = content.splitlines(keepends=True)
    jsonl.write_bytes(b'{"episode_id": "000000-sum-10", "outc\n' + b"".join(lines[1:]))
    corrupt = run_cli(*command, cwd=ROOT)
    assert corrupt.returncode == 2
    (line,) = corrupt.stderr.splitlines()
    assert line.startswith(f"aenv: error: {jsonl}: line 1 is not a trajectory record")
    assert "fix or delete that line" in line


def test_a_second_driver_on_a_run_directory_exits_2_at_once_and_a_dead_ones_lock_never_blocks(
    tmp_path: Path,
) -> None:
    from tests._paced_policy import write_tasks

    out = tmp_path / "run"
    paced = ["--policy", "tests._paced_policy:policy", "--no-ray", "--out", str(out)]
    slow = write_tasks(tmp_path / "slow.jsonl", pause=60)
    first = subprocess.Popen(  # a subprocess: another driver, killed with -9
        aenv_rollout("-n", "2", "-c", "1", "--tasks", str(slow), *paced),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        lock = out / "rollout.lock"
        while not (lock.exists() and f'"pid": {first.pid},' in lock.read_text()):
            assert first.poll() is None, "the first driver ended early"
            assert time.monotonic() < deadline, "the first driver never took the lock"
            time.sleep(0.05)
        # with Ray: refused before it starts (in this process: tests/_cli.py)
        second = run_cli("rollout", TERMINAL, "-n", "2", "--out", str(out), cwd=ROOT)
        assert second.returncode == 2
        (line,) = second.stderr.splitlines()
        assert line.startswith(
            f"aenv: error: run directory {out} is in use by another driver: pid {first.pid} on "
            f"host {socket.gethostname()} since "
        )
        assert "wait for it to finish or pass another --out" in line
        first.kill()  # kill -9: its lock dies with it
        first.wait(timeout=60)
    finally:
        first.kill()
        first.wait(timeout=60)
    quick = write_tasks(tmp_path / "quick.jsonl", pause=0)
    third = run_cli(
        *aenv_rollout("-n", "2", "-c", "2", "--tasks", str(quick), *paced)[3:], cwd=ROOT
    )
    assert third.returncode == 0, third.stderr
    assert [r["outcome"] for r in rows(out)] == ["ok", "ok"]
