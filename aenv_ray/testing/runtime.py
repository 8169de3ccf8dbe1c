"""RuntimeProcess: a project served by ``python -m sandbox_runtime`` in a child process.

:class:`RuntimeProcess` serves a project on free loopback ports, the way ``aenv run`` does, and
hands out :class:`~aenv_ray.Environment` objects attached to it (see the package docstring).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from aenv_ray.environment import Environment
from aenv_ray.errors import StartupTimeoutError

__all__ = ["RuntimeProcess", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RuntimeProcess:
    """``python -m sandbox_runtime PROJECT`` in a child process, stopped on exit."""

    def __init__(
        self,
        project: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        mcp_port: int | None = None,
        debug: bool = False,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        extra_args: list[str] | None = None,
    ) -> None:
        self.project = Path(project)
        self.host = host
        self.port = port or free_port(host)
        self.mcp_port = mcp_port or free_port(host)
        self.debug = debug
        self.env = env
        self.python = python
        self.extra_args = list(extra_args or [])
        self.unstopped: str | None = None
        """What :meth:`stop` saw of a runtime that SIGTERM did not end (its signal masks and
        the end of its log) before it sent SIGKILL; None otherwise."""
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr_path: Path | None = None

    @property
    def url(self) -> str:
        """Base URL of the fast path, functions and health."""
        return f"http://{self.host}:{self.port}"

    @property
    def mcp_url(self) -> str:
        """The standard MCP endpoint."""
        return f"http://{self.host}:{self.mcp_port}/mcp"

    @property
    def pid(self) -> int:
        """The runtime's process id."""
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self, timeout: float = 30.0) -> RuntimeProcess:
        """Start the process and wait until ``/health`` answers 200."""
        command = [
            self.python,
            "-m",
            "sandbox_runtime",
            str(self.project),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--port",
            str(self.mcp_port),
            *self.extra_args,
        ]
        if self.debug:
            command.append("--debug")
        fd, name = tempfile.mkstemp(prefix=f"aenv-runtime-{self.port}-", suffix=".log")
        self.stderr_path = Path(name)
        stderr = os.fdopen(fd, "wb")
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **(self.env or {})},
        )
        stderr.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self._remove_log()
                raise StartupTimeoutError(
                    f"the runtime for {self.project} exited with {self.process.returncode}: {tail}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.02)
        tail = self.log_tail()
        self.stop()
        raise StartupTimeoutError(
            f"the runtime for {self.project} did not become healthy in {timeout:g} s: {tail}",
            timeout=timeout,
        )

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the runtime wrote to stderr."""
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the runtime (to test what callers see when an instance dies)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; remove the log. Idempotent.

        The timeout is generous: a runtime stopped on time runs its environment's exit
        handlers (``atexit``), which a loaded machine may take seconds to reach.
        """
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.unstopped = _signal_state(process.pid) + self.log_tail(40)
                process.kill()
                process.wait()
        self._remove_log()

    def _remove_log(self) -> None:
        if self.stderr_path is not None:
            with contextlib.suppress(OSError):
                self.stderr_path.unlink()

    def environment(self, env_name: str | None = None, **kwargs: Any) -> Environment:
        """An :class:`Environment` attached to this runtime."""
        return Environment.attach(self.url, env_name, **kwargs)

    def __enter__(self) -> RuntimeProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_state(pid: int) -> str:
    """A process's signal lines of /proc/PID/status (blocked, ignored, caught), and its
    threads' states."""
    lines = []
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/status").read_text()
        lines = [line for line in status.splitlines() if line.startswith(("Sig", "Shd", "State"))]
    with contextlib.suppress(OSError):
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            comm = (task / "comm").read_text().strip()
            wchan = (task / "wchan").read_text().strip()
            lines.append(f"thread {task.name} {comm}: {wchan}")
    return "\n".join(lines) + "\n"
