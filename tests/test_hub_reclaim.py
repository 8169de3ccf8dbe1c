"""No instance outlives its owner's record: a hub killed (SIGKILL) in the middle of creates
leaves instances its engine started and it never recorded; the restarted hub finds and ends
them, and the tenant's quota is whole again (issue 22, point 6). The Kubernetes case is in
``test_k8s_pools.py``.

The crash is made deterministic: the hub is frozen (SIGSTOP) the moment the store holds the
intents of the whole burst, while its engine daemon is still loading the environment's template
for the first of them; the daemon (another process) finishes them, and the frozen hub can record
none of them; then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.engine import InstanceSpec
from aenv_ray.errors import InstanceNotFoundError
from aenv_ray.hub import HubClient
from envhub.control import HUB_LEASE, HUBS, INSTANCES, INTENTS, LABEL_STORE, ControlPlane
from envhub.keys import create_key
from envhub.registry import VersionRegistry
from envhub.store import open_store
from local_backend.client import DaemonEngine
from tests._hub import HubProcess, eventually

BURST = 8
MINI = "mini-terminal@1.0.0"
LIMITS = {"default": {"instances": BURST, "per_request": BURST, "ttl": "1h"}}


async def _records(store_url: str, kind: str = INSTANCES) -> dict[str, dict[str, object]]:
    store = await open_store(store_url)
    try:
        return await store.list(kind)
    finally:
        await store.aclose()


async def _live(daemon: DaemonEngine) -> dict[str, str]:
    """The daemon's running instances made by a hub: id -> the store label."""
    return {
        i.id: i.labels.get(LABEL_STORE, "")
        for i in await daemon.list()
        if i.is_running and "aenv.tenant" in i.labels
    }


async def _new_key(store_url: str) -> str:
    store = await open_store(store_url)
    try:
        return (await create_key(store, tenant="alice"))[1]
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    """A hub on the engine daemon (which outlives it), and alice's key; quota BURST."""
    tmp = tmp_path_factory.mktemp("reclaim")
    (tmp / "limits.json").write_text(json.dumps(LIMITS))
    process = HubProcess(tmp / "hub", engine="daemon", extra=["--limits", str(tmp / "limits.json")])
    key = asyncio.run(_new_key(process.store))
    with process:
        yield process, key


async def test_a_hub_killed_mid_create_reclaims_what_it_never_recorded(
    hub: tuple[HubProcess, str],
) -> None:
    process, key = hub
    async with DaemonEngine(process.data_dir / "engine") as daemon:
        async with HubClient(process.url, api_key=key) as client:
            await client.list_instances()  # the hub serves; its daemon is up
            burst = [
                asyncio.create_task(client.create_instance("mini-terminal@1.0.0", ttl="1h"))
                for _ in range(BURST)
            ]
            await _all_intents(process.store)  # every create is under way, none recorded yet
            assert process.proc is not None
            os.kill(process.proc.pid, signal.SIGSTOP)  # no record is written from here on
            in_flight = await eventually(
                lambda: _settled(daemon), "the daemon finished what it was asked", deadline=120
            )
            process.kill()
            await asyncio.gather(*burst, return_exceptions=True)  # the hub died under them
        records = await _records(process.store)
        orphans = set(in_flight) - set(records)
        assert orphans, "control: the crash must leave instances the hub never recorded"
        assert await _records(process.store, INTENTS), "control: their intents are stored"

        process.start()  # the restarted hub reclaims them (before it serves, or in its upkeep
        # for one the daemon finished after the restart)

        async def only_recorded() -> bool:
            return set(await _live(daemon)) <= set(records)

        await eventually(only_recorded, "no instance without a record runs", deadline=60)
        assert not await _records(process.store, INTENTS)

        async with HubClient(process.url, api_key=key) as client:  # the quota is whole again
            for doc in await client.list_instances():  # what the tenant sees is all it holds
                await client.delete_instance(doc["id"])
            made = await asyncio.gather(
                *(client.create_instance("mini-terminal@1.0.0", ttl=600) for _ in range(BURST))
            )
            assert set(await _live(daemon)) == {d["id"] for d in made}
            for doc in made:
                await client.delete_instance(doc["id"])


