"""swe@1.0.0: a SWE-bench task per episode: its repository at the base commit, tools to view,
search, create and edit files and to run commands; the reward runs the tests on a fresh
checkout of the base commit with the agent's source changes only (strict grading, see
``builtin_envs.swe.strict``), applies the test patch and grades FAIL_TO_PASS / PASS_TO_PASS as
SWE-bench does.

The task comes from the ``SWE_*`` variables at the first call or from ``swe_reset`` (another row
on a warm instance). The agent's commands and file tools run in a view of the instance where the
dataset, the repositories it came from and the environment's private files are empty
directories (``builtin_envs.swe.sandbox``). In a Kubernetes pod with a judge container
(``builtin_envs.swe.pod``) the rows, the repositories and the grading are the judge container's,
and the agent's box is the pod itself. See docs/builtins.md and docs/kubernetes.md.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from aenv_ray import register_function, register_health, register_reward, register_tool
from aenv_ray.errors import ConfigurationError
from builtin_envs.swe import pod
from builtin_envs.swe.episode import Episode, Settings
from builtin_envs.swe.rows import load_rows, parse_row

_LOCK = threading.RLock()
_EPISODE: Episode | None = None
_MAX_COMMAND_TIMEOUT = 1800


def _judged(settings: Settings) -> bool:
    """Whether the pod's judge container holds the rows and grades: a pod with one, unless the
    instance has a datasource container to run everything in (``DualContainer``)."""
    return pod.IN_POD and not settings.datasource


def _episode() -> Episode:
    """The current episode; the first call starts the ``SWE_*`` variables' task (in a pod
    with a judge container, the judge's, after connecting to it: before any command runs)."""
    global _EPISODE
    with _LOCK:
        settings = Settings.from_environ(os.environ)
        if _judged(settings):
            pod.judge()
        if _EPISODE is None:
            _EPISODE = pod.start(settings) if _judged(settings) else Episode.start(settings)
        return _EPISODE


