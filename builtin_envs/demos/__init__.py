"""Demo tasks and scripted policies of the built-in environments, one module per environment
directory (``builtin_envs.demos.mini_terminal`` for ``builtin_envs/mini_terminal``).

Each module has ``TASKS`` (task dicts: ``id``, ``prompt``, ``reward`` arguments, and what its
scripted policy needs) and ``async def policy(task, env) -> str | None``, the scripted demo
policy ``aenv rollout`` runs when no policy is given. They exercise the pipeline end to end; they
are not agents.
"""
