"""Cleanup is prompt and complete: after SIGKILL of the engine's owner, of a zygote, or a normal
close with many instances, no process, cgroup, mount or temporary directory of ours is left
after a few seconds (polled with a deadline, never timed).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from aenv_ray import InstanceSpec, InstanceState, TerminationReason
from local_backend import Isolation, LocalEngine
from local_backend._cgroups import hierarchy_roots
from local_backend._sandbox import namespaces_available
from tests._hostile import HOSTILE, call, hostile_spec
from tests._processes import processes_of

REPO = Path(__file__).resolve().parent.parent
NO_NAMESPACES = namespaces_available()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))
PROMPTLY = 15.0  # seconds: "a few", generous for a loaded 2-core machine
CLEAN: dict[str, list[str]] = {"processes": [], "cgroups": [], "mounts": [], "temp": []}


def leftovers(owner: str, *, launcher: bool = False) -> dict[str, list[str]]:
    """What of the engine ``owner`` is still there: processes, cgroups, mounts, temp dirs;
    ``launcher``: but its zygote launcher (it lives as long as its engine)."""
    groups = [str(g) for root in hierarchy_roots() for g in root.glob(f"aenv-{owner}*")]
    mounts = [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "aenv-" in line
    ]
    scratch = Path(tempfile.gettempdir())
    temp = [
        str(p)
        # each names its engine: other engines (other pytest workers') may have theirs now
        for pattern in (f"aenv-root-{owner}-*", f"aenv-instance-{owner}-*", f"aenv-fork-{owner}-*")
        for p in scratch.glob(pattern)
        if _modified_since(p, STARTED - 1)
    ]
    return {
        "processes": [str(p) for p in processes_of(owner) if not (launcher and _is_launcher(p))],
        "cgroups": groups,
        "mounts": mounts,
        "temp": temp,
    }


STARTED = time.time()


def _modified_since(path: Path, when: float) -> bool:
    """True if ``path`` exists and changed at ``when`` or later (it may vanish as we look: the
    cleanup being waited for removes it)."""
    try:
        return path.stat().st_mtime >= when
    except FileNotFoundError:
        return False


def wait_clean(
    owner: str, seconds: float = PROMPTLY, *, launcher: bool = False
) -> dict[str, list[str]]:
    """Poll until nothing of ``owner`` is left (or the deadline passed); what was left."""
    deadline = time.monotonic() + seconds
    while True:
        left = leftovers(owner, launcher=launcher)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


_OWNER_SCRIPT = """
import asyncio, json, sys
from aenv_ray import InstanceSpec
from local_backend import Isolation, LocalEngine

async def main():
    engine = LocalEngine(isolation=Isolation(sys.argv[2]))
    spec = InstanceSpec("hostile@1.0.0", project=sys.argv[1])
    count = int(sys.argv[3])
    infos = []
    for start in range(0, count, 50):
        batch = min(50, count - start)
        infos += await asyncio.gather(*(engine.create(spec, timeout=300) for _ in range(batch)))
    forks = await engine.fork(infos[0].id, 2)
    print(json.dumps({"owner": engine.owner, "created": len(infos) + len(forks)}), flush=True)
    await asyncio.sleep(3600)  # the test kills this process, the owner, with SIGKILL

asyncio.run(main())
"""


def run_owner(isolation: str, count: int) -> tuple[subprocess.Popen[str], dict[str, object]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, str(HOSTILE), isolation, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert owner.stdout is not None
    try:
        line = owner.stdout.readline()
    except BaseException:  # the test's timeout, mid-creation: never leave the owner running
        kill_owner(owner)
        raise
    if not line:
        owner.wait(timeout=30)
        assert owner.stderr is not None
        pytest.fail(f"the owner failed: {owner.stderr.read()[-3000:]}")
    return owner, json.loads(line)


def kill_owner(owner: subprocess.Popen[str]) -> None:
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=30)
    for stream in (owner.stdout, owner.stderr):
        if stream is not None:
            stream.close()


@needs_namespaces
def test_sigkill_of_the_owner_leaves_nothing() -> None:
    owner, said = run_owner("namespaces", 8)
    assert len(processes_of(str(said["owner"]))) > 8
    kill_owner(owner)
    assert wait_clean(str(said["owner"])) == CLEAN


def test_sigkill_of_the_owner_of_plain_processes_leaves_nothing() -> None:
    owner, said = run_owner("none", 4)
    kill_owner(owner)
    assert wait_clean(str(said["owner"])) == CLEAN


@needs_namespaces
@pytest.mark.timeout(400)  # a deadline: ~30 s on a quiet 2-core machine, minutes under load
def test_a_thousand_instances_go_with_their_owner() -> None:
    owner, said = run_owner("namespaces", 1000)
    assert said["created"] == 1002
    kill_owner(owner)
    left = wait_clean(str(said["owner"]), seconds=180.0)  # 2,000+ processes to kill and reap
    assert left == CLEAN


@needs_namespaces
async def test_sigkill_of_a_zygote_is_noticed_and_cleaned_up_by_the_engine() -> None:
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    try:
        first = await engine.create(hostile_spec())
        second = await engine.create(hostile_spec())
        (child,) = await engine.fork(first.id, 1)
        zygotes = [pid for pid in processes_of(engine.owner) if _parent(pid) == os.getpid()]
        assert len(zygotes) == 1, zygotes  # the engine's only child: the zygote
        os.kill(zygotes[0], signal.SIGKILL)
        deadline = time.monotonic() + PROMPTLY
        for info in (first, second, child):
            while (await engine.get(info.id)).state is not InstanceState.TERMINATED:
                assert time.monotonic() < deadline, "the engine did not notice its zygote's death"
                await asyncio.sleep(0.05)
        ended = await engine.get(second.id)
        assert ended.reason is TerminationReason.CRASHED
        assert "template" in ended.detail
        # all but the engine's zygote launcher (local_backend/_launcher.py), which the zygote
        # forked before anything of its own and which lives until the engine closes
        (launcher,) = [p for p in processes_of(engine.owner) if _is_launcher(p)]
        left = await asyncio.to_thread(wait_clean, engine.owner, launcher=True)
        assert left == CLEAN
        # and the engine goes on: a new zygote for the next instance, forked by the launcher
        again = await engine.create(hostile_spec())
        assert (await call(again, "identity"))["pids"] == [1, 2]
        zygotes = [p for p in processes_of(engine.owner) if _parent(p) == launcher]
        assert len(zygotes) == 1, zygotes
    finally:
        await engine.aclose()
    left = await asyncio.to_thread(wait_clean, engine.owner)
    assert left == CLEAN


@needs_namespaces
async def test_closing_the_engine_with_many_instances_leaves_nothing() -> None:
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    spec = InstanceSpec("hostile@1.0.0", project=str(HOSTILE))
    infos = await asyncio.gather(*(engine.create(spec) for _ in range(40)))
    await engine.fork(infos[0].id, 3)
    await engine.aclose()  # returns once its zygotes are gone
    left = leftovers(engine.owner)
    assert left["processes"] == []
    assert left["cgroups"] == []
    assert await asyncio.to_thread(wait_clean, engine.owner) == CLEAN


def _is_launcher(pid: int) -> bool:
    try:
        return b"--launcher" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
