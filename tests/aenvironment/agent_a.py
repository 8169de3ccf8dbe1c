"""AEnvironment's "Agent as Environment" example (its README), written from it: agent A calls
agent B as an environment, lists its tools and calls its chat tool."""

import asyncio

from aenv import Environment


async def main():
    async with Environment("agent-b@1.0.0") as agent_b:
        tools = await agent_b.list_tools()
        print([tool["name"] for tool in tools])
        response = await agent_b.call_tool("chat", {"message": "Hello!"})
        print(response.content)


asyncio.run(main())
