"""Judge rewards (issue 23, point 5) against agents that try to forge them.

``tests/envs/judge_hostile`` is a task graded from ``answer.txt``; its ``config.json`` asks for
the judge. Each attack is played with the agent's tools only (a shell command, one left
running, Python run in the runtime's own process), against a real instance of the local engine
and against the standalone runtime (``python -m sandbox_runtime``, what a pod runs). The same
project served without the judge is the control: there every attack gets 1.0; with the judge,
0.0 with the reward's own ``reason``, while the honest answer still gets 1.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import (
    DefinitionError,
    Environment,
    JudgeReport,
    JudgeUnavailableError,
    register_reward,
)
from aenv_ray.registry import DefinitionRegistry, Kind
from aenv_ray.settings import Settings
from aenv_ray.testing import RuntimeProcess
from local_backend import LocalEngine
from sandbox_runtime import load_project
from sandbox_runtime._judge import (
    WorkspaceLimits,
    WorkspaceTooLarge,
    copy_workspace,
    judge_environment,
)

HOSTILE = Path(__file__).parent / "envs" / "judge_hostile"
ENGINES = ["local", "standalone"]
CAPPED_FILES = 20

in_instance = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``judge-hostile@1.0.0`` (the judge) and ``judge-plain@1.0.0`` (the same, without)."""
    root = tmp_path_factory.mktemp("judge-envs")
    judged = root / "judge-hostile-1.0.0"
    shutil.copytree(HOSTILE, judged)
    plain = root / "judge-plain-1.0.0"
    shutil.copytree(HOSTILE, plain)
    config = json.loads((plain / "config.json").read_text())
    config["name"] = "judge-plain"
    del config["reward"]
    (plain / "config.json").write_text(json.dumps(config))
    capped = root / "judge-capped-1.0.0"  # the judge, with a small limit on the workspace
    shutil.copytree(HOSTILE, capped)
    config = json.loads((capped / "config.json").read_text())
    config["name"] = "judge-capped"
    config["reward"]["maxWorkspaceFiles"] = CAPPED_FILES
    (capped / "config.json").write_text(json.dumps(config))
    for path in [root, *root.rglob("*")]:  # an instance's root is `nobody` on the host
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    engine = LocalEngine()
    yield engine
    engine.close()


@contextlib.asynccontextmanager
async def episode(
    where: str,
    judge: bool,
    projects: Path,
    engine: LocalEngine,
    tmp_path: Path,
    name: str | None = None,
) -> AsyncIterator[Environment]:
    """A fresh instance of the task, with (``judge``) or without the judge (or ``name``)."""
    name = name or ("judge-hostile" if judge else "judge-plain")
    if where == "local":
        settings = Settings(dummy_instance_ip=None, system_url=None, env_path=str(projects))
        async with Environment(f"{name}@1.0.0", engine=engine, settings=settings) as env:
            yield env
        return
    workspace, home = tmp_path / f"{name}-ws", tmp_path / f"{name}-home"
    workspace.mkdir()
    home.mkdir()
    variables = {"AENV_WORKSPACE": str(workspace), "HOME": str(home)}
    with RuntimeProcess(projects / f"{name}-1.0.0", env=variables) as runtime:
        async with runtime.environment() as env:
            yield env


async def _tool(env: Environment, name: str, **arguments: Any) -> Any:
    result = await env.call_tool(name, arguments)
    assert not result.is_error, result.text
    return result.structured if result.structured is not None else result.text


async def _reward(env: Environment) -> dict[str, Any]:
    value = await env.call_reward({"expected": "42"})
    assert isinstance(value, dict)
    return value


