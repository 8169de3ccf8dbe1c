"""What tests/test_openenv.py and docs/ecosystem.md's set-ups share:

- :class:`OpenEnvServe`: ``aenv openenv serve ENV`` in a process of its own (a server that runs
  until stopped), on a free port, until it answers ``/health``;
- :func:`counter_project`: an OpenEnv environment project, as docs/ecosystem.md shows one:
  OpenEnv's own server code (``server/app.py``: a counter) made an aenv-ray environment by a
  ``config.json`` and one module in ``src/``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["OpenEnvServe", "counter_project", "drive", "health"]

DRIVER = Path(__file__).resolve().parent / "openenv_driver.py"
"""The script that plays a scenario with OpenEnv's own clients, in OpenEnv's venv."""


def drive(
    python: Path, scenario: str, url: str, *extra: str, timeout: float = 300
) -> dict[str, Any]:
    """Run :data:`DRIVER`'s ``scenario`` against ``url`` with OpenEnv's ``python``; what it
    reported (its last stdout line, JSON). A failing driver fails the test with its stderr."""
    done = subprocess.run(
        [str(python), str(DRIVER), scenario, url, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def health(url: str) -> dict[str, Any]:
    """``GET URL/health`` as JSON."""
    with urllib.request.urlopen(url + "/health", timeout=5) as answer:
        return dict(json.loads(answer.read()))


class OpenEnvServe:
    """``aenv openenv serve ENV --max-concurrent-envs N --engine ENGINE EXTRA...`` (default:
    the local engine) on a free port;
    :attr:`url` once it answers. Leaving checks that SIGTERM stopped it as a finished command
    (exit 0), every instance released."""

    def __init__(
        self,
        ref: str,
        *,
        sessions: int = 2,
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        engine: str = "local",
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "aenv_cli", "openenv", "serve", ref]
        self.command += ["--port", str(port), "--max-concurrent-envs", str(sessions)]
        self.command += ["--engine", engine, *extra]
        self.env = dict(env if env is not None else os.environ)
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> OpenEnvServe:
        self.proc = proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                health(self.url)
                return self
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    stderr = proc.communicate()[1]
                    raise RuntimeError(
                        f"aenv openenv serve did not serve: {stderr[-2000:]}"
                    ) from None
                time.sleep(0.1)  # its interpreter is starting: nothing else to wait on

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        _, stderr = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, stderr[-2000:]  # SIGTERM: done, instances released
        assert "Traceback" not in stderr, stderr[-3000:]  # its engine closed too, cleanly


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


def counter_project(root: Path) -> Path:
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
                "deployConfig": {"env": {"AENV_OPENENV_PYTHON": "/data/bin/python"}},
            }
        )
    )
    return root
