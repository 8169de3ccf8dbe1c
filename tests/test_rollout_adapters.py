"""The trainer adapters against the trainers' interfaces, on real instances.

AReaL (its package pulls torch and a dozen agent SDKs, so it is not installed here) is exercised
through the contract its proxy workflow applies (``areal/experimental/openai/proxy/workflow.py``
in areal 1.0.4): an object with an async ``run(data, **extra)`` called with ``base_url``,
``api_key`` and ``http_client``, returning a ``float``. RLlib is installed (``ray[rllib]``, no
torch): the env goes through ``ray.tune``'s registry, an ``EnvContext``, the gymnasium
registration and ``make_vec`` its ``SingleAgentEnvRunner.make_env`` performs, and RLlib's
``SingleAgentEpisode``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from aenv_ray.errors import ConfigurationError
from rollout.areal import AEnvWorkflow, EpisodeFailedError
from rollout.gym import make_env
from rollout.rllib import ByteCodec, NumericToolEnv, TokenCodec, register
from rollout.synthesis import AgentEnv

TERMINAL = "mini-terminal@1.0.0"
TASK = {"prompt": "sum 1..10", "reward_arguments": {"path": "answer.txt", "expected": "55"}}


# -- AReaL -------------------------------------------------------------------------------------


async def test_areal_runs_the_model_behind_its_proxy_and_returns_a_float(
    chat_endpoint: tuple[str, list[dict[str, Any]]],
) -> None:
    url, requests = chat_endpoint
    workflow = AEnvWorkflow(TERMINAL, model="policy-model")
    # what AReaL checks before it uses a workflow
    assert callable(getattr(workflow, "run", None))
    assert asyncio.iscoroutinefunction(workflow.run)
    async with httpx.AsyncClient() as client:
        reward = await workflow.run(TASK, base_url=url, api_key="session-key", http_client=client)
        again, trajectory = await workflow.play(TASK, base_url=url, http_client=client)
    assert type(reward) is float
    assert reward == again == 1.0
    assert requests[0]["model"] == "policy-model"
    steps = trajectory.to_json()["steps"]
    assert [s["tool"] for s in steps] == [f"{TERMINAL}/execute_command"]  # the real name


async def test_areal_gives_its_policy_the_task_without_what_grades_it() -> None:
    """AReaL's ``data`` reaches the policy (and its ``AgentEnv``) without ``reward_arguments``
    (the expected answer) or a reference solution; the reward still gets its arguments, and the
    record keeps them, never the solution."""
    given: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def policy(task: dict[str, Any], env: AgentEnv) -> None:
        given.append((dict(task), dict(env.task)))
        await env.call_tool("execute_command", {"command": "echo 55 > answer.txt"})

    workflow = AEnvWorkflow(TERMINAL, policy=policy)
    reward, trajectory = await workflow.play(
        {**TASK, "id": "a", "solution": "echo 55 > answer.txt"}
    )
    assert reward == 1.0  # the reward got its arguments
    assert given == [({"id": "a", "prompt": TASK["prompt"]},) * 2]
    recorded = trajectory.to_json()["task"]
    assert recorded == {
        "id": "a",
        "prompt": TASK["prompt"],
        "reward_arguments": TASK["reward_arguments"],
    }


async def test_areal_legacy_entry_point(chat_endpoint: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = chat_endpoint
    workflow = AEnvWorkflow(TERMINAL, base_url=url)
    reward = await workflow.run_agent_return_reward(
        {**TASK, "reward_arguments": {"path": "answer.txt", "expected": "56"}}
    )
    assert type(reward) is float
    assert reward == 0.0


async def test_areal_never_scores_an_episode_whose_instances_kept_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathlib import Path

    monkeypatch.setenv("AENV_ENV_PATH", str(Path(__file__).parent / "envs"))

    async def crashes(task: dict[str, Any], env: AgentEnv) -> None:
        await env.call_tool("crash")

    workflow = AEnvWorkflow("hostile@1.0.0", policy=crashes, max_retries=1)
    with pytest.raises(EpisodeFailedError, match="after 2 attempts"):
        await workflow.run({"id": "t"})


async def test_areal_without_a_model_says_what_to_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="OPENAI_BASE_URL") as caught:
        await AEnvWorkflow(TERMINAL).run(TASK)
    assert type(caught.value) is ConfigurationError


async def test_areal_subproc_mode_reads_the_proxy_from_openai_variables(
    chat_endpoint: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AReaL's subproc mode calls ``run(data)`` alone, its proxy in ``OPENAI_BASE_URL`` and the
    session's key in ``OPENAI_API_KEY``."""
    url, requests = chat_endpoint
    seen: list[str | None] = []
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "session-key")

    workflow = AEnvWorkflow(TERMINAL)
    model = workflow._model_policy(TASK, {})
    seen.append(getattr(model, "api_key", None))
    assert await workflow.run(TASK) == 1.0
    assert seen == ["session-key"]
    assert requests[0]["messages"][-1] == {"role": "user", "content": TASK["prompt"]}


async def test_areal_data_with_messages_opens_the_conversation_with_them(
    chat_endpoint: tuple[str, list[dict[str, Any]]],
) -> None:
    url, requests = chat_endpoint
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write the sum of 1..10 into answer.txt"},
    ]
    data = {"messages": messages, "reward_arguments": TASK["reward_arguments"]}
    reward, trajectory = await AEnvWorkflow(TERMINAL).play(data, base_url=url)
    assert reward == 1.0
    assert requests[0]["messages"] == messages
    assert trajectory.messages[:2] == messages


