"""agent demo: the mini-terminal's shell tasks, asked of an agent environment in one message each.

The policy is agent A: it sends the task's prompt to the agent's ``chat`` and returns its
answer; the agent (a model over its inner ``mini-terminal@1.0.0``) does the work, and the reward
is the inner mini-terminal's, on the file the agent's commands wrote. The agent needs a model and
an EnvHub, given to its instances with ``-e`` (:func:`check` says which are missing)::

    aenv rollout agent@1.0.0 -e AGENT_BASE_URL=http://127.0.0.1:8000/v1 -e AGENT_MODEL=Qwen3-8B \\
        -e AGENT_ENV=mini-terminal@1.0.0 -e AENV_SYSTEM_URL=http://127.0.0.1:8000 -e AENV_API_KEY

Each prompt ends with the command that does it (``run: ...``), a hint a model may follow and the
deterministic stand-in model of the tests does follow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aenv_ray.errors import ConfigurationError

__all__ = ["REQUIRED", "TASKS", "check", "policy"]

REQUIRED = {
    "AGENT_BASE_URL": "http://HOST:PORT/v1",
    "AGENT_MODEL": "NAME",
    "AGENT_ENV": "mini-terminal@1.0.0",
    "AENV_SYSTEM_URL": "http://HUB:8000",
}
"""What the demo's agent instances must be given, with an example of each."""


def _task(task_id: str, prompt: str, command: str, expected: str) -> dict[str, Any]:
    return {
        "id": task_id,
        "prompt": f"{prompt} Use the terminal. run: {command}",
        "reward_arguments": {"arguments": {"path": "answer.txt", "expected": expected}},
    }


TASKS: list[dict[str, Any]] = [
    _task(
        "sum-10",
        "Write the sum of the integers 1..10 into answer.txt.",
        "seq 1 10 | awk '{ s += $1 } END { print s }' > answer.txt",
        "55",
    ),
    _task(
        "reverse",
        "Write one, two, three into answer.txt in reverse order, one per line.",
        "printf 'one\\ntwo\\nthree\\n' | tac > answer.txt",
        "three\ntwo\none",
    ),
    _task(
        "count",
        "Write how many letters the word environment has into answer.txt.",
        "printf environment | wc -c > answer.txt",
        "11",
    ),
]


def check(environment_variables: Mapping[str, str]) -> None:
    """Raise :class:`~aenv_ray.errors.ConfigurationError` naming the settings the demo's agent
    instances lack (``aenv rollout`` calls it before anything starts)."""
    missing = [name for name in REQUIRED if not environment_variables.get(name)]
    if not missing:
        return
    flags = " ".join(f"-e {name}={example}" for name, example in REQUIRED.items())
    raise ConfigurationError(
        f"the agent@1.0.0 demo needs a model and an EnvHub for its agent instances; missing "
        f"{', '.join(missing)}. Pass them with -e: {flags} -e AENV_API_KEY (a bare -e NAME "
        "copies NAME from your environment; add -e OPENAI_API_KEY if the endpoint wants a key). "
        "See docs/builtins.md#agent100"
    )


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Agent A: one message to the agent; its answer, or its failure raised."""
    result = await env.call_tool("chat", {"message": task["prompt"]})
    if result.is_error:
        raise RuntimeError(result.text)
    return str(result.text)
