"""The local engine against an attacker: environment code at import time, an instance that lies
to the engine on its control channel, forks that try to reach their parent or siblings.

Everything is real: a root or unprivileged engine (the isolation tests skip where this machine
cannot build namespaces), hostile projects in tests/envs, calls over loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import (
    Environment,
    InstanceBrokenError,
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    TerminationReason,
)
from local_backend import Isolation, LocalEngine
from local_backend._sandbox import namespaces_available
from tests._hostile import HOSTILE, call, hostile_spec
from tests._processes import processes_of
from tests._scan import CONTROL, assert_clean, scan_command

HOSTILE_IMPORT = Path(__file__).parent / "envs" / "hostile_import"
NO_NAMESPACES = namespaces_available()
pytestmark = pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    yield engine
    engine.close()


async def wait_for(predicate: Any, what: str, seconds: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# -- environment code at import time -----------------------------------------------------------


def hostile_import_project(where: Path, marker: Path, port: int) -> Path:
    """A copy of tests/envs/hostile_import whose attacks aim at ``marker`` and ``port``."""
    project = where / "hostile-import"
    shutil.copytree(HOSTILE_IMPORT, project)
    config = json.loads((project / "config.json").read_text())
    config["deployConfig"]["env"] = {"HOSTILE_MARKER": str(marker), "HOSTILE_PORT": str(port)}
    (project / "config.json").write_text(json.dumps(config))
    return project


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP server on the host's loopback that nothing sandboxed may reach."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server


def assert_import_contained(attempts: dict[str, Any], marker: Path, secret: str) -> None:
    """What a hostile module's import-time code may and may not have done."""
    shadow = attempts["read_shadow"]
    assert shadow["ok"] is False, shadow
    assert "Permission denied" in shadow["error"]
    root = attempts["list_root"]  # only what the runtime needs (an interpreter under /root)
    assert not root["ok"] or not {".bashrc", ".ssh", ".profile"} & set(root["value"]), root
    assert attempts["write_etc"]["ok"] is False
    assert attempts["write_project"]["ok"] is False  # its project is a read-only copy
    assert attempts["connect_host"]["ok"] is False, attempts["connect_host"]
    assert attempts["connect_outside"]["ok"] is False
    assert secret not in attempts["environment"]["value"]  # the engine's variables stay out
    assert attempts["processes"]["value"] == [1]  # alone in its pid namespace
    assert not marker.exists()  # whatever it wrote stayed in its private /tmp
    assert not Path("/etc/aenv-hostile-import-was-here").exists()


async def test_import_time_code_runs_only_inside_the_sandbox(
    tmp_path: Path, listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "AENV_TEST_SECRET_OF_THE_ENGINE"
    monkeypatch.setenv(secret, "1")
    marker = Path("/tmp") / f"aenv-hostile-marker-{os.getpid()}"
    project = hostile_import_project(tmp_path, marker, listener.getsockname()[1])
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    try:
        manifest = await engine.inspect(project)  # the load check: the same sandbox
        assert [tool["name"] for tool in manifest["tools"]] == ["import_attempts"]
        assert not marker.exists()
        info = await engine.create(InstanceSpec("hostile-import@1.0.0", project=str(project)))
        attempts = await call(info, "import_attempts")
        assert_import_contained(attempts, marker, secret)
        # on the host: nothing the engine started runs as root but the zygote itself and the
        # engine's zygote launcher (forked by the inspect's zygote before anything of the
        # definition's, local_backend/_launcher.py), which forked this create's zygote
        ours = processes_of(engine.owner)
        uids = {pid: _uid(pid) for pid in ours}
        roots = {pid for pid, uid in uids.items() if uid == 0}
        if os.geteuid() == 0:
            launchers = {pid for pid in roots if b"--launcher" in _words(pid)}
            assert len(launchers) == 1, uids
            assert [_parent(pid) for pid in roots - launchers] == [*launchers], uids
            assert all(uid == 65534 for pid, uid in uids.items() if uid != 0), uids
    finally:
        await engine.aclose()


async def test_no_variable_of_the_engine_is_in_any_process_of_an_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shell in the instance reads every /proc/*/environ and cmdline it can see (the
    runtime's, pid 2, kept the zygote's environment block once): no variable of the engine's
    (the driver's) is there; the control, a variable given to the instance, is."""
    canary = f"sk-driver-canary-{uuid.uuid4().hex}"
    for name in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AENV_API_KEY"):
        monkeypatch.setenv(name, canary)
    control = uuid.uuid4().hex
    engine = LocalEngine(isolation=Isolation.NAMESPACES)  # its zygote starts after the canary
    try:
        spec = InstanceSpec("mini-terminal@1.0.0", environment_variables={CONTROL: control})
        info = await engine.create(spec)
        result = await call(info, "execute_command", {"command": scan_command()})
        assert_clean(str(result["output"]), [canary], control)
    finally:
        await engine.aclose()


def _words(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def test_a_project_that_does_not_load_is_a_definition_error_not_a_crash(
    tmp_path: Path,
) -> None:
    project = tmp_path / "broken"
    shutil.copytree(HOSTILE_IMPORT, project)
    (project / "src" / "import_attacks.py").write_text("import os\nraise SystemExit(3)\n")
    from aenv_ray import DefinitionError

    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    try:
        with pytest.raises(DefinitionError, match=r"import_attacks\.py"):
            await engine.inspect(project)
        with pytest.raises(DefinitionError, match="SystemExit"):
            await engine.create(InstanceSpec("hostile-import@1.0.0", project=str(project)))
    finally:
        await engine.aclose()


# -- the zygote trusts no instance ------------------------------------------------------------

ATTACKS = [
    "garbage",
    "truncated",
    "oversized",
    "not_an_object",
    "forged_hello",
    "forged_spawned",
    "forged_fork",
    "deep",
    "fds",
    "flood",
]


@pytest.fixture
async def bystander(engine: LocalEngine) -> AsyncIterator[InstanceInfo]:
    info = await engine.create(hostile_spec())
    await call(info, "remember", {"key": "mine", "value": "kept"})
    yield info
    await engine.delete(info.id)


@pytest.mark.parametrize("attack", ATTACKS)
async def test_lies_on_the_control_channel_cost_only_the_liar(
    engine: LocalEngine, bystander: InstanceInfo, attack: str
) -> None:
    liar = await engine.create(hostile_spec())
    async with Environment.attach(liar.url or "", token=liar.token) as env:

        async def lie_until_killed() -> None:  # it dies while (or right after) it speaks
            for _ in range(100):
                await env.call_tool("control_channel", {"attack": attack})
                await asyncio.sleep(0.02)

        with pytest.raises(InstanceBrokenError):
            await lie_until_killed()

    async def ended() -> bool:
        return (await engine.get(liar.id)).state is InstanceState.TERMINATED

    await wait_for(ended, "the engine to end the liar")
    final = await engine.get(liar.id)
    assert final.reason is TerminationReason.CRASHED
    assert "protocol" in final.detail, final.detail
    # everyone else is untouched: the bystander keeps its state, new instances start
    async with Environment.attach(bystander.url or "", token=bystander.token) as env:
        assert await env.call_function("recall", {"key": "mine"}) == "kept"
    fresh = await engine.create(hostile_spec())
    assert (await call(fresh, "identity"))["pids"] == [1, 2]
    await engine.delete(fresh.id)


async def test_a_legitimate_broken_report_does_not_kill(engine: LocalEngine) -> None:
    info = await engine.create(hostile_spec())
    try:
        assert (await call(info, "control_channel", {"attack": "broken"}))["sent"] >= 1
        assert (await call(info, "identity"))["pids"] == [1, 2]  # it keeps serving
        assert (await engine.get(info.id)).is_running
    finally:
        await engine.delete(info.id)


async def test_a_fork_of_a_busy_instance_blocks_no_one(engine: LocalEngine) -> None:
    busy = await engine.create(hostile_spec())
    other = await engine.create(hostile_spec())
    async with Environment.attach(busy.url or "", token=busy.token) as env:
        working = asyncio.create_task(env.call_tool("busy", {"seconds": 3.0}))
        await asyncio.sleep(0.3)  # the call holds the runtime's worker now
        forking = asyncio.create_task(engine.fork(busy.id, 1))
        await asyncio.sleep(0.1)
        # while the fork waits for the busy instance, the engine serves everyone else
        created = await engine.create(hostile_spec())
        deleted = await engine.delete(other.id)
        assert not working.done(), "the busy call ended before the others were served"
        assert not forking.done()
        assert deleted.state is InstanceState.TERMINATED
        assert (await call(created, "identity"))["pids"] == [1, 2]
        assert (await working).structured == 3.0
        (child,) = await forking
    assert (await call(child, "identity"))["env"]["AENV_INSTANCE_ID"] == child.id
    for info in (busy, created, child):
        await engine.delete(info.id)


# -- forks are isolated from their parent and siblings -----------------------------------------


async def test_a_fork_holds_no_socket_of_its_parent(engine: LocalEngine) -> None:
    parent = await engine.create(hostile_spec())
    try:
        parent_port = int((parent.url or "").rsplit(":", 1)[1])
        assert parent_port in await call(parent, "listening_ports")
        children = await engine.fork(parent.id, 2)
        for child in children:
            child_port = int((child.url or "").rsplit(":", 1)[1])
            ports = await call(child, "listening_ports")
            assert ports == [child_port], ports  # its own socket only, never its parent's
        # the parent's URL is answered by the parent, every time
        for _ in range(20):
            me = await call(parent, "identity")
            assert me["env"]["AENV_INSTANCE_ID"] == parent.id
        for child in children:
            await engine.delete(child.id)
    finally:
        await engine.delete(parent.id)


async def test_kill_all_from_a_fork_reaches_nothing_of_others(engine: LocalEngine) -> None:
    parent = await engine.create(hostile_spec())
    first, second = await engine.fork(parent.id, 2)
    try:
        result = await call(first, "kill_everything")
        # refused by the runtime's seccomp filter where the kernel has no Landlock
        assert (
            result["ok"] is True
            or "No such process" in result["error"]
            or "Operation not permitted" in result["error"]
        ), result
        # the parent and the sibling still answer, with their state
        assert (await call(parent, "identity"))["env"]["AENV_INSTANCE_ID"] == parent.id
        assert (await call(second, "identity"))["env"]["AENV_INSTANCE_ID"] == second.id
        assert (await call(first, "identity"))["pids"] == [1, 2]  # its own namespace only
    finally:
        for info in (first, second, parent):
            await engine.delete(info.id)


async def test_a_crashed_parent_is_reported_broken_while_its_forks_live(
    engine: LocalEngine,
) -> None:
    parent = await engine.create(hostile_spec())
    (child,) = await engine.fork(parent.id, 1)
    try:
        async with Environment.attach(parent.url or "", token=parent.token) as env:
            await env.call_tool("identity", {})
            with pytest.raises(InstanceBrokenError):
                await env.call_tool("crash", {})
            # the next call fails at once: nothing holds the parent's socket open
            with pytest.raises(InstanceBrokenError):
                await env.call_tool("identity", {})

        async def reported() -> bool:
            return (await engine.get(parent.id)).state is InstanceState.TERMINATED

        await wait_for(reported, "the parent's crash to be reported")
        assert (await engine.get(parent.id)).reason is TerminationReason.CRASHED
        assert (await call(child, "identity"))["env"]["AENV_INSTANCE_ID"] == child.id
    finally:
        await engine.delete(child.id)


async def test_files_the_parent_kept_open_are_the_forks_own_copies(engine: LocalEngine) -> None:
    parent = await engine.create(hostile_spec())
    try:
        await call(parent, "open_and_keep", {"path": "log.txt", "text": "before;"})
        (child,) = await engine.fork(parent.id, 1)
        assert (await call(child, "write_kept", {"text": "child;"}))["ok"] is True
        assert (await call(parent, "write_kept", {"text": "parent;"}))["ok"] is True
        parent_log = (await call(parent, "read_file", {"path": "log.txt"}))["value"]
        child_log = (await call(child, "read_file", {"path": "log.txt"}))["value"]
        assert parent_log == "before;parent;"  # the fork wrote into its own copy
        assert child_log == "before;child;"
        await engine.delete(child.id)
    finally:
        await engine.delete(parent.id)


# -- MCP wherever the runtime's files live ------------------------------------------------------


async def test_mcp_works_for_a_project_under_tmp(engine: LocalEngine, tmp_path: Path) -> None:
    assert str(tmp_path).startswith("/tmp")
    project = tmp_path / "hostile"
    shutil.copytree(HOSTILE, project)
    info = await engine.create(InstanceSpec("hostile@1.0.0", project=str(project)))
    try:
        from fastmcp import Client
        from fastmcp.client.transports import StreamableHttpTransport

        transport = StreamableHttpTransport(f"{info.url}/mcp", headers=info.headers)
        async with Client(transport) as client:
            names = {tool.name for tool in await client.list_tools()}
            assert "identity" in names
            result = await client.call_tool("remember", {"key": "k", "value": "v"})
            assert result.structured_content == {"keys": ["k"]}
    finally:
        await engine.delete(info.id)


_VENV_SCRIPT = """
import asyncio, json, sys
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from aenv_ray import InstanceSpec
from local_backend import Isolation, LocalEngine

async def main():
    engine = LocalEngine(isolation=Isolation.NAMESPACES)
    info = await engine.create(InstanceSpec("hostile@1.0.0", project=sys.argv[1]))
    transport = StreamableHttpTransport(f"{info.url}/mcp", headers=info.headers)
    async with Client(transport) as client:
        names = sorted(tool.name for tool in await client.list_tools())
        result = await client.call_tool("identity", {})
    await engine.aclose()
    cwd = result.structured_content["cwd"]
    print(json.dumps({"names": names, "prefix": sys.prefix, "cwd": cwd}))

asyncio.run(main())
"""


NO_INSTANCE_IMPORTS = frozenset(
    {
        "kubernetes",
        "mypy",
        "networkx",
        "pandas",
        "plotly",
        "pyarrow",
        "ray",
        "scipy",
        "sympy",
        "torch",
    }
)
"""Packages of this venv that neither an instance nor the engine imports: left out of the venv
under /tmp (about two thirds of its 67,000 files, whose links and removal cost seconds). Were
one of them imported after all, the instance would fail to start and the test say so."""


def test_mcp_works_with_the_virtual_environment_under_tmp(tmp_path: Path) -> None:
    """A venv in /tmp (hidden by every instance's private /tmp before): MCP imports lazily."""
    import subprocess
    import sys
    import sysconfig

    venv = Path("/tmp") / f"aenv-venv-test-{os.getpid()}"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python*/site-packages"))
        ours = Path(sysconfig.get_paths()["purelib"])  # this suite's packages, really in /tmp
        entries = sorted(p for p in ours.iterdir() if p.name not in NO_INSTANCE_IMPORTS)
        copy = ["cp", "-a", "--link", *map(str, entries), str(site)]  # hard links (one fs)
        if subprocess.run(copy, capture_output=True, check=False).returncode != 0:
            for entry in entries:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, site / entry.name, symlinks=True, dirs_exist_ok=True)
                else:
                    shutil.copy2(entry, site / entry.name, follow_symlinks=False)
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", _VENV_SCRIPT, str(HOSTILE)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["prefix"] == str(venv)
        assert "identity" in out["names"]
        assert out["cwd"] == "/workspace"
    finally:
        shutil.rmtree(venv, ignore_errors=True)


