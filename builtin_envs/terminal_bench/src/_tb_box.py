"""A box: where the agent's commands (or a task's tests) run, inside an instance.

Run by the runtime as a script (``python -I -S -B _tb_box.py``, standard library only) with its
settings as one JSON object on stdin. As root of the instance's user namespace it builds a new
root file system of only what the settings name (the system's directories and Python read-only,
``/app``, ``/tmp`` and ``/root`` read-write, ``/tests`` read-only for the grader), pivots into
it and detaches the old one, then starts pid 1 of a new pid namespace, which mounts its
``/proc`` and drops into a user namespace of its own: every mount is then locked (it cannot be
unmounted to reveal what it covers, nor made writable), the box has no capability over the
runtime's namespaces, and it sees none of the runtime's processes. The task directory, the
dataset (``/data``) and the runtime's files are simply not in the box.

Modes:

- ``agent``: pid 1 forks the box's server, which answers the runtime's requests (one JSON line
  each way, on the socket given as ``fd``): ``run`` a command, ``read``/``write`` a file,
  ``keys``/``screen`` of the tmux session. Pid 1 reaps orphans and exits with the server; the
  kernel then kills everything left in the box.
- ``grader``: ``/tests`` holds the task's ``run-tests.sh`` and ``tests/``; pid 1 runs
  ``command`` (stdout and stderr are the runtime's pipe) and exits with its status.

With ``"pod": true`` (a Kubernetes pod, whose container may not make namespaces: the pod is
the agent's box there, and the tests run in the pod's judge container) no root is built: pid 1
is a plain process, a child subreaper (nothing the agent starts escapes below it), which
serves as above in the workspace and ends everything below it when its server ends.

Whatever runs in the box can take the server over (it is the agent's own): the runtime trusts
nothing it answers beyond its size.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess
# ``subprocess`` and ``shutil`` are imported where used: a grader's box copies the tests
# (``shutil``) and runs its command by exec, an agent's box starts commands (``subprocess``) only
# when asked; each box is a fresh Python, whose start is most of a box's cost.

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_SCRATCH = ("/data", "/storage", "/workspace")  # an empty mount point of the instance's root
MAX_READ = 4 << 20
TMUX_SESSION = "main"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            None if source is None else source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _kept_flags(path: str) -> int:
    """The flags of ``path``'s mount that a remount must repeat (a user namespace may not clear
    them)."""
    found = os.statvfs(path).f_flag
    pairs = (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    )
    return sum(flag for st, flag in pairs if found & st)


def _bind(source: str, target: str, *, writable: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if not writable:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | _kept_flags(target)
        _mount(None, target, None, flags)


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _pivot_root(new_root: str, put_old: str) -> None:
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(38, f"pivot_root: unsupported machine {os.uname().machine}")
    _check(_libc.syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()), "pivot_root")


def _within(path: str, root: str) -> bool:
    """``path`` (under ``root``) names itself: no symbolic link on the way (a directory of
    ``/root`` or ``/tmp`` the agent replaced with a link would move a mount elsewhere)."""
    return os.path.realpath(path) == os.path.normpath(path) and path.startswith(root + "/")


def _copy_tests(task: str, into: str) -> None:
    """``run-tests.sh`` and the contents of ``tests/`` into ``into``, as Terminal-Bench's
    harness copies them to ``/tests``."""
    import shutil

    script = os.path.join(task, "run-tests.sh")
    if os.path.isfile(script):
        shutil.copy2(script, into)
    tests = os.path.join(task, "tests")
    if os.path.isdir(tests):
        shutil.copytree(tests, into, symlinks=True, dirs_exist_ok=True)


def _make_dev(dev: str) -> None:
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{dev}/{name}", "w").close()
            _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for link, to in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(to, f"{dev}/{link}")
    os.mkdir(f"{dev}/pts")
    _mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666")
    os.mkdir(f"{dev}/shm")
    _mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=67108864")


def build_root(settings: dict[str, object]) -> None:
    """A new mount namespace whose root holds only what ``settings`` name; the old root gone."""
    _unshare(CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    listed: list[list[Any]] = settings["binds"]  # type: ignore[assignment]
    binds = sorted(listed, key=lambda b: str(b[1]).count("/"))
    task = settings.get("tests_from")
    # everything is opened before the new root covers its mount point (it may be among them)
    sources = [os.open(b[0], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for b in binds]
    tests = os.open(str(task), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if task else None
    new = next(p for p in _SCRATCH if os.path.isdir(p))
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1048576")
    for name, target in settings.get("links", {}).items():  # type: ignore[attr-defined]
        os.symlink(target, f"{new}/{name}")
    for (_, target, writable), source in zip(binds, sources, strict=True):
        path = new + target
        os.makedirs(path, exist_ok=True)
        if _within(path, new):
            _bind(f"/proc/self/fd/{source}", path, writable=bool(writable))
        os.close(source)
    for hidden in settings.get("hide", []):  # type: ignore[attr-defined]
        path = new + str(hidden)
        if os.path.isdir(path) and _within(path, new):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4096,mode=555")
    os.mkdir(f"{new}/dev")
    _make_dev(f"{new}/dev")
    os.mkdir(f"{new}/proc")  # the instance's, fully visible: a box may mount its own on it
    _mount("/proc", f"{new}/proc", None, MS_BIND | MS_REC)
    if tests is not None:  # last: nothing bound later can cover it
        os.mkdir(f"{new}/tests")
        _mount("tmpfs", f"{new}/tests", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=268435456")
        _copy_tests(f"/proc/self/fd/{tests}", f"{new}/tests")
        os.close(tests)
        # read-only, and locked so: what the tests run cannot rewrite them (nor what they read)
        _mount(None, f"{new}/tests", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.mkdir(f"{new}/.old")
    _pivot_root(new, f"{new}/.old")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "detaching the old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags("/"))


def become_box_root() -> None:
    """In pid 1 of the new pid namespace: its ``/proc``, then a user namespace of its own."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _unshare(CLONE_NEWUSER | CLONE_NEWNS)
    for name, text in (("setgroups", "deny"), ("uid_map", "0 0 1"), ("gid_map", "0 0 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)


# -- the agent's server ---------------------------------------------------------------------


def _output_of(proc: subprocess.Popen[bytes], deadline: float, limit: int) -> tuple[bytes, int]:
    """What ``proc`` writes until it exits (or the deadline), at most ``limit`` bytes kept (the
    head and the tail); the bytes dropped in between."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    head, tail, dropped = bytearray(), bytearray(), 0
    exited_at: float | None = None
    while True:
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.05:  # background children keep it open
            break
        if exited_at is None and now >= deadline:
            break
        ready, _, _ = select.select([fd], [], [], 0.02 if exited_at else min(0.2, deadline - now))
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            if exited_at is None:
                proc.wait(max(0.0, deadline - time.monotonic()))
            break
        if len(head) < limit // 2:
            take = limit // 2 - len(head)
            head += chunk[:take]
            chunk = chunk[take:]
        tail += chunk
        if len(tail) > limit // 2:
            dropped += len(tail) - limit // 2
            del tail[: len(tail) - limit // 2]
    if dropped:
        note = f"\n[... {dropped} bytes of output dropped here ...]\n".encode()
        return bytes(head) + note + bytes(tail), dropped
    return bytes(head + tail), 0


def _run(request: dict[str, object], env: dict[str, str], cwd: str) -> dict[str, object]:
    timeout = float(request.get("seconds") or 60)  # type: ignore[arg-type]
    limit = int(request.get("limit") or 1 << 20)  # type: ignore[call-overload]
    import subprocess

    proc = subprocess.Popen(
        ["bash", "-c", str(request["command"])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    output, _ = _output_of(proc, time.monotonic() + timeout, limit)
    timed_out = proc.poll() is None
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()
    code = 124 if timed_out else proc.returncode
    return {"output": output.decode(errors="replace"), "returncode": code, "timed_out": timed_out}


def _path(request: dict[str, object], cwd: str) -> str:
    return os.path.join(cwd, str(request["path"]))


def _read(request: dict[str, object], cwd: str) -> dict[str, object]:
    path = _path(request, cwd)
    offset = int(request.get("offset") or 0)  # type: ignore[call-overload]
    limit = min(int(request.get("limit") or MAX_READ), MAX_READ)  # type: ignore[call-overload]
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(offset)
        data = handle.read(limit)
    return {"content": data.decode(errors="replace"), "size": size, "offset": offset}


def _write(request: dict[str, object], cwd: str) -> dict[str, object]:
    path = _path(request, cwd)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    data = str(request["content"]).encode()
    with open(path, "ab" if request.get("append") else "wb") as handle:
        handle.write(data)
    return {"path": os.path.normpath(path), "bytes": len(data)}


def _tmux(args: list[str], env: dict[str, str], timeout: float = 10.0) -> str:
    import subprocess

    result = subprocess.run(
        ["tmux", *args], capture_output=True, env=env, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"tmux {args[0]}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode(errors="replace")


def _session(env: dict[str, str], cwd: str) -> None:
    """The agent's tmux session, started when missing (the agent may have ended it)."""
    import subprocess

    probe = subprocess.run(
        ["tmux", "has-session", "-t", TMUX_SESSION], capture_output=True, env=env, check=False
    )
    if probe.returncode != 0:
        width, height = env.get("TB_TMUX_SIZE", "160x40").split("x")
        session = ["new-session", "-d", "-s", TMUX_SESSION, "-x", width, "-y", height, "-c", cwd]
        # the history limit first: a window keeps the one set when it was made
        _tmux(
            ["start-server", ";", "set-option", "-g", "history-limit", "50000", ";", *session], env
        )


def _screen(request: dict[str, object], env: dict[str, str], cwd: str) -> dict[str, object]:
    _session(env, cwd)
    history = int(request.get("history") or 0)  # type: ignore[call-overload]
    args = ["capture-pane", "-p", "-t", TMUX_SESSION]
    if history:
        args += ["-S", f"-{history}"]
    return {"screen": _tmux(args, env)}


def _keys(request: dict[str, object], env: dict[str, str], cwd: str) -> dict[str, object]:
    _session(env, cwd)
    keys = [str(k) for k in request.get("keys") or []]  # type: ignore[attr-defined]
    if keys:
        _tmux(["send-keys", "-t", TMUX_SESSION, *keys], env)
    time.sleep(max(0.0, float(request.get("wait") or 0)))  # type: ignore[arg-type]
    return _screen({"history": 0}, env, cwd)


def serve(sock_fd: int, env: dict[str, str], cwd: str) -> None:
    """Answer the runtime's requests, one JSON line each, until it closes the socket."""
    reader = os.fdopen(sock_fd, "rb", buffering=0)
    writer = os.fdopen(os.dup(sock_fd), "wb", buffering=0)
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = reader.read(1 << 20)
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "run":
                answer = _run(request, env, cwd)
            elif op == "read":
                answer = _read(request, cwd)
            elif op == "write":
                answer = _write(request, cwd)
            elif op == "keys":
                answer = _keys(request, env, cwd)
            elif op == "screen":
                answer = _screen(request, env, cwd)
            elif op == "ping":
                answer = {"pid": os.getpid()}
            else:
                raise ValueError(f"unknown request {op!r}")
            reply: dict[str, object] = {"ok": True, **answer}
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        writer.write(json.dumps(reply).encode() + b"\n")


# -- the processes ----------------------------------------------------------------------------


def _pid_1(settings: dict[str, object], sock_fd: int | None) -> None:
    env = {str(k): str(v) for k, v in settings["env"].items()}  # type: ignore[attr-defined]
    cwd = str(settings["cwd"])
    if settings["mode"] == "agent":  # the box stands: its stderr (the runtime's log) is closed
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    child = os.fork()
    if child == 0:
        try:
            os.chdir(cwd)
            if settings["mode"] == "agent":
                assert sock_fd is not None
                serve(sock_fd, env, cwd)
                os._exit(0)
            os.setsid()
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            command = [str(c) for c in settings["command"]]  # type: ignore[attr-defined]
            os.execvpe(command[0], command, env)
        except BaseException as exc:
            print(f"terminal-bench box: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(127)
    if sock_fd is not None:
        os.close(sock_fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:  # reap orphans until the child ends; the kernel then ends the rest
        pid, status = os.wait()
        if pid == child:
            if settings.get("pod"):  # no pid namespace to end the rest: end it here
                end_below()
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except (OSError, ValueError):
            continue
    return found


def end_below(pid: int | None = None) -> list[int]:
    """Stop every process below ``pid`` (this one by default), again until no new one appears
    (a stopped process forks no more), then kill them all and reap those that came to us."""
    top = os.getpid() if pid is None else pid
    stopped: list[int] = []
    for _ in range(100):
        fresh, todo = [], _children(top)
        while todo:
            found = todo.pop()
            if found not in stopped:
                fresh.append(found)
            todo += _children(found)
        if not fresh:
            break
        for found in fresh:
            with contextlib.suppress(OSError):
                os.kill(found, signal.SIGSTOP)
            stopped.append(found)
    for found in stopped:
        with contextlib.suppress(OSError):
            os.kill(found, signal.SIGKILL)
    if pid is None:
        for found in stopped:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(found, 0)
    return stopped


def _in_pod(settings: dict[str, object], sock_fd: int | None) -> None:
    """The box of a pod (see the module's docstring): pid 1 a subreaper, no namespace."""
    if int(os.readlink("/proc/self")) != os.getpid():  # its pids would name other processes
        raise OSError(22, "/proc is another pid namespace's: the box cannot find its processes")
    child = os.fork()
    if child == 0:
        try:
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl")
            _pid_1(settings, sock_fd)
        except BaseException as exc:
            print(f"terminal-bench box: {type(exc).__name__}: {exc}", file=sys.stderr)
            os._exit(126)
    if sock_fd is not None:
        os.close(sock_fd)
    os.closerange(3, 1 << 16)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)


def main() -> None:
    settings = json.loads(sys.stdin.buffer.read())
    sock_fd = settings.get("fd")
    if settings.get("pod"):
        _in_pod(settings, sock_fd)
        return
    build_root(settings)
    _unshare(CLONE_NEWPID | CLONE_NEWIPC)
    child = os.fork()
    if child == 0:
        try:
            # H waits for it, so it cannot have gone yet (pid 1's getppid() is 0: not asked)
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            become_box_root()
            status_fd = settings.get("status_fd")
            if status_fd is not None:  # the grader's: the box stands, what follows is the run's
                os.write(status_fd, b"ready")
                os.close(status_fd)
            _pid_1(settings, sock_fd)
        except BaseException as exc:
            print(f"terminal-bench box: {type(exc).__name__}: {exc}", file=sys.stderr)
            os._exit(126)
    if sock_fd is not None:
        os.close(sock_fd)
    os.closerange(3, 1 << 16)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
