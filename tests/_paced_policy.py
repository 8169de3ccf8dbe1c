"""A policy for fault tests: the mini-terminal demo, after ``task["pause"]`` seconds of
``sleep`` inside the instance, so that a test can kill things while episodes are under way.

Run as ``aenv rollout mini-terminal@1.0.0 --policy tests._paced_policy:policy`` from the
repository's root, with :func:`write_tasks`'s file as ``--tasks``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builtin_envs.demos import mini_terminal


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Sleep ``task["pause"]`` seconds in the instance, then replay the task's solution."""
    pause = float(task.get("pause", 0))
    if pause:
        await env.call_tool("execute_command", {"command": f"sleep {pause}"})
    return await mini_terminal.policy(task, env)


def write_tasks(path: Path, pause: float) -> Path:
    """The demo tasks with ``pause``, as JSON lines at ``path``."""
    tasks = [{**task, "pause": pause} for task in mini_terminal.TASKS]
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path
