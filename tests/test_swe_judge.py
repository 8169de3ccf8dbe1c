"""swe's judge container, run here as a host process with its socket (issue 28 point 3, issue
25 point 4): the server (builtin_envs.swe.judge), the runtime in pod mode against it
(builtin_envs.swe.pod), and swe's pod spec with a ``judge`` container.

Each judge is the real server, started as the pod starts it (``python -I -B -m
builtin_envs.swe.judge``), with directories of the test's own standing in for the agent's
workspace (read-only in a pod), the judge's own repository directory and its ``/tmp``; its rows
are the demo rows shipped with swe. The judge's own tests talk to it as the runtime does
(JudgeClient: the first connection) and set the agent's repository up from the bundle it
hands out. Hostile cases: a forging conftest, a FIFO, links out, a git configuration that runs
a command, fake ``python`` and shell start-up files, printed results, a daemon the tests' code
leaves, a huge sparse file, a repository replaced by a link, a second connection. Then one
episode over HTTP through the runtime in pod mode, played alike on the local engine: the same
rewards, the same files left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from aenv_ray import Environment
from aenv_ray.config import EnvConfig
from builtin_envs import builtin_path
from builtin_envs.demos import swe as demo
from builtin_envs.swe.episode import DEMO_DATASET
from builtin_envs.terminal_bench import JudgeUnavailableError
from builtin_envs.terminal_bench.judge_wire import JudgeClient, JudgeRequestError
from k8s_backend.manifests import JUDGE_ONLY, JUDGE_WORKSPACE
from tests._judged import builtin_pod, judge_client, pod_runtime, run_command
from tests.test_reward_exploits_swe import ATTACKS, PASS_EVERYTHING, Attack

CALC = "demo__calc-1"
WRONG_MEAN = "    if not values:\n        return 0\n    return sum(values) / len(values)\n"


def _rows() -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in DEMO_DATASET.read_text().splitlines()]
    return {row["instance_id"]: row for row in rows}


@dataclass
class Judged:
    """A running swe judge: its process, socket, the agent's workspace and the judge's own
    directories."""

    process: subprocess.Popen[bytes]
    socket: str
    workspace: Path
    app: Path
    scratch: Path
    root: Path

    @property
    def repo(self) -> Path:
        return self.workspace / "testbed"


def _start(tmp: Path, *extra: str) -> Judged:
    workspace, app, scratch = tmp / "workspace", tmp / "app", tmp / "scratch"
    for directory in (workspace, app, scratch):
        directory.mkdir(exist_ok=True)
    path = str(tmp / "judge.sock")
    process = subprocess.Popen(
        [
            sys.executable,
            *("-I", "-B", "-m", "builtin_envs.swe.judge"),
            *("--socket", path, "--workspace", str(workspace), "--app", str(app)),
            *("--scratch", str(scratch), "--seen-as", str(workspace), *extra),
        ],
        cwd="/",
        env={k: v for k, v in os.environ.items() if not k.startswith(("SWE_", "AENV_"))},
    )
    return Judged(process, path, workspace, app, scratch, tmp)


def _stop(judged: Judged) -> None:
    if judged.process.poll() is None:
        judged.process.kill()
    judged.process.wait(timeout=60)


@pytest.fixture
def judged(tmp_path: Path) -> Iterator[Judged]:
    started = _start(tmp_path)
    try:
        yield started
    finally:
        _stop(started)


@pytest.fixture
def client(judged: Judged) -> Iterator[JudgeClient]:
    with judge_client(judged.socket) as connected:
        yield connected


def _git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo), "GIT_CONFIG_GLOBAL": "/dev/null"}
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _reset(judged: Judged, client: JudgeClient, instance: str = CALC) -> dict[str, Any]:
    """Reset the judge to ``instance`` and set the agent's repository up from its bundle, as
    the runtime does."""
    answer = client.request("reset", timeout=300, instance_id=instance, repo=str(judged.repo))
    bundles = list(Path(answer["bundle_dir"]).glob("*.bundle"))
    assert [b.name for b in bundles] == [answer["task"]["repo"].replace("/", "__") + ".bundle"]
    if judged.repo.exists():
        subprocess.run(["rm", "-rf", str(judged.repo)], check=True)
    judged.repo.mkdir()
    _git(judged.repo, "init", "-q")
    _git(judged.repo, "fetch", "-q", str(bundles[0]), "swe-base")
    _git(judged.repo, "checkout", "-q", "--detach", "FETCH_HEAD")
    return answer


def _apply(judged: Judged, patch: str) -> None:
    done = subprocess.run(
        ["git", "apply", "-"], cwd=judged.repo, input=patch, text=True, capture_output=True
    )
    assert done.returncode == 0, done.stderr


def _grade(judged: Judged, client: JudgeClient, strict: bool = True) -> dict[str, Any]:
    return client.request("grade", timeout=600, repo=str(judged.repo), strict=strict)


def test_the_gold_patch_resolves_and_a_wrong_one_does_not(
    judged: Judged, client: JudgeClient
) -> None:
    row = _rows()[CALC]
    answer = _reset(judged, client)
    task = answer["task"]
    assert task["instance_id"] == CALC
    assert task["base_commit"] == row["base_commit"]
    assert not {"patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"} & set(task)
    # the bundle holds the base commit's history only: no later commit (the fix) reaches it
    assert _git(judged.repo, "rev-parse", "HEAD").strip() == row["base_commit"]
    assert (
        _git(judged.repo, "rev-list", "--all").split()
        == _git(judged.repo, "rev-list", "HEAD").split()
    )
    empty = _grade(judged, client)
    assert empty["ran"] is True
    assert empty["graded"]["reward"] == 0.0
    assert empty["graded"]["resolution"] == "RESOLVED_NO"
    _apply(judged, row["patch"])
    gold = _grade(judged, client)["graded"]
    assert gold["reward"] == 1.0, gold["test_log"]
    assert gold["strict"] is True
    assert gold["graded_files"] == ["calc/ops.py"]
    assert gold["model_patch"].strip() == row["patch"].strip()
    assert _grade(judged, client, strict=False)["graded"]["reward"] == 1.0
    _git(judged.repo, "checkout", "-q", "--", ".")  # back to the base commit, then wrong
    ops = judged.repo / "calc" / "ops.py"
    ops.write_text(ops.read_text().replace("    return sum(values) / len(values)\n", WRONG_MEAN))
    wrong = _grade(judged, client)["graded"]
    assert wrong["reward"] == 0.0
    assert wrong["resolution"] == "RESOLVED_NO"
    assert "tests/test_ops.py::test_mean_of_nothing" in wrong["reason"]


def test_nothing_the_agent_leaves_in_its_repository_changes_the_grade(
    judged: Judged, client: JudgeClient
) -> None:
    """The bug left unfixed, the repository full of what could forge a grade or hang a
    reader: a forging conftest, a FIFO, a socket, links out (to a file of the host and to the
    judge's own repository), a git configuration and hook that run a command, a fake
    ``python`` first on a PATH the agent's shell start-up files export, printed and filed
    passing results. Reward 0, each one left out and named; no command of the agent's ran in
    the judge. Then the gold patch among the same files: 1.0."""
    import socket

    _reset(judged, client)
    repo = judged.repo
    marker = judged.root / "ran-in-the-judge"
    (repo / "conftest.py").write_text(PASS_EVERYTHING)
    os.mkfifo(repo / "pipe")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(repo / "calc" / "sock"))
    (repo / "calc" / "passwd.py").symlink_to("/etc/passwd")
    (repo / "calc" / "judges.py").symlink_to(judged.app / "testbed" / "calc" / "ops.py")
    hook = f"#!/bin/sh\ntouch {marker}\n"
    for name in ("fsmonitor", ".git/hooks/post-checkout", ".git/hooks/pre-commit"):
        (repo / name).write_text(hook)
        (repo / name).chmod(0o755)
    with (repo / ".git" / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {repo / 'fsmonitor'}\n\thooksPath = .git/hooks\n")
    (repo / "bin").mkdir()
    (repo / "bin" / "python").write_text(f"#!/bin/sh\ntouch {marker}\necho '4 passed'\n")
    (repo / "bin" / "python").chmod(0o755)
    for name in (".bashrc", ".profile"):
        (judged.workspace / name).write_text(f"export PATH={repo / 'bin'}:$PATH\n")
    passing = "".join(f"PASSED tests/test_ops.py::test_{n}\n" for n in ("add", "mean"))
    (repo / "test_log.txt").write_text(passing + "4 passed in 0.01s\n")
    print(passing)  # printed text reaches no judge
    try:
        graded = _grade(judged, client)
    finally:
        unix.close()
    assert graded["graded"]["reward"] == 0.0, graded["graded"]["test_log"]
    copy = graded["copy"]
    assert {(r["path"], r["type"]) for r in copy["removed"]} == {
        ("pipe", "fifo"),
        ("calc/sock", "socket"),
    }
    assert {link["path"] for link in copy["links_out"]} == {"calc/passwd.py", "calc/judges.py"}
    left = {item["path"]: item["reason"] for item in graded["graded"]["left_out"]}
    assert left["conftest.py"] == "conftest"
    assert not marker.exists()
    _apply(judged, _rows()[CALC]["patch"])
    gold = _grade(judged, client)["graded"]
    assert gold["reward"] == 1.0, gold["test_log"]
    assert not marker.exists()
    # the judge's own repository is not the agent's: the agent's files are as it left them
    assert (repo / "pipe").exists()
    assert (repo / "conftest.py").read_text() == PASS_EVERYTHING


def test_what_the_tests_leave_running_is_ended(judged: Judged, client: JudgeClient) -> None:
    """The agent's source, imported by the tests, double-forks a daemon that holds the test
    run's output pipe: it ends with the test command (the judge's reaper), so the grading
    neither waits for it nor leaves it; the fix itself is graded 1.0."""
    _reset(judged, client)
    _apply(judged, _rows()[CALC]["patch"])
    pids = judged.root / "daemon.pid"
    daemon = (
        "import os as _os, time as _time\n"
        "if _os.fork() == 0:\n"
        "    _os.setsid()\n"
        "    if _os.fork() == 0:\n"
        f"        open({str(pids)!r}, 'a').write(str(_os.getpid()) + '\\n')\n"
        "        _time.sleep(600)\n"
        "    _os._exit(0)\n"
    )
    ops = judged.repo / "calc" / "ops.py"
    ops.write_text(daemon + ops.read_text())
    graded = _grade(judged, client)
    assert graded["graded"]["reward"] == 1.0, graded["graded"]["test_log"]
    started = {int(p) for p in pids.read_text().split()}
    assert started  # ended with the test command (which would else wait for its output pipe)
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_past_the_copy_limits_nothing_runs(tmp_path: Path) -> None:
    judged = _start(tmp_path, "--max-bytes", str(1 << 20))
    try:
        client = JudgeClient.connect(judged.socket, timeout=60)
        _reset(judged, client)
        _apply(judged, _rows()[CALC]["patch"])
        with (judged.repo / "calc" / "huge.bin").open("wb") as huge:
            huge.truncate(8 << 30)  # sparse: 8 GiB apparent, nothing on disk
        graded = _grade(judged, client)
        client.close()
    finally:
        _stop(judged)
    assert graded["ran"] is False
    assert graded["copy"]["over_limit"]["limit"] == "bytes"
    assert graded["graded"]["reward"] == 0.0
    assert "ran no test" in graded["graded"]["reason"]


def test_bad_requests_are_refused_with_the_reason(judged: Judged, client: JudgeClient) -> None:
    with pytest.raises(JudgeRequestError, match="no task yet"):
        _grade(judged, client)
    with pytest.raises(JudgeRequestError, match="not inside the workspace"):
        client.request("reset", timeout=60, instance_id=CALC, repo="/etc")
    with pytest.raises(JudgeRequestError, match="no instance 'nope'"):
        client.request("reset", timeout=60, instance_id="nope", repo=str(judged.repo))
    assert client.request("instances", timeout=60)["instances"] == [CALC, "demo__textkit-1"]
    # the agent's repository replaced by a link to another one: graded 0, not followed
    _reset(judged, client)
    elsewhere = judged.root / "elsewhere"
    judged.repo.rename(elsewhere)
    judged.repo.symlink_to(elsewhere)
    graded = _grade(judged, client)
    assert graded["graded"]["reward"] == 0.0
    assert "not a directory the judge can read" in graded["graded"]["reason"]


def test_only_the_first_connection_is_served(judged: Judged, client: JudgeClient) -> None:
    with pytest.raises(JudgeUnavailableError, match="refused this connection"):
        JudgeClient.connect(judged.socket, timeout=60)
    assert client.request("ping", timeout=30)["pid"] == judged.process.pid
    client.close()
    judged.process.wait(timeout=60)  # the runtime's connection closed: the judge ends


def test_swes_pod_has_a_judge_container_and_is_not_refused() -> None:
    project = builtin_path("swe@1.0.0")
    assert project is not None
    deploy = EnvConfig.load(project).deploy_config
    assert deploy.nested_namespaces is True
    assert deploy.judge_container == "builtin_envs.swe.judge"
    pod = builtin_pod("swe@1.0.0", deploy, SWE_DATASET="/data/rows.jsonl")
    runtime, judge = pod["spec"]["containers"]
    assert judge["command"] == ["python", "-I", "-B", "-m", "builtin_envs.swe.judge"]
    args = judge["args"]
    assert args[args.index("--workspace") + 1] == JUDGE_WORKSPACE
    assert args[args.index("--app") + 1] == "/workspace"
    assert args[args.index("--seen-as") + 1] == "/workspace"
    assert judge["env"] == [{"name": "SWE_DATASET", "value": "/data/rows.jsonl"}]
    workspace = next(m for m in runtime["volumeMounts"] if m["mountPath"] == "/workspace")
    assert not workspace.get("readOnly")
    # the image's /data is the judge's alone: the runtime container has an empty volume there
    hidden = next(m for m in runtime["volumeMounts"] if m["mountPath"] == JUDGE_ONLY)
    assert hidden["readOnly"] is True
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == hidden["name"])
    assert set(volume) == {"name", "emptyDir"}
    assert JUDGE_ONLY not in {m["mountPath"] for m in judge["volumeMounts"]}


# -- the runtime in pod mode, against the judge; the same work on the local engine ---------------


@pytest.fixture
def runtime(judged: Judged) -> Iterator[str]:
    """swe's runtime as a pod's runtime container runs it, here a host process whose workspace
    the judge reads."""
    tmp = judged.root / "runtime-tmp"  # the runtime container's /tmp
    tmp.mkdir()
    with pod_runtime("swe@1.0.0", judged.socket, judged.workspace, judged.workspace, tmp) as url:
        yield url


@pytest_asyncio.fixture
async def pod_env(runtime: str) -> AsyncIterator[Environment]:
    async with Environment.attach(runtime, timeout=300, startup_timeout=120) as env:
        yield env


@pytest_asyncio.fixture
async def local_env() -> AsyncIterator[Environment]:
    async with Environment("swe@1.0.0", ttl="20m", timeout=300) as environment:
        yield environment


def _portable(attack: Attack) -> bool:
    """An attack whose steps name no path of the local engine's instance (``/workspace``)."""
    return "/workspace" not in json.dumps(attack.steps)


