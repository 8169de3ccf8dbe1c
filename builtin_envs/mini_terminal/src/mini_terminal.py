"""mini-terminal: one bash shell per instance, in the instance's own working directory."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from bash_session import BashSession, CommandTimeout

from aenv_ray import register_health, register_reward, register_tool
from aenv_ray.registry import current_registry

_session: BashSession | None = None


def workdir() -> str:
    """The instance's working directory: $AENV_WORKSPACE, else a fresh private directory."""
    global _session
    if _session is None:
        path = os.environ.get("AENV_WORKSPACE")
        if path:
            Path(path).mkdir(parents=True, exist_ok=True)
        else:  # a directory of our own: removed when the instance exits
            path = tempfile.mkdtemp(prefix="aenv-mini-terminal-")
            atexit.register(shutil.rmtree, path, True)
        _session = BashSession(path)
    return _session.workdir


def _after_fork_in_child() -> None:
    # A forked instance keeps the Python state but not the parent's shell process: the next
    # command starts a new shell in this instance's working directory (its copy of the
    # parent's workspace). The parent's shell stays the parent's.
    global _session
    _session = None


os.register_at_fork(after_in_child=_after_fork_in_child)


@current_registry().add_warm_up
def start_shell() -> None:
    """Start the shell as the instance starts serving (a warm instance's first command finds
    it running, and run once), not at import: the local engine forks instances from a template
    process that imported this module, and a shell started there would be no instance's."""
    workdir()
    assert _session is not None
    _session.start()
    # and has it run once: a shell's first command pays its one-time work (the dynamic
    # linker's lazy binding, bash's first parse), a few ms under a pod's CPU quota
    _session.run(":", timeout=30)


@register_tool
def execute_command(command: str, timeout: int = 60) -> dict[str, object]:
    """Run a bash command in this instance's terminal and return its output and return code.

    The shell persists between calls: `cd`, variables and files stay. stderr is merged into
    the output; output over 1 MB is cut in the middle (the first and last 500 kB are kept, and a
    line says how many bytes were dropped). A command past its timeout is killed and the
    terminal restarts (returncode 124).

    Args:
        command: the command line to run, e.g. "ls -la".
        timeout: seconds before the command is killed.
    """
    workdir()
    assert _session is not None
    if timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    try:
        output, code = _session.run(command, timeout=timeout)
    except CommandTimeout as exc:
        return {"output": str(exc), "returncode": 124}
    return {"output": output, "returncode": code}


@register_reward
def file_contains(path: str, expected: str) -> float:
    """1.0 when the file at `path` (relative to the working directory) contains `expected`.

    Args:
        path: file to check, relative to the working directory.
        expected: text that must appear in it.
    """
    target = Path(workdir()) / path
    try:
        return 1.0 if expected in target.read_text(errors="replace") else 0.0
    except OSError:
        return 0.0


@register_health
def health() -> dict[str, object]:
    """Healthy while the working directory exists."""
    path = workdir()
    return {"status": "healthy" if os.path.isdir(path) else "unhealthy", "workdir": path}
