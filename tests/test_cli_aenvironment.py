"""``aenv`` as AEnvironment's users type it: its option names and commands, each doing what it
does there (or what aenv-ray's command of that name does, when only the spelling differs).

The hub commands run against a real ``aenv serve``; the project is tests/aenvironment/demo
(AEnvironment's ``config.json`` template, with ``deployConfig.service.replicas`` 2).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aenv_ray.testing import free_port
from tests._cli import aenv as run_cli
from tests._hub import HubProcess, aenv

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "tests" / "aenvironment" / "demo"


def test_version() -> None:
    import aenv_ray

    plain = aenv("version")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[0] == f"aenv-ray {aenv_ray.__version__}"
    assert aenv("version", "-s").stdout == f"{aenv_ray.__version__}\n"
    info = json.loads(aenv("version", "--format", "json").stdout)
    assert info["version"] == aenv_ray.__version__
    assert info["aenvironment_api"] == "0.1.7"
    assert json.loads(aenv("version", "--json").stdout) == info


def test_init_with_aenvironments_options(tmp_path: Path) -> None:
    done = aenv("init", "hello", "--version", "2.1.0", "--work-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "hello" / "config.json").read_text())
    assert config["version"] == "2.1.0"
    assert (tmp_path / "hello" / "src" / "hello.py").is_file()
    # --config-only: config.json alone, in --work-dir itself
    only = tmp_path / "existing"
    done = aenv("init", "hello", "-v", "1.2.3", "--config-only", "-w", str(only))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in only.iterdir()) == ["config.json"]
    assert json.loads((only / "config.json").read_text())["version"] == "1.2.3"
    again = aenv("init", "hello", "--config-only", "-w", str(only))
    assert again.returncode == 2
    assert "config.json already exists; pass --force" in again.stderr
    assert aenv("init", "hello", "--config-only", "-w", str(only), "--force").returncode == 0
    bad = aenv("init", "hello", "--version", "not a version", "-w", str(tmp_path / "b"))
    assert bad.returncode == 2
    assert "must be a version" in bad.stderr


@pytest.fixture
def hub(open_hub: HubProcess) -> HubProcess:
    """The session's hub without auth (tests/conftest.py); aenv-demo is published here only."""
    return open_hub


def test_push_list_get_instances_and_service_create(hub: HubProcess, tmp_path: Path) -> None:
    env = {"AENV_SYSTEM_URL": hub.url}
    wrong = aenv("push", "--work-dir", str(DEMO), "--version", "9.9.9", env=env)
    assert wrong.returncode == 2
    assert "differs from" in wrong.stderr
    pushed = aenv("push", "--work-dir", str(DEMO), "--version", "1.0.0", env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert "published aenv-demo@1.0.0" in pushed.stdout
    listed = json.loads(aenv("list", "--format", "json", "--name", "aenv-demo", env=env).stdout)
    assert [e["name"] for e in listed] == ["aenv-demo"]
    assert json.loads(aenv("list", "-f", "json", "--limit", "0", env=env).stdout) == []
    got = aenv("get", "aenv-demo", "--version", "1.0.0", "--format", "json", env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["ref"] == "aenv-demo@1.0.0"
    clash = aenv("get", "aenv-demo@1.0.0", "--version", "2.0.0", env=env)
    assert clash.returncode == 2
    # `aenv service create` in the project: its name and deployConfig.service.replicas (2)
    work = tmp_path / "project"
    work.mkdir()
    (work / "config.json").write_text((DEMO / "config.json").read_text())
    created = run_cli("service", "create", "-o", "json", cwd=work, env=env)
    assert created.returncode == 0, created.stderr
    service = json.loads(created.stdout)
    assert service["env_ref"] == "aenv-demo@1.0.0"
    assert service["replicas"] == 2
    instances = aenv("instances", "--name", "aenv-demo", "--format", "json", env=env)
    assert instances.returncode == 0, instances.stderr
    assert aenv("instances", "--version", "1.0.0", env=env).returncode == 2  # needs --name
    deleted = aenv("service", "delete", service["id"], env=env)
    assert deleted.returncode == 0, deleted.stderr


async def _healthy(url: str) -> Any:
    """The first 200 answer of ``url`` (the server is up), within 30 s."""
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url) as reply:
                    if reply.status == 200:
                        return await reply.json()
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered 200")


def test_run_serves_the_work_dir() -> None:
    port, mcp_port = free_port(), free_port()
    both = aenv("run", str(ROOT / "builtin_envs" / "mini_terminal"), "--work-dir", str(DEMO))
    assert both.returncode == 2
    assert "differ; give one of them" in both.stderr
    ports = ["--port", str(port), "--mcp-port", str(mcp_port), "--inspector-port", "6274"]
    proc = subprocess.Popen(  # a subprocess: a server, stopped by a signal
        [sys.executable, "-m", "aenv_cli", "run", "--work-dir", str(DEMO), *ports],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = proc.stdout.readline() if proc.stdout else ""
        assert banner.startswith("aenv: serving aenv-demo@1.0.0"), banner
        health = asyncio.run(_healthy(f"http://127.0.0.1:{port}/health"))
        assert health["data"]["status"] == "healthy"  # the work dir's project answers
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "--inspector-port is not used" in err