# -- the honest answer ---------------------------------------------------------------------------
@in_instance
@pytest.mark.parametrize("where", ENGINES)
async def test_the_honest_answer_gets_full_reward_with_and_without_the_judge(
    where: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    for judge in (False, True):
        async with episode(where, judge, projects, engine, tmp_path) as env:
            await _tool(env, "write_file", path="answer.txt", content="42")
            value = await _reward(env)
            assert value["reward"] == 1.0, value
            assert ("judge" in value) is judge
    report = JudgeReport.model_validate(value["judge"])
    assert report.seed == "forked"
    assert report.killed == 0
    assert report.workspace_files == 1
    assert report.scope == ("pid namespace" if where == "local" else "descendants")


# -- a process left running rewrites files while the reward grades ------------------------------
# cp into a temporary file, then rename: a reader sees the old answer or the new, never half
REWRITER = 'while :; do cp "$HOME/expected.txt" .next 2>/dev/null && mv .next answer.txt; done'


@in_instance
@pytest.mark.parametrize("where", ENGINES)
async def test_a_process_left_running_is_ended_before_the_judge_grades(
    where: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    results = {}
    for judge in (False, True):
        async with episode(where, judge, projects, engine, tmp_path) as env:
            await _tool(env, "write_file", path="answer.txt", content="7")
            left = await _tool(env, "run", command=REWRITER, background=True)
            results[judge] = (await _reward(env), left["pid"])
    forged, _ = results[False]
    assert forged["reward"] == 1.0, f"the control: the rewriter forges it ({forged})"
    judged, pid = results[True]
    assert judged["reward"] == 0.0
    assert judged["reason"] == "answer.txt holds '7'"
    report = JudgeReport.model_validate(judged["judge"])
    assert report.killed >= 1
    assert {"pid": pid, "command": f"bash -c {REWRITER}"} in report.processes


# -- code run in the runtime's process patches what the reward calls ----------------------------
PATCHES = {
    "module global": "import judge_task\njudge_task.same = lambda answer, expected: True\n",
    "standard library": (
        "import pathlib, subprocess, json\n"
        "def fake(*args, cwd, **kw):\n"
        "    expected = (pathlib.Path.home() / 'expected.txt').read_text()\n"
        "    (pathlib.Path(cwd) / 'verdict.json').write_text(json.dumps({'answer': expected}))\n"
        "    return subprocess.CompletedProcess(args, 0, '', '')\n"
        "subprocess.run = fake\n"
    ),
}


@in_instance
@pytest.mark.parametrize("where", ENGINES)
@pytest.mark.parametrize("patch", sorted(PATCHES))
async def test_patches_of_the_runtimes_memory_do_not_reach_the_judge(
    where: str, patch: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    results = {}
    for judge in (False, True):
        async with episode(where, judge, projects, engine, tmp_path) as env:
            await _tool(env, "write_file", path="answer.txt", content="7")
            await _tool(env, "run_python", code=PATCHES[patch])
            results[judge] = await _reward(env)
    assert results[False]["reward"] == 1.0, f"the control: the patch forges it ({results[False]})"
    assert results[True]["reward"] == 0.0
    assert results[True]["reason"] == "answer.txt holds '7'"


# -- variables and start-up files planted for the grader's subprocess ---------------------------
SITECUSTOMIZE = (
    "import pathlib\n"
    "expected = pathlib.Path.home() / 'expected.txt'\n"
    "if expected.exists():\n"
    "    pathlib.Path('answer.txt').write_text(expected.read_text())\n"
)


@in_instance
@pytest.mark.parametrize("where", ENGINES)
async def test_a_planted_sitecustomize_and_pythonpath_do_not_reach_the_judge(
    where: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    results = {}
    for judge in (False, True):
        async with episode(where, judge, projects, engine, tmp_path) as env:
            await _tool(env, "write_file", path="answer.txt", content="7")
            await _tool(env, "write_file", path="plant/sitecustomize.py", content=SITECUSTOMIZE)
            code = (
                "import os, judge_task\n"
                "os.environ['PYTHONPATH'] = str((judge_task.workspace() / 'plant').resolve())\n"
            )
            await _tool(env, "run_python", code=code)
            results[judge] = await _reward(env)
    assert results[False]["reward"] == 1.0, f"the control: the plant forges it ({results[False]})"
    assert results[True]["reward"] == 0.0
    assert results[True]["reason"] == "answer.txt holds '7'"


# -- links to where the judge writes, FIFOs ------------------------------------------------------
@in_instance
async def test_links_out_of_the_workspace_and_fifos_never_reach_the_judge(
    projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    async with episode("local", True, projects, engine, tmp_path) as env:
        # the judge's layout is scratch/{home,tmp,workspace}: its expected.txt is ../home/
        await _tool(env, "run", command="ln -s ../home/expected.txt answer.txt && mkfifo pipe")
        value = await _reward(env)
        assert value["reward"] == 0.0
        assert value["reason"] == "no answer.txt"
        report = JudgeReport.model_validate(value["judge"])
        assert report.links_out == [{"path": "answer.txt", "target": "../home/expected.txt"}]
        assert report.removed == [{"path": "pipe", "type": "fifo"}]
        # the agent's own workspace is as it left it
        listing = await _tool(env, "run", command="ls -l answer.txt; test -p pipe && echo fifo")
        assert "answer.txt -> ../home/expected.txt" in listing["output"]
        assert "fifo" in listing["output"]


# -- what the agent plants at a fixed path in /tmp, /var/tmp, /dev/shm -------------------------
@in_instance
@pytest.mark.parametrize("where", ENGINES)
async def test_a_file_planted_at_a_fixed_tmp_path_does_not_reach_the_judge(
    where: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    cache = f"/tmp/judge-hostile-cache-{os.getpid()}-{where}.json"  # the host's, standalone
    plant = f'printf \'{{"answer": "42"}}\' > {cache}'
    results: dict[bool, dict[str, Any]] = {}
    try:
        for judge in (False, True):
            async with episode(where, judge, projects, engine, tmp_path) as env:
                await _tool(env, "run", command=plant)
                value = await env.call_reward({"expected": "42", "cache": cache})
                assert isinstance(value, dict)
                results[judge] = value
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cache)
    assert results[False]["reward"] == 1.0, "the control: the plant works without the judge"
    assert results[False]["cached"] is True
    assert results[True]["reward"] == 0.0, results[True]
    assert results[True]["reason"] == "no answer.txt"
    report = JudgeReport.model_validate(results[True]["judge"])
    assert report.fresh_refused is None
    assert report.fresh_places[0] == "/tmp"  # and /var/tmp, /dev/shm where the instance has them


@in_instance
async def test_a_fifo_planted_at_a_fixed_tmp_path_does_not_block_the_judge(
    projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    async with episode("local", True, projects, engine, tmp_path) as env:
        await _tool(env, "run", command="mkfifo /tmp/cache.json")
        await _tool(env, "write_file", path="answer.txt", content="42")
        value = await env.call_reward({"expected": "42", "cache": "/tmp/cache.json"}, timeout=30)
        assert value["reward"] == 1.0
        assert "cached" not in value
        # the agent's /tmp is as it left it
        listing = await _tool(env, "run", command="test -p /tmp/cache.json && echo fifo")
        assert listing["output"].strip() == "fifo"


def test_what_the_fresh_tmp_shows_again_is_the_judges_and_the_images_never_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_runtime._judge import _kept_under_places

    assert str(tmp_path).startswith("/tmp/")
    scratch, project, workspace = tmp_path / "scratch", tmp_path / "project", tmp_path / "ws"
    for directory in (scratch, project / "src", workspace / "lib"):
        directory.mkdir(parents=True)
    # the project's src (inside the project: shown by it) and a directory of the workspace's
    monkeypatch.setattr("sys.path", [str(project / "src"), str(workspace / "lib"), ""])
    kept = _kept_under_places(str(scratch), str(project), str(workspace))
    assert kept == [("ro", str(project)), ("rw", str(scratch))]


def test_where_the_kernel_refuses_a_namespace_the_judge_says_so() -> None:
    # a process with two threads: the kernel refuses it a user namespace (EINVAL), as a host
    # without user namespaces refuses every process
    code = (
        "import json, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "from sandbox_runtime._judge import fresh_scratch_places\n"
        "print(json.dumps(fresh_scratch_places([])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    answer = json.loads(done.stdout)
    assert answer["places"] == []
    assert answer["refused"].startswith("the judge could not get a user namespace with a fresh")
    assert answer["refused"].endswith("it graded on the instance's own")


def test_the_copy_keeps_links_inside_and_removes_those_that_resolve_outside(
    tmp_path: Path,
) -> None:
    source = tmp_path / "ws"
    (source / "sub" / "deep").mkdir(parents=True)
    (source / "sub" / "deep" / "file").write_text("inside")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    links = {
        "rel": "sub/deep/file",  # inside: kept
        "abs": str(source / "sub" / "deep" / "file"),  # absolute into the workspace: the copy's
        "root": ".",  # the workspace itself: kept
        "up": "root/..",  # through a kept link, then up: outside
        "through": "root/../ws/sub",  # outside, even if it looks like the workspace's name
        "etc": "/etc/passwd",  # outside
        "dangling-in": "nothing-here",  # inside, dangling: kept
    }
    for name, target in links.items():
        (source / name).symlink_to(target)
    os.mkfifo(source / "pipe")
    target = tmp_path / "judge" / "workspace"
    target.parent.mkdir()
    report = copy_workspace(str(source), str(target))
    assert sorted(item["path"] for item in report["links_out"]) == ["etc", "through", "up"]
    assert report["removed"] == [{"path": "pipe", "type": "fifo"}]
    assert (target / "rel").read_text() == "inside"
    assert os.readlink(target / "abs") == str(target / "sub" / "deep" / "file")
    assert (target / "root").resolve() == target.resolve()
    assert (target / "dangling-in").is_symlink()
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) & 0o111
    assert report["files"] == 2


# -- a workspace the judge cannot copy is the agent's failure, never the judge's --------------
def test_the_copy_keeps_holes_and_stops_at_its_limits(tmp_path: Path) -> None:
    source = tmp_path / "ws"
    source.mkdir()
    with open(source / "sparse", "wb") as handle:  # 64 MiB apparent, 4 KiB of data
        handle.seek(32 << 20)
        handle.write(b"x" * 4096)
        handle.truncate(64 << 20)
    report = copy_workspace(str(source), str(tmp_path / "copy"))
    copied = tmp_path / "copy" / "sparse"
    assert copied.stat().st_size == 64 << 20
    assert report["bytes"] == 64 << 20
    assert report["allocated"] < 1 << 20, "the holes were written out"
    with open(copied, "rb") as handle:
        handle.seek(32 << 20)
        assert handle.read(4097) == b"x" * 4096 + b"\0"
    os.truncate(source / "sparse", 1 << 40)  # 1 TiB apparent, no more on disk
    with pytest.raises(WorkspaceTooLarge, match="maxWorkspaceBytes") as caught:
        copy_workspace(str(source), str(tmp_path / "copy-2"))
    assert caught.value.report() == {
        "limit": "bytes",
        "cap": 4 << 30,
        "found": 1 << 40,
        "path": "sparse",
    }
    # more on disk than the judge's directory has room for (the agent filled the instance)
    os.truncate(source / "sparse", 64 << 20)
    (source / "data").write_bytes(os.urandom(2 << 20))
    with pytest.raises(WorkspaceTooLarge, match="room") as caught:
        copy_workspace(str(source), str(tmp_path / "copy-room"), room=1 << 20)
    assert caught.value.limit == "room"
    (source / "sparse").unlink()
    (source / "data").unlink()
    deep = source / "/".join("d" * 10)
    deep.mkdir(parents=True)
    with pytest.raises(WorkspaceTooLarge, match="maxWorkspaceDepth"):
        copy_workspace(str(source), str(tmp_path / "copy-3"), limits=WorkspaceLimits(depth=5))


@in_instance
@pytest.mark.parametrize("where", ENGINES)
async def test_a_workspace_past_the_judges_limits_is_graded_zero_with_the_limit_named(
    where: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    async with episode(where, True, projects, engine, tmp_path, name="judge-capped") as env:
        await _tool(env, "write_file", path="answer.txt", content="42")
        assert (await _reward(env))["reward"] == 1.0
        # a sparse file of 1 TiB: it occupies nothing, a byte-for-byte copy would fill the disk
        await _tool(env, "run", command="truncate -s 1T big")
        value = await _reward(env)
        assert value["reward"] == 0.0
        assert "maxWorkspaceBytes" in value["reason"]
        report = JudgeReport.model_validate(value["judge"])
        assert report.over_limit is not None
        assert report.over_limit["limit"] == "bytes"
        assert report.over_limit["path"] == "big"
        # more files than the definition's maxWorkspaceFiles
        await _tool(env, "run", command=f"rm big; mkdir many; touch many/f{{1..{CAPPED_FILES}}}")
        value = await _reward(env)
        assert value["reward"] == 0.0
        assert f"more than {CAPPED_FILES} files" in value["reason"]
        assert "maxWorkspaceFiles" in value["reason"]
        report = JudgeReport.model_validate(value["judge"])
        assert report.over_limit is not None
        assert report.over_limit["limit"] == "files"
        # the agent's workspace is as it left it; back under the limit, it is graded again
        await _tool(env, "run", command="rm -r many")
        assert (await _reward(env))["reward"] == 1.0


def test_the_judges_variables_drop_what_runs_code_unless_the_definition_sets_it() -> None:
    started = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/workspace",
        "PYTHONPATH": "/workspace/plant",
        "PYTHONSTARTUP": "x",
        "LD_PRELOAD": "evil.so",
        "PYTEST_ADDOPTS": "-p evil",
        "BASH_ENV": "/workspace/.bashrc",
        "NODE_OPTIONS": "--require evil",
    }
    assert judge_environment(started, {"PYTEST_ADDOPTS": "-q"}) == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/workspace",
        "PYTEST_ADDOPTS": "-q",
    }


# -- the episode goes on ------------------------------------------------------------------------
@in_instance
@pytest.mark.parametrize("where", ENGINES)
async def test_a_reward_twice_and_the_episode_goes_on(
    where: str, projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    async with episode(where, True, projects, engine, tmp_path) as env:
        await _tool(env, "write_file", path="answer.txt", content="41")
        await _tool(env, "run", command="sleep 1000", background=True)
        first, second = await _reward(env), await _reward(env)
        assert first["reward"] == second["reward"] == 0.0
        assert first["reason"] == second["reason"] == "answer.txt holds '41'"
        assert first["judge"]["killed"] == 1
        assert second["judge"]["killed"] == 0
        # the judge graded a copy: what it wrote is not in the agent's workspace
        listing = await _tool(env, "run", command="ls -A")
        assert listing["output"].split() == ["answer.txt"]
        await _tool(env, "write_file", path="answer.txt", content="42")
        assert (await _reward(env))["reward"] == 1.0


@in_instance
async def test_a_fork_of_a_patched_instance_grades_in_a_fresh_interpreter(
    projects: Path, engine: LocalEngine, tmp_path: Path
) -> None:
    async with episode("local", True, projects, engine, tmp_path) as env:
        await _tool(env, "write_file", path="answer.txt", content="7")
        await _tool(env, "run_python", code=PATCHES["module global"])
        (child,) = await env.fork(1)
        async with child:
            value = await _reward(child)
            assert value["reward"] == 0.0
            assert value["judge"]["seed"] == "fresh interpreter"
            await _tool(child, "write_file", path="answer.txt", content="42")
            assert (await _reward(child))["reward"] == 1.0
        assert (await _reward(env))["reward"] == 0.0


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as handle:
            data = handle.read()
            if int(data[data.rindex(b")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


@in_instance
async def test_a_seed_that_is_gone_is_replaced_by_a_fresh_interpreter(
    projects: Path, tmp_path: Path
) -> None:
    variables = {"AENV_WORKSPACE": str(tmp_path), "HOME": str(tmp_path)}
    with RuntimeProcess(projects / "judge-hostile-1.0.0", env=variables) as runtime:
        (seed,) = _children(runtime.pid)
        os.kill(seed, signal.SIGKILL)
        async with runtime.environment() as env:
            await _tool(env, "write_file", path="answer.txt", content="42")
            value = await _reward(env)
        assert value["reward"] == 1.0
        assert value["judge"]["seed"] == "fresh interpreter (the seed was gone)"


@in_instance
async def test_tool_calls_wait_while_the_judge_grades(projects: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    variables = {"AENV_WORKSPACE": str(workspace), "HOME": str(tmp_path)}
    with RuntimeProcess(projects / "judge-hostile-1.0.0", env=variables) as runtime:
        (seed,) = _children(runtime.pid)
        async with runtime.environment() as env:
            await _tool(env, "write_file", path="answer.txt", content="7")
            reward = asyncio.create_task(_reward(env))
            while not _children(seed):  # the judge runs (a process the seed forked)
                assert not reward.done(), reward.result()
                await asyncio.sleep(0.01)
            write = asyncio.create_task(_tool(env, "write_file", path="answer.txt", content="42"))
            done, _ = await asyncio.wait({reward, write}, return_when=asyncio.FIRST_COMPLETED)
            assert reward in done, "the tool call ran while the judge graded"
            assert (await reward)["reason"] == "answer.txt holds '7'"
            await write
            assert (await _reward(env))["reward"] == 1.0


@in_instance
async def test_a_judge_that_dies_without_an_answer_is_no_reward(
    projects: Path, tmp_path: Path
) -> None:
    project = tmp_path / "crash"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"name": "crash"}')
    (project / "src" / "crash.py").write_text(
        "import os\n"
        "from aenv_ray import register_reward\n\n"
        "@register_reward(judge=True)\n"
        "def grade() -> float:\n"
        "    os._exit(3)\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    variables = {"AENV_WORKSPACE": str(project), "TMPDIR": str(tmp)}
    with RuntimeProcess(project, env=variables) as runtime:
        async with runtime.environment() as env:
            ended = r"ended \(status 3\) without an answer"
            with pytest.raises(JudgeUnavailableError, match=ended):
                await env.call_reward({})
            assert list(tmp.iterdir()) == [], "the judge's directory outlived it"


# -- declaring it ------------------------------------------------------------------------------
def test_judge_is_a_rewards_option_of_the_decorator_and_of_config_json(tmp_path: Path) -> None:
    registry = DefinitionRegistry()
    with registry.collecting():

        @register_reward(judge=True)
        def graded() -> float:
            return 1.0

    assert registry.reward is not None
    assert registry.reward.judge
    assert registry.reward.describe()["judge"] is True
    with pytest.raises(DefinitionError, match="judge= is a reward's option"):
        registry.add(Kind.FUNCTION, graded, name="other", judge=True)
    project = load_project(HOSTILE)
    assert project.registry.reward is not None
    assert project.registry.reward.judge
    (tmp_path / "config.json").write_text('{"name": "none", "reward": {"judge": true}}')
    (tmp_path / "judge_config_tools.py").write_text(
        "from aenv_ray import register_tool\n\n@register_tool\ndef t() -> str:\n    return ''\n"
    )
    with pytest.raises(DefinitionError, match="asks for the judge"):
        load_project(tmp_path)
