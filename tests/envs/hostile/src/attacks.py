"""Tools that try to escape or exhaust their instance. Each reports what happened, never raises."""

from __future__ import annotations

import os
import socket
import sys
import time

from aenv_ray import register_function, register_tool

STATE: dict[str, object] = {}


def _attempt(action: object) -> dict[str, object]:
    try:
        return {"ok": True, "value": action()}  # type: ignore[operator]
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


@register_tool
def read_file(path: str) -> dict[str, object]:
    """Read up to 200 characters of a file."""
    return _attempt(lambda: open(path, errors="replace").read(200))


@register_tool
def write_file(path: str, text: str = "pwned") -> dict[str, object]:
    """Create or overwrite a file."""

    def write() -> int:
        with open(path, "w") as handle:
            return handle.write(text)

    return _attempt(write)


@register_tool
def list_dir(path: str) -> dict[str, object]:
    """Names in a directory."""
    return _attempt(lambda: sorted(os.listdir(path)))


@register_tool
def connect(host: str, port: int) -> dict[str, object]:
    """Open a TCP connection."""

    def dial() -> str:
        with socket.create_connection((host, port), timeout=2):
            return "connected"

    return _attempt(dial)


@register_tool
def identity() -> dict[str, object]:
    """Who and where this instance is."""
    return {
        "uid": os.getuid(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "env": dict(os.environ),
        "argv": sys.argv[1:],
    }


@register_tool
def fork_bomb(limit: int = 100000) -> dict[str, object]:
    """Fork children that sleep, until fork fails or `limit` is reached; then kill them."""
    children = []
    error = None
    for _ in range(limit):
        try:
            pid = os.fork()
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, 9)
    for pid in children:
        os.waitpid(pid, 0)
    return {"forked": len(children), "error": error}


@register_tool
def allocate(megabytes: int) -> dict[str, object]:
    """Hold `megabytes` of memory (touched, so it is really used)."""
    blocks = [bytearray(1 << 20) for _ in range(megabytes)]
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])
    STATE["blocks"] = blocks
    return {"allocated": megabytes}


@register_tool
def fill_tmp(megabytes: int) -> dict[str, object]:
    """Write up to `megabytes` into /tmp; report how much fit."""
    written = 0
    chunk = b"x" * (1 << 20)
    error = None
    try:
        with open("/tmp/fill", "wb") as handle:
            for _ in range(megabytes):
                handle.write(chunk)
                handle.flush()
                written += 1
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        os.unlink("/tmp/fill")
    return {"written_mb": written, "error": error}


@register_tool
def remember(key: str, value: str) -> dict[str, object]:
    """Keep a value in this instance's Python memory."""
    STATE[key] = value
    return {"keys": sorted(k for k in STATE if isinstance(STATE[k], str))}


@register_function
def recall(key: str) -> object:
    """A value kept by `remember`."""
    return STATE.get(key)


@register_tool
def crash() -> None:
    """The runtime dies on the spot, as a segfault would kill it."""
    os._exit(70)


@register_tool
def open_files() -> list[str]:
    """What this process's file descriptors point at."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return sorted(targets)


@register_tool
def orphans(count: int = 3) -> int:
    """Leave ``count`` short-lived grandchildren behind (their parent shell exits at once)."""
    import subprocess

    subprocess.run(["sh", "-c", " ".join(["sleep 0.05 &"] * count)], check=True)
    return count


@register_tool
def process_table() -> list[dict[str, object]]:
    """Every process this instance can see: pid, state (Z: a zombie nobody reaped), command."""
    table = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        table.append({"pid": int(entry), "state": state, "command": command})
    return sorted(table, key=lambda row: int(row["pid"]))  # type: ignore[call-overload]
