"""``aenv instance ...``: instances shared between CLI calls through the local engine daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import Environment
from tests._cli import aenv as run_cli


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    pid_file = state / "engine.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_file.exists(), "the daemon did not stop on SIGTERM"


def aenv(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``aenv instance ARGS`` in this process (tests/_cli.py), the daemon's state in ``state``."""
    return run_cli("instance", *args, env={"AENV_STATE_DIR": str(state)})


def as_json(result: subprocess.CompletedProcess[str]) -> object:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_create_list_get_call_renew_delete(state_dir: Path) -> None:
    created = as_json(
        aenv(state_dir, "create", "mini-terminal", "--ttl", "1h", "-e", "X=1", "--json")
    )
    assert isinstance(created, dict)
    assert created["env_ref"] == "mini-terminal@1.0.0"
    assert created["state"] == "running"
    assert 3599 < created["expires_at"] - created["created_at"] <= 3600
    iid = created["id"]

    # a later command sees the same instance, and the instance answers calls
    listed = as_json(aenv(state_dir, "list", "--json"))
    assert [i["id"] for i in listed] == [iid]  # type: ignore[union-attr]
    async with Environment.attach(created["url"], token=created["token"]) as env:
        result = await env.call_tool("execute_command", {"command": "echo $X"})
    assert result.structured == {"output": "1\n", "returncode": 0}

    renewed = as_json(aenv(state_dir, "renew", iid, "--ttl", "2h", "--json"))
    assert renewed["expires_at"] > created["expires_at"] + 3000  # type: ignore[index]

    plain = aenv(state_dir, "get", iid)
    assert plain.returncode == 0
    assert f"id       {iid}" in plain.stdout
    assert "state    running" in plain.stdout

    deleted = as_json(aenv(state_dir, "delete", iid, "--json"))
    assert deleted["state"] == "terminated"  # type: ignore[index]
    assert deleted["reason"] == "deleted"  # type: ignore[index]
    assert as_json(aenv(state_dir, "list", "--json")) == []
    everything = as_json(aenv(state_dir, "list", "--all", "--json"))
    assert [i["id"] for i in everything] == [iid]  # type: ignore[union-attr]


def test_mistakes_are_one_line_errors(state_dir: Path) -> None:
    unknown = aenv(state_dir, "get", "nope")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "aenv: error: the local engine has no instance `nope`; `aenv instance list` shows the "
        "ones it has"
    )
    missing = aenv(state_dir, "create", "mini-termnal")
    assert missing.returncode == 2
    assert "did you mean `mini-terminal@1.0.0`?" in missing.stderr
    bad_ttl = aenv(state_dir, "create", "mini-terminal", "--ttl", "soon")
    assert bad_ttl.returncode == 2
    assert "duration `soon`" in bad_ttl.stderr
    bad_env = aenv(state_dir, "create", "mini-terminal", "-e", "NOEQUALS")
    assert bad_env.returncode == 2
    assert "KEY=VALUE" in bad_env.stderr


def test_help() -> None:
    result = run_cli("instance", "--help")
    assert result.returncode == 0
    for command in ("create", "list", "get", "delete", "renew"):
        assert command in result.stdout
