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


def _fill(path: str, megabytes: int) -> dict[str, object]:
    """Write up to `megabytes` into `path`; how much fit, and why no more."""
    written = 0
    chunk = b"x" * (1 << 20)
    error = None
    try:
        with open(path, "wb") as handle:
            for _ in range(megabytes):
                handle.write(chunk)
                handle.flush()
                written += 1
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"written_mb": written, "error": error}


@register_tool
def fill_tmp(megabytes: int) -> dict[str, object]:
    """Write up to `megabytes` into /tmp; report how much fit."""
    try:
        return _fill("/tmp/fill", megabytes)
    finally:
        os.unlink("/tmp/fill")


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


def _seqpackets() -> list[int]:
    """This process's AF_UNIX SOCK_SEQPACKET descriptors: its channel to the engine."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_SEQPACKET:
                    found.append(fd)
        except OSError:
            continue
    return found


@register_tool
def control_channel(attack: str) -> dict[str, object]:
    """Send the engine something that is not ours on every channel this process holds:
    garbage, truncated, oversized, forged, descriptors, a flood, or a legitimate 'broken'."""
    import json

    payloads = {
        "garbage": [b"\x00\xff\xfe not json at all"],
        "truncated": [b'{"op": "hel'],
        "not_an_object": [b"[1, 2, 3]"],
        "forged_hello": [json.dumps({"op": "hello", "id": "someone-else"}).encode()],
        "forged_spawned": [json.dumps({"op": "spawned", "id": "x", "port": 1}).encode()],
        "forged_fork": [json.dumps({"op": "fork", "items": [{"id": "x"}]}).encode()],
        "deep": [b"[" * 100000 + b"]" * 100000],
        "broken": [json.dumps({"op": "broken", "reason": "a tool said so"}).encode()],
    }
    sent, errors = 0, []
    for fd in _seqpackets():
        sock = socket.socket(fileno=os.dup(fd))
        try:
            if attack == "oversized":  # the largest datagram the kernel lets through
                for size in (4 << 20, 2 << 20, 1 << 20, 512 << 10, 200 << 10, 100 << 10):
                    try:
                        sock.send(b"x" * size)
                    except OSError:
                        continue
                    sent += 1
                    break
            elif attack == "fds":
                socket.send_fds(sock, [b'{"op": "hello"}'], list(range(3, 10)))
                sent += 1
            elif attack == "flood":
                sock.setblocking(False)
                for _ in range(100000):
                    sock.send(b'{"op": "noise"}')
                    sent += 1
            else:
                for payload in payloads[attack]:
                    sock.send(payload)
                    sent += 1
        except OSError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            sock.close()
    return {"sent": sent, "errors": errors}


@register_tool
def listening_ports() -> list[int]:
    """Ports of the listening TCP sockets among this process's descriptors."""
    ports = []
    for name in os.listdir("/proc/self/fd"):
        try:
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    ports.append(sock.getsockname()[1])
        except OSError:
            continue
    return sorted(ports)


@register_tool
def kill_everything() -> dict[str, object]:
    """kill(-1, SIGKILL): every process this one may signal, but itself."""
    try:
        os.kill(-1, 9)
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


@register_tool
def busy(seconds: float) -> float:
    """Hold the runtime's worker (a sync call) for `seconds`."""
    time.sleep(seconds)
    return seconds


@register_tool
def open_and_keep(path: str, text: str) -> dict[str, object]:
    """Open `path` for appending, write `text`, keep the file open in this process."""
    handle = open(path, "a")  # noqa: SIM115 (kept open on purpose)
    handle.write(text)
    handle.flush()
    STATE["kept"] = handle
    return {"fd": handle.fileno()}


@register_tool
def write_kept(text: str) -> dict[str, object]:
    """Write through the file `open_and_keep` left open."""
    handle = STATE.get("kept")
    try:
        handle.write(text)  # type: ignore[union-attr]
        handle.flush()  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


@register_tool
def fill_workspace(megabytes: int) -> dict[str, object]:
    """Write up to `megabytes` into /workspace (memory: a tmpfs), and keep it there."""
    return _fill("/workspace/fill", megabytes)


# -- processes a call leaves behind --------------------------------------------------------------
_DETACH = """
import os, sys
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        sleep = "import time; time.sleep(600)"
        os.execv(sys.executable, [sys.executable, "-c", sleep, sys.argv[1]])
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode())
"""


def _detached(marker: str) -> int:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _DETACH, marker], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@register_tool
def detach(marker: str, keep: bool = False) -> int:
    """Start a process that leaves its session (setsid, double fork) and sleeps; its pid.
    ``keep``: keep what this call starts (``aenv_ray.keep_processes``)."""
    if keep:
        from aenv_ray import keep_processes

        keep_processes()
    return _detached(marker)


@register_tool
def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@register_tool
def flag(name: str) -> None:
    """Raise flag ``name`` (for calls that wait on it)."""
    STATE[f"flag:{name}"] = True


async def _flagged(name: str) -> None:
    import asyncio

    for _ in range(3000):
        if STATE.get(f"flag:{name}"):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"flag {name} never came")


@register_tool
async def overlap(role: str, marker: str) -> dict[str, object]:
    """Two calls at once. ``long``: once ``short`` began, start a detached process, wait for the
    flag ``go``, say whether it still runs. ``short``: begin, wait for long's process, start one of
    its own, return."""
    import asyncio

    if role == "short":
        STATE["flag:short-began"] = True
        await _flagged("long-started")
        return {"pid": await asyncio.to_thread(_detached, marker)}
    await _flagged("short-began")
    pid = await asyncio.to_thread(_detached, marker)
    STATE["flag:long-started"] = True
    await _flagged("go")
    return {"pid": pid, "alive": alive(pid)}
