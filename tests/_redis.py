"""A real ``redis-server`` for the tests: a child process on a free loopback port.

    with RedisServer() as server:
        store = await RedisStore.open(server.url)
        ...
        server.restart()  # same port and directory; the data comes back from the AOF file

The server writes an append-only file (``appendfsync always``) in a temporary directory of its
own and no RDB snapshots; the directory is removed when the context ends.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from aenv_ray.testing import free_port

EXECUTABLE = "redis-server"


class RedisServer:
    """``redis-server`` in the foreground, on ``127.0.0.1:port``, with its data in ``directory``."""

    def __init__(self, *, executable: str = EXECUTABLE, startup_timeout: float = 20.0) -> None:
        found = shutil.which(executable)
        if found is None:
            raise FileNotFoundError(f"{executable} is not on PATH; scripts/setup installs it")
        self.executable = found
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="aenv-redis-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        if self._process is not None:
            raise RuntimeError("the redis-server is already running")
        command = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--logfile", str(self.log),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers_ping():
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode() if self._process.stderr else ""
                self._process = None
                raise RuntimeError(
                    f"redis-server exited with {self._process_status(stderr)}; log:\n"
                    + (self.log.read_text() if self.log.exists() else "")
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM (the server flushes its AOF and exits), then wait; SIGKILL if it hangs."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr:
            process.stderr.close()

    def restart(self) -> None:
        """Stop and start again on the same port and directory (the data is kept)."""
        self.stop()
        self.start()

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    @staticmethod
    def _process_status(stderr: str) -> str:
        return f"an error: {stderr.strip()}" if stderr.strip() else "no message"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
