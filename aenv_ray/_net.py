"""Listening sockets, shared by the servers (an instance's runtime, the hub)."""

from __future__ import annotations

import socket

__all__ = ["bind_socket"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno, f"cannot listen on {host}:{port} ({exc.strerror}); pick another port"
        ) from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock
