"""TRL's own ``GRPOTrainer`` (trl 1.16) trains on mini-terminal through ``rollout.trl``.

The trainer runs in TRL's virtual environment (tests/_oracles.py's ``TRL``: trl, transformers,
torch's CPU build, this checkout's aenv-ray), made once; tests/_trl_train.py builds a tiny Qwen2
and a byte-level tokenizer in the process (nothing from a hub), trains a few steps with
``environment_factory=TRLEnvironments("mini-terminal@1.0.0")`` and no other reward, on the local
engine, and reports what TRL logged and what the environment saw. Where the venv cannot be made
the test skips saying why (under ``AENV_REQUIRE_ORACLES=1`` it fails).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._oracles import ROOT, TRL, oracle_python

# a guard against a hang, not a measurement: importing torch, transformers and trl costs ~20 s of
# CPU, the 3 steps a few; on 2 cores shared by many, the wall clock is several times that
pytestmark = pytest.mark.timeout(900)

DRIVER = ROOT / "tests" / "_trl_train.py"
GOOD = "echo 42 > out.txt"
BAD = "echo 7 > out.txt"
STEPS, GROUP = 3, 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = oracle_python(TRL)
    out = tmp_path_factory.mktemp("trl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}
    env["AENV_CONFIG_FILE"] = str(out / "no-aenv-config.json")  # the local engine, no hub
    done = subprocess.run(
        [str(python), str(DRIVER), str(out / "grpo")],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    failed = f"the training failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, failed
    assert lines, failed
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def test_grpo_trained_its_steps(trained: dict[str, Any]) -> None:
    assert trained["global_step"] == STEPS
    assert len(trained["log"]) == STEPS  # one logged step each (logging_steps=1)
    assert trained["parameters_changed"] > 0  # the optimiser stepped


def test_the_reward_trl_logged_is_the_environment_s(trained: dict[str, Any]) -> None:
    """Each step's reward in TRL's log is the mean of what mini-terminal's reward returned for
    that step's rollouts (in the order TRL asked for them); the environment is the only reward."""
    records = trained["records"]
    assert len(records) == STEPS * GROUP
    key = f"rewards/{trained['reward_name']}/mean"
    assert key == "rewards/aenv_mini_terminal_1_0_0/mean"
    for step, entry in enumerate(trained["log"]):
        rewards = [r["reward"] for r in records[step * GROUP : (step + 1) * GROUP]]
        assert entry[key] == pytest.approx(sum(rewards) / GROUP)
        assert entry["reward"] == pytest.approx(sum(rewards) / GROUP)
        # and the tool calls TRL counted are the ones that reached the instances
        calls = [len(r["calls"]) for r in records[step * GROUP : (step + 1) * GROUP]]
        assert entry["tools/call_frequency"] == pytest.approx(sum(calls) / GROUP)


def test_tool_calls_ran_in_each_rollout_s_own_instance(trained: dict[str, Any]) -> None:
    """The model's tool calls reached the instances: each rollout's reward (does out.txt hold
    42?) is what its last command left in its own instance; no instance served two rollouts,
    and none is left when training is done."""
    records = trained["records"]
    assert trained["tool_names"] == {"execute_command": "execute_command"}
    calls = [call for r in records for call in r["calls"]]
    assert calls, "the model made no tool call"
    assert {c["arguments"]["command"] for c in calls} <= {GOOD, BAD}
    assert all(c["tool"] == "execute_command" and not c["is_error"] for c in calls)
    for record in records:
        assert record["failure"] is None
        commands = [c["arguments"]["command"] for c in record["calls"]]
        wrote_42 = bool(commands) and commands[-1] == GOOD
        assert record["reward"] == (1.0 if wrote_42 else 0.0), record
    instances = [r["instance_id"] for r in records]
    assert None not in instances
    assert len(set(instances)) == len(instances)
    assert trained["counts"]["started"] == trained["counts"]["released"] == len(records)
    assert trained["live"] == 0
    assert trained["instances_left"] == []


def test_the_model_was_given_the_task_without_its_answer(trained: dict[str, Any]) -> None:
    for prompt in trained["prompts"]:
        text = json.dumps(prompt)
        assert prompt[-1] == {"role": "user", "content": "Write the answer into out.txt"}
        assert "42" not in text
        assert "reward_arguments" not in text
        assert "solution" not in text


# HF `datasets` reads a real run's Parquet file as nested columns, not JSON strings: printed by
# this script in TRL's venv (it has `datasets`), as the feature types' own reprs
FEATURES = """
import json, sys
from datasets import Dataset, List, Value

data = Dataset.from_parquet(sys.argv[1])
def kind(feature):
    if isinstance(feature, List):
        return ["list", kind(feature.feature)]
    if isinstance(feature, dict):
        return {name: kind(sub) for name, sub in feature.items()}
    if isinstance(feature, Value):
        return feature.dtype
    return type(feature).__name__
row = data[0]
print(json.dumps({
    "features": {name: kind(data.features[name]) for name in ("messages", "tools", "turns")},
    "first_message": row["messages"][0],
    "tool_name": json.loads(row["tools"])[0]["function"]["name"],
    "turn_tokens": [len(turn["token_ids"]) for turn in row["turns"]],
}))
"""


def test_hf_datasets_reads_a_rollout_s_parquet_as_nested_columns(tmp_path: Path) -> None:
    from tests._chat_server import OPENAI_NAME, ChatServer
    from tests.test_rollout_records import aenv_rollout, model_options, write_tasks

    python = oracle_python(TRL)
    tasks = write_tasks(tmp_path / "tasks.jsonl", "42")
    out = tmp_path / "run"
    with ChatServer() as server:
        done = aenv_rollout(
            "mini-terminal@1.0.0",
            "-n",
            "1",
            "--no-ray",
            *model_options(server.url, out, tasks),
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr
    read = subprocess.run(
        [str(python), "-c", FEATURES, str(out / "trajectories.parquet")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    found = json.loads(read.stdout.strip().splitlines()[-1])
    features = found["features"]
    # lists of structs, each field typed: not a string column to json.loads
    message = features["messages"][1]
    assert features["messages"][0] == "list"
    assert isinstance(message, dict)
    assert {"role", "content", "tool_calls"} <= set(message)
    assert message["role"] == message["content"] == "string"
    function = message["tool_calls"][1]["function"]
    assert function == {"name": "string", "arguments": "string"}
    # the tools' JSON Schemas are free-form: JSON text by design (rollout/records.py JSON_FIELDS)
    assert features["tools"] == "string"
    turn = features["turns"][1]
    assert features["turns"][0] == "list"
    assert isinstance(turn, dict)
    assert turn["token_ids"] == ["list", "int64"]
    assert turn["message_index"] == "int64"
    assert turn["logprobs"][0] == "list"
    assert isinstance(turn["logprobs"][1], dict)
    # and the values are the run's: the system prompt, the name offered, a turn's tokens
    assert found["first_message"]["role"] == "system"
    assert found["tool_name"] == OPENAI_NAME
    assert found["turn_tokens"]
    assert all(n > 0 for n in found["turn_tokens"])
