"""Rollouts through a hub.

Ray and no-Ray agree (issue 13, point 5): with a hub configured, ``aenv rollout`` creates its
instances through the hub on both paths, a Ray pool's actors as the ``--no-ray`` path does.

No leaked instances (issue 25, point 7): after either run the hub holds no live instance of the
tenant (a pool's refill under way as it closed once left one, counted against the quota until its
TTL); and a pool that closes while its creations are under way at the hub waits for them and
deletes what they made, and an SDK instance whose creation is cancelled (an episode's timeout,
the ``--no-ray`` path) has what the hub made deleted. (A direct run's instances:
tests/test_rollout_datasource.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import Environment
from aenv_ray.hub import HubClient
from envhub.control import INTENTS
from envhub.store import open_store
from rollout._instance_pool import InstancePool
from rollout.spec import HubEngine, PoolSpec
from tests._cli import aenv
from tests._hub import HubProcess, new_key
from tests._session_ray import SessionRay

ROOT = Path(__file__).resolve().parent.parent
AENV = [sys.executable, "-m", "aenv_cli"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    """One hub for the module, and a key of tenant alice."""
    process = HubProcess(tmp_path_factory.mktemp("hub"))
    key = new_key("alice", process.store)
    with process:
        yield process, key


async def _intents(store_url: str) -> int:
    """How many creates are under way at the hub (their intents are stored, their records not
    yet)."""
    store = await open_store(store_url)
    try:
        return len(await store.list(INTENTS))
    finally:
        await store.aclose()


async def _settled_instances(process: HubProcess, key: str) -> list[dict[str, object]]:
    """alice's instances (terminated ones too) once no create is under way at the hub: an
    instance whose creator gave up on it is recorded only when the hub's create ends."""
    end = time.monotonic() + 120
    while await _intents(process.store):
        assert time.monotonic() < end, "creates at the hub never ended"
        await asyncio.sleep(0.1)
    async with HubClient(process.url, api_key=key) as client:
        return await client.list_instances(include_terminated=True)


# first in the module: the hub's mini-terminal template is cold, so its creates take long
async def test_a_pool_closing_while_its_creations_are_under_way_leaves_none(
    hub: tuple[HubProcess, str],
) -> None:
    process, key = hub
    size = 3
    spec = PoolSpec(
        env_name="mini-terminal@1.0.0",
        name=f"closing-{uuid.uuid4().hex[:6]}",
        engine=HubEngine(process.url, api_key=key),
    )
    pool = InstancePool(spec, size)
    try:
        await pool.start()  # no wait: the maintenance task starts the creations
        await _under_way(process, size)
        async with HubClient(process.url, api_key=key) as client:  # control: under way
            assert not [d for d in await client.list_instances() if d["owner"] == spec.owner]
    finally:
        deleted = await pool.close()
    mine = [d for d in await _settled_instances(process, key) if d["owner"] == spec.owner]
    assert len(mine) == size  # every create the pool began made its instance at the hub
    assert {d["state"] for d in mine} == {"terminated"}  # and the close deleted each
    assert deleted == size


async def _under_way(process: HubProcess, count: int) -> None:
    """Return once ``count`` creates are under way at the hub. Polled often: the window lasts as
    long as the hub's cold template of the environment takes to load."""
    end = time.monotonic() + 60
    while await _intents(process.store) < count:
        assert time.monotonic() < end, "the creates never reached the hub"
        await asyncio.sleep(0.01)


# second: mini-program's template at the hub is cold too (no other test uses it)
async def test_an_instance_whose_creation_is_cancelled_is_deleted_at_the_hub(
    hub: tuple[HubProcess, str],
) -> None:
    process, key = hub
    owner = f"cancelled-{uuid.uuid4().hex[:6]}"
    env = Environment("mini-program@1.0.0", aenv_url=process.url, api_key=key, owner=owner)
    starting = asyncio.ensure_future(env.initialize())
    await _under_way(process, 1)
    starting.cancel()  # as an episode's timeout does
    with pytest.raises(asyncio.CancelledError):
        await starting  # its cleanup (the engine's close) waits for the deletion
    mine = [d for d in await _settled_instances(process, key) if d["owner"] == owner]
    assert len(mine) == 1  # the hub finished the create its caller gave up
    assert mine[0]["state"] == "terminated"


def test_both_paths_create_their_instances_through_the_configured_hub_and_leave_none(
    hub: tuple[HubProcess, str], tmp_path: Path, session_ray: SessionRay
) -> None:
    process, key = hub
    hub_env = {"AENV_SYSTEM_URL": process.url, "AENV_API_KEY": key}
    ids: dict[str, set[str]] = {}
    for path in ("--ray", "--no-ray"):
        out = tmp_path / path.strip("-")
        args = ["rollout", "mini-terminal@1.0.0", "-n", "2", "-c", "2", path, "-o", str(out)]
        if path == "--ray":
            # a subprocess that joins the session's Ray (its pool actors get the hub engine
            # the driver made): what is checked is where the instances are made, not Ray's
            # start, and no Ray stays initialized in this process
            done = subprocess.run(
                [*AENV, *args],
                cwd=ROOT,
                env={**os.environ, **hub_env, **session_ray.env, "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        else:  # in this process (tests/_cli.py): the run's own engine is the hub's
            done = aenv(*args, env=hub_env, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (out / "trajectories.jsonl").read_text().splitlines()
        ids[path] = {json.loads(line)["instance_id"] for line in lines}
        assert len(ids[path]) == 2

    docs = asyncio.run(_settled_instances(process, key))
    states = {str(d["id"]): d["state"] for d in docs}
    assert ids["--ray"] | ids["--no-ray"] <= set(states)  # every one the hub's, alice's
    # none left running: neither the episodes' instances nor the Ray pool's warm ones and
    # the refills it began as the episodes released theirs
    assert set(states.values()) == {"terminated"}, states
