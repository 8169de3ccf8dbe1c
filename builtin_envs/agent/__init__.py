"""The agent as an environment (``agent@1.0.0``): a model behind a ``chat`` tool.

An instance's ``chat(message)`` adds the message to its conversation and asks an
OpenAI-compatible ``/chat/completions`` endpoint, offering the tools of its *inner* environment
(``AGENT_ENV``), whose instance it creates through an EnvHub with the SDK; it runs the tool calls
the model makes there, and answers with the model's reply. Modules: :mod:`.settings` (the
``AGENT_*`` variables, secrets and their scrubbing), :mod:`.model` (one chat-completions
request, its failures), :mod:`.inner` (the inner instance and its keep-alive), :mod:`.session`
(the chat loop), :mod:`.tools` (what an agent project serves; importing it registers them).

May import: ``aenv_ray``'s public API (the SDK, the hub client), aiohttp (the model's HTTP
client).
"""

from __future__ import annotations

from builtin_envs.agent.settings import AgentSettings

__all__ = ["AgentSettings"]
