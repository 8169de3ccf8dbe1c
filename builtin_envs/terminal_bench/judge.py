"""terminal-bench's judge container: grades the agent's work where the agent cannot reach.

On Kubernetes a pod's container may not build the boxes terminal-bench builds on the local
engine (user, mount and pid namespaces). There the pod is the agent's box, and this runs as a
second container of the pod (``python -I -B -m builtin_envs.terminal_bench.judge``, the same
image as the runtime): its own pid namespace (the pod's default; no process of the agent's sees
it), the agent's workspace mounted read-only (``--workspace``), its own empty directories for
its copy of ``/app`` (``--app``), ``/tests`` (``--tests``) and ``/tmp`` (``--scratch``), the
task's tests from its own image (the bundled demo tasks, ``TB_DATASET_DIR`` or ``/data``).

It listens on one unix socket (``--socket``) and serves the **first** connection it accepts,
the runtime's (:mod:`builtin_envs.terminal_bench.judge_wire` is the protocol); every later one
is answered with a refusal and closed, so an agent's process that reaches the socket can
neither ask nor stall a grading. When the served connection closes, the judge ends.

A grading (:meth:`Judge.grade`), after the runtime ended every process of the agent's:

1. what a previous run left is ended (every process below the judge but its warm pytest: the
   judge is a child subreaper, so nothing the tests started escapes it) and the judge's
   ``/app``, ``/tests`` and scratch are emptied;
2. the workspace is copied as files (:func:`copy_files`): directories, regular files and the
   links that stay inside it; FIFOs, sockets and device nodes are left out (``removed``), links
   that lead out of it (resolved as the kernel would, through the copy's other links) removed
   (``links_out``); past :class:`CopyLimits` the copy stops and nothing runs (``over_limit``:
   the agent's doing, graded 0 by the runtime);
3. ``run-tests.sh`` and ``tests/`` of the task are copied into ``/tests``, and ``bash
   /tests/run-tests.sh`` runs in the copy with a fresh ``HOME`` and ``TMPDIR``, the offline
   ``apt-get``, ``curl`` and ``uv`` first on ``PATH`` and the environment given here (never the
   agent's); ``uv run pytest`` is served by a warm pytest that writes pytest's own report on a
   pipe only the judge reads (``reports``);
4. everything the run left is ended, and the answer goes back on the served connection:
   ``output`` (its end), ``exit_code``, ``timed_out``, ``seconds``, ``reports``, the copy's
   ``files``, ``bytes``, ``removed``, ``links_out`` and ``over_limit``, ``killed``.

The judge makes itself not dumpable (the programs the tests start, which run the agent's code
under the judge's user, cannot trace it or open its descriptors through ``/proc``) and keeps
its sockets out of every child.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from builtin_envs.terminal_bench.errors import TaskNotFoundError
from builtin_envs.terminal_bench.judge_wire import PROTOCOL, encode
from builtin_envs.terminal_bench.task import Task, load_task, task_names

__all__ = [
    "CopyLimits",
    "Handler",
    "Judge",
    "copy_files",
    "empty_dir",
    "end_below",
    "harden",
    "listen_and_serve",
    "main",
    "serve",
    "stop_on_sigterm",
]

LIBRARY = Path(__file__).resolve().parent
DEMO_TASKS = LIBRARY / "demo_tasks"
OFFLINE = LIBRARY / "offline"
PYTEST = LIBRARY / "src" / "_tb_pytest.py"
AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_OUTPUT = 4 << 20  # bytes of the test output kept (the end)
MAX_REPORTS = 16 << 20  # bytes of pytest's reports kept
MAX_REQUEST = 1 << 16
_NAME_PART = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class CopyLimits:
    """How much of the agent's workspace the judge copies: ``files`` (entries of any kind),
    ``bytes`` (the apparent size of the regular files: a sparse file of 1 TiB counts 1 TiB),
    ``depth`` (directories deep)."""

    files: int = 100_000
    bytes: int = 1 << 30
    depth: int = 64


class _OverLimit(Exception):
    def __init__(self, limit: str, cap: int, path: str) -> None:
        super().__init__(f"the workspace holds more than {cap} {limit} (at {path!r})")
        self.report = {"limit": limit, "cap": cap, "path": path}


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "unknown"


def _copy_regular(name: str, dir_fd: int, dest: str, room: int) -> int:
    """Copy the regular file ``name`` (of the directory ``dir_fd``) to ``dest``, refusing to
    follow a link or open anything else put there since it was listed; its size."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(0, "not a regular file any more")  # replaced while listed
        copied = 0
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                copied += len(chunk)
                if copied > room:
                    raise _OverLimit("bytes", room, name)
                os.write(out, chunk)
            os.fchmod(out, (stat.S_IMODE(status.st_mode) & 0o755) | 0o600)
        except OSError:
            os.unlink(dest)
            raise
        finally:
            os.close(out)
        return copied
    finally:
        os.close(fd)


