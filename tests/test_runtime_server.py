"""RuntimeServer in this process: built before its sockets exist (as a template builds it), the
MCP app started on demand, and a clean stop whether MCP was used or not."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fastmcp
import httpx
import pytest

from aenv_ray.testing import RuntimeProcess
from sandbox_runtime._loader import load_project
from sandbox_runtime.server import RuntimeServer, bind_socket
from tests._processes import children_of

PROBE = Path(__file__).resolve().parent / "envs" / "probe"


@contextmanager
def serving(server: RuntimeServer) -> Iterator[str]:
    """Run ``server`` on a thread; yield its base URL; stop it and require the thread to end."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.ready.wait(30), "the server did not start"
    host, port = server.addresses[0]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        thread.join(10)
        assert not thread.is_alive(), "the server did not stop"


def test_a_server_built_without_sockets_refuses_to_run_until_given_some() -> None:
    server = RuntimeServer(load_project(PROBE), sockets=[])
    with pytest.raises(RuntimeError, match="listen_on"):
        server.run()


def test_listen_on_serves_the_given_socket_and_is_fixed_once_running() -> None:
    server = RuntimeServer(load_project(PROBE), sockets=[])
    listen = bind_socket("127.0.0.1", 0)
    server.listen_on([listen])
    with serving(server) as url:
        assert url.endswith(f":{listen.getsockname()[1]}")
        info = httpx.get(f"{url}/aenv/v1/info").json()
        assert info["ref"].startswith("probe@")
        with socket.socket() as other, pytest.raises(RuntimeError, match="runs already"):
            server.listen_on([other])


async def test_mcp_starts_on_its_first_request_and_the_server_stops_cleanly() -> None:
    server = RuntimeServer(load_project(PROBE), sockets=[bind_socket("127.0.0.1", 0)])
    with serving(server) as url:
        async with httpx.AsyncClient() as http:
            call = {"name": "echo", "arguments": {"text": "a"}}
            fast = await http.post(f"{url}/aenv/v1/call", json=call)
        assert fast.status_code == 200
        assert not fast.json()["is_error"]
        async with fastmcp.Client(f"{url}/mcp") as client:  # starts the MCP app now
            names = {tool.name for tool in await client.list_tools()}
            result = await client.call_tool("echo", {"text": "b"})
        assert "echo" in names
        assert not result.is_error
        assert [(item.type, getattr(item, "text", None)) for item in result.content] == [
            ("text", "b")
        ]


def test_a_server_whose_mcp_never_started_stops_cleanly() -> None:
    server = RuntimeServer(load_project(PROBE), sockets=[bind_socket("127.0.0.1", 0)])
    with serving(server) as url:
        assert httpx.get(f"{url}/health").status_code == 200


async def test_arguments_after_a_double_dash_are_the_environments() -> None:
    hostile = Path(__file__).parent / "envs" / "hostile"
    with RuntimeProcess(hostile, extra_args=["--", "--level", "hard", "x"]) as runtime:
        async with runtime.environment() as env:
            identity = (await env.call_tool("identity", {})).structured
    assert identity["argv"] == ["--level", "hard", "x"]


# -- the token an engine gives a runtime in a container ------------------------------------------


