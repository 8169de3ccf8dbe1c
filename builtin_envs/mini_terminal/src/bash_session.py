"""A persistent bash process driven through pipes, one command at a time.

State (working directory, variables, functions) persists between commands, as in a terminal.
Each command's end is found by a sentinel line carrying a random nonce and the exit status.
A command past its timeout kills the whole session's process group; the next command starts a
fresh session in the same working directory.

Output over ``MAX_OUTPUT`` bytes is cut in the middle: its first and last ``MAX_OUTPUT // 2``
bytes are kept, with a line saying how many bytes were dropped in between. The command is read
to its end either way, so its status comes back and the shell lives on.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import subprocess
import time

from aenv_ray import keep_processes

MAX_OUTPUT = 1_000_000
"""Bytes of one command's output returned at most (plus the line saying what was dropped)."""
_READ = 65536


class CommandTimeout(Exception):
    """The command did not finish in time; the session was restarted."""


class BashSession:
    """One bash process, started by :meth:`start` or else by the first command."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the shell now unless it runs (its first command then does not wait for it)."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()

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
        # the shell (and the jobs it keeps) serves many calls: it outlives each call, not the
        # episode; what detaches itself from it still ends with its call
        keep_processes(proc.pid)
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
        deadline = time.monotonic() + timeout
        output = _Output(marker.encode())
        while True:
            found = output.finish()
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise CommandTimeout(f"command did not finish within {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, _READ)
            if not chunk:  # the shell exited (e.g. `exit 3`)
                status = proc.wait()
                self.close()
                return output.text(output.buffer), status
            output.add(chunk)


class _Output:
    """One command's output as it arrives: the head kept, the middle dropped and counted, the
    tail kept in a window that always holds the end marker when it comes."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.head: bytes | None = None  # the first MAX_OUTPUT // 2 bytes, once there are more
        self.buffer = bytearray()  # what came after the head (all of it, while it is short)
        self.dropped = 0
        self._searched = 0  # the marker does not start before this offset of the buffer

    def add(self, chunk: bytes) -> None:
        self.buffer += chunk
        keep = MAX_OUTPUT // 2
        if len(self.buffer) <= MAX_OUTPUT + _READ:
            return
        if self.head is None:
            self.head = bytes(self.buffer[:keep])
            del self.buffer[:keep]
            self._searched = max(0, self._searched - keep)
        excess = len(self.buffer) - keep - len(self.marker) - 64
        if excess > 0:
            del self.buffer[:excess]
            self.dropped += excess
            self._searched = max(0, self._searched - excess)

    def finish(self) -> tuple[str, int] | None:
        """``(output, status)`` once the end marker and its line arrived."""
        buffer = self.buffer
        at = buffer.find(self.marker, self._searched)
        if at < 0:
            self._searched = max(0, len(buffer) - len(self.marker))
            return None
        self._searched = at
        end = buffer.find(b"\n", at)
        if end < 0:
            return None
        status = int(buffer[at + len(self.marker) : end].strip() or 0)
        out = bytes(buffer[:at])
        if out.endswith(b"\n"):
            out = out[:-1]
        return self.text(out), status

    def text(self, tail: bytes | bytearray) -> str:
        if self.head is None:
            return bytes(tail).decode(errors="replace")
        keep = MAX_OUTPUT // 2
        if len(tail) > keep:
            self.dropped += len(tail) - keep
            tail = tail[-keep:]
        total = len(self.head) + self.dropped + len(tail)
        note = (
            f"\n[... {self.dropped} bytes of output dropped here: {total} bytes in all, the "
            f"first {len(self.head)} and the last {len(tail)} are shown ...]\n"
        )
        return self.head.decode(errors="replace") + note + bytes(tail).decode(errors="replace")
