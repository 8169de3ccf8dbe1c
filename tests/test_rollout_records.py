"""What ``aenv rollout`` records, run as a user runs it (the CLI, in this process: tests/_cli.py):
the whole conversation in the OpenAI chat shape with the tools' real names and matching ids,
per-turn token usage and logprobs from an OpenAI-compatible endpoint (a deterministic server on
loopback), the policy's settings, the resolved ``name@version``; a ``--policy`` callable's calls
made into a conversation; JSONL and Parquet reading back equal; the reward's components."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.failures import TaskCallError
from rollout.synthesis import AgentEnv, read_trajectories, synthesize
from tests._chat_server import OPENAI_NAME, ChatServer
from tests._cli import aenv as run_cli
from tests._session_ray import SessionRay

TERMINAL = "mini-terminal@1.0.0"
REAL = f"{TERMINAL}/execute_command"
SYSTEM = "You are a careful shell agent."


def aenv_rollout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``aenv rollout ARGS`` in this process (tests/_cli.py)."""
    return run_cli("rollout", *args, cwd=cwd)


def write_tasks(path: Path, *expected: str) -> Path:
    tasks = [
        {
            "id": f"t{value}",
            "prompt": f"write {value}",
            "reward_arguments": {"path": "answer.txt", "expected": value},
        }
        for value in expected
    ]
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def check_model_record(row: dict[str, Any], url: str) -> None:
    """A record of the chat server's two-turn conversation (see tests/_chat_server.py)."""
    value = row["task"]["reward_arguments"]["expected"]
    assert row["outcome"] == "ok", row["reason"]
    assert row["env_ref"] == TERMINAL
    assert row["instance_id"]
    assert row["reward"] == 1.0
    assert row["answer"] == "done"
    assert row["format"] == 3
    assert row["truncated"] is False  # the model answered: the episode ended, not cut
    messages = row["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert messages[1] == {"role": "user", "content": f"write {value}"}
    calls = messages[2]["tool_calls"]
    assert [c["id"] for c in calls] == ["call-a", "call-b"]
    assert [c["function"]["name"] for c in calls] == [REAL, REAL]  # not the names the model used
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "command": f"echo {value} > answer.txt"
    }
    assert [m["tool_call_id"] for m in messages[3:5]] == ["call-a", "call-b"]
    assert json.loads(messages[4]["content"])["output"] == f"{value}\n"
    assert messages[5] == {"role": "assistant", "content": "done"}
    assert [(s["tool"], s["tool_call_id"]) for s in row["steps"]] == [
        (REAL, "call-a"),
        (REAL, "call-b"),
    ]
    assert [t["message_index"] for t in row["turns"]] == [2, 5]
    assert [t["finish_reason"] for t in row["turns"]] == ["tool_calls", "stop"]
    # the server counts 10 prompt tokens per message sent, and one completion token per token
    assert [t["usage"] for t in row["turns"]] == [
        {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
        {"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53},
    ]
    assert row["usage"] == {"prompt_tokens": 70, "completion_tokens": 10, "total_tokens": 80}
    tokens = [[item["token"] for item in t["logprobs"]["content"]] for t in row["turns"]]
    assert tokens == [["<tool>", "echo", "cat", "x", "x", "x", "x"], ["do", "ne", "."]]
    assert row["turns"][1]["logprobs"]["content"][2]["logprob"] == -0.75
    assert row["policy"] == {
        "name": "OpenAIPolicy",
        "model": "test-model",
        "base_url": url,
        "system_prompt": SYSTEM,
        "temperature": 0.5,
        "max_turns": 4,
        "logprobs": True,
    }
    assert [t["function"]["name"] for t in row["tools"]] == [REAL]
    assert row["tool_names"] == {REAL: OPENAI_NAME}
    assert set(row["timings"]) == {"acquire", "setup", "policy", "reward"}


def model_options(url: str, out: Path, tasks: Path) -> list[str]:
    return [
        *("--base-url", url, "--model", "test-model", "--api-key", "sk-secret-test"),
        *("--system-prompt", SYSTEM, "--temperature", "0.5", "--max-turns", "4", "--logprobs"),
        *("--tasks", str(tasks), "--out", str(out)),
    ]


def test_a_base_url_run_records_the_whole_conversation_usage_and_logprobs(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", "42", "7")
    out = tmp_path / "run"
    with ChatServer() as server:
        done = aenv_rollout(
            TERMINAL,
            "-n",
            "2",
            "-c",
            "2",
            "--no-ray",
            *model_options(server.url, out, tasks),
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        requests = server.requests
    rows = read_trajectories(out / "trajectories.jsonl")
    assert sorted(r["episode_id"] for r in rows) == ["000000-t42", "000001-t7"]  # as they end
    for row in rows:
        check_model_record(row, server.url)
    assert "sk-secret-test" not in (out / "trajectories.jsonl").read_text()
    # what the model saw: the OpenAI-safe names, the settings, its own tool calls sent back
    first = [r for r in requests if len(r["messages"]) == 2]
    assert len(first) == 2
    assert first[0]["messages"][0] == {"role": "system", "content": SYSTEM}
    assert first[0]["temperature"] == 0.5
    assert first[0]["logprobs"] is True
    assert [t["function"]["name"] for t in first[0]["tools"]] == [OPENAI_NAME]
    second = next(r for r in requests if len(r["messages"]) == 5)
    sent = second["messages"][2]["tool_calls"]
    assert [c["function"]["name"] for c in sent] == [OPENAI_NAME, "execute_command"]
    # the Parquet file carries the same rows
    assert read_trajectories(out / "trajectories.parquet") == rows


POLICY = """
async def agent(task, env):
    await env.call_tool("execute_command", {"command": "echo 42 > answer.txt"})
    await env.call_tool("mini-terminal_1_0_0__execute_command", {"command": "cat answer.txt"})
    await env.call_tool("no_such_tool", {})
    return "42"
"""


def test_a_policy_run_records_its_calls_as_a_conversation(tmp_path: Path) -> None:
    (tmp_path / "mypolicy.py").write_text(POLICY)
    tasks = write_tasks(tmp_path / "tasks.jsonl", "42")
    out = tmp_path / "run"
    done = aenv_rollout(
        TERMINAL,
        *("-n", "1", "--no-ray", "--policy", "mypolicy:agent", "--system-prompt", SYSTEM),
        *("--tasks", str(tasks), "--out", str(out)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (row,) = read_trajectories(out)
    assert row["outcome"] == "ok"  # a tool error is the agent's behaviour, recorded
    assert row["reward"] == 1.0
    assert row["env_ref"] == TERMINAL
    messages = row["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        *["assistant", "tool"] * 3,
        "assistant",
    ]
    assert messages[:2] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "write 42"},
    ]
    calls = [m["tool_calls"][0] for m in messages[2:8:2]]
    assert [c["id"] for c in calls] == ["call_0", "call_1", "call_2"]
    assert [c["function"]["name"] for c in calls] == [REAL, REAL, "no_such_tool"]
    assert [m["tool_call_id"] for m in messages[3:9:2]] == ["call_0", "call_1", "call_2"]
    assert json.loads(messages[5]["content"])["output"] == "42\n"
    assert "no_such_tool" in messages[7]["content"]
    assert messages[8] == {"role": "assistant", "content": "42"}
    assert [s["is_error"] for s in row["steps"]] == [False, False, True]
    assert [s["tool_call_id"] for s in row["steps"]] == ["call_0", "call_1", "call_2"]
    assert row["turns"] == []
    assert row["usage"] is None
    assert row["policy"]["name"] == "mypolicy:agent"
    assert row["policy"]["system_prompt"] == SYSTEM
    assert read_trajectories(out / "trajectories.parquet") == [row]


def test_a_base_url_run_on_a_ray_pool_records_the_same(
    tmp_path: Path, session_ray: SessionRay
) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", "42")
    out = tmp_path / "run"
    with ChatServer() as server:
        # a subprocess that joins the session's Ray: no Ray stays initialized in this process
        command = [sys.executable, "-m", "aenv_cli", "rollout", TERMINAL, "-n", "1", "-c", "1"]
        done = subprocess.run(
            [*command, *model_options(server.url, out, tasks)],
            cwd=tmp_path,
            env={**os.environ, **session_ray.env},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr
    (row,) = read_trajectories(out)
    check_model_record(row, server.url)
    assert read_trajectories(out / "trajectories.parquet") == [row]


SCORED_CONFIG = {"name": "scored", "version": "0.1.0", "description": "a reward with parts"}
SCORED = '''
from aenv_ray import register_reward, register_tool


@register_tool
def say(text: str) -> str:
    """Say something."""
    return text


@register_reward
def reward(shape: str = "parts") -> object:
    """A reward with its components, or (shape="text") no number at all."""
    if shape == "text":
        return "great job"
    if shape == "unscored":
        return {"reward": None, "invalid": True}
    return {"reward": 0.5, "format": 1.0, "length": 3}
'''


@pytest.fixture
def scored(tmp_path: Path) -> str:
    project = tmp_path / "scored"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text(json.dumps(SCORED_CONFIG))
    (project / "src" / "scored.py").write_text(SCORED)
    return str(project)


async def say_hello(task: dict[str, Any], env: AgentEnv) -> str:
    await env.call_tool("say", {"text": "hello"})
    return "hello"


async def test_the_reward_components_are_kept_null_is_unscored_and_no_number_stops_the_run(
    tmp_path: Path, scored: str
) -> None:
    out = tmp_path / "run"
    tasks = [{"id": "a", "prompt": "say hello", "reward_arguments": {}}]
    summary = await synthesize(scored, episodes=1, out=out, tasks=tasks, policy=say_hello)
    assert summary.outcomes == {"ok": 1}
    (row,) = read_trajectories(out)
    assert row["env"] == scored
    assert row["env_ref"] == "scored@0.1.0"
    assert row["reward"] == 0.5
    assert row["reward_components"] == {"format": 1.0, "length": 3}
    assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "scored@0.1.0/say"
    assert read_trajectories(out / "trajectories.parquet") == [row]

    unscored = [{"id": "u", "prompt": "say hello", "reward_arguments": {"shape": "unscored"}}]
    summary = await synthesize(
        scored, episodes=1, out=tmp_path / "u", tasks=unscored, policy=say_hello
    )
    assert (summary.outcomes, summary.mean_reward) == ({"ok": 1}, None)
    (row,) = read_trajectories(tmp_path / "u")
    assert (row["reward"], row["reward_components"]) == (None, {"invalid": True})

    text = [{"id": "b", "prompt": "say hello", "reward_arguments": {"shape": "text"}}]
    with pytest.raises(TaskCallError, match="returned 'great job', not a number") as caught:
        await synthesize(scored, episodes=1, out=tmp_path / "b", tasks=text, policy=say_hello)
    assert caught.value.task_id == "b"
    assert read_trajectories(tmp_path / "b") == []  # not recorded as an episode
