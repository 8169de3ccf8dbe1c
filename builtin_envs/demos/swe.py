"""swe demo: the two demo rows shipped with the environment, and a reference policy that
applies each row's gold patch through the tools (the reward then runs the hidden tests: 1.0).

A task's ``setup`` calls ``swe_reset`` with its instance id (so one warm instance serves any
task) and its ``reward_arguments`` are empty (``swe_reward`` grades the episode). A task holds
no gold patch (nothing a policy is given, nor the rollout record's ``task``, does): the
reference policy, a grader's check that the gold patch resolves, reads it from the dataset on
the driver's side (:func:`gold_patch`)::

    aenv rollout swe@1.0.0                          # these tasks, this policy
    aenv rollout swe@1.0.0 --tasks my_tasks.jsonl   # the same task format
"""

from __future__ import annotations

from typing import Any

__all__ = ["DATA_VARIABLES", "TASKS", "gold_patch", "policy", "task_for"]

DATA_VARIABLES = ("SWE_DATASET", "SWE_REPOS")
"""The instance variables that name the dataset's rows file and repository directories in the
instance: with ``aenv rollout --datasource DIR`` paths under ``/data``; a path of this machine
is one the instance cannot see, refused before the run."""


def task_for(row: Any) -> dict[str, Any]:
    """The demo task (``aenv rollout`` form) of a :class:`builtin_envs.swe.rows.Row`."""
    from builtin_envs.swe.episode import task_prompt

    return {
        "id": row.instance_id,
        "prompt": task_prompt(row),
        "setup": [{"function": "swe_reset", "arguments": {"instance_id": row.instance_id}}],
        "reward_arguments": {},
    }


def gold_patch(instance_id: str) -> str:
    """The gold patch of a demo row, read from the demo dataset (never from the task)."""
    from builtin_envs.swe.episode import DEMO_DATASET
    from builtin_envs.swe.rows import load_rows

    for row in load_rows(DEMO_DATASET):
        if row.instance_id == instance_id:
            return row.patch
    raise KeyError(f"no demo row {instance_id!r} in {DEMO_DATASET}")


def _tasks() -> list[dict[str, Any]]:
    from builtin_envs.swe.episode import DEMO_DATASET
    from builtin_envs.swe.rows import load_rows

    return [task_for(row) for row in load_rows(DEMO_DATASET)]


TASKS: list[dict[str, Any]] = _tasks()


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Look at the files the gold patch changes, apply it with git, show the change."""
    from builtin_envs.swe.rows import modified_files

    patch = gold_patch(str(task["id"]))
    for path in modified_files(patch):
        await env.call_tool("view", {"path": path})
    delimiter = "EOF_SWE_GOLD_PATCH"
    applied = await env.call_tool(
        "run_command", {"command": f"git apply - <<'{delimiter}'\n{patch}\n{delimiter}"}
    )
    if applied.is_error or (applied.structured or {}).get("returncode") != 0:
        return None
    shown = await env.call_tool("run_command", {"command": "git diff --stat"})
    return str((shown.structured or {}).get("output", "")).strip() or None
