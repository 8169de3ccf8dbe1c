"""Failures that are not the agent's stop ``aenv rollout`` or are marked as such (issue 25.6): a
model endpoint that does not answer or answers 5xx (retried, then the run stops with one line
naming it, no ``agent_error`` record) or refuses our request (any other 4xx: the same, at once,
with the endpoint's own message), a conversation over the model's context (``truncated``), a Ray
that does not start (one line with the alternatives), Ctrl-C (exit 130, what is done written,
the command that resumes), a turn cap (``truncated``), and a summary whose mean says how
failures count and whose wall time is the command's. The CLI runs in this process
(tests/_cli.py) with ``--no-ray`` (or a Ray address where nothing answers), except where the
subject is a process (signals, a Ray that refuses the driver's join)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rollout.failures import ModelEndpointDownError, ModelEndpointError
from rollout.records import FORMAT
from rollout.synthesis import Trajectory, Turn, _EndpointWatch, read_trajectories
from tests._chat_server import REFUSALS, ChatServer, refusing, reply
from tests._cli import CHILD
from tests._cli import aenv as run_cli
from tests._paced_policy import write_tasks as paced_tasks
from tests._session_ray import SessionRay
from tests.test_rollout_records import write_tasks  # the same tasks file

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = "mini-terminal@1.0.0"


def model_rollout(url: str, out: Path, tasks: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "rollout",
        TERMINAL,
        *("--base-url", url, "--model", "test-model", "--tasks", str(tasks), "--out", str(out)),
        *("--no-ray", "-c", "1", *args),
        cwd=ROOT,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("aenv: error:")]


def test_a_dead_model_endpoint_stops_the_run_naming_it_and_records_no_agent_error(
    tmp_path: Path,
) -> None:
    dead = "http://127.0.0.1:1/v1"
    tasks = write_tasks(tmp_path / "tasks.jsonl", "a", "b")
    done = model_rollout(
        dead, tmp_path / "out", tasks, "-n", "5", "--model-retries", "1", "--endpoint-failures", "2"
    )
    assert done.returncode == 1, done.stderr
    (line,) = error_lines(done.stderr)
    assert f"the model endpoint {dead} failed 2 episodes in a row" in line
    assert "did not answer (2 tries)" in line
    assert "--retry-failed" in line
    assert "Traceback" not in done.stderr
    rows = read_trajectories(tmp_path / "out")
    assert [r["outcome"] for r in rows] == ["infrastructure_error"] * 2  # not 5 agent errors
    assert all(f"ModelEndpointError: the model endpoint {dead}" in r["reason"] for r in rows)
    assert all(r["attempts"] == 1 for r in rows)  # retried per request, not per instance
    assert pq.read_table(tmp_path / "out" / "trajectories.parquet").num_rows == 2


def test_a_model_endpoint_answering_5xx_is_retried_and_one_that_keeps_failing_stops_the_run(
    tmp_path: Path,
) -> None:
    failed_once: list[bool] = []

    def flaky(body: dict[str, Any]) -> Any:
        if not failed_once:
            failed_once.append(True)
            return 503, {"error": "loading the model"}
        return reply(body)

    tasks = write_tasks(tmp_path / "tasks.jsonl", "a")
    with ChatServer(flaky) as server:
        done = model_rollout(server.url, tmp_path / "flaky", tasks, "-n", "1")
        assert len(server.requests) == 3  # the first turn twice, then the second
    assert done.returncode == 0, done.stderr
    (row,) = read_trajectories(tmp_path / "flaky")
    assert (row["outcome"], row["reward"]) == ("ok", 1.0)

    with ChatServer(lambda body: (500, {"error": "boom"})) as server:
        broken = model_rollout(
            server.url,
            tmp_path / "broken",
            tasks,
            "-n",
            "3",
            "--model-retries",
            "1",
            "--endpoint-failures",
            "2",
        )
        assert len(server.requests) == 2 * 2  # 2 episodes (the limit), 2 tries each
    assert broken.returncode == 1
    (line,) = error_lines(broken.stderr)
    assert f"the model endpoint {server.url} failed 2 episodes in a row" in line
    assert "answered 500 (2 tries)" in line
    assert {r["outcome"] for r in read_trajectories(tmp_path / "broken")} == {
        "infrastructure_error"
    }


def test_a_conversation_over_the_models_context_ends_the_episode_truncated(
    tmp_path: Path,
) -> None:
    """A 400 saying the context is full (OpenAI's and vLLM's answers) is the agent's trajectory
    cut, as a turn cap cuts it: ``ok``, ``truncated``, graded; not a failure of anyone."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", "a")
    for kind in ("openai-context", "vllm-context"):
        # the first turn calls tools, the second is refused
        with ChatServer(refusing(kind)) as server:
            done = model_rollout(server.url, tmp_path / kind, tasks, "-n", "1")
            assert len(server.requests) == 2  # not retried: the conversation only grows
        assert done.returncode == 0, done.stderr
        (row,) = read_trajectories(tmp_path / kind)
        assert (row["outcome"], row["truncated"], row["reason"]) == ("ok", True, None), kind
        assert len(row["steps"]) == 2  # the agent's two tool calls are its trajectory
        assert row["reward"] == 1.0  # the state it left is graded


