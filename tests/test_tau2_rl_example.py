"""examples/tau2_rl: the AReaL-style workflow plays tau2 tasks on a warm Ray pool of the built-in
``tau2@1.0.0``, as a trainer calls it (``run(data, base_url=, api_key=)``) and as AEnvironment's
``run_agent_return_reward({"domain", "task_id"})``.

One deterministic chat server (started here) plays both sides: as ``agent-model`` it replays the
task's gold actions as tool calls, then says what must be said; as ``user-model`` (the
instances' LLM user simulator, reached over the network the tau2 instances keep) it opens with
a marker naming its task, answers, and stops once the agent is done. Rewards come from tau2's
evaluator inside the instance: 1.0 for the replay, 0.0 for an agent that changes nothing where
the task needs a change.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import ray

from builtin_envs.tau2 import get_domain
from tests._chat_server import ChatServer
from tests._cli import aenv as run_cli
from tests._tau2 import require_tau2_data

require_tau2_data()


ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-agent-key-5c1d"
TASKS = [("airline", "1"), ("airline", "5"), ("retail", "0")]
MARKER = re.compile(r"\[task (\w+)/(\w+)\]")


def _scenario_marker(system_prompt: str) -> str:
    """The marker of the task whose user scenario this user-simulator prompt holds."""
    for domain, task_id in TASKS:
        reason = get_domain(domain).task(task_id).user_scenario["instructions"]["reason_for_call"]
        if reason in system_prompt:
            return f"[task {domain}/{task_id}]"
    raise AssertionError("the user simulator's prompt holds none of the tasks' scenarios")


def _reply(content: str | None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def _respond(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    if body["model"] == "user-model":  # the simulator: its own turns are "assistant" here
        said = sum(1 for m in messages if m["role"] == "assistant")
        if said == 0:
            return _reply(f"{_scenario_marker(messages[0]['content'])} Hi, I need some help.")
        done = "ALL DONE" in str(messages[-1].get("content"))
        return _reply("###STOP###" if done else "Please go on.")
    opening = next(m["content"] for m in messages if m["role"] == "user")
    found = MARKER.search(opening)
    assert found, opening
    criteria = get_domain(found[1]).task(found[2]).evaluation_criteria
    assert criteria is not None
    actions = [a for a in criteria.actions or [] if a.requestor == "assistant"]
    made = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
    if body["model"] == "agent-model" and made < len(actions):
        action = actions[made]
        call = {
            "id": f"call-{made}",
            "type": "function",
            "function": {"name": action.name, "arguments": json.dumps(action.arguments)},
        }
        return _reply(None, [call])
    return _reply(" ".join(criteria.communicate_info or []) + " ALL DONE")


@pytest.fixture(scope="module")
def chat() -> Iterator[ChatServer]:
    with ChatServer(_respond) as server:
        yield server


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tau2_rl_agent", ROOT / "examples" / "tau2_rl" / "agent.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def workflow(example: ModuleType, chat: ChatServer) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TAU2_USER_LLM", "user-model")
        patch.setenv("TAU2_USER_LLM_API_BASE", chat.url)
        patch.setenv("TAU2_USER_LLM_API_KEY", "sk-user-key")
        the_workflow = example.Tau2Workflow(size=2, model="agent-model")
        try:
            yield the_workflow
        finally:
            the_workflow.close()
            if example._DEFAULT is not None:
                example._DEFAULT.close()
            ray.shutdown()


async def test_a_trainer_call_plays_the_task_to_tau2s_reward(
    workflow: Any, chat: ChatServer
) -> None:
    """AReaL's call (the proxy's address and key as arguments): the gold replay scores 1.0,
        and the record holds the conversation the model had, as it had it (the map of the tool names
    it was offered to the environment's beside it)."""
    reward, trajectory = await workflow.play(
        {"domain": "retail", "task_id": "0"}, base_url=chat.url, api_key=KEY
    )
    assert reward == 1.0
    assert isinstance(reward, float)
    assert trajectory.outcome == "ok"
    assert trajectory.reward_components["components"]["DB"] == 1.0
    assert trajectory.reward_components["termination_reason"] == "user_stop"
    messages = trajectory.messages
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("<instructions>")
    assert messages[1] == {"role": "assistant", "content": "Hi! How can I help you today?"}
    assert messages[2]["content"].startswith("[task retail/0]")
    called = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    plain = [
        "find_user_id_by_name_zip",
        "get_order_details",
        "get_product_details",
        "get_product_details",
        "exchange_delivered_order_items",
    ]
    assert called == plain  # as the stand-in model called them (by their plain names)
    assert [s.tool for s in trajectory.steps] == [f"tau2@1.0.0/{name}" for name in plain]
    assert {"name": "tau2_1_0_0__get_order_details", "tool": "tau2@1.0.0/get_order_details"} in (
        trajectory.tool_names
    )
    assert [s.tool for s in trajectory.steps][-1] == "tau2@1.0.0/exchange_delivered_order_items"
    assert all(not s.is_error for s in trajectory.steps)
    assert messages[-1]["role"] == "assistant"
    assert "ALL DONE" in messages[-1]["content"]
    assert trajectory.usage["completion_tokens"] == 5 * len(trajectory.turns)
    agent_headers = [h for b, h in zip(chat.requests, chat.headers, strict=True)
                     if b["model"] == "agent-model"]  # fmt: skip
    assert agent_headers
    assert all(h["Authorization"] == f"Bearer {KEY}" for h in agent_headers)


async def test_an_agent_that_changes_nothing_scores_zero(workflow: Any, chat: ChatServer) -> None:
    """retail task 0 needs an exchange: saying "done" without it fails tau2's DB check."""
    lazy = type(workflow)(pool=workflow.pool, model="lazy-model", base_url=chat.url)
    reward, trajectory = await lazy.play({"domain": "retail", "task_id": "0"})
    assert reward == 0.0
    assert trajectory.steps == []
    assert trajectory.reward_components["components"]["DB"] == 0.0


async def test_aenvironments_entry_point_reads_the_model_from_openai_variables(
    example: ModuleType, workflow: Any, chat: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_MODEL", "agent-model")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("TAU2_USER_LLM", "user-model")
    monkeypatch.setenv("TAU2_USER_LLM_API_BASE", chat.url)
    rewards = [
        await example.run_agent_return_reward({"domain": domain, "task_id": task_id})
        for domain, task_id in TASKS[:2]
    ]
    assert rewards == [1.0, 1.0]
    assert example._DEFAULT.model == "agent-model"  # OPENAI_MODEL


def test_aenv_rollout_plays_a_model_against_tau2s_user(
    example: ModuleType, chat: ChatServer, tmp_path: Path
) -> None:
    """``aenv rollout tau2@1.0.0 --base-url`` takes tau2's dialogue; ``--env`` gives every
    instance the user simulator's settings (never written to the run directory)."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(example.tau2_task({"domain": d, "task_id": t})) + "\n" for d, t in TASKS[1:]
        )
    )
    secret = "sk-user-secret-42"
    command = ["rollout", "tau2@1.0.0", "--tasks", str(tasks),
               "-n", "2", "-c", "2", "--no-ray", "--out", str(tmp_path / "out"),
               "--base-url", chat.url, "--model", "agent-model", "--max-turns", "30",
               "-e", "TAU2_USER_LLM=user-model", "-e", f"TAU2_USER_LLM_API_BASE={chat.url}",
               "-e", f"TAU2_USER_LLM_API_KEY={secret}"]  # fmt: skip
    done = run_cli(*command, cwd=ROOT)  # in this process (tests/_cli.py)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted((r["task_id"], r["outcome"], r["reward"]) for r in rows) == [
        ("airline-5", "ok", 1.0),
        ("retail-0", "ok", 1.0),
    ]
    assert {r["policy"]["dialogue"] for r in rows} == {"Tau2Dialogue"}
    for row in rows:
        assert row["messages"][1]["content"] == "Hi! How can I help you today?"
        assert row["messages"][-1]["content"].endswith("ALL DONE")
    written = "".join(p.read_text() for p in (tmp_path / "out").iterdir() if p.suffix != ".parquet")
    assert secret not in written
    assert secret not in done.stdout + done.stderr
