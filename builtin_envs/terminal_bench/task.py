"""A Terminal-Bench (TB-1) task directory: ``task.yaml``, ``solution.sh``, ``run-tests.sh``,
``tests/``.

:func:`load_task` reads one; :func:`task_names` lists the tasks of a dataset (a directory of
task directories). A task *has tests* when some Python file under ``tests/`` defines a test
(a ``test*`` function, or a ``Test*`` class with one): an empty ``test_outputs.py`` is a task
without tests, which is graded as invalid rather than passed or failed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from builtin_envs.terminal_bench.errors import TaskError

__all__ = [
    "DEFAULT_AGENT_TIMEOUT_SEC",
    "DEFAULT_TEST_TIMEOUT_SEC",
    "Task",
    "has_tests",
    "is_task",
    "load_task",
    "task_names",
]

DEFAULT_AGENT_TIMEOUT_SEC = 360.0
"""Terminal-Bench's ``max_agent_timeout_sec`` when ``task.yaml`` gives none."""
DEFAULT_TEST_TIMEOUT_SEC = 60.0
"""Terminal-Bench's ``max_test_timeout_sec`` when ``task.yaml`` gives none."""
PARSERS = ("pytest",)


@dataclass(frozen=True)
class Task:
    """One task, as its ``task.yaml`` describes it."""

    name: str
    path: Path
    instruction: str
    max_agent_timeout_sec: float = DEFAULT_AGENT_TIMEOUT_SEC
    max_test_timeout_sec: float = DEFAULT_TEST_TIMEOUT_SEC
    parser_name: str = "pytest"
    invalid: str | None = None  # why the task cannot be graded (no tests), else None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def has_tests(self) -> bool:
        """Whether the task can be graded (it has a test and ``run-tests.sh``)."""
        return self.invalid is None

    @property
    def solution(self) -> Path:
        """The reference solution, ``solution.sh`` (it may be missing)."""
        return self.path / "solution.sh"

    def public(self) -> dict[str, Any]:
        """What the agent may know of the task: never its tests nor its solution."""
        return {
            "task": self.name,
            "instruction": self.instruction,
            "max_agent_timeout_sec": self.max_agent_timeout_sec,
            "max_test_timeout_sec": self.max_test_timeout_sec,
            "parser_name": self.parser_name,
            "has_tests": self.has_tests,
            **{
                k: self.metadata[k]
                for k in ("difficulty", "category", "tags")
                if k in self.metadata
            },
        }


def is_task(path: Path) -> bool:
    """Whether ``path`` is a task directory (it holds a ``task.yaml``)."""
    return (path / "task.yaml").is_file()


def task_names(root: Path) -> list[str]:
    """The tasks of the dataset ``root``: its subdirectories holding a ``task.yaml``, sorted
    naturally (``2`` before ``10``)."""
    if not root.is_dir():
        return []
    names = [p.name for p in root.iterdir() if not p.name.startswith(".") and is_task(p)]
    return sorted(names, key=lambda n: (0, int(n), n) if n.isdigit() else (1, 0, n))


def _positive(data: dict[str, Any], key: str, default: float, where: Path) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TaskError(f"{where}: `{key}` must be a positive number of seconds, got {value!r}")
    return float(value)


def has_tests(path: Path) -> bool:
    """Whether the task at ``path`` has a test: a ``test*`` function (or a ``Test*`` class
    holding one) in a Python file under ``tests/``. A file that does not parse counts as
    having tests (pytest will report the error)."""
    tests = path / "tests"
    if not tests.is_dir():
        return False
    for source in sorted(tests.rglob("*.py")):
        try:
            tree = ast.parse(source.read_bytes(), filename=str(source))
        except (SyntaxError, ValueError):
            return True
        for node in tree.body:
            if _is_test(node) or (
                isinstance(node, ast.ClassDef)
                and node.name.startswith("Test")
                and any(_is_test(item) for item in node.body)
            ):
                return True
    return False


def _is_test(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def _invalid(path: Path) -> str | None:
    if not (path / "tests").is_dir():
        return "the task has no tests/ directory"
    if not has_tests(path):
        return "the task's tests/ define no test (no test function in any of its Python files)"
    if not (path / "run-tests.sh").is_file():
        return "the task has no run-tests.sh"
    return None


def load_task(path: Path, name: str | None = None) -> Task:
    """The task in directory ``path``; :class:`TaskError` when it is not one."""
    config = path / "task.yaml"
    if not config.is_file():
        raise TaskError(f"{path} is not a Terminal-Bench task: it has no task.yaml")
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskError(f"{config} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise TaskError(f"{config} must hold a mapping with an `instruction`")
    instruction = data.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(f"{config} has no `instruction`")
    parser = str(data.get("parser_name") or "pytest")
    if parser not in PARSERS:
        raise TaskError(
            f"{config}: parser `{parser}` is not supported here (only {', '.join(PARSERS)})"
        )
    metadata = {k: v for k, v in data.items() if k in ("difficulty", "category", "tags")}
    return Task(
        name=name or path.name,
        path=path,
        instruction=instruction,
        max_agent_timeout_sec=_positive(
            data, "max_agent_timeout_sec", DEFAULT_AGENT_TIMEOUT_SEC, config
        ),
        max_test_timeout_sec=_positive(
            data, "max_test_timeout_sec", DEFAULT_TEST_TIMEOUT_SEC, config
        ),
        parser_name=parser,
        invalid=_invalid(path),
        metadata=metadata,
    )
