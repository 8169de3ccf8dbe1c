"""aenv-ray in OpenEnv's interface, driven by OpenEnv's own clients (its PyPI package openenv
0.10.0, in a virtual environment of its own: tests/_oracles.py's ``OPENENV``; its pins differ
from ours, fastmcp >= 3). The clients run there (tests/openenv_driver.py); aenv-ray runs here.

- ``aenv openenv serve mini-terminal@1.0.0`` (a built-in) with a limit of 2: GenericEnvClient
  plays an episode to its reward, two sessions at once each get an instance of their own, a
  third is refused, none is left behind; MCPToolClient lists and calls tools over ``/mcp``.
- An OpenEnv environment project written here (OpenEnv's ``Environment``, ``Action``,
  ``Observation`` and ``create_app``) runs inside an aenv-ray instance through
  :class:`aenv_openenv.AenvRayProvider`, and GenericEnvClient plays it through the provider's
  bridge: OpenEnv's own server answers, its sessions and its limit included.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_openenv import AenvRayProvider
from aenv_ray import Environment
from tests._openenv import OpenEnvServe, counter_project, drive, health
from tests._oracles import OPENENV, oracle_python

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def openenv_python() -> Path:
    return oracle_python(OPENENV)


@pytest.fixture(scope="module")
def terminal_server() -> Iterator[str]:
    """``aenv openenv serve mini-terminal@1.0.0`` (subprocess: a server that runs until
    stopped), on the local engine, at most 2 sessions."""
    with OpenEnvServe("mini-terminal@1.0.0", sessions=2) as server:
        yield server.url


def test_openenv_clients_play_a_builtin_served_by_aenv(
    openenv_python: Path, terminal_server: str
) -> None:
    seen = drive(openenv_python, "terminal", terminal_server, timeout=120)
    assert seen["reset_tools"] == ["execute_command"]
    step = seen["step"]
    assert step["observation"]["result"] == {"output": "hello\n", "returncode": 0}
    assert step["observation"]["content"][0]["type"] == "text"
    assert step["observation"]["is_error"] is False
    assert (step["reward"], step["done"]) == (None, False)
    assert seen["reward"] == {"reward": 1.0, "done": True}
    assert seen["state"]["step_count"] == 2
    assert seen["state"]["done"] is True
    assert "the episode is done" in seen["after_done"]
    assert "VALIDATION_ERROR" in seen["after_done"]
    # reset: a new episode on a new instance, nothing of the last one's workspace
    assert seen["new_instance"] is True
    assert "missing" in seen["after_reset"]["output"]
    # two sessions at once: two instances, each its own file
    assert seen["a_reads"].strip() == "from-a"
    assert seen["b_reads"].strip() == "from-b"
    assert seen["a_reward"] == 1.0
    assert seen["b_reward_of_a"] == 0.0
    # the limit: the third is refused, clearly; after the two close a session is accepted
    assert "CAPACITY_REACHED" in seen["third"]
    assert "max_concurrent_envs (2)" in seen["third"]
    assert seen["idle"]["active_sessions"] == 0
    assert seen["after_close"] == "accepted"
    # MCP: OpenEnv's MCP client (an /mcp session attached to /ws)
    mcp = seen["mcp"]
    assert mcp["tools"] == ["execute_command"]
    assert mcp["call"]["output"].strip() == "via-mcp"
    assert mcp["step"]["tool_name"] == "execute_command"  # OpenEnv's CallToolObservation
    assert mcp["step"]["result"]["output"].strip() == "stepped"
    # none left behind: every session's slot (and instance) released, the vanished client's
    # too (released when its connection closed, which the server learns on its own time)
    assert seen["vanished"] == "observation"
    assert _idle(terminal_server) == {"active_sessions": 0, "max_sessions": 2}


def _idle(url: str) -> dict[str, int]:
    """The server's sessions once none is open (or as they are after 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        sessions = dict(health(url)["sessions"])
        if sessions["active_sessions"] == 0 or time.monotonic() > deadline:
            return sessions
        time.sleep(0.1)  # a release in progress on the server: nothing here to wait on


