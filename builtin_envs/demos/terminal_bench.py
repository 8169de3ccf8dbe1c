"""terminal-bench demo: the bundled demo tasks, and a policy that runs each task's reference
solution (``solution.sh``) through the agent's tools, as an agent would type it.

A task's ``setup`` calls ``tb_reset`` (so one warm instance serves any task), its
``reward_arguments`` are empty (``tb_reward`` runs the task's tests), ``solution`` holds the
text of its ``solution.sh``. The policy writes the script into the agent's ``/tmp``, runs it
with ``run_command`` and shows the terminal's screen; every demo task then reaches reward 1.0.

    aenv rollout terminal-bench@1.0.0                         # these tasks, this policy
    aenv rollout terminal-bench@1.0.0 --tasks my_tasks.jsonl  # the same task format
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TASKS", "policy", "task_for"]

_DEMO_TASKS = Path(__file__).resolve().parent.parent / "terminal_bench" / "demo_tasks"


def task_for(path: Path, name: str | None = None) -> dict[str, Any]:
    """The demo task (``aenv rollout`` form) of the Terminal-Bench task directory ``path``:
    ``tb_reset(task=name)`` finds it in the instance (a bundled task, or one of the dataset)."""
    from builtin_envs.terminal_bench import load_task

    task = load_task(path, name)
    solution = task.solution.read_text() if task.solution.is_file() else None
    return {
        "id": task.name,
        "prompt": task.instruction,
        "setup": [{"function": "tb_reset", "arguments": {"task": task.name}}],
        "reward_arguments": {},
        "solution": solution,
    }


def _tasks() -> list[dict[str, Any]]:
    from builtin_envs.terminal_bench import task_names

    return [task_for(_DEMO_TASKS / name) for name in task_names(_DEMO_TASKS)]


TASKS: list[dict[str, Any]] = _tasks()


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Run the task's reference solution in the agent's terminal; the screen is the answer."""
    solution = task.get("solution")
    if not solution:
        return None
    await env.call_tool("write_file", {"path": "/tmp/solution.sh", "content": solution})
    result = await env.call_tool("run_command", {"command": "bash /tmp/solution.sh"})
    if result.is_error:
        return None
    screen = await env.call_tool("send_keys", {"keys": ["ls -la /app", "Enter"]})
    return screen.text.strip() or None
