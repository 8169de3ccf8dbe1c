"""The SDK against real runtimes on loopback: calls, every bad input, timeouts, dead servers."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import pytest

from aenv_ray import (
    CallTimeoutError,
    ClosedError,
    ConfigurationError,
    Environment,
    EnvironmentNotFoundError,
    FunctionError,
    FunctionNotFoundError,
    InstanceBrokenError,
    InstanceClosedError,
    StartupTimeoutError,
    ToolArgumentError,
    ToolErrorKind,
    ToolExecutionError,
    ToolTimeoutError,
)
from aenv_ray.settings import Settings
from aenv_ray.testing import RuntimeProcess, free_port

from .conftest import PROBE


async def test_list_tools_are_namespaced_and_described(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment("probe@0.1.0") as env:
        tools = {t["name"]: t for t in await env.list_tools()}
    assert "probe@0.1.0/echo" in tools
    echo = tools["probe@0.1.0/echo"]
    assert echo["description"] == "Say it back."
    assert echo["inputSchema"]["properties"]["text"] == {
        "type": "string",
        "description": "what to say.",
    }
    assert echo["inputSchema"]["required"] == ["text"]
    assert tools["probe@0.1.0/async_echo"]["description"] == "Say it back, asynchronously."


async def test_attach_without_a_name_takes_the_served_one(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        assert env.env_name == "probe@0.1.0"
        assert env.is_open


async def test_call_by_plain_namespaced_and_openai_names(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        plain = await env.call_tool("echo", {"text": "a"})
        spaced = await env.call_tool("probe@0.1.0/echo", {"text": "b"})
        openai = await env.list_openai_tools()
        name = next(
            t["function"]["name"] for t in openai if t["function"]["name"].endswith("__echo")
        )
        by_openai = await env.call_tool(name, {"text": "c"})
        other = await env.call_tool("other@1.0/echo", {"text": "d"})
    assert (plain.text, spaced.text, by_openai.text) == ("a", "b", "c")
    assert not plain.is_error
    assert other.is_error
    assert other.error_kind is ToolErrorKind.NOT_FOUND
    assert "belongs to `other@1.0`" in other.text


async def test_openai_tools_are_chat_completions_dicts(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        tools = await env.list_openai_tools()
    assert len(tools) == len({t["function"]["name"] for t in tools}) >= 10
    for tool in tools:
        assert tool["type"] == "function"
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", tool["function"]["name"])
        assert tool["function"]["parameters"]["type"] == "object"


async def test_agents_sdk_adapter_invokes_the_tool(probe_runtime: RuntimeProcess) -> None:
    agents = pytest.importorskip("agents")
    async with probe_runtime.environment() as env:
        tools = await env.list_agents_tools()
        echo = next(t for t in tools if t.name.endswith("__echo"))
        assert isinstance(echo, agents.FunctionTool)
        assert await echo.on_invoke_tool(None, '{"text": "via agents"}') == "via agents"
        assert "invalid JSON" in await echo.on_invoke_tool(None, "{nope")


async def test_result_shapes(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        model = await env.call_tool("returns_model", {"x": 2})
        none = await env.call_tool("returns_none")
        listed = await env.call_tool("returns_list", {"n": 3})
        typed = await env.call_tool(
            "typed",
            {
                "count": 3,
                "ratio": 0.5,
                "flag": True,
                "tags": ["a"],
                "meta": {"k": 1},
                "mode": "slow",
                "color": "blue",
                "point": {"x": 1},
            },
        )
    assert model.structured == {"x": 2, "y": 4}
    assert model.content == [{"type": "text", "text": '{"x":2,"y":4}'}]
    assert none.content == []
    assert not none.is_error
    assert listed.structured == [0, 1, 2]
    assert typed.structured == {
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "tags": ["a"],
        "meta": {"k": 1},
        "mode": "slow",
        "color": "blue",
        "note": None,
        "point": {"x": 1, "y": 0},
    }


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"text": 5}, "argument `text` must be a string, got int 5"),
        ({}, "missing required argument `text`"),
        ({"text": "x", "loud": True}, "unexpected argument `loud` (it takes: text)"),
    ],
)
async def test_bad_arguments_name_the_argument(
    probe_runtime: RuntimeProcess, arguments: dict[str, object], expected: str
) -> None:
    async with probe_runtime.environment() as env:
        result = await env.call_tool("echo", arguments)
    assert result.is_error
    assert result.error_kind is ToolErrorKind.INVALID_ARGUMENTS
    assert expected in result.text
    with pytest.raises(ToolArgumentError, match="invalid arguments for tool `echo`"):
        result.raise_for_error(tool="echo")


async def test_literal_enum_and_model_arguments_are_checked(probe_runtime: RuntimeProcess) -> None:
    base = {"count": 1, "ratio": 1.0, "flag": False, "tags": [], "meta": {}}
    async with probe_runtime.environment() as env:
        mode = await env.call_tool("typed", {**base, "mode": "medium"})
        color = await env.call_tool("typed", {**base, "color": "green"})
        point = await env.call_tool("typed", {**base, "point": {"x": "far"}})
        tags = await env.call_tool("typed", {**base, "tags": "not-a-list"})
    assert "argument `mode`" in mode.text
    assert "'fast' or 'slow'" in mode.text
    assert "argument `color`" in color.text
    assert "argument `point.x` must be an integer" in point.text
    assert "argument `tags` must be an array" in tags.text


async def test_arguments_that_are_not_a_dict_raise_locally(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        with pytest.raises(ToolArgumentError, match="must be a dict"):
            await env.call_tool("echo", ["text"])  # type: ignore[arg-type]


async def test_unknown_tool_suggests_the_closest(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        close = await env.call_tool("ecoh", {"text": "x"})
        far = await env.call_tool("zzzzzz", {})
    assert close.error_kind is ToolErrorKind.NOT_FOUND
    assert close.text == "tool `ecoh` not found in `probe@0.1.0`; did you mean `echo`?"
    assert "it has: " in far.text
    assert "echo" in far.text


async def test_a_raising_tool_reports_type_and_message(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        result = await env.call_tool("fail", {"message": "bad things"})
        exited = await env.call_tool("sys_exit")
        after = await env.call_tool("echo", {"text": "alive"})
    assert result.error_kind is ToolErrorKind.EXECUTION
    assert result.text == "tool `fail` raised ValueError: bad things"
    assert "Traceback" not in result.text
    assert exited.text == "tool `sys_exit` raised SystemExit: 3"
    assert after.text == "alive"
    with pytest.raises(ToolExecutionError, match="ValueError: bad things"):
        result.raise_for_error()


async def test_debug_runtime_includes_tracebacks() -> None:
    with RuntimeProcess(PROBE, debug=True) as runtime:
        async with runtime.environment() as env:
            result = await env.call_tool("fail", {"message": "deep"})
    assert "Traceback (most recent call last)" in result.text
    assert "probe_tools.py" in result.text


async def test_unserializable_result_is_an_error(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        result = await env.call_tool("returns_unserializable")
    assert result.is_error
    assert "value of type `object`, which is not JSON" in result.text


@pytest.mark.parametrize(
    ("tool", "arguments", "timeout", "limit"),
    [
        ("busy_loop", {}, None, "0.5"),  # the tool's own timeout, a pure-Python busy loop
        ("sleepy", {"seconds": 30}, 0.3, "0.3"),  # the call's timeout, a blocking C call
        ("async_sleepy", {"seconds": 30}, 0.3, "0.3"),  # an async tool
    ],
)
async def test_tool_timeouts_interrupt_and_the_next_call_works(
    probe_runtime: RuntimeProcess,
    tool: str,
    arguments: dict[str, object],
    timeout: float | None,
    limit: str,
) -> None:
    async with probe_runtime.environment() as env:
        result = await env.call_tool(tool, arguments, timeout=timeout)
        after = await env.call_tool("echo", {"text": "next"})
    assert result.error_kind is ToolErrorKind.TIMEOUT
    assert result.text == f"tool `{tool}` timed out after {limit} s and was interrupted"
    with pytest.raises(ToolTimeoutError):
        result.raise_for_error()
    assert after.text == "next"


async def test_a_tool_that_ignores_interruption_breaks_the_instance(
    fresh_probe: RuntimeProcess,
) -> None:
    async with fresh_probe.environment() as env:
        result = await env.call_tool("stubborn_loop", timeout=0.2)
        assert result.error_kind is ToolErrorKind.TIMEOUT
        assert "ignored its interruption" in result.text
        with pytest.raises(InstanceBrokenError, match="stuck in `stubborn_loop`"):
            await env.call_tool("echo", {"text": "x"})
        health = await env.check_health()
        assert health["status"] == "unhealthy"
        # async tools still run on the event loop: the server itself is alive
        assert (await env.call_tool("async_echo", {"text": "y"})).text == "y"
    # SIGTERM ends it (exit 0), though its main thread never comes back from the stuck tool:
    # no SIGKILL needed, so an engine does not wait out a grace period for it
    process = fresh_probe.process
    assert process is not None
    await asyncio.to_thread(fresh_probe.stop)
    assert fresh_probe.unstopped is None
    assert process.returncode == 0


async def test_call_timeout_when_the_server_does_not_answer(fresh_probe: RuntimeProcess) -> None:
    settings = Settings(call_grace=0.2)
    async with fresh_probe.environment(settings=settings) as env:
        os.kill(fresh_probe.pid, signal.SIGSTOP)
        try:
            with pytest.raises(CallTimeoutError, match="did not answer") as caught:
                await env.call_tool("echo", {"text": "x"}, timeout=0.2)
        finally:
            os.kill(fresh_probe.pid, signal.SIGCONT)
        assert caught.value.timeout == pytest.approx(0.4)
        assert caught.value.retryable
        assert (await env.call_tool("echo", {"text": "back"})).text == "back"


async def test_server_killed_between_calls_is_a_broken_instance(
    fresh_probe: RuntimeProcess,
) -> None:
    async with fresh_probe.environment() as env:
        assert (await env.call_tool("echo", {"text": "x"})).text == "x"
        fresh_probe.kill()
        # the default timeout is 60 s: the error must come long before that
        with pytest.raises(InstanceBrokenError, match=r"crashed|died") as caught:
            await asyncio.wait_for(env.call_tool("echo", {"text": "x"}), timeout=15)
    assert caught.value.instance_id is None
    assert caught.value.env_name == "probe@0.1.0"


async def test_server_dying_during_a_call_is_a_broken_instance(fresh_probe: RuntimeProcess) -> None:
    async with fresh_probe.environment() as env:
        with pytest.raises(InstanceBrokenError, match="dropped the connection"):
            await asyncio.wait_for(env.call_tool("crash"), timeout=15)
        with pytest.raises(InstanceBrokenError):
            await asyncio.wait_for(env.call_tool("echo", {"text": "x"}), timeout=15)


async def test_release_is_idempotent_and_closes(probe_runtime: RuntimeProcess) -> None:
    env = probe_runtime.environment()
    await env.initialize()
    assert await env.initialize() is True
    await env.release()
    await env.release()
    await env.destroy()
    assert not env.is_open
    with pytest.raises(InstanceClosedError, match="was released"):
        await env.call_tool("echo", {"text": "x"})
    with pytest.raises(ClosedError):  # the one class every closed object raises
        await env.initialize()


async def test_first_call_initializes(probe_runtime: RuntimeProcess) -> None:
    env = probe_runtime.environment()
    try:
        assert (await env.call_tool("echo", {"text": "lazy"})).text == "lazy"
    finally:
        await env.release()


async def test_functions_reward_and_health(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        assert await env.call_function("add", {"a": 2}) == 3
        assert await env.call_function("add", {"a": 2, "b": 5}) == 7
        assert await env.call_reward({"answer": " 42 "}) == 1.0
        assert await env.call_reward({"answer": "41"}) == 0.0
        assert await env.check_health() == {"status": "healthy"}
        await env.call_function("set_healthy", {"ok": False})
        try:
            assert (await env.check_health())["status"] == "unhealthy"
        finally:
            await env.call_function("set_healthy", {"ok": True})


async def test_function_errors_are_typed(probe_runtime: RuntimeProcess) -> None:
    async with probe_runtime.environment() as env:
        with pytest.raises(FunctionNotFoundError, match="did you mean `add`"):
            await env.call_function("ad", {"a": 1})
        with pytest.raises(FunctionError, match="RuntimeError: kaboom") as raised:
            await env.call_function("explode")
        assert raised.value.error_type == "RuntimeError"
        with pytest.raises(FunctionError, match="argument `a` must be an integer") as invalid:
            await env.call_function("add", {"a": "two"})
        assert invalid.value.error_type == "invalid_arguments"
        with pytest.raises(FunctionError, match="missing required argument `answer`"):
            await env.call_reward({})


async def test_reward_missing_is_function_not_found(tmp_path: Path) -> None:
    project = tmp_path / "noreward"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"name": "noreward", "version": "1"}')
    (project / "src" / "noreward_tools.py").write_text(
        "from aenv_ray import register_tool\n\n@register_tool\ndef hi() -> str:\n    return 'hi'\n"
    )
    with RuntimeProcess(project) as runtime:
        async with runtime.environment() as env:
            assert await env.check_health() == {"status": "healthy"}  # the default check
            with pytest.raises(FunctionNotFoundError, match="registers no reward"):
                await env.call_reward({})


async def test_dummy_instance_ip_aenv_run_mode(
    probe_runtime: RuntimeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUMMY_INSTANCE_IP", probe_runtime.url)
    async with Environment("probe@0.1.0") as env:
        assert env.instance_id == "local"
        assert env.url == probe_runtime.url
        assert (await env.call_tool("echo", {"text": "dummy"})).text == "dummy"


async def test_without_a_server_the_name_must_be_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no DUMMY_INSTANCE_IP and no AENV_SYSTEM_URL: the embedded engine would create the
    # instance, but `probe` is a test project, neither built in nor on AENV_ENV_PATH
    monkeypatch.delenv("DUMMY_INSTANCE_IP", raising=False)
    monkeypatch.delenv("AENV_SYSTEM_URL", raising=False)
    monkeypatch.delenv("AENV_ENV_PATH", raising=False)
    with pytest.raises(EnvironmentNotFoundError, match=r"no environment `probe@0\.1\.0`"):
        async with Environment("probe@0.1.0"):
            pass


async def test_nothing_listening_fails_startup_with_the_reason() -> None:
    env = Environment.attach(f"http://127.0.0.1:{free_port()}", "probe@0.1.0", startup_timeout=0.3)
    with pytest.raises(StartupTimeoutError, match="did not become healthy") as caught:
        await env.initialize()
    assert "nothing answers" in str(caught.value)


def test_bad_constructor_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="env_name"):
        Environment("")
    with pytest.raises(ConfigurationError, match="duration `soon`"):
        Environment("x@1", ttl="soon")


async def test_a_tool_declared_slower_than_the_environment_default_is_not_cut(
    probe_runtime: RuntimeProcess,
) -> None:
    async with probe_runtime.environment(timeout=0.5) as env:
        slow = await env.call_tool("patient", {"seconds": 1.0})  # declares timeout=5
        assert slow.text == "waited 1.0"
        # an explicit call timeout still bounds it, on the server: interrupted, then answered
        cut = await env.call_tool("patient", {"seconds": 3.0}, timeout=0.3)
        assert cut.error_kind is ToolErrorKind.TIMEOUT
        assert "0.3" in cut.text
        # tools that declare nothing run under the environment's timeout
        default = await env.call_tool("sleepy", {"seconds": 2.0})
        assert default.error_kind is ToolErrorKind.TIMEOUT


async def test_function_timeouts_are_enforced_by_the_runtime(fresh_probe: RuntimeProcess) -> None:
    async with fresh_probe.environment() as env:
        with pytest.raises(FunctionError) as caught:
            await env.call_function("nap", {"seconds": 30}, timeout=0.3)
        assert caught.value.error_type == "timeout"
        assert not isinstance(caught.value, CallTimeoutError)  # the server answered
        # the runtime stopped the function: the next sync call runs at once
        assert (await env.call_tool("echo", {"text": "next"}, timeout=2)).text == "next"
        assert await env.call_function("nap", {"seconds": 0.01}) == 0.01


async def test_names_use_the_served_version_when_the_name_had_none(
    probe_runtime: RuntimeProcess,
) -> None:
    async with Environment.attach(probe_runtime.url, "probe") as env:
        names = [tool["name"] for tool in await env.list_tools()]
        openai = [tool["function"]["name"] for tool in await env.list_openai_tools()]
        assert "probe@0.1.0/echo" in names
        assert "probe_0_1_0__echo" in openai
        assert (await env.call_tool("probe_0_1_0__echo", {"text": "ok"})).text == "ok"


async def test_health_ignores_query_parameters_it_does_not_take(
    probe_runtime: RuntimeProcess,
) -> None:
    import aiohttp

    url = f"{probe_runtime.url}/health?nocache=123"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        assert (await response.json())["data"]["status"] == "healthy"
