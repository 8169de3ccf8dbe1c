"""Messages between the engine, the zygote, templates and instances: one JSON object per
``SOCK_SEQPACKET`` datagram, with file descriptors and (optionally) the sender's credentials.

The zygote reads what templates and instances send as untrusted input: :func:`receive` never
blocks (it is called when the selector says a datagram is there), never returns a truncated
message, closes every descriptor it was not asked for, and raises :class:`ProtocolViolation`
for anything that is not a JSON object with a string ``op``. :func:`send` to an untrusted peer
never blocks either (``block=False``): a peer that does not read its socket is a violation, not
a reason for the zygote to wait.

    >>> a, b = pair()
    >>> send(a, {"op": "hello", "id": "x"})
    >>> receive(b).message
    {'op': 'hello', 'id': 'x'}
    >>> a.close(); b.close()
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_MESSAGE", "ProtocolViolation", "Received", "pair", "receive", "send", "text"]

MAX_MESSAGE = 1 << 20
"""Bytes a message may have; a longer datagram is a violation (the kernel would truncate it)."""

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ProtocolViolation(Exception):
    """A peer sent something that is not a message of ours (garbage, truncated, oversized)."""


@dataclass
class Received:
    """One message, the descriptors that came with it, and the sender's pid (when asked)."""

    message: dict[str, Any] | None  # None: the peer closed its end
    fds: list[int] = field(default_factory=list)
    pid: int | None = None  # in the receiver's pid namespace, checked by the kernel

    def close_fds(self) -> None:
        """Close the descriptors that came with the message."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected ``SOCK_SEQPACKET`` pair (both ends close-on-exec)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(
    sock: socket.socket,
    message: dict[str, Any],
    fds: list[int] | None = None,
    *,
    block: bool = True,
) -> None:
    """Send one message (and descriptors). ``block=False``: raise :class:`ProtocolViolation`
    instead of waiting when the peer's queue is full (it does not read)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"message {message.get('op')!r} is {len(data)} bytes, over {MAX_MESSAGE}")
    flags = 0 if block else socket.MSG_DONTWAIT
    ancillary = []
    if fds:
        ancillary.append((socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds)))
    try:
        sock.sendmsg([data], ancillary, flags)
    except BlockingIOError as exc:
        raise ProtocolViolation("the peer does not read its messages") from exc


def receive(
    sock: socket.socket, *, max_fds: int = 0, creds: bool = False, block: bool = False
) -> Received:
    """One message from ``sock``; ``Received(None)`` at end of stream.

    ``max_fds``: descriptors accepted with it (more: violation, all closed). ``creds``: the
    socket has ``SO_PASSCRED`` on and the sender's pid is wanted. ``block``: wait for it
    (only where the peer is trusted to send); else the selector said a message is there.
    """
    size = 0
    if max_fds:
        size += socket.CMSG_SPACE(max_fds * struct.calcsize("i"))
    if creds:
        size += socket.CMSG_SPACE(_CREDS.size)
    try:
        # descriptors arrive close-on-exec: nothing a process execs (its pid 1, a shell) may
        # inherit a socket to the zygote or a listening socket by accident
        asked = socket.MSG_CMSG_CLOEXEC | (0 if block else socket.MSG_DONTWAIT)
        data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, size, asked)
    except BlockingIOError:
        raise ProtocolViolation("woken for a message that is not there") from None
    except ConnectionResetError:
        return Received(None)
    received = Received(None)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            received.fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            received.pid = _CREDS.unpack(payload[: _CREDS.size])[0]
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolViolation("a truncated message (too long, or too many descriptors)")
        if not data:
            if received.fds:
                raise ProtocolViolation("descriptors without a message")
            return received
        try:
            message = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ProtocolViolation(f"a message that is not JSON ({exc})") from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ProtocolViolation('a message that is not an object with a string "op"')
    except ProtocolViolation:
        received.close_fds()
        raise
    received.message = message
    return received


def text(message: dict[str, Any], key: str, *, limit: int = 4096) -> str:
    """``message[key]`` as a string of at most ``limit`` characters, else a violation."""
    value = message.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolViolation(f"field {key!r} must be a string of at most {limit} characters")
    return value
