"""What ``aenv rollout`` records, run as a user runs it (the CLI, in this process: tests/_cli.py):
the whole conversation exactly as the model saw it (the requests the server received, the tool
names it was offered) with the map to the environment's names beside it, per-turn token usage,
logprobs and token ids from an OpenAI-compatible endpoint (a deterministic byte-level server on
loopback, answering as vLLM and as SGLang do), the policy's settings, the resolved
``name@version``; a ``--policy`` callable's calls made into a conversation; JSONL and Parquet
reading back equal, with one type per field (pyarrow reads the JSONL as a table, the Parquet
file has nested columns); records of format 3 read back in this format; the reward's
components."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.failures import TaskCallError
from rollout.records import FORMAT, chat_messages
from rollout.synthesis import AgentEnv, OpenAIPolicy, read_trajectories, synthesize
from tests._chat_server import (
    OPENAI_NAME,
    ChatServer,
    render_prompt,
    render_reply,
    sglang_reply,
    tokens,
)
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
    assert row["format"] == FORMAT == 4
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
    # the names the model used, not the environment's: the map is beside them
    assert [c["function"]["name"] for c in calls] == [OPENAI_NAME, "execute_command"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "command": f"echo {value} > answer.txt"
    }
    assert [m["tool_call_id"] for m in messages[3:5]] == ["call-a", "call-b"]
    assert json.loads(messages[4]["content"])["output"] == f"{value}\n"
    assert messages[5] == {"role": "assistant", "content": "done"}
    assert row["tool_names"] == [{"name": OPENAI_NAME, "tool": REAL}]
    assert [(s["tool"], s["tool_call_id"]) for s in row["steps"]] == [
        (REAL, "call-a"),
        (REAL, "call-b"),
    ]
    assert json.loads(row["steps"][0]["arguments_json"]) == json.loads(
        calls[0]["function"]["arguments"]
    )
    assert json.loads(row["steps"][1]["structured_json"]) == {
        "output": f"{value}\n",
        "returncode": 0,
    }
    assert [t["message_index"] for t in row["turns"]] == [2, 5]
    assert [t["finish_reason"] for t in row["turns"]] == ["tool_calls", "stop"]
    check_turn_tokens(row)
    assert row["usage"] == {
        key: sum(t["usage"][key] for t in row["turns"])
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    assert row["policy"] == {
        "name": "OpenAIPolicy",
        "model": "test-model",
        "base_url": url,
        "system_prompt": SYSTEM,
        "temperature": 0.5,
        "max_turns": 4,
        "logprobs": True,
        "token_ids": True,
        "dialogue": None,
    }
    assert [t["function"]["name"] for t in row["tools"]] == [OPENAI_NAME]
    assert set(row["timings"]) == {"acquire", "setup", "policy", "reward"}


def check_turn_tokens(row: dict[str, Any]) -> None:
    """Each turn's prompt is the messages before it and the tools offered, as sent; its token
    ids, logprobs and usage are those of that prompt and of its recorded assistant message
    (the byte-level server's: tests/_chat_server.py)."""
    for turn in row["turns"]:
        sent = {"messages": chat_messages(row["messages"][: turn["message_index"]])}
        sent["tools"] = row["tools"]
        (said,) = chat_messages([row["messages"][turn["message_index"]]])
        completion = render_reply(said)
        assert turn["prompt_token_ids"] == tokens(render_prompt(sent))
        assert turn["token_ids"] == tokens(completion)
        assert bytes(turn["token_ids"]).decode() == completion
        assert "".join(item["token"] for item in turn["logprobs"]) == completion
        assert [item["bytes"] for item in turn["logprobs"]] == [[i] for i in turn["token_ids"]]
        assert turn["usage"] == {
            "prompt_tokens": len(turn["prompt_token_ids"]),
            "completion_tokens": len(turn["token_ids"]),
            "total_tokens": len(turn["prompt_token_ids"]) + len(turn["token_ids"]),
        }


def model_options(url: str, out: Path, tasks: Path) -> list[str]:
    return [
        *("--base-url", url, "--model", "test-model", "--api-key", "sk-secret-test"),
        *("--system-prompt", SYSTEM, "--temperature", "0.5", "--max-turns", "4", "--logprobs"),
        "--token-ids",
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
    # what the model saw: the OpenAI-safe names, the settings, its own tool calls sent back;
    # each turn of a record is one of these requests, exactly
    first = [r for r in requests if len(r["messages"]) == 2]
    assert len(first) == 2
    assert first[0]["messages"][0] == {"role": "system", "content": SYSTEM}
    assert (first[0]["temperature"], first[0]["logprobs"]) == (0.5, True)
    assert first[0]["return_token_ids"] is True
    assert [t["function"]["name"] for t in first[0]["tools"]] == [OPENAI_NAME]
    second = next(r for r in requests if len(r["messages"]) == 5)
    sent = second["messages"][2]["tool_calls"]
    assert [c["function"]["name"] for c in sent] == [OPENAI_NAME, "execute_command"]
    for row in rows:
        for turn in row["turns"]:
            request = {
                "messages": chat_messages(row["messages"][: turn["message_index"]]),
                "tools": row["tools"],
            }
            assert request in [{k: r[k] for k in ("messages", "tools")} for r in requests]
    # the Parquet file carries the same rows, in nested columns; the JSONL is a table too
    assert read_trajectories(out / "trajectories.parquet") == rows
    check_table_types(out)


def check_table_types(out: Path, *, jsonl: bool = True) -> None:
    """pyarrow reads the JSONL as a table (one type per field; ``jsonl=False``: it holds lines
    of an older format, whose fields had other types) and the Parquet file's nested fields as
    lists of structs and structs."""
    import pyarrow as pa
    import pyarrow.json
    import pyarrow.parquet as pq

    schema = pq.read_schema(out / "trajectories.parquet")
    for name in ("messages", "steps", "turns", "tool_names"):
        assert pa.types.is_struct(schema.field(name).type.value_type), name
        if jsonl:
            table = pyarrow.json.read_json(out / "trajectories.jsonl")
            assert pa.types.is_list(table.schema.field(name).type), name
    for name in ("policy", "timings", "usage"):
        assert pa.types.is_struct(schema.field(name).type), name
    turn = schema.field("turns").type.value_type
    assert turn.field("token_ids").type == pa.list_(pa.int64())
    assert pa.types.is_struct(turn.field("logprobs").type.value_type)
    message = schema.field("messages").type.value_type
    assert message.field("tool_calls").type.value_type.field("function").type.names == [
        "name",
        "arguments",
    ]


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
    # as a model would have been offered them (a tool the instance lacks keeps its name)
    assert [c["function"]["name"] for c in calls] == [OPENAI_NAME, OPENAI_NAME, "no_such_tool"]
    assert [s["tool"] for s in row["steps"]] == [REAL, REAL, "no_such_tool"]
    assert [t["function"]["name"] for t in row["tools"]] == [OPENAI_NAME]
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
    assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "scored_0_1_0__say"
    assert row["tool_names"] == [{"name": "scored_0_1_0__say", "tool": "scored@0.1.0/say"}]
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


async def test_sglang_token_ids_and_top_logprobs_are_kept(tmp_path: Path) -> None:
    """SGLang returns both id lists on the choice; ``top_logprobs`` alternatives are kept."""
    tasks = [
        {
            "id": "s",
            "prompt": "write 5",
            "reward_arguments": {"path": "answer.txt", "expected": "5"},
        }
    ]
    with ChatServer(sglang_reply) as server:
        policy = OpenAIPolicy(server.url, "m", logprobs=True, token_ids=True)
        summary = await synthesize(TERMINAL, episodes=1, out=tmp_path, tasks=tasks, policy=policy)
    assert summary.outcomes == {"ok": 1}
    (row,) = read_trajectories(tmp_path)
    check_turn_tokens(row)
    assert all(item["top_logprobs"] == [] for t in row["turns"] for item in t["logprobs"])
    assert read_trajectories(tmp_path / "trajectories.parquet") == [row]


FORMAT_3 = {
    "episode_id": "000000-old",
    "task_id": "old",
    "env": TERMINAL,
    "outcome": "ok",
    "reason": None,
    "truncated": False,
    "reward": 1.0,
    "answer": "done",
    "steps": [
        {
            "tool": REAL,
            "arguments": {"command": "ls"},
            "text": "{}",
            "is_error": False,
            "started": 0.1,
            "seconds": 0.2,
            "structured": {"output": "", "returncode": 0},
            "tool_call_id": "c1",
        }
    ],
    "attempts": 1,
    "instance_id": "i1",
    "seconds": 1.5,
    "task": {"id": "old", "prompt": "list"},
    "retried": [],
    "env_ref": TERMINAL,
    "reward_components": None,
    "messages": [
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": REAL, "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ],
    "tools": [
        {"type": "function", "function": {"name": REAL, "description": "", "parameters": {}}}
    ],
    "tool_names": {REAL: OPENAI_NAME},
    "turns": [
        {
            "message_index": 1,
            "started": 0.0,
            "seconds": 0.1,
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            "logprobs": {"content": [{"token": "ls", "logprob": -0.5}]},
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    "timings": {"acquire": 0.5, "setup": 0.1, "policy": 0.3, "reward": 0.1},
    "policy": {"name": "OpenAIPolicy", "model": "m", "temperature": 1, "logprobs": True},
    "format": 3,
}


async def test_records_of_format_3_read_back_upgraded_and_a_resumed_run_keeps_them(
    tmp_path: Path,
) -> None:
    """A run directory an older version wrote: its records read in this format's shape (the
    model's names back in the messages and tools), a run into it skips them and writes one
    Parquet file of both formats."""
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(FORMAT_3) + "\n")
    (old,) = read_trajectories(tmp_path)
    assert old["format"] == 3
    call = old["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == OPENAI_NAME
    assert [t["function"]["name"] for t in old["tools"]] == [OPENAI_NAME]
    assert old["tool_names"] == [{"name": OPENAI_NAME, "tool": REAL}]
    assert old["steps"][0]["arguments_json"] == '{"command": "ls"}'
    assert json.loads(old["steps"][0]["structured_json"]) == {"output": "", "returncode": 0}
    assert old["turns"][0]["logprobs"] == [
        {"token": "ls", "logprob": -0.5, "bytes": None, "top_logprobs": []}
    ]
    assert old["turns"][0]["token_ids"] is None
    assert old["policy"]["temperature"] == 1.0
    assert old["policy"]["token_ids"] is None

    tasks = [{"id": "old", "prompt": "say hello"}, {"id": "new", "prompt": "say hello"}]
    summary = await synthesize(TERMINAL, episodes=2, out=tmp_path, tasks=tasks, policy=noop)
    assert (summary.skipped, summary.outcomes) == (1, {"ok": 1})
    rows = read_trajectories(tmp_path)
    assert [r["format"] for r in rows] == [3, FORMAT]
    assert rows[0] == old
    assert read_trajectories(tmp_path / "trajectories.parquet") == rows
    check_table_types(tmp_path, jsonl=False)


def test_a_parquet_file_of_format_3_reads_back_upgraded(tmp_path: Path) -> None:
    """Format 3's Parquet files held the nested fields as JSON text columns: they read back as
    its JSONL lines do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {k: [json.dumps(v) if isinstance(v, dict | list) else v] for k, v in FORMAT_3.items()}
    columns["reward_components"] = [json.dumps(None)]
    pq.write_table(pa.Table.from_pydict(columns), tmp_path / "trajectories.parquet")
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(FORMAT_3) + "\n")
    assert read_trajectories(tmp_path / "trajectories.parquet") == read_trajectories(tmp_path)


async def noop(task: dict[str, Any], env: AgentEnv) -> None:
    return None
