"""terminal-bench@1.0.0 in real instances of the local engine: the tools, the tmux terminal, the
reward's outcomes (passed, failed, fraction, strict, invalid, test timeout), the agent's time
limit, resets on a warm instance, ``TB_TASK_DIR`` at creation, and an agent that tries every
way it has to read or change the tests before they run.

The tasks are written here, in the Terminal-Bench format, into a dataset given to the instances
as their datasource; each holds a secret string only its tests and solution know.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from aenv_ray import Environment, FunctionError
from aenv_ray.engine import SandboxEngine
from builtin_envs.demos import terminal_bench as demo
from local_backend._sandbox import namespaces_available
from tests._cli import aenv_async
from tests._demo_solutions import assert_given_no_grader_fields

if (why := namespaces_available()) is not None:
    pytest.skip(f"terminal-bench's boxes need namespaces: {why}", allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parent.parent
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (scripts/setup installs it as root)"
)
SECRET = f"TB-SECRET-{uuid.uuid4().hex}"
RUN_TESTS = textwrap.dedent(
    """\
    #!/bin/bash
    apt-get update
    apt-get install -y curl
    curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
    source $HOME/.local/bin/env
    uv init
    uv add pytest==8.4.1
    uv run pytest $TEST_DIR/test_outputs.py -rA
    """
)
TASKS: dict[str, dict[str, str]] = {
    # three tests: one per file the agent makes, and one skipped
    "mixed": {
        "task.yaml": "instruction: Create /app/a and /app/b.\nmax_test_timeout_sec: 60\n",
        "solution.sh": "touch /app/a /app/b\n",
        "tests/test_outputs.py": f"""
            import os
            import pytest

            SECRET = "{SECRET}"

            def test_a():
                assert os.path.exists("/app/a")

            def test_b():
                assert os.path.exists("/app/b")

            @pytest.mark.skip(reason="kept for later")
            def test_later():
                pass
        """,
    },
    # the tests read a file beside them, through $TEST_DIR
    "with-data": {
        "task.yaml": "instruction: Copy the word the tests hold into /app/word.txt.\n",
        "solution.sh": f"echo {SECRET} > /app/word.txt\n",
        "tests/word.txt": f"{SECRET}\n",
        "tests/test_outputs.py": """
            import os
            from pathlib import Path

            def test_word():
                expected = (Path(os.environ["TEST_DIR"]) / "word.txt").read_text()
                assert Path("/app/word.txt").read_text() == expected
        """,
    },
    # the tests run the agent's program
    "agent-code": {
        "task.yaml": "instruction: Write /app/program.py.\n",
        "tests/test_outputs.py": """
            import subprocess
            import sys

            def test_the_program_runs():
                subprocess.run([sys.executable, "/app/program.py"], check=True)
        """,
    },
    "slow-tests": {
        "task.yaml": "instruction: Nothing.\nmax_test_timeout_sec: 2\n",
        "solution.sh": "true\n",
        "tests/test_outputs.py": """
            import time

            def test_forever():
                time.sleep(600)
        """,
    },
    "no-tests-dir": {"task.yaml": "instruction: Nothing.\n", "solution.sh": "true\n"},
    "no-run-tests": {
        "task.yaml": "instruction: Nothing.\n",
        "tests/test_outputs.py": "def test_x():\n    pass\n",
    },
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tb-dataset")
    for name, files in TASKS.items():
        for relative, text in files.items():
            path = root / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text).lstrip("\n"))
        if "tests/test_outputs.py" in files:
            (root / name / "run-tests.sh").write_text(RUN_TESTS)
    (root / "no-run-tests" / "run-tests.sh").unlink()
    for path in [root, *root.rglob("*")]:  # an instance's root is `nobody` on the host
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture(scope="module")
def engine(warm_engine: SandboxEngine) -> SandboxEngine:
    return warm_engine  # the session's: its terminal-bench template serves every file


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(engine: SandboxEngine, dataset: Path) -> AsyncIterator[Environment]:
    """One warm instance for the module: every test starts its own task (tb_reset)."""
    async with Environment(
        "terminal-bench@1.0.0", engine=engine, datasource=str(dataset), ttl="20m", timeout=120
    ) as env:
        yield env


async def _run(env: Environment, command: str, timeout: float = 60) -> dict[str, Any]:
    result = await env.call_tool("run_command", {"command": command, "timeout": timeout})
    assert not result.is_error, result.text
    assert isinstance(result.structured, dict)
    return result.structured


# -- the reward ---------------------------------------------------------------------------------


async def test_nothing_fails_the_solution_passes_fraction_and_strict(env: Environment) -> None:
    info = await env.call_function("tb_reset", {"task": "mixed"})
    assert info["instruction"] == "Create /app/a and /app/b."
    assert (info["workdir"], info["has_tests"], info["max_test_timeout_sec"]) == ("/app", True, 60)
    assert "SECRET" not in str(info)
    nothing = await env.call_reward({})
    assert (nothing["reward"], nothing["outcome"], nothing["invalid"]) == (0.0, "failed", False)
    assert nothing["tests"] == {
        "test_a": "failed",
        "test_b": "failed",
        next(n for n in nothing["tests"] if "kept for later" in n): "skipped",
    }
    await _run(env, "touch a")
    half = await env.call_reward({"scoring": "fraction"})
    assert (half["reward"], half["passed"], half["total"]) == (pytest.approx(2 / 3), 2, 3)
    strict = await env.call_reward({"scoring": "fraction", "strict": True})
    assert strict["reward"] == pytest.approx(1 / 3)  # the skipped test no longer counts
    solved = await env.call_function("tb_run_solution", {})
    assert solved["returncode"] == 0
    passed = await env.call_reward({})
    assert (passed["reward"], passed["outcome"], passed["resolved"]) == (1.0, "passed", True)
    assert passed["parser"] == "parsed"
    assert "short test summary info" in passed["output_tail"]
    assert (await env.call_reward({"strict": True}))["reward"] == 0.0


async def test_the_tests_read_their_own_files_through_test_dir(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "with-data"})
    assert (await env.call_reward({}))["reward"] == 0.0
    await env.call_function("tb_run_solution", {})
    assert (await env.call_reward({}))["reward"] == 1.0


async def test_tasks_without_tests_are_invalid(env: Environment) -> None:
    for task, why in (("no-tests-dir", "no tests/ directory"), ("no-run-tests", "no run-tests")):
        info = await env.call_function("tb_reset", {"task": task})
        assert info["has_tests"] is False
        result = await env.call_reward({})
        assert (result["reward"], result["invalid"], result["outcome"]) == (None, True, "invalid")
        assert why in result["reason"]


async def test_tests_past_their_time_are_stopped_and_fail(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "slow-tests"})
    await _run(env, "sleep 300 > /dev/null 2>&1 &")  # the judge ends it before the tests
    started = time.monotonic()
    result = await env.call_reward({})
    assert time.monotonic() - started < 60
    assert (result["reward"], result["outcome"], result["exit_code"]) == (0.0, "test_timeout", None)
    # the leftover, caught as `sleep` or, under load, as the shell's child before its exec
    killed = [p["command"] for p in result["judge"]["killed"]]
    assert len(killed) == 1, killed
    assert killed[0].startswith(("sleep 300", "bash -c sleep 300")), killed
    assert (await _run(env, "pgrep -c sleep"))["output"].strip() == "0"
    again = await env.call_function("tb_reset", {"task": "slow-tests", "test_timeout_sec": 1})
    assert again["max_test_timeout_sec"] == 1


@needs_tmux
async def test_the_agents_time_limit(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "mixed", "agent_timeout_sec": 3})
    await _run(env, "touch a b")
    await asyncio.sleep(3.5)
    for tool, arguments in (
        ("run_command", {"command": "ls"}),
        ("send_keys", {"keys": ["ls", "Enter"]}),
        ("write_file", {"path": "c", "content": "x"}),
    ):
        late = await env.call_tool(tool, arguments)
        assert late.is_error
        assert "time for this task (3 s, max_agent_timeout_sec) is up" in late.text
    result = await env.call_reward({})  # graded as it stands, as Terminal-Bench does
    assert (result["reward"], result["agent_timed_out"]) == (1.0, True)


async def test_a_command_past_its_timeout_is_killed(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "mixed"})
    started = time.monotonic()
    ran = await _run(env, "echo started; sleep 30; echo never", timeout=1)
    assert time.monotonic() - started < 15
    assert ran == {"output": "started\n", "returncode": 124}


# -- the tools ----------------------------------------------------------------------------------


@needs_tmux
async def test_files_commands_and_the_terminal(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "mixed"})
    written = await env.call_tool("write_file", {"path": "src/hello.py", "content": "print(42)\n"})
    assert written.structured == {"path": "/app/src/hello.py", "bytes": 10}
    read = await env.call_tool("read_file", {"path": "/app/src/hello.py"})
    assert read.structured == {"content": "print(42)\n", "size": 10, "offset": 0}
    missing = await env.call_tool("read_file", {"path": "nope.txt"})
    assert missing.is_error
    assert "No such file" in missing.text
    ran = await _run(env, "pwd; echo $HOME; cat src/hello.py; echo oops >&2; exit 3")
    assert ran == {"output": "/app\n/root\nprint(42)\noops\n", "returncode": 3}
    screen = await env.call_tool("send_keys", {"keys": ["echo typed-$((6*7))", "Enter"]})
    assert "typed-42" in screen.text
    # a program that keeps running: the screen follows it; Ctrl-C stops it
    loop = "for i in $(seq 1 600); do echo tick $i; sleep 0.1; done"
    await env.call_tool("send_keys", {"keys": [loop, "Enter"], "wait_seconds": 0.5})
    await asyncio.sleep(1.0)
    later = (await env.call_tool("read_screen", {})).text
    ticks = [
        int(w) for line in later.splitlines() if line.startswith("tick") for w in line.split()[1:]
    ]
    assert ticks
    assert max(ticks) >= 5
    stopped = await env.call_tool("send_keys", {"keys": ["C-c"], "wait_seconds": 0.3})
    assert "^C" in stopped.text
    history = (await env.call_tool("read_screen", {"history_lines": 200})).text
    assert "typed-42" in history


@needs_tmux
async def test_a_server_left_running_is_ended_the_tests_start_their_own(env: Environment) -> None:
    """The judge ends every process of the agent's: a server left running in the terminal does
    not answer the tests; the demo's http-server tests start the agent's serve.sh themselves."""
    solution = demo.reference_solution("http-server")
    assert solution is not None
    await env.call_function("tb_reset", {"task": "http-server"})
    server = "mkdir -p site; echo 'aenv-ray demo' > site/index.html; python3 -m http.server 8765"
    await env.call_tool("send_keys", {"keys": [server, "Enter"], "wait_seconds": 2})
    left = await env.call_reward({})
    assert (left["reward"], left["outcome"]) == (0.0, "failed")
    assert any("http.server" in p["command"] for p in left["judge"]["killed"])
    await env.call_tool("write_file", {"path": "/tmp/solve.sh", "content": solution})
    await env.call_tool("send_keys", {"keys": ["bash /tmp/solve.sh", "Enter"], "wait_seconds": 1})
    result = await env.call_reward({})
    assert result["reward"] == 1.0, result["output_tail"]


async def test_a_fork_gets_its_own_box_and_files(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "mixed"})
    await _run(env, "touch a; sleep 300 > /dev/null 2>&1 &")
    (child,) = await env.fork(1)
    try:
        ran = await _run(child, "ls /app; pgrep -c sleep; touch b")  # a copy of /app, no process
        assert ran["output"].split() == ["a", "0"]
        assert (await child.call_reward({}))["reward"] == 1.0
        assert (await env.call_reward({}))["reward"] == 0.0  # the parent has no b
    finally:
        await child.release()


# -- resets, the task at creation -------------------------------------------------------------


@needs_tmux
async def test_a_reset_starts_clean_and_knows_its_tasks(env: Environment, dataset: Path) -> None:
    await env.call_function("tb_reset", {"task": "mixed"})
    await _run(env, "touch a b /tmp/left-over ~/.profile-left; sleep 300 > /dev/null 2>&1 &")
    await env.call_tool("send_keys", {"keys": ["echo before-reset", "Enter"]})
    info = await env.call_function("tb_reset", {"task": "with-data"})
    assert info["task"] == "with-data"
    left = await _run(env, "ls -A /app /tmp ~; pgrep -c sleep")
    assert left["output"].split("\n", 1)[0] == "/app:"
    for name in ("a", "b", "left-over", ".profile-left"):
        assert name not in left["output"].split()
    assert left["output"].split()[-1] == "0"
    assert "before-reset" not in (await env.call_tool("read_screen", {})).text
    tasks = await env.call_function("tb_tasks", {})
    assert set(tasks["dataset"]) == set(TASKS)
    assert set(tasks["demo"]) == {t["id"] for t in demo.TASKS}
    for bad, message in (("nope", "no task `nope`"), ("../etc", "not a task name")):
        with pytest.raises(FunctionError, match=message):
            await env.call_function("tb_reset", {"task": bad})


async def test_the_task_given_at_creation(engine: SandboxEngine, dataset: Path) -> None:
    variables = {"TB_TASK_DIR": "/data/mixed"}
    async with Environment(
        "terminal-bench@1.0.0",
        engine=engine,
        datasource=str(dataset),
        environment_variables=variables,
        timeout=120,
    ) as env:
        info = await env.call_function("tb_task", {})
        assert (info["task"], info["max_test_timeout_sec"]) == ("mixed", 60)
        await _run(env, "touch a b")
        assert (await env.call_reward({}))["reward"] == 1.0
    async with Environment(
        "terminal-bench@1.0.0", engine=engine, datasource=str(dataset / "mixed"), timeout=120
    ) as env:  # a datasource that is a task is the default task, named after its mount point
        assert (await env.call_function("tb_task", {}))["task"] == "data"
    async with Environment("terminal-bench@1.0.0", engine=engine, timeout=120) as env:
        assert (await env.call_function("tb_task", {}))["task"] is None
        with pytest.raises(FunctionError, match="no task"):
            await env.call_reward({})
        assert (await _run(env, "pwd"))["output"] == "/app\n"  # the tools work without one


# -- a hostile agent --------------------------------------------------------------------------


async def test_the_agent_can_neither_read_nor_change_the_tests(env: Environment) -> None:
    await env.call_function("tb_reset", {"task": "mixed"})
    seen = await _run(env, "ls /data /tests /storage /workspace 2>&1; cat /proc/1/environ")
    for absent in ("/data", "/tests", "/storage", "/workspace"):
        assert f"ls: cannot access '{absent}'" in seen["output"]
    assert "TB_" not in seen["output"]  # pid 1 of the box knows nothing of the runtime's
    assert "AENV_" not in seen["output"]
    found = await _run(
        env,
        "find / \\( -path /proc -o -path /usr \\) -prune -o \\( -name 'test_outputs.py' -o "
        "-name 'solution.sh' -o -name 'task.yaml' \\) -print 2>/dev/null; "
        f"grep -rl {SECRET} /app /tmp /root /etc /dev 2>/dev/null; echo done",
        timeout=120,
    )
    assert found["output"] == "done\n"
    # what a root of the box tries: its mounts are locked, the runtime is in no namespace it sees
    attempts = await _run(
        env,
        "umount /proc; umount -l /proc; umount -l /app; mount -t proc proc /tmp 2>&1; "
        "mount -o remount,rw / ; ls /proc | grep -c '^[0-9]'; "
        "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[l]ocal_backend\\|[s]andbox_r'; "
        "nsenter -t 1 -m -U true; echo $?; ls /tmp/.tb-runtime 2>&1",
    )
    lines = attempts["output"].splitlines()
    assert "cannot access '/tmp/.tb-runtime'" in lines[-1]
    assert lines[-4] == "0"  # the runtime's process: not visible
    assert int(lines[-5]) < 20  # only the box's own processes
    # the file tools see what the agent sees: a link to the data leads nowhere
    await _run(env, "ln -s /data /app/d; ln -s /proc/1/root/data /app/e")
    for path in ("/data/mixed/tests/test_outputs.py", "d/mixed/tests/test_outputs.py", "e"):
        result = await env.call_tool("read_file", {"path": path})
        assert result.is_error, path
    # a process left behind to catch or rewrite the tests while they run finds nothing
    spy = (
        "while true; do for f in /tests/test_outputs.py /proc/*/root/tests/test_outputs.py; do "
        "[ -e $f ] && { echo $f >> /app/spied; echo 'def test_a(): pass' > $f; }; done; "
        "sleep 0.01; done"
    )
    await env.call_tool("write_file", {"path": "/tmp/spy.sh", "content": spy})
    await _run(env, "nohup bash /tmp/spy.sh > /dev/null 2>&1 &")
    result = await env.call_reward({})
    assert (result["reward"], result["outcome"]) == (0.0, "failed")
    assert result["tests"]["test_a"] == "failed"
    assert "spied" not in (await _run(env, "ls /app"))["output"]
    assert any("spy.sh" in p["command"] for p in result["judge"]["killed"])  # ended first
    assert (await _run(env, "pgrep -fc '[s]py.sh'"))["output"].strip() == "0"


async def test_the_agents_code_run_by_the_tests_sees_no_more(env: Environment) -> None:
    """Tests run what the agent wrote (here: /app/program.py): in the grader's box, which has
    the tests and the agent's files, never the dataset, the runtime or the agent's processes."""
    await env.call_function("tb_reset", {"task": "agent-code"})
    program = textwrap.dedent(
        """
        import json, os
        commands = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                commands.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
            except OSError:
                pass
        seen = {"root": sorted(os.listdir("/")), "commands": commands}
        seen["tests"] = os.listdir("/tests")
        json.dump(seen, open("/app/seen.json", "w"))
        """
    )
    await env.call_tool("write_file", {"path": "program.py", "content": program})
    await _run(env, "sleep 300 > /dev/null 2>&1 &")
    result = await env.call_reward({})
    assert result["reward"] == 1.0, result["output_tail"]
    seen = json.loads((await env.call_tool("read_file", {"path": "seen.json"})).text)["content"]
    seen = json.loads(seen)
    assert "tests" in seen["root"]
    assert "data" not in seen["root"]
    assert "test_outputs.py" in seen["tests"]
    assert not any("sleep" in c or "local_backend" in c for c in seen["commands"]), seen
    assert any("pytest" in c for c in seen["commands"]), seen


async def test_tasks_inside_what_the_boxes_bind_are_covered(
    engine: SandboxEngine, dataset: Path
) -> None:
    """The boxes bind the Python that runs the instance, whose virtual environment holds the
    bundled demo tasks in an installed aenv-ray: task directories there are covered with an
    empty directory. A dataset put into this checkout's virtual environment stands for them."""
    inside = Path(sys.prefix) / f"tb-test-{uuid.uuid4().hex[:8]}"
    shutil.copytree(dataset, inside)
    try:
        variables = {"TB_DATASET_DIR": str(inside)}
        async with Environment(
            "terminal-bench@1.0.0", engine=engine, environment_variables=variables, timeout=120
        ) as env:
            await env.call_function("tb_reset", {"task": "mixed"})
            seen = await _run(env, f"ls -A {inside}; cat {inside}/mixed/task.yaml 2>&1; echo end")
            assert seen["output"].startswith("cat: ")
            assert seen["output"].endswith("No such file or directory\nend\n")
            await _run(env, "touch a b")
            assert (await env.call_reward({}))["reward"] == 1.0  # the tests still run
    finally:
        shutil.rmtree(inside)