@pytest.mark.parametrize("kind", ["openai-401", "openai-schema", "vllm-404"])
def test_a_model_endpoint_refusing_our_request_is_a_config_failure_that_stops_the_run(
    tmp_path: Path, kind: str
) -> None:
    """Any other 4xx (a wrong key, model or URL, a request the endpoint cannot take) is ours to
    fix: never the agent's, not retried, and the run stops early naming the endpoint, the
    status and the endpoint's own message."""
    status, body = REFUSALS[kind]
    message = str(body["error"]["message"] if "error" in body else body["message"])
    tasks = write_tasks(tmp_path / "tasks.jsonl", "a", "b")
    with ChatServer(refusing(kind, after=0)) as server:
        done = model_rollout(
            server.url, tmp_path / "out", tasks, "-n", "6", "--endpoint-failures", "2"
        )
        assert len(server.requests) == 2  # one request per episode (no retries), 2 episodes
    assert done.returncode == 1, done.stderr
    (line,) = error_lines(done.stderr)
    assert f"the model endpoint {server.url} failed 2 episodes in a row" in line
    assert f"answered {status}: {message[:60]}" in line
    assert "refused each time" in line
    assert "(a configuration failure, not the agent's)" in line
    rows = read_trajectories(tmp_path / "out")
    assert [r["outcome"] for r in rows] == ["infrastructure_error"] * 2  # 4 never started
    assert all(f"answered {status}" in r["reason"] for r in rows)


def _ended(turns: int, error: BaseException | None = None) -> tuple[Trajectory, Any]:
    trajectory = Trajectory("e", "t", TERMINAL, "ok", turns=[Turn(0, 0.0, 0.0)] * turns)
    return trajectory, error


def test_the_endpoint_watch_counts_identical_failures_in_a_row_only() -> None:
    def down(kind: str) -> ModelEndpointError:
        return ModelEndpointError("down", endpoint="http://m/v1", kind=kind)

    watch = _EndpointWatch(limit=2)
    watch.saw(*_ended(0, down("no answer")))
    watch.saw(*_ended(0, down("HTTP 500")))  # another failure: not the same one
    watch.saw(*_ended(1))  # the model answered an episode: the count starts again
    watch.saw(*_ended(0, down("no answer")))
    wrapped = RuntimeError("the policy wrapped it")
    wrapped.__cause__ = down("no answer")
    with pytest.raises(ModelEndpointDownError) as stopped:
        watch.saw(*_ended(0, wrapped))
    assert (stopped.value.count, stopped.value.endpoint) == (2, "http://m/v1")
    assert stopped.value.kind == "no answer"
    never = _EndpointWatch(limit=0)
    for _ in range(5):
        never.saw(*_ended(0, down("no answer")))


def test_a_turn_cap_marks_the_record_truncated_and_the_summary_counts_failures_as_it_says(
    tmp_path: Path,
) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", "a")
    with ChatServer() as server:  # its first reply calls tools; one turn is all it gets
        done = model_rollout(server.url, tmp_path / "cut", tasks, "-n", "1", "--max-turns", "1")
    assert done.returncode == 0, done.stderr
    (row,) = read_trajectories(tmp_path / "cut")
    assert (row["outcome"], row["truncated"], row["answer"]) == ("ok", True, None)
    assert row["reward"] == 1.0  # the environment's state is graded, as gymnasium's last step
    assert row["format"] == FORMAT
    (parquet,) = read_trajectories(tmp_path / "cut" / "trajectories.parquet")
    assert parquet["truncated"] is True
    said = " ".join(done.stderr.split())
    assert "of them truncated (--max-turns) │ 1" in said

    # an episode ok with reward 1, one the agent's failure: both means, each saying how
    failing = tmp_path / "failing.jsonl"
    failing.write_text(
        "".join(
            json.dumps({**task, "reward_arguments": {"path": "x", "expected": "y"}}) + "\n"
            for task in [{"id": "a"}, {"id": "b", "fail": True}]
        )
    )
    summary = run_cli(
        "rollout",
        TERMINAL,
        *("--policy", "tests.test_rollout_failures:scripted", "--tasks", str(failing)),
        *("-n", "2", "-c", "2", "--no-ray", "--out", str(tmp_path / "mixed")),
        cwd=ROOT,
    )
    assert summary.returncode == 1  # an episode did not end ok
    said = " ".join(summary.stderr.split())
    assert "agent_error │ 1" in said
    assert "mean reward (1 of 2 scored) │ 1.000" in said
    assert "mean reward, failed as 0 (2 of 2) │ 0.500" in said
    wall = float(re.search(r"wall time \(the whole command\) │ ([\d.]+) s", said)[1])  # type: ignore[index]
    running = float(re.search(r"of it running episodes │ ([\d.]+) s", said)[1])  # type: ignore[index]
    assert wall >= running