WORK = [
    Attack("gold", CALC, [], {}, gold=True),
    Attack(
        "wrong",
        CALC,
        [
            (
                "str_replace",
                {
                    "path": "calc/ops.py",
                    "old_str": "    return sum(values) / len(values)\n",
                    "new_str": WRONG_MEAN,
                },
            )
        ],
        {},
    ),
    *(a for a in ATTACKS if _portable(a)),
]


async def _play(env: Environment, work: Attack) -> dict[str, Any]:
    await env.call_function("swe_reset", {"instance_id": work.instance})
    if work.gold:
        assert await demo.policy({"id": work.instance}, env) is not None
    for tool, arguments in work.steps:
        result = await env.call_tool(tool, arguments)
        assert not result.is_error, (work.name, result.text)
    graded = await env.call_reward({})
    assert isinstance(graded, dict)
    return graded


async def test_an_episode_in_pod_mode_is_graded_as_on_the_local_engine(
    judged: Judged, pod_env: Environment, local_env: Environment
) -> None:
    task = await pod_env.call_function("swe_task", {})
    assert task["instance_id"] == CALC  # the judge's first row, before any reset
    assert task["repo_dir"] == str(judged.repo)
    assert "patch" not in task
    assert await pod_env.call_function("swe_instances", {}) == [CALC, "demo__textkit-1"]
    knock = (
        'python3 -c "import socket; s=socket.socket(socket.AF_UNIX); '
        f"s.connect('{judged.socket}'); print(s.recv(200))\""
    )
    result = await pod_env.call_tool("run_command", {"command": knock})
    assert result.structured is not None
    assert "refused" in result.structured["output"], result.structured
    # a command that leaves a process holding its output pipe returns when its shell ends,
    # and the process ends with it (the reaper each command runs under in a pod)
    # (a length of sleep of its own: the instance may see the host's processes, other tests')
    started = await pod_env.call_tool(
        "run_command", {"command": "(setsid sleep 611.25 &); echo started", "timeout": 60}
    )
    assert started.structured == {"output": "started\n", "returncode": 0}, started.text
    left = await pod_env.call_tool(
        "run_command", {"command": "pgrep -cf '^sleep 611[.]25$' || true", "timeout": 60}
    )
    assert left.structured is not None, left.text
    assert left.structured["output"].strip() == "0", left.text
    for work in WORK:
        in_pod = await _play(pod_env, work)
        local = await _play(local_env, work)
        expected = 1.0 if work.gold else 0.0
        assert in_pod["reward"] == local["reward"] == expected, (work.name, in_pod["test_log"])
        assert in_pod["left_out"] == local["left_out"], work.name
        assert in_pod["graded_files"] == local["graded_files"], work.name
        assert in_pod["test_statuses"] == local["test_statuses"], work.name
        assert in_pod["model_patch"] == local["model_patch"], work.name
        assert in_pod["judge"]["removed"] == [], work.name
    # SWE-bench's grading (strict=False) of the forging conftest: forged alike in both modes
    forged = next(a for a in ATTACKS if a.left_out.get("conftest.py") == "conftest")
    await _play(pod_env, forged)
    assert (await pod_env.call_reward({"strict": False}))["reward"] == 1.0


