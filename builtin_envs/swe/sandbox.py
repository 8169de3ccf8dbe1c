"""Where the agent's commands run: a view of the instance without the task's secrets.

:class:`LocalSandbox` (the local engine) runs each command in fresh namespaces nested in the
instance's: a user namespace whose mounts lay an empty read-only file system over every hidden
directory (the dataset, the repositories it came from, the environment's private files), then
another user namespace (which locks those mounts: they cannot be unmounted from inside), a pid
namespace with its own ``/proc`` (the runtime's process and memory are out of sight) and a
mount namespace. When the command exits, everything it started is killed with its pid
namespace: nothing of the agent runs between calls. :class:`DatasourceSandbox` (the Kubernetes
engine's ``DualContainer`` instances) runs commands in the datasource container, which holds no
dataset. Both cap what a command prints (the head and the tail are kept) and kill it at its
timeout.

May import: ``aenv_ray``'s public API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aenv_ray.errors import ConfigurationError

__all__ = [
    "CommandResult",
    "DatasourceSandbox",
    "IsolationUnavailableError",
    "Judge",
    "LocalSandbox",
    "Sandbox",
    "hidden_around",
    "kept_under_tmp",
]

log = logging.getLogger("swe")

# the hidden paths' mounts (argv: their number, the paths, then anything), made by one process:
# a mount(8) per path cost more than the command itself. An empty read-only tmpfs over a
# directory, /dev/null bound over anything else; the first that fails ends it with 125.
_MOUNT_HIDDEN = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for path in sys.argv[2 : 2 + int(sys.argv[1])]:
    if os.path.isdir(path):  # MS_RDONLY
        done = libc.mount(b"swe-hidden", os.fsencode(path), b"tmpfs", 1, b"size=4k,mode=0555")
    else:  # MS_BIND
        done = libc.mount(b"/dev/null", os.fsencode(path), None, 4096, None)
    if done != 0:
        print(f"swe: cannot hide {path}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(125)
"""
_HIDE = (
    'py=$1; code=$2; shift 2; if [ "$1" -gt 0 ]; then "$py" -I -S -c "$code" "$@" '
    '|| { echo "swe: cannot hide the hidden paths" >&2; exit 125; }; fi; shift $(($1 + 1)); '
    # a fresh /tmp: a tmpfs mounted on the stage (an empty directory of the runtime's), each
    # kept path bound into it at its own place (read-only or not), then moved onto /tmp
    'if [ "$1" = fresh-tmp ]; then stage=$2; n=$3; shift 3; '
    'mount -t tmpfs -o mode=1777,size=1g,nosuid,nodev swe-tmp "$stage" '
    '|| { echo "swe: cannot mount a fresh /tmp" >&2; exit 125; }; i=0; '
    'while [ "$i" -lt "$n" ]; do at="$stage${2#/tmp}"; '
    '{ mkdir -p "$at" && mount -n --rbind "$2" "$at" && { [ "$1" = rw ] '
    '|| mount -n -o remount,bind,ro,nosuid,nodev "$at"; }; } '
    '|| { echo "swe: cannot keep $2 in a fresh /tmp" >&2; exit 125; }; '
    "shift 2; i=$((i + 1)); done; "
    'mount -n --move "$stage" /tmp || { echo "swe: cannot move a fresh /tmp in place" >&2; '
    "exit 125; }; else shift; fi; "
    'exec unshare --user --map-root-user --mount --pid --fork --mount-proc --kill-child -- "$@"'
)


class IsolationUnavailableError(ConfigurationError):
    """Commands cannot be run out of sight of the dataset here (no nested user namespaces)."""


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its exit status (124 after a timeout), its output (stdout and
    stderr together, decoded; the middle cut past the cap) and whether either happened."""

    returncode: int
    output: str
    timed_out: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class Judge:
    """How a grading run differs from the agent's commands: a fresh ``/tmp``, its own home
    directory, more directories hidden (the agent's tree set aside), and variables of its own.
    The environment is never the agent's: it is built anew from the runtime's (see
    :func:`_environment`).

    Nothing of the agent's ``/tmp`` shows in the fresh one but what the run needs where it
    lies under ``/tmp``: its home and the directories in ``keep`` (the repository under test),
    writable, and the runtime's Python (``sys.prefix``, ``sys.base_prefix``), read-only, each
    bound at its own path (:func:`kept_under_tmp`)."""

    home: str
    hide: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    keep: tuple[str, ...] = ()


def kept_under_tmp(judge: Judge) -> list[tuple[str, str]]:
    """What a judge's fresh ``/tmp`` shows of the one it covers: ``(mode, path)`` for each of
    its home, its ``keep`` paths (``rw``) and the runtime's Python (``ro``) that lies under
    ``/tmp`` (resolved; directories that exist), outer paths first: for a home
    ``/tmp/w/home`` and a repository ``/tmp/w/testbed``, ``[("rw", "/tmp/w/home"), ("rw",
    "/tmp/w/testbed")]``, then the Python's prefix if it lies under ``/tmp`` too."""
    wanted = [("rw", p) for p in (judge.home, *judge.keep)]
    wanted += [("ro", p) for p in (sys.prefix, sys.base_prefix)]
    kept: dict[str, str] = {}
    for mode, path in wanted:
        real = os.path.realpath(path)
        if real.startswith("/tmp/") and os.path.isdir(real):
            kept[real] = "rw" if kept.get(real) == "rw" else mode
    return [(kept[p], p) for p in sorted(kept, key=lambda p: (p.count("/"), p))]


class Sandbox(Protocol):
    """Runs a command in the agent's view of the instance."""

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float,
        stdin: bytes = b"",
        max_output: int = 100_000,
        judge: Judge | None = None,
    ) -> CommandResult:
        """Run ``argv`` in ``cwd`` with ``stdin``; kill it past ``timeout`` seconds; as the
        judge (``judge``): see :class:`Judge`."""
        ...

    def stop_all(self) -> int:
        """Kill every command still running (and all it started); how many there were."""
        ...


