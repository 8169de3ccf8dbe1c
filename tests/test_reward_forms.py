"""One reward shape everywhere: every form of reward ``aenv rollout`` takes (a number,
``{"reward": x, ...components}``, AEnvironment's template ``{"score": x, ...}``, ``{"reward":
null}`` for an unscored episode) is read alike (:func:`rollout.rewards.split_reward`) by the
gymnasium wrapper, RLlib's numeric view of it, the AReaL workflow and ``aenv rollout`` itself,
on one real project served in instances; anything else is refused by each with its typed
error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.errors import FunctionError
from rollout.areal import AEnvWorkflow
from rollout.failures import TaskCallError
from rollout.gym import ToolEnv, make_env
from rollout.rewards import split_reward
from rollout.rllib import ByteCodec, NumericToolEnv
from rollout.synthesis import AgentEnv, read_trajectories, synthesize

SHAPED = '''
from aenv_ray import register_reward, register_tool

STATE = {"said": ""}


@register_tool
def say(text: str) -> dict:
    """Say something; the episode is over."""
    STATE["said"] = text
    return {"said": text, "done": True}


@register_reward
def reward(shape: str = "number") -> object:
    """0.75 if "yes" was said, in the form ``shape`` asks for."""
    value = 0.75 if STATE["said"] == "yes" else 0.0
    return {
        "number": value,
        "int": int(value),
        "object": {"reward": value, "format": 1.0},
        "score": {"score": value, "passed": 3},
        "unscored": {"reward": None, "invalid": True},
        "text": "great job",
    }[shape]
'''

# shape -> (the reward, its components) as every consumer reads them
FORMS: dict[str, tuple[float | None, dict[str, Any] | None]] = {
    "number": (0.75, None),
    "int": (0.0, None),
    "object": (0.75, {"format": 1.0}),
    "score": (0.75, {"passed": 3}),
    "unscored": (None, {"invalid": True}),
}


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory) -> str:
    project = tmp_path_factory.mktemp("shaped")
    (project / "src").mkdir()
    (project / "src" / "shaped.py").write_text(SHAPED)
    config = {"name": "shaped", "version": "1.0.0", "description": "rewards of every form"}
    (project / "config.json").write_text(json.dumps(config))
    return str(project)


def task(shape: str) -> dict[str, Any]:
    return {"id": shape, "prompt": "say yes", "reward_arguments": {"shape": shape}}


@pytest.fixture(scope="module")
def gym_env(shaped: str) -> Iterator[ToolEnv]:
    env = make_env(shaped, tasks=[task(shape) for shape in FORMS])
    yield env
    env.close()


def test_split_reward_reads_every_form_and_says_what_it_refuses() -> None:
    assert split_reward(True) == (1.0, None)
    assert split_reward({"score": 2, "reward": 0.5}) == (0.5, {"score": 2})  # "reward" wins
    for refused in ("great job", {"score": "high"}, {"reward": "1"}, None, [1.0]):
        with pytest.raises(ValueError, match="not a number or an object"):
            split_reward(refused)


def test_the_gym_wrapper_and_rllib_view_take_every_form(gym_env: ToolEnv) -> None:
    for index, (shape, (reward, components)) in enumerate(FORMS.items()):
        assert gym_env.reset(options={"task": index})[1] == {"task_id": shape}
        _, got, terminated, _, info = gym_env.step({"tool": "say", "arguments": {"text": "yes"}})
        assert terminated
        assert got == (0.0 if reward is None else reward), shape
        assert type(got) is float
        assert (info["scored"], info["reward_components"]) == (reward is not None, components)

    numeric = NumericToolEnv(gym_env, codec=ByteCodec(), max_observation_len=64, max_action_len=64)
    numeric.reset(options={"task": 3})  # the template form
    action = numeric.encode_action({"tool": "say", "arguments": {"text": "yes"}})
    _, got, terminated, _, info = numeric.step(action)
    assert (got, terminated, info["reward_components"]) == (0.75, True, {"passed": 3})


def test_the_gym_wrapper_refuses_a_reward_of_no_form(shaped: str) -> None:
    env = make_env(shaped, tasks=[task("text")])
    try:
        env.reset()
        with pytest.raises(FunctionError, match="returned 'great job', not a number") as caught:
            env.step({"tool": "say", "arguments": {"text": "yes"}})
        assert caught.value.error_type == "invalid_reward"
    finally:
        env.close()


async def say_yes(task: dict[str, Any], env: AgentEnv) -> str:
    await env.call_tool("say", {"text": "yes"})
    return "yes"


async def test_areal_and_aenv_rollout_take_every_form(shaped: str, tmp_path: Path) -> None:
    workflow = AEnvWorkflow(shaped, policy=say_yes)
    for shape, (reward, _) in FORMS.items():
        got = await workflow.run(task(shape))
        assert (got, type(got)) == (0.0 if reward is None else reward, float), shape

    tasks = [task(shape) for shape in FORMS]
    summary = await synthesize(
        shaped, episodes=len(tasks), out=tmp_path, tasks=tasks, policy=say_yes, concurrency=2
    )
    assert summary.outcomes == {"ok": len(tasks)}
    rows = {row["task_id"]: row for row in read_trajectories(tmp_path)}
    assert {s: (r["reward"], r["reward_components"]) for s, r in rows.items()} == FORMS

    with pytest.raises(TaskCallError, match="returned 'great job', not a number"):
        await synthesize(
            shaped, episodes=1, out=tmp_path / "text", tasks=[task("text")], policy=say_yes
        )
