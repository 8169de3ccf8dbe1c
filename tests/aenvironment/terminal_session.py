"""The SDK guide's interactive mini-terminal session ("Start Environment Instance"), written from
AEnvironment's docs/guide/sdk.md: list the tools of `mini-terminal@1.0.1`, then run each line read
from stdin as a command through the namespaced tool, until `exit`."""

import asyncio

from aenv import Environment


async def main():
    terminal = Environment("mini-terminal@1.0.1", ttl="60m")

    try:
        tools = await terminal.list_tools()
        print("Tools:", tools)
        assert tools is not None
    except Exception as exc:
        print("The environment was created, but listing its tools failed:", str(exc))

    while True:
        try:
            line = input(">>> ").strip()
            if line.lower() in ("exit", "quit"):
                print("Leaving the interactive mode")
                break
            result = await terminal.call_tool(
                "mini-terminal@1.0.1/execute_command", {"command": line, "timeout": 5}
            )
            print("Result:\n", result)
            print("-" * 60)
        except KeyboardInterrupt:
            print("\nInterrupted: type 'exit' to leave")
            await terminal.release()
            print("Environment released")


if __name__ == "__main__":
    asyncio.run(main())
