"""A lean HTTP/1.1 keep-alive client over asyncio for one origin: how the SDK reaches a runtime.

aiohttp spends ~0.1-0.2 ms of CPU per request on request and response objects, header
multidicts, its stream reader and timers; this client spends a few tens of microseconds. A
request is one pre-built ``bytes`` write (the request line and fixed headers are built once per
method and path); a response is parsed with a handful of ``bytes`` operations on the
:class:`asyncio.Protocol`'s buffer, and resolves one future. What it covers:

- keep-alive connections in a small last-in-first-out pool; a connection the server closed
  while idle is dropped, never reused; a connection in an unknown state (timeout, cancellation,
  stray bytes after a response) is aborted;
- responses with ``Content-Length``, ``Transfer-Encoding: chunked`` or a body that ends when the
  server closes; ``Connection: close`` honoured; HTTP/1.0 answers; interim 1xx answers skipped;
- one timeout covering connect, send and the whole response; ``https`` through asyncio's TLS;
- at most ``max_body`` bytes of a body (default :data:`aenv_ray.protocol.MAX_RESPONSE_BYTES`): a
  ``Content-Length`` over it, or a chunked or close-delimited body that grows past it, fails
  with :class:`ResponseTooLarge` as soon as that is known, and the connection is dropped;
- an idempotent request (``GET``, ``HEAD``) whose reused connection closes before any byte of
  the answer is sent once more on a fresh connection (the server dropped an idle connection);
- connections opened ahead (:func:`preconnect`): an engine that knows which server a caller
  will use next (a warm pod it reserved) opens a connection to it and sees it answer; the
  first client of that origin on that event loop takes it instead of connecting.

Not covered, on purpose: redirects, proxies, cookies, compression, pipelining. Failures raise
this module's :class:`WireError` subclasses (or :class:`TimeoutError`) for the caller to
translate into its own error types.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import weakref
from typing import Any
from urllib.parse import quote, urlsplit

from aenv_ray.protocol import MAX_RESPONSE_BYTES

__all__ = [
    "MAX_BODY",
    "BadResponse",
    "ConnectFailed",
    "Disconnected",
    "ResponseTooLarge",
    "WireClient",
    "WireError",
    "discard_preconnected",
    "preconnect",
]

MAX_HEAD = 64 * 1024
"""Bytes the status line and headers of a response may take."""
MAX_BODY = MAX_RESPONSE_BYTES
"""Bytes a response body may take, unless a client says otherwise (``max_body=``)."""

_IDEMPOTENT = frozenset({"GET", "HEAD"})
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _IDLE = range(5)
_HEX = frozenset(b"0123456789abcdefABCDEF")
_HEADS_KEPT = 64  # distinct response heads remembered per client, parsed
_SMALL = 16 * 1024  # bodies up to this size are joined to the head: one write, one syscall
SHELF_SECONDS = 600.0
"""How long a connection opened ahead (:func:`preconnect`) waits for a client (the runtime
keeps an idle connection for an hour)."""
_SHELF_PER_ORIGIN = 4
_Origin = tuple[bool, str, int]  # (TLS, host, port)
_shelves: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Origin, list[Any]]] = (
    weakref.WeakKeyDictionary()
)


class WireError(Exception):
    """Base of the client's failures (a timeout is a plain :class:`TimeoutError`)."""


class ConnectFailed(WireError):
    """No connection could be made: refused, unreachable, unknown host, TLS handshake."""


class Disconnected(WireError):
    """The connection closed before a whole response arrived.

    ``received``: some bytes of the response had arrived; ``reused``: the connection had
    served an earlier request (so the server may have dropped it while idle).
    """

    def __init__(self, message: str, *, received: bool, reused: bool) -> None:
        super().__init__(message)
        self.received = received
        self.reused = reused


class BadResponse(WireError):
    """The bytes that came back are not an HTTP/1.x response."""


