"""A warm pytest for the grader's boxes: the offline ``uv run pytest`` starts its pytest here.

Importing pytest takes most of a test run's time (0.5-2 s). This process, one per instance
(started by the runtime with nothing of its environment), imports it once. For each test run,
the runtime hands it one end of a socket whose other end goes into the grader's box. When the
offline ``uv`` asks there (its argv, working directory, environment and umask, with its stdin,
stdout and stderr passed along), the kernel says which process sent the request; its
namespaces are opened at once (refused when it shares this process's user namespace: only a
box's processes ask). A fork joins its pid, ipc, user and mount namespaces (joining the user
namespace leaves no capability over this one), forks again into the box's pid namespace, and
there becomes ``pytest ARGS`` as its console script would run: the box's files, environment
and descriptors, pytest's own plugins only. The first fork waits for it and answers its exit
status. Nothing of the box's is trusted: whatever it sends only shapes a process inside it.

The judge's channel: with each box's socket the runtime hands over the write end of a pipe
that only this process and its forks hold. pytest runs with :class:`JudgeReport` loaded as a
plugin object (not by name: nothing on the box's ``sys.path`` can stand in for it), which
writes pytest's own per-test outcomes to a pipe of the first fork's (fd 3 of pytest, closed on
exec: the programs the tests start do not inherit it); the first fork reads it, waits for
pytest's exit, and writes one JSON line to the runtime's pipe: ``{"report": ..., "exit": N}``
(``signal`` when pytest was killed). The box never holds the runtime's pipe.

Run as a script (``python -I -B _tb_pytest.py``) with the runtime's control socket as stdin.
With ``--here`` (terminal-bench's judge container on Kubernetes, where the test run is not in a
box but in the judge's own container) a request is served without joining any namespace: the
fork becomes pytest where it is, with the sender's descriptors, directory and environment.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MAX_REQUEST = 1 << 20
MAX_REPORT = 8 << 20  # bytes of one pytest run's report
REPORT_FD = 3  # pytest's end of the report pipe
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, kind: int, what: str) -> None:
    if _libc.setns(ctypes.c_int(fd), ctypes.c_int(kind)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns({what}): {os.strerror(errno)}")


def warm() -> None:
    """Import pytest, and what its ``main`` imports on top (the debugger's modules, pytest's
    own plugins: each run would import them again in its fork), then freeze what is there out
    of the garbage collector's sight: pytest collects at the end of every run (several passes),
    which in a fork would walk, and so copy, every object imported here."""
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import email.parser  # noqa: F401
    import faulthandler  # noqa: F401
    import gc
    import importlib
    import pdb  # noqa: F401

    import pytest  # noqa: F401
    from _pytest.config import default_plugins, essential_plugins

    for name in ("_argcomplete", *essential_plugins, *default_plugins):
        with contextlib.suppress(ImportError):  # then the run imports it, and says why not
            importlib.import_module(f"_pytest.{name}")
    gc.collect()
    gc.freeze()


def _namespaces(pid: int) -> list[tuple[int, int, str]]:
    """The namespaces of process ``pid`` (the one that sent a request), opened; refused when it
    shares this process's user namespace: only a box's processes may ask."""
    opened: list[tuple[int, int, str]] = []
    try:
        # pid and ipc first: after joining the user namespace nothing of ours may be joined
        for name, kind in (
            ("pid", CLONE_NEWPID),
            ("ipc", CLONE_NEWIPC),
            ("user", CLONE_NEWUSER),
            ("mnt", CLONE_NEWNS),
        ):
            fd = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            opened.append((fd, kind, name))
        user = next(fd for fd, _, name in opened if name == "user")
        if os.fstat(user).st_ino == os.stat("/proc/self/ns/user").st_ino:
            raise PermissionError(f"process {pid} is not in a box")
    except BaseException:
        for fd, _, _ in opened:
            os.close(fd)
        raise
    return opened


class JudgeReport:
    """A pytest plugin object: what pytest collected and each test's outcome, written as one
    JSON object to ``fd`` when the session ends (``collected``: node ids, paths and markers;
    ``outcomes``: ``passed``, ``failed``, ``error``, ``skipped``, ``xfail``, ``xpass`` per node
    id, with the phase a skip came from; ``collect_errors``; ``exitstatus``)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.collected: list[dict[str, object]] = []
        self.outcomes: dict[str, dict[str, str]] = {}
        self.collect_errors: list[str] = []
        self.raised: set[tuple[str, str]] = set()  # (node id, phase) whose code raised

    def saw_call(self, nodeid: str, when: str, raised: bool) -> None:
        """What a phase of a test really did, before any report was made of it (from
        :func:`_raw_outcomes`): whether it raised (a skip aside)."""
        if raised:
            self.raised.add((nodeid, when))

    def pytest_collectreport(self, report: object) -> None:
        if getattr(report, "failed", False):
            self.collect_errors.append(str(getattr(report, "nodeid", "")))

    def pytest_collection_finish(self, session: object) -> None:
        for item in getattr(session, "items", []):
            marks = sorted({m.name for m in item.iter_markers()} & {"skip", "skipif", "xfail"})
            self.collected.append({"nodeid": item.nodeid, "path": str(item.path), "marks": marks})

    def pytest_runtest_logreport(self, report: object) -> None:
        when = str(getattr(report, "when", ""))
        outcome = str(getattr(report, "outcome", ""))
        xfail = hasattr(report, "wasxfail")
        if outcome == "passed":
            status = "xpass" if xfail and when == "call" else "passed"
        elif outcome == "skipped":
            status = "xfail" if xfail else "skipped"
        else:
            status = "failed" if when == "call" else "error"
        nodeid = str(getattr(report, "nodeid", ""))
        if outcome == "passed" and (nodeid, when) in self.raised:
            status = "altered"  # it raised, and its report says it passed
        known = self.outcomes.get(nodeid)
        worse = status != "passed" and known is not None and known["status"] in ("passed", "xpass")
        if known is None or worse or status in ("error", "altered"):  # a teardown's error wins
            self.outcomes[nodeid] = {"status": status, "when": when}

    def pytest_sessionfinish(self, session: object, exitstatus: object) -> None:
        data = {
            "collected": self.collected,
            "outcomes": self.outcomes,
            "collect_errors": self.collect_errors,
            "exitstatus": int(exitstatus),  # type: ignore[call-overload]
        }
        with contextlib.suppress(OSError):
            view = memoryview(json.dumps(data).encode())
            while view:
                view = view[os.write(self._fd, view) :]
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _raw_outcomes(judge: JudgeReport) -> object:
    """A plugin whose outermost ``pytest_runtest_makereport`` wrapper tells ``judge`` whether
    each phase's code raised (``call.excinfo``, which the report is made from): a report that
    says passed for a phase that raised was altered after it was made (a plugin or a patch in
    pytest's process that rewrites outcomes)."""
    import pytest

    class RawOutcomes:
        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
            report = yield
            excinfo = call.excinfo
            raised = excinfo is not None and not excinfo.errisinstance(pytest.skip.Exception)
            judge.saw_call(item.nodeid, call.when, raised)
            return report

    return RawOutcomes()


