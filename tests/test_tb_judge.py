"""terminal-bench's judge container, run here as a host process with its socket (issue 25 point
4, issue 28 point 3): the server (builtin_envs.terminal_bench.judge) and its protocol
(judge_wire), the runtime's client, the agent's box of a pod (``_tb_box.py`` with ``"pod"``:
no namespaces), and the pod spec with a ``judge`` container (k8s_backend.manifests).

Each judge is the real server, started as the pod starts it (``python -I -B -m
builtin_envs.terminal_bench.judge``), with directories of the test's own standing in for the
judge container's ``/app``, ``/tests`` and ``/tmp``; its tasks read their files relative to
the working directory (the judge's copy), since this host has no ``/app``. Hostile cases: a
second connection and a flood of them, a process the tests' code leaves running, and a
tampered workspace (links out, also through other links, FIFOs, sockets, huge and sparse
files, too many files).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import Environment
from aenv_ray.config import DeployConfig
from aenv_ray.errors import ConfigurationError
from builtin_envs.terminal_bench import JudgeUnavailableError
from builtin_envs.terminal_bench.judge import CopyLimits, copy_files
from builtin_envs.terminal_bench.judge_wire import SOCKET_ENV, JudgeClient, JudgeRequestError
from k8s_backend.manifests import (
    JUDGE_PATH,
    JUDGE_SOCKET_ENV,
    JUDGE_WORKSPACE,
)
from tests._judged import builtin_pod, judge_client, pod_runtime

BOX = Path(__file__).resolve().parents[1] / "builtin_envs/terminal_bench/src/_tb_box.py"

RUN_TESTS = textwrap.dedent(
    """\
    #!/bin/bash
    curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
    source $HOME/.local/bin/env
    uv init
    uv add pytest==8.4.1
    uv run pytest $TEST_DIR/test_outputs.py -rA
    """
)


def _task(root: Path, name: str, tests: str, run_tests: str = RUN_TESTS) -> None:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text(f"instruction: {name}\nmax_test_timeout_sec: 60\n")
    (task / "run-tests.sh").write_text(run_tests)
    (task / "solution.sh").write_text("echo hi > hello.txt\n")
    (task / "tests" / "test_outputs.py").write_text(textwrap.dedent(tests))


@dataclass
class Judged:
    """A running judge: its process, socket, the agent's workspace and the judge's copy."""

    process: subprocess.Popen[bytes]
    socket: str
    workspace: Path
    app: Path
    root: Path


def _start(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> Judged:
    dataset = tmp / "dataset"
    _task(
        dataset,
        "hello",
        """\
        from pathlib import Path

        def test_hello():
            assert Path("hello.txt").read_text().strip() == "hi"
        """,
    )
    # the tests import the agent's code, which leaves a process running (its pid in a file)
    _task(
        dataset,
        "lingers",
        f"""\
        import subprocess

        def test_starts_a_daemon():
            code = "import os,time\\nif os.fork(): os._exit(0)\\nos.setsid()\\ntime.sleep(600)"
            proc = subprocess.Popen(["python3", "-c", code])
            proc.wait()
            with open({str(tmp / "daemon.pids")!r}, "a") as out:
                out.write(str(proc.pid) + "\\n")
        """,
    )
    # the tests' code signals the judge (its pid in a file the test writes first)
    _task(
        dataset,
        "signals",
        f"""\
        import os, signal

        def test_ends_the_judge():
            os.kill(int(open({str(tmp / "judge.pid")!r}).read()), signal.SIGTERM)
        """,
    )
    workspace, app = tmp / "workspace", tmp / "app"
    for directory in (workspace, app, tmp / "tests", tmp / "scratch"):
        directory.mkdir(exist_ok=True)
    path = str(tmp / "judge.sock")
    process = subprocess.Popen(
        [
            sys.executable,
            *("-I", "-B", "-m", "builtin_envs.terminal_bench.judge"),
            *("--socket", path, "--workspace", str(workspace), "--app", str(app)),
            *("--tests", str(tmp / "tests"), "--scratch", str(tmp / "scratch")),
            *("--dataset", str(dataset), *extra),
        ],
        cwd="/",
        env={**os.environ, **(env or {})},
    )
    return Judged(process, path, workspace, app, tmp)


def _stop(judged: Judged) -> None:
    if judged.process.poll() is None:
        judged.process.kill()
    judged.process.wait()


@pytest.fixture
def judged(tmp_path: Path) -> Iterator[Judged]:
    judged = _start(tmp_path)
    yield judged
    _stop(judged)


@pytest.fixture
def client(judged: Judged) -> Iterator[JudgeClient]:
    with judge_client(judged.socket) as connected:
        yield connected


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_workspace_is_graded_with_pytests_own_report(judged: Judged, client: JudgeClient) -> None:
    (judged.workspace / "hello.txt").write_text("hi\n")
    answer = client.request("grade", timeout=120, name="hello")
    assert answer["ran"]
    assert answer["exit_code"] == 0
    assert not answer["timed_out"]
    assert "PASSED" in answer["output"]
    assert "test_hello" in answer["output"]
    (report,) = answer["reports"]
    assert report["exit"] == 0
    assert report["report"]["outcomes"]["tests/test_outputs.py::test_hello"]["status"] == "passed"
    assert answer["copy"]["files"] == 1
    assert answer["copy"]["removed"] == []
    # the agent's work was copied, never used in place: a wrong answer fails on the next run
    (judged.workspace / "hello.txt").write_text("bye\n")
    again = client.request("grade", timeout=120, name="hello")
    assert again["exit_code"] == 1
    assert (
        again["reports"][0]["report"]["outcomes"]["tests/test_outputs.py::test_hello"]["status"]
        == "failed"
    )


def test_the_judge_tells_tasks_and_their_public_part(client: JudgeClient) -> None:
    tasks = client.request("tasks", timeout=30)
    assert tasks["dataset"] == ["hello", "lingers", "signals"]
    assert "hello-world" in tasks["demo"]
    task = client.request("task", timeout=30, name="hello")
    assert task["instruction"] == "hello"
    assert task["invalid"] is None
    assert "test_hello" not in json.dumps(task)
    assert "path" not in task
    assert client.request("solution", timeout=30, name="hello")["script"] == "echo hi > hello.txt\n"
    with pytest.raises(JudgeRequestError, match="no task `nope`"):
        client.request("task", timeout=30, name="nope")
    with pytest.raises(JudgeRequestError, match="not a task name"):
        client.request("grade", timeout=30, name="../dataset/hello")
    with pytest.raises(JudgeRequestError, match="unknown request 'rm'"):
        client.request("rm", timeout=30)
    assert client.request("ping", timeout=30)["pid"] > 0  # the connection stays


def test_the_task_of_tb_task_dir(tmp_path: Path) -> None:
    """A judge whose container names one task (``TB_TASK_DIR``, the task's image) serves it
    without a name, and by its directory's name."""
    own = tmp_path / "own"
    _task(own, "mine", "def test_x():\n    pass\n")
    judged = _start(tmp_path, env={"TB_TASK_DIR": str(own / "mine")})
    try:
        client = JudgeClient.connect(judged.socket, timeout=60)
        assert client.request("task", timeout=30, name="")["task"] == "mine"
        assert client.request("grade", timeout=120, name="mine")["exit_code"] == 0
        client.close()
    finally:
        _stop(judged)


def test_only_the_first_connection_is_served(judged: Judged, client: JudgeClient) -> None:
    with pytest.raises(JudgeUnavailableError, match="refused this connection"):
        JudgeClient.connect(judged.socket, timeout=30)
    # a flood of connections that ask and never read, during a grading: each is refused, none
    # stalls the grading or gets an answer
    (judged.workspace / "hello.txt").write_text("hi\n")
    graded: list[dict[str, object]] = []
    grading = threading.Thread(
        target=lambda: graded.append(client.request("grade", timeout=120, name="hello"))
    )
    grading.start()
    flood = []
    for _ in range(50):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(judged.socket)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b'{"op": "grade", "name": "hello"}\n')
        flood.append(sock)
    grading.join(timeout=300)
    assert graded[0]["exit_code"] == 0
    for sock in flood:
        sock.settimeout(30)
        line = sock.makefile("rb").readline()
        assert json.loads(line)["refused"] is True
        with contextlib.suppress(ConnectionResetError):  # reset: it left the request unread
            assert sock.recv(10) == b""  # closed by the judge
        sock.close()


