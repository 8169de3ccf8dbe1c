"""Zygotes forked warm from the engine's launcher (local_backend/_launcher.py).

The engine's first zygote is exec'd cold and forks a launcher once the runtime is imported;
later zygotes fork from it. Checked on real engines: who is whose parent, what each process
shows and holds, and that a launcher that is gone only means cold zygotes again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from aenv_ray import Environment, InstanceInfo, InstanceSpec
from builtin_envs import builtin_path
from local_backend import Isolation, LocalEngine
from local_backend._sandbox import namespaces_available
from tests._hostile import HOSTILE, call, hostile_spec
from tests._processes import processes_of

pytestmark = pytest.mark.skipif(
    namespaces_available() is not None, reason=f"no namespaces: {namespaces_available()}"
)

PROBE = Path(__file__).resolve().parent / "envs" / "probe"
CANARY = "AENV_LAUNCHER_TEST_CANARY"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as block:
        return block.read()


def _words(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")


def _zygote_of(owner: str, project: Path) -> int:
    """The zygote of ``project``: the process of ``owner`` that shows ``project`` first and
    whose parent shows something else (its templates and instances are its descendants)."""
    shown = str(project).encode()
    mine = [p for p in processes_of(owner) if shown in _words(p)]
    (zygote,) = [p for p in mine if _parent(p) not in mine]
    return zygote


async def _echo(info: InstanceInfo, text: str) -> str:
    assert info.url is not None
    async with Environment.attach(info.url, token=info.token) as env:
        result = await env.call_tool("echo", {"text": text})
    assert not result.is_error, result.text
    return result.text


def _launcher_of(owner: str) -> int:
    (launcher,) = [p for p in processes_of(owner) if b"--launcher" in _words(p)]
    return launcher


async def test_later_zygotes_fork_from_the_launcher_and_show_their_own_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CANARY, "the engine's own variable, never a zygote's")
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    try:
        first = await engine.create(hostile_spec())
        cold = _zygote_of(engine.owner, HOSTILE)
        assert _parent(cold) == os.getpid()  # the first: exec'd by the engine
        launcher = _launcher_of(engine.owner)
        assert _parent(launcher) == cold  # forked by it, before anything of its own
        assert _words(launcher)[-3:] == [b"--launcher", b"--owner", engine.owner.encode()]
        second = await engine.create(InstanceSpec("probe@0.1.0", project=str(PROBE)))
        warm = _zygote_of(engine.owner, PROBE)
        assert _parent(warm) == launcher
        assert _words(warm)[1:4] == [b"-m", b"local_backend.zygote", str(PROBE).encode()]
        assert b"--launcher" not in _words(warm)
        # the same environment block as the cold one: built for zygotes, nothing of the engine
        environ = _environ(warm)
        assert environ == _environ(cold)
        assert CANARY.encode() not in environ
        assert CANARY.encode() not in _environ(launcher)
        # the launcher holds nothing but the standard streams, its one socket to the engine,
        # its selector and a pidfd per live zygote (none of a zygote's sockets or files)
        held = {
            int(fd): os.readlink(f"/proc/{launcher}/fd/{fd}")
            for fd in os.listdir(f"/proc/{launcher}/fd")
        }
        kinds = sorted(
            target.split(":")[0] if target.startswith("socket:") else target
            for fd, target in held.items()
            if fd > 2
        )
        assert kinds == ["anon_inode:[eventpoll]", "anon_inode:[pidfd]", "socket"], held
        # both serve, each from its own template
        assert (await call(first, "identity"))["pids"] == [1, 2]
        assert await _echo(second, "warm") == "warm"
    finally:
        await engine.aclose()
    assert processes_of(engine.owner) == []  # the launcher went with its engine


async def test_a_definition_inspected_then_created_gets_a_warm_zygote() -> None:
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    try:
        manifest = await engine.inspect(PROBE)  # its zygote is started for this and stopped
        assert manifest["tools"]
        launcher = _launcher_of(engine.owner)  # it outlives the zygote that forked it
        info = await engine.create(InstanceSpec("probe@0.1.0", project=str(PROBE)))
        assert _parent(_zygote_of(engine.owner, PROBE)) == launcher
        assert await _echo(info, "after inspect") == "after inspect"
    finally:
        await engine.aclose()
    assert processes_of(engine.owner) == []


async def test_without_its_launcher_the_engine_starts_zygotes_cold_again() -> None:
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    try:
        await engine.create(hostile_spec())
        launcher = _launcher_of(engine.owner)
        os.kill(launcher, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while launcher in processes_of(engine.owner):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        info = await engine.create(InstanceSpec("probe@0.1.0", project=str(PROBE)))
        assert await _echo(info, "cold again") == "cold again"
        assert _parent(_zygote_of(engine.owner, PROBE)) == os.getpid()
        # ... and that cold one brought a new launcher for the next
        assert _launcher_of(engine.owner) != launcher
        mini = builtin_path("mini-terminal")
        await engine.create(InstanceSpec("mini-terminal@1.0.0", project=str(mini)))
        assert _parent(_zygote_of(engine.owner, mini)) == _launcher_of(engine.owner)
    finally:
        await engine.aclose()
    assert processes_of(engine.owner) == []
