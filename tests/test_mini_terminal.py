"""The built-in mini-terminal environment, served by a real runtime."""

from __future__ import annotations

import os

from aenv_ray.testing import RuntimeProcess

from .conftest import MINI_TERMINAL


async def test_shell_state_persists_between_commands(terminal_runtime: RuntimeProcess) -> None:
    async with terminal_runtime.environment("mini-terminal@1.0.0") as env:
        first = await env.call_tool(
            "execute_command", {"command": "mkdir -p sub && cd sub && export X=7 && pwd"}
        )
        second = await env.call_tool("execute_command", {"command": "echo $X; pwd; ls nope"})
    assert not first.is_error
    assert first.structured["returncode"] == 0
    workdir = first.structured["output"].strip()
    assert workdir.endswith("/sub")
    out = second.structured["output"].splitlines()
    assert out[0] == "7"
    assert out[1] == workdir
    assert "No such file or directory" in out[2]  # stderr is merged into the output
    assert second.structured["returncode"] == 2


async def test_command_timeout_restarts_the_terminal(terminal_runtime: RuntimeProcess) -> None:
    async with terminal_runtime.environment() as env:
        slow = await env.call_tool("execute_command", {"command": "sleep 30", "timeout": 1})
        after = await env.call_tool("execute_command", {"command": "echo fresh"})
    assert slow.structured == {"output": "command did not finish within 1 s", "returncode": 124}
    assert after.structured == {"output": "fresh\n", "returncode": 0}


async def test_exit_ends_the_shell_and_the_next_command_gets_a_new_one(
    terminal_runtime: RuntimeProcess,
) -> None:
    async with terminal_runtime.environment() as env:
        gone = await env.call_tool("execute_command", {"command": "echo bye; exit 3"})
        back = await env.call_tool("execute_command", {"command": "echo back"})
    assert gone.structured == {"output": "bye\n", "returncode": 3}
    assert back.structured["output"] == "back\n"


async def test_bad_timeout_is_an_error_result(terminal_runtime: RuntimeProcess) -> None:
    async with terminal_runtime.environment() as env:
        result = await env.call_tool("execute_command", {"command": "true", "timeout": 0})
        wrong = await env.call_tool("execute_command", {"command": ["ls"]})
    assert result.is_error
    assert "timeout must be a positive number" in result.text
    assert "argument `command` must be a string" in wrong.text


async def test_reward_and_health(terminal_runtime: RuntimeProcess) -> None:
    async with terminal_runtime.environment() as env:
        health = await env.check_health()
        assert health["status"] == "healthy"
        workdir = health["workdir"]
        # Another test may have left the shell elsewhere: the reward reads paths relative to the
        # instance's working directory, whatever the shell's current directory is.
        await env.call_tool("execute_command", {"command": f"echo 42 > '{workdir}/answer.txt'"})
        found = await env.call_reward({"path": "answer.txt", "expected": "42"})
        missing = await env.call_reward({"path": "nothing.txt", "expected": "42"})
        wrong = await env.call_reward({"path": "answer.txt", "expected": "43"})
    assert (found, missing, wrong) == (1.0, 0.0, 0.0)


async def test_each_instance_has_its_own_working_directory() -> None:
    with RuntimeProcess(MINI_TERMINAL) as one, RuntimeProcess(MINI_TERMINAL) as two:
        async with one.environment() as a, two.environment() as b:
            await a.call_tool("execute_command", {"command": "echo mine > private.txt"})
            dir_a = (await a.check_health())["workdir"]
            dir_b = (await b.check_health())["workdir"]
            seen = await b.call_tool("execute_command", {"command": "ls"})
    assert dir_a != dir_b
    assert "private.txt" not in seen.structured["output"]
    # a working directory the instance made for itself goes away with the instance
    assert not os.path.exists(dir_a)  # noqa: ASYNC240 (a test; nothing else runs)
    assert not os.path.exists(dir_b)  # noqa: ASYNC240