@register_function(timeout=1800)
def swe_reset(
    instance_id: str | None = None,
    index: int | None = None,
    dataset: str | None = None,
    row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start a new episode: a row's repository at its base commit, in a fresh workspace.

    Args:
        instance_id: the row's instance_id (default: SWE_INSTANCE, else the first row).
        index: the row's position in the dataset, from 0 (instead of instance_id).
        dataset: a JSON or JSON-lines file of SWE-bench rows (default: SWE_DATASET, else the
            demo rows).
        row: the row itself, a dict of SWE-bench's fields (instead of a dataset).
    """
    global _EPISODE
    with _LOCK:
        settings = Settings.from_environ(os.environ)
        parsed = parse_row(row, "row") if row is not None else None
        if parsed is not None and (instance_id or index is not None):
            raise ConfigurationError("give either row or instance_id/index, not both")
        _EPISODE = None
        if _judged(settings):  # the judge picks the row; the dataset is a file of its own
            _EPISODE = pod.start(settings, instance_id, index, dataset=dataset, row=row)
            return _EPISODE.public()
        if dataset:
            settings = dataclasses.replace(settings, dataset=dataset)
        _EPISODE = Episode.start(settings, instance_id, index, row=parsed)
        return _EPISODE.public()


@register_function
def swe_task() -> dict[str, Any]:
    """The current task as the agent may know it: instance, repository, problem, prompt."""
    return _episode().public()


@register_function
def swe_instances(dataset: str | None = None) -> list[str]:
    """The instance ids of a dataset (default: SWE_DATASET, else the demo rows).

    Args:
        dataset: a JSON or JSON-lines file of SWE-bench rows.
    """
    settings = Settings.from_environ(os.environ)
    if _judged(settings):
        return pod.instances(dataset)
    return [r.instance_id for r in load_rows(dataset or settings.dataset)]


@register_function(timeout=600)
def swe_diff() -> dict[str, str]:
    """The agent's change so far against the base commit, new files included."""
    episode = _episode()
    with episode.gate.using():
        return {"patch": episode.diff()}


@register_tool(timeout=_MAX_COMMAND_TIMEOUT + 60)
def run_command(command: str, timeout: int | None = None) -> dict[str, object]:
    """Run a bash command in the repository and return its output and exit status.

    Each command runs in a fresh shell whose working directory is the repository: `cd`,
    variables and background processes do not carry over to the next command. stderr is merged
    into the output; past 100 kB the middle of the output is cut. A command past its timeout is
    killed (returncode 124).

    Args:
        command: the command line, e.g. "python -m pytest tests/test_x.py -q".
        timeout: seconds before the command is killed (default 120, at most 1800).
    """
    if timeout is not None and not 0 < timeout <= _MAX_COMMAND_TIMEOUT:
        raise ValueError(f"timeout must be between 1 and {_MAX_COMMAND_TIMEOUT} seconds")
    episode = _episode()
    with episode.gate.using():
        return episode.run(command, timeout)


@register_tool(timeout=120)
def view(path: str, view_range: list[int] | None = None) -> str:
    """Show a file with line numbers, or list a directory two levels deep.

    Args:
        path: a file or directory, relative to the repository or absolute.
        view_range: [first, last] lines to show (last -1: to the end of the file).
    """
    episode = _episode()
    with episode.gate.using():
        return episode.view(path, view_range)


@register_tool(timeout=120)
def search(
    pattern: str,
    path: str = ".",
    include: str | None = None,
    fixed_strings: bool = False,
    ignore_case: bool = False,
    max_results: int = 100,
) -> str:
    """Search files for a pattern (grep -rn): matching lines as file:line:text.

    Args:
        pattern: an extended regular expression (or plain text with fixed_strings).
        path: the file or directory to search, relative to the repository or absolute.
        include: only files whose name matches this glob, e.g. "*.py".
        fixed_strings: take pattern as plain text.
        ignore_case: match regardless of case.
        max_results: at most this many lines.
    """
    episode = _episode()
    with episode.gate.using():
        return episode.search(pattern, path, include, fixed_strings, ignore_case, max_results)


@register_tool(timeout=120)
def create_file(path: str, file_text: str) -> str:
    """Create a new file (missing directories included); an existing file is not overwritten.

    Args:
        path: the new file, relative to the repository or absolute.
        file_text: its content.
    """
    episode = _episode()
    with episode.gate.using():
        return episode.create(path, file_text)


@register_tool(timeout=120)
def str_replace(path: str, old_str: str, new_str: str = "") -> str:
    """Replace text in a file: old_str must occur exactly once (whitespace included).

    Args:
        path: the file, relative to the repository or absolute.
        old_str: the exact text to replace.
        new_str: the text to put in its place (empty: delete old_str).
    """
    episode = _episode()
    with episode.gate.using():
        return episode.str_replace(path, old_str, new_str)


@register_reward(timeout=3600)
def swe_reward(strict: bool = True) -> dict[str, Any]:
    """Apply the row's test patch, run its tests, grade as SWE-bench: reward 1.0 when the
    instance is resolved (every FAIL_TO_PASS test passes, no PASS_TO_PASS test broke), else
    0.0; the report says why.

    Args:
        strict: run the tests on a fresh checkout of the base commit with the agent's changes
            to source files only (changes to tests, conftest.py, test settings, files that
            shadow pytest or the standard library, .pth files... are left out, listed under
            ``left_out``), in a judge's view (the agent's commands ended, a fresh /tmp and
            home). False: grade the repository as the agent left it, exactly as SWE-bench does
            (for comparisons with SWE-bench's numbers; the agent can forge that reward).
    """
    return _episode().grade(strict=strict)


@register_health
def health() -> dict[str, object]:
    """Healthy while the instance answers; which task it holds."""
    episode = _EPISODE
    return {
        "status": "healthy",
        "instance_id": episode.row.instance_id if episode is not None else None,
    }


__all__ = [
    "create_file",
    "health",
    "run_command",
    "search",
    "str_replace",
    "swe_diff",
    "swe_instances",
    "swe_reset",
    "swe_reward",
    "swe_task",
    "view",
]