def test_the_judge_ends_with_the_runtimes_connection(judged: Judged) -> None:
    client = JudgeClient.connect(judged.socket, timeout=60)
    client.close()
    assert judged.process.wait(timeout=60) == 0
    assert client.closed
    with pytest.raises(JudgeUnavailableError, match="the judge is gone"):
        client.request("ping", timeout=5)


def test_sigterm_ends_an_idle_judge_and_a_busy_one_after_its_answer(judged: Judged) -> None:
    """The kubelet's SIGTERM ends an idle judge; one sent by the tests' code (the agent's)
    during a grading ends it only once that grading is answered, unchanged."""
    client = JudgeClient.connect(judged.socket, timeout=60)
    (judged.root / "judge.pid").write_text(str(judged.process.pid))
    answer = client.request("grade", timeout=120, name="signals")
    assert answer["exit_code"] == 0
    assert (
        answer["reports"][0]["report"]["outcomes"]["tests/test_outputs.py::test_ends_the_judge"][
            "status"
        ]
        == "passed"
    )
    assert judged.process.wait(timeout=60) == 0
    with pytest.raises(JudgeUnavailableError):
        client.request("ping", timeout=30)
    client.close()


def test_sigterm_ends_an_idle_judge(judged: Judged, client: JudgeClient) -> None:
    assert client.request("ping", timeout=30)["ok"]
    judged.process.terminate()
    assert judged.process.wait(timeout=60) == 0