class ResponseTooLarge(BadResponse):
    """The response's body is over the client's ``max_body``: not read further.

    ``size``: what its ``Content-Length`` announced (None: it grew past the limit)."""

    def __init__(self, message: str, *, size: int | None, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


def _too_large(limit: int, size: int | None = None) -> ResponseTooLarge:
    told = f"of {size} bytes" if size is not None else "growing"
    return ResponseTooLarge(
        f"a response body {told}, over the limit of {limit} bytes", size=size, limit=limit
    )


def _expire(waiter: asyncio.Future[tuple[int, bytes]], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no whole answer within {timeout:g} s"))


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; serves one request at a time."""

    def __init__(
        self, heads: dict[bytes, tuple[int, bool, int, int]], max_body: int = MAX_BODY
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self._heads = heads  # parsed heads, shared by a client's connections
        self._max_body = max_body
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._buf = bytearray()
        self._state = _IDLE
        self._pos = 0  # where parsing resumes in the buffer
        self._end = 0  # end of a Content-Length body in the buffer
        self._status = 0
        self._keep = True
        self._no_body = False
        self._chunks: list[bytes] = []
        self._size = 0

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio hands a stream protocol a Transport; typeshed's signature says BaseTransport
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if self._state == _UNTIL_CLOSE:
            body = bytes(self._buf[self._pos :])
            if len(body) > self._max_body:
                waiter.set_exception(_too_large(self._max_body))
            else:
                waiter.set_result((self._status, body))
            return
        received = bool(self._buf) or self._state != _HEAD
        reason = f": {exc}" if exc else ""
        where = "before answering" if not received else "in the middle of its answer"
        waiter.set_exception(
            Disconnected(
                f"the server closed the connection {where}{reason}",
                received=received,
                reused=self.reused,
            )
        )

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost finishes or fails the request

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: this connection is out of step
            self.abort()
            return
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        try:
            done = self._advance(buf)
        except BadResponse as exc:
            self._fail(exc)
            return
        if not done and buf is data:
            self._buf = bytearray(data)

    # -- requests ------------------------------------------------------------------------------
    def send(
        self,
        data: bytes,
        body: bytes | None,
        waiter: asyncio.Future[tuple[int, bytes]],
        *,
        no_body: bool,
    ) -> None:
        """Write a request (``body`` separately when it is large) and resolve ``waiter`` with
        ``(status, body)`` once its whole response is in."""
        assert self.transport is not None
        self._waiter = waiter
        self._state = _HEAD
        self._pos = 0
        self._no_body = no_body
        self.transport.write(data)
        if body is not None:
            self.transport.write(body)

    def abort(self) -> None:
        """Close at once, without waiting for buffered writes (the state is unknown)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()

    def _finish(self, body: bytes, extra: bool) -> None:
        waiter, self._waiter = self._waiter, None
        self._state = _IDLE
        if self._buf:
            self._buf = bytearray()
        self.reused = True
        if extra or not self._keep:
            self.closed = True
            assert self.transport is not None
            self.transport.close()
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))

    # -- parsing -------------------------------------------------------------------------------
    def _advance(self, buf: bytes | bytearray) -> bool:
        """Parse what ``buf`` holds; True once the response is complete (and delivered)."""
        if self._state == _HEAD:
            while True:
                pos = self._pos
                if len(buf) - pos >= 5 and buf[pos : pos + 5] != b"HTTP/":
                    raise BadResponse(f"not an HTTP answer: {bytes(buf[pos : pos + 80])!r}")
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if len(buf) - pos > MAX_HEAD:
                        raise BadResponse(f"no end of the headers within {MAX_HEAD} bytes")
                    return False
                self._head(bytes(buf[pos:end]), end + 4)
                if self._state != _HEAD:  # not an interim 1xx answer
                    break
        state = self._state
        if state == _LENGTH:
            if len(buf) < self._end:
                return False
            self._finish(bytes(buf[self._pos : self._end]), len(buf) > self._end)
            return True
        if state == _CHUNKED:
            return self._chunked(buf)
        if len(buf) - self._pos > self._max_body:  # _UNTIL_CLOSE
            raise _too_large(self._max_body)
        return False

    def _head(self, head: bytes, body_at: int) -> None:
        parsed = self._heads.get(head)
        if parsed is None:  # a server sends the same few heads again and again
            parsed = _parse_head(head)
            if len(self._heads) < _HEADS_KEPT:
                self._heads[head] = parsed
        status, keep, framing, length = parsed
        self._status = status
        self._pos = body_at
        if 100 <= status < 200 and status != 101:
            return  # interim answer: the real one follows; state stays _HEAD
        self._keep = keep
        if self._no_body or status in (101, 204, 304):
            self._state, self._end = _LENGTH, body_at
        elif framing == _CHUNKED:
            self._state, self._chunks, self._size = _CHUNKED, [], 0
        elif framing == _LENGTH:
            if length > self._max_body:
                raise _too_large(self._max_body, length)
            self._state, self._end = _LENGTH, body_at + length
        else:
            self._state, self._keep = _UNTIL_CLOSE, False

    def _chunked(self, buf: bytes | bytearray) -> bool:
        pos = self._pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if len(buf) - pos > 4096:
                    raise BadResponse("a chunk size line over 4096 bytes")
                break
            field = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
            if not field or not _HEX.issuperset(field):
                raise BadResponse(f"a bad chunk size: {field[:40]!r}")
            size = int(field, 16)
            if self._size + size > self._max_body:  # refused before the chunk is buffered
                raise _too_large(self._max_body)
            if size == 0:  # last chunk, then trailer lines up to an empty one
                line = eol + 2
                while True:
                    nl = buf.find(b"\r\n", line)
                    if nl < 0:
                        if len(buf) - line > MAX_HEAD:
                            raise BadResponse(f"trailers over {MAX_HEAD} bytes")
                        self._pos = pos
                        return False
                    if nl == line:
                        self._finish(b"".join(self._chunks), len(buf) > nl + 2)
                        return True
                    line = nl + 2
            start, stop = eol + 2, eol + 2 + size
            if len(buf) < stop + 2:
                break
            if buf[stop : stop + 2] != b"\r\n":
                raise BadResponse("a chunk not followed by CRLF")
            self._size += size
            self._chunks.append(bytes(buf[start:stop]))
            pos = stop + 2
        self._pos = pos
        return False


