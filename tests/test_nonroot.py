"""What a user without root runs, run as one: ``aenv rollout`` (on Ray and without), the SDK,
``aenv instance``, and the engine daemon's separation between users.

The suite runs as root, so every command here runs as ``nobody`` (``setpriv``, the
``unprivileged`` fixture: its own home, nothing of root's); run by another user, as that user.
The commands are the CLI's own (``python -m aenv_cli``: nobody may not run root's
``.venv/bin/aenv``, whose interpreter is under /root on some machines). Each test asserts on
what the user sees: exit codes, stdout, the one loud warning on stderr, the files written.

Delegated cgroups: a subtree root gives nobody (v1 ``memory``, ``pids`` and ``cpu`` groups,
chowned to it, the engine started inside them) is used as root's own: an instance's fork bomb
stops at the project's ``pids`` limit, and no NO RESOURCE LIMITS warning is given.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.errors import ConfigurationError
from local_backend.client import DaemonEngine
from tests._nobody import NOBODY

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "tests" / "envs" / "hostile"
PROBE = REPO / "tests" / "envs" / "probe"
WARNING = "NO RESOURCE LIMITS"

Unprivileged = tuple[list[str], dict[str, str]]


def _run(
    unprivileged: Unprivileged, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    command, base = unprivileged
    return subprocess.run(
        [*command, *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=base["HOME"],
    )


def _aenv(
    unprivileged: Unprivileged, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return _run(unprivileged, "-m", "aenv_cli", *args, env=env)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("ray", [False, True], ids=["no-ray", "ray"])
def test_the_main_job_runs_as_a_user_without_root(unprivileged: Unprivileged, ray: bool) -> None:
    out = Path(unprivileged[1]["HOME"]) / f"runs-{'ray' if ray else 'no-ray'}"
    flags = [] if ray else ["--no-ray"]
    args = ["--episodes", "4", "--concurrency", "2", "--out", str(out), *flags]
    result = _aenv(unprivileged, "rollout", "mini-terminal@1.0.0", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "episodes (this run / skipped)" in result.stderr  # the summary
    assert f"trajectories: {out}/trajectories.jsonl" in result.stderr.replace("\n", "")
    rows = _rows(out / "trajectories.jsonl")
    assert len(rows) == 4
    assert {r["outcome"] for r in rows} == {"ok"}
    assert [r["reward"] for r in rows] == [1.0] * 4
    assert all(r["env_ref"] == "mini-terminal@1.0.0" and r["steps"] for r in rows)
    assert (out / "trajectories.parquet").stat().st_size > 0
    user = NOBODY if os.geteuid() == 0 else os.geteuid()
    assert {p.stat().st_uid for p in out.iterdir()} == {user}
    assert result.stderr.count(WARNING) == 1, result.stderr[-3000:]  # Ray or not: said once


_SDK = r"""
import asyncio, json, sys
from aenv_ray import Environment

async def main():
    out = {}
    async with Environment("mini-terminal@1.0.0", timeout=60) as env:
        out["tools"] = [t["name"] for t in await env.list_tools()]
        result = await env.call_tool("execute_command", {"command": "echo hi > a.txt; id -u"})
        out["call"] = [result.is_error, result.structured]
        out["reward"] = await env.call_reward({"path": "a.txt", "expected": "hi"})
    env = Environment.from_project(sys.argv[1], timeout=60)
    out["project_tools"] = len(await env.list_tools())
    await env.release()
    print(json.dumps(out), flush=True)

