"""The instance side of terminal-bench: the boxes, the episode (task, deadline), the test run.

Two kinds of box (``_tb_box.py``), each a pid, user and mount namespace of its own whose root
holds only the system's directories, Python, ``/app``, ``/tmp`` and ``/root``:

- the **agent's box**, one per episode: every tool runs there (commands, files, the tmux
  session), so the agent sees what a user of the task's container sees, and never the dataset,
  the task directory or the runtime;
- the **grader's box** (the judge), one per test run: the same system view plus ``/tests``
  (the task's ``run-tests.sh`` and ``tests/``, read-only) and the offline ``apt-get``, ``curl``
  and ``uv``; the agent's ``/app`` as files (FIFOs, sockets and device nodes removed first), a
  ``/tmp`` and ``/root`` of its own, emptied before every run, the task image's environment.
  Before it starts, the agent's box is ended: every process in it frozen, listed, killed
  (:meth:`AgentBox.end`); the agent's next tool call starts a new one.

``/tmp`` and ``/root`` of the boxes are directories of the instance's own ``/tmp`` (under
``/tmp/.tb``), emptied with ``/app`` at every reset (the judge's: before every test run).

In a Kubernetes pod (:data:`IN_POD`: the pod spec names the judge container's socket) no box
has namespaces of its own: the agent's box is a plain process tree below a subreaper, in the
pod's runtime container (``"pod"`` in its settings), and the tests run in the pod's judge
container (``_tb_pod.py``), not here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import builtin_envs.terminal_bench as terminal_bench_library
from aenv_ray import keep_processes
from aenv_ray.extras import require_extra
from aenv_ray.processes import unconfined
from builtin_envs.terminal_bench import (
    BoxUnavailableError,
    NoTaskError,
    Task,
    TaskNotFoundError,
    TestRun,
    load_task,
    task_names,
)
from builtin_envs.terminal_bench.errors import JudgeUnavailableError
from builtin_envs.terminal_bench.judge_wire import SOCKET_ENV

log = logging.getLogger("terminal_bench")

BOX = Path(__file__).resolve().with_name("_tb_box.py")
PYTEST = Path(__file__).resolve().with_name("_tb_pytest.py")
LIBRARY = Path(terminal_bench_library.__file__ or "").resolve().parent  # wherever it is installed
OFFLINE = LIBRARY / "offline"
DEMO_TASKS = LIBRARY / "demo_tasks"
STATE = Path("/tmp/.tb")  # the boxes' /tmp and /root, in the instance's /tmp
WORKDIR = "/app"
SYSTEM_DIRS = frozenset({"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"})
AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OFFLINE_AT = "/aenv-offline"
MAX_REPLY = 64 << 20  # bytes of one answer of the agent's box
MAX_TEST_OUTPUT = 16 << 20  # bytes of test output kept (the end)
START_TIMEOUT = 20.0
FREEZE_ROUNDS = 100  # passes over the agent's processes to stop them all (then they are killed)
END_TIMEOUT = 20.0  # seconds for the agent's box to be gone once its pid 1 is killed
MAX_JUDGE_REPORT = 64 << 20  # bytes of pytest reports kept
IN_POD = bool(os.environ.get(SOCKET_ENV))
"""Whether this instance is a Kubernetes pod with a judge container (no namespaces here)."""
_NAME_PART = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


_GONE = "the terminal's box is gone; the next call starts a new one"


class BoxError(RuntimeError):
    """A request the agent's box could not carry out (its message is the agent's to read)."""


class BoxDiedError(BoxError):
    """The agent's box is gone (its server ended): the next call starts a new one."""


