"""What a demo task must not hold: the texts of its reference solution, per built-in demo.

:func:`solution_texts` gives, for a demo task, the texts its scripted policy replays (commands,
file contents, scripts, gold actions' arguments, what must be told the user), read from the
demo module on the driver's side; :func:`assert_holds_no_solution` checks that none of them is
in a task dict (the demo module's own, the one a policy is given, or a rollout record's
``task``) and that it has none of the keys that used to carry them.
"""

from __future__ import annotations

import json
from typing import Any

from builtin_envs.demos import mini_program, mini_terminal, swe, terminal_bench

GOLD_KEYS = ("solution", "communicate", "solo", "gold_patch", "patch")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _strings(item)]
    return []


def solution_texts(env: str, task: dict[str, Any]) -> list[str]:
    """The texts of ``task``'s reference solution in the demo of ``env`` (a module name of
    ``builtin_envs.demos``), none of them empty; only a tau2 task may have none."""
    task_id = str(task["id"])
    texts: list[str]
    if env == "mini_terminal":
        texts = mini_terminal.reference_solution(task_id)
    elif env == "mini_program":
        texts = []
        for step in mini_program.reference_solution(task_id):
            arguments = step["arguments"]
            texts += [arguments[k] for k in ("content", "code") if arguments.get(k)]
    elif env == "terminal_bench":
        script = terminal_bench.reference_solution(task_id) or ""
        texts = [script] + [
            line for line in script.splitlines() if len(line) >= 12 and not line.startswith("#!")
        ]
    elif env == "tau2":
        from builtin_envs.demos import tau2  # reads tau2's data at import (tests/_tau2.py)

        reference = tau2.reference_solution(task)
        texts = list(reference.communicate)
        texts += [json.dumps(a["arguments"]) for a in reference.actions if a["arguments"]]
    elif env == "swe":
        patch = swe.gold_patch(task_id)
        texts = [
            line[1:].strip()
            for line in patch.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()
        ]
    else:
        raise ValueError(f"no demo {env!r}")
    texts = [text for text in texts if text.strip()]
    # a tau2 task's gold may be to do and say nothing (a request the policy must refuse)
    assert texts or env == "tau2", f"{env} task {task_id} has no reference solution to look for"
    return texts


def assert_holds_no_solution(env: str, task: dict[str, Any], where: str = "task") -> None:
    """``task`` (a demo task, the one a policy got, or a record's ``task``) holds no key that
    carried a solution and none of the texts of its reference solution."""
    leaked = [key for key in GOLD_KEYS if key in task]
    assert not leaked, f"{env} {where} {task.get('id')}: holds {leaked}"
    strings = _strings(task)
    flat = json.dumps(task)
    for text in solution_texts(env, task):
        assert not any(text in s for s in strings), f"{env} {where} {task['id']}: {text!r}"
        assert text not in flat, f"{env} {where} {task['id']}: {text!r}"


GIVEN: dict[str, list[dict[str, Any]]] = {}
"""What each watched demo policy (:func:`watched`) was given, per demo: ``{"task": the task
dict, "env_task": the AgentEnv's ``task``}`` per episode, in this process."""


def watched(env: str) -> Any:
    """The demo policy of ``env`` (a module name of ``builtin_envs.demos``), recording in
    :data:`GIVEN` what it was given before it plays: ``aenv rollout ... --no-ray --policy
    tests._demo_solutions:watched_swe`` (the CLI in this process)."""
    import copy
    import importlib

    async def policy(task: dict[str, Any], agent: Any) -> str | None:
        seen = {"task": copy.deepcopy(task), "env_task": copy.deepcopy(agent.task)}
        GIVEN.setdefault(env, []).append(seen)
        module = importlib.import_module(f"builtin_envs.demos.{env}")
        return await module.policy(task, agent)  # type: ignore[no-any-return]

    policy.__qualname__ = f"watched_{env}"
    return policy


watched_mini_terminal = watched("mini_terminal")
watched_mini_program = watched("mini_program")
watched_terminal_bench = watched("terminal_bench")
watched_tau2 = watched("tau2")
watched_swe = watched("swe")


def assert_given_no_grader_fields(
    env: str, tasks: list[dict[str, Any]], records: list[dict[str, Any]]
) -> None:
    """Every episode's policy of ``env`` (watched, :data:`GIVEN`) got its task without the
    reward's arguments and without a reference solution, as did its ``AgentEnv``; each record's
    ``task`` keeps the reward's arguments (re-grading needs them) and holds no solution.
    ``tasks`` are the tasks as given to the run; ``records`` its records."""
    given = GIVEN.pop(env, [])
    assert len(given) == len(records), (env, len(given), len(records))
    by_id = {str(task["id"]): task for task in tasks}
    for seen in given:
        task = seen["task"]
        assert seen["env_task"] == task
        assert "reward_arguments" not in task, (env, task)
        assert task["prompt"] == by_id[task["id"]]["prompt"]  # the control: it is the task
        assert_holds_no_solution(env, task, "policy's task")
    for record in records:
        original = by_id[record["task_id"]]
        assert record["task"]["reward_arguments"] == original["reward_arguments"]
        assert_holds_no_solution(env, record["task"], "record's task")
