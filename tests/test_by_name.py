"""Engines and built-in environments found by name (entry points), and the runtime's public hook
for a tool set that changes while it runs (``DefinitionRegistry.set_tool_listing``).

A third party's engine and environments are installed for real: a ``.dist-info`` directory with
its ``entry_points.txt`` on ``PYTHONPATH`` of a fresh interpreter, as pip would leave it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aenv_cli import main
from aenv_ray import Environment
from aenv_ray.engine import check_engine_name, engine_names, new_engine
from aenv_ray.errors import ConfigurationError
from aenv_ray.resolve import available_environments, builtin_environments
from aenv_ray.testing import RuntimeProcess
from local_backend.client import DaemonEngine

ROOT = Path(__file__).resolve().parent.parent


def test_the_engines_aenv_ray_registers_have_one_set_of_names() -> None:
    assert {"local", "daemon", "kubernetes"} <= set(engine_names())
    assert check_engine_name("daemon") == "daemon"
    with pytest.raises(ConfigurationError, match=r"unknown engine `docker`: use one of daemon"):
        new_engine("docker")
    with pytest.raises(ConfigurationError, match="unknown engine `inprocess`"):
        Environment("mini-terminal@1.0.0", engine="inprocess")  # aenv serve's old spelling only


async def test_new_engine_daemon_is_the_local_engine_in_its_daemon(tmp_path: Path) -> None:
    engine = new_engine("daemon", state_dir=tmp_path / "engine")
    try:
        assert isinstance(engine, DaemonEngine)
        assert engine.state_dir == tmp_path / "engine"
    finally:
        await engine.aclose()  # nothing started: the daemon starts on the first call


def test_aenv_serve_takes_the_same_names_and_refuses_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--engine", "docker", "--no-auth", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "unknown engine `docker`: use one of daemon, kubernetes, local" in err
    assert "--engine" in err


def test_the_built_ins_come_from_the_entry_points() -> None:
    built_in = builtin_environments()
    assert {"mini-terminal@1.0.0", "tau2@1.0.0"} <= set(built_in)
    assert built_in["tau2@1.0.0"] == ROOT / "builtin_envs" / "tau2"
    assert set(built_in) <= set(available_environments(""))


def _third_party(site: Path) -> None:
    """A package ``acme`` with an engine and an environment, installed under ``site``."""
    package = site / "acme"
    (package / "envs" / "anvil" / "src").mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path

            from local_backend import LocalEngine


            class AcmeEngine(LocalEngine):
                made_with: dict = {}

                def __init__(self, **options):
                    AcmeEngine.made_with = options
                    super().__init__()


            def environments():
                return {"anvil@2.0.0": Path(__file__).parent / "envs" / "anvil"}
            """
        )
    )
    (package / "envs" / "anvil" / "config.json").write_text(
        json.dumps({"name": "anvil", "version": "2.0.0"})
    )
    info = site / "acme-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[aenv_ray.engines]\nacme = acme:AcmeEngine\n\n"
        "[aenv_ray.builtins]\nacme = acme:environments\n"
    )


def test_a_third_party_engine_and_environments_plug_in_by_name(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _third_party(site)
    code = textwrap.dedent(
        """
        import asyncio
        from aenv_ray.engine import engine_names, new_engine
        from aenv_ray.resolve import resolve_environment

        engine = new_engine("acme", max_instances=3)
        print(type(engine).__name__, type(engine).made_with, engine_names())
        print(resolve_environment("anvil")[0])
        asyncio.run(engine.aclose())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    made, resolved = done.stdout.splitlines()
    assert made == "AcmeEngine {'max_instances': 3} ('acme', 'daemon', 'kubernetes', 'local')"
    assert resolved == "anvil@2.0.0"


LISTING = '''
from aenv_ray import register_tool
from aenv_ray.registry import current_registry

ON = {"tools": ["a"]}


@register_tool
def a() -> str:
    """Tool a."""
    return "a"


@register_tool
def b() -> str:
    """Tool b."""
    return "b"


@register_tool
def switch(to: str) -> str:
    """Turn the listed tools to `to` (comma-separated); `fail` makes the listing raise."""
    ON["tools"] = to.split(",")
    return to


def listing():
    if ON["tools"] == ["fail"]:
        raise RuntimeError("the listing broke")
    if ON["tools"] == ["none"]:
        return None
    tools = current.tools
    return [tools[name].describe() for name in ON["tools"]]


current = current_registry()
current.set_tool_listing(listing)
'''


async def test_the_runtime_lists_what_the_tool_listing_says(tmp_path: Path) -> None:
    project = tmp_path / "listing"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text(json.dumps({"name": "listing", "version": "1.0.0"}))
    (project / "src" / "listing_tools.py").write_text(LISTING)
    with RuntimeProcess(project) as runtime:
        async with runtime.environment() as env:

            async def listed() -> list[str]:
                return [tool["name"].rsplit("/", 1)[1] for tool in await env.list_tools()]

            assert await listed() == ["a"]
            await env.call_tool("switch", {"to": "b,switch"})
            assert await listed() == ["b", "switch"]
            assert (await env.call_tool("a", {})).text == "a"  # calls go by name, listed or not
            await env.call_tool("switch", {"to": "none"})  # None: every registered tool
            assert await listed() == ["a", "b", "switch"]
            await env.call_tool("switch", {"to": "fail"})  # raising: the same, and logged
            assert await listed() == ["a", "b", "switch"]
        assert "the environment's tool listing failed" in runtime.log_tail(200)
