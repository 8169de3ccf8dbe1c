"""AEnvironment's API (``import aenv``) on aenv-ray: code written from AEnvironment's docs runs
as it is, on isolated instances of the embedded local engine.

The environment is tests/aenvironment/demo: AEnvironment's ``aenv init`` config.json and modules
written as its guides write them (``from aenv import register_tool``; ``timeout=60`` without an
annotation). What AEnvironment itself does with the same code is tests/test_aenv_oracle.py's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aenv
import aenv_ray
from aenv_ray.config import EnvConfig
from aenv_ray.errors import DefinitionError
from aenv_ray.testing import RuntimeProcess
from rollout.synthesis import read_trajectories
from tests._cli import aenv as run_cli

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "tests" / "aenvironment"
DEMO = ENVS / "demo"
NAME = "aenv-demo@1.0.0"


@pytest.fixture(autouse=True)
def _env_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AENV_ENV_PATH", str(ENVS))
    monkeypatch.delenv("DUMMY_INSTANCE_IP", raising=False)


def test_the_import_paths_of_aenvironments_docs() -> None:
    from aenv import Environment, register_function, register_health, register_reward
    from aenv import register_tool as top_level_register_tool
    from aenv.core import Environment as CoreEnvironment
    from aenv.core import ToolTimeoutError, get_function_registry
    from aenv.core.environment import Environment as ModuleEnvironment
    from aenv.core.environment import ToolResult, split_env_name_version
    from aenv.core.exceptions import EnvironmentError, ToolError, UnrecoverableEnvironmentError
    from aenv.core.function_registry import register_function as module_register_function
    from aenv.core.logging import getLogger, setup_logging
    from aenv.core.models import EnvInstance, EnvStatus
    from aenv.core.tool import Tool, get_registry, register_tool

    assert aenv.__version__ == "0.1.7"
    assert Environment is CoreEnvironment is ModuleEnvironment is aenv.Environment
    assert top_level_register_tool is register_tool
    assert register_function is module_register_function
    assert callable(register_reward)
    assert callable(register_health)
    assert issubclass(ToolTimeoutError, ToolError)
    assert issubclass(UnrecoverableEnvironmentError, EnvironmentError)
    assert issubclass(ToolError, aenv_ray.AEnvError)  # aenv-ray's error tree too
    assert split_env_name_version("a@1") == ("a", "1")
    assert repr(ToolResult([], is_error=True)) == "ToolResult(content=[], is_error=True)"
    assert EnvStatus.RUNNING == "Running"
    assert EnvInstance(id="x", status="Running", created_at="t", updated_at="t").ip is None
    assert Tool(name="t", inputSchema={}).get_openai_tool()["function"]["name"] == "t"
    assert getLogger("environment").name == "aenv.environment"
    assert callable(setup_logging)
    assert callable(get_registry)
    assert callable(get_function_registry)


async def test_an_aenvironment_project_runs_as_it_is_on_the_local_engine() -> None:
    env = aenv.Environment(NAME, environment_variables={"EXTRA": "x", "UNSET": None})
    assert await env.initialize() is True
    try:
        native = env.native
        assert native is not None
        assert native.instance_id is not None  # an engine's instance, not a server's
        tools = {tool["name"]: tool for tool in await env.list_tools()}
        assert f"{NAME}/echo" in tools
        run_schema = tools[f"{NAME}/run"]["inputSchema"]["properties"]
        assert run_schema["timeout"] == {"default": 60, "type": "integer"}
        assert run_schema["verbose"] == {"default": False, "type": "boolean"}
        # a parameter without annotation took its default's type: "5" arrives as 5
        result = await env.call_tool("run", {"command": "ls", "timeout": "5"})
        assert json.loads(result.content[0]["text"])["timeout"] == 5
        variables = await env.call_tool(f"{NAME}/variables", {})
        assert json.loads(variables.content[0]["text"]) == {
            "envNAME": "aenv-demo",
            "envversion": "1.0.0",
            "GREETING": "hello from config.json",  # deployConfig.environmentVariables
            "EXTRA": "x",
        }
        assert (await env.call_tool("echo", {"content": "hi"})).content == [
            {"type": "text", "text": '{"result":"hi"}'}
        ]
        assert await env.call_function("calls", {}) == 1
        assert await env.call_reward({"expected": "e"}) == {"score": 1.0, "expected": "e"}
        health = await env.check_health({})
        assert health == {"success": True, "data": {"status": "healthy", "calls": 1}}
        detailed = await env.check_health({"detail": True})
        assert set(detailed["data"]) == {"status", "calls", "pid"}
        info = await env.get_env_info()
        assert info["name"] == NAME
        assert info["instance_id"] == native.instance_id
        assert info["status"] == "Running"
        assert info["ip"] == native.url
        await env.wait_for_ready(timeout=5)
        listing = await env.list_functions()
        assert [f["name"] for f in listing["functions"]] == ["custom_endpoint", "calls", "fails"]
        assert listing["health"][0]["parameters"] == {
            "detail": {"type": "<class 'bool'>", "default": "False"}
        }
    finally:
        await env.release()


async def test_release_then_initialize_makes_a_new_instance() -> None:
    env = aenv.Environment(NAME)
    await env.call_tool("echo", {"content": "one"})  # the first call initializes
    first = env.native
    assert first is not None
    assert await env.call_function("calls", {}) == 1
    await env.release()
    assert env.native is None
    assert await env.initialize() is True
    second = env.native
    assert second is not None
    assert second.instance_id != first.instance_id
    assert await env.call_function("calls", {}) == 0  # a fresh instance
    await env.destroy()  # AEnvironment's other name for release()
    # after a release, a call initializes again, as in AEnvironment
    assert await env.call_function("calls", {}) == 0
    assert env.native is not None
    assert env.native.instance_id not in (first.instance_id, second.instance_id)
    async with env:  # AEnvironment's context manager: initialize, then release on the way out
        assert env.native is not None
    assert env.native is None


def test_the_templates_score_reward_rolls_out(tmp_path: Path) -> None:
    # the demo's reward is `aenv init`'s form, {"score": ..., ...}: `aenv rollout` takes the
    # score as the reward and the rest as its components (it stopped with TaskCallError)
    (tmp_path / "pol.py").write_text(
        "async def agent(task, env):\n"
        "    await env.call_tool('echo', {'content': 'hi'})\n"
        "    return 'done'\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "prompt": "p", "reward_arguments": {"expected": "e"}}))
    out = tmp_path / "run"
    done = run_cli(
        "rollout", NAME, "-n", "1", "-c", "1", "--no-ray", "--policy", "pol:agent",
        "--tasks", str(tasks), "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = read_trajectories(out)
    assert (row["outcome"], row["reward"], row["reward_components"]) == (
        "ok",
        1.0,
        {"expected": "e"},
    )


async def test_where_aenvironment_raises_so_does_aenv() -> None:
    from aenv.core.exceptions import EnvironmentError, ToolError, ToolTimeoutError

    async with aenv.Environment(NAME, timeout=30) as env:
        with pytest.raises(ToolError, match=r"not found in environment 'aenv-demo@1\.0\.0'"):
            await env.call_tool("other@1.0.0/echo", {"content": "x"})
        with pytest.raises(ToolTimeoutError, match=r"timed out after 0\.3 s") as timed_out:
            await env.call_tool("sleepy", {"seconds": 5}, timeout=0.3)
        assert timed_out.value.timeout == 0.3
        assert (await env.call_tool("text", {"n": 1})).content[0]["text"] == "n=1"
        # what the agent can act on is a result, as in AEnvironment
        failed = await env.call_tool("boom", {"x": 2})
        assert failed.is_error is True
        assert "boom 2" in failed.content[0]["text"]
        assert (await env.call_tool("nope", {})).is_error is True
        assert (await env.call_tool("text", {"n": "abc"})).is_error is True
        with pytest.raises(EnvironmentError, match="Function 'fails' execution failed") as raised:
            await env.call_function("fails", {})
        assert isinstance(raised.value.__cause__, aenv_ray.FunctionError)
        with pytest.raises(EnvironmentError) as unknown:
            await env.call_function("nope", {})
        assert isinstance(unknown.value.__cause__, aenv_ray.FunctionNotFoundError)


async def test_list_openai_tools_are_agents_sdk_function_tools() -> None:
    async with aenv.Environment(NAME) as env:
        tools = {tool.name: tool for tool in await env.list_openai_tools()}
        assert f"{NAME}/echo" in tools
        echo = tools[f"{NAME}/echo"]
        assert echo.strict_json_schema is True
        assert echo.description == "Echo the content back."
        assert await echo.on_invoke_tool(None, '{"content": "via agents"}') == (
            '{"result":"via agents"}'
        )
        failed = await tools[f"{NAME}/boom"].on_invoke_tool(None, '{"x": 3}')
        assert json.loads(failed)[0]["type"] == "text"  # an error result: its content's JSON
        assert "boom 3" in json.loads(failed)[0]["text"]
        bad = await echo.on_invoke_tool(None, "{not json")
        assert bad.startswith(f"Invalid JSON input for tool '{NAME}/echo'")


def _unhealthy_project(root: Path) -> Path:
    project = root / "starting"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text(json.dumps({"name": "starting", "version": "1.0.0"}))
    (project / "src" / "starting.py").write_text(
        "from aenv import register_health, register_tool\n\n\n"
        "@register_tool\ndef ping() -> str:\n    return 'pong'\n\n\n"
        "@register_health\ndef health() -> dict:\n    return {'status': 'starting'}\n"
    )
    return project


async def test_skip_for_healthy_and_enable_data_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aenv.core.exceptions import EnvironmentError

    _unhealthy_project(tmp_path)
    monkeypatch.setenv("AENV_ENV_PATH", str(tmp_path))
    async with aenv.Environment("starting@1.0.0", skip_for_healthy=True) as env:
        assert (await env.call_tool("ping", {})).content[0]["text"] == "pong"
        assert (await env.check_health())["data"]["status"] == "starting"
    waiting = aenv.Environment("starting@1.0.0", startup_timeout=1.0)  # the template is warm
    with pytest.raises(EnvironmentError, match="did not become healthy") as never:
        await waiting.initialize()
    assert isinstance(never.value.__cause__, aenv_ray.StartupTimeoutError)
    unready = aenv.Environment("starting@1.0.0", skip_for_healthy=True)
    await unready.initialize()  # without waiting for health; then wait for it
    unready.skip_for_healthy = False
    with pytest.raises(EnvironmentError, match=r"not healthy within 0\.2 s"):
        await unready.wait_for_ready(timeout=0.2)
    await unready.release()
    async with aenv.Environment("starting@1.0.0", enable_data_plane=False) as control_only:
        assert control_only.native is not None
        for call in (
            control_only.list_tools(),
            control_only.call_tool("ping", {}),
            control_only.call_function("x", {}),
            control_only.call_reward({}),
            control_only.check_health(),
        ):
            with pytest.raises(EnvironmentError, match="enable_data_plane=False"):
                await call


async def test_five_broken_calls_open_the_circuit_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    from aenv.core.exceptions import ToolError, UnrecoverableEnvironmentError

    monkeypatch.setenv("AENV_RECONNECT_WINDOW", "0.1")
    with RuntimeProcess(DEMO) as runtime:
        monkeypatch.setenv("DUMMY_INSTANCE_IP", runtime.url)  # AEnvironment's local mode
        env = aenv.Environment(NAME)
        assert (await env.call_tool("text", {"n": 2})).content[0]["text"] == "n=2"
        runtime.kill()
        for _ in range(5):
            with pytest.raises(ToolError, match="Tool 'text' execution failed") as broke:
                await env.call_tool("text", {"n": 2})
            assert isinstance(broke.value.__cause__, aenv_ray.InstanceError)
        with pytest.raises(UnrecoverableEnvironmentError, match="5 consecutive failures"):
            await env.call_tool("text", {"n": 2})
        await env.release()


def test_aliases_name_aenv_rays_builtins_by_aenvironments_names() -> None:
    from aenv.core.environment import ALIASES, resolve_alias

    available = aenv_ray.available_environments()
    for alias, target in ALIASES.items():
        assert target in available  # each names a built-in that is there
        assert resolve_alias(f"{alias}@9.9.9") == target
    assert resolve_alias("mini-terminal@1.0.0") == "mini-terminal@1.0.0"
    assert resolve_alias("mini-terminal") == "mini-terminal"
    assert resolve_alias(NAME) == NAME


# -- environment code ----------------------------------------------------------------------------


def test_decorators_register_with_types_from_defaults() -> None:
    from aenv import get_registry, register_function, register_tool
    from aenv.core.function_registry import get_function_registry

    registry = aenv_ray.DefinitionRegistry()
    with registry.collecting():

        @register_tool
        def execute_command(command: str, timeout=60, mode=None, anything=None):  # type: ignore[no-untyped-def]
            return command, timeout

        @register_tool(name="renamed", description="Said here.")
        def tool_two(untyped):  # type: ignore[no-untyped-def]
            return untyped

        @register_function(endpoint="/functions/helper", method="GET")
        def helper_impl(x: int = 1) -> int:
            return x

        @register_function(endpoint="/task/reward")
        def score() -> float:
            return 1.0

        get_registry().register(lambda: "hidden", name="secret", hidden=True)
        tools = {tool.name: tool for tool in get_registry().list_tools()}
        functions = get_function_registry().list_functions()

    assert execute_command("ls") == ("ls", 60)  # returned unchanged
    assert execute_command.__annotations__ == {"command": "str"}
    schema = registry.tools["execute_command"].signature.input_schema
    assert schema["properties"]["timeout"] == {"default": 60, "type": "integer"}
    assert schema["properties"]["mode"] == {"default": None}  # None: any value, as FastMCP
    assert schema["required"] == ["command"]
    assert registry.tools["renamed"].description == "Said here."
    assert registry.tools["renamed"].signature.validate({"untyped": [1, "a"]}) == {
        "untyped": [1, "a"]
    }
    assert "helper" in registry.functions
    assert registry.reward is not None
    assert registry.reward.name == "score"
    assert "secret" not in registry.tools  # hidden: registered, not served
    assert tools["secret"].hidden is True
    assert tools["execute_command"].inputSchema == schema
    assert functions["helper"]["endpoint"] == "/functions/helper"
    assert functions["helper"]["parameters"] == {"x": {"type": "<class 'int'>", "default": "1"}}
    assert functions["score"]["endpoint"] == "/task/reward"


def test_an_endpoint_aenv_ray_cannot_serve_is_a_definition_error() -> None:
    from aenv import register_function

    with (
        aenv_ray.DefinitionRegistry().collecting(),
        pytest.raises(DefinitionError, match="aenv-ray serves functions at /functions/NAME"),
    ):

        @register_function(endpoint="/custom/path")
        def custom() -> int:
            return 1


# -- config.json ---------------------------------------------------------------------------------


@pytest.fixture
def config_log() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("aenv_ray.config")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_aenvironments_config_json_loads(config_log: list[logging.LogRecord]) -> None:
    config = EnvConfig.load(DEMO)
    deploy = config.deploy_config
    assert deploy.env == {"GREETING": "hello from config.json"}
    assert deploy.ephemeral_storage == "5Gi"
    assert deploy.service.replicas == 2
    assert deploy.service.storage_size == "10Gi"
    assert config.ref == NAME


def test_aenvironments_legacy_keys_are_read(config_log: list[logging.LogRecord]) -> None:
    raw: dict[str, Any] = {
        "name": "legacy",
        "requirements": {"memory": "3Gi"},
        "deployConfig": {
            "cpuRequest": "1",
            "cpuLimit": "2",
            "ephemeralStorageRequest": "1Gi",
            "podTemplate": "Default",
            "replicas": 3,
            "enableStorage": True,
            "port": 9123,
            "mountPath": "/mnt/legacy-unique",
        },
    }
    deploy = EnvConfig.model_validate(raw).deploy_config
    assert (deploy.cpu, deploy.memory, deploy.ephemeral_storage) == ("2", "3Gi", "1Gi")
    assert deploy.pod_template == "singleContainer"
    assert (deploy.service.replicas, deploy.service.enable_storage) == (3, True)
    said = [record.getMessage() for record in config_log]
    assert any("deployConfig.service.port is not used" in m for m in said), said
    assert any("mounted at /storage" in m for m in said), said
    assert any("cpuRequest" in m and "cpuLimit 2" in m for m in said), said
    before = len(config_log)
    EnvConfig.model_validate(raw)  # once per process: no second warning
    assert len(config_log) == before


def test_environment_variables_may_not_contradict_env() -> None:
    raw = {"name": "x", "deployConfig": {"env": {"A": "1"}, "environmentVariables": {"A": "2"}}}
    with pytest.raises(ValueError, match="give A different values"):
        EnvConfig.model_validate(raw)
