"""The last word of a runtime that must end: every request still waiting for its answer gets
one saying why, before the process exits.

When the watchdog finds the event loop blocked for good (:mod:`sandbox_runtime._watchdog`),
the loop cannot answer anyone; without this, each caller would only see its connection drop
and guess. :class:`Waiting` remembers the client address of each request whose answer has not
started (a set add and remove per request); :meth:`Waiting.answer_all`, called from another
thread just before the process ends, finds those connections among the process's sockets and
writes a complete ``503`` answer with the error envelope of
:class:`~aenv_ray.errors.InstanceBrokenError` and the reason on each, so that the SDK raises that
error with the real reason at once.

May import: the standard library, ``aenv_ray.errors``, orjson.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from aenv_ray.errors import InstanceBrokenError, encode_error

__all__ = ["Waiting"]

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_SEND_SECONDS = 1.0


class Waiting:
    """The client addresses of requests not answered yet."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, int], int] = {}

    def track(self, scope: MutableMapping[str, Any], send: Send) -> tuple[Send, Callable[[], None]]:
        """Remember the request of ``scope`` until its answer starts; the ``send`` to answer it
        with, and a function to call when it is over (either may come first)."""
        client = scope.get("client")
        if not client:
            return send, _nothing
        key = (str(client[0]), int(client[1]))
        self._clients[key] = self._clients.get(key, 0) + 1
        done = False

        def forget() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._clients.get(key, 0) - 1
            if left > 0:
                self._clients[key] = left
            else:
                self._clients.pop(key, None)

        async def answering(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                forget()
            await send(message)

        return answering, forget

    def answer_all(self, reason: str) -> int:
        """Write a ``503`` answer carrying ``reason`` on the connection of every request not
        answered yet (call from a thread other than the blocked loop's, just before the
        process ends); how many were answered."""
        clients = set(self._clients)
        if not clients:
            return 0
        error = InstanceBrokenError(f"the instance's runtime had to end: {reason}")
        body = orjson.dumps({"success": False, **encode_error(error)})
        head = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        answered = 0
        for name in os.listdir("/proc/self/fd"):
            sock = _socket(int(name))
            if sock is None:
                continue
            with sock:
                try:
                    peer = sock.getpeername()
                except OSError:
                    continue
                if not isinstance(peer, tuple) or (str(peer[0]), int(peer[1])) not in clients:
                    continue
                with contextlib.suppress(OSError):
                    sock.settimeout(_SEND_SECONDS)
                    sock.sendall(head + body)
                    answered += 1
        return answered


def _socket(fd: int) -> socket.socket | None:
    """A socket object on a copy of ``fd`` if it is a TCP socket."""
    try:
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    return sock


def _nothing() -> None:
    return None