# -- the same bundle through a hub: the CLI's and the hub's load checks, then an instance -------


async def test_a_pushed_bundles_import_time_code_never_runs_outside_a_sandbox(
    tmp_path: Path, listener: socket.socket
) -> None:
    from envhub.keys import create_key
    from envhub.store import open_store
    from tests._cli import aenv_async
    from tests._hub import HubProcess

    secret = "AENV_TEST_SECRET_OF_THE_HOST"
    marker = Path("/tmp") / f"aenv-hostile-push-marker-{os.getpid()}"
    project = hostile_import_project(tmp_path, marker, listener.getsockname()[1])
    store_url = f"sqlite:///{tmp_path}/hub.db"
    store = await open_store(store_url)
    try:
        _, key = await create_key(store, tenant="mallory")
    finally:
        await store.aclose()
    with HubProcess(tmp_path / "hub", store=store_url, env={secret: "1"}) as hub:
        # in this process (tests/_cli.py): import-time code run outside a sandbox by the CLI's
        # load check would write the marker here as well
        env = {secret: "1", "AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": key}
        pushed = await aenv_async("push", str(project), env=env)
        assert pushed.returncode == 0, pushed.stderr
        assert "published hostile-import@1.0.0" in pushed.stdout
        assert not marker.exists()  # neither the CLI's check nor the hub's wrote it
        async with Environment("hostile-import@1.0.0", aenv_url=hub.url, api_key=key) as remote:
            result = await remote.call_tool("import_attempts", {})
        assert not result.is_error, result.text
        assert_import_contained(result.structured, marker, secret)


