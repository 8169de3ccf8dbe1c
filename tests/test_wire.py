"""The SDK's lean HTTP/1.1 client (``aenv_ray._wire``) against a real runtime and against a tiny
raw-socket server started in each test that answers, or misbehaves, byte by byte.

Every case either works or raises the typed ``aenv_ray.errors`` exception the SDK promises.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import orjson
import pytest

from aenv_ray import Environment
from aenv_ray._transport import InstanceClient
from aenv_ray._wire import (
    MAX_HEAD,
    BadResponse,
    Disconnected,
    ResponseTooLarge,
    WireClient,
    discard_preconnected,
    preconnect,
)
from aenv_ray.errors import (
    CallTimeoutError,
    InstanceBrokenError,
    InstanceClosedError,
    InstanceUnreachableError,
    ProtocolError,
    ResponseTooLargeError,
)
from aenv_ray.protocol import MAX_RESPONSE_BYTES
from aenv_ray.testing import RuntimeProcess, free_port

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
Script = Callable[[Reader, Writer, int, bytes], Awaitable[None]]
"""``(reader, writer, n, request)``: answer the ``n``-th request (from 0) on the server."""

OK_JSON = b'{"ok":true}'


class RawServer:
    """A loopback TCP server that reads HTTP requests and lets a script write the answer."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                n = len(self.requests)
                self.requests.append(head + body)
                await self.script(reader, writer, n, head + body)
                if writer.is_closing():
                    return
        finally:
            writer.close()


def json_answer(body: bytes = OK_JSON, *extra: bytes) -> bytes:
    headers = b"".join(h + b"\r\n" for h in extra)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + headers
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


async def _ok(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
    writer.write(json_answer())
    await writer.drain()


@contextlib.asynccontextmanager
async def client_for(
    script: Script, *, reconnect_window: float = 0.2
) -> AsyncIterator[tuple[InstanceClient, RawServer]]:
    async with RawServer(script) as server:
        client = InstanceClient(
            server.url,
            connect_timeout=2.0,
            reconnect_window=reconnect_window,
            env_name="raw@1",
            instance_id="i-1",
        )
        try:
            yield client, server
        finally:
            await client.aclose()


# -- a real runtime ----------------------------------------------------------------------------
async def test_the_sdk_reuses_one_connection_against_a_runtime(
    probe_runtime: RuntimeProcess,
) -> None:
    async with probe_runtime.environment() as env:
        for i in range(20):
            result = await env.call_tool("echo", {"text": f"hi {i}"})
            assert result.text == f"hi {i}"
        assert await env.call_function("add", {"a": 2}) == 3
        assert (await env.check_health())["status"] == "healthy"
        wire = env._client._wire  # type: ignore[union-attr]
        assert wire is not None
        assert len(wire._idle) == 1  # sequential calls: one keep-alive connection, reused


async def test_concurrent_calls_open_connections_and_keep_them(
    probe_runtime: RuntimeProcess,
) -> None:
    async with probe_runtime.environment() as env:
        texts = [f"t{i}" for i in range(32)]
        results = await asyncio.gather(*(env.call_tool("async_echo", {"text": t}) for t in texts))
        assert [r.text for r in results] == texts
        wire = env._client._wire  # type: ignore[union-attr]
        assert wire is not None
        opened = len(wire._idle)
        assert 1 <= opened <= 32
        await asyncio.gather(*(env.call_tool("async_echo", {"text": t}) for t in texts))
        assert len(wire._idle) <= 32


async def test_a_body_near_the_protocols_limit_goes_and_comes_back(
    probe_runtime: RuntimeProcess,
) -> None:
    text = "x" * (60 * 1024 * 1024)  # the runtime refuses request bodies over 64 MiB
    async with probe_runtime.environment() as env:
        result = await env.call_tool("echo", {"text": text}, timeout=60)
        assert not result.is_error
        assert result.text == text


async def test_a_body_over_the_limit_is_the_runtimes_413_not_a_transport_error(
    probe_runtime: RuntimeProcess,
) -> None:
    wire = WireClient(probe_runtime.url, headers={"Content-Type": "application/json"})
    try:
        body = orjson.dumps({"name": "echo", "arguments": {"text": "x" * (65 * 1024 * 1024)}})
        status, answer = await wire.request("POST", "/aenv/v1/call", body, timeout=60)
        assert status == 413  # RequestTooLargeError, typed (docs/errors.md)
        assert b"RequestTooLargeError" in answer, answer[:400]
        assert b"64" in answer, answer[:400]
    finally:
        await wire.aclose()


async def test_a_killed_runtime_is_broken_and_the_connection_replaced(
    fresh_probe: RuntimeProcess,
) -> None:
    async with fresh_probe.environment() as env:
        assert (await env.call_tool("echo", {"text": "a"})).text == "a"
        fresh_probe.kill()
        await asyncio.sleep(0.2)
        with pytest.raises(InstanceBrokenError, match=r"stopped answering|dropped the connection"):
            await env.call_tool("echo", {"text": "b"})


# -- the raw server: answers the client must read ----------------------------------------------
async def test_chunked_bodies_split_anywhere_with_extensions_and_trailers() -> None:
    payload = orjson.dumps({"text": "y" * 5000, "n": 1})

    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for i in range(0, len(payload), 777):
            part = payload[i : i + 777]
            wire += b"%X;ext=1\r\n" % len(part) + part + b"\r\n"
        wire += b"0\r\nx-trailer: yes\r\n\r\n"
        step = 1 if n == 0 else 4096  # the first answer one byte per write
        for i in range(0, len(wire), step):
            writer.write(wire[i : i + step])
            await writer.drain()

    async with client_for(script) as (client, server):
        for _ in range(2):
            status, data = await client.request("GET", "/x", timeout=10)
            assert (status, data) == (200, orjson.loads(payload))
        assert server.connections == 1  # kept alive after a chunked answer


async def test_content_length_bodies_arrive_in_pieces() -> None:
    body = orjson.dumps(list(range(20000)))

    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        answer = json_answer(body)
        for i in range(0, len(answer), 1000):
            writer.write(answer[i : i + 1000])
            await writer.drain()
            await asyncio.sleep(0)

    async with client_for(script) as (client, server):
        status, data = await client.request("POST", "/x", {"a": 1}, timeout=10)
        assert (status, data) == (200, list(range(20000)))
        assert server.requests[0].startswith(b"POST /x HTTP/1.1\r\n")
        assert server.requests[0].endswith(b'{"a":1}')


async def test_connection_close_is_honoured_and_a_new_connection_used() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer(OK_JSON, b"Connection: close"))
        await writer.drain()
        await asyncio.sleep(0.05)  # the client must not wait for this close
        writer.close()

    async with client_for(script) as (client, server):
        for _ in range(3):
            assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        assert server.connections == 3


