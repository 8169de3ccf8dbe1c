"""What hostile agent code tries against the runtime that serves it (not a test module).

Run as a program inside an instance (mini-program's ``execute_python_code``, a mini-terminal
shell): finds the runtime (the ancestor whose parent lies outside the pid namespace), then
traces it, reads its memory and signals it in every way the kernel offers, and does the same to a
process of its own as a control. Prints one JSON object: ``{"runtime": {...}, "control": {...}}``,
each attempt ``true`` (it worked) or the error's text.
"""

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "x86_64": {"tgkill": 234, "pidfd_open": 434, "pidfd_send_signal": 424},
    "aarch64": {"tgkill": 131, "pidfd_open": 434, "pidfd_send_signal": 424},
}[os.uname().machine]
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206


def ppid_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def find_runtime() -> int:
    pid = os.getpid()
    while ppid_of(pid) not in (0, 1):
        pid = ppid_of(pid)
    return pid


def outcome(result: int) -> object:
    return True if result == 0 else os.strerror(ctypes.get_errno())


def attempt(action: object) -> object:
    try:
        action()  # type: ignore[operator]
    except OSError as exc:
        return exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    return True


def probe(target: int, *, kill_it: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, request in (("ptrace_attach", PTRACE_ATTACH), ("ptrace_seize", PTRACE_SEIZE)):
        out[name] = outcome(libc.ptrace(request, target, None, None))
        if out[name] is True:
            time.sleep(0.05)
            libc.ptrace(PTRACE_DETACH, target, None, None)
    out["read_mem"] = attempt(lambda: os.close(os.open(f"/proc/{target}/mem", os.O_RDONLY)))
    out["read_environ"] = attempt(lambda: os.close(os.open(f"/proc/{target}/environ", 0)))
    opened = libc.syscall(NR["pidfd_open"], target, 0)
    out["pidfd_open"] = outcome(0 if opened >= 0 else -1)
    # a pidfd from /proc/<pid> itself, then a signal through it (0: only asks)
    directory = os.open(f"/proc/{target}", os.O_RDONLY | os.O_DIRECTORY)
    try:
        sent = libc.syscall(NR["pidfd_send_signal"], directory, 0, None, 0)
        out["pidfd_send_signal"] = outcome(int(sent))
    finally:
        os.close(directory)
    out["kill_0"] = attempt(lambda: os.kill(target, 0))
    out["tgkill_0"] = outcome(libc.syscall(NR["tgkill"], target, target, 0))
    if kill_it:  # the real thing: a runtime that got these would be gone
        out["sigstop"] = attempt(lambda: os.kill(target, signal.SIGSTOP))
        out["sigkill"] = attempt(lambda: os.kill(target, signal.SIGKILL))
        out["tgkill_sigkill"] = outcome(libc.syscall(NR["tgkill"], target, target, 9))
        out["killpg"] = attempt(lambda: os.killpg(os.getpgid(target), signal.SIGKILL))
    return out


def main() -> None:
    runtime = find_runtime()
    control = subprocess.Popen(["sleep", "60"])
    time.sleep(0.1)
    report = {
        "runtime_pid": runtime,
        "runtime": probe(runtime, kill_it=True),
        "control": probe(control.pid, kill_it=False),
    }
    # every process this one may signal (the runtime among them, were it allowed)
    # a signal to any of its threads would reach the whole runtime: try each, for real
    threads = sorted({int(t) for t in os.listdir(f"/proc/{runtime}/task")} - {runtime})
    tried = {attempt(lambda t=t: os.kill(t, signal.SIGKILL)) for t in threads}  # type: ignore[misc]
    report["runtime"]["kill_threads"] = sorted(map(str, tried)) if threads else "no threads?"
    # every process this one may signal: the runtime among them, were it allowed (refused
    # outright without Landlock; with it, the signal reaches this program's own processes only)
    report["kill_minus_1"] = attempt(lambda: os.kill(-1, signal.SIGKILL))
    control.wait()
    report["control"]["sigkill"] = control.returncode == -signal.SIGKILL
    json.dump(report, sys.stdout)


main()
