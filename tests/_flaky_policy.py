"""A policy for resume tests: the mini-terminal demo, except that while the file named by the
task's ``"stall_unless"`` is missing it sleeps past any short ``--episode-timeout`` (the episode
times out, an outcome ``--retry-failed`` runs again).

Run as ``aenv rollout mini-terminal@1.0.0 --policy tests._flaky_policy:policy`` from the
repository's root.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from builtin_envs.demos import mini_terminal


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Time out until ``task["stall_unless"]`` exists, then replay the task's solution."""
    marker = task.get("stall_unless")
    if marker and not await asyncio.to_thread(os.path.exists, marker):
        await asyncio.sleep(60)
    return await mini_terminal.policy(task, env)
