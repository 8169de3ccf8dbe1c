"""``DaemonEngine``: the SandboxEngine contract over a real local engine daemon.

A test of the daemon's own start, end or faults gets a state directory of its own (short: it
holds the daemon's Unix socket); the tests of what a running daemon answers share one daemon
for the module (``shared``: its templates warm after the first create). The daemon is started
on demand by the client, its instances are real and called over loopback, and every daemon is
shut down in teardown.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from aenv_ray import (
    AEnvError,
    ClosedError,
    ConfigurationError,
    Environment,
    EnvironmentNotFoundError,
    InstanceInfo,
    InstanceNotFoundError,
    InstanceSpec,
    InstanceState,
    TerminationReason,
)
from aenv_ray.engine import SandboxEngine
from aenv_ray.resolve import resolve_environment
from local_backend._cgroups import hierarchy_roots
from local_backend.client import DaemonEngine
from tests._hostile import call, hostile_spec
from tests._processes import processes_of


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="aenv-d-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def engine(state_dir: Path) -> AsyncIterator[DaemonEngine]:
    engine = DaemonEngine(state_dir)
    yield engine
    await engine.shutdown()
    assert not _daemon_alive(state_dir)


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """The state directory of the module's one daemon, shut down after the module."""
    path = Path(tempfile.mkdtemp(prefix="aenv-d-"))
    yield path
    asyncio.run(DaemonEngine(path).shutdown())
    assert not _daemon_alive(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def shared(shared_dir: Path) -> AsyncIterator[DaemonEngine]:
    """A client of the module's daemon (each test's own: closing it leaves the daemon up)."""
    async with DaemonEngine(shared_dir) as engine:
        yield engine


def _pid(state_dir: Path) -> int:
    return int((state_dir / "engine.pid").read_text())


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _daemons(state_dir: Path) -> list[int]:
    """Daemon processes of ``state_dir`` (by their command line)."""
    return processes_of(f"--state-dir\0{state_dir}\0")


def _daemon_alive(state_dir: Path) -> bool:
    return bool(_daemons(state_dir))


def _instance_processes(daemon_pid: int) -> list[int]:
    """Processes of the daemon's engine: its zygotes, their instances' inits and runtimes."""
    return processes_of(f"--owner\0{daemon_pid}-")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def until(predicate: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_create_by_project_and_by_name_get_list_renew_delete(shared: DaemonEngine) -> None:
    assert isinstance(shared, SandboxEngine)
    assert shared.name == "local-daemon"
    before = {i.id for i in await shared.list()}  # the module's other tests' instances
    info = await shared.create(hostile_spec(ttl=120, owner="alice", labels={"run": "a"}))
    assert info.state is InstanceState.RUNNING
    assert info.env_ref == "hostile@1.0.0"
    assert info.owner == "alice"
    assert info.labels == {"run": "a"}
    assert info.expires_at is not None
    assert 119 < info.expires_at - info.created_at <= 120
    assert (await call(info, "identity"))["env"]["AENV_INSTANCE_ID"] == info.id

    terminal = await shared.create(InstanceSpec("mini-terminal@1.0.0"))
    assert terminal.state is InstanceState.RUNNING
    assert terminal.env_ref == "mini-terminal@1.0.0"
    said = await call(terminal, "execute_command", {"command": "echo hi"})
    assert said == {"output": "hi\n", "returncode": 0}

    assert await shared.get(info.id) == info

    def new(infos: list[InstanceInfo]) -> list[str]:
        return [i.id for i in infos if i.id not in before]

    assert new(await shared.list()) == [terminal.id, info.id]  # newest first
    assert new(await shared.list(env_ref="hostile")) == [info.id]
    assert new(await shared.list(env_ref="mini-terminal@1.0.0")) == [terminal.id]

    renewed = await shared.renew(info.id, 3600)
    assert renewed.expires_at is not None
    assert renewed.expires_at > info.expires_at + 3000
    assert renewed.owner == "alice"
    assert renewed.labels == {"run": "a"}

    ended = await shared.delete(info.id)
    assert ended.state is InstanceState.TERMINATED
    assert ended.reason is TerminationReason.DELETED
    assert await shared.delete(info.id) == ended  # idempotent
    assert await shared.get(info.id) == ended
    with pytest.raises(httpx.TransportError):
        async with httpx.AsyncClient() as http:
            await http.get(f"{info.url}/aenv/v1/info", timeout=5)
    await shared.delete(terminal.id)


async def test_fork(shared: DaemonEngine) -> None:
    parent = await shared.create(hostile_spec(labels={"job": "7"}))
    await call(parent, "remember", {"key": "stage", "value": "set up"})
    children = await shared.fork(parent.id, 2)
    assert len(children) == 2
    assert len({c.id for c in children} | {parent.id}) == 3
    for child in children:
        assert child.state is InstanceState.RUNNING
        assert child.parent == parent.id
        assert child.labels == {"job": "7"}
        async with Environment.attach(child.url or "", token=child.token) as env:
            assert await env.call_function("recall", {"key": "stage"}) == "set up"
    listed = {i.id: i for i in await shared.list()}
    assert all(listed[c.id].parent == parent.id for c in children)


async def test_storage_reaches_the_instance(shared: DaemonEngine, tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    os.chmod(storage, 0o777)  # the instances' root may be nobody on the host
    info = await shared.create(hostile_spec(storage=str(storage)))
    me = await call(info, "identity")
    where = me["env"].get("AENV_STORAGE", "/storage")  # namespaces: mounted at /storage
    assert (await call(info, "write_file", {"path": f"{where}/x", "text": "kept"}))["ok"]
    assert (storage / "x").read_text() == "kept"


async def test_errors_come_back_typed(shared: DaemonEngine, tmp_path: Path) -> None:
    with pytest.raises(EnvironmentNotFoundError, match=r"no environment `no-such-env@9\.9\.9`"):
        await shared.create(InstanceSpec("no-such-env@9.9.9"))
    with pytest.raises(InstanceNotFoundError, match="no instance `nope`") as caught:
        await shared.get("nope")
    assert caught.value.instance_id == "nope"
    for attempt in (
        shared.delete("nope"),
        shared.renew("nope", 60),
        shared.fork("nope", 1),
        shared.get("a/../b"),  # never a path of the API
        shared.get(""),
    ):
        with pytest.raises(InstanceNotFoundError):
            await attempt
    with pytest.raises(ConfigurationError, match="`ttl`: duration `-5`"):
        await shared.create(hostile_spec(ttl=-5))
    with pytest.raises(ConfigurationError, match="project"):
        await shared.create(InstanceSpec("x@1", project=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigurationError, match="is not a directory"):
        await shared.create(hostile_spec(storage=str(tmp_path / "nowhere")))
    info = await shared.create(hostile_spec())
    with pytest.raises(ConfigurationError, match="n >= 1"):
        await shared.fork(info.id, 0)
    with pytest.raises(ConfigurationError, match="`ttl`: duration `-1`"):
        await shared.renew(info.id, -1)


async def test_started_on_demand_and_instances_outlive_the_client(
    engine: DaemonEngine, state_dir: Path
) -> None:
    assert not (state_dir / "engine.sock").exists()
    assert not _daemon_alive(state_dir)
    info = await engine.create(hostile_spec())
    pid = _pid(state_dir)
    assert _alive(pid)
    assert (state_dir / "daemon.log").exists()
    # the same object from another event loop (a thread's asyncio.run): a session of its own
    assert (await asyncio.to_thread(asyncio.run, engine.get(info.id))).id == info.id
    await call(info, "remember", {"key": "k", "value": "v"})
    await engine.aclose()
    await engine.aclose()  # idempotent
    with pytest.raises(ClosedError, match="is closed; create a new DaemonEngine"):
        await engine.get(info.id)

    async with DaemonEngine(state_dir) as second:  # e.g. a restarted hub
        assert (await second.get(info.id)).state is InstanceState.RUNNING
        assert info.id in [i.id for i in await second.list()]
        async with Environment.attach(info.url or "", token=info.token) as env:
            assert await env.call_function("recall", {"key": "k"}) == "v"
        assert (await second.delete(info.id)).reason is TerminationReason.DELETED
    assert _pid(state_dir) == pid  # one daemon all along


async def test_concurrent_first_calls_start_one_daemon(state_dir: Path) -> None:
    engines = [DaemonEngine(state_dir) for _ in range(3)]
    try:
        infos = await asyncio.gather(*(e.create(hostile_spec()) for e in engines for _ in "ab"))
        assert len({i.id for i in infos}) == 6
        assert len(await engines[0].list()) == 6
        # a daemon started in the race leaves at once (the state directory's lock): one stays
        await until(lambda: len(_daemons(state_dir)) == 1, "one daemon")
        assert _daemons(state_dir) == [_pid(state_dir)]
    finally:
        for other in engines[1:]:
            await other.aclose()
        await engines[0].shutdown()


async def test_shutdown_ends_the_daemon_and_its_instances(
    engine: DaemonEngine, state_dir: Path
) -> None:
    info = await engine.create(hostile_spec())
    (child,) = await engine.fork(info.id, 1)
    pid = _pid(state_dir)
    assert _instance_processes(pid)
    await engine.shutdown()
    assert not _alive(pid)
    assert not (state_dir / "engine.sock").exists()
    assert not (state_dir / "engine.pid").exists()
    await until(lambda: not _instance_processes(pid), "the instances to end")
    for url in (info.url, child.url):
        with pytest.raises(httpx.TransportError):
            async with httpx.AsyncClient() as http:
                await http.get(f"{url}/aenv/v1/info", timeout=5)
    await engine.shutdown()  # nothing running: no error


async def test_a_killed_daemon_is_restarted_without_its_instances(
    engine: DaemonEngine, state_dir: Path
) -> None:
    info = await engine.create(hostile_spec())
    pid = _pid(state_dir)
    os.kill(pid, signal.SIGKILL)
    await until(lambda: not _alive(pid), "the daemon to die")
    # its template processes see it go and take the instances with them
    await until(lambda: not _instance_processes(pid), "the instances to end")
    with pytest.raises(InstanceNotFoundError):
        await engine.get(info.id)
    assert _pid(state_dir) != pid  # a new daemon answered
    assert await engine.list() == []
    again = await engine.create(hostile_spec())
    assert again.state is InstanceState.RUNNING


async def test_a_daemon_that_cannot_start_points_at_its_log(state_dir: Path) -> None:
    (state_dir / "engine.lock").mkdir()  # the daemon cannot take its lock: it exits at once
    async with DaemonEngine(state_dir) as engine:
        with pytest.raises(AEnvError, match=r"daemon\.log") as caught:
            await engine.list()
    assert "IsADirectoryError" in str(caught.value)  # the log's tail is in the message
    assert not _daemon_alive(state_dir)


def test_a_state_dir_too_long_for_a_socket_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="too long"):
        DaemonEngine("/tmp/" + "x" * 120)


def _groups(daemon_pid: int, pattern: str) -> set[str]:
    """The names of the daemon's engine's cgroups ``aenv-<owner>/<zygote>/<pattern>``, in any
    hierarchy: ``i-<id>`` an instance's, ``t<n>`` a template's."""
    return {
        group.name
        for root in hierarchy_roots()
        for group in root.glob(f"aenv-{daemon_pid}-*/*/{pattern}")
        if group.is_dir()
    }


async def _terminated_of(engine: DaemonEngine, env_ref: str) -> bool:
    """Whether ``env_ref`` has an instance at the daemon, and all it has are terminated."""
    infos = await engine.list(env_ref=env_ref)
    return bool(infos) and all(i.state is InstanceState.TERMINATED for i in infos)


async def until_async(predicate: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def _live(state_dir: Path) -> list[str]:
    """The daemon's instances not terminated, asked by a client of its own."""
    async with DaemonEngine(state_dir) as other:
        return [i.id for i in await other.list() if i.state is not InstanceState.TERMINATED]


async def test_a_cancelled_create_leaves_no_instance(state_dir: Path) -> None:
    """A create cancelled while the daemon starts the instance (an episode's timeout) has it
    deleted: the client sends the create again with its idempotency key, which answers the
    instance the first one made, and deletes that; ``aclose`` waits for it."""
    engine = DaemonEngine(state_dir)
    try:
        await engine.list()  # the daemon runs: what follows is the create alone
        pid = _pid(state_dir)
        starting = asyncio.ensure_future(engine.create(hostile_spec()))
        # under way at the daemon: the template's zygote (cold) is starting for it
        await until(lambda: bool(_instance_processes(pid)), "the create to reach the daemon")
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await engine.aclose()  # waits for the deletion
        assert await _live(state_dir) == []
        # its cgroup goes once its processes are reaped (the zygote removes it)
        await until(lambda: not _groups(pid, "i-*"), "the instance's cgroup to go")

        # the control: the same create, not cancelled, leaves a running instance
        async with DaemonEngine(state_dir) as again:
            made = await again.create(hostile_spec())
        assert await _live(state_dir) == [made.id]
        # where the engine uses cgroups (its template has one), the instance has its own
        assert _groups(pid, "i-*") == ({f"i-{made.id}"} if _groups(pid, "t*") else set())

        # a caller gone before the answer without a key to send again with (its process
        # ended): the daemon deletes what it made for nobody
        _, project = resolve_environment("mini-terminal@1.0.0", "")
        connector = aiohttp.UnixConnector(path=str(state_dir / "engine.sock"))
        async with aiohttp.ClientSession(connector=connector) as raw:
            body = {"env": "mini-terminal@1.0.0", "project": str(project)}
            posting = asyncio.ensure_future(raw.post("http://engine/v1/instances", json=body))
            shown = f"local_backend.zygote\0{project}\0".encode()  # this daemon's only: the
            await until(  # session's other engines may run mini-terminal zygotes of their own
                lambda: any(shown in _cmdline(p) for p in _instance_processes(pid)),
                "the mini-terminal create to reach the daemon",
            )
            posting.cancel()
        async with DaemonEngine(state_dir) as again:
            await until_async(
                lambda: _terminated_of(again, "mini-terminal@1.0.0"), "its instance deleted"
            )
        assert await _live(state_dir) == [made.id]
    finally:
        await DaemonEngine(state_dir).shutdown()
