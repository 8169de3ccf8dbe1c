"""agent@1.0.0: an agent as an environment. ``chat(message)`` is answered by an OpenAI-compatible
model that uses the tools of another environment (``AGENT_ENV``), whose instance it creates
through an EnvHub; the conversation is this instance's. Settings: ``AGENT_*`` variables given at
creation (docs/builtins.md#agent100). Your own agent environment is a project with this one
import and its settings in ``deployConfig.env`` (``examples/agent_b``).
"""

from __future__ import annotations

from builtin_envs.agent.tools import agent_health, chat, history, inner_reward, reset

__all__ = ["agent_health", "chat", "history", "inner_reward", "reset"]
