"""A create whose reply is lost neither leaks nor duplicates an instance: the ``Idempotency-Key``
of ``POST /v1/instances`` against a real ``aenv serve`` (auth on, in-process engine), two
tenants' keys. The reply is lost for real: the request reaches the hub whole and its connection
is closed before the answer (by the client, or by a relay in between that drops the first
answer it carries), then the SDK's :class:`~aenv_ray.hub.RemoteEngine` sends it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aenv_ray.engine import InstanceSpec
from aenv_ray.errors import ConfigurationError
from aenv_ray.hub import IDEMPOTENCY_HEADER, HubClient, RemoteEngine
from tests._hub import HubProcess, eventually, new_key

MINI = "mini-terminal@1.0.0"


@pytest.fixture(scope="module")
def hub(shared_hub: HubProcess) -> tuple[HubProcess, str, str]:
    """The session's hub (tests/conftest.py: auth on, the local engine), with keys of this
    module's own."""
    alice, bob = new_key("alice", shared_hub.store), new_key("bob", shared_hub.store)
    return shared_hub, alice, bob


@pytest.fixture
async def alice(hub: tuple[HubProcess, str, str]) -> AsyncIterator[HubClient]:
    async with HubClient(hub[0].url, api_key=hub[1]) as client:
        yield client
        for doc in await client.list_instances():
            await client.delete_instance(doc["id"])


def started_with(docs: list[dict[str, Any]], env: str = MINI) -> list[str]:
    return sorted(
        d["id"] for d in docs if d["env_ref"].endswith(env) and d["state"] != "terminated"
    )


async def test_the_same_key_answers_the_same_instance_and_another_tenant_gets_its_own(
    hub: tuple[HubProcess, str, str], alice: HubClient
) -> None:
    key = "run-7f3a-episode-0001"
    # two at once (the second while the first starts) and one after: one instance
    first, second = await asyncio.gather(
        alice.create_instance(MINI, ttl="5m", idempotency_key=key),
        alice.create_instance(MINI, ttl="5m", idempotency_key=key),
    )
    third = await alice.create_instance(MINI, ttl="5m", idempotency_key=key)
    assert first["id"] == second["id"] == third["id"]
    assert started_with(await alice.list_instances()) == [first["id"]]
    # another key is another instance; so is the same key of another tenant
    other = await alice.create_instance(MINI, ttl="5m", idempotency_key=key + "-b")
    assert other["id"] != first["id"]
    async with HubClient(hub[0].url, api_key=hub[2]) as bob:
        theirs = await bob.create_instance(MINI, ttl="5m", idempotency_key=key)
        assert theirs["id"] not in (first["id"], other["id"])
        assert started_with(await bob.list_instances()) == [theirs["id"]]
        await bob.delete_instance(theirs["id"])
    # a malformed key is refused with what to send
    with pytest.raises(ConfigurationError, match=IDEMPOTENCY_HEADER):
        await alice.create_instance(MINI, idempotency_key="no spaces allowed")


async def test_a_create_whose_connection_closed_before_the_reply_is_found_by_its_retry(
    hub: tuple[HubProcess, str, str], alice: HubClient
) -> None:
    proc, key, _ = hub
    body = json.dumps({"env": MINI, "ttl": "5m", "labels": {"sent": "first"}}).encode()
    head = (
        f"POST /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n{IDEMPOTENCY_HEADER}: lost-reply-0001\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", proc.port)
    writer.write(head + body)
    await writer.drain()
    writer.close()  # gone before any answer: the hub starts the instance all the same
    await writer.wait_closed()

    async def recorded() -> list[str]:
        return started_with(await alice.list_instances())

    # whether the retry meets the create in flight or its record, it gets that instance
    retried = await alice.create_instance(
        MINI, ttl="5m", labels={"sent": "again"}, idempotency_key="lost-reply-0001"
    )
    assert retried["labels"]["sent"] == "first"
    assert (await eventually(recorded, "the first create's instance")) == [retried["id"]]


async def relay(upstream: int, lose: int) -> tuple[asyncio.Server, list[int]]:
    """A TCP relay to 127.0.0.1:``upstream`` that delivers each request and drops the answer
    of its first ``lose`` connections (closing them once the answer came); the counts of
    connections it carried, answers dropped, in a list."""
    seen = [0, 0]

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen[0] += 1
        drop = seen[0] <= lose
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        sending = asyncio.create_task(pump(reader, up_writer))
        if drop:
            await up_reader.readuntil(b"\r\n\r\n")  # the hub answered: lose it
            seen[1] += 1
            writer.transport.abort()
            up_writer.close()
            sending.cancel()
            return
        await pump(up_reader, writer)
        sending.cancel()

    server = await asyncio.start_server(carry, "127.0.0.1", 0)
    return server, seen


async def test_the_sdk_sends_a_create_again_after_a_lost_reply_and_gets_one_instance(
    hub: tuple[HubProcess, str, str], alice: HubClient
) -> None:
    proc, key, _ = hub
    server, seen = await relay(proc.port, lose=2)
    port = server.sockets[0].getsockname()[1]
    try:
        async with HubClient(f"http://127.0.0.1:{port}", api_key=key) as through:
            engine = RemoteEngine(through, route="proxy")
            info = await engine.create(InstanceSpec(env_ref=MINI, ttl=300))
    finally:
        server.close()
    assert seen[1] == 2  # two answers were lost: the create was sent three times
    assert seen[0] >= 3
    assert started_with(await alice.list_instances()) == [info.id]
