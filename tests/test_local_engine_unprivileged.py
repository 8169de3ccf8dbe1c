"""The local engine without root: isolation through unprivileged user namespaces.

The tests run as root, so a script runs the engine as ``nobody`` (``setpriv``), with its home,
cache and state in a directory nobody owns, attacks its instances with the hostile environment and
prints what happened as JSON; the test asserts on that, then kills the script with SIGKILL and
checks that nothing of it is left. Run by another user, the script runs as that user directly.
Skips (saying why) without ``setpriv`` or where this kernel forbids unprivileged user namespaces.

The fallback for kernels that forbid them is tested for real too: inside a user namespace whose
``max_pid_namespaces`` is 0 (``unshare``), the probe fails and says why, and the engine runs plain
processes with its loud warning (or refuses, when namespaces were required).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests._processes import processes_of

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "tests" / "envs" / "hostile"
NOBODY = 65534

_SCRIPT = r"""
import asyncio, json, os, sys, time
from aenv_ray import Environment, InstanceSpec, InstanceState
from local_backend import Isolation, LocalEngine

HOSTILE, REPO, PORT, HOME = sys.argv[1], sys.argv[2], int(sys.argv[3]), os.getcwd()

async def call(info, tool, args=None):
    async with Environment.attach(info.url, token=info.token) as env:
        result = await env.call_tool(tool, args or {})
    assert not result.is_error, result.text
    return result.structured

def processes_of(owner):
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and owner.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                found.append(int(entry))
        except OSError:
            pass
    return found

async def reaped(url):
    for _ in range(200):
        rows = await call(url, "process_table")
        if not any(r["state"] == "Z" or "sleep" in r["command"] for r in rows):
            return True
        await asyncio.sleep(0.05)
    return False

async def attack(engine, out):
    spec = InstanceSpec("hostile@1.0.0", project=HOSTILE)
    started = time.monotonic()
    a = await engine.create(spec)
    out["identity"] = await call(a, "identity")
    out["first_call_ms"] = (time.monotonic() - started) * 1000
    out["pid1"] = (await call(a, "process_table"))[0]
    reads = {p: await call(a, "read_file", {"path": p}) for p in ("/etc/shadow",)}
    lists = {p: await call(a, "list_dir", {"path": p}) for p in ("/root", "/home", HOME)}
    targets = [REPO + "/pwned.txt", "/usr/pwned", "/etc/pwned", "/pwned", "/bin/pwned",
               "/workspace/mine.txt"]
    writes = {p: await call(a, "write_file", {"path": p}) for p in targets}
    out.update(reads=reads, lists=lists, writes=writes)
    out["connect"] = await call(a, "connect", {"host": "127.0.0.1", "port": PORT})
    await call(a, "write_file", {"path": "secret.txt", "text": "mine"})
    b = await engine.create(spec)
    out["other_workspace"] = await call(b, "list_dir", {"path": "/workspace"})
    out["other_identity"] = await call(b, "identity")
    out["orphans"] = await call(a, "orphans", {"count": 3})
    out["orphans_reaped"] = await reaped(a)
    (child,) = await engine.fork(a.id, 1)
    out["fork_sees"] = await call(child, "read_file", {"path": "secret.txt"})
    await call(child, "write_file", {"path": "secret.txt", "text": "child"})
    out["parent_after_fork"] = await call(a, "read_file", {"path": "secret.txt"})
    await engine.delete(a.id)  # the parent goes first; its fork lives on
    out["fork_after_parent"] = await call(child, "read_file", {"path": "secret.txt"})
    before = len(processes_of(engine.owner))
    await engine.delete(b.id)
    for _ in range(100):
        if len(processes_of(engine.owner)) <= before - 2:
            break
        await asyncio.sleep(0.05)
    out["deleted"] = {
        "state": (await engine.get(b.id)).state.value,
        "processes_before": before,
        "processes_after": len(processes_of(engine.owner)),
    }