def test_what_the_tests_leave_running_is_ended(judged: Judged, client: JudgeClient) -> None:
    answer = client.request("grade", timeout=120, name="lingers")
    assert answer["exit_code"] == 0
    assert len((judged.root / "daemon.pids").read_text().split()) == 1  # the tests' code ran
    # the daemon's parent exited at once: the daemon itself was reparented to the judge (a
    # subreaper) and killed, whatever session it made
    ended = answer["killed_after"]
    assert any("time.sleep(600)" in p["command"] for p in ended), ended
    assert not any(_alive(p["pid"]) for p in ended)
    again = client.request("grade", timeout=120, name="hello")
    assert again["killed_before"] == []  # nothing left from the last run


def test_a_tampered_workspace_is_copied_as_files(judged: Judged, client: JudgeClient) -> None:
    ws = judged.workspace
    (ws / "hello.txt").write_text("hi\n")
    (ws / "sub").mkdir()
    os.mkfifo(ws / "fifo")  # a reader of it would block the tests
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(ws / "sub" / "sock"))
    os.symlink("/etc/passwd", ws / "passwd")  # out, absolute
    os.symlink("../../etc", ws / "sub" / "etc")  # out, relative
    os.symlink("/app", ws / "sub" / "top")  # in (the workspace itself)
    os.symlink("sub/top/../secret", ws / "through")  # lexically in; the kernel goes out
    os.symlink("hello.txt", ws / "same")  # in, relative
    os.symlink("/app/hello.txt", ws / "abs-in")  # in, absolute
    answer = client.request("grade", timeout=120, name="hello")
    listener.close()
    assert answer["exit_code"] == 0
    copy = answer["copy"]
    assert sorted((r["path"], r["type"]) for r in copy["removed"]) == [
        ("fifo", "fifo"),
        ("sub/sock", "socket"),
    ]
    assert sorted(link["path"] for link in copy["links_out"]) == ["passwd", "sub/etc", "through"]
    kept = sorted(p.name for p in judged.app.rglob("*") if p.is_symlink())
    assert kept == ["abs-in", "same", "top"]
    assert not (judged.app / "fifo").exists()
    assert not (judged.app / "passwd").is_symlink()


def test_past_the_copy_limits_nothing_runs(tmp_path: Path) -> None:
    judged = _start(tmp_path, "--max-bytes", str(1 << 20), "--max-files", "50")
    try:
        client = JudgeClient.connect(judged.socket, timeout=60)
        with open(judged.workspace / "sparse", "wb") as out:  # 8 GiB that take no disk
            out.truncate(8 << 30)
        answer = client.request("grade", timeout=120, name="hello")
        assert answer["ran"] is False
        assert "output" not in answer
        assert answer["copy"]["over_limit"] == {"limit": "bytes", "cap": 1 << 20, "path": "sparse"}
        os.unlink(judged.workspace / "sparse")
        for n in range(60):
            (judged.workspace / f"f{n}").write_text("x")
        answer = client.request("grade", timeout=120, name="hello")
        assert answer["copy"]["over_limit"]["limit"] == "files and directories"
        client.close()
    finally:
        _stop(judged)