async def test_areal_data_without_prompt_or_messages_is_refused(
    chat_endpoint: tuple[str, list[dict[str, Any]]],
) -> None:
    url, requests = chat_endpoint
    with pytest.raises(ConfigurationError, match="neither `prompt` nor `messages`"):
        await AEnvWorkflow(TERMINAL).run({"reward_arguments": {}}, base_url=url)
    with pytest.raises(ConfigurationError, match="list of chat messages"):
        await AEnvWorkflow(TERMINAL).run({"messages": "hi"}, base_url=url)
    assert requests == []


async def test_areal_a_group_of_concurrent_runs_shares_nothing(
    chat_endpoint: tuple[str, list[dict[str, Any]]],
) -> None:
    """AReaL's group (``group_size`` > 1) runs one workflow on the same data at once: each run
    has its own episode, instance and record."""
    url, _ = chat_endpoint
    workflow = AEnvWorkflow(TERMINAL)
    data = {**TASK, "id": "same"}
    played = await asyncio.gather(*(workflow.play(data, base_url=url) for _ in range(3)))
    assert [reward for reward, _ in played] == [1.0] * 3
    trajectories = [trajectory for _, trajectory in played]
    assert len({t.episode_id for t in trajectories}) == 3
    assert len({t.instance_id for t in trajectories}) == 3
    assert all(t.task_id == "same" and len(t.steps) == 1 for t in trajectories)
    assert not hasattr(workflow, "last_trajectory")


# -- RLlib -------------------------------------------------------------------------------------


def _action(text: str | dict[str, Any], length: int = 128) -> np.ndarray:
    return ByteCodec().encode(text if isinstance(text, str) else json.dumps(text), length)


def test_numeric_view_passes_check_env_and_solves_a_task() -> None:
    env = NumericToolEnv(
        make_env(TERMINAL, tasks=[TASK], max_steps=5), max_observation_len=512, max_action_len=128
    )
    try:
        check_env(env, skip_render_check=True)
        obs, info = env.reset(seed=0)
        assert obs.dtype == np.float32  # what RLlib's torch models take
        assert obs.shape == (512,)
        assert float(obs.max()) <= 1.0  # normalized: bytes / 255
        assert env.decode_observation(obs) == "sum 1..10" == info["text"]
        command = {"command": "seq 1 10 | paste -sd+ | bc > answer.txt"}
        env.step(_action({"tool": "execute_command", "arguments": command}))
        obs, reward, terminated, _, _ = env.step(_action({"tool": "submit"}))
        assert terminated
        assert reward == 1.0
        garbage = np.full(128, 0xFF, dtype=np.uint8)  # not UTF-8: the agent's error, not ours
        env.reset(seed=1)
        obs, reward, _, _, info = env.step(garbage)
        assert info["error_kind"] == "invalid_action"
        assert reward == 0.0
    finally:
        env.close()


def test_rllib_makes_and_steps_the_registered_env_and_records_episodes() -> None:
    from ray.rllib.env.env_context import EnvContext
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.tune.registry import ENV_CREATOR, _global_registry

    name = register(TERMINAL, max_observation_len=256, max_action_len=128)
    assert name == "aenv-mini-terminal-1.0.0"
    creator = _global_registry.get(ENV_CREATOR, name)
    context = EnvContext({"tasks": [TASK], "max_steps": 2}, worker_index=1)
    # what SingleAgentEnvRunner.make_env does with a registered name (RLlib 2.x)
    gym.register(
        "aenv-test-rllib-v0",
        entry_point=lambda: creator(context),
        vector_entry_point=lambda num_envs: creator(context | {"num_envs": num_envs}),
    )
    try:
        for mode in (gym.VectorizeMode.SYNC, gym.VectorizeMode.VECTOR_ENTRY_POINT):
            vector = gym.wrappers.vector.DictInfoToList(
                gym.make_vec("aenv-test-rllib-v0", num_envs=2, vectorization_mode=mode)
            )
            try:
                obs, infos = vector.reset(seed=3)
                assert obs.shape == (2, 256)
                episode = SingleAgentEpisode(
                    observation_space=vector.single_observation_space,
                    action_space=vector.single_action_space,
                )
                episode.add_env_reset(observation=obs[0], infos=infos[0])
                actions = np.stack(
                    [_action({"tool": "execute_command", "arguments": {"command": "echo hi"}})] * 2
                )
                for _ in range(2):
                    obs, rewards, terminated, truncated, infos = vector.step(actions)
                    episode.add_env_step(
                        observation=obs[0],
                        action=actions[0],
                        reward=float(rewards[0]),
                        infos=infos[0],
                        terminated=bool(terminated[0]),
                        truncated=bool(truncated[0]),
                    )
                assert truncated.all()  # max_steps 2 from RLlib's env_config
                episode.to_numpy()
                observations = episode.get_observations()
                assert observations.shape == (3, 256)  # arrays, not characters
                assert "hi" in ByteCodec().decode(np.rint(observations[1] * 255))
            finally:
                vector.close()
    finally:
        gym.registry.pop("aenv-test-rllib-v0", None)


def test_token_codec_round_trips_text_through_ids() -> None:
    vocab = {chr(c): c - 31 for c in range(32, 127)}
    inverse = {v: k for k, v in vocab.items()}
    codec = TokenCodec(
        tokenize=lambda text: [vocab[c] for c in text],
        detokenize=lambda ids: "".join(inverse[i] for i in ids),
        vocab_size=len(vocab) + 1,
    )
    array = codec.encode('{"tool": "submit"}', 32)
    assert array.shape == (32,)
    assert array.max() <= codec.high
    assert codec.decode(array) == '{"tool": "submit"}'