# -- all of the above once more, by an unprivileged user ----------------------------------------


@pytest.mark.timeout(900)  # as long as the run it waits for may take
def test_every_attack_holds_for_an_unprivileged_engine(
    unprivileged: tuple[list[str], dict[str, str]],
) -> None:
    """This file (the agent's attacks on its runtime included, from mini-program's Python and
    from a mini-terminal shell), the runtime's seccomp and Landlock confinement, the cleanup
    suite and the instance limits, run again by ``nobody`` (user namespaces, no cgroups).
    What cannot hold without root is skipped there with its reason (``cgroup limits need
    root``)."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("already unprivileged: this run is the unprivileged one")
    command, env = unprivileged
    scratch = Path(tempfile.gettempdir()) / f"aenv-nobody-pytest-{os.getpid()}"
    scratch.mkdir()
    os.chown(scratch, 65534, 65534)
    try:
        done = subprocess.run(
            [
                *command,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:hypothesispytest",  # no test here uses it: ~1 s of start-up less
                "-q",
                f"--basetemp={scratch}",
                "-rps",  # what passed, and why what is skipped without root was
                "tests/test_sandbox_attacks.py",
                "tests/test_contain.py",
                "tests/test_engine_cleanup.py",
                "tests/test_instance_limits.py",
                "-k",
                "not unprivileged_engine and not thousand and not pushed_bundle",
            ],
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout
    # the agent's attacks ran and held, not skipped: from Python and from a shell
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED")]
    for attack in ("mini_program_cannot_reach", "mini_terminal_shell_cannot_reach"):
        assert any(attack in line for line in passed), done.stdout[-6000:]


# -- hostile calls in an engine's instance: limits named, the instance survives -----------------

UNRULY = Path(__file__).parent / "envs" / "unruly"


@pytest.fixture
async def unruly(engine: LocalEngine) -> AsyncIterator[InstanceInfo]:
    info = await engine.create(InstanceSpec("unruly@1.0.0", project=str(UNRULY)))
    yield info
    await engine.delete(info.id)


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroup limits need root")
async def test_a_memory_hog_and_a_fork_bomb_end_their_call_naming_the_limit(
    unruly: InstanceInfo,
) -> None:
    from aenv_ray import ToolErrorKind

    async with Environment.attach(unruly.url or "", token=unruly.token, timeout=60) as env:
        hog = await env.call_tool("child_hog", {"megabytes": 2048})
        assert hog.error_kind is ToolErrorKind.RESOURCE_LIMIT, hog.text
        assert "memory limit (192 MiB of the instance's 256 MiB)" in hog.text
        assert (await env.call_tool("sync_ping")).text == "pong"
        inside = await env.call_tool("inprocess_hog", {"gigabytes": 10})
        assert inside.error_kind is ToolErrorKind.RESOURCE_LIMIT, inside.text
        assert "256 MiB" in inside.text
        bomb = await env.call_tool("fork_bomb", {"seconds": 30})
        assert bomb.error_kind is ToolErrorKind.RESOURCE_LIMIT, bomb.text
        assert "process limit (56 of the instance's 64)" in bomb.text
        assert (await env.call_tool("ping")).text == "pong"  # the server serves on


async def test_a_loop_that_cannot_be_cut_is_reported_broken_with_its_reason(
    engine: LocalEngine, unruly: InstanceInfo
) -> None:
    async with Environment.attach(unruly.url or "", token=unruly.token) as env:
        with pytest.raises(InstanceBrokenError) as raised:
            await env.call_tool("async_read_blocking")
    # the caller hears the reason at once, not a dropped connection
    assert "tool `async_read_blocking` blocked the event loop" in str(raised.value)

    async def reported() -> bool:
        return (await engine.get(unruly.id)).state is InstanceState.TERMINATED

    await wait_for(reported, "the engine to hear why the instance broke")
    ended = await engine.get(unruly.id)
    assert ended.reason is TerminationReason.CRASHED
    assert "async_read_blocking" in ended.detail, ended.detail


# -- agent code against the runtime that serves it (issue 22, point 2) ---------------------------

AGENT_ATTACKS = (Path(__file__).parent / "agent_attacks.py").read_text()
_EPERM, _EACCES = "Operation not permitted", "Permission denied"
_ENOSYS = "Function not implemented"


def assert_runtime_unreachable(report: dict[str, Any]) -> None:
    """Every attempt on the runtime refused, every one on the agent's own process done."""
    runtime, control = report["runtime"], report["control"]
    # pidfd_send_signal is refused outright (a pidfd can come from opening /proc/<pid>)
    assert control.pop("pidfd_send_signal") == _ENOSYS
    assert all(v is True for v in control.values()), control  # the probes do work
    refused = {
        "ptrace_attach": _EPERM,
        "ptrace_seize": _EPERM,
        "read_mem": _EACCES,  # not dumpable
        "read_environ": _EACCES,
        "pidfd_open": _EPERM,
        "pidfd_send_signal": _ENOSYS,
        "kill_0": _EPERM,
        "tgkill_0": _EPERM,
        "sigstop": _EPERM,
        "sigkill": _EPERM,
        "tgkill_sigkill": _EPERM,
        "killpg": _EPERM,
        "kill_threads": [_EPERM],  # Landlock: no thread of the runtime, whatever its id
    }
    assert runtime == refused, runtime
    # kill(-1) ends the agent's own control process and nothing else (or is refused outright)
    assert report["kill_minus_1"] in (True, _EPERM), report


