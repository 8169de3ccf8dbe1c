"""What an agent environment serves: the ``chat`` tool, the ``reset`` and ``history``
functions, the inner environment's reward and a health check.

Importing this module registers them, so a project is an agent environment by importing it
from one of its modules (``from builtin_envs.agent.tools import chat, history, reset``): the
built-in ``agent@1.0.0`` does, and so does a project of your own (``examples/agent_b``). The
settings come from the instance's environment variables at each call
(:class:`~builtin_envs.agent.settings.AgentSettings`); the conversation is this process's,
so each instance has its own.
"""

from __future__ import annotations

import os
from typing import Any

from aenv_ray import (
    ToolResult,
    register_function,
    register_health,
    register_reward,
    register_tool,
)
from builtin_envs.agent.session import AgentSession
from builtin_envs.agent.settings import AgentSettings

__all__ = ["SESSION", "agent_health", "chat", "history", "inner_reward", "reset"]

SESSION = AgentSession()
"""This instance's conversation (an instance is its own process)."""

os.register_at_fork(after_in_child=SESSION.after_fork)


def _settings() -> AgentSettings:
    return AgentSettings.read(os.environ)


@register_tool(timeout=3600)
async def chat(message: str) -> ToolResult:
    """Send a message to this agent and get its answer. The agent is a model that can use the
    tools of its own environment to do what you ask; the conversation goes on across calls.

    Args:
        message: what to say to the agent.
    """
    return await SESSION.chat(_settings(), message)


@register_function
async def reset(new_environment: bool = False) -> dict[str, Any]:
    """Clear the conversation (and its token counts).

    Args:
        new_environment: also release the inner environment's instance; the next chat starts a
            fresh one.
    """
    return await SESSION.reset(new_environment)


@register_function
async def history() -> dict[str, Any]:
    """The conversation so far (OpenAI chat messages), its model turns and token usage."""
    return SESSION.history(_settings())


@register_reward
async def inner_reward(arguments: dict[str, Any] | None = None) -> Any:
    """The inner environment's reward, called with ``arguments`` on its instance's state.

    Args:
        arguments: the arguments of the inner environment's reward.
    """
    return await SESSION.reward(_settings(), dict(arguments or {}))


@register_health
async def agent_health() -> dict[str, Any]:
    """Healthy while it serves; the model, environment and hub it is configured with (never a
    key), and the conversation's size."""
    return SESSION.health(_settings())
