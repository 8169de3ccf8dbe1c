"""Fail before anything starts (issue 13, point 2): ``aenv rollout`` checks the policy, the tasks
and the environment before it starts Ray or any instance; a mistake is one line and exit 2, and
a rerun with nothing left to do starts nothing at all.

"Nothing started" is observed, not timed: each command runs with a private state directory
(an engine daemon would leave its pid file there), ``RAY_ADDRESS`` pointing at a closed port
(a Ray start would fail loudly) and, where it matters, a hub URL nobody answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.engine import SandboxEngine
from aenv_ray.errors import ConfigurationError
from aenv_ray.hub import HubClient
from aenv_ray.loadcheck import load_in_sandbox
from aenv_ray.testing import free_port
from rollout.precheck import EnvironmentCalls, check_policy, check_tasks
from tests._cli import aenv as run_cli
from tests._hub import HubProcess, new_key

SCORED = '''from aenv_ray import register_function, register_reward, register_tool

LEVEL = [0]


@register_tool
def bump() -> int:
    """Add one to the level."""
    LEVEL[0] += 1
    return LEVEL[0]


@register_function
def prepare(level: int) -> int:
    """Start at `level`."""
    LEVEL[0] = level
    return level


@register_reward
def scored(expected: int, weight: float = 1.0) -> float:
    """`weight` when the level is `expected`."""
    return weight if LEVEL[0] == expected else 0.0
'''

POLICIES = """
import json

async def bumps(task, env):
    await env.call_tool("bump", {})
    return "bumped"

def not_async(task, env):
    return None

async def one_argument(task):
    return None

NOT_A_POLICY = 3
"""

GOOD_TASK = {
    "id": "t1",
    "setup": [{"function": "prepare", "arguments": {"level": 4}}],
    "reward_arguments": {"expected": 5},
}


def project(parent: Path, name: str, source: str) -> Path:
    root = parent / name
    (root / "src").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"name": name, "version": "1.0.0"}))
    (root / "src" / f"{name.replace('-', '_')}.py").write_text(source)
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's directory: a project with a reward and a setup function, policies in
    ``pols.py`` (importable because it is the current directory, not through PYTHONPATH)."""
    root = tmp_path_factory.mktemp("user")
    project(root, "scored", SCORED)
    (root / "pols.py").write_text(POLICIES)
    (root / "raises.py").write_text("import json\n\nvalue = undefined_name + 1\n")
    (root / "good.jsonl").write_text(json.dumps(GOOD_TASK) + "\n")
    return root


@pytest.fixture
def user_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A user without a hub: a private state dir, and a Ray address nobody answers."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AENV_SYSTEM_URL", "AENV_API_KEY", "AENV_ENV_PATH", "PYTHONPATH")
    }
    env["AENV_STATE_DIR"] = str(tmp_path / "state")
    env["AENV_CONFIG_FILE"] = str(tmp_path / "no-config.json")
    env["RAY_ADDRESS"] = f"127.0.0.1:{free_port()}"
    yield env
    stop_daemon(Path(env["AENV_STATE_DIR"]))


def stop_daemon(state: Path) -> None:
    """Stop the engine daemon a command started in ``state`` (and its instances), if any."""
    pid_file = state / "engine.pid"
    if pid_file.exists():
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_file.exists(), "the daemon did not stop on SIGTERM"