async def _all_intents(store_url: str) -> None:
    """Return once the store holds the intents of the whole burst at once: each create has
    passed its quota and told the daemon (the intent is stored just before), and the first
    instance, a cold template's, is not started yet, so none of them is recorded. Polled
    often: the window lasts as long as that template takes to load."""
    store = await open_store(store_url)
    try:
        end = time.monotonic() + 120
        while len(await store.list(INTENTS)) < BURST:
            assert time.monotonic() < end, "the hub never had its whole burst under way"
            await asyncio.sleep(0.01)
    finally:
        await store.aclose()


async def _running(daemon: DaemonEngine, instance_id: str) -> bool:
    try:
        return (await daemon.get(instance_id)).is_running
    except InstanceNotFoundError:
        return False


async def _settled(daemon: DaemonEngine) -> dict[str, str] | None:
    """The daemon's hub instances once their number stays the same for a second."""
    first = await _live(daemon)
    await asyncio.sleep(1.0)
    second = await _live(daemon)
    return second if first == second and second else None


async def test_no_hub_ends_a_create_under_way_of_a_live_hub_of_its_store(
    hub: tuple[HubProcess, str], tmp_path: Path
) -> None:
    """Two more hubs of the running hub's store (control planes in this process): an instance
    that one of them is creating (its intent stands, no record yet) is left alone by the other,
    by itself and by the running hub, until its hub's heartbeat lapses; an instance labelled
    with another store's id is never touched."""
    process, _ = hub
    daemon = DaemonEngine(process.data_dir / "engine")
    store = await open_store(process.store)
    first = ControlPlane(store, daemon, VersionRegistry(store), tmp_path / "first")
    second = ControlPlane(store, daemon, VersionRegistry(store), tmp_path / "second")
    spec = InstanceSpec("mini-terminal@1.0.0", ttl=600, labels={"aenv.tenant": "alice"})
    try:
        stranger = await daemon.create(
            InstanceSpec(spec.env_ref, ttl=600, labels={**spec.labels, LABEL_STORE: "elsewhere"})
        )
        async with first._intent("alice") as marks:
            info = await daemon.create(InstanceSpec(spec.env_ref, ttl=600, labels=marks))
            assert info.id not in await second.reclaim()
            assert info.id not in await first.reclaim()
            assert await _running(daemon, info.id)
            # `first` dies: its heartbeat stops; once it has lapsed, its intents are dead
            beat = await store.get(HUBS, first.hub_id)
            assert beat is not None
            await store.put(HUBS, first.hub_id, {**beat, "heartbeat_at": time.time() - HUB_LEASE})
            await second.reclaim()
            assert not await _running(daemon, info.id)
        assert stranger.id not in await second.reclaim()
        assert await _running(daemon, stranger.id)
        await daemon.delete(stranger.id)
    finally:
        await first.stop()
        await second.stop()
        await store.aclose()
        await daemon.aclose()


# -- a create retried on another hub of the store -------------------------------------------------

WAITING = "create retried: another hub of the store has it under way"
"""What a hub logs when a create's key is another live hub's in flight (it waits for it)."""


@pytest.fixture(scope="module")
def other_hub(hub: tuple[HubProcess, str]) -> Iterator[HubProcess]:
    """A second hub of the first's store and data directory (so of its engine daemon: the
    hubs of one machine), with a log of its own."""
    process, _ = hub
    second = HubProcess(process.data_dir, store=process.store, engine="daemon", extra=process.extra)
    second.log = process.data_dir.parent / "other-hub.log"
    second.start()
    try:
        yield second
    finally:
        second.stop()  # the first hub's fixture stops the daemon


@contextlib.contextmanager
def _daemon_frozen(process: HubProcess) -> Iterator[None]:
    """The engine daemon of ``process``'s data directory stopped (SIGSTOP) for the body: a
    create sent to a hub meanwhile is under way (claimed, its intent stored) and stays so."""
    pids = DaemonEngine(process.data_dir / "engine")._daemon_pids()
    assert pids, "control: the daemon runs"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def _intents(store_url: str, count: int) -> None:
    """Return once the store holds ``count`` intents (creates under way)."""
    store = await open_store(store_url)
    try:

        async def enough() -> bool:
            return len(await store.list(INTENTS)) >= count

        await eventually(enough, f"{count} creates under way")
    finally:
        await store.aclose()