async def test_http_10_and_bodies_that_end_when_the_server_closes() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        version = b"HTTP/1.0" if n % 2 == 0 else b"HTTP/1.1"
        writer.write(version + b" 200 OK\r\nContent-Type: application/json\r\n\r\n" + OK_JSON)
        await writer.drain()
        writer.close()

    async with client_for(script) as (client, server):
        for _ in range(2):
            assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        assert server.connections == 2


async def test_interim_answers_are_skipped_and_no_body_statuses_have_none() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        if n == 0:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + json_answer())
        else:
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    async with client_for(script) as (client, server):
        assert await client.request("POST", "/x", {}, timeout=5) == (200, {"ok": True})
        assert await client.request("POST", "/x", {}, timeout=5) == (204, None)
        assert server.connections == 1


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer())
        await writer.drain()
        writer.close()  # keep-alive promised, then closed while idle

    async with client_for(script) as (client, server):
        assert await client.request("POST", "/x", {}, timeout=5) == (200, {"ok": True})
        await asyncio.sleep(0.1)  # the close reaches the client
        assert await client.request("POST", "/x", {}, timeout=5) == (200, {"ok": True})
        assert server.connections == 2


async def test_a_connection_opened_ahead_serves_the_first_request_of_the_next_client() -> None:
    async with client_for(_ok) as (client, server):
        assert await preconnect(server.url, "/ready")
        assert server.connections == 1
        assert await client.request("POST", "/call", {}, timeout=5) == (200, {"ok": True})
        assert server.connections == 1  # the first call went on the connection opened ahead
        assert [r.split(b" ")[1] for r in server.requests] == [b"/ready", b"/call"]
        other = InstanceClient(
            server.url, connect_timeout=2.0, reconnect_window=0.2, env_name="raw@1"
        )
        try:  # it was handed to one client only: the next one connects
            assert await other.request("GET", "/x", timeout=5) == (200, {"ok": True})
            assert server.connections == 2
        finally:
            await other.aclose()


