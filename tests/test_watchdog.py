"""The watchdog against real runtimes: an async tool that blocks the event loop is cut at its
deadline and the instance serves on; one that cannot be cut breaks the instance at once (the
process ends, ``on_broken`` hears why); an idle runtime's threads do not wake up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import InstanceBrokenError, ToolErrorKind
from aenv_ray.testing import RuntimeProcess, free_port
from sandbox_runtime import BROKEN_EXIT_CODE

UNRULY = Path(__file__).resolve().parent / "envs" / "unruly"


@pytest.fixture
def unruly() -> Iterator[RuntimeProcess]:
    with RuntimeProcess(UNRULY) as runtime:
        yield runtime


def _wait_exit(process: subprocess.Popen[bytes], timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    code = process.poll()
    assert code is not None, "the runtime did not end"
    return code


async def test_an_async_tool_spinning_on_the_loop_is_cut_and_the_instance_serves_on(
    unruly: RuntimeProcess,
) -> None:
    async with unruly.environment() as env:
        before = (await env.call_tool("sync_ping")).text
        # a well-behaved async call in flight while the loop is blocked finishes too
        nap = asyncio.create_task(env.call_tool("async_nap", {"seconds": 0.05}))
        await asyncio.sleep(0.01)
        spin = await env.call_tool("async_spin")
        assert (await nap).text == "napped 0.05"
        after = await env.call_tool("ping")
        again = await env.call_tool("async_spin")
        assert (await env.call_tool("sync_ping")).text == "pong"
    assert before == "pong"
    assert spin.is_error
    assert spin.error_kind is ToolErrorKind.TIMEOUT
    assert spin.text == "tool `async_spin` timed out after 0.5 s and was interrupted"
    assert after.text == "pong"
    assert again.error_kind is ToolErrorKind.TIMEOUT
    assert unruly.process is not None
    assert unruly.process.poll() is None
    assert "interrupting it" in unruly.log_tail()


async def test_an_async_tool_in_time_sleep_is_interrupted_and_the_instance_serves_on(
    unruly: RuntimeProcess,
) -> None:
    async with unruly.environment() as env:
        slept = await env.call_tool("async_sleep_blocking", {"seconds": 100})
        after = await env.call_tool("ping")
        sync_after = await env.call_tool("sync_ping")
    assert slept.error_kind is ToolErrorKind.TIMEOUT, slept.text
    assert slept.text == "tool `async_sleep_blocking` timed out after 0.5 s and was interrupted"
    assert after.text == sync_after.text == "pong"
    assert unruly.process is not None
    assert unruly.process.poll() is None  # before time.sleep was cut, the instance ended


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("async_spin_stubborn", "did not stop when interrupted"),
        ("async_read_blocking", "did not stop when interrupted"),  # os.read: C code
    ],
)
async def test_an_async_tool_that_cannot_be_cut_breaks_the_instance_at_once(
    unruly: RuntimeProcess, tool: str, why: str
) -> None:
    async with unruly.environment() as env:
        waiting = asyncio.create_task(env.call_tool("async_nap", {"seconds": 30}))
        await asyncio.sleep(0.05)
        with pytest.raises(InstanceBrokenError) as culprit:
            await env.call_tool(tool)
        with pytest.raises(InstanceBrokenError) as bystander:  # every caller, not only it
            await waiting
    assert unruly.process is not None
    assert _wait_exit(unruly.process) == BROKEN_EXIT_CODE
    log = unruly.log_tail()
    assert f"tool `{tool}` blocked the event loop past its 0.5 s timeout" in log
    assert why in log
    # each caller is answered with the real reason, not a dropped connection
    for raised in (culprit.value, bystander.value):
        assert f"tool `{tool}` blocked the event loop past its 0.5 s timeout" in str(raised)
        assert "probably crashed" not in str(raised)


def test_on_broken_hears_the_reason_before_the_process_ends(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(
        "import sys\n"
        "from sandbox_runtime import RuntimeServer, bind_socket, load_project\n"
        "server = RuntimeServer(load_project(sys.argv[1]), "
        "sockets=[bind_socket('127.0.0.1', int(sys.argv[2]))])\n"
        "def report(reason):\n"
        "    with open(sys.argv[3], 'w') as out:\n"
        "        out.write(reason)\n"
        "server.on_broken = report\n"
        "server.run()\n"
    )
    port, reported = free_port(), tmp_path / "reason.txt"
    process = subprocess.Popen(
        [sys.executable, str(script), str(UNRULY), str(port), str(reported)],
        stderr=subprocess.DEVNULL,
    )
    try:

        async def call() -> None:
            env = RuntimeProcess(UNRULY, port=port).environment(startup_timeout=30)
            async with env:
                with pytest.raises(InstanceBrokenError):
                    await env.call_tool("async_spin_stubborn")

        asyncio.run(call())
        assert _wait_exit(process) == BROKEN_EXIT_CODE
    finally:
        process.kill()
        process.wait()
    reason = reported.read_text()
    assert reason.startswith("tool `async_spin_stubborn` blocked the event loop past its 0.5 s")
    assert "Use a sync def for blocking work" in reason


def _context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


async def test_an_idle_runtime_does_not_wake_up_after_async_calls(unruly: RuntimeProcess) -> None:
    async with unruly.environment() as env:
        for _ in range(3):
            assert (await env.call_tool("ping")).text == "pong"  # the watchdog watches these
        assert (await env.call_tool("sync_ping")).text == "pong"
        await asyncio.sleep(0.1)  # the replies are written, the threads back to waiting
        before = _context_switches(unruly.pid)
        for _ in range(4):
            await asyncio.sleep(0.1)
        after = _context_switches(unruly.pid)
    assert after == before, "a thread of the idle runtime woke up"
