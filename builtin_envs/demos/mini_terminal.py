"""mini-terminal demo: small shell tasks, and a policy that replays each task's reference
solution through ``execute_command`` (the reward then checks the file it wrote).

A task holds no solution (nothing a policy is given, nor the rollout record's ``task``, does):
the scripted policy reads the reference commands of a demo task by its id, on the driver's
side (:func:`reference_solution`).
"""

from __future__ import annotations

from typing import Any

from aenv_ray.errors import ConfigurationError

__all__ = ["TASKS", "policy", "reference_solution"]


def _sum_task(n: int) -> tuple[dict[str, Any], list[str]]:
    task = {
        "id": f"sum-{n}",
        "prompt": f"Write the sum of the integers 1..{n} into answer.txt.",
        "reward_arguments": {"path": "answer.txt", "expected": str(n * (n + 1) // 2)},
    }
    return task, [
        f"seq 1 {n} > numbers.txt",
        "awk '{ total += $1 } END { print total }' numbers.txt > answer.txt",
        "cat answer.txt",
    ]


_DEMO: list[tuple[dict[str, Any], list[str]]] = [
    _sum_task(10),
    _sum_task(100),
    (
        {
            "id": "count-lines",
            "prompt": "Count the lines of /etc/passwd-like data in users.txt; write the count to "
            "answer.txt.",
            "reward_arguments": {"path": "answer.txt", "expected": "4"},
        },
        ["printf 'root\\nalice\\nbob\\ncarol\\n' > users.txt", "wc -l < users.txt > answer.txt"],
    ),
    (
        {
            "id": "reverse",
            "prompt": "Write the words one, two, three into words.txt, one per line, then write "
            "them in reverse order into answer.txt.",
            "reward_arguments": {"path": "answer.txt", "expected": "three\ntwo\none"},
        },
        ["printf 'one\\ntwo\\nthree\\n' > words.txt", "tac words.txt > answer.txt"],
    ),
    (
        {
            "id": "tree",
            "prompt": "Create src/app/main.py containing print('hi'), then list every file under "
            "src into answer.txt.",
            "reward_arguments": {"path": "answer.txt", "expected": "src/app/main.py"},
        },
        [
            "mkdir -p src/app && echo \"print('hi')\" > src/app/main.py",
            "find src -type f > answer.txt",
        ],
    ),
]

TASKS: list[dict[str, Any]] = [task for task, _ in _DEMO]
_SOLUTIONS: dict[str, list[str]] = {task["id"]: commands for task, commands in _DEMO}


def reference_solution(task_id: str) -> list[str]:
    """The reference commands of demo task ``task_id`` (never part of the task).

        >>> reference_solution("sum-10")[0]
        'seq 1 10 > numbers.txt'

    Raises :class:`~aenv_ray.errors.ConfigurationError` for a task that is not a demo task:
    the scripted policy has nothing to replay there (a run with it stops, saying so).
    """
    try:
        return list(_SOLUTIONS[task_id])
    except KeyError:
        raise ConfigurationError(
            f"the mini-terminal demo policy replays the demo tasks' reference solutions "
            f"({', '.join(_SOLUTIONS)}); task {task_id!r} is not one of them: give a policy "
            "(--policy MODULE:CALLABLE, or --base-url and --model)"
        ) from None


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Run the task's reference commands in order; stop at the first failing one."""
    output = ""
    for command in reference_solution(str(task["id"])):
        result = await env.call_tool("execute_command", {"command": command})
        if result.is_error:
            return None
        output = str((result.structured or {}).get("output", ""))
    return output.strip() or None
