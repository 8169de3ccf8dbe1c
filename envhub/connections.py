"""The hub's connections under :class:`envhub.defences.Defences`: read timeouts and caps.

uvicorn waits for a request's headers as long as a client cares to send them, and holds as many
connections as the process has file descriptors; 20,000 idle connections with unfinished headers
(slowloris) filled a hub's descriptors, so keyed requests waited ~40 s for a free one.
:func:`guarded_protocol` is uvicorn's HTTP protocol (httptools) with, per connection:

- a **header deadline**: its request line and headers must arrive within ``header_timeout`` of
  the connection's start, or of the previous answer's end on a kept-alive connection (a deadline
  for all of them, not a pause between bytes: a byte every second does not extend it);
- a **body timeout**: the body may pause at most ``body_timeout`` between two reads (unless the
  hub itself stopped reading because the app has not taken what came);

on expiry the client gets 408 (the error envelope of :class:`~aenv_ray.errors.AEnvTimeoutError`)
and the connection is closed. :class:`ConnectionGate` counts connections per client and in all:
over ``client_connections`` a new one is answered 429
(:class:`~aenv_ray.errors.RateLimitedError`); at ``max_connections`` a new one replaces the
oldest connection still waiting for its headers (an attacker's idle ones go first, a request in
progress is never cut), and is answered 503 (:class:`~aenv_ray.errors.CapacityError`) when none
waits. Refused connections are closed at once: no descriptor stays with them.

:func:`raise_fd_limit` raises the process's soft ``RLIMIT_NOFILE`` to its hard limit, and
:func:`connection_cap` picks ``max_connections`` below it, :func:`accept_backlog` how many
connections the event loop may accept at once (each a descriptor before the gate sees it).
When three quarters of a peak of at least :data:`TRIM_AFTER` connections have closed, the hub
gives freed heap back to the system (``malloc_trim`` on glibc), so its memory returns to its
level after an attack: ``aenv serve`` runs with glibc's allocator for small objects too
(:func:`envhub.allocator.use_system_allocator`), whose freed memory the trim reaches.

May import: the standard library, ``aenv_ray.errors``, ``envhub.defences``, uvicorn, httptools.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import resource
from collections import OrderedDict
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aenv_ray.errors import (
    AEnvError,
    AEnvTimeoutError,
    CapacityError,
    RateLimitedError,
    encode_error,
)
from envhub.defences import MAX_CONNECTIONS, PEER, Defences, client_key

__all__ = [
    "ConnectionGate",
    "accept_backlog",
    "connection_cap",
    "guarded_protocol",
    "raise_fd_limit",
]

log = logging.getLogger("envhub.connections")

RESERVED_FDS = 256
"""File descriptors kept out of ``max_connections``'s reach: the store, the engine, logs."""
TRIM_AFTER = 256
"""A peak of at least this many connections is followed by a heap trim once three quarters of
them are gone."""
TRIM_DELAY = 2.0
"""Seconds between that moment and the trim: the rest of the wave of closes passes first."""


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (as far as the system lets); the
    soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(defences: Defences, fd_limit: int) -> int:
    """``max_connections``: the operator's, else half the descriptors left after
    :data:`RESERVED_FDS` (each proxied call holds a second one), at most
    :data:`~envhub.defences.MAX_CONNECTIONS`, at least 16; 0 means no cap."""
    if defences.max_connections is not None:
        return defences.max_connections
    return max(16, min(MAX_CONNECTIONS, (fd_limit - RESERVED_FDS) // 2))


def accept_backlog(fd_limit: int, max_connections: int) -> int:
    """The listening socket's backlog, which is also how many connections the event loop
    accepts in one go, before the gate sees any of them: a quarter of the descriptors the
    connections and :data:`RESERVED_FDS` leave, 16 to 2048 (uvicorn's default)."""
    spare = fd_limit - RESERVED_FDS - (max_connections or fd_limit // 2)
    return max(16, min(2048, spare // 4))


def _answer(status: int, reason: str, error: AEnvError, extra: dict[str, str]) -> bytes:
    body = json.dumps(encode_error(error)).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json"]
    head += [f"{name}: {value}" for name, value in extra.items()]
    head += [f"content-length: {len(body)}", "connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


class ConnectionGate:
    """Open connections per client and in all (see the module); one per server."""

    def __init__(self, defences: Defences, max_connections: int) -> None:
        self.defences = defences
        self.max_connections = max_connections
        self.per_client: dict[str, int] = {}
        self.open = 0
        self.peak = 0
        self.refused = 0
        self.evicted = 0
        # connections waiting for a request's headers, oldest first: the ones to evict
        self.waiting: OrderedDict[GuardedBase, None] = OrderedDict()
        self._trim = _malloc_trim()
        self._trimming: asyncio.TimerHandle | None = None

    def admit(self, conn: GuardedBase, client: str) -> bytes | None:
        """Count ``conn`` in, or the answer to close it with."""
        cap = self.defences.client_connections
        if cap and self.per_client.get(client, 0) >= cap:
            self.refused += 1
            error = RateLimitedError(
                f"{client} holds {cap} connections to this hub already, the most one client may "
                "(--client-connections); reuse connections or open fewer at once",
                retry_after=1.0,
            )
            return _answer(429, "Too Many Requests", error, {"retry-after": "1"})
        if self.max_connections and self.open >= self.max_connections:
            if not self.waiting:
                self.refused += 1
                full = CapacityError(
                    f"this hub holds {self.open} connections, its most (--max-connections), "
                    "each of them busy with a request; retry in a moment"
                )
                return _answer(503, "Service Unavailable", full, {"retry-after": "1"})
            oldest, _ = self.waiting.popitem(last=False)
            self.evicted += 1
            oldest.drop()
        self.per_client[client] = self.per_client.get(client, 0) + 1
        self.open += 1
        if self.open > self.peak:
            self.peak = self.open
        self.waiting[conn] = None
        return None

    def release(self, conn: GuardedBase, client: str) -> None:
        """``conn`` closed."""
        self.waiting.pop(conn, None)
        left = self.per_client.get(client, 0) - 1
        if left > 0:
            self.per_client[client] = left
        else:
            self.per_client.pop(client, None)
        self.open -= 1
        if self.peak >= TRIM_AFTER and self.open <= self.peak // 4:
            log.info(
                "%d connections of a peak of %d are gone; giving freed memory back",
                self.peak - self.open,
                self.peak,
            )
            self.peak = self.open
            if self._trimming is None:  # once the wave of closes has passed
                loop = asyncio.get_running_loop()
                self._trimming = loop.call_later(TRIM_DELAY, self._give_back)

    def _give_back(self) -> None:
        self._trimming = None
        # dicts never shrink their tables by themselves: copies sized for what is left
        self.per_client = dict(self.per_client)
        self.waiting = OrderedDict(self.waiting)
        gc.collect()  # the closed connections' cycles, before the heap is trimmed
        if self._trim is not None:
            self._trim(0)  # give the heap an attack grew back to the system

    def stats(self) -> dict[str, int]:
        """What the gate holds now and has done: ``open`` connections, ``clients`` holding
        them, connections ``waiting`` for a request's headers, and since the start
        connections ``refused`` and ``evicted``.

            >>> from envhub.defences import Defences
            >>> ConnectionGate(Defences(), 16).stats()
            {'open': 0, 'clients': 0, 'waiting': 0, 'refused': 0, 'evicted': 0}
        """
        return {
            "open": self.open,
            "clients": len(self.per_client),
            "waiting": len(self.waiting),
            "refused": self.refused,
            "evicted": self.evicted,
        }

    def busy(self, conn: GuardedBase) -> None:
        """``conn``'s request has its headers: it is no longer evictable."""
        self.waiting.pop(conn, None)

    def idle(self, conn: GuardedBase) -> None:
        """``conn`` answered and waits for the next request (the newest to evict)."""
        self.waiting[conn] = None
        self.waiting.move_to_end(conn)


def _discard_received(transport: asyncio.Transport, most: int = 1 << 16) -> None:
    """Read and drop what the peer sent already (at most ``most`` bytes): a socket closed with
    unread bytes sends a reset, and the peer's kernel drops the answer written before it."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    taken = 0
    with contextlib.suppress(OSError):  # BlockingIOError: nothing (more) to read
        while taken < most:
            chunk = os.read(sock.fileno(), most - taken)
            if not chunk:
                return
            taken += len(chunk)


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None elsewhere."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


class GuardedBase(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and the gate (see the module);
    :func:`guarded_protocol` binds it to one gate."""

    gate: ConnectionGate

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._client = client_key(self.client[0] if self.client else None)
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False
        refusal = self.gate.admit(self, self._client)
        if refusal is not None:
            _discard_received(transport)  # unread bytes at close would reset the answer away
            transport.write(refusal)
            transport.close()
            return
        self._admitted = True
        self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._admitted:
            self._admitted = False
            self.gate.release(self, self._client)
        super().connection_lost(exc)

    # -- the deadlines -------------------------------------------------------------------------
    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wait_for_headers(self) -> None:
        self._stop_timer()
        self._timer = self.loop.call_later(self.gate.defences.header_timeout, self._headers_late)

    def _wait_for_body(self) -> None:
        self._stop_timer()
        self._timer = self.loop.call_later(self.gate.defences.body_timeout, self._body_late)

    def _headers_late(self) -> None:
        self._timer = None
        self._time_out(
            f"the request's headers did not arrive within "
            f"{self.gate.defences.header_timeout:g} s (--header-timeout); send the whole "
            "request at once"
        )

    def _body_late(self) -> None:
        self._timer = None
        if self.flow is not None and self.flow.read_paused:
            self._wait_for_body()  # the app has not taken what came: the client is not late
            return
        self._time_out(
            f"the request's body paused for more than {self.gate.defences.body_timeout:g} s "
            "(--body-timeout); send it without pauses"
        )

    def _time_out(self, message: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        started = self.cycle is not None and self.cycle.response_started
        if not started:  # nobody answered yet: say why the connection ends
            error = AEnvTimeoutError(message)
            self.transport.write(_answer(408, "Request Timeout", error, {}))
        self.transport.close()

    def drop(self) -> None:
        """Close this connection, waiting for its headers, to make room for a new one."""
        self._stop_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- no WebSocket ----------------------------------------------------------------------
    def _should_upgrade_to_ws(self) -> bool:
        # the hub serves no WebSocket; an upgraded connection would leave this protocol (and
        # its place in the gate) behind: an upgrade request is answered as plain HTTP
        return False

    def _unsupported_upgrade_warning(self) -> None:
        pass  # not a line per request an attacker sends

    # -- uvicorn's parser callbacks --------------------------------------------------------
    def on_headers_complete(self) -> None:
        self._stop_timer()
        self.gate.busy(self)
        # the peer as the gate counts it, for the app: uvicorn's proxy headers middleware
        # rewrites ``client`` from X-Forwarded-For, which a client on loopback may send
        cast(dict[str, Any], self.scope)[PEER] = self._client
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.more_body:
            self._wait_for_body()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self.cycle is not None and not self.cycle.response_complete:
            self._wait_for_body()
        # else: answered before its body was read; the next request's deadline runs already

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._wait_for_headers()  # answered already: the next request's deadline
        else:
            self._stop_timer()  # the app works on it: no deadline for the client

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request is parsed already: still busy
        super().on_response_complete()
        if not pipelined and self._admitted and not self.transport.is_closing():
            self.gate.idle(self)
            self._wait_for_headers()


def guarded_protocol(gate: ConnectionGate) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn (``Config(http=...)``), bound to ``gate``."""
    return type("GuardedHttpProtocol", (GuardedBase,), {"gate": gate})