def _stays_inside(copy_root: str, root: list[str], start: list[str], target: str) -> bool:
    """Whether the link target ``target``, read in the directory ``start`` (components from
    ``/`` as the agent saw them; the workspace is ``root``, copied at ``copy_root``), resolves
    inside the workspace as the kernel resolves it: through the copy's other links, ``..``
    after a link going up from where the link led. Conservative: a walk that passes anything
    but the workspace and the directories above it counts as leaving."""
    current = [] if target.startswith("/") else list(start)
    parts = target.split("/")[::-1]
    hops = 40
    while parts:
        name = parts.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if current:
                current.pop()
            continue
        current.append(name)
        if len(current) <= len(root):
            if current != root[: len(current)]:
                return False
            continue
        host = os.path.join(copy_root, *current[len(root) :])
        if os.path.islink(host):
            hops -= 1
            if hops < 0:
                return False
            link = os.readlink(host)
            current.pop()
            if link.startswith("/"):
                current = []
            parts.extend(link.split("/")[::-1])
    return len(current) >= len(root)


def copy_files(
    source: str,
    target: str,
    *,
    seen_as: str = "/app",
    limits: CopyLimits | None = None,
    skip: Collection[str] = (),
) -> dict[str, Any]:
    """Copy the workspace ``source`` into the empty directory ``target`` as files (see the
    module's docstring; the agent saw it at ``seen_as``): ``files``, ``bytes``, ``removed``
    (``{"path", "type"}``), ``links_out`` (``{"path", "target"}``, removed from the copy) and
    ``over_limit`` (``{"limit", "cap", "path"}`` or None: then the copy is incomplete).
    ``skip``: names of ``source``'s own entries not copied (swe's ``.git``). ``source`` itself
    must be a directory, not a link to one (:class:`OSError` otherwise)."""
    limits = limits or CopyLimits()
    removed: list[dict[str, str]] = []
    links: list[str] = []
    counts = {"files": 0, "entries": 0, "bytes": 0}
    top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    pending: list[tuple[int, str]] = [(top, "")]
    over: dict[str, Any] | None = None
    skipped = frozenset(skip)
    try:
        while pending:
            dir_fd, relative = pending.pop()
            try:
                _copy_directory(
                    dir_fd,
                    relative,
                    target,
                    limits,
                    counts,
                    pending,
                    removed,
                    links,
                    skipped if not relative else frozenset(),
                )
            finally:
                os.close(dir_fd)
    except _OverLimit as exc:
        over = exc.report
    finally:
        for dir_fd, _ in pending:
            os.close(dir_fd)
    root = [p for p in os.path.normpath(seen_as).split("/") if p]
    escaping = [
        rel
        for rel in links
        if not _stays_inside(
            target,
            root,
            root + [p for p in os.path.dirname(rel).split("/") if p],
            os.readlink(os.path.join(target, rel)),
        )
    ]
    links_out = []
    for rel in escaping:  # after the walk: a chain's every link judged with the others
        path = os.path.join(target, rel)
        links_out.append({"path": rel, "target": os.readlink(path)})
        os.unlink(path)
    return {
        "files": counts["files"],
        "bytes": counts["bytes"],
        "removed": removed,
        "links_out": links_out,
        "over_limit": over,
    }


def _copy_directory(
    dir_fd: int,
    relative: str,
    target: str,
    limits: CopyLimits,
    counts: dict[str, int],
    pending: list[tuple[int, str]],
    removed: list[dict[str, str]],
    links: list[str],
    skip: frozenset[str],
) -> None:
    depth = relative.count("/") + 1 if relative else 0
    if depth > limits.depth:
        raise _OverLimit("directories deep", limits.depth, relative)
    for entry in sorted(os.listdir(dir_fd)):
        if entry in skip:
            continue
        rel = os.path.join(relative, entry)
        counts["entries"] += 1
        if counts["entries"] > limits.files:
            raise _OverLimit("files and directories", limits.files, rel)
        try:
            _copy_entry(entry, rel, dir_fd, target, limits, counts, pending, removed, links)
        except OSError as exc:  # the agent's doing (a mode of 000, ...): left out, named
            removed.append({"path": rel, "type": f"unreadable ({exc.strerror})"})


