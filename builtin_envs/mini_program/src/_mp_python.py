"""Run a Python snippet in a child process of the instance, with a timeout and bounded output.

The code is written to a file in a private temporary directory and run with the runtime's own
interpreter (``sys.executable``), stdin empty, in the project directory (which is also on its
``sys.path``, so it can import the project's modules and read and write its files). stdout and
stderr are read as they come; each keeps its first :data:`MAX_OUTPUT` bytes and counts the rest.
The child runs in a session of its own: past the timeout the whole session is killed, and when
the child ends, whatever it left running in the background is killed too.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_OUTPUT", "MAX_TIMEOUT", "RunResult", "run_python"]

MAX_OUTPUT = 100_000
"""Bytes of stdout (and, separately, of stderr) returned at most; the rest is counted."""
MAX_TIMEOUT = 120
"""The longest a snippet may run, in seconds."""
_CHUNK = 65536


@dataclass
class _Stream:
    kept: bytearray
    dropped: int = 0

    def add(self, chunk: bytes) -> None:
        room = MAX_OUTPUT - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... {self.dropped} more bytes not shown: only the first {MAX_OUTPUT} are]"
        return text


@dataclass(frozen=True)
class RunResult:
    """What a snippet did: its output, its exit status, whether it ran out of time."""

    output: str
    error: str
    returncode: int
    timed_out: bool

    def describe(self) -> dict[str, object]:
        """The tool's answer (``success``: exit status 0 within the time)."""
        return {
            "success": self.returncode == 0 and not self.timed_out,
            "output": self.output,
            "error": self.error,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
        }


def run_python(code: str, *, cwd: Path, timeout: float) -> RunResult:
    """Run ``code`` in ``cwd`` for at most ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="aenv-mini-program-") as scratch:
        script = Path(scratch) / "__aenv_code__.py"
        script.write_text(code, encoding="utf-8", errors="surrogatepass")
        env = dict(
            os.environ,
            PYTHONPATH=str(cwd),
            PYTHONDONTWRITEBYTECODE="1",  # no __pycache__ among the project's files
            PYTHONUNBUFFERED="1",
            PYTHONIOENCODING="utf-8",
        )
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        return _collect(proc, timeout)  # kills the session and reaps the child, whatever happens


def _collect(proc: subprocess.Popen[bytes], timeout: float) -> RunResult:
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = _Stream(bytearray()), _Stream(bytearray())
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    reading = set(streams)
    exited = _exit_watch(proc.pid)
    deadline = time.monotonic() + timeout
    timed_out = ended = False
    try:
        while reading:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = not ended  # else: something it detached still holds its output
                break
            watched = [*reading] if exited is None or ended else [*reading, exited]
            # without a pidfd, look at the child's status every 0.1 s
            wait = remaining if exited is not None or ended else min(remaining, 0.1)
            ready, _, _ = select.select(watched, [], [], wait)
            if not ended and ((exited in ready) if exited is not None else _has_exited(proc.pid)):
                ended = True
                _kill_session(proc)  # what it left running in the background: pipes then close
            for fd in ready:
                if fd in reading:
                    chunk = os.read(fd, _CHUNK)
                    if chunk:
                        streams[fd].add(chunk)
                    else:
                        reading.discard(fd)
    finally:
        if exited is not None:
            os.close(exited)
        _kill_session(proc)
        returncode = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    error = err.text()
    if timed_out:
        note = f"[killed: the code did not finish within {timeout:g} s]"
        error = f"{error}\n{note}" if error else note
        returncode = 124
    return RunResult(out.text(), error, returncode, timed_out)


def _exit_watch(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (a pidfd), where the kernel has
    them."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _has_exited(pid: int) -> bool:
    """True once ``pid`` has exited, without reaping it (its pid stays ours to signal)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is not None:  # reaped: its pid may be another process's by now
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