_AS_NOBODY = """
import asyncio, json
from aenv_ray import Environment

async def main():
    async with Environment("terminal-bench@1.0.0", timeout=120) as env:
        await env.call_function("tb_reset", {"task": "hello-world"})
        nothing = await env.call_reward({})
        seen = await env.call_tool("run_command", {"command": "id -u; ls /data 2>&1"})
        await env.call_function("tb_run_solution", {})
        solved = await env.call_reward({})
        print(json.dumps([nothing["reward"], seen.structured["output"], solved["reward"]]))

asyncio.run(main())
"""


async def test_as_an_unprivileged_user(unprivileged: tuple[list[str], dict[str, str]]) -> None:
    command, environment = unprivileged
    done = await asyncio.to_thread(
        subprocess.run,
        [*command, "-c", _AS_NOBODY],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    nothing, seen, solved = json.loads(done.stdout.strip().splitlines()[-1])
    assert (nothing, solved) == (0.0, 1.0)
    assert seen.startswith("0\nls: cannot access '/data'")


# -- the demo -----------------------------------------------------------------------------------


@needs_tmux
async def test_aenv_rollout_runs_the_demo_solutions_to_reward_one(tmp_path: Path) -> None:
    done = await aenv_async(
        "rollout", "terminal-bench@1.0.0", "--episodes", "4", "--concurrency", "4", "--no-ray",
        "--policy", "tests._demo_solutions:watched_terminal_bench",
        "--out", str(tmp_path / "out"), cwd=ROOT, env={"COLUMNS": "120"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted(r["task_id"] for r in records) == sorted(t["id"] for t in demo.TASKS)
    assert all(r["reward"] == 1.0 and r["outcome"] == "ok" for r in records), records
    assert all(r["reward_components"]["outcome"] == "passed" for r in records)
    # the task the policy got: no reward arguments, no solution.sh; the record's: no solution
    assert_given_no_grader_fields("terminal_bench", demo.TASKS, records)