def aenv(env: Mapping[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process (tests/_cli.py), with ``env`` as its whole environment."""
    return run_cli(*args, environ=env, cwd=cwd)


def refused_at_once(
    done: subprocess.CompletedProcess[str], env: Mapping[str, str], out: Path, *words: str
) -> None:
    """Exit 2, one ``aenv: error:`` line naming ``words``, and nothing started or recorded."""
    assert done.returncode == 2, (done.args, done.stdout, done.stderr)
    assert done.stderr.startswith("aenv: error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # no progress bar, no Ray banner
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    assert not (Path(env["AENV_STATE_DIR"]) / "engine.pid").exists()  # no engine daemon
    assert not (out / "trajectories.jsonl").exists() or not (out / "trajectories.jsonl").read_text()


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ("pols:not_async", ["pols:not_async is not async", "async def policy(task, env)"]),
        ("pols:one_argument", ["pols:one_argument takes (task)", "policy(task, env)"]),
        ("pols:NOT_A_POLICY", ["no callable 'NOT_A_POLICY'"]),
        ("pols:missing", ["no callable 'missing'"]),
        ("nowhere:policy", ["'nowhere'", "the current directory"]),
        ("raises:policy", ["importing policy module 'raises' failed", "raises.py:3", "NameError"]),
    ],
)
def test_a_policy_that_cannot_work_is_one_line_before_ray(
    workdir: Path, user_env: dict[str, str], tmp_path: Path, policy: str, words: list[str]
) -> None:
    out = tmp_path / "out"
    done = aenv(
        user_env, workdir, "rollout", "./scored", "--policy", policy, "--tasks", "good.jsonl",
        "-n", "2", "-o", str(out),
    )  # fmt: skip
    refused_at_once(done, user_env, out, *words)


def test_a_task_the_environment_would_refuse_is_one_line_before_ray(
    workdir: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    tasks = tmp_path / "typo.jsonl"
    tasks.write_text(
        json.dumps(GOOD_TASK) + "\n" + json.dumps({"id": "t2", "reward_arguments": {"expectd": 5}})
    )
    out = tmp_path / "out"
    done = aenv(
        user_env, workdir, "rollout", "./scored", "--policy", "pols:bumps", "--tasks",
        str(tasks), "-n", "2", "-o", str(out),
    )  # fmt: skip
    refused_at_once(
        done, user_env, out, "typo.jsonl: task `t2`", "reward `scored`", "`expectd`",
        "it takes `expected`, `weight`", "no `expected`, which it requires",
    )  # fmt: skip


def test_an_unknown_environment_is_one_line_before_ray(
    workdir: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    for name, words in (
        ("scord", ["no environment `scord`", "known: `", "`mini-terminal@1.0.0`"]),
        ("mini-termnal", ["did you mean `mini-terminal@1.0.0`?"]),  # the demo tasks' path
        ("./nothing-here", ["./nothing-here: not an environment project"]),
    ):
        args = ["--policy", "pols:bumps", "--tasks", "good.jsonl"] if name != "mini-termnal" else []
        done = aenv(user_env, workdir, "rollout", name, *args, "-n", "1", "-o", str(out))
        refused_at_once(done, user_env, out, *words)


def test_a_good_run_imports_its_policy_from_the_current_directory_and_a_rerun_starts_nothing(
    workdir: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ("rollout", "./scored", "--policy", "pols:bumps", "--tasks", "good.jsonl", "-n", "2")
    done = aenv(user_env, workdir, *args, "--no-ray", "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in records] == [1.0, 1.0]  # setup 4, one bump, reward for 5
    assert {r["policy"]["name"] for r in records} == {"pols:bumps"}
    stop_daemon(Path(user_env["AENV_STATE_DIR"]))
    parquet = (out / "trajectories.parquet").stat().st_mtime_ns
    # nothing left: with Ray (no --no-ray) and a hub nobody answers, it still returns, at once
    rerun = aenv(
        {**user_env, "AENV_SYSTEM_URL": f"http://127.0.0.1:{free_port()}"}, workdir, *args,
        "-o", str(out),
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "0 / 2" in rerun.stderr  # this run / skipped
    assert not (Path(user_env["AENV_STATE_DIR"]) / "engine.pid").exists()  # no engine started
    assert (out / "trajectories.parquet").stat().st_mtime_ns == parquet  # not even rewritten


# -- the checks themselves, on what a real template reports -------------------------------------


@pytest.fixture(scope="module")
def scored_calls(workdir: Path, warm_engine: SandboxEngine) -> EnvironmentCalls:
    manifest = asyncio.run(load_in_sandbox(warm_engine, workdir / "scored"))
    assert manifest is not None
    calls = EnvironmentCalls.from_manifest("scored@1.0.0", manifest)
    assert calls is not None
    return calls


def test_the_template_reports_what_its_calls_take(scored_calls: EnvironmentCalls) -> None:
    assert scored_calls.reward is not None
    assert scored_calls.reward.name == "scored"
    assert scored_calls.reward.parameters == ("expected", "weight")
    assert scored_calls.reward.required == {"expected"}
    assert not scored_calls.reward.open
    assert set(scored_calls.functions) == {"prepare"}
    assert scored_calls.functions["prepare"].required == {"level"}


@pytest.mark.parametrize(
    ("task", "words"),
    [
        ({"reward_arguments": {"expected": 1, "wieght": 2}}, ["`wieght`", "does not take"]),
        ({"reward_arguments": {"weight": 2}}, ["no `expected`, which it requires"]),
        ({"reward_arguments": [1]}, ["reward_arguments must be an object"]),
        ({"setup": [{"function": "prep", "arguments": {}}]}, ["`prep`", "its functions: prepare"]),
        ({"setup": [{"function": "prepare", "arguments": {"lvl": 1}}]}, ["`lvl`", "`prepare`"]),
        ({"setup": [{"function": "prepare"}]}, ["no `level`, which it requires"]),
        ({"setup": {"function": "prepare"}}, ["setup must be a list"]),
        ({"setup": ["prepare"]}, ["each setup step is"]),
    ],
)
def test_tasks_are_checked_against_the_calls(
    scored_calls: EnvironmentCalls, task: dict[str, Any], words: list[str]
) -> None:
    good = {"id": "fine", **GOOD_TASK}
    with pytest.raises(ConfigurationError) as caught:
        check_tasks([good, {"id": "bad", **task}], scored_calls, source="t.jsonl")
    assert str(caught.value).startswith("t.jsonl: task `bad`"), caught.value
    for word in words:
        assert word in str(caught.value)
    check_tasks([good, {"id": "no-reward-call"}], scored_calls, source="t.jsonl")  # fine


def test_reward_arguments_for_an_environment_without_a_reward() -> None:
    calls = EnvironmentCalls.from_manifest("plain@1.0.0", {"calls": {"functions": []}})
    assert calls is not None
    with pytest.raises(ConfigurationError, match=r"plain@1\.0\.0 registers no reward"):
        check_tasks([{"id": "a", "reward_arguments": {}}], calls)


def test_policies_are_checked_as_called() -> None:
    class Agent:
        async def __call__(self, task: Any, env: Any) -> None:
            return None

    async def flexible(*args: Any, **kwargs: Any) -> None:
        return None

    for fine in (Agent(), flexible):
        check_policy(fine, "fine")
    with pytest.raises(ConfigurationError, match="is not async"):
        check_policy(lambda task, env: None, "sync")

    async def three(task: Any, env: Any, extra: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"takes \(task, env, extra\)"):
        check_policy(three, "three")
    with pytest.raises(ConfigurationError, match="is not callable"):
        check_policy(3, "number")


# -- through a hub --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_user(tmp_path_factory: pytest.TempPathFactory, workdir: Path) -> Iterator[dict[str, str]]:
    """A hub (its engine loads what it receives in a sandbox) where alice published
    ``scored@1.0.0``; her environment, with a Ray address nobody answers."""
    hub = HubProcess(tmp_path_factory.mktemp("hub"))
    key = new_key("alice", hub.store)
    state = tmp_path_factory.mktemp("state")
    env = {k: v for k, v in os.environ.items() if k not in ("AENV_ENV_PATH", "PYTHONPATH")}
    env.update(
        AENV_SYSTEM_URL=hub.url,
        AENV_API_KEY=key,
        AENV_STATE_DIR=str(state),
        AENV_CONFIG_FILE=str(state / "no-config.json"),
        RAY_ADDRESS=f"127.0.0.1:{free_port()}",
    )
    with hub:
        pushed = aenv(env, workdir, "push", "scored")
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        yield env
    stop_daemon(state)


def test_the_hub_says_what_a_published_version_and_a_builtin_take(
    hub_user: dict[str, str],
) -> None:
    async def resolve(ref: str) -> dict[str, Any]:
        async with HubClient(hub_user["AENV_SYSTEM_URL"], api_key=hub_user["AENV_API_KEY"]) as c:
            return await c.resolve(ref)

    published = asyncio.run(resolve("scored"))
    assert published["ref"] == "scored@1.0.0"
    assert published["publisher"] == "alice"
    calls = EnvironmentCalls.from_manifest(published["ref"], published)
    assert calls is not None
    assert calls.reward is not None
    assert calls.reward.parameters == ("expected", "weight")
    builtin = asyncio.run(resolve("mini-terminal"))
    assert builtin["ref"] == "mini-terminal@1.0.0"
    assert builtin["publisher"] is None
    assert builtin["calls"]["reward"]["name"] == "file_contains"
    # the tools too, with their schemas (the hub's UI shows them as forms)
    tools = {t["name"]: t for t in builtin["calls"]["tools"]}
    command = tools["execute_command"]["inputSchema"]
    assert "command" in command["properties"]
    assert "command" in command["required"]


def test_the_hub_stores_a_published_versions_tool_schemas(hub_user: dict[str, str]) -> None:
    """What the sandbox that loaded the bundle at its push saw, kept with the version and
    served by ``GET /v1/envs/NAME/VERSION``: each tool's name, description and schema."""

    async def version() -> dict[str, Any]:
        async with HubClient(hub_user["AENV_SYSTEM_URL"], api_key=hub_user["AENV_API_KEY"]) as c:
            return await c.get_version("scored", "1.0.0")

    calls = asyncio.run(version())["calls"]
    assert [t["name"] for t in calls["tools"]] == ["bump"]
    assert calls["tools"][0]["description"] == "Add one to the level."
    assert calls["tools"][0]["inputSchema"]["type"] == "object"
    assert calls["tools"][0]["inputSchema"]["properties"] == {}
    assert [f["name"] for f in calls["functions"]] == ["prepare"]
    assert calls["functions"][0]["inputSchema"]["required"] == ["level"]


def test_through_the_hub_a_refused_task_or_unknown_name_is_one_line_before_ray(
    workdir: Path, hub_user: dict[str, str], tmp_path: Path
) -> None:
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text(json.dumps({"id": "b", "reward_arguments": {"expected": 1, "bonus": 2}}))
    out = tmp_path / "out"
    done = aenv(
        hub_user, workdir, "rollout", "scored", "--policy", "pols:bumps", "--tasks", str(tasks),
        "-o", str(out),
    )  # fmt: skip
    refused_at_once(done, hub_user, out, "task `b`", "reward `scored`", "`bonus`")
    unknown = aenv(hub_user, workdir, "rollout", "scord", "--policy", "pols:bumps", "--tasks",
                   str(tasks), "-o", str(out))  # fmt: skip
    refused_at_once(unknown, hub_user, out, "`scord`")