# -- an OpenEnv environment inside an aenv-ray instance -------------------------------------


def test_an_openenv_environment_runs_in_an_aenv_instance(
    openenv_python: Path, tmp_path: Path
) -> None:
    project = counter_project(tmp_path / "counter")
    venv = openenv_python.parent.parent  # the OpenEnv server's packages, as the datasource

    def make(ref: str, env_vars: dict[str, str]) -> Environment:
        return Environment.from_project(project, datasource=str(venv))

    with AenvRayProvider(environment_factory=make, token="t0ken") as provider:
        url = provider.start_container("counter-openenv@1.0.0")
        provider.wait_for_ready(url)
        seen = drive(openenv_python, "counter", url, "t0ken", timeout=120)
        instance = provider.environment
        assert instance is not None
    assert "rejected WebSocket connection: HTTP 403" in seen["without_token"]
    assert seen["reset"]["observation"]["total"] == 0
    assert seen["steps"] == [{"total": 2, "reward": 2.0}, {"total": 5, "reward": 5.0}]
    assert seen["final"] == {"total": 10, "reward": 10.0}
    assert seen["done"] is True
    assert seen["state"]["step_count"] == 3
    assert seen["other"] == 1  # a second session: OpenEnv's own, isolated
    assert "CAPACITY_REACHED" in seen["third"]  # OpenEnv's own limit, through the bridge
    assert provider.base_url is None  # stopped: the bridge closed, the instance released


def test_openenv_clients_start_an_aenv_instance_through_the_process_provider(
    openenv_python: Path, tmp_path: Path
) -> None:
    """OpenEnv's own ``EnvClient(provider=...)`` and ``from_docker_image(..., provider=...)``
    start the counter in an aenv-ray instance through ``AenvRayProcessProvider``, imported in
    OpenEnv's virtual environment where aenv-ray is installed without its dependencies; the
    provider runs this checkout's ``aenv`` as a child process."""
    project = counter_project(tmp_path / "counter")
    venv = openenv_python.parent.parent
    spec = {
        "project": str(project),
        "engine": "local",
        "datasource": str(venv),
        "token": "pr0vider",
        "command": [sys.executable, "-m", "aenv_cli"],
    }
    seen = drive(openenv_python, "provider", json.dumps(spec), timeout=120)
    assert seen["started"] is True
    assert (seen["reset"], seen["steps"]) == (0, [4, 10])
    assert seen["pid_alive"] is True
    assert (seen["stopped"], seen["exit_code"]) == (True, 0)  # closed stdin: a clean exit
    assert seen["from_image"] is True
    assert seen["image_stopped"] is True
    assert seen["aenv_ray_imported"] == []  # the provider's side needs no aenv-ray dependency


def test_idle_sessions_are_closed_and_their_clients_told(openenv_python: Path) -> None:
    """``--idle-timeout 3``: a /ws session (OpenEnv's GenericEnvClient) and an /mcp session left
    idle are closed by the server's reaper, their instances released; the client coming back
    gets a clear error (not a hang, not a silent new session), and a reset starts anew. The
    driver waits for the reap on /health, never longer."""
    with OpenEnvServe("mini-terminal@1.0.0", sessions=2, extra=("--idle-timeout", "3")) as server:
        seen = drive(openenv_python, "idle", server.url, timeout=120)
    assert seen["before"]["result"]["output"] == "kept\n"
    assert seen["open"] == 2
    assert seen["reaped"]["active_sessions"] == 0  # both closed, their slots free
    assert "SESSION_EXPIRED" in seen["step_after"]
    assert "idle for more than 3 s" in seen["step_after"]
    assert "send reset" in seen["step_after"]
    assert seen["reset_after"] == ["execute_command"]
    assert seen["fresh"]["output"].strip().endswith("gone")  # a new instance: the old released
    error = seen["mcp_after"]["error"]
    assert (error["code"], error["data"]) == (-32000, {"code": "SESSION_EXPIRED"})
    assert seen["attach_after"]["data"]["code"] == "SESSION_EXPIRED"
    assert seen["closed"]["active_sessions"] == 0