async def test_a_connection_opened_ahead_is_kept_only_if_it_answered_200_and_stays_open() -> None:
    async def not_ready(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(b"HTTP/1.1 503 Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    async with client_for(not_ready) as (client, server):
        assert not await preconnect(server.url, "/ready")
        assert server.connections == 1
        assert await client.request("GET", "/x", timeout=5) == (503, None)
        assert server.connections == 2  # nothing was kept: the client connected itself

    async with client_for(_ok) as (client, server):  # discarded: its server is gone
        assert await preconnect(server.url, "/ready")
        assert discard_preconnected(server.url) == 1
        assert discard_preconnected(server.url) == 0
        assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        assert server.connections == 2

    async def closes(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer())
        await writer.drain()
        if n == 0:
            writer.close()  # keep-alive promised, then closed while kept

    async with client_for(closes) as (client, server):
        assert await preconnect(server.url, "/ready")
        await asyncio.sleep(0.1)  # the close reaches the kept connection
        assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        assert server.connections == 2

    assert not await preconnect(f"http://127.0.0.1:{free_port()}", "/ready", timeout=1.0)


async def test_a_reused_connection_dropped_before_answering_retries_reads_only() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        if n in (1, 3):  # the second request on a connection: dropped unanswered
            writer.close()
            return
        writer.write(json_answer())
        await writer.drain()

    async with client_for(script) as (client, server):
        assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        # a read is sent once more on a fresh connection
        assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        assert server.connections == 2
        # a call may have run: never repeated
        with pytest.raises(InstanceBrokenError, match="dropped the connection during POST /x"):
            await client.request("POST", "/x", {}, timeout=5)
        assert len(server.requests) == 4


# -- the raw server: misbehaviour, each a typed error ------------------------------------------
async def test_a_close_in_the_middle_of_an_answer_is_a_broken_instance() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer(b'{"content": [1, 2, 3]}')[:-5])
        await writer.drain()
        writer.close()

    async with client_for(script) as (client, _):
        with pytest.raises(InstanceBrokenError) as caught:
            await client.request("POST", "/aenv/v1/call", {}, timeout=5)
    message = str(caught.value)
    assert "dropped the connection during POST /aenv/v1/call" in message
    assert "in the middle of its answer" in message
    assert caught.value.instance_id == "i-1"
    assert isinstance(caught.value.__cause__, Disconnected)


async def test_a_close_in_the_middle_of_a_chunked_answer_is_a_broken_instance() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":')
        await writer.drain()
        writer.close()

    async with client_for(script) as (client, _):
        with pytest.raises(InstanceBrokenError, match="dropped the connection"):
            await client.request("GET", "/x", timeout=5)


async def test_a_close_before_any_answer_is_a_broken_instance() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.close()

    async with client_for(script) as (client, _):
        with pytest.raises(InstanceBrokenError, match="before answering"):
            await client.request("POST", "/x", {}, timeout=5)


async def test_headers_slower_than_the_timeout_are_a_call_timeout() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: appl")
            await writer.drain()
            await asyncio.sleep(30)
        writer.write(json_answer())
        await writer.drain()

    async with client_for(script) as (client, server):
        with pytest.raises(CallTimeoutError, match=r"did not answer GET /slow within 0.3 s") as c:
            await client.request("GET", "/slow", timeout=0.3)
        assert c.value.timeout == 0.3
        # the timed-out connection is never reused: the next call gets a fresh one
        assert await client.request("GET", "/x", timeout=5) == (200, {"ok": True})
        assert server.connections == 2


async def test_a_body_slower_than_the_timeout_is_a_call_timeout() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(30)

    async with client_for(script) as (client, _):
        with pytest.raises(CallTimeoutError):
            await client.request("POST", "/x", {}, timeout=0.3)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer"),
        (b"HTTP/2 200\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 OK 200\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -4\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n", "not followed"),
        (b"HTTP/1.1 200 OK\r\nx: " + b"a" * (MAX_HEAD + 10), "no end of the headers"),
    ],
    ids=[
        "ssh",
        "http2",
        "swapped",
        "header",
        "length",
        "two-lengths",
        "chunk-size",
        "chunk-crlf",
        "huge-head",
    ],
)
async def test_garbage_answers_are_protocol_errors(answer: bytes, why: str) -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(5)  # the client must not wait for more

    async with client_for(script) as (client, _):
        with pytest.raises(ProtocolError, match=why) as caught:
            await client.request("GET", "/x", timeout=3)
    assert "is this an aenv-ray runtime?" in str(caught.value)
    assert isinstance(caught.value.__cause__, BadResponse)


