"""The hub under abuse from the network, as an attacker on loopback does it: slowloris (idle
connections with unfinished headers, from many addresses and from one), a trickled request, a
stalled body, a flood of guessed keys. A real ``aenv serve`` whose open files are capped at
:data:`NOFILE` (so the attack is small and quick: 600 slow connections would have taken every
descriptor of the hub before its connection caps, and its keyed calls would have waited until
the attacker let go); every address is a loopback one (127.0.0.0/8 is all loopback on Linux).

The hub's knobs here: headers within :data:`HEADER_TIMEOUT` s, body pauses of
:data:`BODY_TIMEOUT` s, :data:`PER_CLIENT` connections per address, :data:`FAILURES` failed
authentications a minute (per :data:`AUTH_WINDOW` s for the test of their forgetting);
``max_connections`` is picked from the open files limit: 128.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aenv_ray.errors import RateLimitedError, decode_error
from aenv_ray.hub import HubClient
from envhub.defences import FailureThrottle
from tests._hub import HubProcess, eventually, new_key

NOFILE = 512
HEADER_TIMEOUT = 3
BODY_TIMEOUT = 2
PER_CLIENT = 40
FAILURES = 5
AUTH_WINDOW = 4.0  # seconds: forgetful_hub's --auth-window
PARTIAL = b"GET /v1/envs HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"


def abused_hub(data_dir: Path, *, auth_window: float = 60.0) -> tuple[HubProcess, str]:
    """The hub with this module's knobs (not started), and alice's key."""
    proc = HubProcess(
        data_dir,
        nofile=NOFILE,
        extra=[
            "--header-timeout",
            str(HEADER_TIMEOUT),
            "--body-timeout",
            str(BODY_TIMEOUT),
            "--client-connections",
            str(PER_CLIENT),
            "--auth-failures",
            str(FAILURES),
            "--auth-window",
            str(auth_window),
        ],
    )
    return proc, new_key("alice", proc.store)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    proc, key = abused_hub(tmp_path_factory.mktemp("abused"))
    with proc:
        yield proc, key


@pytest.fixture
def forgetful_hub(tmp_path: Path) -> Iterator[tuple[HubProcess, str]]:
    """The same hub, whose clients' failures are forgiven (and forgotten) within
    :data:`AUTH_WINDOW` s of their last one, not a minute."""
    proc, key = abused_hub(tmp_path, auth_window=AUTH_WINDOW)
    with proc:
        yield proc, key


def pid_of(proc: HubProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def keyed(url: str, key: str, source: str, path: str = "/v1/envs") -> tuple[int, Any]:
    """A keyed GET from ``source``; a generous timeout (the hub is loaded in these tests)."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as s,
        s.get(url + path, headers={"Authorization": f"Bearer {key}"}) as reply,
    ):
        return reply.status, await reply.read()


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def hold(port: int, source: str, data: bytes = PARTIAL) -> Conn:
    """A connection from ``source`` that sends ``data`` (an unfinished request) and waits."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(data)
    with contextlib.suppress(ConnectionError):  # the hub closed it to make room already
        await writer.drain()
    return reader, writer


async def ending(conn: Conn) -> bytes:
    """What the hub sends until it closes the connection (EOF, or a reset)."""
    reader, writer = conn
    try:
        return await asyncio.wait_for(reader.read(), 60)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def envelope(answer: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(answer.partition(b"\r\n\r\n")[2])
    return body


async def test_slowloris_from_many_addresses_leaves_keyed_calls_prompt(
    hub: tuple[HubProcess, str],
) -> None:
    proc, key = hub
    pid = pid_of(proc)
    assert (await keyed(proc.url, key, "127.0.0.2"))[0] == 200  # warm: the baseline after
    fds, rss = open_fds(pid), rss_mib(pid)
    # 600 slow connections from 20 addresses, each under the per-client cap: together more
    # than the hub's 512 descriptors
    sources = [f"127.0.1.{i}" for i in range(1, 21)]
    conns = await asyncio.gather(*(hold(proc.port, s) for s in sources for _ in range(30)))
    assert open_fds(pid) < NOFILE - 64  # the caps kept descriptors free
    # a keyed call gets through at once, from another address (the oldest slow one makes room)
    status, _ = await keyed(proc.url, key, "127.0.0.2")
    assert status == 200
    # every slow connection is closed by the hub: the newest after the header timeout (408,
    # saying why), the older ones to make room (no answer)
    answers = await asyncio.gather(*(ending(c) for c in conns))
    timed_out = [envelope(a) for a in answers if status_of(a) == 408]
    assert len(timed_out) >= 64, [a[:60] for a in answers[-5:]]
    assert all(status_of(a) in (None, 408) for a in answers)
    assert timed_out[0]["type"] == "AEnvTimeoutError"
    assert "--header-timeout" in timed_out[0]["error"]
    # the hub holds nothing of the attack afterwards: descriptors, and memory (loosely)

    async def settled() -> bool:
        return open_fds(pid) <= fds + 2

    await eventually(settled, "the hub closed the attack's descriptors")
    assert rss_mib(pid) < rss + 32, (rss, rss_mib(pid))
    assert (await keyed(proc.url, key, "127.0.0.2"))[0] == 200


async def test_a_trickled_request_and_a_stalled_body_time_out(
    hub: tuple[HubProcess, str],
) -> None:
    proc, key = hub
    # headers a byte every half second: the deadline holds for all of them, not per byte
    conn = await asyncio.open_connection("127.0.0.1", proc.port, local_addr=("127.0.0.3", 0))
    writer = conn[1]
    request = b"GET /v1/envs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 200

    async def trickle() -> int:
        for sent, byte in enumerate(request):
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                return sent
            await asyncio.sleep(0.5)
        return len(request)

    sending = asyncio.create_task(trickle())
    answer = await ending(conn)
    sent = await sending
    assert status_of(answer) == 408, answer[:200]
    assert sent < len(request)  # closed mid-headers: all of them would take 120 s
    # a body that stops: 408 once it has paused for the body timeout
    head = (
        "POST /v1/envs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/gzip\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: 100000\r\n\r\n"
    )
    stalled = await hold(proc.port, "127.0.0.3", head.encode() + b"\x1f\x8b" * 100)
    answer = await ending(stalled)
    assert status_of(answer) == 408, answer[:300]
    assert "--body-timeout" in envelope(answer)["error"]


async def test_one_address_holds_at_most_its_cap_of_connections(
    hub: tuple[HubProcess, str],
) -> None:
    proc, key = hub
    held = [await hold(proc.port, "127.0.0.4") for _ in range(PER_CLIENT)]
    over = await hold(proc.port, "127.0.0.4")
    answer = await ending(over)
    assert status_of(answer) == 429, answer[:200]
    error = decode_error(envelope(answer), 429)
    assert isinstance(error, RateLimitedError)
    assert error.retry_after == 1.0
    assert "--client-connections" in str(error)
    assert b"retry-after: 1" in answer.lower()
    # another address is not held back
    assert (await keyed(proc.url, key, "127.0.0.5"))[0] == 200
    # the held ones end with the header timeout, and the address may connect again
    await asyncio.gather(*(ending(r) for r in held))
    assert (await keyed(proc.url, key, "127.0.0.4"))[0] == 200


async def test_websocket_upgrades_do_not_leak_places(hub: tuple[HubProcess, str]) -> None:
    # the hub serves no WebSocket: an upgrade request is plain HTTP, and its connection, once
    # closed, frees its place (were it upgraded, the gate would never see it close, and the
    # address would be refused after its cap of them)
    proc, key = hub
    upgrade = (
        "GET /v1/envs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer {key}\r\n\r\n"
    ).encode()
    for _ in range(PER_CLIENT + 5):
        reader, writer = await hold(proc.port, "127.0.0.7", upgrade)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        assert status_of(head) == 200, head
        writer.close()
        await writer.wait_closed()

    async def served() -> bool:
        return (await keyed(proc.url, key, "127.0.0.7"))[0] == 200

    await eventually(served, "127.0.0.7 served again after its connections closed")


async def defences_now(proc: HubProcess, key: str) -> dict[str, Any]:
    """``GET /v1/defences`` from 127.0.0.9 (an address no attack in this module uses)."""
    status, body = await keyed(proc.url, key, "127.0.0.9", "/v1/defences")
    assert status == 200, body
    stats: dict[str, Any] = json.loads(body)
    return stats


def test_the_hub_runs_with_the_allocator_whose_memory_goes_back(
    hub: tuple[HubProcess, str],
) -> None:
    # aenv serve ran itself again with PYTHONMALLOC=malloc (envhub.allocator): the block the
    # exec gave it says so (the tests' own environment does not set it)
    proc, _ = hub
    assert "PYTHONMALLOC" not in proc.env
    block = Path(f"/proc/{pid_of(proc)}/environ").read_bytes().split(b"\0")
    assert b"PYTHONMALLOC=malloc" in block


def test_the_failure_throttle_forgets_clients_once_their_window_passed() -> None:
    now = [0.0]
    throttle = FailureThrottle(3, clock=lambda: now[0])
    for i in range(2000):  # an attack from 2,000 addresses, a failure each second
        now[0] = i / 1000
        throttle.failed(f"10.1.{i // 250}.{i % 250}")
    assert throttle.stats() == {"clients": 2000}
    now[0] = 2 + throttle.window  # the attack ended a window ago: all forgiven, all forgotten
    assert throttle.refusal("10.1.0.0") is None
    assert throttle.stats() == {"clients": 0}
    # forgotten in the order they failed: half a window after the last, the earlier go first
    for i in range(4):
        now[0] = 100 + i * throttle.window / 2
        throttle.failed(f"10.2.0.{i}")
    assert throttle.stats() == {"clients": 2}  # 10.2.0.0 and .1 are a window old
    assert throttle.retry_after("10.2.0.3") is None


async def test_the_bookkeeping_of_an_attack_is_pruned_once_it_ends(
    forgetful_hub: tuple[HubProcess, str],
) -> None:
    # what the hub counts per client and per connection goes back to what honest clients
    # hold, not only its descriptors: slow connections from 10 addresses and keys guessed
    # from 5 others, then the attack stops
    proc, key = forgetful_hub
    before = await defences_now(proc, key)
    assert before["connections"]["clients"] == 1  # the request asking
    slow = [await hold(proc.port, f"127.0.4.{i}") for i in range(1, 11) for _ in range(3)]
    guessed = "aenv_0123456789ab_" + "y" * 32
    for i in range(1, 6):
        for _ in range(FAILURES + 2):
            status, _ = await keyed(proc.url, guessed, f"127.0.5.{i}")
            assert status in (401, 429)
    during = await defences_now(proc, key)
    assert during["connections"]["clients"] >= 11, during
    assert during["connections"]["waiting"] >= 30, during
    assert during["auth_failures"]["clients"] >= 5, during
    for _, writer in slow:
        writer.close()

    async def pruned() -> dict[str, Any] | None:
        now = await defences_now(proc, key)
        held = now["connections"]
        settled = held["clients"] == 1 and held["open"] == 1 and held["waiting"] == 0
        return now if settled and now["auth_failures"]["clients"] == 0 else None

    # failures are forgiven --auth-window (AUTH_WINDOW s) after the last one
    await eventually(pruned, "the attack's bookkeeping pruned", deadline=180)


# last: it leaves 127.0.0.1 refused for a minute
async def test_guessing_keys_gets_429_and_valid_keys_elsewhere_still_work(
    hub: tuple[HubProcess, str],
) -> None:
    proc, key = hub
    guessed = "aenv_0123456789ab_" + "x" * 32
    answers = []
    async with aiohttp.ClientSession() as session:
        for i in range(40):
            # a new X-Forwarded-For each time: the hub counts the connection's address
            headers = {"Authorization": f"Bearer {guessed}", "X-Forwarded-For": f"10.9.0.{i}"}
            async with session.get(proc.url + "/v1/envs", headers=headers) as reply:
                answers.append((reply.status, reply.headers.get("Retry-After"), await reply.json()))
    statuses = [status for status, _, _ in answers]
    assert statuses[:FAILURES] == [401] * FAILURES
    assert set(statuses[FAILURES:]) == {429}
    _, retry_after, body = answers[-1]
    assert retry_after is not None
    assert 1 <= int(retry_after) <= 60
    assert body["type"] == "RateLimitedError"
    assert body["retryable"] is True
    # the SDK raises the typed error, even with a valid key, from the guessing address: its
    # keys are not looked at until it may try again
    async with HubClient(proc.url, api_key=key) as client:
        with pytest.raises(RateLimitedError, match="failed authentications") as refused:
            await client.search()
    assert refused.value.retry_after is not None
    assert refused.value.retry_after > 0
    # a valid key from another address works at once
    assert (await keyed(proc.url, key, "127.0.0.6"))[0] == 200
    # a request without a key is no guess (it costs the hub nothing): never 429
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.8", 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(FAILURES * 3):
            async with session.get(proc.url + "/v1/envs") as reply:
                assert reply.status == 401
    # one warning for the episode, not one line per guess
    log = proc.tail()
    assert log.count("client 127.0.0.1 failed to authenticate") == 1, log
