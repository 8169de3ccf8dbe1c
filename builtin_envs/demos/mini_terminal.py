"""mini-terminal demo: small shell tasks, and a policy that replays each task's reference
solution through ``execute_command`` (the reward then checks the file it wrote)."""

from __future__ import annotations

from typing import Any

__all__ = ["TASKS", "policy"]


def _sum_task(n: int) -> dict[str, Any]:
    return {
        "id": f"sum-{n}",
        "prompt": f"Write the sum of the integers 1..{n} into answer.txt.",
        "solution": [
            f"seq 1 {n} > numbers.txt",
            "awk '{ total += $1 } END { print total }' numbers.txt > answer.txt",
            "cat answer.txt",
        ],
        "reward_arguments": {"path": "answer.txt", "expected": str(n * (n + 1) // 2)},
    }


TASKS: list[dict[str, Any]] = [
    _sum_task(10),
    _sum_task(100),
    {
        "id": "count-lines",
        "prompt": "Count the lines of /etc/passwd-like data in users.txt; write the count to "
        "answer.txt.",
        "solution": [
            "printf 'root\\nalice\\nbob\\ncarol\\n' > users.txt",
            "wc -l < users.txt > answer.txt",
        ],
        "reward_arguments": {"path": "answer.txt", "expected": "4"},
    },
    {
        "id": "reverse",
        "prompt": "Write the words one, two, three into words.txt, one per line, then write them "
        "in reverse order into answer.txt.",
        "solution": [
            "printf 'one\\ntwo\\nthree\\n' > words.txt",
            "tac words.txt > answer.txt",
        ],
        "reward_arguments": {"path": "answer.txt", "expected": "three\ntwo\none"},
    },
    {
        "id": "tree",
        "prompt": "Create src/app/main.py containing print('hi'), then list every file under "
        "src into answer.txt.",
        "solution": [
            "mkdir -p src/app && echo \"print('hi')\" > src/app/main.py",
            "find src -type f > answer.txt",
        ],
        "reward_arguments": {"path": "answer.txt", "expected": "src/app/main.py"},
    },
]


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Run the task's reference commands in order; stop at the first failing one."""
    output = ""
    for command in task.get("solution") or []:
        result = await env.call_tool("execute_command", {"command": command})
        if result.is_error:
            return None
        output = str((result.structured or {}).get("output", ""))
    return output.strip() or None