def test_copy_files_follows_chains_as_the_kernel_would(tmp_path: Path) -> None:
    ws, copy = tmp_path / "ws", tmp_path / "copy"
    (ws / "a" / "b").mkdir(parents=True)
    copy.mkdir()
    os.symlink("a/b", ws / "l")  # in
    os.symlink("l/../../x", ws / "up")  # a/b/../../x: in (the kernel walks from a/b)
    os.symlink("l/../../../x", ws / "out")  # a/b/../../../x: out
    os.symlink("loop2", ws / "loop1")
    os.symlink("loop1", ws / "loop2")  # a loop: never resolves inside
    (ws / "a" / "b" / "deep").write_text("x" * 10)
    found = copy_files(str(ws), str(copy), seen_as="/app", limits=CopyLimits())
    assert sorted(link["path"] for link in found["links_out"]) == ["loop1", "loop2", "out"]
    assert found["files"] == 1
    assert found["bytes"] == 10
    assert found["over_limit"] is None
    deep = tmp_path / "deep"
    path = deep
    for _ in range(5):
        path = path / "d"
    path.mkdir(parents=True)
    (tmp_path / "deep-copy").mkdir()
    found = copy_files(str(deep), str(tmp_path / "deep-copy"), limits=CopyLimits(depth=3))
    assert found["over_limit"] == {"limit": "directories deep", "cap": 3, "path": "d/d/d/d"}


