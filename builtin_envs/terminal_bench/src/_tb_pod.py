"""terminal-bench in a Kubernetes pod: the tasks and the tests are the judge container's.

The runtime container holds neither the task directories nor their tests; it asks the pod's
judge container (:mod:`builtin_envs.terminal_bench.judge`) over the socket the pod spec names
(``AENV_JUDGE_SOCKET``). The connection is opened by :func:`judge` before the agent's box
first starts (every tool and function of the environment calls it first), and never again:
the judge serves only the first connection it accepts, so a process of the agent's that
reaches the socket later is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from builtin_envs.terminal_bench import NoTaskError, Task, TestRun
from builtin_envs.terminal_bench.judge_wire import JudgeClient, PodJudge

_JUDGE = PodJudge()
_NOWHERE = Path("/nonexistent/terminal-bench-judge")  # the task's directory: not in this container


def judge() -> JudgeClient:
    """The connection to the pod's judge, opened on the first call (before any agent command
    runs); :class:`JudgeUnavailableError` once it is lost (it is never opened twice)."""
    return _JUDGE.get()


def find_task(name: str | None) -> Task:
    """The task ``name`` as the judge describes it (its directory is not here); without a
    name, ``TB_TASK_DIR``'s (a directory of the judge container's image)."""
    if name is None and not os.environ.get("TB_TASK_DIR"):
        raise NoTaskError(
            "no task: call tb_reset(task=NAME) (tb_tasks() lists them), or create the instance "
            "with TB_TASK_DIR; in a pod the tasks are the judge container's"
        )
    info = judge().request("task", timeout=60, name=name or "")
    metadata: dict[str, Any] = {k: info[k] for k in ("difficulty", "category", "tags") if k in info}
    return Task(
        name=str(info["task"]),
        path=_NOWHERE,
        instruction=str(info["instruction"]),
        max_agent_timeout_sec=float(info["max_agent_timeout_sec"]),
        max_test_timeout_sec=float(info["max_test_timeout_sec"]),
        parser_name=str(info["parser_name"]),
        invalid=info.get("invalid"),
        metadata=metadata,
    )


def all_task_names() -> dict[str, list[str]]:
    """The tasks the judge has: its dataset's and the bundled demo tasks."""
    answer = judge().request("tasks", timeout=60)
    return {"dataset": list(answer["dataset"]), "demo": list(answer["demo"])}


def solution(task: Task) -> str:
    """The text of the task's ``solution.sh`` (the oracle's), from the judge."""
    return str(judge().request("solution", timeout=60, name=task.name)["script"])


def run_tests(task: Task, timeout: float) -> tuple[TestRun | None, dict[str, Any]]:
    """Ask the judge to grade the workspace as it stands (the agent's processes already
    ended): the test run (None when nothing ran: the workspace was past the judge's copy
    limits) and what the judge's copy removed, left out or found past its limits."""
    answer = judge().request("grade", timeout=timeout + 120, name=task.name, seconds=timeout)
    copy = dict(answer["copy"])
    run = None
    if answer.get("ran"):
        run = TestRun(
            output=str(answer["output"]),
            exit_code=answer["exit_code"],
            seconds=float(answer["seconds"]),
            timed_out=bool(answer["timed_out"]),
            reports=tuple(answer["reports"]),
        )
    copy["tests_dir"] = str(answer["tests_dir"])  # where the judge's pytest collects from
    copy["judge_ended"] = list(answer.get("killed_before") or []) + list(
        answer.get("killed_after") or []
    )
    return run, copy