def _outermost(paths: set[Path]) -> list[Path]:
    kept: list[Path] = []
    for path in sorted(paths, key=lambda p: len(p.parts)):
        if str(path) != "/" and not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def _layout() -> tuple[dict[str, str], list[tuple[str, str, bool]]]:
    """The top-level links and the read-only binds of every box: the system's directories and
    the Python that runs the instance (the grader's pytest is its)."""
    links: dict[str, str] = {}
    binds: list[tuple[str, str, bool]] = []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name not in SYSTEM_DIRS:
            continue
        if os.path.islink(path):
            links[name] = os.readlink(path)
        elif os.path.isdir(path):
            binds.append((path, path, False))
    prefixes = {Path(p).resolve() for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    if PYTEST_SITE is not None:  # pytest may live outside the prefixes (PYTHONPATH)
        prefixes.add(Path(PYTEST_SITE))
    system = [Path(b[0]) for b in binds]
    for prefix in _outermost(prefixes):
        if not any(prefix.is_relative_to(s) for s in system):
            binds.append((str(prefix), str(prefix), False))
    return links, binds


def _pytest_site() -> str | None:
    """The directory pytest is imported from (its site-packages), or None without pytest."""
    spec = importlib.util.find_spec("pytest")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).resolve().parent.parent)


PYTEST_SITE = _pytest_site()


def _hidden(binds: list[tuple[str, str, bool]]) -> list[str]:
    """The tasks' directories inside what the boxes bind (the bundled demo tasks of an install
    in a virtual environment, a dataset inside one), as the boxes see them: covered there."""
    secret = [DEMO_TASKS, _dataset()]
    if os.environ.get("TB_TASK_DIR"):
        secret.append(Path(os.environ["TB_TASK_DIR"]))
    covered = []
    for path in (p.resolve() for p in secret if p.is_dir()):
        for source, target, _ in binds:
            if path.is_relative_to(source):
                covered.append(str(Path(target) / path.relative_to(source)))
    return sorted(set(covered))


def _box_env(*, grader: bool) -> dict[str, str]:
    env = {
        "PATH": AGENT_PATH,
        "HOME": "/root",
        "USER": "root",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "TERM": "xterm-256color",
        "TEST_DIR": "/tests",
        "PWD": WORKDIR,
    }
    if grader:
        env.update(
            PATH=f"{OFFLINE_AT}/bin:{AGENT_PATH}",
            TB_OFFLINE=OFFLINE_AT,
            TB_PYTHON=sys.executable,
            TB_SITE_PACKAGES=PYTEST_SITE or "",
            COLUMNS="160",
            LINES="40",
            DEBIAN_FRONTEND="noninteractive",
        )
    return env


def _workspace() -> str:
    path = os.environ.get("AENV_WORKSPACE") or WORKDIR
    if not os.path.isdir(path):
        raise BoxUnavailableError(
            f"the instance has no workspace at {path}: terminal-bench needs /app "
            "(deployConfig.workspace, on an engine that isolates instances)"
        )
    return path


def _settings(
    mode: str, *, tmp: Path | None = None, home: Path | None = None, **more: Any
) -> dict[str, Any]:
    links, binds = _layout()
    binds = [
        (_workspace(), WORKDIR, True),
        (str(tmp or STATE / "tmp"), "/tmp", True),
        (str(home or STATE / "home"), "/root", True),
        *binds,
    ]
    if mode == "grader":
        binds.append((str(OFFLINE), OFFLINE_AT, False))
    return {
        "mode": mode,
        "links": links,
        "binds": binds,
        "hide": _hidden(binds),
        "env": _box_env(grader=mode == "grader"),
        "cwd": WORKDIR,
        **more,
    }


def _box_command() -> list[str]:
    return [sys.executable, "-I", "-S", "-B", str(BOX)]


# what the processes the runtime starts get of its environment: nothing (a box's pid 1 is one
# of them, and a box can read its pid 1's environment)
_CLEAN_ENV = {"PATH": AGENT_PATH, "LANG": "C.UTF-8"}


def _empty(directory: Path, mode: int) -> None:
    """``directory`` exists, empty, with ``mode`` (what the agent left there is removed)."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in list(os.scandir(directory)):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(PermissionError):  # a pod's emptyDir (/app) is root's, mode 0777
        directory.chmod(mode)


def clean_slate() -> None:
    """Empty ``/app`` and the boxes' ``/tmp`` and ``/root``."""
    _empty(Path(_workspace()), 0o755)
    _empty(STATE / "tmp", 0o1777)
    _empty(STATE / "home", 0o700)