def test_what_the_judge_cannot_read_is_left_out_not_an_error() -> None:
    """Files and directories the agent made unreadable (mode 000) are left out of the copy and
    named; the grading goes on (an error would let the agent turn its 0 into a retry). Run as
    the pod runs the judge: a user of its own, no capability."""
    if os.getuid() != 0:
        pytest.skip("needs root to run the copy as another user without capabilities")
    base = Path(tempfile.mkdtemp(prefix="tb-judge-"))
    try:
        ws, copy = base / "ws", base / "copy"
        (ws / "closed").mkdir(parents=True)
        (ws / "closed" / "inside.txt").write_text("x")
        (ws / "secret.txt").write_text("x")
        (ws / "fine.txt").write_text("ok")
        copy.mkdir()
        for path in (base, ws, copy, *ws.rglob("*")):
            os.chown(path, 65534, 65534)
        (ws / "secret.txt").chmod(0)
        (ws / "closed").chmod(0)
        code = (
            "import json, sys; from builtin_envs.terminal_bench.judge import copy_files; "
            "print(json.dumps(copy_files(sys.argv[1], sys.argv[2])))"
        )
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        done = subprocess.run(
            [
                *as_nobody,
                *("--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", code),
                *(str(ws), str(copy)),
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert sorted(found["removed"], key=lambda r: r["path"]) == [
            {"path": "closed", "type": "unreadable (Permission denied)"},
            {"path": "secret.txt", "type": "unreadable (Permission denied)"},
        ]
        assert found["files"] == 1
        assert (copy / "fine.txt").read_text() == "ok"
        assert sorted(p.name for p in copy.iterdir()) == ["fine.txt"]
    finally:
        for path in (base / "ws" / "closed", base / "ws" / "secret.txt"):
            path.chmod(0o700)
        shutil.rmtree(base)


def test_the_pod_box_ends_everything_below_it(tmp_path: Path) -> None:
    """The agent's box of a pod (``_tb_box.py``, ``"pod"``): no namespace, a subreaper whose
    end takes every process the agent started with it, double forks and new sessions too."""
    ours, theirs = socket.socketpair()
    settings = {
        "mode": "agent",
        "pod": True,
        "env": {"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        "cwd": str(tmp_path),
        "fd": theirs.fileno(),
    }
    box = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(BOX)],
        stdin=subprocess.PIPE,
        pass_fds=(theirs.fileno(),),
    )
    theirs.close()
    assert box.stdin is not None
    box.stdin.write(json.dumps(settings).encode())
    box.stdin.close()
    reader = ours.makefile("rb")

    def ask(request: dict[str, object]) -> dict[str, object]:
        ours.sendall(json.dumps(request).encode() + b"\n")
        answer: dict[str, object] = json.loads(reader.readline())
        return answer

    command = "setsid -w bash -c 'sleep 600 & echo $! > daemon.pid'; cat daemon.pid"
    answer = ask({"op": "run", "command": command, "seconds": 60})
    assert answer["ok"], answer
    assert answer["returncode"] == 0, answer
    daemon = int(str(answer["output"]).split()[-1])
    assert _alive(daemon)
    assert ask({"op": "write", "path": "x.txt", "content": "hi"})["ok"]
    assert (tmp_path / "x.txt").read_text() == "hi"  # the pod's workspace itself: no root built
    reader.close()
    ours.close()  # the runtime goes: the server ends, and its pid 1 ends the rest
    assert box.wait(timeout=60) == 0
    assert not _alive(daemon)


def _pod(deploy: DeployConfig, **env: str) -> dict[str, Any]:
    return builtin_pod("terminal-bench@1.0.0", deploy, **env)


def test_the_pod_spec_has_a_judge_container() -> None:
    deploy = DeployConfig(
        workspace="/app", nestedNamespaces=True, judgeContainer="builtin_envs.terminal_bench.judge"
    )
    pod = _pod(deploy, TB_DATASET_DIR="/data/tb")
    spec = pod["spec"]
    assert isinstance(spec, dict)
    runtime, judge = spec["containers"]
    assert "shareProcessNamespace" not in spec  # each container its own pid namespace
    assert judge["name"] == "judge"
    assert judge["image"] == runtime["image"]
    assert judge["command"] == ["python", "-I", "-B", "-m", "builtin_envs.terminal_bench.judge"]
    assert judge["securityContext"] == runtime["securityContext"]
    assert judge["securityContext"]["readOnlyRootFilesystem"] is True
    assert judge["resources"] == runtime["resources"]
    mounts = {m["mountPath"]: m for m in judge["volumeMounts"]}
    assert mounts[JUDGE_WORKSPACE] == {
        "name": "workspace",
        "mountPath": JUDGE_WORKSPACE,
        "readOnly": True,
    }
    assert {mounts[p]["name"] for p in ("/app", "/tests", "/tmp")} == {
        "judge-app",
        "judge-tests",
        "judge-tmp",
    }
    assert not mounts[JUDGE_PATH].get("readOnly")
    runtime_mounts = {m["mountPath"]: m for m in runtime["volumeMounts"]}
    assert runtime_mounts[JUDGE_PATH]["readOnly"] is True  # the runtime may connect, not plant
    assert "/tests" not in runtime_mounts
    socket_var = next(v for v in runtime["env"] if v["name"] == JUDGE_SOCKET_ENV)
    assert socket_var["value"] == f"{JUDGE_PATH}/judge.sock"
    assert JUDGE_SOCKET_ENV == SOCKET_ENV
    assert f"{JUDGE_PATH}/judge.sock" in judge["args"]
    assert judge["env"] == [{"name": "TB_DATASET_DIR", "value": "/data/tb"}]  # none of ours
    volumes = {v["name"] for v in spec["volumes"]}
    assert {"aenv-judge", "judge-app", "judge-tests", "judge-tmp"} <= volumes


def test_nested_namespaces_are_refused_without_a_judge_container() -> None:
    with pytest.raises(ConfigurationError, match="makes namespaces of its own"):
        _pod(DeployConfig(workspace="/app", nestedNamespaces=True))
    with pytest.raises(ValueError, match="must name a Python module"):
        DeployConfig(judgeContainer="python -c evil")
    with pytest.raises(ConfigurationError, match="AENV_JUDGE_SOCKET is aenv-ray's own"):
        _pod(
            DeployConfig(judgeContainer="builtin_envs.terminal_bench.judge"),
            AENV_JUDGE_SOCKET="/elsewhere",
        )


def test_the_judges_descriptors_are_out_of_its_users_reach(
    judged: Judged, client: JudgeClient
) -> None:
    """The judge is not dumpable: a process of its own user without CAP_SYS_PTRACE (as the
    agent's code the tests run, in a pod) cannot open its descriptors (the served connection)
    through /proc; the same process can read those of a dumpable one (the control)."""
    pid = judged.process.pid
    assert client.request("ping", timeout=30)["pid"] == pid
    probe = (
        "import os, sys\n"
        "for pid in sys.argv[1:]:\n"
        "    try:\n"
        "        os.readlink(f'/proc/{pid}/fd/0'); print(pid, 'open')\n"
        "    except PermissionError:\n"
        "        print(pid, 'denied')\n"
    )
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]
    if os.getuid() != 0:
        drop = []
    control = subprocess.Popen([*drop, "sleep", "600"])  # as the probe: no capability
    try:
        found = subprocess.run(
            [*drop, sys.executable, "-c", probe, str(pid), str(control.pid)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    finally:
        control.kill()
        control.wait()
    assert found[:2] == [f"{pid} denied", f"{control.pid} open"]


# -- the runtime in pod mode, against the judge: one episode over HTTP ---------------------------


@pytest.fixture
def runtime(judged: Judged) -> Iterator[str]:
    """terminal-bench's runtime as a pod's runtime container runs it, here a host process
    serving the judge's workspace."""
    with pod_runtime("terminal-bench@1.0.0", judged.socket, judged.workspace, judged.root) as url:
        yield url


async def test_an_episode_in_pod_mode_is_graded_by_the_judge(judged: Judged, runtime: str) -> None:
    async with Environment.attach(runtime, timeout=120, startup_timeout=120) as env:
        task = await env.call_function("tb_reset", {"task": "hello"})
        assert task["instruction"] == "hello"
        assert "tests" not in task
        listed = await env.call_function("tb_tasks", {})
        assert listed["dataset"] == ["hello", "lingers", "signals"]
        # the agent reaches the judge's socket: refused, the runtime connected first
        knock = (
            'python3 -c "import socket; s=socket.socket(socket.AF_UNIX); '
            f"s.connect('{judged.socket}'); print(s.recv(200))\""
        )
        result = await env.call_tool("run_command", {"command": knock})
        assert "refused" in result.structured["output"], result.structured
        command = "echo hi > hello.txt; (setsid sleep 600 &) ; echo started"
        result = await env.call_tool("run_command", {"command": command})
        assert result.structured["output"].strip() == "started"
        assert (judged.workspace / "hello.txt").read_text() == "hi\n"  # the pod's own /app
        graded = await env.call_reward({})
        assert graded["outcome"] == "passed", graded
        assert graded["reward"] == 1.0
        assert graded["judge"]["verdict"] == "agrees"
        killed = [p["command"] for p in graded["judge"]["killed"]]
        assert any(c.startswith("sleep 600") for c in killed), killed
        # a wrong answer, and a FIFO that would block a reader: 0, the FIFO left out
        command = "echo bye > hello.txt; mkfifo pipe"
        await env.call_tool("run_command", {"command": command})
        graded = await env.call_reward({})
        assert graded["reward"] == 0.0
        assert graded["outcome"] == "failed"
        assert graded["judge"]["removed"] == [{"path": "pipe", "type": "fifo"}]
        oracle = await env.call_function("tb_run_solution", {})
        assert oracle["returncode"] == 0
        assert (await env.call_reward({}))["reward"] == 1.0


@pytest.mark.parametrize(
    ("hello", "said"),
    [
        (b'{"ok": true, "protocol": 2}\n', "speaks protocol 2, not 1"),
        (b"not json\n", "a line that is not JSON"),
        (b"[1]\n", "not an object"),
        (b"", "closed the connection"),
    ],
)
def test_the_client_trusts_no_judge_that_breaks_the_protocol(
    tmp_path: Path, hello: bytes, said: str
) -> None:
    """A socket that answers otherwise than the judge (another version, garbage, nothing) is a
    judge the runtime cannot use, said so; never a task or a grade."""
    path = str(tmp_path / "other.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(hello)

    server = threading.Thread(target=answer)
    server.start()
    try:
        with pytest.raises(JudgeUnavailableError, match=said):
            JudgeClient.connect(path, timeout=60)
    finally:
        server.join(timeout=60)
        listener.close()
