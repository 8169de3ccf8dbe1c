"""AReaL: an environment as an AReaL agent workflow (``async def run(data, **extra) -> float``).

AReaL (>= 1.0) takes any object with ``async def run(self, data, **extra_kwargs)`` as an agent
workflow and calls it with ``base_url``, ``api_key`` and ``http_client`` of its
OpenAI-compatible proxy, which records the model's tokens and log-probabilities. Its older
entry point is ``run_agent_return_reward(data) -> float``. :class:`AEnvWorkflow` provides both:
each call runs one episode on a fresh instance, with the model behind AReaL's proxy as the
policy (or any :data:`~rollout.synthesis.Policy` you give), and returns the environment's
reward as a Python ``float`` (AReaL rejects ints).

    workflow = AEnvWorkflow("mini-terminal@1.0.0", model="default", max_turns=10)
    reward = await workflow.run(
        {"prompt": "Write 42 into out.txt",
         "reward_arguments": {"path": "out.txt", "expected": "42"}},
        base_url=proxy_url, api_key=session_key, http_client=client)

``data`` is a task (see :mod:`rollout.synthesis`: ``prompt``, ``reward_arguments``, ``setup``),
or carries ``messages`` (chat messages, a common AReaL dataset shape) instead of ``prompt``:
they open the conversation as given. Where the environment simulates the user (``dialogue=``;
by default the built-in's own, such as tau2's ``builtin_envs.demos.tau2.DIALOGUE``), the model
talks with that user until the episode ends.

AReaL's two modes both work. *inline*: ``run(data, base_url=, api_key=, http_client=)`` in
AReaL's event loop. *subproc*: AReaL pickles the workflow, calls ``run(data)`` in a process of
its pool and passes its proxy as ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, which :meth:`run`
reads when it is given no ``base_url`` (so give the constructor none: its own would bypass the
proxy's session). Each call keeps its state to itself (its policy, its task, its trajectory),
so the concurrent runs of a group (``group_size`` > 1) share nothing mutable; :meth:`play`
returns the episode's :class:`~rollout.trajectories.Trajectory` with the reward.
An episode whose instance failed is retried on a fresh one; if it still fails,
:class:`EpisodeFailedError` is raised rather than a made-up reward (an infrastructure failure is
not the agent's score). An agent error or a timeout scores ``0.0``.

May import: ``aenv_ray``, ``rollout``. Must not import: kubernetes.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from aenv_ray.errors import AEnvError, ConfigurationError
from rollout.failures import EpisodeOutcome
from rollout.sources import InstanceSource, SDKSource
from rollout.synthesis import (
    AgentEnv,
    Dialogue,
    OpenAIPolicy,
    Policy,
    Trajectory,
    demo_dialogue,
    play_episode,
)

__all__ = ["AEnvWorkflow", "EpisodeFailedError"]


class EpisodeFailedError(AEnvError):
    """The episode could not be played (its instances kept failing): there is no reward."""


class AEnvWorkflow:
    """One episode per :meth:`run`; see the module docstring."""

    def __init__(
        self,
        env_name: str,
        *,
        model: str = "default",
        policy: Policy | None = None,
        max_turns: int = 20,
        temperature: float | None = None,
        system_prompt: str | None = None,
        source: InstanceSource | None = None,
        max_retries: int = 2,
        episode_timeout: float | None = 600.0,
        base_url: str | None = None,
        api_key: str | None = None,
        dialogue: Dialogue | None = None,
    ) -> None:
        self.env_name = env_name
        self.model = model
        self.policy = policy
        self.max_turns = max_turns
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.source = source or SDKSource(env_name)
        self.max_retries = max_retries
        self.episode_timeout = episode_timeout
        self.base_url = base_url  # for run_agent_return_reward, which gets no proxy address
        self.api_key = api_key
        self.dialogue = dialogue if dialogue is not None else demo_dialogue(env_name)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        """Play one episode of task ``data``; return its reward as a ``float``."""
        reward, _ = await self.play(data, **extra_kwargs)
        return reward

    async def play(self, data: dict[str, Any], **extra_kwargs: Any) -> tuple[float, Trajectory]:
        """:meth:`run`, returning the episode's trajectory too (its record: the messages as the
        model saw them, each turn's tokens and log-probabilities, the tool calls)::

            reward, trajectory = await workflow.play(data, base_url=url, api_key=key)
        """
        policy = self.policy or self._model_policy(data, extra_kwargs)
        run_id = uuid.uuid4().hex[:12]  # the runs of a group share their data, never an id
        task = {**data, "id": str(data.get("id", data.get("query_id", run_id)))}
        trajectory = await play_episode(
            self.source,
            self.env_name,
            f"areal-{task['id']}-{run_id}",
            task,
            policy,
            max_retries=self.max_retries,
            episode_timeout=self.episode_timeout,
        )
        if trajectory.outcome == EpisodeOutcome.INFRASTRUCTURE_ERROR.value:
            raise EpisodeFailedError(
                f"episode {trajectory.episode_id} of {self.env_name} failed after "
                f"{trajectory.attempts} attempts: {trajectory.reason}"
            )
        return float(trajectory.reward or 0.0), trajectory

    async def run_agent_return_reward(self, data: dict[str, Any]) -> float:
        """AReaL's older entry point: :meth:`run` with the ``base_url``/``api_key`` given here."""
        return await self.run(data, base_url=self.base_url, api_key=self.api_key)

    def _model_policy(self, data: dict[str, Any], extra: dict[str, Any]) -> Policy:
        """The model behind AReaL's proxy: ``base_url=`` (inline mode), else the constructor's,
        else ``OPENAI_BASE_URL`` (subproc mode); the API key likewise."""
        base_url = extra.get("base_url") or self.base_url or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise ConfigurationError(
                "no model to play the episode: AReaL passes base_url= to run() (inline mode) "
                "or OPENAI_BASE_URL (subproc mode); give AEnvWorkflow(base_url=...) or "
                "policy= to call it yourself"
            )
        api_key = extra.get("api_key") or self.api_key
        if not api_key and not extra.get("base_url") and not self.base_url:
            api_key = os.environ.get("OPENAI_API_KEY")  # the session key of that same proxy
        dialogue = self.dialogue
        messages = data.get("messages")
        if messages is not None:
            dialogue = _Opening(_chat_messages(messages), self.dialogue)
        elif not data.get("prompt") and dialogue is None:
            raise ConfigurationError(
                f"the task has neither `prompt` nor `messages` (its keys: {sorted(data)}): "
                "the model would be told nothing; give one of them"
            )
        return OpenAIPolicy(
            str(base_url),
            self.model,
            api_key=api_key,
            max_turns=self.max_turns,
            temperature=self.temperature,
            system_prompt=self.system_prompt,
            http_client=extra.get("http_client"),
            dialogue=dialogue,
        )


def _chat_messages(messages: Any) -> list[dict[str, Any]]:
    """A task's ``messages``, checked: a non-empty list of chat messages (``role``, ``content``)."""
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise ConfigurationError(
            "the task's `messages` must be a non-empty list of chat messages "
            f"({{'role': ..., 'content': ...}}), got {str(messages)[:200]}"
        )
    return [dict(m) for m in messages]


class _Opening:
    """A :class:`~rollout.synthesis.Dialogue` opening with a task's own ``messages``; the
    model's answers go to the environment's dialogue, if it has one, else end the episode."""

    def __init__(self, messages: list[dict[str, Any]], then: Dialogue | None) -> None:
        self.messages = messages
        self.then = then

    async def opening(self, task: dict[str, Any], env: AgentEnv) -> list[dict[str, Any]]:
        return [dict(m) for m in self.messages]

    async def reply(self, answer: str, task: dict[str, Any], env: AgentEnv) -> str | None:
        return None if self.then is None else await self.then.reply(answer, task, env)
