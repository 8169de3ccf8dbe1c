"""Resource limits named in results: a runtime in a cgroup of the test's own (256 MiB, 64
processes; as the engine will give each instance), told its limits with
``python -m sandbox_runtime --memory-limit/--pids-limit/--memory-events-fd/--pids-events-fd``
or ``--cgroup``. A memory hog, an in-process hog and a fork bomb each end their call with an
error naming the limit, and the server serves the next call. Without cgroups
(``--rlimits-only``) the limits become rlimits."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import ToolErrorKind, ToolResourceLimitError
from aenv_ray.testing import RuntimeProcess
from sandbox_runtime._limits import InstanceLimits, LimitHit, _counter
from tests._cgroup import TestCgroup

UNRULY = Path(__file__).resolve().parent / "envs" / "unruly"
MEMORY = 256 << 20
PIDS = 64
NAMED = ["--memory-limit", "256M", "--pids-limit", str(PIDS)]
FDS = ["--memory-events-fd", "3", "--pids-events-fd", "4"]


@pytest.fixture
def cgroup() -> Iterator[TestCgroup]:
    with TestCgroup(memory=MEMORY, pids=PIDS) as group:
        yield group


@pytest.fixture
def limited(cgroup: TestCgroup, tmp_path: Path) -> Iterator[RuntimeProcess]:
    python = cgroup.launcher(tmp_path, pass_fds=True)
    with RuntimeProcess(UNRULY, python=str(python), extra_args=NAMED + FDS) as runtime:
        yield runtime


def _rlimits(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/limits").read_text().splitlines()


async def test_a_child_over_the_memory_limit_is_killed_and_the_call_says_so(
    limited: RuntimeProcess,
) -> None:
    async with limited.environment(timeout=60) as env:
        result = await env.call_tool("child_hog", {"megabytes": 2048})
        after = await env.call_tool("sync_ping")
        info = await env.call_tool("ping")
    assert result.is_error
    assert result.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert result.text.startswith(
        "tool `child_hog`: the instance hit its memory limit (256 MiB) during this call: the "
        "kernel killed a process that used too much memory"
    )
    assert "deployConfig.memory" in result.text
    assert result.structured == {"returncode": -9, "stdout": ""}  # what the tool saw, kept
    with pytest.raises(ToolResourceLimitError):
        result.raise_for_error(tool="child_hog")
    assert after.text == info.text == "pong"
    assert limited.process is not None
    assert limited.process.poll() is None  # the runtime itself was not the one killed


async def test_an_in_process_hog_gets_memory_error_naming_the_limit(
    limited: RuntimeProcess,
) -> None:
    async with limited.environment() as env:
        result = await env.call_tool("inprocess_hog", {"gigabytes": 10})
        after = await env.call_tool("sync_ping")
    assert result.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert result.text.startswith("tool `inprocess_hog` ran out of memory (MemoryError")
    assert "the instance's memory limit is 256 MiB" in result.text
    assert after.text == "pong"


async def test_a_fork_bomb_ends_its_call_its_processes_die_the_server_serves(
    limited: RuntimeProcess, cgroup: TestCgroup
) -> None:
    async with limited.environment(timeout=60) as env:
        sleeper = (await env.call_tool("start_sleeper", {"seconds": 60})).structured
        await asyncio.sleep(0.1)  # a quiet moment: the sleeper's call is over and done with
        baseline = cgroup.processes
        result = await env.call_tool("fork_bomb", {"seconds": 30})
        assert cgroup.drained(baseline) <= baseline
        sync_after = await env.call_tool("sync_ping")
        async_after = await env.call_tool("ping")
        sleeper_alive = (await env.call_tool("is_alive", {"pid": sleeper})).structured
    assert result.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert result.text.startswith(
        "tool `fork_bomb`: the instance hit its process limit (64 processes) during this call: "
        "a fork failed; the "
    )
    assert "processes started since were killed" in result.text
    assert "deployConfig.pids" in result.text
    assert result.structured == {"returncode": -9}  # the bomb's first process, killed
    assert sync_after.text == async_after.text == "pong"
    assert sleeper_alive is True  # started before the bomb's call began: not its doing


async def test_children_are_killed_before_the_runtime_and_lack_its_data_limit(
    limited: RuntimeProcess,
) -> None:
    async with limited.environment(timeout=60) as env:
        settings = (await env.call_tool("process_settings")).structured
    runtime = settings["runtime"]
    assert runtime["data"] == MEMORY  # RLIMIT_DATA: an in-process hog gets MemoryError
    for child in (settings["subprocess"], settings["fork"]):
        assert child["oom_score_adj"] == 1000 > runtime["oom_score_adj"]
        assert child["data"] is None  # the cgroup limits it; the kernel kills it
    assert settings["shell"] == 1000  # os.system / shell=True too
    assert runtime["oom_score_adj"] == 0  # put back after each fork


async def test_the_runtime_finds_its_own_cgroups_limits(cgroup: TestCgroup, tmp_path: Path) -> None:
    python = cgroup.launcher(tmp_path, pass_fds=False)
    with RuntimeProcess(UNRULY, python=str(python), extra_args=["--cgroup"]) as runtime:
        async with runtime.environment(timeout=60) as env:
            status, info = await env._request("GET", "/aenv/v1/info", timeout=5)
            hog = await env.call_tool("child_hog", {"megabytes": 2048})
    assert status == 200
    assert info["limits"] == {"memory": MEMORY, "pids": PIDS, "enforced": True}
    assert hog.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert "memory limit (256 MiB)" in hog.text


async def test_without_cgroups_the_limits_are_rlimits_of_the_runtime_and_its_children() -> None:
    extra = ["--memory-limit", "1G", "--pids-limit", "4000", "--rlimits-only"]
    with RuntimeProcess(UNRULY, extra_args=extra) as runtime:
        limits = _rlimits(runtime.pid)
        async with runtime.environment(timeout=60) as env:
            settings = (await env.call_tool("process_settings")).structured
            _, info = await env._request("GET", "/aenv/v1/info", timeout=5)
            hog = await env.call_tool("inprocess_hog", {"gigabytes": 2})
    data = next(line for line in limits if line.startswith("Max data size")).split()
    processes = next(line for line in limits if line.startswith("Max processes")).split()
    assert data[3:5] == ["1073741824", "1073741824"]  # soft and hard: code cannot lift it
    assert processes[2:4] == ["4000", "4000"]
    assert settings["subprocess"]["data"] == settings["runtime"]["data"] == 1 << 30
    assert info["limits"] == {"memory": 1 << 30, "pids": 4000, "enforced": False}
    assert hog.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert "memory limit is 1024 MiB" in hog.text


async def test_without_limits_a_memory_error_is_the_tools_own_failure() -> None:
    with RuntimeProcess(UNRULY) as runtime:
        async with runtime.environment() as env:
            result = await env.call_tool("inprocess_hog", {"gigabytes": 1 << 20})
    assert result.error_kind is ToolErrorKind.EXECUTION
    assert result.text.startswith("tool `inprocess_hog` raised MemoryError")


# -- pieces -------------------------------------------------------------------------------------
def test_event_counters_are_read_from_either_cgroup_version(tmp_path: Path) -> None:
    files = {
        "v1": b"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        "v2": b"low 0\nhigh 0\nmax 7\noom 2\noom_kill 5\noom_group_kill 0\n",
        "pids": b"max 11\n",
    }
    fds = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        fds[name] = os.open(tmp_path / name, os.O_RDONLY)
    try:
        assert _counter(fds["v1"], b"oom_kill") == 3
        assert _counter(fds["v2"], b"oom_kill") == 5
        assert _counter(fds["v2"], b"max") == 7
        assert _counter(fds["pids"], b"max") == 11
        assert _counter(fds["pids"], b"oom_kill") == 0
        assert _counter(None, b"max") == 0
    finally:
        for fd in fds.values():
            os.close(fd)


def test_a_hit_names_each_limit_and_what_to_do() -> None:
    limits = InstanceLimits(memory=512 << 20, pids=128)
    both = LimitHit(memory=True) | LimitHit(pids=True, killed=9, earlier=True)
    text = both.describe(limits)
    assert "memory limit (512 MiB) during or shortly before this call" in text
    assert "process limit (128 processes)" in text
    assert "the 9 processes started since were killed" in text