def test_a_runtime_takes_its_token_from_the_environment_and_hides_it_from_the_project(
    tmp_path: Path,
) -> None:
    """The token and a bundle key, given as variables, are in no /proc/*/environ or cmdline a
    command the project runs can read (the runtime's own included); a variable that is not a
    secret (the control) still is."""
    import os
    import subprocess
    import sys
    import time
    import uuid

    from aenv_ray.testing import free_port
    from builtin_envs import builtin_refs
    from tests._scan import CONTROL, assert_clean, scan_command

    port = free_port()
    bundle_key, control = f"aenv_bundle_{uuid.uuid4().hex}", uuid.uuid4().hex
    env = {
        **os.environ,
        "AENV_RUNTIME_TOKEN": "s3cret-token",
        "AENV_BUNDLE_KEY": bundle_key,
        CONTROL: control,
    }
    project = builtin_refs()["mini-terminal@1.0.0"]
    process = subprocess.Popen(
        [sys.executable, "-m", "sandbox_runtime", str(project), "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the ready path needs no token: what a kubelet's probe asks
            try:
                ready = httpx.get(f"{base}/aenv/v1/ready")
                break
            except httpx.TransportError:
                assert process.poll() is None, "the runtime exited"
                assert time.monotonic() < deadline, "the runtime never listened"
                time.sleep(0.05)
        assert ready.status_code == 200
        assert ready.json() == {"ready": True}
        call = {
            "name": "execute_command",
            "arguments": {"command": "echo ${AENV_RUNTIME_TOKEN:-unset}"},
        }
        refused = httpx.post(f"{base}/aenv/v1/call", json=call)
        assert refused.status_code == 401
        assert httpx.get(f"{base}/health").status_code == 401
        answered = httpx.post(
            f"{base}/aenv/v1/call", json=call, headers={"Authorization": "Bearer s3cret-token"}
        )
        assert answered.status_code == 200
        assert "unset" in answered.text
        assert "s3cret" not in answered.text
        call["arguments"] = {"command": scan_command(every=False)}
        scanned = httpx.post(
            f"{base}/aenv/v1/call", json=call, headers={"Authorization": "Bearer s3cret-token"}
        )
        assert scanned.status_code == 200
        assert_clean(scanned.json()["structured"]["output"], ["s3cret", bundle_key], control)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_token_file_that_is_missing_or_empty_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandbox_runtime.__main__ import main

    empty = tmp_path / "empty"
    empty.write_text("")
    for path, said in ((empty, "is empty"), (tmp_path / "missing", "No such file")):
        with pytest.raises(SystemExit) as exited:
            main(["/nonexistent-project", "--token-file", str(path)])
        assert exited.value.code == 2
        assert said in capsys.readouterr().err


STRAY_THREAD = '''
import atexit
import pathlib
import sys
import threading
import time

from aenv_ray import register_tool

atexit.register(pathlib.Path(sys.argv[1]).write_text, "exit handlers ran")


@register_tool
def start_a_thread() -> str:
    """Start a thread (not a daemon) that never ends."""
    threading.Thread(target=time.sleep, args=(3600,), name="stray").start()
    return "started"
'''


def _project(tmp_path: Path, name: str, source: str) -> Path:
    """A project ``name@1.0.0`` of one module, ``source``."""
    project = tmp_path / name
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text(f'{{"name": "{name}", "version": "1.0.0"}}')
    (project / "src" / f"{name}.py").write_text(source)
    return project


async def test_a_thread_the_environment_leaves_running_does_not_hold_a_stopped_runtime(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, "stray", STRAY_THREAD)
    marker = tmp_path / "exited"
    runtime = RuntimeProcess(project, extra_args=["--", str(marker)])
    with runtime:
        async with runtime.environment() as env:
            assert (await env.call_tool("start_a_thread", {})).text == "started"
        runtime.stop(timeout=60)  # SIGTERM; a process still there after 60 s is SIGKILLed
    assert runtime.process is not None
    assert runtime.process.returncode == 0  # it ended by itself, not by the SIGKILL
    assert marker.read_text() == "exit handlers ran"


WARM_UPS = '''
import subprocess
from aenv_ray import register_tool
from aenv_ray.registry import current_registry

helper = None
calls_before_warm_up = []


@current_registry().add_warm_up
def start_helper() -> None:
    global helper
    helper = subprocess.Popen(["sleep", "3600"])


@current_registry().add_warm_up
def fail() -> None:
    raise RuntimeError("this warm-up fails on purpose")


@register_tool
def helper_pid() -> int:
    """The helper the warm-up started: running, or -1."""
    return helper.pid if helper is not None and helper.poll() is None else -1
'''


async def test_warm_ups_run_before_the_runtime_serves_and_a_failing_one_is_logged(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, "warm", WARM_UPS)
    with RuntimeProcess(project) as runtime:
        # answering its readiness means the warm-ups ran: the helper runs before any call
        started = [pid for pid, name in children_of(runtime.pid).items() if name == "sleep"]
        assert len(started) == 1, children_of(runtime.pid)
        async with runtime.environment() as env:
            first = await env.call_tool("helper_pid", {})
            second = await env.call_tool("helper_pid", {})  # no call's end killed it
        assert first.structured == second.structured == started[0]
        assert "warm-up failed" in runtime.log_tail(200)
        assert "this warm-up fails on purpose" in runtime.log_tail(200)