async def scripted(task: dict[str, Any], env: Any) -> str | None:
    """A policy for the summary test: fails task ``b`` (the agent's failure), writes the
    answer the reward expects for the others."""
    if task.get("fail"):
        raise ValueError("the agent gave up")
    await env.call_tool("execute_command", {"command": "printf y > x"})
    return "done"


def test_a_ray_that_cannot_start_is_one_line_with_the_alternatives(tmp_path: Path) -> None:
    import ray

    args = ["rollout", TERMINAL, "-n", "1", "--out", str(tmp_path)]
    nothing_there = {"RAY_ADDRESS": "127.0.0.1:1"}
    if not ray.is_initialized():
        # in this process: nothing answers at the address, so the join fails before ray.init
        # is called (this process's Ray state untouched; tests/_cli.py restores os.environ)
        done = run_cli(*args, env=nothing_there, cwd=ROOT)
    else:  # subprocess: a process that is a Ray driver already would not try to join
        done = subprocess.run(
            [*CHILD, *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**os.environ, **nothing_there},
        )
    assert done.returncode == 1, done.stderr
    (line,) = error_lines(done.stderr)
    assert "could not join the Ray at 127.0.0.1:1: nothing answers there" in line
    assert "ConnectionRefusedError" in line
    assert "--no-ray" in line
    assert "RAY_ADDRESS=HOST:PORT" in line
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) <= 3, done.stderr


def test_joining_a_ray_that_asks_for_a_token_without_one_says_how_to_give_it(
    tmp_path: Path, session_ray: SessionRay
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env["RAY_ADDRESS"] = session_ray.address
    # Ray tries a refused join once a second, 20 times by default, before it raises: two tries
    # (Ray's RAY_gcs_server_port_wait_time_s) end in the same refusal 18 s sooner (how long it
    # takes is not the subject; what the error says is)
    env["RAY_gcs_server_port_wait_time_s"] = "2"
    # subprocess: the failed ray.init must not touch this process's Ray state
    done = subprocess.run(
        [*CHILD, "rollout", TERMINAL, "-n", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    (line,) = error_lines(done.stderr)
    assert f"could not join the Ray at {session_ray.address}" in line
    assert "set RAY_AUTH_MODE=token" in line
    assert "Traceback" not in done.stderr


@contextmanager
def _sigint_as_in_a_terminal() -> Iterator[None]:
    """A child started meanwhile gets SIGINT at its default, as a terminal's foreground job
    does, even where this process ignores it: a background job of a non-interactive shell
    (``scripts/test &``, a CI runner) starts with SIGINT ignored, a child inherits that
    across exec, and Python then leaves it ignored. A handler is reset to the default by exec:
    this process has Python's own meanwhile (the tests run in its main thread)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:  # None: a handler not set from Python, which this cannot put back
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def test_ctrl_c_exits_130_writes_what_is_done_and_says_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    tasks = paced_tasks(tmp_path / "paced.jsonl", pause=1)
    args = ["-n", "8", "-c", "1", "--no-ray", "--out", str(out)]
    args += ["--policy", "tests._paced_policy:policy", "--tasks", str(tasks)]
    # subprocess: a signal needs a process of its own
    with _sigint_as_in_a_terminal():
        child = subprocess.Popen(
            [*CHILD, "rollout", TERMINAL, *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        jsonl = out / "trajectories.jsonl"
        deadline = time.monotonic() + 120
        while not (jsonl.is_file() and jsonl.read_bytes().count(b"\n") >= 1):
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "no episode recorded in 120 s"
            time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, stderr
    recorded = read_trajectories(out)
    assert 1 <= len(recorded) < 8
    assert {r["outcome"] for r in recorded} == {"ok"}
    assert len(read_trajectories(out / "trajectories.parquet")) == len(recorded)
    (line,) = [line for line in stderr.splitlines() if line.startswith("aenv: interrupted:")]
    assert f"{len(recorded)} of 8 episodes are recorded in {out / 'trajectories.jsonl'}" in line
    assert "and trajectories.parquet" in line
    assert line.endswith(f"aenv rollout {TERMINAL} {' '.join(args)}")
    assert "Traceback" not in stderr