def _copy_entry(
    entry: str,
    rel: str,
    dir_fd: int,
    target: str,
    limits: CopyLimits,
    counts: dict[str, int],
    pending: list[tuple[int, str]],
    removed: list[dict[str, str]],
    links: list[str],
) -> None:
    status = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
    dest = os.path.join(target, rel)
    if stat.S_ISDIR(status.st_mode):
        child = os.open(
            entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
        try:
            os.listdir(child)  # a directory it may open but not list: left out whole
            os.mkdir(dest, 0o755)
        except OSError:
            os.close(child)
            raise
        pending.append((child, rel))
    elif stat.S_ISREG(status.st_mode):
        room = limits.bytes - counts["bytes"]
        if status.st_size > room:
            raise _OverLimit("bytes", limits.bytes, rel)
        counts["bytes"] += _copy_regular(entry, dir_fd, dest, room)
        counts["files"] += 1
    elif stat.S_ISLNK(status.st_mode):
        os.symlink(os.readlink(entry, dir_fd=dir_fd), dest)
        links.append(rel)
    else:
        removed.append({"path": rel, "type": _kind(status.st_mode)})


def empty_dir(directory: Path, mode: int) -> None:
    """``directory`` exists, empty (whatever modes a run left on what it holds)."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in list(os.scandir(directory)):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(path)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(PermissionError):  # a pod's emptyDir is root's (mode 0777)
        directory.chmod(mode)


def _remove_tree(path: Path) -> None:
    def retry(function: Any, name: str, _: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
            function(name)

    shutil.rmtree(path, onerror=retry)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with (
            contextlib.suppress(OSError, ValueError),
            open(f"/proc/{pid}/task/{task}/children") as handle,
        ):
            found += [int(p) for p in handle.read().split()]
    return found


def _proc_self() -> int:
    """This process's pid as ``/proc`` numbers it."""
    return int(os.readlink("/proc/self"))


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read(4096).split(b"\0")
    except OSError:
        return ""
    return " ".join(a.decode(errors="replace") for a in argv if a)[:200]


def end_below(spare: Collection[int] = ()) -> list[dict[str, Any]]:
    """End every process below this one except the ``spare`` ones (whose own children are
    ended too): stopped first, again until no new one appears, then killed and reaped. What a
    grading's run left (a judge is a child subreaper, so nothing it started escapes it). Their
    pids and commands."""
    if _proc_self() != os.getpid():  # a /proc of another pid namespace: pids would lie
        raise RuntimeError("the judge's /proc is not its pid namespace's: mount its own")
    kept = set(spare)
    stopped: dict[int, str] = {}
    for _ in range(100):
        fresh = []
        todo = [p for p in _children(os.getpid()) if p not in kept]
        todo += [c for p in kept for c in _children(p)]
        while todo:
            pid = todo.pop()
            if pid not in stopped:
                fresh.append(pid)
            todo += _children(pid)
        if not fresh:
            break
        for pid in fresh:
            stopped[pid] = _command(pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in stopped:  # the subreaper's: reap them (ours, or orphans that came to us)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return [{"pid": pid, "command": cmd} for pid, cmd in sorted(stopped.items())]


class _WarmPytest:
    """``_tb_pytest.py --here``: pytest imported once; each run gets a socket to it and the
    judge keeps the read end of the pipe its report comes on."""

    def __init__(self, site: str) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.process = _popen(
                [sys.executable, "-I", "-B", str(PYTEST), "--here"],
                stdin=theirs.fileno(),
                env={"PATH": AGENT_PATH, "LANG": "C.UTF-8", "TB_SITE_PACKAGES": site},
            )
        finally:
            theirs.close()
        self._control = ours

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def socket_for_run(self) -> tuple[socket.socket, int] | None:
        if not self.alive:
            return None
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        report_read, report_write = os.pipe2(os.O_CLOEXEC)
        try:
            socket.send_fds(self._control, [b"{}"], [ours.fileno(), report_write])
        except OSError:
            theirs.close()
            os.close(report_read)
            return None
        finally:
            ours.close()
            os.close(report_write)
        return theirs, report_read

    def close(self) -> None:
        self._control.close()
        if self.alive:
            self.process.kill()
        self.process.wait()


def _popen(argv: list[str], **kwargs: Any) -> Any:
    import subprocess

    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=None, **kwargs)


def _pytest_site() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pytest")
    if spec is None or spec.origin is None:
        return ""
    return str(Path(spec.origin).resolve().parent.parent)


class Judge:
    """What the judge container does for the runtime's requests (see the module docstring).

    ``workspace``: the agent's work (read-only here); ``app``, ``tests``, ``scratch``: the
    judge's own directories (emptied at every grading; ``app`` is where the copy goes and the
    tests run, the agent saw its work at ``seen_as``); ``datasets``: where tasks are looked
    up by name, in order."""

    def __init__(
        self,
        *,
        workspace: str,
        app: str,
        tests: str,
        scratch: str,
        datasets: Sequence[Path],
        seen_as: str = "/app",
        limits: CopyLimits | None = None,
    ) -> None:
        self.workspace, self.app, self.tests = workspace, Path(app), Path(tests)
        self.scratch, self.datasets, self.seen_as = Path(scratch), list(datasets), seen_as
        self.limits = limits or CopyLimits()
        self._site = _pytest_site()
        self._pytest: _WarmPytest | None = None
        self.busy = False  # a grading runs (the tests, the agent's code among them)
        self.stop_after = False  # asked to stop during one: stop once it is answered

    def _warm(self) -> _WarmPytest:
        if self._pytest is None or not self._pytest.alive:
            if self._pytest is not None:
                self._pytest.close()
            self._pytest = _WarmPytest(self._site)
        return self._pytest

    def find(self, name: str) -> Task:
        """The task ``name`` of the first dataset that has it, else ``TB_TASK_DIR``'s when it
        is named so (or ``name`` is empty); :class:`TaskNotFoundError`."""
        configured = os.environ.get("TB_TASK_DIR")
        if configured and name in ("", Path(configured).name):
            fixed = load_task(Path(configured))
            if not name or not any((root / name / "task.yaml").is_file() for root in self.datasets):
                return fixed
        if not name:
            raise TaskNotFoundError("no task named, and no TB_TASK_DIR in the judge container")
        parts = name.split("/")
        if not name or any(not p or p in (".", "..") or set(p) - _NAME_PART for p in parts):
            raise TaskNotFoundError(f"task `{name}` is not a task name")
        for root in self.datasets:
            if (root / name / "task.yaml").is_file():
                return load_task(root / name, name)
        raise TaskNotFoundError(f"no task `{name}` in the judge's datasets; tb_tasks() lists them")

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request (``ok`` and its fields, or ``ok: false`` and ``error``)."""
        op = request.get("op")
        try:
            if op == "ping":
                return {"ok": True, "pid": os.getpid()}
            if op == "tasks":
                names = [task_names(root) for root in self.datasets]
                return {
                    "ok": True,
                    "dataset": [n for ns in names[1:] for n in ns],
                    "demo": names[0] if names else [],
                }
            if op == "task":
                task = self.find(str(request.get("name") or ""))
                return {"ok": True, **task.public(), "invalid": task.invalid}
            if op == "solution":
                task = self.find(str(request.get("name") or ""))
                if not task.solution.is_file():
                    raise FileNotFoundError(f"task {task.name} has no solution.sh")
                return {"ok": True, "script": task.solution.read_text(errors="replace")}
            if op == "grade":
                task = self.find(str(request.get("name") or ""))
                timeout = float(request.get("seconds") or task.max_test_timeout_sec)
                self.busy = True
                try:
                    return {"ok": True, **self.grade(task, timeout)}
                finally:
                    self.busy = False
            raise ValueError(f"unknown request {op!r}")
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def end_leftovers(self) -> list[dict[str, Any]]:
        """End every process below the judge but its warm pytest (:func:`end_below`): what a
        run left. Their pids and commands."""
        return end_below({self._pytest.process.pid} if self._pytest is not None else set())

    def grade(self, task: Task, timeout: float) -> dict[str, Any]:
        """Copy the work, run the task's tests on the copy (see the module docstring)."""
        killed = self.end_leftovers()
        empty_dir(self.app, 0o755)
        empty_dir(self.tests, 0o755)
        empty_dir(self.scratch, 0o1777)
        copy = copy_files(self.workspace, str(self.app), seen_as=self.seen_as, limits=self.limits)
        result: dict[str, Any] = {
            "copy": copy,
            "killed_before": killed,
            "tests_dir": str(self.tests),
        }
        if copy["over_limit"] is not None or task.invalid is not None:
            return {**result, "ran": False}
        script = task.path / "run-tests.sh"
        shutil.copy2(script, self.tests / "run-tests.sh")
        if (task.path / "tests").is_dir():  # entry by entry: a pod's /tests itself is root's
            for entry in (task.path / "tests").iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, self.tests / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, self.tests / entry.name, follow_symlinks=False)
        home = self.scratch / ".home"
        home.mkdir(mode=0o700)
        run = self._run(timeout, home)
        return {**result, "ran": True, **run, "killed_after": self.end_leftovers()}

    def _env(self, home: Path, pytest_fd: int) -> dict[str, str]:
        return {
            "PATH": f"{OFFLINE}/bin:{AGENT_PATH}",
            "HOME": str(home),
            "TMPDIR": str(self.scratch),
            "USER": "root",
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "TEST_DIR": str(self.tests),
            "PWD": str(self.app),
            "TB_OFFLINE": str(OFFLINE),
            "TB_PYTHON": sys.executable,
            "TB_SITE_PACKAGES": self._site,
            "TB_PYTEST_FD": str(pytest_fd),
            "COLUMNS": "160",
            "LINES": "40",
            "DEBIAN_FRONTEND": "noninteractive",
        }

    def _run(self, timeout: float, home: Path) -> dict[str, Any]:
        import subprocess

        connected = self._warm().socket_for_run()
        if connected is None:
            raise RuntimeError("the judge's pytest is gone; grade again")
        warm, report_fd = connected
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                ["bash", str(self.tests / "run-tests.sh")],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=self.app,
                env=self._env(home, warm.fileno()),
                pass_fds=(warm.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            os.close(report_fd)
            raise
        finally:
            warm.close()
        try:
            output, reports, timed_out = _collect(process, started + timeout, report_fd)
        finally:
            os.close(report_fd)
        code = process.wait()
        return {
            "output": output.decode(errors="replace"),
            "exit_code": None if timed_out else code,
            "timed_out": timed_out,
            "seconds": time.monotonic() - started,
            "reports": _reports(reports),
        }

    def close(self) -> None:
        """Stop the warm pytest and what runs below the judge."""
        self.end_leftovers()
        if self._pytest is not None:
            self._pytest.close()


def _collect(process: Any, deadline: float, report_fd: int) -> tuple[bytes, bytes, bool]:
    """What ``process`` prints until it ends (its end kept) and what comes on ``report_fd``
    until the run's pytest closed it; past ``deadline`` the run's session is killed."""
    out_fd = process.stdout.fileno()
    kept, reports = bytearray(), bytearray()
    timed_out = False
    watched = {out_fd, report_fd}
    with selectors.DefaultSelector() as selector:
        for fd in watched:
            selector.register(fd, selectors.EVENT_READ)
        while out_fd in watched:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    watched.discard(int(key.fd))
                elif key.fd == out_fd:
                    kept += chunk
                    del kept[: max(0, len(kept) - MAX_OUTPUT)]
                elif len(reports) < MAX_REPORTS:
                    reports += chunk
    process.stdout.close()
    os.set_blocking(report_fd, False)
    with contextlib.suppress(BlockingIOError):  # a report written as the run ended
        while chunk := os.read(report_fd, 1 << 16):
            if len(reports) < MAX_REPORTS:
                reports += chunk
    return bytes(kept), bytes(reports), timed_out


def _reports(data: bytes) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for line in data.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            value = {"error": "a report line that is not JSON"}
        found.append(value if isinstance(value, dict) else {"error": "a report that is not one"})
    return found


_REFUSAL = {
    "ok": False,
    "refused": True,
    "error": "the judge serves one connection, the runtime's, which is already open",
}


class Handler(Protocol):
    """What :func:`serve` serves: terminal-bench's :class:`Judge`, swe's judge
    (:mod:`builtin_envs.swe.judge`). ``busy`` while a grading runs, ``stop_after`` once asked
    to stop during one (see :func:`stop_on_sigterm`)."""

    busy: bool
    stop_after: bool

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request."""
        ...

    def close(self) -> None:
        """End what runs below the judge."""
        ...


def serve(listener: socket.socket, judge: Handler, *, hello: str = "terminal-bench judge") -> None:
    """Serve the first connection ``listener`` accepts until it closes (its first line says
    ``hello``); refuse every other."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    served: socket.socket | None = None
    pending = b""
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is listener:
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    if served is None:
                        served = conn
                        served.sendall(
                            encode(
                                {
                                    "ok": True,
                                    "hello": hello,
                                    "protocol": PROTOCOL,
                                    "pid": os.getpid(),
                                }
                            )
                        )
                        selector.register(served, selectors.EVENT_READ)
                    else:
                        conn.setblocking(False)
                        with contextlib.suppress(OSError):
                            conn.send(encode(_REFUSAL))
                        conn.close()
                    continue
                assert served is not None
                chunk = served.recv(1 << 16)
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    try:
                        request = json.loads(line)
                        if not isinstance(request, dict):
                            raise ValueError("not an object")
                    except ValueError:
                        answer: dict[str, Any] = {
                            "ok": False,
                            "error": "a request is one JSON object",
                        }
                    else:
                        answer = judge.handle(request)
                    served.sendall(encode(answer))
                    if judge.stop_after:
                        return
                if len(pending) > MAX_REQUEST:
                    return
    finally:
        selector.close()
        if served is not None:
            served.close()


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def stop_on_sigterm(judge: Handler) -> None:
    """``SIGTERM`` (the kubelet's, when the pod is deleted) ends the judge at once when it is
    idle, else once the grading under way is answered: a process of the tests (the agent's
    code, which may signal the container's pid 1 once it has a handler) can end the judge
    after an honest answer, never change one."""

    def stop(signum: int, frame: object) -> None:
        if not judge.busy:
            raise SystemExit(0)
        judge.stop_after = True

    signal.signal(signal.SIGTERM, stop)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -I -B -m builtin_envs.terminal_bench.judge --socket PATH --workspace DIR``."""
    parser = argparse.ArgumentParser(
        prog="terminal-bench judge", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--socket", required=True, help="the unix socket to listen on")
    parser.add_argument("--workspace", required=True, help="the agent's work (read-only)")
    parser.add_argument("--app", default="/app", help="the judge's copy (emptied)")
    parser.add_argument("--tests", default="/tests", help="the task's tests (emptied)")
    parser.add_argument("--scratch", default="/tmp", help="the runs' TMPDIR and HOME (emptied)")
    parser.add_argument("--seen-as", default="/app", help="where the agent saw its work")
    parser.add_argument("--dataset", action="append", default=[], help="a directory of tasks")
    parser.add_argument("--max-bytes", type=int, default=CopyLimits.bytes)
    parser.add_argument("--max-files", type=int, default=CopyLimits.files)
    args = parser.parse_args(argv)
    harden("terminal-bench judge")
    datasets = [DEMO_TASKS, *(Path(d) for d in args.dataset)]
    if not args.dataset:
        datasets.append(Path(os.environ.get("TB_DATASET_DIR") or "/data"))
    judge = Judge(
        workspace=args.workspace,
        app=args.app,
        tests=args.tests,
        scratch=args.scratch,
        datasets=datasets,
        seen_as=args.seen_as,
        limits=CopyLimits(files=args.max_files, bytes=args.max_bytes),
    )
    listen_and_serve(args.socket, judge, hello="terminal-bench judge")


def harden(prog: str) -> None:
    """What a judge does first: refuse a ``/proc`` of another pid namespace (exit 2), become
    not dumpable and a child subreaper, ignore ``SIGPIPE``."""
    if _proc_self() != os.getpid():
        print(f"{prog}: /proc is another pid namespace's; mount its own", file=sys.stderr)
        raise SystemExit(2)
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def listen_and_serve(path: str, judge: Handler, *, hello: str) -> None:
    """Listen on the unix socket ``path`` and :func:`serve` ``judge`` there (``SIGTERM`` as
    :func:`stop_on_sigterm` says); close the judge when the served connection ends."""
    stop_on_sigterm(judge)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print(f"{hello}: listening on {path}", file=sys.stderr, flush=True)
    try:
        serve(listener, judge, hello=hello)
    finally:
        listener.close()
        judge.close()


if __name__ == "__main__":
    main()
