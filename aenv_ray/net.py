"""Networking shared by the servers (an instance's runtime, the hub): listening sockets, and
what a server on loopback accepts from a browser.

    >>> is_local_host("127.0.0.1:8080"), is_local_host("[::1]"), is_local_host("localhost")
    (True, True, True)
    >>> is_local_host("evil.example:8080"), is_local_host("127.0.0.1:http"), is_local_host("")
    (False, False, False)
    >>> media_type("Application/JSON; charset=utf-8")
    'application/json'
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from urllib.parse import urlsplit

__all__ = ["bind_socket", "is_local_host", "media_type"]


@functools.lru_cache(maxsize=256)  # a server sees the same few Host headers again and again
def is_local_host(host: str) -> bool:
    """``localhost`` or an IP literal, with or without a valid port: a ``Host`` header a DNS
    name cannot rebind to this machine (a web page's request to ``evil.example`` can carry
    ``Host: evil.example`` to 127.0.0.1, never ``Host: 127.0.0.1``)."""
    if not host or "@" in host:
        return False
    try:
        parts = urlsplit(f"//{host}")
        name = parts.hostname
        parts.port  # noqa: B018 (a port that is not a number raises ValueError)
    except ValueError:
        return False
    if not name:
        return False
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def media_type(value: str) -> str:
    """The media type of a ``Content-Type`` value, parameters dropped, lowercased."""
    return value.split(";", 1)[0].strip().lower()


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
