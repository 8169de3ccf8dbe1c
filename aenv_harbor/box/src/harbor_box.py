"""harbor-box: a Harbor task's machine inside an aenv-ray instance.

A Harbor task runs in a container whose whole file system its commands may write (``/app``,
``/tests``, ``/solution``, ``/logs/verifier``...). An instance's own root is read-only, so the
box is a root of its own in the instance's workspace (``$AENV_WORKSPACE/root``): the
instance's system directories (``/usr``, ``/etc``, ``/bin``, ``/lib``...) bound read-only into
it at each command, every other path a private, writable directory that lasts as long as the
instance (and is copied by a fork). Each command runs as ``bash -c`` in a mount namespace of
its own (``unshare --mount``), ``chroot``-ed into the box, as root of the instance's user
namespace (the only user it maps), with exactly the environment it is given.

Functions (called by :mod:`aenv_harbor`'s provider, never by an agent):

- ``harbor_exec(command, cwd, env, timeout_sec, no_network, stdin_key)``: ``{"stdout",
  "stderr", "return_code", "timed_out"}``; past ``timeout_sec`` every process of the command's
  session is killed. As with ``docker exec``, what the command leaves running in the
  background stays (and holds the call until it closes the command's stdout and stderr).
- ``harbor_stage(key, data, append)`` / ``harbor_unstage(key, offset, size)`` /
  ``harbor_drop(key)``: move bytes (base64) in chunks between the caller and a staging file
  outside the box, which ``harbor_exec`` gives a command on stdin (``stdin_key``) or fills with
  its stdout (``stdout_key``): files travel as ``tar`` streams made and unpacked in the box.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from aenv_ray import register_function

HERE = Path(__file__).resolve().parent
ENTER = HERE / "enter.sh"
SYSTEM = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
MAX_CHUNK = 8 << 20
_lock = threading.Lock()
_ready: list[Path] = []
_running: dict[str, subprocess.Popen[bytes]] = {}


def _workspace() -> Path:
    return Path(os.environ.get("AENV_WORKSPACE") or "/harbor")


def _stage(key: str) -> Path:
    if not key or not key.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"a staging key is letters, digits, - and _: {key!r}")
    folder = _workspace() / ".stage"
    folder.mkdir(exist_ok=True)
    return folder / key


def _root() -> Path:
    """The box's root, laid out once per instance: mount points for the system's directories
    (symbolic links where the instance has links, as /bin -> usr/bin), /dev, /proc, /tmp,
    /root."""
    root = _workspace() / "root"
    with _lock:
        if _ready:
            return root
        root.mkdir(exist_ok=True)
        for name in (*SYSTEM, "dev", "proc"):
            source = Path("/") / name
            target = root / name
            if target.exists() or target.is_symlink() or not source.exists():
                continue
            if source.is_symlink():
                target.symlink_to(os.readlink(source))
            else:
                target.mkdir()
        for name, mode in (("tmp", 0o1777), ("root", 0o700)):
            (root / name).mkdir(exist_ok=True)
            (root / name).chmod(mode)
        _ready.append(root)
    return root


def _mounts(root: Path) -> list[str]:
    return [
        name
        for name in (*SYSTEM, "dev", "proc")
        if (root / name).is_dir() and not (root / name).is_symlink()
    ]


def _chroot() -> str:
    found = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        raise RuntimeError("this machine has no `chroot` command (coreutils): the box needs it")
    return found


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@register_function(timeout=86400.0)
def harbor_exec(
    command: str,
    cwd: str = "/",
    env: dict[str, str] | None = None,
    timeout_sec: float | None = None,
    no_network: bool = False,
    stdin_key: str | None = None,
    stdout_key: str | None = None,
    run_id: str | None = None,
) -> dict[str, object]:
    """Run ``bash -c command`` in the box, in ``cwd`` (exit 126 with bash's message when it is
    not a directory), with exactly ``env``; ``no_network`` gives it an empty network namespace.
    ``stdin_key``: a staged file as its stdin; ``stdout_key``: its stdout into a staged file
    (then ``stdout`` is empty). ``run_id`` names it for :func:`harbor_kill`."""
    root = _root()
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if no_network:
        unshare.append("--net")
    variables = [f"{key}={value}" for key, value in (env or {}).items()]
    inner = 'cd -- "$1" || exit 126; exec /bin/bash -c "$2"'
    argv = [
        *unshare,
        "/bin/sh",
        str(ENTER),
        str(root),
        *_mounts(root),
        "--",
        _chroot(),
        str(root),
        "/usr/bin/env",
        "-i",
        *variables,
        "/bin/bash",
        "-c",
        inner,
        "harbor",
        cwd,
        command,
    ]
    stdin = open(_stage(stdin_key), "rb") if stdin_key else subprocess.DEVNULL  # noqa: SIM115
    stdout = open(_stage(stdout_key), "wb") if stdout_key else subprocess.PIPE  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            start_new_session=True,
        )
        timed_out = False
        if run_id:
            _running[run_id] = proc
        try:
            out, err = proc.communicate(timeout=timeout_sec)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
            out, err = proc.communicate()
    finally:
        if run_id:
            _running.pop(run_id, None)
        if stdin_key:
            stdin.close()  # type: ignore[union-attr]
        if stdout_key:
            stdout.close()  # type: ignore[union-attr]
    return {
        "stdout": (out or b"").decode("utf-8", "replace"),
        "stderr": (err or b"").decode("utf-8", "replace"),
        "return_code": proc.returncode,
        "timed_out": timed_out,
    }


@register_function
def harbor_kill(run_id: str) -> bool:
    """Kill the session of the running command ``run_id`` (its caller gave up on it)."""
    proc = _running.get(run_id)
    if proc is None:
        return False
    _kill(proc)
    return True


@register_function
def harbor_stage(key: str, data: str, append: bool = False) -> int:
    """Write (or append) base64 ``data`` to the staging file ``key``; its size after."""
    path = _stage(key)
    with open(path, "ab" if append else "wb") as file:
        file.write(base64.b64decode(data))
    return path.stat().st_size


@register_function
def harbor_unstage(key: str, offset: int = 0, size: int = MAX_CHUNK) -> dict[str, object]:
    """``size`` bytes (at most 8 MiB) of the staging file ``key`` from ``offset``, base64, and
    the file's whole size."""
    path = _stage(key)
    with open(path, "rb") as file:
        file.seek(offset)
        chunk = file.read(min(size, MAX_CHUNK))
    return {"data": base64.b64encode(chunk).decode(), "total": path.stat().st_size}


@register_function
def harbor_drop(key: str) -> bool:
    """Remove the staging file ``key``."""
    path = _stage(key)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed
