"""The local engine: lifecycle, TTL, fork, owner death, and hostile code against the sandbox.

Instances are real: forked from a real zygote into real namespaces (when this machine allows
them, else the isolation tests skip) and called over loopback through the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aenv_ray import (
    AEnvError,
    AuthenticationError,
    ConfigurationError,
    Environment,
    InstanceBrokenError,
    InstanceNotFoundError,
    InstanceSpec,
    InstanceState,
    TerminationReason,
    ToolErrorKind,
)
from builtin_envs import builtin_path
from local_backend import Isolation, LocalEngine
from local_backend._cgroups import missing_limits
from local_backend._init import init_binary
from local_backend._sandbox import namespaces_available
from tests._hostile import HOSTILE, call, hostile_spec
from tests._processes import processes_of

REPO = Path(__file__).resolve().parent.parent
TERMINAL = builtin_path("mini-terminal@1.0.0")
NO_NAMESPACES = namespaces_available()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))
# without root, cgroups only in a subtree delegated to the user (else rlimits stand in)
CGROUP_LIMITS_MISSING = "" if os.geteuid() == 0 else " ".join(missing_limits())
CGROUP_LIMITS = not CGROUP_LIMITS_MISSING


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    engine = LocalEngine(isolation=Isolation.AUTO)
    yield engine
    engine.close()


async def wait_for(predicate: Any, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def instance(engine: LocalEngine) -> AsyncIterator[Any]:
    info = await engine.create(hostile_spec())
    yield info
    await engine.delete(info.id)


# -- lifecycle -------------------------------------------------------------------------------


async def test_create_get_list_renew_delete(engine: LocalEngine) -> None:
    info = await engine.create(hostile_spec(ttl=120, labels={"run": "a"}))
    assert info.state is InstanceState.RUNNING
    assert info.env_ref == "hostile@1.0.0"
    assert info.expires_at is not None
    assert 119 < info.expires_at - info.created_at <= 120
    assert await engine.get(info.id) == info
    assert info.id in [i.id for i in await engine.list(env_ref="hostile")]
    assert info.id not in [i.id for i in await engine.list(env_ref="mini-terminal@1.0.0")]
    assert (await call(info, "remember", {"key": "k", "value": "v"}))["keys"] == ["k"]

    renewed = await engine.renew(info.id, 3600)
    assert renewed.expires_at is not None
    assert renewed.expires_at > info.expires_at + 3000

    async with Environment.attach(info.url or "", token=info.token) as env:
        ended = await engine.delete(info.id)
        assert ended.state is InstanceState.TERMINATED
        assert ended.reason is TerminationReason.DELETED
        assert await engine.delete(info.id) == ended  # idempotent
        with pytest.raises(InstanceBrokenError):
            await env.call_tool("identity", {})
    with pytest.raises(InstanceNotFoundError, match="no instance `nope`"):
        await engine.get("nope")


async def test_ttl_from_config_then_expiry(engine: LocalEngine) -> None:
    default = await engine.create(hostile_spec())
    assert default.expires_at is not None
    assert abs(default.expires_at - default.created_at - 600) < 1  # deployConfig.ttl "10m"
    await engine.delete(default.id)

    short = await engine.create(hostile_spec(ttl=0.5))
    async with Environment.attach(short.url or "", token=short.token) as env:

        async def expired() -> bool:
            return (await engine.get(short.id)).state is InstanceState.TERMINATED

        await wait_for(expired, "the TTL to expire the instance")
        ended = await engine.get(short.id)
        assert ended.reason is TerminationReason.EXPIRED
        assert "TTL" in ended.describe_end()
        with pytest.raises(InstanceBrokenError):
            await env.call_tool("identity", {})


async def test_the_runtime_answers_only_requests_with_the_instance_token(
    engine: LocalEngine,
) -> None:
    first = await engine.create(hostile_spec())
    second = await engine.create(hostile_spec())
    try:
        assert first.token
        assert second.token
        assert first.token != second.token
        assert first.token not in repr(first)  # logs never show it
        assert first.headers == {"Authorization": f"Bearer {first.token}"}
        for token in (None, second.token, first.token + "x"):
            with pytest.raises(AuthenticationError, match="Authorization: Bearer"):
                async with Environment.attach(first.url or "", token=token) as env:
                    await env.call_tool("identity", {})
        async with httpx.AsyncClient() as http:  # every route, MCP included
            for method, path in (("GET", "/health"), ("POST", "/aenv/v1/call"), ("POST", "/mcp")):
                answer = await http.request(method, f"{first.url}{path}", json={})
                assert answer.status_code == 401, (path, answer.text)
                assert answer.json()["error_type"] == "unauthorized"
        assert (await call(first, "identity"))["uid"] >= 0
    finally:
        await engine.delete(first.id)
        await engine.delete(second.id)


async def test_a_crashed_instance_is_a_typed_error_and_reported(engine: LocalEngine) -> None:
    info = await engine.create(hostile_spec())
    async with Environment.attach(info.url or "", token=info.token) as env:
        assert (await env.call_tool("identity", {})).structured["cwd"]
        with pytest.raises(InstanceBrokenError):
            await env.call_tool("crash", {})
        # the typed error at once (the server is gone), not a wait for the call's timeout
        with pytest.raises(InstanceBrokenError, match="Release it and create a new one"):
            await env.call_tool("identity", {})

    async def ended() -> bool:
        return (await engine.get(info.id)).state is InstanceState.TERMINATED

    await wait_for(ended, "the engine to notice the crash")
    assert (await engine.get(info.id)).reason is TerminationReason.CRASHED


async def test_fork_copies_python_state_and_workspace(engine: LocalEngine) -> None:
    parent = await engine.create(hostile_spec())
    await call(parent, "remember", {"key": "episode", "value": "setup-done"})
    await call(parent, "write_file", {"path": "notes.txt", "text": "from parent"})

    children = await engine.fork(parent.id, 3)
    assert len({c.id for c in children}) == 3
    assert all(c.parent == parent.id and c.state is InstanceState.RUNNING for c in children)
    for index, child in enumerate(children):
        assert (await call(child, "read_file", {"path": "notes.txt"}))["value"] == "from parent"
        async with Environment.attach(child.url or "", token=child.token) as env:
            assert await env.call_function("recall", {"key": "episode"}) == "setup-done"
        await call(child, "write_file", {"path": "notes.txt", "text": f"child {index}"})
        await call(child, "remember", {"key": "episode", "value": f"child {index}"})
    # every copy is its own: the parent and the siblings saw none of those writes
    assert (await call(parent, "read_file", {"path": "notes.txt"}))["value"] == "from parent"
    async with Environment.attach(parent.url or "", token=parent.token) as env:
        assert await env.call_function("recall", {"key": "episode"}) == "setup-done"
    for index, child in enumerate(children):
        assert (await call(child, "read_file", {"path": "notes.txt"}))["value"] == (
            f"child {index}"
        )
    # the parent can go first; its forks live on
    await engine.delete(parent.id)
    assert (await call(children[0], "identity"))["cwd"]
    for child in children:
        await engine.delete(child.id)


async def test_fork_of_mini_terminal_keeps_files_and_gets_its_own_shell(
    engine: LocalEngine,
) -> None:
    parent = await engine.create(InstanceSpec("mini-terminal@1.0.0", project=str(TERMINAL)))
    command = {"command": "mkdir -p repo && echo base > repo/file && cat repo/file"}
    assert (await call(parent, "execute_command", command))["output"] == "base\n"
    (child,) = await engine.fork(parent.id, 1)
    change = {"command": "echo changed > repo/file && cat repo/file"}
    assert (await call(child, "execute_command", change))["output"] == "changed\n"
    look = {"command": "cat repo/file"}
    assert (await call(parent, "execute_command", look))["output"] == "base\n"
    await engine.delete(parent.id)
    await engine.delete(child.id)


# -- owner death -----------------------------------------------------------------------------

_OWNER = """
import asyncio, sys
from aenv_ray import InstanceSpec
from local_backend import LocalEngine

