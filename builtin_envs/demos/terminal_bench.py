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
    aenv rollout terminal-bench@1.0.0 --datasource ./my-tb    # your dataset's tasks, at /data

With ``--datasource DIR`` (a Terminal-Bench dataset: one directory per task, each with its
``task.yaml``) and no ``--tasks``, the tasks are the dataset's (:func:`dataset_tasks`);
:func:`check_dataset` refuses, before the run, a task the instances will not find.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "DATA_VARIABLES",
    "TASKS",
    "check_dataset",
    "dataset_tasks",
    "policy",
    "reference_solution",
    "task_for",
]

_DEMO_TASKS = Path(__file__).resolve().parent.parent / "terminal_bench" / "demo_tasks"

DATA_VARIABLES = ("TB_DATASET_DIR", "TB_TASK_DIR")
"""The instance variables that name directories in the instance (the dataset, a task): a path
of this machine there is one the instance cannot see (:func:`rollout.precheck.check_data_paths`)."""


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


def dataset_tasks(root: Path) -> list[dict[str, Any]]:
    """The tasks (``aenv rollout`` form) of the Terminal-Bench dataset ``root``, the directory
    given as the instances' datasource (``/data`` in them): one per task directory.

    Raises :class:`~aenv_ray.errors.ConfigurationError` when ``root`` holds no task."""
    from aenv_ray.errors import ConfigurationError
    from builtin_envs.terminal_bench import task_names

    names = task_names(root)
    if not names:
        raise ConfigurationError(
            f"--datasource {root}: no Terminal-Bench task there (a task is a directory holding "
            "a task.yaml); give the dataset's directory, or --tasks FILE"
        )
    return [task_for(root / name, name) for name in names]


def check_dataset(
    tasks: list[dict[str, Any]], datasource: Path | None, variables: dict[str, str]
) -> None:
    """Every task's ``tb_reset(task=NAME)`` finds its task in the instance: in the dataset
    (``TB_DATASET_DIR``, default ``/data``: the datasource, ``datasource`` on this machine) or
    among the bundled demo tasks. Raises :class:`~aenv_ray.errors.ConfigurationError` naming
    both paths otherwise."""
    from aenv_ray.errors import ConfigurationError
    from builtin_envs.terminal_bench import task_names

    demo = set(task_names(_DEMO_TASKS))
    inside = (variables.get("TB_DATASET_DIR") or "/data").rstrip("/") or "/"
    if datasource is not None and inside.startswith("/data"):
        datasource = datasource / inside.removeprefix("/data").lstrip("/")
    found = set(task_names(datasource)) if datasource is not None else set()
    for task in tasks:
        for step in task.get("setup") or []:
            if not isinstance(step, dict) or step.get("function") != "tb_reset":
                continue
            name = (step.get("arguments") or {}).get("task")
            if not isinstance(name, str) or name in found or name in demo:
                continue
            if datasource is None:
                raise ConfigurationError(
                    f"task `{task.get('id')}` resets to task `{name}`, which is not a bundled "
                    "demo task, and no --datasource was given: the instances look for it in "
                    f"{inside}/{name}; pass --datasource DIR (the dataset holding "
                    f"{name}/task.yaml)"
                )
            raise ConfigurationError(
                f"task `{task.get('id')}` resets to task `{name}`, which the instances will not "
                f"find: no {datasource / name}/task.yaml on this machine ({inside}/{name} in "
                "the instance) and no bundled demo task of that name"
            )


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