def _children(pid: int) -> list[int]:
    """The children of process ``pid`` (none when it is gone)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except OSError:
            continue
    return found


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...)."""
    found: list[int] = []
    todo = _children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += _children(child)
    return found


def _process_info(pid: int) -> dict[str, Any] | None:
    """``{"pid", "command"}`` of process ``pid``: its pid in its innermost pid namespace, its
    command line (200 characters at most); None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as raw:
            argv = raw.read(4096).split(b"\0")
    except OSError:
        return None
    inner = pid
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            inner = int(line.split()[-1])
    command = " ".join(a.decode(errors="replace") for a in argv if a)
    if not command:
        name = next((ln.split(None, 1)[-1] for ln in status.splitlines() if ln[:5] == "Name:"), "")
        command = f"[{name}]"
    return {"pid": inner, "command": command[:200]}


def _kind(mode: int) -> str | None:
    """What a file that is not a plain file, directory or link is (None for those)."""
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return None


# where a link resolved in the grader's box reaches what only the judge has: the task's tests
# (and the files they compare with), the offline tools, the processes (``/proc/self/root``
# leads back to ``/tests``; ``/proc/PID/fd`` to the judge's pipes)
_JUDGE_ONLY = ("/tests", OFFLINE_AT, "/proc")
_BOX_STDIO = ("/proc/self/fd/0", "/proc/self/fd/1", "/proc/self/fd/2")
_BOX_DEV_LINKS = {
    "/dev/fd": "/proc/self/fd",
    "/dev/stdin": "/proc/self/fd/0",
    "/dev/stdout": "/proc/self/fd/1",
    "/dev/stderr": "/proc/self/fd/2",
}


def _box_host_path(path: str, root: str, shared: list[str]) -> str | None:
    """Where the grader's box's ``path`` is on this machine, when the box shows this machine's
    file there (``/app``, the system's directories and the Python it binds); None elsewhere
    (its own ``/tests``, ``/proc``, ``/dev``, fresh ``/tmp`` and home: not followed)."""
    if path == WORKDIR or path.startswith(WORKDIR + "/"):
        return root + path[len(WORKDIR) :]
    for top in shared:
        if path == top or path.startswith(top.rstrip("/") + "/"):
            return path
    return None


def _box_shared() -> list[str]:
    """The paths a grader's box shows as this machine's: its top-level links, what it binds."""
    links, binds = _layout()
    return ["/" + name for name in links] + [target for _, target, _ in binds]


def box_resolve(target: str, *, root: str | None = None, shared: list[str] | None = None) -> str:
    """The path the absolute ``target`` resolves to in a grader's box, links followed as the
    kernel follows them there (``..`` after a link goes up from where the link led): the box's
    own directories (``/tests``, ``/proc``, ``/tmp``...) end the walk, the rest of the path
    taken as written. ``""`` for a chain of more than 40 links (the box's kernel refuses it)."""
    root = root or _workspace()
    shared = _box_shared() if shared is None else shared
    parts = [p for p in target.split("/") if p][::-1]  # a stack: the next part last
    current = "/"
    hops = 40
    while parts:
        name = parts.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        link = _BOX_DEV_LINKS.get(candidate)
        host = _box_host_path(candidate, root, shared)
        if link is None and host is not None and os.path.islink(host):
            link = os.readlink(host)
        if link is not None:
            hops -= 1
            if hops < 0:
                return ""
            if link.startswith("/"):
                current = "/"
            parts += [p for p in link.split("/") if p][::-1]
            continue
        if host is None:  # the box's own: what follows is as written
            return os.path.normpath(os.path.join(candidate, *parts[::-1]))
        current = candidate
    return current


def into_judge(resolved: str) -> bool:
    """Whether a path a link resolves to in the grader's box is one of the judge's own (the
    tests, the offline tools, the processes; not the standard streams ``/dev/stdout`` and the
    like lead to)."""
    if resolved in _BOX_STDIO:
        return False
    return any(resolved == top or resolved.startswith(top + "/") for top in _JUDGE_ONLY)


def files_only() -> dict[str, list[dict[str, str]]]:
    """The agent's ``/app`` as files only, for the judge: FIFOs, sockets and device nodes are
    removed (``removed``: path and type); links that lead out of ``/app`` are kept and listed
    (``links_out``: in the judge's box they lead to its own ``/tmp``, ``/root``, the system),
    except those that lead, in the judge's box, to the judge's own files (the task's tests,
    ``/proc``, the offline tools; directly, through other links or through ``..``): removed and
    listed (``links_into_judge``: path, target and where it leads), and the grading fails."""
    root = _workspace()
    removed: list[dict[str, str]] = []
    links_out: list[dict[str, str]] = []
    into: list[dict[str, str]] = []
    shared = _box_shared()
    todo = [root]
    while todo:
        directory = todo.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            shown = WORKDIR + entry.path[len(root) :]
            if stat.S_ISDIR(mode):
                todo.append(entry.path)
            elif stat.S_ISLNK(mode):
                target = os.readlink(entry.path)
                leads = box_resolve(
                    os.path.join(os.path.dirname(shown), target), root=root, shared=shared
                )
                lexical = os.path.normpath(os.path.join(os.path.dirname(shown), target))
                if leads and into_judge(leads):
                    into.append({"path": shown, "target": target, "leads_to": leads})
                elif not (lexical == WORKDIR or lexical.startswith(WORKDIR + "/")):
                    links_out.append({"path": shown, "target": target})
            elif (kind := _kind(mode)) is not None:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                removed.append({"path": shown, "type": kind})
    for link in into:  # after the walk: a chain's every link is judged with the others
        with contextlib.suppress(OSError):
            os.unlink(root + link["path"][len(WORKDIR) :])
    return {"removed": removed, "links_out": links_out, "links_into_judge": into}


def _log_file(name: str) -> Any:
    directory = Path("/tmp/.tb-runtime")
    directory.mkdir(mode=0o700, exist_ok=True)
    return open(directory / name, "w+b")


class AgentBox:
    """The agent's box and its server, started at once; :meth:`request` talks to it."""

    def __init__(self) -> None:
        (STATE / "tmp").mkdir(parents=True, exist_ok=True, mode=0o1777)
        (STATE / "home").mkdir(parents=True, exist_ok=True, mode=0o700)
        ours, theirs = socket.socketpair()
        self._errors = _log_file("agent-box.log")
        if IN_POD:
            env = _box_env(grader=False)
            env["HOME"] = str(STATE / "home")
            settings = {"mode": "agent", "pod": True, "env": env, "cwd": _workspace()}
            settings["fd"] = theirs.fileno()
        else:
            settings = _settings("agent", fd=theirs.fileno())
        try:
            self._process = subprocess.Popen(
                _box_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._errors,
                pass_fds=(theirs.fileno(),),
                env=_CLEAN_ENV,
            )
            keep_processes(self._process.pid)  # the episode's box outlives the call
        finally:
            theirs.close()
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(settings).encode())
        self._process.stdin.close()
        self._sock = ours
        self._pending = b""
        self._ending = False
        try:
            self._server_pid = int(self.request("ping", timeout=START_TIMEOUT)["pid"])
        except BoxError as exc:
            why = self._why()
            self.close()
            needs = (
                ""
                if IN_POD
                else ". terminal-bench needs unprivileged user namespaces inside "
                "the instance (the local engine gives them)"
            )
            raise BoxUnavailableError(
                f"the agent's box did not start: {why or exc}{needs}"
            ) from exc

    def _why(self) -> str:
        self._errors.seek(0)
        text: bytes = self._errors.read()
        return text[-2000:].decode(errors="replace").strip()

    @property
    def alive(self) -> bool:
        """Whether the box's process still runs."""
        return self._process.poll() is None

    def request(self, op: str, *, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one request; its answer (a dict), or :class:`BoxError` with the box's reason."""
        line = json.dumps({"op": op, **fields}).encode() + b"\n"
        try:
            self._sock.sendall(line)
        except OSError as exc:
            raise BoxDiedError(
                "the terminal's box is gone; the next call starts a new one"
            ) from exc
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise BoxDiedError(
                    f"the terminal did not answer within {timeout:g} s; it was reset"
                )
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                continue
            try:
                chunk = self._sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                raise BoxDiedError(_GONE)
            self._pending += chunk
            if len(self._pending) > MAX_REPLY:
                self.close()
                raise BoxDiedError("the terminal's box answered too much; it was reset")
        raw, self._pending = self._pending.split(b"\n", 1)
        try:
            reply = json.loads(raw)
        except ValueError as exc:
            self.close()
            raise BoxDiedError("the terminal's box answered garbage; it was reset") from exc
        if not isinstance(reply, dict):
            raise BoxDiedError("the terminal's box answered garbage")
        if not reply.get("ok"):
            raise BoxError(str(reply.get("error") or "the request failed"))
        return reply

    def end(self) -> list[dict[str, Any]]:
        """End the box and everything in it, as the judge needs it: every process frozen
        (``SIGSTOP``, until no new one appears), listed, then the box's pid 1 killed, which
        kills the rest of its pid namespace at once; returns once the namespace is empty (its
        pid 1 reaped). The processes the agent had, as ``{"pid", "command"}`` (the pid as the
        box saw it; the box's own pid 1 and server left out)."""
        found: list[dict[str, Any]] = []
        pid_1 = _children(self._process.pid)
        if self._process.poll() is None and pid_1:
            stopped: set[int] = set()
            for _ in range(FREEZE_ROUNDS):  # a stopped process forks no more: this ends
                fresh = [p for p in _descendants(pid_1[0]) if p not in stopped]
                if not fresh:
                    break
                for pid in fresh:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            ours = {pid_1[0]}
            for child in _children(pid_1[0]):
                seen = _process_info(child)
                if seen is not None and seen["pid"] == self._server_pid:
                    ours.add(child)
            for pid in sorted(stopped - ours):
                seen = _process_info(pid)
                if seen is not None:
                    found.append(seen)
            for pid in stopped:  # in a pod no pid namespace ends them with its pid 1
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid_1[0], signal.SIGKILL)
            try:  # the box's H waits for its pid 1, which waits for its namespace to be empty
                self._process.wait(timeout=END_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.warning("the agent's box did not end within %s s", END_TIMEOUT)
        self.close()
        return found

    def close(self) -> None:
        """End the box and everything in it."""
        if IN_POD and not self._ending and self._process.poll() is None:
            self._ending = True  # no pid namespace ends the rest with the box: each one, frozen
            self.end()
            return
        self._sock.close()
        if self._process.poll() is None:
            self._process.kill()  # its pid 1 dies with it (a parent-death signal), then the rest
        self._process.wait()
        self._errors.close()


class WarmPytest:
    """The instance's warm pytest (``_tb_pytest.py``): started once, it imports pytest while the
    agent works; each test run gets a socket to it (:meth:`socket_for_box`)."""

    def __init__(self) -> None:
        require_extra("builtins", "terminal-bench's graded tests (pytest)")
        ours, theirs = socket.socketpair()
        self._log = _log_file("pytest.log")
        try:
            # unconfined: it joins the agent's boxes' namespaces (runs nothing of the agent's
            # outside a box's pid namespace, where the runtime cannot be seen)
            with unconfined():
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-B", str(PYTEST)],
                    stdin=theirs.fileno(),
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    env={**_CLEAN_ENV, "TB_SITE_PACKAGES": PYTEST_SITE or ""},
                )
            keep_processes(self._process.pid)  # warm for the instance's later calls
        finally:
            theirs.close()
        self._control = ours

    @property
    def alive(self) -> bool:
        """Whether it still runs."""
        return self._process.poll() is None

    def socket_for_box(self) -> tuple[socket.socket, int] | None:
        """A socket whose other end it serves, and the read end of the judge's pipe, where it
        writes each pytest run's report (None when it is gone): the box's ``uv run pytest``
        asks on the socket; the box never holds the pipe."""
        if not self.alive:
            return None
        ours, theirs = socket.socketpair()
        # the kernel then says who sent each request, however soon the box asks
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        judge_read, judge_write = os.pipe()
        try:
            socket.send_fds(self._control, [b"{}"], [ours.fileno(), judge_write])
        except OSError:
            theirs.close()
            os.close(judge_read)
            return None
        finally:
            ours.close()
            os.close(judge_write)
        return theirs, judge_read

    def close(self) -> None:
        """Stop it."""
        self._control.close()
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._log.close()


def run_tests(task: Task, timeout: float, pytest: WarmPytest) -> TestRun:
    """Run the task's ``run-tests.sh`` in a grader's box (the judge's: fresh ``/tmp`` and
    ``/root``, emptied here), at most ``timeout`` seconds, with the warm ``pytest`` for its
    ``uv run pytest``; the run carries the reports of every pytest it ran (``reports``), read
    from the judge's pipe. :class:`JudgeUnavailableError` when the warm pytest is gone."""
    connected = pytest.socket_for_box()
    if connected is None:
        raise JudgeUnavailableError(
            "the instance's pytest is gone, so the judge would get no report of the tests: "
            "grade again (the next reward starts a new one)"
        )
    scratch = Path(tempfile.mkdtemp(prefix="judge-", dir=STATE))
    try:
        return _run_tests(task, timeout, connected, scratch)
    finally:
        _remove(scratch)


def _remove(path: Path) -> None:
    """Remove ``path`` and all in it, whatever modes the tests left on its directories."""

    def retry(function: Any, name: str, _: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
            function(name)

    shutil.rmtree(path, onerror=retry)


def _run_tests(
    task: Task, timeout: float, connected: tuple[socket.socket, int], scratch: Path
) -> TestRun:
    (scratch / "tmp").mkdir(mode=0o1777)
    (scratch / "tmp").chmod(0o1777)
    (scratch / "home").mkdir(mode=0o700)
    status_read, status_write = os.pipe()
    warm, judge_read = connected
    passed = [status_write, warm.fileno()]
    settings = _settings(
        "grader",
        tmp=scratch / "tmp",
        home=scratch / "home",
        tests_from=str(task.path),
        command=["bash", "/tests/run-tests.sh"],
        status_fd=status_write,
    )
    settings["env"]["TB_PYTEST_FD"] = str(warm.fileno())
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            _box_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=passed,
            env=_CLEAN_ENV,
        )
    except BaseException:
        os.close(judge_read)
        raise
    finally:
        os.close(status_write)
        warm.close()
    judge = bytearray()
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(json.dumps(settings).encode())
        process.stdin.close()
        output, timed_out = _collect(process, started + timeout, judge_read, judge)
        code = process.wait()
        ready = os.read(status_read, 16)
        _drain(judge_read, judge, time.monotonic() + END_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(status_read)
        os.close(judge_read)
    text = output.decode(errors="replace")
    if ready != b"ready" and not timed_out:
        raise BoxUnavailableError(f"the grader's box did not start: {text[-2000:].strip()}")
    return TestRun(
        output=text,
        exit_code=None if timed_out else code,
        seconds=time.monotonic() - started,
        timed_out=timed_out,
        reports=_reports(bytes(judge)),
    )


def _reports(data: bytes) -> tuple[dict[str, Any], ...]:
    """The judge's pipe's lines (one per pytest run, written by the warm pytest's forks)."""
    found = []
    for line in data.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            value = {"error": "a report line that is not JSON"}
        found.append(value if isinstance(value, dict) else {"error": "a report that is not one"})
    return tuple(found)


def _drain(fd: int, into: bytearray, deadline: float) -> None:
    """Read ``fd`` into ``into`` until its end (every writer gone) or ``deadline``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        if len(into) < MAX_JUDGE_REPORT:
            into += chunk


def _collect(
    process: subprocess.Popen[bytes], deadline: float, judge_fd: int, judge: bytearray
) -> tuple[bytes, bool]:
    """Everything ``process`` prints until it ends (its end: at most MAX_TEST_OUTPUT bytes),
    and whether it ran past ``deadline`` (then it is killed, with all of its box); what comes
    on ``judge_fd`` meanwhile goes into ``judge``."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    kept = bytearray()
    timed_out = False
    watched = [fd, judge_fd]
    while True:
        left = deadline - time.monotonic()
        if left <= 0 and not timed_out:
            timed_out = True
            process.send_signal(signal.SIGKILL)  # the box's pid 1 follows, then all of it
            deadline = time.monotonic() + 5.0
            continue
        if left <= 0:
            break
        ready, _, _ = select.select(watched, [], [], left)
        if judge_fd in ready:
            chunk = os.read(judge_fd, 1 << 16)
            if not chunk:
                watched.remove(judge_fd)
            elif len(judge) < MAX_JUDGE_REPORT:
                judge += chunk
        if fd not in ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        kept += chunk
        if len(kept) > MAX_TEST_OUTPUT:
            del kept[: len(kept) - MAX_TEST_OUTPUT]
    process.stdout.close()
    return bytes(kept), timed_out


# -- the episode ------------------------------------------------------------------------------


def _dataset() -> Path:
    return Path(os.environ.get("TB_DATASET_DIR") or "/data")


def _checked_name(name: str) -> str:
    parts = name.split("/")
    if not name or any(not p or p in (".", "..") or set(p) - _NAME_PART for p in parts):
        raise TaskNotFoundError(
            f"task `{name}` is not a task name (letters, digits, `.`, `_`, `-`, parts joined "
            "by `/`); call tb_tasks() for the names"
        )
    return name


def find_task(name: str | None) -> Task:
    """The task ``name`` of the dataset (or of the bundled demo tasks); without a name, the one
    ``TB_TASK_DIR`` names, else the datasource when it is a task itself."""
    if name is None:
        configured = os.environ.get("TB_TASK_DIR")
        if configured:
            return load_task(Path(configured))
        dataset = _dataset()
        if (dataset / "task.yaml").is_file():
            return load_task(dataset)
        raise NoTaskError(
            "no task: call tb_reset(task=NAME) (tb_tasks() lists them), or create the instance "
            "with TB_TASK_DIR or a datasource that is a task"
        )
    _checked_name(name)
    for root in (_dataset(), DEMO_TASKS):
        path = root / name
        if (path / "task.yaml").is_file():
            return load_task(path, name)
    raise TaskNotFoundError(
        f"no task `{name}` in {_dataset()} or the bundled demo tasks; tb_tasks() lists them"
    )


def all_task_names() -> dict[str, list[str]]:
    """The task names of the dataset and of the bundled demo tasks."""
    return {"dataset": task_names(_dataset()), "demo": task_names(DEMO_TASKS)}


@dataclass
class Episode:
    """One task's attempt: the task (or None), the agent's deadline, the agent's box."""

    task: Task | None = None
    agent_timeout: float | None = None
    test_timeout: float | None = None
    started: float = field(default_factory=time.monotonic)
    box: AgentBox | None = None
    timed_out: bool = False

    @property
    def deadline(self) -> float | None:
        """When the agent's time is up (monotonic clock), or None without a task."""
        return None if self.agent_timeout is None else self.started + self.agent_timeout

    def time_left(self) -> float | None:
        """Seconds the agent has left (None: no limit)."""
        deadline = self.deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def agent_box(self) -> AgentBox:
        """The running agent's box, started when there is none (or it died)."""
        if self.box is None or not self.box.alive:
            if self.box is not None:
                self.box.close()
            self.box = None
            self.box = AgentBox()
        return self.box

    def close(self) -> None:
        """End the agent's box."""
        if self.box is not None:
            self.box.close()
            self.box = None

    def end(self) -> list[dict[str, Any]]:
        """End the agent's box for the judge (:meth:`AgentBox.end`): the processes it had."""
        if self.box is None:
            return []
        try:
            return self.box.end()
        finally:
            self.box = None