PR_SET_DUMPABLE = 4
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_SYS_PTRACE = 19
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def out_of_the_tests_reach() -> None:
    """Put this process (pytest, in the box) out of reach of the programs its tests start:
    ``CAP_SYS_PTRACE`` dropped from every capability set (bounding, ambient, inheritable,
    permitted, effective: no program started from here, nor a fork of it, has it again) and
    the process made not dumpable. A program of the tests (the agent's, run in a subprocess)
    then cannot ptrace pytest, nor open its descriptors through ``/proc/PID/fd`` (the judge's
    report pipe, pytest's output), nor read or write its memory: the kernel asks for
    ``CAP_SYS_PTRACE`` over a process that is not dumpable. Code pytest imports runs in pytest's
    own process: nothing here stops it (docs/security.md)."""
    if _libc.prctl(ctypes.c_int(PR_CAPBSET_READ), ctypes.c_ulong(CAP_SYS_PTRACE), 0, 0, 0) != 0:
        _prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE)  # (a pod's container has none to drop)
    with contextlib.suppress(OSError):  # a kernel without ambient capabilities has none
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capget: {os.strerror(errno)}")
    keep = ~(1 << CAP_SYS_PTRACE) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if _libc.capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")
    _prctl(PR_SET_DUMPABLE, 0)


