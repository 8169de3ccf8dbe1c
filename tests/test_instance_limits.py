"""What one call does cannot end its instance (issue 22, point 3), in real instances of the
local engine: a fork bomb and a memory hog fail their call naming the limit, without touching
``oom_score_adj``; an oversized result, oversized or many large arguments, a full workspace
each give a typed error; the instance serves the next call every time.

The instances are the ``unruly`` test project's (256 MiB, 64 processes) and a copy of it with
512 processes, where memory runs out before processes do (as in the issue: an ``os.fork`` loop
in the runtime itself reached the memory limit and the kernel killed the runtime)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from aenv_ray import (
    Environment,
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    RequestTooLargeError,
    ToolErrorKind,
)
from local_backend import Isolation, LocalEngine
from local_backend._sandbox import namespaces_available

UNRULY = Path(__file__).parent / "envs" / "unruly"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="cgroup limits need root")

NO_NAMESPACES = namespaces_available()
pytestmark = pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    yield engine
    engine.close()


def _variant(where: Path, **deploy: object) -> Path:
    project = where / "unruly"
    shutil.copytree(UNRULY, project)
    config = json.loads((project / "config.json").read_text())
    config["deployConfig"].update(deploy)
    (project / "config.json").write_text(json.dumps(config))
    return project


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unruly project with 512 processes: memory runs out first."""
    return _variant(tmp_path_factory.mktemp("wide"), pids=512)


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unruly project with 1 GiB, as in the issue's many large arguments."""
    return _variant(tmp_path_factory.mktemp("large"), memory="1G")


async def _instance(engine: LocalEngine, project: Path) -> AsyncIterator[InstanceInfo]:
    info = await engine.create(InstanceSpec("unruly@1.0.0", project=str(project)))
    try:
        yield info
    finally:
        await engine.delete(info.id)


@pytest.fixture
async def unruly(engine: LocalEngine) -> AsyncIterator[InstanceInfo]:
    async for info in _instance(engine, UNRULY):
        yield info


@pytest.fixture
async def unruly_wide(engine: LocalEngine, wide: Path) -> AsyncIterator[InstanceInfo]:
    async for info in _instance(engine, wide):
        yield info


def _attach(info: InstanceInfo) -> Environment:
    return Environment.attach(info.url or "", token=info.token, timeout=120)


@root_only
async def test_an_os_fork_loop_in_the_runtime_fails_its_call_naming_the_memory_limit(
    engine: LocalEngine, unruly_wide: InstanceInfo
) -> None:
    async with _attach(unruly_wide) as env:
        placed = (await env.call_tool("cgroups")).structured
        settings = (await env.call_tool("process_settings")).structured
        loop = await env.call_tool("fork_loop", {"seconds": 60})
        after = await env.call_tool("sync_ping")
        again = await env.call_tool("child_hog", {"megabytes": 1})  # the next call may fork
        last = await env.call_tool("ping")
    # the processes calls start are in a cgroup of their own, below the instance's
    ours = {key: [line for line in lines if "/aenv-" in line] for key, lines in placed.items()}
    assert ours["child"], placed
    assert all(line.endswith("/work") for line in ours["child"]), placed
    assert not any(line.endswith("/work") for line in ours["runtime"]), placed
    # ... so nobody's oom_score_adj is raised to protect the runtime
    assert settings["runtime"]["oom_score_adj"] == settings["subprocess"]["oom_score_adj"] == 0
    assert loop.error_kind is ToolErrorKind.RESOURCE_LIMIT, loop.text
    assert loop.text.startswith(
        "tool `fork_loop`: the instance's memory (256 MiB) was nearly used up during this call: "
        "the runtime refused to start a process; the "
    ), loop.text
    assert "processes started since were killed" in loop.text
    # the loop ended on the refusal, past the 64 processes the small instance would allow
    assert loop.structured["error"].startswith("BlockingIOError: [Errno 11] fork refused")
    assert loop.structured["forked"] > 64
    assert after.text == last.text == "pong"
    assert again.structured == {"returncode": 0, "stdout": "survived"}, again.text
    assert (await engine.get(unruly_wide.id)).state is InstanceState.RUNNING


@root_only
async def test_a_fork_bomb_of_a_child_fails_its_call_at_the_calls_process_limit(
    engine: LocalEngine, unruly_wide: InstanceInfo
) -> None:
    async with _attach(unruly_wide) as env:
        bomb = await env.call_tool("fork_bomb", {"seconds": 60})
        hog = await env.call_tool("child_hog", {"megabytes": 2048})
        after = await env.call_tool("ping")
    assert bomb.error_kind is ToolErrorKind.RESOURCE_LIMIT, bomb.text
    assert "calls hit their process limit (480 of the instance's 512)" in bomb.text, bomb.text
    assert hog.error_kind is ToolErrorKind.RESOURCE_LIMIT, hog.text
    assert "memory limit (192 MiB of the instance's 256 MiB)" in hog.text
    assert hog.structured == {"returncode": -9, "stdout": ""}  # the hog, not the runtime
    assert after.text == "pong"
    assert (await engine.get(unruly_wide.id)).state is InstanceState.RUNNING


async def test_oversized_results_arguments_and_a_full_workspace_are_typed_errors(
    engine: LocalEngine, unruly: InstanceInfo
) -> None:
    async with _attach(unruly) as env:
        result = await env.call_tool("big_text", {"megabytes": 65})
        fits = await env.call_tool("big_text", {"megabytes": 1})
        unsendable = await env.call_tool("big_text", {"megabytes": 20})  # JSON needs ~16x
        with pytest.raises(RequestTooLargeError) as arguments:
            await env.call_tool("echo_size", {"data": "a" * (40 << 20)})  # over 256 MiB / 16
        full = await env.call_tool("fill_workspace", {"megabytes": 300})
        await env.call_tool("remove_file", {"name": "fill.bin"})
        child = await env.call_tool("fill_workspace", {"megabytes": 300, "in_process": False})
        after = await env.call_tool("sync_ping")
    assert result.error_kind is ToolErrorKind.EXECUTION
    assert "returned a result of 65.0 MiB of JSON, over the limit of 64.0 MiB" in result.text
    assert len(fits.text) == 1 << 20
    assert unsendable.error_kind is ToolErrorKind.RESOURCE_LIMIT, unsendable.text
    assert "more than the runtime has the memory left to send" in unsendable.text
    assert "takes at most 16.0 MiB (a sixteenth of its memory)" in str(arguments.value)
    assert full.error_kind is ToolErrorKind.RESOURCE_LIMIT, full.text
    assert full.text.startswith("tool `fill_workspace` ran out of disk space (OSError: [Errno 28]")
    assert "the workspace (/workspace) holds 128 MiB" in full.text
    # a child writing fills the disk too, and gets ENOSPC, not the kernel's OOM kill
    assert child.structured["returncode"] == 1
    assert "No space left on device" in child.structured["stderr"]
    assert after.text == "pong"
    assert (await engine.get(unruly.id)).state is InstanceState.RUNNING


async def test_many_large_arguments_at_once_take_turns_and_all_succeed(
    engine: LocalEngine, large: Path
) -> None:
    data = "a" * (24 << 20)  # together over the budget (1 GiB / 16): they take turns
    async for info in _instance(engine, large):
        async with _attach(info) as env:
            sizes = await asyncio.gather(
                *(env.call_tool("echo_size", {"data": data}) for _ in range(4))
            )
            after = await env.call_tool("ping")
        assert [r.text for r in sizes] == [str(len(data))] * 4
        assert after.text == "pong"
        assert (await engine.get(info.id)).state is InstanceState.RUNNING