async def main():
    results = {}
    engines = []
    for pid1 in ("compiled", "python"):
        if pid1 == "python":
            os.environ["AENV_LOCAL_INIT"] = "python"
        engine = LocalEngine(isolation=Isolation.NAMESPACES)
        engines.append(engine)
        out = results[pid1] = {"isolated": engine.is_isolated, "owner": engine.owner}
        await attack(engine, out)
    print(json.dumps(results), flush=True)
    await asyncio.sleep(3600)  # the test kills this process, the owner, with SIGKILL

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def attacked(unprivileged: tuple[list[str], dict[str, str]]) -> dict[str, Any]:
    """Run the script once; yield its results (and stderr, owner death) for every test."""
    command, env = unprivileged
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    owner = subprocess.Popen(
        [*command, "-c", _SCRIPT, str(HOSTILE), str(REPO), str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=env["HOME"],  # the owner's home: never part of an instance's view
    )
    assert owner.stdout is not None
    assert owner.stderr is not None
    with owner.stdout, owner.stderr:
        try:
            line = owner.stdout.readline()
            if line:
                results: dict[str, Any] = json.loads(line)
                owners = [r["owner"] for r in results.values()]
                alive = {o: len(processes_of(o)) for o in owners}
        finally:
            owner.send_signal(signal.SIGKILL)  # the owner dies, by SIGKILL
            owner.wait()
            server.close()
        stderr = owner.stderr.read()
    if not line:
        pytest.fail(f"the unprivileged script failed:\n{stderr[-3000:]}")
    deadline = time.monotonic() + 10
    while any(processes_of(o) for o in owners) and time.monotonic() < deadline:
        time.sleep(0.05)
    results["owner_death"] = {"alive": alive, "left": {o: processes_of(o) for o in owners}}
    results["stderr"] = stderr
    return results


PID1 = ["compiled", "python"]


@pytest.mark.parametrize("pid1", PID1)
def test_an_instance_answers_as_root_of_its_own_namespaces(
    attacked: dict[str, Any], pid1: str
) -> None:
    out = attacked[pid1]
    assert out["isolated"] is True
    me = out["identity"]
    assert me["uid"] == 0  # root inside; the invoking user (nobody here) outside
    assert me["cwd"] == "/workspace"
    assert me["hostname"].startswith("aenv-")
    assert me["pids"] == [1, 2]  # its own pid namespace: its init and its runtime
    expected = ".aenv-init" if pid1 == "compiled" else "local_backend.zygote"
    assert out["pid1"]["pid"] == 1
    assert expected in out["pid1"]["command"]


@pytest.mark.parametrize("pid1", PID1)
def test_host_files_are_unreadable_or_read_only(attacked: dict[str, Any], pid1: str) -> None:
    out = attacked[pid1]
    shadow = out["reads"]["/etc/shadow"]
    assert shadow["ok"] is False
    assert "Permission denied" in shadow["error"]
    root = out["lists"]["/root"]
    assert not root["ok"] or ".bashrc" not in root["value"]
    assert out["lists"]["/home"]["ok"] is False
    home = [path for path in out["lists"] if path not in ("/root", "/home")]
    assert [out["lists"][path]["ok"] for path in home] == [False]  # the engine's cwd, its home
    for path, attempt in out["writes"].items():
        assert attempt["ok"] is (path == "/workspace/mine.txt"), (path, attempt)
    assert not (REPO / "pwned.txt").exists()


@pytest.mark.parametrize("pid1", PID1)
def test_no_network_and_other_instances_invisible(attacked: dict[str, Any], pid1: str) -> None:
    out = attacked[pid1]
    assert out["connect"]["ok"] is False, out["connect"]
    assert out["other_workspace"] == {"ok": True, "value": []}
    assert out["other_identity"]["pids"] == [1, 2]
    assert out["other_identity"]["hostname"] != out["identity"]["hostname"]


@pytest.mark.parametrize("pid1", PID1)
def test_orphans_reaped_fork_and_delete(attacked: dict[str, Any], pid1: str) -> None:
    out = attacked[pid1]
    assert out["orphans"] == 3
    assert out["orphans_reaped"] is True
    assert out["fork_sees"]["value"] == "mine"
    assert out["parent_after_fork"]["value"] == "mine"  # the fork's write stayed its own
    assert out["fork_after_parent"]["value"] == "child"  # deleting the parent left it alive
    deleted = out["deleted"]
    assert deleted["state"] == "terminated"
    assert deleted["processes_after"] <= deleted["processes_before"] - 2  # its init and runtime


def test_owner_death_leaves_no_process(attacked: dict[str, Any]) -> None:
    death = attacked["owner_death"]
    # outer and inner zygote; the first instance's init, kept by its fork; the fork's runtime
    assert all(count >= 4 for count in death["alive"].values()), death
    assert death["left"] == {owner: [] for owner in death["left"]}


def test_missing_cgroup_limits_are_said_loudly(attacked: dict[str, Any]) -> None:
    assert "NO RESOURCE LIMITS" in attacked["stderr"]
    assert "not enforced" in attacked["stderr"]
    assert "NOT ISOLATED" not in attacked["stderr"]


_FORBIDDEN = r"""
import asyncio, json, logging, sys
from aenv_ray import Environment, InstanceSpec
from local_backend import Isolation, LocalEngine
from local_backend._sandbox import namespaces_available

async def main():
    out = {"why_not": namespaces_available()}
    try:
        LocalEngine(isolation=Isolation.NAMESPACES)
    except Exception as exc:
        out["required"] = f"{type(exc).__name__}: {exc}"
    engine = LocalEngine()
    out["isolated"] = engine.is_isolated
    info = await engine.create(InstanceSpec("hostile@1.0.0", project=sys.argv[1]))
    async with Environment.attach(info.url, token=info.token) as env:
        out["cwd"] = (await env.call_tool("identity", {})).structured["cwd"]
    await engine.aclose()
    print(json.dumps(out), flush=True)

asyncio.run(main())
"""

# root of a user namespace that may create no pid namespace, then an ordinary user (1000) in a
# user namespace below it: the limit holds there too, as on a kernel that forbids the recipe
_NO_PID_NAMESPACES = [
    "unshare",
    "--user",
    "--map-root-user",
    "sh",
    "-c",
    "echo 0 > /proc/sys/user/max_pid_namespaces && exec unshare --user --map-user=1000 "
    '--map-group=1000 "$@"',
    "sh",
]


def test_where_the_kernel_forbids_it_the_engine_falls_back_and_says_why(
    unprivileged: tuple[list[str], dict[str, str]],
) -> None:
    command, env = unprivileged
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux) to forbid pid namespaces")
    if os.geteuid() == 0:
        wrapped = [
            *command[:-1],
            *_NO_PID_NAMESPACES,
            command[-1],
        ]  # setpriv ... unshare ... python
    else:
        wrapped = [*_NO_PID_NAMESPACES, *command]
    result = subprocess.run(
        [*wrapped, "-c", _FORBIDDEN, str(HOSTILE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    if "unrecognized option" in result.stderr:
        pytest.skip(f"this unshare cannot map users: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert "No space left on device" in out["why_not"]  # the probe's own words: ENOSPC
    assert "unshare" in out["why_not"]
    assert "isolation=namespaces was asked for" in out["required"]
    assert out["isolated"] is False
    assert "NOT ISOLATED" in result.stderr
    assert out["cwd"].startswith("/tmp")