async def test_resets_in_pod_mode_leave_no_copy_of_a_bundle_in_the_runtimes_tmp(
    judged: Judged, pod_env: Environment
) -> None:
    """Each reset's base history comes as a new bundle of the judge's; the runtime sets the
    agent's repository up from it and keeps no mirror of it in its private directory (in a pod,
    in the runtime container's size-limited ``/tmp``), however many episodes it plays; the
    repository is fresh in each: at the row's base commit, nothing of the previous episode's."""
    rows = _rows()
    for instance in (CALC, "demo__textkit-1", CALC, "demo__textkit-1", CALC):
        await pod_env.call_function("swe_reset", {"instance_id": instance})
        fresh = await run_command(
            pod_env, "git status --porcelain --untracked-files=all && git rev-parse HEAD"
        )
        assert fresh["output"].split() == [rows[instance]["base_commit"]], (instance, fresh)
        left = await run_command(pod_env, "echo agent > left.txt && git add left.txt")
        assert left["returncode"] == 0, left
    private = judged.root / "runtime-tmp" / ".swe-private"
    assert private.is_dir()  # the runtime's private directory is where the test looks
    mirrors = sorted(p.name for p in private.glob("mirrors/*"))
    assert mirrors == [], f"{len(mirrors)} mirrors kept after 5 resets"
    assert sorted(p.name for p in private.iterdir()) == []
