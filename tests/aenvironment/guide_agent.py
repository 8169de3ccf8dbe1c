"""The SDK and environment guides' usage examples (AEnvironment's docs/guide/sdk.md "Environment
Usage", docs/guide/environments.md "Environment Instance Lifecycle"), written from them against
guide-env: basic usage (initialize, list_tools, destroy), the context manager, and the calls the
guides show for tools, the reward, functions and health. Prints one JSON object."""

import asyncio
import json

from aenv import Environment


async def basic_example():
    env = Environment("guide-env")
    await env.initialize()
    tools = await env.list_tools()
    print(f"Available tools: {len(tools)}")
    await env.destroy()
    return tools


async def recommended_usage():
    async with Environment("guide-env", ttl="2h") as env:
        tools = await env.list_tools()
        result = await env.call_tool("my_custom_echo_env", {"content": "Hello from AEnvironment!"})
        print(result.content)
        typed = await env.call_tool(
            "simple_types",
            {"name": "a", "count": 1, "price": 2.5, "enabled": True, "tags": ["x"]},
        )
        model = await env.call_tool("search_users", {"params": {"query": "alice"}})
        reward = await env.call_reward(
            {"code": "def hello(): return 'world'", "test_results": {"passed": 5, "failed": 0}}
        )
        function = await env.call_function("custom_endpoint", {"data": {"k": "v"}})
        health = await env.check_health()
        return {
            "tools": [tool["name"] for tool in tools],
            "echo": result.content,
            "typed": typed.content,
            "model": model.content,
            "reward": reward,
            "function": function,
            "health": health,
        }


async def lifecycle():
    env = Environment(env_name="guide-env", ttl="1h", environment_variables={"DEBUG": "true"})
    await env.initialize()
    await env.release()


async def main():
    listed = await basic_example()
    used = await recommended_usage()
    await lifecycle()
    print(json.dumps({"basic": [tool["name"] for tool in listed], **used}))


asyncio.run(main())
