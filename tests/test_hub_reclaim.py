"""No instance outlives its owner's record: a hub killed (SIGKILL) in the middle of creates
leaves instances its engine started and it never recorded; the restarted hub finds and ends
them, and the tenant's quota is whole again (issue 22, point 6). The Kubernetes case is in
``test_k8s_pools.py``.

The crash is made deterministic: the hub is frozen (SIGSTOP) the moment its engine daemon
holds the first instance of the burst, while the others are still being started; the daemon
(another process) finishes them, and the frozen hub can record none of them; then SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from aenv_ray.hub import HubClient
from envhub.control import INSTANCES, INTENTS, LABEL_STORE
from envhub.keys import create_key
from envhub.store import open_store
from local_backend.client import DaemonEngine
from tests._hub import HubProcess, eventually

BURST = 8
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


async def test_a_hub_killed_mid_create_reclaims_what_it_never_recorded(tmp_path: Path) -> None:
    (tmp_path / "limits.json").write_text(json.dumps(LIMITS))
    process = HubProcess(
        tmp_path / "hub", engine="local", extra=["--limits", str(tmp_path / "limits.json")]
    )
    store = await open_store(process.store)
    try:
        key = (await create_key(store, tenant="alice"))[1]
    finally:
        await store.aclose()
    daemon = DaemonEngine(process.data_dir / "engine")
    with process:
        async with HubClient(process.url, api_key=key) as hub:
            await hub.list_instances()  # the hub serves; its daemon is up
            burst = [
                asyncio.create_task(hub.create_instance("mini-terminal@1.0.0", ttl="1h"))
                for _ in range(BURST)
            ]
            await eventually(lambda: _live(daemon), "the daemon started a first instance")
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

        process.start()  # the restarted hub reclaims them before it serves
        live = await _live(daemon)
        assert not orphans & set(live), f"instances with no record still run: {orphans}"
        assert set(live) <= set(records)  # every instance still running has its record
        assert not await _records(process.store, INTENTS)

        async with HubClient(process.url, api_key=key) as hub:  # the quota is whole again
            for doc in await hub.list_instances():  # what the tenant sees is all it holds
                await hub.delete_instance(doc["id"])
            made = await asyncio.gather(
                *(hub.create_instance("mini-terminal@1.0.0", ttl=600) for _ in range(BURST))
            )
            assert set(await _live(daemon)) == {d["id"] for d in made}
        await daemon.aclose()


async def _settled(daemon: DaemonEngine) -> dict[str, str] | None:
    """The daemon's hub instances once their number stays the same for a second."""
    first = await _live(daemon)
    await asyncio.sleep(1.0)
    second = await _live(daemon)
    return second if first == second and second else None