def _parse_head(head: bytes) -> tuple[int, bool, int, int]:
    """``(status, keep-alive, framing, length)`` of a response head (status line and headers,
    without the final CRLF CRLF); framing is ``_LENGTH`` (``length`` bytes), ``_CHUNKED`` or
    ``_UNTIL_CLOSE``."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if (
        version not in (b"HTTP/1.1", b"HTTP/1.0")
        or len(code) != 3
        or not code.isdigit()
        or rest[3:4] not in (b"", b" ")
    ):
        raise BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    keep = version == b"HTTP/1.1"
    length: int | None = None
    coded: bytes | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in b" \t":
            raise BadResponse(f"a malformed header line: {line[:80]!r}")
        name = name.lower()
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or (length is not None and int(value) != length):
                raise BadResponse(f"a bad Content-Length: {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            coded = value.strip().lower()
        elif name == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            if b"close" in tokens:
                keep = False
            elif b"keep-alive" in tokens:
                keep = True
    if coded is not None:  # Transfer-Encoding wins over Content-Length
        if coded.rsplit(b",", 1)[-1].strip() == b"chunked":
            return int(code), keep, _CHUNKED, 0
        return int(code), False, _UNTIL_CLOSE, 0
    if length is not None:
        return int(code), keep, _LENGTH, length
    return int(code), False, _UNTIL_CLOSE, 0


class WireClient:
    """HTTP/1.1 requests to one origin (``http://host:port`` or ``https://...``) over a pool
    of keep-alive connections, opened as needed and kept up to ``max_idle`` while idle.

    Bound to the event loop that first uses it; on another loop it starts a fresh pool.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        headers: dict[str, str] | None = None,
        keepalive: float = 60.0,
        max_idle: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        max_body: int = MAX_BODY,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.max_idle = max_idle
        self.max_body = max_body
        self._ssl = (
            (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        )
        self._prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self._ssl else 80
        authority = host if self.port == default else f"{host}:{self.port}"
        fixed = {"Host": authority, **(headers or {})}
        _check_headers(fixed)
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._lines: dict[tuple[str, str], bytes] = {}
        self._heads: dict[bytes, tuple[int, bool, int, int]] = {}
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._connecting: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._ended = ""  # why the server is gone for good (:meth:`end`), "" while it may answer

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Send one request; return ``(status, body)`` of its response.

        Raises :class:`ConnectFailed`, :class:`Disconnected`, :class:`BadResponse`, or
        :class:`TimeoutError` when connecting, sending and receiving took over ``timeout`` s.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._rebind(loop)
        if self._ended:
            raise Disconnected(self._ended, received=False, reused=False)
        deadline = loop.time() + timeout
        data, rest = self._build(method, path, body, headers)
        fresh = False
        while True:
            conn = None if fresh else self._take_idle(loop.time())
            if conn is None:
                conn = await self._connect(loop, deadline, timeout)
            waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
            timer = loop.call_at(deadline, _expire, waiter, timeout)
            self._busy.add(conn)
            try:
                conn.send(data, rest, waiter, no_body=method == "HEAD")
                answer = await waiter
            except Disconnected as exc:
                if exc.received or not exc.reused or method not in _IDEMPOTENT or fresh:
                    raise
                fresh = True  # the server dropped an idle connection: once more, on a new one
                continue
            except BaseException:
                conn.abort()  # timed out or cancelled mid-request: never reuse it
                raise
            finally:
                timer.cancel()
                self._busy.discard(conn)
            if not conn.closed:
                self._put_idle(conn, loop.time())
            return answer

    async def aclose(self) -> None:
        """Close every connection; requests in flight fail with :class:`Disconnected`."""
        self._closed = True
        for conn in (*self._idle, *self._busy):
            conn.abort()
        self._idle.clear()
        self._busy.clear()

    def end(self, reason: str) -> None:
        """The server is gone for good (someone who knows said so, e.g. an engine that saw its
        pod deleted): every request in flight, connecting or waiting for its answer, and every
        later one fails at once with :class:`Disconnected` saying ``reason``. On a real network
        a vanished address does not refuse, it stays silent: without this a request would wait
        for its whole timeout. Call it on the client's loop."""
        self._ended = reason
        for future in self._connecting:
            future.cancel()
        for conn in (*self._idle, *self._busy):
            conn.abort()  # the request waiting on it fails with Disconnected
        self._idle.clear()

    # -- connections ---------------------------------------------------------------------------
    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        for conn in self._idle:  # they belong to the previous loop, which may be closed
            with contextlib.suppress(RuntimeError):
                conn.abort()
        self._idle.clear()
        self._loop = loop

    def _take_idle(self, now: float) -> _Connection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive:
                return conn
            conn.abort()
        return None

    def _put_idle(self, conn: _Connection, now: float) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = now
        self._idle.append(conn)

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, deadline: float, timeout: float
    ) -> _Connection:
        ahead = _unshelve(loop, (self._ssl is not None, self.host, self.port))
        if ahead is not None and not self._closed:
            ahead._heads = self._heads
            ahead._max_body = self.max_body
            return ahead
        left = deadline - loop.time()
        limit = min(self.connect_timeout, left)
        if limit <= 0:
            raise TimeoutError(f"no whole answer within {timeout:g} s")
        # a task of its own, so that end() can stop it without cancelling the caller
        connecting = asyncio.ensure_future(
            loop.create_connection(
                lambda: _Connection(self._heads, self.max_body),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl else None,
            )
        )
        self._connecting.add(connecting)
        try:
            async with asyncio.timeout(limit):
                _, conn = await connecting
        except TimeoutError:
            raise TimeoutError(
                f"connecting to {self.host}:{self.port} took over {limit:g} s"
            ) from None
        except OSError as exc:  # refused, unreachable, unknown host, TLS (ssl.SSLError)
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._ended and connecting.cancelled() and not (task and task.cancelling()):
                raise Disconnected(self._ended, received=False, reused=False) from None
            raise
        finally:
            self._connecting.discard(connecting)
        if self._closed:
            conn.abort()
            raise Disconnected("the client was closed", received=False, reused=False)
        return conn

    # -- requests ------------------------------------------------------------------------------
    def _build(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> tuple[bytes, bytes | None]:
        """The request's bytes: head (with the body when small) and the body when large."""
        key = (method, path)
        line = self._lines.get(key)
        if line is None:
            target = quote(self._prefix + path, safe="/%:@!$&'()*+,;=~?")
            line = f"{method} {target} HTTP/1.1\r\n{self._fixed}".encode("latin-1")
            if len(self._lines) < 1024:
                self._lines[key] = line
        if headers:
            _check_headers(headers)
            line += "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        if body is None:
            if method in _IDEMPOTENT:
                return line + b"\r\n", None
            return line + b"Content-Length: 0\r\n\r\n", None
        head = line + b"Content-Length: %d\r\n\r\n" % len(body)
        if len(body) <= _SMALL:
            return head + body, None
        return head, body


async def preconnect(
    base_url: str, path: str, *, headers: dict[str, str] | None = None, timeout: float = 2.0
) -> bool:
    """Open a connection to ``base_url``'s origin, send ``GET path`` on it and, if it answers
    200, keep it for the next :class:`WireClient` of that origin on the running loop (for up to
    :data:`SHELF_SECONDS`): that client's first request then costs no connect. True when a
    connection was kept; False (nothing kept) when the server did not answer 200 in time.

    The caller's knowledge that the origin will be used soon is what makes this worth it; an
    origin that goes away takes its kept connections with it (:func:`discard_preconnected`)."""
    client = WireClient(base_url, connect_timeout=timeout, headers=headers, max_idle=1)
    loop = asyncio.get_running_loop()
    try:
        status, _ = await client.request("GET", path, timeout=timeout)
    except (WireError, TimeoutError, OSError):
        await client.aclose()
        return False
    conn_kept = client._take_idle(loop.time())
    await client.aclose()
    if status != 200 or conn_kept is None:
        if conn_kept is not None:
            conn_kept.abort()
        return False
    conn_kept.idle_since = loop.time()
    shelf = _shelves.setdefault(loop, {}).setdefault(
        (client._ssl is not None, client.host, client.port), []
    )
    shelf.append(conn_kept)
    while len(shelf) > _SHELF_PER_ORIGIN:
        shelf.pop(0).abort()
    return True


def discard_preconnected(base_url: str) -> int:
    """Close the connections kept for ``base_url``'s origin on the running loop (its server is
    gone, or will not be used); how many were closed."""
    parts = urlsplit(base_url)
    tls = parts.scheme == "https"
    origin = (tls, parts.hostname or "", parts.port or (443 if tls else 80))
    shelf = _shelves.get(asyncio.get_running_loop(), {}).pop(origin, [])
    for conn in shelf:
        conn.abort()
    return len(shelf)


def _unshelve(loop: asyncio.AbstractEventLoop, origin: _Origin) -> _Connection | None:
    shelves = _shelves.get(loop)
    shelf = shelves.get(origin) if shelves else None
    while shelf:
        conn: _Connection = shelf.pop()
        if not conn.closed and loop.time() - conn.idle_since < SHELF_SECONDS:
            return conn
        conn.abort()
    if shelves and origin in shelves and not shelf:
        del shelves[origin]
    return None


def _check_headers(headers: dict[str, str]) -> None:
    for name, value in headers.items():
        if not name or any(c in name for c in ":\r\n ") or "\r" in value or "\n" in value:
            raise ValueError(f"a header that cannot be sent: {name!r}: {value!r}")
