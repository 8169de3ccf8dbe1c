"""The built-in mini-terminal environment, served by a real runtime."""

from __future__ import annotations

import os
from pathlib import Path

from aenv_ray import ToolErrorKind, ToolResult
from aenv_ray.testing import RuntimeProcess
from tests._cgroup import TestCgroup
from tests._processes import children_of

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
        for runtime in (one, two):
            runtime.stop()  # SIGTERM, as an engine stops an instance
            assert runtime.unstopped is None, f"SIGTERM did not end it:\n{runtime.unstopped}"
    assert dir_a != dir_b
    assert "private.txt" not in seen.structured["output"]
    # a working directory the instance made for itself goes away with the instance
    assert not os.path.exists(dir_a)  # noqa: ASYNC240 (a test; nothing else runs)
    assert not os.path.exists(dir_b)  # noqa: ASYNC240


async def test_output_over_a_megabyte_keeps_head_and_tail_and_says_what_was_dropped(
    terminal_runtime: RuntimeProcess,
) -> None:
    command = (
        "cd / && export KEPT=yes; echo first; head -c 3000000 /dev/zero | tr '\\0' a; echo; "
        "echo last; (exit 3)"
    )
    async with terminal_runtime.environment(timeout=60) as env:
        big = await env.call_tool("execute_command", {"command": command})
        after = await env.call_tool("execute_command", {"command": "echo $KEPT; pwd"})
    assert not big.is_error
    assert big.structured["returncode"] == 3  # the command's own status, read to its end
    output = big.structured["output"]
    assert output.startswith("first\n" + "a" * 1000)
    assert output.endswith("a" * 1000 + "\nlast\n")
    assert (
        "bytes of output dropped here: 3000012 bytes in all, the first 500000 and the last "
        "500000 are shown" in output
    )
    dropped = int(output.split("[... ")[1].split(" bytes")[0])
    assert dropped == 3000012 - 1_000_000
    assert len(output) < 1_000_200
    assert after.structured == {"output": "yes\n/\n", "returncode": 0}  # the same shell


async def test_output_just_under_the_limit_is_whole(terminal_runtime: RuntimeProcess) -> None:
    async with terminal_runtime.environment(timeout=60) as env:
        result = await env.call_tool(
            "execute_command", {"command": "head -c 999999 /dev/zero | tr '\\0' b"}
        )
    assert result.structured == {"output": "b" * 999999, "returncode": 0}


async def test_a_memory_hog_or_fork_bomb_ends_its_command_and_the_shell_lives_on(
    tmp_path: Path,
) -> None:
    hog = "python3 -c 'x = bytearray(2 << 30); x[::4096] = b\"x\" * len(x[::4096])'"
    bomb = "python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'"
    with TestCgroup(memory=256 << 20, pids=64) as cgroup:
        python = cgroup.launcher(tmp_path, pass_fds=True)
        flags = ["--memory-limit", "256M", "--pids-limit", "64"]
        flags += ["--memory-events-fd", "3", "--pids-events-fd", "4"]
        with RuntimeProcess(MINI_TERMINAL, python=str(python), extra_args=flags) as runtime:
            async with runtime.environment(timeout=60) as env:

                async def run(command: str) -> ToolResult:
                    return await env.call_tool("execute_command", {"command": command})

                # a command that starts a process: the runtime's end-of-call sweep then has
                # made its worker thread (pids.current counts threads) before the base is read
                await run("export KEPT=yes; cd /; /bin/true")
                base = cgroup.processes
                killed = await run(hog)
                after_hog = await run("echo $KEPT; pwd")
                bombed = await run(bomb)
                drained = cgroup.drained(base)
                after_bomb = await run("echo $KEPT; pwd")
    assert killed.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert killed.text.startswith(
        "tool `execute_command`: the instance hit its memory limit (256 MiB) during this call"
    )
    assert "Killed" in killed.structured["output"]
    assert killed.structured["returncode"] == 137
    assert bombed.error_kind is ToolErrorKind.RESOURCE_LIMIT
    assert "the instance hit its process limit (64 processes) during this call" in bombed.text
    assert bombed.structured["returncode"] == 137
    assert drained <= base
    for after in (after_hog, after_bomb):  # the same shell: its variable and directory
        assert after.structured == {"output": "yes\n/\n", "returncode": 0}
        assert not after.is_error


async def test_the_shell_starts_with_the_instance_not_with_its_first_command() -> None:
    with RuntimeProcess(MINI_TERMINAL) as runtime:
        shells = [pid for pid, name in children_of(runtime.pid).items() if name == "bash"]
        assert len(shells) == 1  # the warm-up started it: a warm instance's shell is running
        async with runtime.environment() as env:
            result = await env.call_tool("execute_command", {"command": "echo $$"})
    assert result.structured == {"output": f"{shells[0]}\n", "returncode": 0}
