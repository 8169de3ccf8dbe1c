"""The errors of the terminal-bench library, under :class:`aenv_ray.errors.AEnvError`::

AEnvError
├── ConfigurationError
│   ├── TaskError              a task directory that is not a Terminal-Bench task; fix the task
│   └── BoxUnavailableError    the instance cannot build the box that hides the tests
├── TaskNotFoundError (LookupError)  no task of that name in the dataset; check the name
├── NoTaskError                no task is active: call tb_reset(task=...) or set TB_TASK_DIR
└── JudgeUnavailableError      the judge's pytest is gone: no report to check; grade again
"""

from __future__ import annotations

from aenv_ray.errors import AEnvError, ConfigurationError

__all__ = [
    "BoxUnavailableError",
    "JudgeUnavailableError",
    "NoTaskError",
    "TaskError",
    "TaskNotFoundError",
]


class TaskError(ConfigurationError):
    """A task directory without ``task.yaml``, or whose ``task.yaml`` is not valid."""


class BoxUnavailableError(ConfigurationError):
    """The instance cannot build a box (user namespaces, ``/app``): the tests cannot be hidden."""


class TaskNotFoundError(AEnvError, LookupError):
    """No task of that name in the dataset."""


class NoTaskError(AEnvError):
    """A call that needs a task, with none active."""


class JudgeUnavailableError(AEnvError):
    """The judge cannot grade (its pytest, whose report it checks, is gone): grade again."""