async def test_a_body_that_is_not_json_is_a_protocol_error() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer(b"<html>hi</html>"))
        await writer.drain()

    async with client_for(script) as (client, _):
        with pytest.raises(ProtocolError, match="not JSON"):
            await client.request("GET", "/x", timeout=3)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (MAX_RESPONSE_BYTES + 1),
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%X\r\n" % (MAX_RESPONSE_BYTES + 1),
    ],
    ids=["content-length", "chunk-size"],
)
async def test_an_answer_announced_over_the_limit_is_refused_before_its_body(head: bytes) -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(head + b"x" * 1000)
        await writer.drain()
        await asyncio.sleep(5)  # the client must not wait for the body

    async with client_for(script) as (client, _):
        with pytest.raises(ResponseTooLargeError, match="over the limit of") as caught:
            await client.request("GET", "/x", timeout=3)
    assert isinstance(caught.value, ProtocolError)
    assert "stopped reading it" in str(caught.value)
    assert f"{MAX_RESPONSE_BYTES} bytes" in str(caught.value)
    assert caught.value.instance_id == "i-1"


@pytest.mark.parametrize("framing", ["chunked", "until-close"])
async def test_a_body_that_grows_past_the_limit_is_cut_off_not_buffered(framing: str) -> None:
    sent = 0
    piece = b"y" * 65536

    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        nonlocal sent
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        else:
            writer.write(b"HTTP/1.0 200 OK\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while sent < 64 << 20:  # endless, as far as the client can tell
                chunk = b"%X\r\n%s\r\n" % (len(piece), piece) if framing == "chunked" else piece
                writer.write(chunk)
                sent += len(piece)
                await writer.drain()

    async with RawServer(script) as server:
        wire = WireClient(server.url, max_body=1 << 20)
        try:
            with pytest.raises(ResponseTooLarge, match="over the limit of 1048576 bytes"):
                await wire.request("GET", "/x", timeout=10)
        finally:
            await wire.aclose()
    assert sent < 16 << 20  # the client stopped reading soon after the limit


async def test_an_answer_of_exactly_the_limit_is_read() -> None:
    body = b'"' + b"z" * 998 + b'"'

    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer(body))
        await writer.drain()

    async with RawServer(script) as server:
        wire = WireClient(server.url, max_body=len(body))
        try:
            assert await wire.request("GET", "/x", timeout=3) == (200, body)
        finally:
            await wire.aclose()


async def test_stray_bytes_after_an_answer_retire_the_connection() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        writer.write(json_answer() + b"HTTP/1.1 200 OK\r\n")
        await writer.drain()

    async with client_for(script) as (client, server):
        for _ in range(2):
            assert await client.request("GET", "/x", timeout=3) == (200, {"ok": True})
        assert server.connections == 2


async def test_nothing_listening_is_unreachable() -> None:
    client = InstanceClient(
        f"http://127.0.0.1:{free_port()}",
        connect_timeout=1.0,
        reconnect_window=0.1,
        env_name="gone@1",
    )
    with pytest.raises(InstanceUnreachableError, match="nothing answers"):
        await client.request("GET", "/health", timeout=2)
    await client.aclose()
    with pytest.raises(InstanceClosedError):
        await client.request("GET", "/health", timeout=2)


async def test_a_cancelled_call_never_leaves_its_connection_for_reuse() -> None:
    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        if n == 0:
            await asyncio.sleep(0.3)
        writer.write(json_answer(b'{"n": %d}' % n))
        await writer.drain()

    async with client_for(script) as (client, server):
        task = asyncio.ensure_future(client.request("POST", "/x", {}, timeout=5))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # a late answer to the cancelled call must not be taken for this one's
        assert await client.request("POST", "/x", {}, timeout=5) == (200, {"n": 1})
        assert server.connections == 2


async def test_headers_cannot_be_injected() -> None:
    async with client_for(_ok) as (client, server):
        with pytest.raises(ValueError, match="cannot be sent"):
            await client.request("GET", "/x", timeout=3, headers={"x-a": "1\r\nx-b: 2"})
        assert await client.request("GET", "/a b?q=1", timeout=3) == (200, {"ok": True})
        assert server.requests[0].startswith(b"GET /a%20b?q=1 HTTP/1.1\r\n")


