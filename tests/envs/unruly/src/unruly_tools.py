"""Tools that misbehave against the runtime itself: block its event loop, exhaust the instance's
memory or processes, return values JSON cannot carry."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time

from aenv_ray import keep_processes, register_function, register_tool


@register_tool
async def ping() -> str:
    """Answer at once (the event loop is free)."""
    await asyncio.sleep(0)
    return "pong"


@register_tool
def sync_ping() -> str:
    """Answer at once from the sync worker."""
    return "pong"


@register_tool(timeout=0.5)
async def async_spin() -> str:
    """Block the event loop in pure Python."""
    while True:
        pass


@register_tool(timeout=0.5)
async def async_spin_stubborn() -> str:
    """Block the event loop and swallow every interruption."""
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass


@register_tool(timeout=0.5)
async def async_sleep_blocking(seconds: float = 100) -> str:
    """time.sleep on the event loop (a blocking C call)."""
    time.sleep(seconds)  # noqa: ASYNC251 (the point of the tool)
    return "woke"


@register_tool(timeout=0.5)
async def async_read_blocking() -> str:
    """os.read of a pipe nothing writes to, on the event loop (blocking C code nothing cuts)."""
    read, write = os.pipe()
    os.read(read, 1)
    os.close(write)
    return "read"


@register_tool
async def async_nap(seconds: float) -> str:
    """asyncio.sleep: a well-behaved slow call."""
    await asyncio.sleep(seconds)
    return f"napped {seconds}"


@register_tool
def child_hog(megabytes: int = 2048) -> dict[str, object]:
    """A child process that allocates (and touches) `megabytes`."""
    code = f"x = bytearray({megabytes} << 20)\nx[::4096] = b'x' * len(x[::4096])\nprint('survived')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return {"returncode": done.returncode, "stdout": done.stdout.strip()}


@register_tool
def inprocess_hog(gigabytes: int = 10) -> str:
    """Allocate `gigabytes` in the runtime's own process."""
    block = bytearray(gigabytes << 30)
    return f"allocated {len(block)}"


@register_tool
def fork_bomb(seconds: float = 20) -> dict[str, object]:
    """A child that forks forever (each fork forks again); waits for it up to `seconds`."""
    code = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"returncode": None}
    return {"returncode": done.returncode}


@register_tool
def start_sleeper(seconds: float = 60) -> int:
    """A background process (started by this call, kept running after it); its pid."""
    pid = subprocess.Popen(["sleep", str(seconds)], start_new_session=True).pid
    keep_processes(pid)  # else it would end with this call (sandbox_runtime.contain)
    return pid


@register_tool
def is_alive(pid: int) -> bool:
    """Whether a process of this instance still runs (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _settings() -> dict[str, object]:
    with open("/proc/self/oom_score_adj") as handle:
        adj = int(handle.read())
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return {"oom_score_adj": adj, "data": None if soft == resource.RLIM_INFINITY else soft}


@register_tool
def process_settings() -> dict[str, object]:
    """oom_score_adj and the soft RLIMIT_DATA of the runtime, of a subprocess child, of an
    os.fork child and of a multiprocessing child."""
    code = "import json, sys; sys.path.insert(0, sys.argv[1]); import unruly_tools as u; "
    code += "print(json.dumps(u._settings()))"
    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run(
        [sys.executable, "-c", code, here], capture_output=True, text=True, check=True
    )
    read, write = os.pipe()
    forked = os.fork()
    if forked == 0:
        os.write(write, json.dumps(_settings()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(forked, 0)
    with os.fdopen(read) as handle:
        fork = json.loads(handle.read())
    shell = subprocess.run(
        "cat /proc/self/oom_score_adj", shell=True, capture_output=True, text=True, check=True
    )
    return {
        "runtime": _settings(),
        "subprocess": json.loads(child.stdout),
        "fork": fork,
        "shell": int(shell.stdout),
    }


@register_tool
def not_a_number(kind: str = "nan") -> dict[str, object]:
    """A structured result holding NaN or infinity."""
    return {"score": float(kind), "ok": True}


@register_tool
def lone_surrogate() -> str:
    """A string os.fsdecode makes of an undecodable file name."""
    return "file-" + os.fsdecode(b"\xff") + ".txt"


@register_tool
def big_text(megabytes: int) -> str:
    """A text result of `megabytes` MiB."""
    return "x" * (megabytes << 20)


@register_function
def function_nan() -> float:
    """A function value that is NaN."""
    return float("nan")


@register_function
def function_big(megabytes: int) -> str:
    """A function value of `megabytes` MiB."""
    return "y" * (megabytes << 20)


@register_function
def function_surrogate() -> dict[str, str]:
    """A function value with a lone surrogate."""
    return {"name": "\udcff"}


@register_tool
def takes_anything(value: object = None, number: float = 0.0) -> str:
    """Say what arrived."""
    return f"{value!r} {number!r}"


@register_tool
def fork_loop(seconds: float = 30) -> dict[str, object]:
    """Fork (``os.fork``, in the runtime's own process) until a fork fails or `seconds` pass;
    each child sleeps. What a fork bomb written as a tool does."""
    children: list[int] = []
    error = None
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            pid = os.fork()
            if pid == 0:
                time.sleep(3600)
                os._exit(0)
            children.append(pid)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"forked": len(children), "error": error}


@register_tool
def fill_workspace(megabytes: int, in_process: bool = True) -> dict[str, object]:
    """Write `megabytes` MiB into the workspace (in the runtime, or from a `dd` child)."""
    path = os.path.join(os.environ.get("AENV_WORKSPACE", "."), "fill.bin")
    if not in_process:
        done = subprocess.run(
            ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}"],
            capture_output=True,
            text=True,
        )
        return {"returncode": done.returncode, "stderr": done.stderr[-300:]}
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as handle:
        for _ in range(megabytes):
            handle.write(chunk)
    return {"written": megabytes}


@register_tool
def remove_file(name: str) -> bool:
    """Remove a file of the workspace."""
    os.unlink(os.path.join(os.environ.get("AENV_WORKSPACE", "."), name))
    return True


@register_tool
def echo_size(data: str) -> int:
    """How many characters arrived."""
    return len(data)


@register_tool
def cgroups() -> dict[str, object]:
    """The cgroup lines (memory, pids, unified) of the runtime and of a child it starts."""

    def lines(text: str) -> list[str]:
        return sorted(
            line.split(":", 2)[2]
            for line in text.splitlines()
            if line.split(":", 2)[1] in ("memory", "pids", "")
        )

    with open("/proc/self/cgroup") as handle:
        runtime = lines(handle.read())
    # the runtime moves a child into its cgroup just after starting it: read once it has
    child = subprocess.run(
        ["sh", "-c", "sleep 0.2; cat /proc/self/cgroup"], capture_output=True, text=True
    )
    return {"runtime": runtime, "child": lines(child.stdout)}