asyncio.run(main())
"""


def test_the_sdk_as_a_user_without_root(unprivileged: Unprivileged) -> None:
    result = _run(unprivileged, "-c", _SDK, str(PROBE))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert "mini-terminal@1.0.0/execute_command" in out["tools"]
    is_error, structured = out["call"]
    assert is_error is False
    assert structured["output"] == "0\n"  # root of its own user namespace
    assert out["reward"] == 1.0
    assert out["project_tools"] > 0
    # two environment definitions (two templates), one warning: once per process
    assert result.stderr.count(WARNING) == 1, result.stderr[-3000:]
    assert "not enforced" in result.stderr
    assert "delegated" in result.stderr  # and what to do


@pytest.fixture(scope="module")
def nobody_daemon(unprivileged: Unprivileged) -> Iterator[Path]:
    """Where nobody's ``aenv instance`` keeps its daemon (the default: under its home);
    the daemon is stopped afterwards."""
    state = Path(unprivileged[1]["HOME"]) / ".local" / "state" / "aenv-ray" / "engine"
    yield state
    pid_file = state / "engine.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def _without_state_dir(unprivileged: Unprivileged) -> Unprivileged:
    command, env = unprivileged
    return command, {k: v for k, v in env.items() if k != "AENV_STATE_DIR"}


def test_aenv_instance_as_a_user_without_root(
    unprivileged: Unprivileged, nobody_daemon: Path
) -> None:
    user = _without_state_dir(unprivileged)
    created = _aenv(user, "instance", "create", "mini-terminal", "--ttl", "10m", "--json")
    assert created.returncode == 0, created.stderr[-3000:]
    info = json.loads(created.stdout)
    assert created.stderr.count(WARNING) == 1, created.stderr  # said to the user, not only logged

    # called as a user would: over loopback, with the token it printed
    call = _run(
        user,
        "-c",
        "import asyncio, sys\nfrom aenv_ray import Environment\nasync def main():\n"
        "    async with Environment.attach(sys.argv[1], token=sys.argv[2]) as env:\n"
        "        r = await env.call_tool('execute_command', {'command': 'echo $((6*7))'})\n"
        "    print(r.structured['output'], end='')\nasyncio.run(main())",
        info["url"],
        info["token"],
    )
    assert call.stdout == "42\n", call.stderr[-3000:]

    listed = _aenv(user, "instance", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert [i["id"] for i in json.loads(listed.stdout)] == [info["id"]]
    deleted = _aenv(user, "instance", "delete", info["id"], "--json")
    assert deleted.returncode == 0, deleted.stderr[-3000:]
    assert json.loads(deleted.stdout)["state"] == "terminated"

    # the daemon is nobody's, in its own state directory, reachable by nobody else
    sock = nobody_daemon / "engine.sock"
    assert sock.stat().st_uid == NOBODY
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(nobody_daemon.stat().st_mode) == 0o700


def test_users_never_share_a_daemon(
    unprivileged: Unprivileged, nobody_daemon: Path, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a second user: run as root, this test runs nobody beside it")
    user = _without_state_dir(unprivileged)
    # root's own daemon, up and answering, in a directory others may look into (0755): only
    # its socket's mode keeps them out
    shared = Path(tempfile.mkdtemp(prefix="aenv-root-", dir="/var/tmp"))
    mine = shared / "engine"
    mine.mkdir()
    shared.chmod(0o755)
    mine.chmod(0o755)
    try:
        assert asyncio.run(_list(mine)) == []
        # nobody pointed at root's state directory: refused, saying why
        refused = _aenv(user, "instance", "list", env={"AENV_STATE_DIR": str(mine)})
        assert refused.returncode == 2, refused.stderr
        assert f"{mine} belongs to uid 0" in refused.stderr
        # nor can nobody reach root's socket directly
        reached = _run(unprivileged, "-c", _CONNECT, str(mine / "engine.sock"))
        assert reached.stdout.strip() == "PermissionError", reached
        # and root is refused nobody's daemon (root's permissions would let it in)
        nobody_daemon.mkdir(parents=True, exist_ok=True)
        os.chown(nobody_daemon, NOBODY, NOBODY)
        with pytest.raises(ConfigurationError, match="belongs to uid 65534"):
            asyncio.run(_list(nobody_daemon))
    finally:
        asyncio.run(DaemonEngine(mine).shutdown())
        shutil.rmtree(shared, ignore_errors=True)
    # a state directory nobody cannot even see (root's home, pytest's): refused as well
    hidden = tmp_path / "engine"
    refused = _aenv(user, "instance", "list", env={"AENV_STATE_DIR": str(hidden)})
    assert refused.returncode == 2, refused.stderr
    assert "is not this user's (permission denied)" in refused.stderr


async def _list(state_dir: Path) -> list[Any]:
    async with DaemonEngine(state_dir, idle_exit=60) as engine:
        return await engine.list()


_CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


def _own_v1(controller: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            group = Path("/sys/fs/cgroup") / controller / path.lstrip("/")
            return group if group.is_dir() else None
    return None


@pytest.fixture
def delegated() -> Iterator[list[Path]]:
    """A cgroup v1 subtree of nobody's in each of memory, pids and cpu (as a machine's admin
    would delegate one), removed afterwards with whatever is left in it."""
    from local_backend._cgroups import kill_and_remove

    if os.geteuid() != 0:
        pytest.skip("delegating a cgroup needs root")
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("cgroup v2: the engine uses delegated cgroup v1 subtrees only (see docs)")
    parents = [_own_v1(c) for c in ("memory", "pids", "cpu")]
    if any(p is None for p in parents):
        pytest.skip("no cgroup v1 memory, pids and cpu hierarchies here")
    groups = [p / f"aenv-test-delegated-{uuid.uuid4().hex[:8]}" for p in parents if p]
    try:
        for group in groups:
            group.mkdir()
            for path in (group, group / "cgroup.procs", group / "tasks"):
                os.chown(path, NOBODY, NOBODY)
        yield groups
    finally:
        kill_and_remove(groups)


_LIMITED = r"""
import asyncio, json, sys
from aenv_ray import Environment, InstanceSpec
from local_backend import LocalEngine

async def main():
    engine = LocalEngine()
    info = await engine.create(InstanceSpec("hostile@1.0.0", project=sys.argv[1]))
    async with Environment.attach(info.url, token=info.token) as env:
        bomb = (await env.call_tool("fork_bomb", {"limit": 500})).structured
    await engine.aclose()
    print(json.dumps(bomb), flush=True)

asyncio.run(main())
"""


def test_a_delegated_cgroup_limits_instances_without_root(
    unprivileged: Unprivileged, delegated: list[Path]
) -> None:
    command, env = unprivileged
    # root moves the shell into nobody's groups, then becomes nobody: the engine starts there
    enter = 'for g in $GROUPS_TO_ENTER; do echo $$ > $g/cgroup.procs; done; exec "$@"'
    groups = " ".join(str(g) for g in delegated)
    result = subprocess.run(
        ["/bin/sh", "-c", enter, "sh", *command, "-c", _LIMITED, str(HOSTILE)],
        env={**env, "GROUPS_TO_ENTER": groups},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=env["HOME"],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    bomb = json.loads(result.stdout)
    assert bomb["forked"] < 64, bomb  # hostile's deployConfig: pids 64
    assert "Resource temporarily unavailable" in bomb["error"]
    assert WARNING not in result.stderr
    # the engine's groups went with it; nobody's subtree is left as it was given
    for group in delegated:
        assert [p.name for p in group.iterdir() if p.is_dir()] == []


def test_these_commands_run_as_another_user(unprivileged: Unprivileged) -> None:
    result = _run(unprivileged, "-c", "import os; print(os.geteuid())")
    assert int(result.stdout) == (NOBODY if os.geteuid() == 0 else os.geteuid())