def decode_output(data: bytes) -> str:
    """Bytes a command printed as text, line ends as Python's text files read them."""
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _Capped:
    """The first and last ``limit / 2`` bytes of a stream, and how many were dropped."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - self.half
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return decode_output(bytes(self.head + self.tail))
        note = f"\n[... {self.dropped} bytes of output cut here ...]\n"
        return decode_output(bytes(self.head)) + note + decode_output(bytes(self.tail))


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    python_bin = os.path.dirname(sys.executable)
    path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    env = {
        "PATH": f"{python_bin}:{path}",
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "HOME": os.environ.get("AENV_WORKSPACE") or os.getcwd(),
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONIOENCODING": "utf-8",
    }
    env.update(extra)
    return env


def hidden_around(root: str, keep: Iterable[str]) -> list[str]:
    """What to hide so that ``root`` is out of sight but the paths in ``keep`` (inside it) stay:
    every entry of ``root`` (recursively into the ones holding a kept path) but those. Symbolic
    links are left: what they point to is hidden, or not, on its own."""
    root = os.path.realpath(root)
    kept = [os.path.realpath(k) for k in keep]
    if any(k == root for k in kept):
        return []
    inside = [k for k in kept if k.startswith(root.rstrip("/") + "/")]
    if not inside:
        return [root]
    hidden: list[str] = []
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return [root]
    for name in entries:
        path = os.path.join(root, name)
        if os.path.islink(path):
            continue
        if any(k == path or k.startswith(path + "/") for k in inside):
            if os.path.isdir(path):
                hidden += hidden_around(path, inside)
            continue
        hidden.append(path)
    return hidden


def _outermost(paths: Iterable[str]) -> list[str]:
    """The paths not inside another one of them (hiding a directory hides what it holds)."""
    kept: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths}):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


class LocalSandbox:
    """Commands in nested namespaces that hide ``hidden`` directories (see the module)."""

    def __init__(
        self,
        hidden: Sequence[str],
        *,
        isolate: bool = True,
        env: Mapping[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        self.hidden = _outermost(p for p in hidden if os.path.lexists(p))
        self.isolate = isolate
        self.env = dict(env or {})
        self.wrap = list(wrap)  # a program each command runs under (swe's judge: its reaper)
        self._checked = False
        self._running: set[subprocess.Popen[bytes]] = set()
        self._running_lock = threading.Lock()

    def _prefix(self, judge: Judge | None = None) -> list[str]:
        if not self.isolate:
            return []
        unshare = shutil.which("unshare") or "/usr/bin/unshare"
        hidden = _outermost([*self.hidden, *(judge.hide if judge else ())])
        return [
            unshare,
            "--user",
            "--map-root-user",
            "--mount",
            "--",
            "/bin/sh",
            "-c",
            _HIDE,
            "swe-hide",
            sys.executable,
            _MOUNT_HIDDEN,
            str(len(hidden)),
            *hidden,
            *self._tmp_args(judge),
        ]

    @staticmethod
    def _tmp_args(judge: Judge | None) -> list[str]:
        if judge is None:
            return ["same-tmp"]
        kept = kept_under_tmp(judge)
        return ["fresh-tmp", _stage(judge), str(len(kept)), *(x for pair in kept for x in pair)]

    def check(self) -> None:
        """Raise :class:`IsolationUnavailableError` if commands cannot be isolated here."""
        if self._checked or not self.isolate:
            return
        # pid 1 of its own pid namespace, and each hidden directory empty
        probe = (
            'echo "$$"; for d in "$@"; do if [ -d "$d" ]; then ls -A "$d" | wc -l; '
            'else wc -c < "$d"; fi; done'
        )
        result = self._run(
            ["/bin/sh", "-c", probe, "probe", *self.hidden],
            cwd="/",
            timeout=30,
            stdin=b"",
            cap=4096,
        )
        if result.returncode != 0 or result.output.split() != ["1"] + ["0"] * len(self.hidden):
            raise IsolationUnavailableError(
                "swe: the agent's commands cannot be run out of sight of the dataset here: "
                f"nested user and pid namespaces failed ({result.output.strip()[:300]!r}); "
                "use a kernel that allows unprivileged user namespaces, or set "
                "SWE_ISOLATION=none to run commands without hiding the dataset "
                "(the agent can then read the gold patch and the test patch)"
            )
        self._checked = True

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float,
        stdin: bytes = b"",
        max_output: int = 100_000,
        judge: Judge | None = None,
    ) -> CommandResult:
        """Run ``argv`` in the hidden view; see :class:`Sandbox`."""
        self.check()
        return self._run(argv, cwd=cwd, timeout=timeout, stdin=stdin, cap=max_output, judge=judge)

    def stop_all(self) -> int:
        """Kill every command still running: each one's pid namespace dies with it."""
        with self._running_lock:
            running = list(self._running)
        for process in running:
            _kill(process)
        return len(running)

    def _run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float,
        stdin: bytes,
        cap: int,
        judge: Judge | None = None,
    ) -> CommandResult:
        env = _environment(self.env)
        stage = None
        if judge is not None:
            env.update({"HOME": judge.home, "TMPDIR": "/tmp", **judge.env})
            if self.isolate:
                stage = _stage(judge)
                os.mkdir(stage, 0o700)
        try:
            return self._watch(
                argv, cwd=cwd, timeout=timeout, stdin=stdin, cap=cap, judge=judge, env=env
            )
        finally:
            if stage is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(stage)

    def _watch(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float,
        stdin: bytes,
        cap: int,
        judge: Judge | None,
        env: dict[str, str],
    ) -> CommandResult:
        output = _Capped(cap)
        process = subprocess.Popen(
            [*self._prefix(judge), *self.wrap, *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self._running_lock:
            self._running.add(process)
        assert process.stdin is not None
        assert process.stdout is not None
        timed_out = False
        try:
            try:
                process.stdin.write(stdin)
                process.stdin.close()
            except BrokenPipeError:
                pass
            deadline = time.monotonic() + timeout
            with selectors.DefaultSelector() as selector:
                selector.register(process.stdout, selectors.EVENT_READ)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    if not selector.select(min(left, 1.0)):
                        continue
                    chunk = os.read(process.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    output.add(chunk)
        finally:
            if timed_out or process.poll() is None:
                _kill(process)
            process.stdout.close()
            with self._running_lock:
                self._running.discard(process)
        code = process.wait()
        text = output.text()
        if timed_out:
            text += f"\n[the command was killed after {timeout:g} s]"
            code = 124
        return CommandResult(code, text, timed_out=timed_out, truncated=bool(output.dropped))


def _stage(judge: Judge) -> str:
    """Where a judge's fresh ``/tmp`` is put together before it moves onto ``/tmp``: an empty
    directory beside its home (the runtime's, made for the run and removed after it)."""
    return judge.home.rstrip("/") + ".tmp-stage"


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignored
        log.warning("swe: a killed command did not exit", extra={"pid": process.pid})


class DatasourceSandbox:
    """Commands in the datasource container of a ``DualContainer`` instance."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env or {})

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float,
        stdin: bytes = b"",
        max_output: int = 100_000,
        judge: Judge | None = None,
    ) -> CommandResult:
        """Run ``argv`` in the datasource container; see :class:`Sandbox` (a judge's run gets
        its home and variables; the container's ``/tmp`` stays). The exec helper returns at most
        :data:`aenv_ray.datasource.MAX_OUTPUT` bytes of output: a larger ``max_output`` is that
        (``truncated`` says when output was cut)."""
        from aenv_ray import datasource
        from aenv_ray.errors import DatasourceTimeoutError

        max_output = min(max_output, datasource.MAX_OUTPUT)

        merged = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        env = {"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", **self.env}
        if judge is not None:
            env.update({"HOME": judge.home, **judge.env})
        try:
            result = asyncio.run(
                datasource.run(
                    merged,
                    cwd=cwd,
                    env=env,
                    stdin=stdin,
                    timeout=timeout,
                    max_output=max_output,
                )
            )
        except DatasourceTimeoutError as exc:
            partial_result = getattr(exc, "result", None)
            partial = partial_result.stdout if partial_result is not None else b""
            text = decode_output(partial) + f"\n[the command was killed after {timeout:g} s]"
            return CommandResult(124, text, timed_out=True)
        text = decode_output(result.stdout)
        if result.stdout_truncated:
            text += "\n[... output cut here ...]"
        return CommandResult(result.returncode, text, truncated=result.stdout_truncated)

    def stop_all(self) -> int:
        """Commands in the datasource container end with their call: nothing to stop here."""
        return 0
