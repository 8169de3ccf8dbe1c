"""terminal-bench demo: the bundled demo tasks, and a policy that runs each task's reference
solution (``solution.sh``) through the agent's tools, as an agent would type it.

A task's ``setup`` calls ``tb_reset`` (so one warm instance serves any task) and its
``reward_arguments`` are empty (``tb_reward`` runs the task's tests). A task holds no solution
(nothing a policy is given, nor the rollout record's ``task``, does). The policy reads a demo
task's ``solution.sh`` on the driver's side (:func:`reference_solution`), writes it into the
agent's ``/tmp``, runs it with ``run_command`` and shows the terminal's screen; every demo task
then reaches reward 1.0. For a task that is not a demo task (one of the instance's dataset,
``tb_reset(task=NAME)``), the driver has no solution and the policy asks the instance to run the
task's own (``tb_run_solution``: the script never leaves the instance).

    aenv rollout terminal-bench@1.0.0                         # these tasks, this policy
    aenv rollout terminal-bench@1.0.0 --tasks my_tasks.jsonl  # the same task format
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TASKS", "policy", "reference_solution", "task_for"]

_DEMO_TASKS = Path(__file__).resolve().parent.parent / "terminal_bench" / "demo_tasks"


def task_for(path: Path, name: str | None = None) -> dict[str, Any]:
    """The demo task (``aenv rollout`` form) of the Terminal-Bench task directory ``path``:
    ``tb_reset(task=name)`` finds it in the instance (a bundled task, or one of the dataset)."""
    from builtin_envs.terminal_bench import load_task

    task = load_task(path, name)
    return {
        "id": task.name,
        "prompt": task.instruction,
        "setup": [{"function": "tb_reset", "arguments": {"task": task.name}}],
        "reward_arguments": {},
    }


def reference_solution(task_id: str) -> str | None:
    """The text of demo task ``task_id``'s ``solution.sh`` (never part of the task), or
    ``None`` for a task that is not a bundled demo task.

        >>> reference_solution("hello-world").startswith("#!/bin/bash")
        True
        >>> reference_solution("no-such-task") is None
        True
    """
    from builtin_envs.terminal_bench import task_names

    if task_id not in task_names(_DEMO_TASKS):
        return None
    solution = _DEMO_TASKS / task_id / "solution.sh"
    return solution.read_text() if solution.is_file() else None


def _tasks() -> list[dict[str, Any]]:
    from builtin_envs.terminal_bench import task_names

    return [task_for(_DEMO_TASKS / name) for name in task_names(_DEMO_TASKS)]


TASKS: list[dict[str, Any]] = _tasks()


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Run the task's reference solution in the agent's terminal; the screen is the answer."""
    solution = reference_solution(str(task["id"]))
    if solution is None:  # a dataset task: the instance runs its own solution.sh
        ran = await env.call_function("tb_run_solution", {})
        return str(ran.get("output", "")).strip() or None
    await env.call_tool("write_file", {"path": "/tmp/solution.sh", "content": solution})
    result = await env.call_tool("run_command", {"command": "bash /tmp/solution.sh"})
    if result.is_error:
        return None
    screen = await env.call_tool("send_keys", {"keys": ["ls -la /app", "Enter"]})
    return screen.text.strip() or None
