"""rollout.gym: the gymnasium Env and VectorEnv over real instances on the local engine."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from aenv_ray import InstanceClosedError, InstanceState
from aenv_ray.engine import default_engine
from rollout.gym import (
    AnyText,
    ResetMode,
    ResetNeededError,
    Task,
    ToolEnv,
    env_ref,
    gym_id,
    make_env,
    make_vector_env,
)

ROOT = Path(__file__).resolve().parent.parent
PROBE = str(ROOT / "tests" / "envs" / "probe")
TERMINAL = "mini-terminal@1.0.0"


def write_task(value: str) -> dict[str, Any]:
    return {
        "id": f"write-{value}",
        "prompt": f"Write {value} into out.txt",
        "reward_arguments": {"path": "out.txt", "expected": value},
    }


TASKS = [write_task("1"), write_task("2"), write_task("3")]


def shell(command: str) -> str:
    return json.dumps({"tool": "execute_command", "arguments": {"command": command}})


COUNTER = '''
from aenv_ray import register_function, register_reward, register_tool

STATE = {"n": 0, "seed": None}


@register_function
def reset(seed: int, start: int = 0) -> dict:
    """New game."""
    STATE.update(n=start, seed=seed)
    return dict(STATE)


@register_tool
def bump() -> dict:
    """Count one; done at 3."""
    STATE["n"] += 1
    return {"n": STATE["n"], "done": STATE["n"] >= 3}


@register_tool
def seed() -> int:
    """The seed reset() got."""
    return STATE["seed"]


@register_reward
def reached(target: int = 3) -> float:
    """1.0 at the target."""
    return 1.0 if STATE["n"] >= target else 0.0
'''


@pytest.fixture
def counter_project(tmp_path: Path) -> str:
    """A project with a `reset` function and a tool that signals done."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "counter.py").write_text(COUNTER)
    config = {"name": "counter", "version": "1.0.0", "deployConfig": {"cpu": "1"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.fixture
def terminal() -> Iterator[ToolEnv]:
    env = make_env(TERMINAL, tasks=TASKS, max_steps=4)
    yield env
    env.close()


def is_running(instance_id: str) -> bool:
    info = asyncio.run(default_engine().get(instance_id))
    return info.state is not InstanceState.TERMINATED


def gym_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aenv-gym")]


# -- the checker ---------------------------------------------------------------------------------


def test_check_env_passes_on_mini_terminal(terminal: ToolEnv) -> None:
    check_env(terminal)  # random actions, seeding, data reuse, spec.make() and double close


def test_check_env_passes_on_the_probe_project() -> None:
    env = make_env(PROBE, tasks=[{"prompt": "answer", "reward_arguments": {"answer": "42"}}])
    try:
        check_env(env)
        assert env.spec is not None
        assert env.spec.id == "aenv/probe.0.1.0"
        assert "echo" in env.tools
    finally:
        env.close()


def test_the_spaces_contain_every_string() -> None:
    space = AnyText()
    assert "∑ ✓\n\x00" * 10_000 in space
    assert "" in space
    assert b"bytes" not in space
    assert 3 not in space
    space.seed(0)
    assert all(space.sample() in space for _ in range(20))
    assert space == AnyText()
    assert space != gymnasium.spaces.Text(64)


# -- the episode protocol ------------------------------------------------------------------------


def test_an_episode_solves_a_task_and_the_next_starts_clean(terminal: ToolEnv) -> None:
    obs, info = terminal.reset(seed=0, options={"task": 1})
    assert (obs, info) == ("Write 2 into out.txt", {"task_id": "write-2"})
    first = terminal.instance_id
    obs, reward, terminated, truncated, info = terminal.step(shell("echo 2 > out.txt; cat out.txt"))
    assert json.loads(obs) == {"output": "2\n", "returncode": 0}
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"tool": "execute_command", "is_error": False, "error_kind": ""}
    obs, reward, terminated, truncated, info = terminal.step({"tool": "submit"})
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert type(reward) is float
    assert type(terminated) is bool
    with pytest.raises(ResetNeededError, match="episode has ended") as caught:
        terminal.step({"tool": "submit"})
    assert isinstance(caught.value, gymnasium.error.ResetNeeded)

    # mini-terminal has no reset function: the next episode runs on a new instance
    terminal.reset(
        options={"task": Task(prompt="again", reward_arguments=TASKS[1]["reward_arguments"])}
    )
    assert terminal.instance_id != first
    assert not is_running(first)
    assert terminal.step({"tool": "submit"})[1] == 0.0  # no out.txt here


def test_seeded_resets_pick_the_same_tasks() -> None:
    picks = []
    for _ in range(2):
        env = make_env(TERMINAL, tasks=TASKS)
        try:
            picks.append(
                [env.reset(seed=7)[0], env.reset()[0], env.reset()[0], env.reset(seed=8)[0]]
            )
        finally:
            env.close()
    assert picks[0] == picks[1]


def test_malformed_actions_are_observations_not_exceptions(terminal: ToolEnv) -> None:
    terminal.reset(seed=1)
    cases = [
        ("ls -la", "invalid action: the action is not JSON"),
        ("[1, 2]", "invalid action: the action must be a JSON object, got list"),
        ({"arguments": {}}, 'the action needs "tool"'),
        ({"tool": "execute_command", "argument": {}}, "did you mean `arguments`?"),
        ({"tool": "execute_command", "arguments": [1]}, "must be an object"),
        ({"tool": "execute_command", "arguments": "{bad"}, "is not JSON"),
    ]
    for action, expected in cases:
        obs, reward, terminated, truncated, info = terminal.step(action)
        assert expected in obs, obs
        assert "tools: execute_command, submit" in obs
        ended = {"scored": True, "reward_components": None} if truncated else {}
        assert info == {"tool": "", "is_error": True, "error_kind": "invalid_action", **ended}
        assert (reward, terminated) == (0.0, False)
        if truncated:  # max_steps=4: the 4th step ends the episode (the reward's info added)
            terminal.reset()
    # the tool's own errors come back as they are
    obs, *_, info = terminal.step({"tool": "exec_command", "arguments": {"command": "ls"}})
    assert "did you mean `execute_command`?" in obs
    assert info == {"tool": "exec_command", "is_error": True, "error_kind": "not_found"}
    # arguments as JSON text, as OpenAI tool calls carry them
    obs, *_ = terminal.step({"tool": "execute_command", "arguments": '{"command": "echo hi"}'})
    assert json.loads(obs)["output"] == "hi\n"


def test_max_steps_truncates_and_the_last_step_is_rewarded() -> None:
    env = make_env(TERMINAL, tasks=[write_task("ok")], max_steps=2)
    try:
        env.reset(seed=0)
        assert env.step(shell("echo ok > out.txt"))[1:4] == (0.0, False, False)
        _, reward, terminated, truncated, _ = env.step(shell("true"))
        assert (reward, terminated, truncated) == (1.0, False, True)
        with pytest.raises(ResetNeededError):
            env.step(shell("true"))
    finally:
        env.close()


def test_a_reset_function_and_a_done_signal(counter_project: str) -> None:
    task = {"id": "from-1", "reset_arguments": {"start": 1}, "reward_arguments": {"target": 3}}
    env = make_env(counter_project, tasks=[task], reset_mode="auto")
    other = make_env(counter_project, tasks=[task], reset_mode=ResetMode.FRESH_INSTANCE)
    try:
        assert env.reset(seed=3) == ("", {"task_id": "from-1"})
        instance = env.instance_id
        assert env.step({"tool": "bump"})[1:3] == (0.0, False)
        obs, reward, terminated, truncated, _ = env.step({"tool": "bump"})
        assert json.loads(obs) == {"n": 3, "done": True}
        assert (reward, terminated, truncated) == (1.0, True, False)
        env.reset()
        assert env.instance_id == instance  # the reset function made it new again
        assert json.loads(env.step({"tool": "bump"})[0])["n"] == 2

        other.reset(seed=3)  # a new instance each time, seeded alike
        assert other.instance_id != instance
        env.reset(seed=3)
        assert env.step({"tool": "seed"})[0] == other.step({"tool": "seed"})[0]
        first = other.instance_id
        other.reset()
        assert other.instance_id != first
    finally:
        env.close()
        other.close()


# -- vector -------------------------------------------------------------------------------------


def test_the_vector_env_matches_sync_vector_env_step_for_step() -> None:
    n = 3
    options: dict[str, Any] = {"tasks": TASKS, "max_steps": 3}
    ours = make_vector_env(TERMINAL, num_envs=n, **options)
    sync = SyncVectorEnv([lambda: make_env(TERMINAL, **options)] * n)
    script = [
        [shell("echo 1 > out.txt"), shell("echo 2 > out.txt"), "not json"],
        [{"tool": "submit"}, shell("cat out.txt"), shell("echo 3 > out.txt")],
        [shell("pwd"), {"tool": "submit"}, {"tool": "nope"}],  # env 0 autoresets here
        [shell("cat out.txt"), shell("ls"), shell("echo 3 > out.txt")],  # env 1 autoresets
        [{"tool": "submit"}, shell("echo 2 > out.txt"), {"tool": "submit"}],  # env 2 too
        [shell("true"), {"tool": "submit"}, shell("echo 1 > out.txt")],
    ]
    try:
        assert ours.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        assert ours.single_observation_space == sync.single_observation_space
        assert ours.single_action_space == sync.single_action_space
        assert ours.observation_space == sync.observation_space
        for seed in ([5, 6, 7], 11):
            a, b = ours.reset(seed=seed), sync.reset(seed=seed)
            assert data_equivalence(a, b, exact=True), (a, b)
        ended, rewarded = np.zeros(n, dtype=bool), 0.0
        for actions in script:
            a, b = ours.step(tuple(actions)), sync.step(tuple(actions))
            assert data_equivalence(a, b, exact=True), (actions, a, b)
            ended |= a[2] | a[3]
            rewarded += float(a[1].sum())
        assert ended.all()  # every environment ended an episode and was reset
        assert rewarded >= 1.0  # and some solved their task
    finally:
        ours.close()
        sync.close()


def test_reset_mask_resets_only_the_chosen_environments() -> None:
    env = make_vector_env(TERMINAL, num_envs=2, tasks=TASKS)
    try:
        env.reset(seed=0)
        before = [episode.instance.instance_id for episode in env._episodes]  # type: ignore[union-attr]
        _, info = env.reset(options={"reset_mask": np.array([False, True])})
        after = [episode.instance.instance_id for episode in env._episodes]  # type: ignore[union-attr]
        assert before[0] == after[0]
        assert before[1] != after[1]
        assert list(info["_task_id"]) == [False, True]
    finally:
        env.close()


# -- registration and lifecycle -------------------------------------------------------------------


def test_registered_ids_round_trip_and_make() -> None:
    for ref in ("mini-terminal@1.0.0", "mini-terminal", "a_b-c@1.2.3-rc.1"):
        assert env_ref(gym_id(ref)) == ref
        assert gymnasium.envs.registration.parse_env_id(gym_id(ref))[2] is None
    assert "aenv/mini-terminal.1.0.0" in gymnasium.registry
    assert "aenv/mini-terminal" in gymnasium.registry
    env = gymnasium.make("aenv/mini-terminal.1.0.0", tasks=TASKS, max_steps=3)
    try:
        assert env.spec is not None
        assert env.spec.id == "aenv/mini-terminal.1.0.0"
        obs, _ = env.reset(seed=2)
        assert obs.startswith("Write ")
        assert env.step({"tool": "submit"})[2] is True
    finally:
        env.close()
    vec = gymnasium.make_vec(
        "aenv/mini-terminal", num_envs=2, vectorization_mode="vector_entry_point"
    )
    try:
        assert vec.reset(seed=0)[0] == ("", "")
    finally:
        vec.close()


def test_close_releases_every_instance_and_thread() -> None:
    others = set(gym_threads())  # an earlier test's environment is not this test's business
    env = make_env(TERMINAL)
    vec = make_vector_env(TERMINAL, num_envs=2)
    seen = set()
    for _ in range(2):
        env.reset()
        vec.reset()
        seen.add(env.instance_id)
        seen.update(e.instance.instance_id for e in vec._episodes)  # type: ignore[union-attr]
    assert gym_threads()
    env.close()
    vec.close()
    env.close()  # idempotent
    vec.close()
    assert len(seen) == 6
    assert not [i for i in seen if i is not None and is_running(i)]
    assert not set(gym_threads()) - others
    with pytest.raises(InstanceClosedError):
        env.reset()


def test_the_gym_wrappers_do_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import sys, rollout.gym; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
