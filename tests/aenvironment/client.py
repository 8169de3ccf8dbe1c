"""An agent written against AEnvironment's documented SDK: every call its guides show, each
outcome written as one JSON line to the file named by argv[1] (stdout is AEnvironment's log).

tests/test_aenv_oracle.py runs it twice, unchanged: with AEnvironment 0.1.7 against its own
server, and with aenv-ray (whose `aenv` package is the compatibility layer) against `aenv run`;
both with DUMMY_INSTANCE_IP, AEnvironment's local mode."""

import asyncio
import json
import sys
from typing import Any

import aenv
from aenv import Environment
from aenv.core.environment import Environment as CoreEnvironment

OUT = open(sys.argv[1], "w")  # noqa: SIM115 - closed at the end of main()


def jsonable(value: Any) -> Any:
    if hasattr(value, "content") and hasattr(value, "is_error"):
        return {"content": value.content, "is_error": value.is_error}
    if isinstance(value, list) and value and hasattr(value[0], "on_invoke_tool"):
        return [{"name": t.name, "strict": t.strict_json_schema} for t in value]
    return value


async def step(label: str, call: Any) -> Any:
    try:
        value = await call
    except Exception as exc:
        record = {
            "step": label,
            "raised": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
        }
        value = None
    else:
        record = {"step": label, "value": jsonable(value)}
    OUT.write(json.dumps(record, default=str) + "\n")
    return value


async def main() -> None:
    OUT.write(json.dumps({"step": "version", "value": aenv.__version__}) + "\n")
    assert CoreEnvironment is Environment
    env = Environment("aenv-demo@1.0.0", environment_variables={"EXTRA": "x"})
    await step("initialize", env.initialize())
    await step("list_tools", env.list_tools())
    await step("echo", env.call_tool("echo", {"content": "hi"}))
    await step("echo_namespaced", env.call_tool("aenv-demo@1.0.0/echo", {"content": "ns"}))
    await step("echo_other_env", env.call_tool("other@1.0.0/echo", {"content": "x"}))
    await step("run_defaults", env.call_tool("run", {"command": "ls"}))
    await step("run_timeout_int", env.call_tool("run", {"command": "ls", "timeout": 5}))
    await step("text", env.call_tool("text", {"n": 3}))
    await step("nothing", env.call_tool("nothing", {}))
    await step("boom", env.call_tool("boom", {"x": 2}))
    await step("unknown_tool", env.call_tool("nope", {}))
    await step("bad_argument", env.call_tool("text", {"n": "abc"}))
    await step("missing_argument", env.call_tool("text", {}))
    await step("extra_argument", env.call_tool("text", {"n": 1, "m": 2}))
    await step("timeout", env.call_tool("sleepy", {"seconds": 2}, timeout=1))
    await step("after_timeout", env.call_tool("echo", {"content": "again"}))
    await step("pydantic_model", env.call_tool("search_users", {"params": {"query": "q"}}))
    simple = {"name": "a", "count": 1, "price": 2.5, "enabled": True, "tags": ["x"]}
    await step("simple_types", env.call_tool("simple_types", simple))
    await step("function", env.call_function("custom_endpoint", {"data": {"a": 1}}))
    await step("function_calls", env.call_function("calls", {}))
    await step("function_raises", env.call_function("fails", {}))
    await step("function_unknown", env.call_function("nope", {}))
    await step("function_bad_arguments", env.call_function("custom_endpoint", {"x": 1}))
    await step("reward", env.call_reward({"expected": "e"}))
    await step("health", env.check_health({}))
    await step("list_functions", env.list_functions())
    await step("env_info", env.get_env_info())
    await step("openai_tools", env.list_openai_tools())
    await step("release", env.release())
    await step("initialize_again", env.initialize())
    await step("function_after_release", env.call_function("calls", {}))
    await step("release_again", env.release())
    async with Environment("aenv-demo@1.0.0") as managed:
        await step("context_manager", managed.call_tool("text", {"n": 7}))
    OUT.close()


asyncio.run(main())
