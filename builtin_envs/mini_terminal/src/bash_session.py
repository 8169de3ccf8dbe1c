"""A persistent bash process driven through pipes, one command at a time.

State (working directory, variables, functions) persists between commands, as in a terminal.
Each command's end is found by a sentinel line carrying a random nonce and the exit status.
A command past its timeout kills the whole session's process group; the next command starts a
fresh session in the same working directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import subprocess
import time

MAX_OUTPUT = 1_000_000


class CommandTimeout(Exception):
    """The command did not finish in time; the session was restarted."""


class BashSession:
    """One bash process, started lazily on the first command."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PS1="", PS2="", TERM="dumb", HISTFILE="/dev/null")
        proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
            start_new_session=True,
        )
        self._proc = proc
        return proc

    def close(self) -> None:
        """Kill the session's process group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def run(self, command: str, timeout: float) -> tuple[str, int]:
        """Run ``command``; return (output, exit status). Raise CommandTimeout past ``timeout``."""
        proc = self._proc if self._proc and self._proc.poll() is None else self._start()
        assert proc.stdin is not None
        assert proc.stdout is not None
        nonce = secrets.token_hex(8)
        marker = f"__AENV_DONE_{nonce}__"
        script = f"{command}\n__aenv_rc=$?; printf '\\n{marker} %s\\n' \"$__aenv_rc\"\n"
        try:
            proc.stdin.write(script.encode())
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return "the shell exited; a new one starts with the next command", 1
        fd = proc.stdout.fileno()
        buf = bytearray()
        deadline = time.monotonic() + timeout
        needle = marker.encode()
        while True:
            idx = buf.find(needle)
            if idx >= 0:
                end = buf.find(b"\n", idx)
                if end >= 0:
                    status = int(buf[idx + len(needle) : end].strip() or 0)
                    out = bytes(buf[:idx])
                    if out.endswith(b"\n"):
                        out = out[:-1]
                    return out.decode(errors="replace"), status
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise CommandTimeout(f"command did not finish within {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # the shell exited (e.g. `exit 3`)
                status = proc.wait()
                self.close()
                return bytes(buf).decode(errors="replace"), status
            if len(buf) < MAX_OUTPUT:
                buf.extend(chunk)
