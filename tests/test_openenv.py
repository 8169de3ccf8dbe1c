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
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_openenv import AenvRayProvider
from aenv_ray import Environment
from tests._oracles import OPENENV, oracle_python

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "openenv_driver.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/health", timeout=5) as answer:
        return dict(json.loads(answer.read()))


def _drive(python: Path, scenario: str, url: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), str(DRIVER), scenario, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def openenv_python() -> Path:
    return oracle_python(OPENENV)


@pytest.fixture(scope="module")
def terminal_server() -> Iterator[str]:
    """``aenv openenv serve`` in a process of its own (subprocess: a server that runs until
    stopped), on the local engine, at most 2 sessions."""
    port = _free_port()
    command = [sys.executable, "-m", "aenv_cli", "openenv", "serve", "mini-terminal@1.0.0"]
    command += ["--port", str(port), "--max-concurrent-envs", "2", "--engine", "local"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            _health(url)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"aenv openenv serve did not serve: {proc.communicate()[1][-2000:]}")
            time.sleep(0.1)  # its interpreter is starting: nothing else to wait on
    yield url
    proc.terminate()
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]  # SIGTERM: done, every instance released


def test_openenv_clients_play_a_builtin_served_by_aenv(
    openenv_python: Path, terminal_server: str
) -> None:
    seen = _drive(openenv_python, "terminal", terminal_server)
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
    assert seen["after_close"] == "accepted"
    # MCP: OpenEnv's MCP client (an /mcp session attached to /ws)
    mcp = seen["mcp"]
    assert mcp["tools"] == ["execute_command"]
    assert mcp["call"]["output"].strip() == "via-mcp"
    assert mcp["step"]["tool_name"] == "execute_command"  # OpenEnv's CallToolObservation
    assert mcp["step"]["result"]["output"].strip() == "stepped"
    # none left behind: every session's slot (and instance) released
    assert _health(terminal_server)["sessions"] == {"active_sessions": 0, "max_sessions": 2}


# -- an OpenEnv environment inside an aenv-ray instance -------------------------------------

COUNTER_APP = '''
"""A counter: each step adds its amount; the reward is the total, done at 10 or more."""

from uuid import uuid4

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class AddAction(Action):
    amount: int


class CounterObservation(Observation):
    total: int


class CounterEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.total = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.total = 0
        return CounterObservation(total=0, done=False, reward=0.0)

    def step(self, action):
        self._state.step_count += 1
        self.total += action.amount
        return CounterObservation(
            total=self.total, done=self.total >= 10, reward=float(self.total)
        )

    @property
    def state(self):
        return self._state


app = create_app(
    CounterEnvironment, AddAction, CounterObservation, env_name="counter", max_concurrent_envs=2
)
'''

RELAY = """
from aenv_openenv.relay import serve_openenv

serve_openenv("server.app:app")
"""


def _counter_project(root: Path) -> Path:
    """An OpenEnv project (server/app.py, its pyproject.toml) made an aenv-ray environment by a
    config.json and one module in src/."""
    (root / "server").mkdir(parents=True)
    (root / "server" / "__init__.py").write_text("")
    (root / "server" / "app.py").write_text(COUNTER_APP)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "counter-env"\nversion = "0.1.0"\ndependencies = ["openenv==0.10.0"]\n'
    )
    (root / "src").mkdir()
    (root / "src" / "openenv_server.py").write_text(RELAY)
    (root / "config.json").write_text(
        json.dumps(
            {
                "name": "counter-openenv",
                "version": "1.0.0",
                "description": "OpenEnv's counter",
                "deployConfig": {"env": {"AENV_OPENENV_PYTHON": "/data/bin/python"}},
            }
        )
    )
    return root


def test_an_openenv_environment_runs_in_an_aenv_instance(
    openenv_python: Path, tmp_path: Path
) -> None:
    project = _counter_project(tmp_path / "counter")
    venv = openenv_python.parent.parent  # the OpenEnv server's packages, as the datasource

    def make(ref: str, env_vars: dict[str, str]) -> Environment:
        return Environment.from_project(project, datasource=str(venv))

    with AenvRayProvider(environment_factory=make) as provider:
        url = provider.start_container("counter-openenv@1.0.0")
        provider.wait_for_ready(url)
        assert _health(url) == {"status": "healthy"}  # OpenEnv's own server answers
        seen = _drive(openenv_python, "counter", url)
        instance = provider.environment
        assert instance is not None
    assert seen["reset"]["observation"]["total"] == 0
    assert seen["steps"] == [{"total": 2, "reward": 2.0}, {"total": 5, "reward": 5.0}]
    assert seen["final"] == {"total": 10, "reward": 10.0}
    assert seen["done"] is True
    assert seen["state"]["step_count"] == 3
    assert seen["other"] == 1  # a second session: OpenEnv's own, isolated
    assert "CAPACITY_REACHED" in seen["third"]  # OpenEnv's own limit, through the bridge
    assert provider.base_url is None  # stopped: the bridge closed, the instance released
