"""Using an object after closing it raises one class, :class:`~aenv_ray.errors.ClosedError`,
with a message naming the object and what to do (one test per class; ``Environment``'s is in
``test_sdk.py``: :class:`~aenv_ray.errors.InstanceClosedError`, a ``ClosedError`` too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv_ray import ClosedError, InstanceClosedError, InstanceError
from aenv_ray.hub import HubClient
from local_backend import LocalEngine
from local_backend.client import DaemonEngine
from rollout._instance_pool import InstancePool
from rollout.lease import Owner
from rollout.run_directory import RunDirectory
from rollout.spec import PoolSpec


def test_an_instance_closed_error_is_a_closed_error_and_an_instance_error() -> None:
    assert issubclass(InstanceClosedError, ClosedError)
    assert issubclass(InstanceClosedError, InstanceError)
    assert not issubclass(ClosedError, InstanceError)  # an engine or a pool is no instance
    assert ClosedError.retryable is False  # retrying on a closed object cannot help


async def test_the_local_engine() -> None:
    engine = LocalEngine()
    assert await engine.list() == []
    await engine.aclose()
    await engine.aclose()  # idempotent
    with pytest.raises(ClosedError, match=rf"local engine {engine.owner} is closed.*LocalEngine"):
        await engine.list()


async def test_the_daemon_engine(tmp_path: Path) -> None:
    engine = DaemonEngine(tmp_path / "engine")  # no daemon is started: closed before any call
    await engine.aclose()
    with pytest.raises(ClosedError, match="is closed; create a new DaemonEngine"):
        await engine.list()


async def test_the_hub_client() -> None:
    client = HubClient("http://127.0.0.1:9")  # closed before any request: nothing is contacted
    await client.aclose()
    with pytest.raises(ClosedError, match=r"hub client of http://127\.0\.0\.1:9 is closed"):
        await client.versions("mini-terminal")


async def test_the_pool_actor() -> None:
    pool = InstancePool(PoolSpec(env_name="mini-terminal@1.0.0", name="closing"), 0)
    assert await pool.close() == 0
    owner = Owner(job_id="job")
    with pytest.raises(ClosedError, match="pool actor `closing` is closed; create a new pool"):
        await pool.acquire(owner)
    with pytest.raises(ClosedError, match="pool actor `closing` is closed"):
        await pool.start()


async def test_the_run_directory(tmp_path: Path) -> None:
    run = RunDirectory.open(tmp_path / "run")
    await run.append({"episode_id": "e1"})
    run.close()
    with pytest.raises(ClosedError, match=rf"run directory {tmp_path / 'run'} is closed"):
        await run.append({"episode_id": "e2"})
