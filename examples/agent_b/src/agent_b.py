"""agent-b@1.0.0: the built-in agent (``agent@1.0.0``) as a project of your own.

Importing ``builtin_envs.agent.tools`` registers what an agent environment serves: the ``chat``
tool, the ``reset`` and ``history`` functions, the inner environment's reward and the health
check. What makes it agent B is ``config.json``: its name, its settings in ``deployConfig.env``
(its inner environment, its system prompt, its turn limit) and ``"network": true`` (it talks to
a model and to an EnvHub). The model, the hub and the keys are given when an instance is created
(docs/builtins.md#agent100).
"""

from __future__ import annotations

from builtin_envs.agent.tools import agent_health, chat, history, inner_reward, reset

__all__ = ["agent_health", "chat", "history", "inner_reward", "reset"]