async def main():
    engine = LocalEngine()
    infos = [await engine.create(InstanceSpec("hostile@1.0.0", project=sys.argv[1]))
             for _ in range(2)]
    await engine.fork(infos[0].id, 1)
    print(engine.owner, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_concurrent_first_creates_of_a_definition_share_one_template() -> None:
    # the first definition's cold start forks the launcher; a later definition's template comes
    # from the launcher, an await during which other creates of it arrive
    engine = LocalEngine(isolation=Isolation.AUTO)
    program = builtin_path("mini-program@1.0.0")
    try:
        await engine.create(InstanceSpec(env_ref="mini-terminal@1.0.0", project=str(TERMINAL)))
        spec = InstanceSpec(env_ref="mini-program@1.0.0", project=str(program))
        infos = await asyncio.gather(*(engine.create(spec) for _ in range(3)))
        assert len({info.id for info in infos}) == 3
        templates = set()
        for pid in processes_of(engine.owner):
            with contextlib.suppress(OSError):
                arguments = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
                if b"local_backend.zygote" in arguments and str(program).encode() in arguments:
                    templates.add(arguments[arguments.index(b"--cgroup-name") + 1])
        assert len(templates) == 1, templates  # one template; its instances carry its name
    finally:
        await engine.aclose()

    async def all_gone() -> bool:  # none left running unowned, as replaced templates were
        return processes_of(engine.owner) == []

    await wait_for(all_gone, "the engine's processes to exit")


def test_instances_die_with_their_owner_even_by_sigkill() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(HOSTILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        owner_id = owner.stdout.readline().strip()
        assert owner_id
        # the zygote and each instance's processes carry the owner id in their command line
        assert len(processes_of(owner_id)) >= 1 + 2 * 2 + 1  # zygote, init+runtime each, a fork
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    deadline = time.monotonic() + 10
    while processes_of(owner_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(owner_id) == []


@needs_namespaces
@pytest.mark.parametrize("pid1", ["compiled", "python"])
async def test_pid_1_reaps_orphans_in_either_form(
    pid1: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pid1 == "python":
        monkeypatch.setenv("AENV_LOCAL_INIT", "python")
    elif init_binary()[0] is None:
        pytest.skip(f"no compiled init here: {init_binary()[1]}")
    engine = LocalEngine()
    try:
        info = await engine.create(hostile_spec())
        table = await call(info, "process_table")
        assert table[0]["pid"] == 1
        expected = ".aenv-init" if pid1 == "compiled" else "local_backend.zygote"
        assert expected in table[0]["command"]
        assert await call(info, "orphans", {"count": 3}) == 3

        async def all_reaped() -> bool:
            rows = await call(info, "process_table")
            return not any(r["state"] == "Z" or "sleep" in r["command"] for r in rows)

        await wait_for(all_reaped, "pid 1 to reap the orphans")
        await engine.delete(info.id)
        assert (await engine.get(info.id)).state is InstanceState.TERMINATED
    finally:
        engine.close()


# -- hostile code ----------------------------------------------------------------------------


@needs_namespaces
async def test_host_files_are_unreadable_or_read_only(instance: Any) -> None:
    url = instance
    shadow = await call(url, "read_file", {"path": "/etc/shadow"})
    assert shadow["ok"] is False
    assert "Permission denied" in shadow["error"]
    home = await call(url, "list_dir", {"path": "/root"})
    assert not home["ok"] or ".bashrc" not in home["value"]
    assert not (await call(url, "list_dir", {"path": "/home"}))["ok"]
    checkout = await call(url, "write_file", {"path": str(REPO / "pwned.txt")})
    assert checkout["ok"] is False
    assert not (REPO / "pwned.txt").exists()
    for target in ("/usr/pwned", "/etc/pwned", "/pwned", "/bin/pwned"):
        assert (await call(url, "write_file", {"path": target}))["ok"] is False, target
    assert (await call(url, "write_file", {"path": "/workspace/mine.txt"}))["ok"] is True


@needs_namespaces
async def test_identity_is_its_own(instance: Any) -> None:
    me = await call(instance, "identity")
    assert me["uid"] == 0  # root inside a user namespace whose root is nobody outside
    assert me["cwd"] == "/workspace"
    assert me["hostname"].startswith("aenv-")
    assert max(me["pids"]) < 100  # its own pid namespace: a handful of processes
    assert not any(key.startswith(("PYTEST", "HOSTNAME")) for key in me["env"])  # no host env
    # the template built the server; the instance's info still names the instance's own process
    async with httpx.AsyncClient() as http:
        info = (await http.get(f"{instance.url}/aenv/v1/info", headers=instance.headers)).json()
    assert info["pid"] == me["pid"]


@needs_namespaces
async def test_other_instances_are_invisible(engine: LocalEngine, instance: Any) -> None:
    await call(instance, "write_file", {"path": "secret.txt", "text": "mine"})
    other = await engine.create(hostile_spec())
    try:
        theirs = await call(other, "list_dir", {"path": "/workspace"})
        assert theirs["value"] == []  # a fresh instance never sees an old one's files
        mine = await call(instance, "identity")
        seen = await call(other, "identity")
        # separate pid namespaces: each sees only its own init and runtime (and its shell)
        assert seen["pids"] == mine["pids"]
        assert len(seen["pids"]) < 5
        assert seen["env"]["AENV_INSTANCE_ID"] == other.id
    finally:
        await engine.delete(other.id)


@needs_namespaces
async def test_nothing_of_the_engine_leaks_in_as_open_files(instance: Any) -> None:
    async with Environment.attach(instance.url or "", token=instance.token) as env:
        files = (await env.call_tool("open_files", {})).structured
    assert isinstance(files, list)
    # the runtime is given read-only descriptors of its own cgroup's event counters (to name a
    # limit it hit) and memory in use (to refuse a fork), write-only ones of its calls' cgroup
    # (to move the processes it starts there: into a group with lower limits, never out of one),
    # nothing else of the engine's: no cgroup directory, pid namespace or host root
    given = (
        "/memory.oom_control",
        "/memory.events",
        "/pids.events",
        "/memory.usage_in_bytes",
        "/memory.current",
        "/work/cgroup.procs",
    )
    leaked = [
        f
        for f in files
        if ("cgroup" in f and not f.endswith(given)) or f.startswith(("pid:", "/.host"))
    ]
    assert not leaked, files


@needs_namespaces
async def test_no_network_by_default(instance: Any) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        port = server.getsockname()[1]
        attempt = await call(instance, "connect", {"host": "127.0.0.1", "port": port})
        assert attempt["ok"] is False
        outside = await call(instance, "connect", {"host": "1.1.1.1", "port": 80})
        assert outside["ok"] is False
    finally:
        server.close()


@needs_namespaces
async def test_fork_bomb_stops_at_the_pids_limit(engine: LocalEngine, instance: Any) -> None:
    async with Environment.attach(instance.url or "", token=instance.token) as env:
        bombed = await env.call_tool("fork_bomb", {"limit": 5000})
    if CGROUP_LIMITS:  # the cgroup's limit, named in the result (else an rlimit stops it)
        assert bombed.error_kind is ToolErrorKind.RESOURCE_LIMIT, bombed.text
        assert "process limit (" in bombed.text, bombed.text  # the instance's, or the calls'
        assert "deployConfig.pids" in bombed.text
    result = bombed.structured  # what the tool itself saw is kept
    assert result["error"] is not None
    assert "Resource temporarily unavailable" in result["error"]
    assert result["forked"] < 64  # deployConfig.pids
    # the instance and the engine go on
    assert (await call(instance, "identity"))["uid"] == 0
    fresh = await engine.create(hostile_spec())
    await engine.delete(fresh.id)


@needs_namespaces
async def test_memory_past_the_limit_kills_only_that_instance(engine: LocalEngine) -> None:
    victim = await engine.create(hostile_spec())
    bystander = await engine.create(hostile_spec())
    try:
        async with Environment.attach(victim.url or "", token=victim.token) as env:
            # in the runtime's own memory: a MemoryError, named, and the instance serves on
            hog = await env.call_tool("allocate", {"megabytes": 400})  # the limit is 256M
            assert hog.error_kind is ToolErrorKind.RESOURCE_LIMIT, hog.text
            assert "256 MiB" in hog.text
            assert (await env.call_tool("identity", {})).structured["uid"] == 0
            if not CGROUP_LIMITS:  # the rest is the kernel's, through the instance's cgroup
                pytest.skip(f"no cgroup here to kill the instance: {CGROUP_LIMITS_MISSING}")
            # its tmpfs workspace is full (ENOSPC) before its memory is: the instance lives
            filled = (await env.call_tool("fill_workspace", {"megabytes": 400})).structured
            assert "No space left" in filled["error"], filled
            assert filled["written_mb"] <= 128  # half the memory limit
            assert (await env.call_tool("identity", {})).structured["uid"] == 0
            # memory the runtime holds, next to its full workspace: the kernel can only kill it
            with pytest.raises(InstanceBrokenError):
                await env.call_tool("allocate", {"megabytes": 150})

        async def ended() -> bool:
            return (await engine.get(victim.id)).state is InstanceState.TERMINATED

        await wait_for(ended, "the engine to notice the OOM kill")
        info = await engine.get(victim.id)
        assert info.reason is TerminationReason.OUT_OF_MEMORY
        assert "memory" in info.describe_end()
        assert (await call(bystander, "identity"))["uid"] == 0
    finally:
        await engine.delete(bystander.id)


@needs_namespaces
async def test_tmp_is_size_limited(instance: Any) -> None:
    result = await call(instance, "fill_tmp", {"megabytes": 1024})
    assert result["error"] is not None
    assert "No space left" in result["error"]
    assert result["written_mb"] <= 32  # an eighth of the memory limit


def _project_with_workspace(root: Path, workspace: str) -> Path:
    """A copy of the hostile project whose ``deployConfig.workspace`` is ``workspace``."""
    import json
    import shutil

    project = root / "hostile"
    shutil.copytree(HOSTILE, project, ignore=shutil.ignore_patterns("__pycache__"))
    config = json.loads((project / "config.json").read_text())
    config.setdefault("deployConfig", {})["workspace"] = workspace
    (project / "config.json").write_text(json.dumps(config))
    return project


@needs_namespaces
async def test_the_workspace_at_another_path_is_private_writable_and_forked(
    engine: LocalEngine, tmp_path: Path
) -> None:
    spec = InstanceSpec("hostile@1.0.0", project=str(_project_with_workspace(tmp_path, "/app")))
    info = await engine.create(spec)
    try:
        me = await call(info, "identity")
        assert me["cwd"] == "/app"
        assert me["env"]["AENV_WORKSPACE"] == me["env"]["HOME"] == "/app"
        assert (await call(info, "write_file", {"path": "/app/a.txt", "text": "one"}))["ok"]
        # /workspace stays, empty and read-only; the root gains nothing writable
        for path in ("/workspace/x", "/x"):
            written = await call(info, "write_file", {"path": path})
            assert "Read-only file system" in str(written.get("error")), path
        (child,) = await engine.fork(info.id, 1)
        assert (await call(child, "identity"))["cwd"] == "/app"
        assert (await call(child, "read_file", {"path": "a.txt"}))["value"] == "one"
        await call(child, "write_file", {"path": "a.txt", "text": "two"})
        assert (await call(info, "read_file", {"path": "a.txt"}))["value"] == "one"
        other = await engine.create(hostile_spec())  # another definition: its own /workspace
        try:
            assert (await call(other, "identity"))["cwd"] == "/workspace"
            assert not (await call(other, "list_dir", {"path": "/app"}))["ok"]
        finally:
            await engine.delete(other.id)
        await engine.delete(child.id)
    finally:
        await engine.delete(info.id)


@needs_namespaces
async def test_a_workspace_over_a_path_the_runtime_needs_is_refused(
    engine: LocalEngine, tmp_path: Path
) -> None:
    from local_backend._sandbox import runtime_paths

    needed = {"/" + p.parts[1] for p in runtime_paths(HOSTILE) if len(p.parts) > 1}
    free = sorted(p for p in needed if p not in ("/usr", "/etc", "/tmp", "/lib", "/lib64"))
    if not free:
        pytest.skip(f"every path the runtime needs here is a system directory: {sorted(needed)}")
    spec = InstanceSpec("hostile@1.0.0", project=str(_project_with_workspace(tmp_path, free[0])))
    with pytest.raises(AEnvError, match=rf"workspace `{free[0]}` would hide"):
        await engine.create(spec)


# -- without namespaces ----------------------------------------------------------------------


async def test_plain_process_fallback_works_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="local_backend")
    engine = LocalEngine(isolation=Isolation.NONE)
    try:
        assert engine.is_isolated is False
        assert "NOT ISOLATED" in caplog.text
        info = await engine.create(hostile_spec())
        me = await call(info, "identity")
        assert me["cwd"].startswith(("/tmp", os.environ.get("TMPDIR", "/tmp")))
        assert me["env"]["AENV_INSTANCE_ID"] == info.id
        await call(info, "write_file", {"path": "f.txt", "text": "parent"})
        (child,) = await engine.fork(info.id, 1)
        assert (await call(child, "read_file", {"path": "f.txt"}))["value"] == "parent"
        await call(child, "write_file", {"path": "f.txt", "text": "child"})
        assert (await call(info, "read_file", {"path": "f.txt"}))["value"] == "parent"
        await engine.delete(info.id)
        await engine.delete(child.id)
    finally:
        await engine.aclose()


def test_unavailable_namespaces_are_a_clear_error_when_required() -> None:
    if NO_NAMESPACES is None:
        engine = LocalEngine(isolation=Isolation.NAMESPACES)
        assert engine.is_isolated
        engine.close()
    else:
        with pytest.raises(ConfigurationError, match="isolation=namespaces") as caught:
            LocalEngine(isolation=Isolation.NAMESPACES)
        assert type(caught.value) is ConfigurationError
