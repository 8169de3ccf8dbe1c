"""``Environment(name)`` with no server configured: the engine creates, forks and deletes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import (
    ConfigurationError,
    Environment,
    EnvironmentNotFoundError,
    EnvironmentState,
    InstanceBrokenError,
    InstanceClosedError,
    InstanceExpiredError,
    InstanceState,
    TerminationReason,
)
from aenv_ray.engine import DEFAULT_TTL, default_engine
from aenv_ray.errors import HubUnreachableError
from aenv_ray.settings import Settings
from local_backend import LocalEngine
from local_backend._sandbox import namespaces_available

HOSTILE = Path(__file__).parent / "envs" / "hostile"


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    engine = LocalEngine()
    yield engine
    engine.close()


@pytest.fixture
def settings() -> Settings:
    # nothing from the test machine's environment: no DUMMY_INSTANCE_IP, no AENV_SYSTEM_URL
    return Settings(dummy_instance_ip=None, system_url=None, env_path="")


async def until_terminated(engine: LocalEngine, instance_id: str | None) -> None:
    """Wait (10 s at most) until the engine has seen the instance end."""
    deadline = time.monotonic() + 10
    while (await engine.get(instance_id or "")).state is not InstanceState.TERMINATED:
        assert time.monotonic() < deadline, "the engine never noticed"
        await asyncio.sleep(0.05)


def make_project(parent: Path, name: str, version: str, ttl: str | None = None) -> Path:
    root = parent / f"{name}-{version}"
    (root / "src").mkdir(parents=True)
    config = {"name": name, "version": version}
    if ttl:
        config["deployConfig"] = {"ttl": ttl}
    (root / "config.json").write_text(json.dumps(config))
    (root / "src" / f"tools_{name.replace('-', '_')}.py").write_text(
        "from aenv_ray import register_tool\n\n"
        "@register_tool\n"
        "def version() -> str:\n"
        f"    return {version!r}\n"
    )
    return root


async def test_a_builtin_by_name_is_created_and_deleted(
    engine: LocalEngine, settings: Settings
) -> None:
    env = Environment("mini-terminal@1.0.0", engine=engine, settings=settings)
    async with env:
        assert env.instance_id is not None
        result = await env.call_tool("execute_command", {"command": "echo from an instance"})
        assert result.structured == {"output": "from an instance\n", "returncode": 0}
        assert (await engine.get(env.instance_id)).state is InstanceState.RUNNING
    info = await engine.get(env.instance_id)
    assert info.state is InstanceState.TERMINATED
    assert info.reason is TerminationReason.DELETED


async def test_names_resolve_on_env_path_highest_version_first(
    engine: LocalEngine, tmp_path: Path
) -> None:
    make_project(tmp_path, "tiny", "1.0.0")
    make_project(tmp_path, "tiny", "1.10.0")
    make_project(tmp_path, "tiny", "1.9.0")
    settings = Settings(dummy_instance_ip=None, system_url=None, env_path=str(tmp_path))
    async with Environment("tiny", engine=engine, settings=settings) as env:
        assert (await env.call_tool("version", {})).text == "1.10.0"
        assert [t["name"] for t in await env.list_tools()] == ["tiny@1.10.0/version"]
    async with Environment("tiny@1.9.0", engine=engine, settings=settings) as env:
        assert (await env.call_tool("version", {})).text == "1.9.0"
    with pytest.raises(EnvironmentNotFoundError, match=r"did you mean `tiny@1\.\d+\.0`\?"):
        await Environment("tinyy", engine=engine, settings=settings).initialize()


async def test_unknown_environment_lists_what_exists(
    engine: LocalEngine, settings: Settings
) -> None:
    env = Environment("mini-termnal@1.0.0", engine=engine, settings=settings)
    with pytest.raises(EnvironmentNotFoundError) as caught:
        await env.initialize()
    message = str(caught.value)
    assert "did you mean `mini-terminal@1.0.0`?" in message
    assert "AENV_ENV_PATH" in message


async def test_from_project_and_ttl_precedence(
    engine: LocalEngine, settings: Settings, tmp_path: Path
) -> None:
    project = make_project(tmp_path, "timed", "2.0.0", ttl="45m")
    async with Environment.from_project(project, engine=engine, settings=settings) as env:
        assert env.env_name == "timed@2.0.0"
        info = await engine.get(env.instance_id or "")
        assert info.expires_at is not None
        assert abs(info.expires_at - info.created_at - 45 * 60) < 1  # config.json
    async with Environment.from_project(project, ttl="2h", engine=engine, settings=settings) as env:
        info = await engine.get(env.instance_id or "")
        assert info.expires_at is not None
        assert abs(info.expires_at - info.created_at - 2 * 3600) < 1  # the parameter
    plain = make_project(tmp_path, "untimed", "1.0.0")
    async with Environment.from_project(plain, engine=engine, settings=settings) as env:
        info = await engine.get(env.instance_id or "")
        assert info.expires_at is not None
        assert abs(info.expires_at - info.created_at - DEFAULT_TTL) < 1  # 30 minutes


async def test_variables_arguments_and_datasource_reach_the_instance(
    engine: LocalEngine, settings: Settings, tmp_path: Path
) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "task.txt").write_text("solve me")
    env = Environment.from_project(
        HOSTILE,
        environment_variables={"TASK_ID": "t-7"},
        arguments=["--level", "3"],
        datasource=str(data),
        engine=engine,
        settings=settings,
    )
    async with env:
        me = (await env.call_tool("identity", {})).structured
        assert me["env"]["TASK_ID"] == "t-7"
        assert me["argv"] == ["--level", "3"]
        if namespaces_available() is None:  # mounted read-only at /data
            read = (await env.call_tool("read_file", {"path": "/data/task.txt"})).structured
            assert read == {"ok": True, "value": "solve me"}
            write = await env.call_tool("write_file", {"path": "/data/task.txt"})
            assert write.structured["ok"] is False
            assert (data / "task.txt").read_text() == "solve me"


async def test_fork_through_the_sdk(engine: LocalEngine, settings: Settings) -> None:
    async with Environment.from_project(HOSTILE, engine=engine, settings=settings) as parent:
        await parent.call_tool("remember", {"key": "stage", "value": "set up"})
        children = await parent.fork(2)
        try:
            for child in children:
                assert child.instance_id != parent.instance_id
                assert await child.call_function("recall", {"key": "stage"}) == "set up"
        finally:
            for child in children:
                await child.release()
        for child in children:
            assert (await engine.get(child.instance_id or "")).state is InstanceState.TERMINATED


async def test_forking_an_attached_runtime_is_a_configuration_error(
    probe_runtime: object,
) -> None:
    async with Environment.attach(probe_runtime.url) as env:  # type: ignore[attr-defined]
        with pytest.raises(ConfigurationError, match="cannot be forked"):
            await env.fork(1)


async def test_a_crashed_instance_says_why(engine: LocalEngine, settings: Settings) -> None:
    async with Environment.from_project(HOSTILE, engine=engine, settings=settings) as env:
        with pytest.raises(InstanceBrokenError):
            await env.call_tool("crash", {})
        await until_terminated(engine, env.instance_id)
        with pytest.raises(InstanceBrokenError, match="crashed"):
            await env.call_tool("identity", {})


async def test_an_expired_instance_is_instance_expired(
    engine: LocalEngine, settings: Settings
) -> None:
    async with Environment.from_project(HOSTILE, ttl=0.5, engine=engine, settings=settings) as env:
        await until_terminated(engine, env.instance_id)
        with pytest.raises(InstanceExpiredError, match="TTL"):
            await env.call_tool("identity", {})


async def test_the_lifecycle_new_open_broken_closed(
    engine: LocalEngine, settings: Settings
) -> None:
    env = Environment.from_project(HOSTILE, engine=engine, settings=settings)
    assert env.state is EnvironmentState.NEW
    assert not env.is_open
    assert repr(env) == "Environment('hostile@1.0.0', state=new, url=None)"
    await env.initialize()
    assert env.state is EnvironmentState.OPEN
    assert env.is_open
    assert env.mcp_url == f"{env.url}/mcp"
    await engine.delete(env.instance_id or "")  # ended behind its back: the engine says so
    with pytest.raises(InstanceBrokenError, match="ended: deleted") as first:
        await env.call_tool("identity", {})
    assert env.state is EnvironmentState.BROKEN
    assert not env.is_open
    # from now on every call raises the same end, without another request or engine lookup
    instances_before = len(await engine.list())
    for call in (env.list_tools(), env.call_tool("identity", {}), env.fork(1), env.initialize()):
        with pytest.raises(InstanceBrokenError) as again:
            await call
        assert str(again.value) == str(first.value)
    assert len(await engine.list()) == instances_before  # the fork made nothing
    await env.release()
    assert env.state is EnvironmentState.CLOSED
    with pytest.raises(InstanceClosedError):
        await env.call_tool("identity", {})
    await env.release()  # idempotent


async def test_remote_mode_without_a_hub_listening_is_a_clear_error() -> None:
    from tests._hub import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = Settings(dummy_instance_ip=None, system_url=url, env_path="")
    env = Environment("mini-terminal@1.0.0", settings=settings)
    with pytest.raises(HubUnreachableError, match="aenv serve") as caught:
        await env.initialize()
    assert url in str(caught.value)
    assert env.instance_id is None  # nothing was created, nothing left open


def test_the_default_engine_is_one_local_engine() -> None:
    first = default_engine()
    assert first is default_engine()
    assert isinstance(first, LocalEngine)


async def test_a_missing_datasource_is_a_configuration_error(
    engine: LocalEngine, settings: Settings, tmp_path: Path
) -> None:
    env = Environment.from_project(
        HOSTILE, datasource=str(tmp_path / "nowhere"), engine=engine, settings=settings
    )
    with pytest.raises(ConfigurationError, match="is not a directory"):
        await env.initialize()
    assert env.instance_id is None  # nothing was created
