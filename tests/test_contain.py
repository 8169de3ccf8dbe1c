"""The runtime's seccomp filter and Landlock confinement (``sandbox_runtime.contain``), in
real processes: a child installs the filter that protects its parent, or confines itself, and
then attacks the parent; controls show each probe would have worked. Engine instances are
attacked in ``tests/test_sandbox_attacks.py``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from sandbox_runtime import contain

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
    reason="seccomp filters are built for Linux on x86_64 and aarch64",
)

# the child: arguments are the protected pid and the filter's kind; prints what each try gave
_CHILD = r"""
import ctypes, importlib.util, json, os, signal, subprocess, sys
target, kind, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
spec = importlib.util.spec_from_file_location("contain", path)  # not the runtime's imports
contain = sys.modules["contain"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(contain)
if kind == "landlock":
    contain.confine_self()
else:
    contain._install_filter(contain.seccomp_program(target, target, groups=kind == "groups"))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {"x86_64": 424, "aarch64": 424}[os.uname().machine]
def attempt(action):
    try:
        action()
    except OSError as exc:
        return exc.strerror
    return True
def through_pidfd(pid):
    if libc.syscall(nr, os.pidfd_open(pid), 0, None, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
own = subprocess.Popen(["sleep", "30"])
out = {
    "kill": attempt(lambda: os.kill(target, 0)),
    "kill_minus_1": attempt(lambda: os.kill(-1, 0)),
    "kill_0": attempt(lambda: os.kill(0, 0)),
    "setpgid": attempt(lambda: os.setpgid(0, target)),
    "pidfd_send_signal": attempt(lambda: through_pidfd(own.pid)),
    "own": attempt(lambda: os.kill(own.pid, 0)),
}
own.kill()
own.wait()
json.dump(out, sys.stdout)
"""


def _attack(kind: str) -> dict[str, object]:
    # the target: a process of its own group, so that kill(0) and setpgid can reach it
    target = subprocess.Popen(["sleep", "30"], process_group=0)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(target.pid), kind, contain.__file__],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            preexec_fn=lambda: os.setpgid(0, target.pid),
        )
        assert done.returncode == 0, done.stderr
        assert target.poll() is None  # it lives
        result: dict[str, object] = json.loads(done.stdout)
        return result
    finally:
        target.kill()
        target.wait()


def test_the_filter_without_landlock_refuses_every_way_to_signal_the_runtime() -> None:
    refused, nosys = "Operation not permitted", "Function not implemented"
    assert _attack("groups") == {
        "kill": refused,
        "kill_minus_1": refused,
        "kill_0": refused,  # the caller's group is the runtime's
        "setpgid": refused,
        "pidfd_send_signal": nosys,
        "own": True,  # the control: its own child
    }


def test_the_filter_with_landlock_refuses_the_pid_and_lets_groups_through() -> None:
    result = _attack("pid")
    assert result["kill"] == "Operation not permitted"
    assert result["pidfd_send_signal"] == "Function not implemented"
    assert result["kill_minus_1"] is True
    assert result["kill_0"] is True
    assert result["own"] is True


def test_a_confined_process_signals_only_what_it_started() -> None:
    if contain._landlock_abi() < contain._LANDLOCK_SIGNAL_ABI:
        pytest.skip("this kernel has no Landlock signal scoping (Linux 6.12)")
    result = _attack("landlock")
    assert result["kill"] == "Operation not permitted"  # Landlock, not seccomp: any pid
    assert result["own"] is True


def test_the_program_builds_for_each_machine() -> None:
    for machine in ("x86_64", "aarch64"):
        program = contain.seccomp_program(2, 2, machine)
        assert len(program) % 8 == 0
        assert 0 < len(program) // 8 < 4096
    with pytest.raises(OSError, match="no seccomp filter for machine"):
        contain.seccomp_program(2, 2, "sparc")
