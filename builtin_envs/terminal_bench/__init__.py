"""terminal-bench (Terminal-Bench 1 tasks) as a library: task directories, the pytest parser,
grading. Usable without any sandbox::

    from builtin_envs.terminal_bench import grade, load_task, parse_pytest
    task = load_task(Path("tasks/hello-world"))      # task.yaml, whether it has tests
    parse_pytest(output).statuses                     # {"test_x": "PASSED", ...}
    grade(task.name, run)["reward"]                   # 1.0, 0.0, or None when invalid
    judge_verdict(run.reports, statuses)              # pytest's own report against the summary

The environment project beside it (``config.json``, ``src/``) runs the tasks in instances;
``offline/`` holds the stand-ins for ``apt-get``, ``curl`` and ``uv`` that let a task's
``run-tests.sh`` run without a network, and ``demo_tasks/`` the demo's tasks. See
docs/builtins.md.

May import: yaml, pytest (the offline ``uv run pytest``) and _pytest (its warm start imports
pytest's plugin list, ``_pytest.config``, once), ``aenv_ray``'s public API (errors).
"""

from __future__ import annotations

from builtin_envs.terminal_bench.errors import (
    BoxUnavailableError,
    JudgeUnavailableError,
    NoTaskError,
    TaskError,
    TaskNotFoundError,
)
from builtin_envs.terminal_bench.grading import TestRun, grade, judge_verdict
from builtin_envs.terminal_bench.pytest_parser import PytestReport, parse_pytest
from builtin_envs.terminal_bench.task import Task, has_tests, load_task, task_names

__all__ = [
    "BoxUnavailableError",
    "JudgeUnavailableError",
    "NoTaskError",
    "PytestReport",
    "Task",
    "TaskError",
    "TaskNotFoundError",
    "TestRun",
    "grade",
    "has_tests",
    "judge_verdict",
    "load_task",
    "parse_pytest",
    "task_names",
]
