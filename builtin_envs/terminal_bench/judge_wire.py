"""The wire between terminal-bench's runtime and its judge container, and the runtime's end.

On Kubernetes the pod is the agent's box and the judge is a second container of the pod
(:mod:`builtin_envs.terminal_bench.judge`, docs/kubernetes.md). It serves one unix socket in a
volume both containers mount; the runtime container mounts it read-only (a unix socket is
reachable on a read-only mount, so the agent's processes can connect too). The judge serves
the **first** connection it accepts and refuses every later one, so the runtime connects
(:meth:`JudgeClient.connect`) before the agent's first command runs.

The protocol: one JSON object per line each way. On the served connection the judge first
says ``{"ok": true, "hello": "terminal-bench judge", "protocol": 1, "pid": N}``; a refused
connection gets ``{"ok": false, "refused": true, "error": "..."}`` and is closed. Requests are
``{"op": ..., ...}``; each answer is ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``.
The ops: ``ping``; ``tasks`` (``{"dataset": [...], "demo": [...]}``); ``task`` (``name`` or
none: the task as the agent may know it, with ``invalid``); ``solution`` (``name``: the text of
its ``solution.sh``, for the oracle); ``grade`` (``name``, ``seconds``: see
:meth:`builtin_envs.terminal_bench.judge.Judge.grade`).

    >>> encode({"op": "ping"})
    b'{"op": "ping"}\\n'
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from typing import Any

from builtin_envs.terminal_bench.errors import JudgeUnavailableError

__all__ = [
    "MAX_ANSWER",
    "PROTOCOL",
    "SOCKET_ENV",
    "JudgeClient",
    "JudgeRequestError",
    "PodJudge",
    "encode",
]

PROTOCOL = 1
SOCKET_ENV = "AENV_JUDGE_SOCKET"
"""The variable that names the judge's socket in the runtime container (the pod spec sets it)."""
MAX_ANSWER = 64 << 20
"""Bytes of one answer of the judge, at most (the test output's end and pytest's reports)."""
CONNECT_TIMEOUT = 60.0


class JudgeRequestError(JudgeUnavailableError):
    """The judge could not carry out a request (its message says why; the connection stays)."""


def encode(message: dict[str, Any]) -> bytes:
    """One line of the protocol."""
    return json.dumps(message).encode() + b"\n"


class JudgeClient:
    """The runtime's connection to its judge container: :meth:`connect` once, before the agent
    runs anything, then :meth:`request`. Thread-safe (one request at a time)."""

    def __init__(self, sock: socket.socket, hello: dict[str, Any]) -> None:
        self._sock = sock
        self._pending = b""
        self._lock = threading.Lock()
        self.hello = hello

    @classmethod
    def connect(cls, path: str, *, timeout: float = CONNECT_TIMEOUT) -> JudgeClient:
        """Connect to the judge at ``path``, waiting up to ``timeout`` seconds for it to listen
        (the containers of a pod start together); :class:`JudgeUnavailableError` when it does
        not, or when it refuses this connection (another process connected first)."""
        deadline = time.monotonic() + timeout
        last: OSError | None = None
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                break
            except OSError as exc:
                sock.close()
                last = exc
            if time.monotonic() >= deadline:
                raise JudgeUnavailableError(
                    f"the judge's socket {path} did not answer within {timeout:g} s ({last}): "
                    "is the pod's judge container running? Its log says why it is not"
                )
            time.sleep(0.05)
        client = cls(sock, {})
        hello = client._answer(max(1.0, deadline - time.monotonic()))
        if not hello.get("ok"):
            sock.close()
            raise JudgeUnavailableError(
                f"the judge at {path} refused this connection ({hello.get('error')}): it serves "
                "only the first one, which another process opened; the instance cannot be "
                "graded, replace it"
            )
        if hello.get("protocol") != PROTOCOL:
            sock.close()
            raise JudgeUnavailableError(
                f"the judge at {path} speaks protocol {hello.get('protocol')!r}, not {PROTOCOL}: "
                "the runtime and the judge container must run the same image"
            )
        client.hello = hello
        return client

    def request(self, op: str, *, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one request and wait up to ``timeout`` seconds for its answer.
        :class:`JudgeRequestError` when the judge answers an error;
        :class:`JudgeUnavailableError` when it is gone or silent (then this client is closed)."""
        with self._lock:
            try:
                self._sock.sendall(encode({"op": op, **fields}))
            except OSError as exc:
                self.close()
                raise JudgeUnavailableError(
                    f"the judge is gone ({exc}); replace the instance"
                ) from exc
            answer = self._answer(timeout)
        if not answer.get("ok"):
            raise JudgeRequestError(f"the judge could not {op}: {answer.get('error')}")
        return answer

    def _answer(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise JudgeUnavailableError(
                    f"the judge did not answer within {timeout:g} s; replace the instance"
                )
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                continue
            try:
                chunk = self._sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                raise JudgeUnavailableError("the judge closed the connection; replace the instance")
            self._pending += chunk
            if len(self._pending) > MAX_ANSWER:
                self.close()
                raise JudgeUnavailableError(f"the judge answered more than {MAX_ANSWER} bytes")
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError as exc:
            self.close()
            raise JudgeUnavailableError("the judge answered a line that is not JSON") from exc
        if not isinstance(answer, dict):
            self.close()
            raise JudgeUnavailableError("the judge answered something that is not an object")
        return answer

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (it is never opened again)."""
        return self._sock.fileno() < 0

    def close(self) -> None:
        """Close the connection (idempotent). The judge then ends."""
        self._sock.close()


class PodJudge:
    """A runtime's one connection to its pod's judge container (terminal-bench's ``_tb_pod``,
    swe's ``builtin_envs.swe.pod``): opened by the first :meth:`get`, before the agent's first
    command runs, and never again (the judge serves only the first connection it accepts, so a
    process of the agent's that reaches the socket later is refused). A forked child holds
    none (the judge would refuse it)."""

    def __init__(self) -> None:
        self._client: JudgeClient | None = None
        self._opened = False
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._client = None

    def get(self) -> JudgeClient:
        """The connection, opened on the first call (``AENV_JUDGE_SOCKET`` names the socket);
        :class:`JudgeUnavailableError` once it is lost."""
        if self._client is not None and not self._client.closed:
            return self._client
        if self._opened:
            raise JudgeUnavailableError(
                "the connection to the pod's judge container was lost, and the judge serves "
                "one connection only: this instance cannot be graded any more; replace it"
            )
        self._opened = True
        self._client = JudgeClient.connect(os.environ[SOCKET_ENV])
        return self._client