async def _waits_or_creates(other: HubProcess, store_url: str, intents: int) -> None:
    """Return once ``other`` is handling its create: waiting for the first hub's (its log says
    so) or, if it does not know to wait, started its own (a second intent in the store)."""
    store = await open_store(store_url)
    try:

        async def handling() -> bool:
            return WAITING in other.tail() or len(await store.list(INTENTS)) > intents

        await eventually(handling, "the second hub took the create")
    finally:
        await store.aclose()


async def _created_on_both(
    a: tuple[HubProcess, HubClient], b: tuple[HubProcess, HubClient], idem: str
) -> tuple[asyncio.Task[dict[str, Any]], asyncio.Task[dict[str, Any]]]:
    """The create of ``idem`` sent to hub A, then (A's intent recorded) retried on hub B, and
    B has taken it up: both under way (the daemon frozen by the caller)."""
    (first_hub, first), (second_hub, second) = a, b
    at_first = asyncio.create_task(first.create_instance(MINI, ttl=600, idempotency_key=idem))
    await _intents(first_hub.store, 1)
    at_second = asyncio.create_task(second.create_instance(MINI, ttl=600, idempotency_key=idem))
    await _waits_or_creates(second_hub, first_hub.store, intents=1)
    return at_first, at_second


async def test_a_create_retried_on_another_hub_while_under_way_gets_the_same_instance(
    hub: tuple[HubProcess, str], other_hub: HubProcess
) -> None:
    """The retry lands on hub B while hub A's create is under way: B waits for A's and answers
    its instance; retried again once it is done, on either hub, the same one. One instance."""
    process, key = hub
    idem = f"retried-elsewhere-{os.getpid()}"
    async with (
        DaemonEngine(process.data_dir / "engine") as daemon,
        HubClient(process.url, api_key=key) as first,
        HubClient(other_hub.url, api_key=key) as second,
    ):
        before = set(await _live(daemon))
        with _daemon_frozen(process):
            at_first, at_second = await _created_on_both(
                (process, first), (other_hub, second), idem
            )
        made, retried = await asyncio.gather(at_first, at_second)
        assert retried["id"] == made["id"]
        for client in (first, second):
            again = await client.create_instance(MINI, ttl=600, idempotency_key=idem)
            assert again["id"] == made["id"]
        assert set(await _live(daemon)) - before == {made["id"]}
        await first.delete_instance(made["id"])


async def test_a_create_retried_on_another_hub_after_the_first_died_is_made_once(
    hub: tuple[HubProcess, str], other_hub: HubProcess
) -> None:
    """Hub A dies (SIGKILL) in the middle of the create; the retry waiting on hub B takes it
    over once A's heartbeat has lapsed (made to lapse in the store, as HUB_LEASE would): B
    makes the instance, A's half-made one is reclaimed, one instance runs for the key."""
    process, key = hub
    idem = f"retried-after-death-{os.getpid()}"
    async with (
        DaemonEngine(process.data_dir / "engine") as daemon,
        HubClient(process.url, api_key=key) as first,
        HubClient(other_hub.url, api_key=key) as second,
    ):
        before = set(await _live(daemon))
        with _daemon_frozen(process):
            at_first, at_second = await _created_on_both(
                (process, first), (other_hub, second), idem
            )
            dead_id = _hub_id(process)
            process.kill()
            await asyncio.gather(at_first, return_exceptions=True)
            store = await open_store(process.store)
            try:
                beat = await store.get(HUBS, dead_id)
                assert beat is not None
                await store.put(HUBS, dead_id, {**beat, "heartbeat_at": time.time() - HUB_LEASE})
            finally:
                await store.aclose()
        made = await at_second
        again = await second.create_instance(MINI, ttl=600, idempotency_key=idem)
        assert again["id"] == made["id"]

        async def one_left() -> bool:  # B's upkeep reclaims what A left unrecorded
            return set(await _live(daemon)) - before == {made["id"]}

        await eventually(one_left, "one instance runs for the key", deadline=60)
        await second.delete_instance(made["id"])
    process.start()  # the module's hub again


def _hub_id(process: HubProcess) -> str:
    """The id of the hub ``process`` (the first of its data directory: it holds the id kept
    there; its intents name it)."""
    return (process.data_dir / "hub.id").read_text().strip()
