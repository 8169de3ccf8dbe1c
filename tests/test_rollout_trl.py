"""``rollout.trl`` against the contract TRL's ``GRPOTrainer`` applies to an ``environment_factory``
(trl 1.16, ``trainer/grpo_trainer.py``), on real mini-terminal instances, without TRL itself
(tests/test_trl_oracle.py trains with the real trainer in its own virtual environment).

TRL calls the factory for each concurrent rollout, takes every public function of the object's
class but ``reset`` and ``get_reward`` as a tool (its schema from the signature and the Google
docstring), calls ``reset(**row)`` before a rollout, the tools with the model's arguments as
keywords, and ``get_reward()`` after it.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Literal

import pytest

from aenv_ray.engine import SandboxEngine
from aenv_ray.errors import ConfigurationError, InstanceBrokenError
from rollout.sources import InstanceHandle, SDKSource
from rollout.trl import EpisodeFailedError, TRLEnvironments, TRLEpisode, _hint

TERMINAL = "mini-terminal@1.0.0"
TASK = {
    "id": "sum",
    "prompt": "Write the sum of 1..10 into answer.txt",
    "reward_arguments": {"path": "answer.txt", "expected": "55"},
    "solution": "echo 55 > answer.txt",
}


@pytest.fixture(scope="module")
def environments(warm_engine: SandboxEngine) -> Any:
    with TRLEnvironments(TERMINAL) as made:
        yield made
    assert made.live == 0


def _tools(episode: TRLEpisode) -> dict[str, Any]:
    """The tools TRL finds on ``episode``, as TRL finds them."""
    return {
        name: getattr(episode, name)
        for name, _ in inspect.getmembers(type(episode), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }


def test_the_environment_s_tools_are_the_methods_trl_offers(environments: TRLEnvironments) -> None:
    tools = _tools(environments())
    assert list(tools) == ["execute_command"]
    assert environments.tool_names == {"execute_command": "execute_command"}
    method = tools["execute_command"]
    assert method.__name__ == "execute_command"
    signature = inspect.signature(method)  # bound: no self, as transformers reads it
    assert list(signature.parameters) == ["command", "timeout"]
    assert signature.parameters["command"].annotation is str
    assert signature.parameters["command"].default is inspect.Parameter.empty
    assert signature.parameters["timeout"].annotation is int
    assert signature.parameters["timeout"].default == 60
    doc = inspect.getdoc(method) or ""
    assert doc.startswith("Run a bash command")
    assert "Args:\n    command: the command line to run" in doc
    assert "    timeout: seconds before the command is killed." in doc
    assert environments.reward_name == "aenv_mini_terminal_1_0_0"


def test_rows_give_the_model_the_task_without_what_grades_it() -> None:
    rows = TRLEnvironments.rows_of([TASK], system_prompt="Be brief.")
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": TASK["prompt"]},
    ]
    assert json.loads(rows[0]["task"]) == {  # for reset(), never rendered to the model
        "id": "sum",
        "prompt": TASK["prompt"],
        "reward_arguments": TASK["reward_arguments"],
    }
    messages = [{"role": "user", "content": "hi"}]
    (row,) = TRLEnvironments.rows_of([{"messages": messages, "reward_arguments": {}}])
    assert row["prompt"] == messages


def test_a_rollout_runs_on_its_own_instance_and_scores_the_environment_s_reward(
    environments: TRLEnvironments,
) -> None:
    (row,) = environments.rows([TASK])
    episode = environments()
    seen = []
    for command, expected in (("echo 55 > answer.txt", 1.0), ("echo 54 > answer.txt", 0.0)):
        assert episode.reset(**row) is None  # the prompt already says it all
        answer = episode.execute_command(command=command)  # type: ignore[attr-defined]
        assert json.loads(answer) == {"output": "", "returncode": 0}  # the result's text
        listing = episode.execute_command(command="cat answer.txt")  # type: ignore[attr-defined]
        assert json.loads(listing)["output"].strip() == command.split()[1]  # in this instance
        assert episode.get_reward() == expected
        record = environments.records[-1]
        assert record.reward == expected
        assert [c["arguments"] for c in record.calls] == [
            {"command": command},
            {"command": "cat answer.txt"},
        ]
        seen.append(record.instance_id)
    assert len(set(seen)) == 2
    assert None not in seen
    environments.wait_released()
    assert environments.live == 0


def test_what_the_agent_got_wrong_is_answered_and_a_rollout_left_open_is_given_back(
    environments: TRLEnvironments,
) -> None:
    (row,) = environments.rows([TASK])
    episode = environments()
    episode.reset(**row)
    answer = episode.execute_command(command="true", timeout=-1)  # type: ignore[attr-defined]
    assert answer.startswith("error: ")
    assert "timeout must be a positive" in answer
    (call,) = episode._record.calls  # type: ignore[union-attr]
    assert call["is_error"] is True
    episode.reset(**row)  # TRL never asked for the reward: that instance is given back
    assert episode.get_reward() == 0.0
    environments.wait_released()
    assert environments.live == 0


class _Broken:
    """An instance source whose instances never start (the engine keeps failing)."""

    label = TERMINAL

    def __init__(self) -> None:
        self.attempts = 0

    async def acquire(self) -> InstanceHandle:
        self.attempts += 1
        raise InstanceBrokenError("the sandbox died while starting")

    async def release(self, instance: InstanceHandle, *, broken: bool = False) -> None:
        raise AssertionError("nothing was acquired")


def test_an_infrastructure_failure_is_no_reward_of_the_agent() -> None:
    source = _Broken()
    tools = [{"name": "noop", "description": "Do nothing.", "inputSchema": {"type": "object"}}]
    with TRLEnvironments(TERMINAL, source=source, tools=tools, max_retries=1) as environments:
        episode = environments()
        episode.reset(**environments.rows([TASK])[0])
        with pytest.raises(EpisodeFailedError, match="the sandbox died"):
            episode.noop()  # type: ignore[attr-defined]  (TRL shows the model the error)
        with pytest.raises(EpisodeFailedError, match="has no reward"):
            episode.get_reward()
    assert source.attempts == 2  # one retry on a fresh instance
    assert environments.records[-1].failure is not None


def test_a_task_without_reward_arguments_is_refused(environments: TRLEnvironments) -> None:
    episode = environments()
    episode.reset(task=json.dumps({"id": "x", "prompt": "p"}))
    with pytest.raises(ConfigurationError, match="no reward_arguments"):
        episode.get_reward()
    environments.wait_released()
    assert environments.live == 0


def test_schema_types_become_hints_transformers_reads_back() -> None:
    assert _hint({"type": "string"}) is str
    assert _hint({"type": "array", "items": {"type": "integer"}}) == list[int]
    assert _hint({"enum": ["a", "b"]}) == Literal["a", "b"]
    assert _hint({"type": ["string", "null"]}) == str | None
    assert _hint({"type": "object", "properties": {"x": {}}}) is dict
    assert _hint({"type": "object", "additionalProperties": {"type": "number"}}) == dict[str, float]
    assert _hint({}) is Any


def test_tool_names_trl_reserves_or_python_refuses_are_renamed() -> None:
    tools = [
        {"name": f"{TERMINAL}/reset", "inputSchema": {"type": "object"}},
        {"name": "get-file", "inputSchema": {"type": "object"}},
    ]
    with TRLEnvironments(TERMINAL, source=SDKSource(TERMINAL), tools=tools) as environments:
        assert environments.tool_names == {"tool_reset": "reset", "get_file": "get-file"}
        assert sorted(_tools(environments())) == ["get_file", "tool_reset"]