async def test_an_environment_attached_to_a_raw_server_reads_its_info() -> None:
    info = orjson.dumps({"ref": "raw@1.0.0", "tools": ["echo"], "timeouts": {}})
    call = orjson.dumps({"content": [{"type": "text", "text": "hi"}], "is_error": False})

    async def script(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        if request.startswith(b"GET /health"):
            writer.write(json_answer(b'{"success": true, "data": {"status": "healthy"}}'))
        elif request.startswith(b"GET /aenv/v1/info"):
            writer.write(json_answer(info))
        else:
            assert request.startswith(b"POST /aenv/v1/call HTTP/1.1\r\n")
            chunked = b"%x\r\n" % len(call) + call + b"\r\n0\r\n\r\n"
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked)
        await writer.drain()

    async with RawServer(script) as server, Environment.attach(server.url) as env:
        assert env.env_name == "raw@1.0.0"
        assert (await env.call_tool("echo", {"text": "hi"})).text == "hi"
        assert server.connections == 1


def test_a_client_moves_to_a_new_event_loop(probe_runtime: RuntimeProcess) -> None:
    client = InstanceClient(probe_runtime.url, connect_timeout=2, reconnect_window=0.2)
    expected = (200, {"success": True, "data": {"status": "healthy"}})
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        health = client.request("GET", "/health", timeout=5)
        assert first.run_until_complete(health) == expected
        # the first loop's connection is closed and a new one opened on the second loop
        assert second.run_until_complete(client.request("GET", "/health", timeout=5)) == expected
        second.run_until_complete(client.aclose())
    finally:
        for loop in (first, second):
            loop.run_until_complete(asyncio.sleep(0.01))  # let closed transports finish
            loop.close()


# -- an instance its engine saw end -------------------------------------------------------------
ENDED = "instance i-1 ended: deleted (its pod was deleted)"


@contextlib.contextmanager
def _unanswered_port() -> Iterator[int]:
    """A loopback port whose listener never accepts, its queue full: the kernel drops further
    SYNs, so a connect hangs as it does towards an address nobody holds any more."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    try:
        for _ in range(4):
            s = socket.socket()
            queued.append(s)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
        yield port
    finally:
        for s in queued:
            s.close()
        listener.close()


async def test_an_ended_instance_fails_the_call_waiting_for_its_answer_at_once() -> None:
    async def silent(reader: Reader, writer: Writer, n: int, request: bytes) -> None:
        received.set()
        await reader.read()  # a pod IP gone silent: never answers, never closes

    received = asyncio.Event()
    async with client_for(silent) as (client, server):
        call = asyncio.create_task(client.request("GET", "/x", timeout=600, max_retries=3))
        await received.wait()
        client.end(ENDED)
        with pytest.raises(InstanceBrokenError, match=r"ended: deleted"):
            await asyncio.wait_for(call, 60)  # a bound for a broken build, not a timing
        # a read is not sent again, and a later call does not even connect
        with pytest.raises(InstanceBrokenError, match=r"ended: deleted"):
            await client.request("POST", "/y", {}, timeout=600)
        assert len(server.requests) == 1
        assert server.connections == 1


async def test_an_ended_instance_fails_a_connect_that_gets_no_answer() -> None:
    with _unanswered_port() as port:
        client = InstanceClient(
            f"http://127.0.0.1:{port}",
            connect_timeout=600,
            reconnect_window=0.2,
            env_name="raw@1",
            instance_id="i-1",
        )
        try:
            call = asyncio.create_task(client.request("POST", "/x", {}, timeout=600))
            await asyncio.sleep(0.3)
            assert not call.done()  # still connecting
            client.end(ENDED)
            with pytest.raises(InstanceBrokenError, match=r"ended: deleted"):
                await asyncio.wait_for(call, 60)  # a bound for a broken build, not a timing
        finally:
            await client.aclose()


async def test_a_call_cancelled_while_connecting_is_cancelled_not_ended() -> None:
    with _unanswered_port() as port:
        wire = WireClient(f"http://127.0.0.1:{port}", connect_timeout=600)
        try:
            call = asyncio.create_task(wire.request("GET", "/x", timeout=600))
            await asyncio.sleep(0.3)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            # a connect timing out is still a timeout (the connect's own task is cancelled too)
            with pytest.raises(TimeoutError, match="connecting to"):
                await WireClient(f"http://127.0.0.1:{port}", connect_timeout=0.2).request(
                    "GET", "/x", timeout=5
                )
        finally:
            await wire.aclose()