def _run_pytest(request: dict[str, object]) -> int:
    """In the box: become ``pytest ARGS`` as its console script runs it; its exit status."""
    env = {str(k): str(v) for k, v in dict(request.get("env") or {}).items()}  # type: ignore[call-overload]
    os.environ.clear()
    os.environ.update(env)
    os.environ.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    os.umask(int(request.get("umask") or 0o022))  # type: ignore[call-overload]
    os.chdir(str(request.get("cwd") or "/"))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [os.path.dirname(sys.executable), *extra]
    sys.argv = ["pytest", *[str(a) for a in request.get("argv") or []]]  # type: ignore[attr-defined]
    sys.stdin = os.fdopen(0, "r", closefd=False)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    sys.stderr = os.fdopen(2, "w", closefd=False)
    import pytest

    try:
        judge = JudgeReport(REPORT_FD)
        code = int(pytest.main(plugins=[judge, _raw_outcomes(judge)]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _read_report(fd: int, child: int) -> bytes:
    """What pytest (process ``child``) writes on ``fd`` until it exits or closes it (at most
    MAX_REPORT bytes): a process of the tests that kept the pipe open does not hold it up."""
    data = bytearray()
    pidfd = os.pidfd_open(child)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            selector.register(pidfd, selectors.EVENT_READ)
            exited = False
            while True:
                ready = {key.fd for key, _ in selector.select(0 if exited else None)}
                if fd in ready:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    if len(data) < MAX_REPORT:
                        data += chunk
                    continue
                if exited:
                    break
                if pidfd in ready:
                    exited = True
                    os.set_blocking(fd, False)
    finally:
        os.close(pidfd)
    return bytes(data[:MAX_REPORT])


def _serve_one(
    sock: socket.socket,
    namespaces: list[tuple[int, int, str]],
    request: dict[str, object],
    fds: list[int],
    judge: int,
) -> None:
    """In a fork of this process: join the box, start pytest there, write its report and exit
    status to the runtime's ``judge`` pipe, answer its exit status."""
    code = 1
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this one waits for its child
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    verdict: dict[str, object] = {"report": None, "exit": None}
    try:
        for fd, kind, name in namespaces:
            _setns(fd, kind, name)
        report_read, report_write = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                for target, fd in enumerate(fds[:3]):
                    os.dup2(fd, target)
                os.dup2(report_write, REPORT_FD, inheritable=False)
                os.closerange(REPORT_FD + 1, 1 << 16)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                out_of_the_tests_reach()
                os._exit(_run_pytest(request) & 0xFF)
            except BaseException as exc:
                os.write(2, f"terminal-bench pytest: {type(exc).__name__}: {exc}\n".encode())
                os._exit(4)
        os.close(report_write)
        for fd in fds:
            os.close(fd)
        raw = _read_report(report_read, child)
        os.close(report_read)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        verdict["exit"] = code
        if code < 0:
            verdict["signal"] = -code
        code = code if code >= 0 else 128 - code
        try:
            verdict["report"] = json.loads(raw) if raw else None
        except ValueError:
            verdict["report_error"] = "pytest's report is not JSON"
    except BaseException as exc:
        os.write(2, f"terminal-bench pytest: {type(exc).__name__}: {exc}\n".encode())
        verdict["error"] = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):
        view = memoryview(json.dumps(verdict).encode() + b"\n")
        while view:
            view = view[os.write(judge, view) :]
    try:
        sock.sendall(json.dumps({"code": code}).encode() + b"\n")
    finally:
        os._exit(0)


_UCRED = struct.Struct("3i")  # pid, uid, gid


def _receive(sock: socket.socket) -> tuple[dict[str, object], list[int], int] | None:
    """One request of a box (a JSON object, its stdin, stdout and stderr) and the pid of the
    process that sent it (the kernel's, in this pid namespace); None when the box is gone."""
    try:
        data, ancillary, _, _ = sock.recvmsg(
            MAX_REQUEST, socket.CMSG_SPACE(3 * 4) + socket.CMSG_SPACE(_UCRED.size)
        )
    except OSError:
        return None
    fds: list[int] = []
    pid = 0
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(array.array("i", payload[:usable]))
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = _UCRED.unpack(payload[: _UCRED.size])[0]
    try:
        request = json.loads(data) if data else None
        if not isinstance(request, dict) or len(fds) != 3 or pid <= 0:
            raise ValueError("a request is one JSON object with stdin, stdout and stderr")
    except ValueError:
        for fd in fds:
            os.close(fd)
        return None
    return request, fds, pid


def serve(control: socket.socket, *, here: bool = False) -> None:
    """Take boxes' sockets (each with the runtime's judge pipe) from the runtime and requests
    from the boxes until the runtime goes (``here``: requests of this process's own namespaces,
    served there)."""
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, None)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the forks are reaped by the kernel
    while True:
        for key, _ in selector.select():
            data: tuple[socket.socket, int] | None = key.data
            if data is None:
                try:
                    message, fds, _, _ = socket.recv_fds(control, 4096, 2)
                except OSError:
                    return
                if not message:
                    return
                if len(fds) != 2:
                    for fd in fds:
                        os.close(fd)
                    continue
                box = socket.socket(fileno=fds[0])
                box.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                selector.register(box, selectors.EVENT_READ, (box, fds[1]))
                continue
            sock, judge = data
            received = _receive(sock)
            if received is None:  # the box is gone, or it broke the protocol
                selector.unregister(sock)
                sock.close()
                os.close(judge)
                continue
            request, fds, pid = received
            try:
                namespaces = [] if here else _namespaces(pid)
            except OSError:
                namespaces = []
            if (namespaces or here) and os.fork() == 0:
                control.close()
                _serve_one(sock, namespaces, request, fds, judge)
            for fd in [*fds, *(n[0] for n in namespaces)]:
                os.close(fd)
            if not namespaces and not here:
                selector.unregister(sock)
                sock.close()
                os.close(judge)


def main() -> None:
    site = os.environ.get("TB_SITE_PACKAGES")
    if site and site not in sys.path:  # pytest's directory, when -I leaves it out
        sys.path.append(site)
    control = socket.socket(fileno=os.dup(0))
    os.close(0)
    os.open("/dev/null", os.O_RDONLY)
    warm()
    serve(control, here="--here" in sys.argv[1:])


if __name__ == "__main__":
    main()