def _agent_output(result: Any, *, shell: bool = False) -> dict[str, Any]:
    structured = result.structured
    # in a shell, the attack's kill(-1) ends that shell too (it is the agent's own), never more
    assert structured["returncode"] in ((0, -9, 137) if shell else (0,)), structured
    found: dict[str, Any] = json.loads(structured["output"].strip().splitlines()[-1])
    return found


async def _tool(info: InstanceInfo, tool: str, args: dict[str, Any]) -> Any:
    assert info.url is not None
    async with Environment.attach(info.url, token=info.token) as env:
        result = await env.call_tool(tool, args)
    assert not result.is_error, result.text
    return result


_DOUBLE_FORK = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "MARK"])
    os._exit(0)
time.sleep(0.2)
print("left it running")
"""


async def test_agent_code_in_mini_program_cannot_reach_the_runtime_and_leaves_nothing_behind(
    engine: LocalEngine,
) -> None:
    from builtin_envs import builtin_path

    spec = InstanceSpec("mini-program@1.0.0", project=str(builtin_path("mini-program@1.0.0")))
    info = await engine.create(spec)
    marker = f"aenv-left-{os.getpid()}-{id(info)}"
    try:
        result = await _tool(info, "execute_python_code", {"code": AGENT_ATTACKS})
        assert_runtime_unreachable(_agent_output(result))
        # the instance still serves, and a detached double fork ends with the call
        code = _DOUBLE_FORK.replace("MARK", marker)
        result = await _tool(info, "execute_python_code", {"code": code})
        assert result.structured["output"] == "left it running\n"
        assert processes_of(marker) == []  # from the host: nowhere
        # a fork of the instance is its own runtime, protected the same way
        (fork,) = await engine.fork(info.id, 1)
        try:
            result = await _tool(fork, "execute_python_code", {"code": AGENT_ATTACKS})
            assert_runtime_unreachable(_agent_output(result))
        finally:
            await engine.delete(fork.id)
    finally:
        await engine.delete(info.id)


async def test_agent_code_in_a_mini_terminal_shell_cannot_reach_the_runtime(
    engine: LocalEngine,
) -> None:
    from builtin_envs import builtin_path

    spec = InstanceSpec("mini-terminal@1.0.0", project=str(builtin_path("mini-terminal@1.0.0")))
    info = await engine.create(spec)
    job, escaped = (f"aenv-{kind}-{os.getpid()}-{id(info)}" for kind in ("job", "escaped"))
    sleeper = "python3 -c 'import time; time.sleep(600)'"
    try:
        script = f"cat > /tmp/attack.py <<'EOF'\n{AGENT_ATTACKS}\nEOF\npython3 /tmp/attack.py"
        result = await _tool(info, "execute_command", {"command": script})
        assert_runtime_unreachable(_agent_output(result, shell=True))
        # the kept shell's own job lives on; what left the shell (setsid, its parent gone) ends
        command = f"{sleeper} {job} & ( setsid {sleeper} {escaped} & ); sleep 0.2; echo ok"
        result = await _tool(info, "execute_command", {"command": command})
        assert result.structured["output"] == "ok\n"
        assert len(processes_of(job)) == 1
        assert processes_of(escaped) == []
    finally:
        await engine.delete(info.id)
    await wait_for(lambda: _none_left(job), "the kept job to end with the instance")


async def _none_left(marker: str) -> bool:
    return processes_of(marker) == []


async def test_what_a_call_leaves_ends_with_it_unless_kept_and_always_at_release(
    engine: LocalEngine,
) -> None:
    info = await engine.create(hostile_spec())
    left, kept = (f"aenv-{kind}-{os.getpid()}-{id(info)}" for kind in ("left", "kept"))
    try:
        pid = await call(info, "detach", {"marker": left})
        assert await call(info, "alive", {"pid": pid}) is False
        assert processes_of(left) == []
        pid = await call(info, "detach", {"marker": kept, "keep": True})
        assert await call(info, "alive", {"pid": pid}) is True  # the control: it would live
        assert len(processes_of(kept)) == 1
    finally:
        await engine.delete(info.id)
    await wait_for(lambda: _none_left(kept), "the kept process to end with the instance")


async def test_concurrent_calls_never_end_each_others_processes(engine: LocalEngine) -> None:
    info = await engine.create(hostile_spec())
    first, second = (f"aenv-{kind}-{os.getpid()}-{id(info)}" for kind in ("long", "short"))
    try:
        long = asyncio.create_task(call(info, "overlap", {"role": "long", "marker": first}))
        short = await call(info, "overlap", {"role": "short", "marker": second})
        # the short call ended while the long one runs: neither process ended with it
        assert await call(info, "alive", {"pid": short["pid"]}) is True
        await call(info, "flag", {"name": "go"})
        done = await long
        assert done["alive"] is True
        # the last of them ended: both are gone
        assert processes_of(first) == []
        assert processes_of(second) == []
        assert (await call(info, "identity"))["pid"] == 2  # the same runtime serves on
    finally:
        await engine.delete(info.id)
