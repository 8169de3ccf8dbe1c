"""The scan a hostile agent runs from mini-terminal's shell in an instance: every
``/proc/*/environ`` and ``/proc/*/cmdline`` it can read (tests/test_secrets.py,
tests/test_sandbox_attacks.py)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONTROL", "assert_clean", "host_environments", "scan_command"]

CONTROL = "AENV_CONTROL_GIVEN_TO_THE_INSTANCE"


def scan_command(every: bool = True) -> str:
    """The shell command that prints what every visible process's environment and command line
    hold (``every=False``: only the runtime's, the shell's parent, and the shell's own), each
    followed by ``READ FILE``; first ``RUNTIME PID``."""
    where = "/proc/[0-9]*" if every else "/proc/$PPID /proc/$$"
    return (
        'echo "RUNTIME $PPID"; '
        f"for d in {where}; do for f in $d/environ $d/cmdline; do "
        'if tr "\\0" "\\n" < "$f" 2>/dev/null; then echo; echo "READ $f"; fi; '
        "done; done; true"
    )


def host_environments() -> dict[int, bytes]:
    """From the host: the environment block of every process in a pid namespace other than the
    test's (the instances' inits, runtimes and whatever they run) that this process may read."""
    ours = os.readlink("/proc/self/ns/pid")
    found: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") == ours:
                continue
            found[int(entry.name)] = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read (an unprivileged test run)
            continue
    return found


def assert_clean(output: str, canaries: list[str], control: str) -> None:
    """The scan found the control and no canary. The runtime's own environment block is either
    read by the scan and clean, or not readable at all from the instance (a runtime that is not
    dumpable, ``sandbox_runtime.contain``): then it is read from the host, as root, and must be
    clean there too (as another user the host cannot read it, and the scan is what counts)."""
    runtime = next(line.split()[1] for line in output.splitlines() if line.startswith("RUNTIME"))
    assert f"READ /proc/{runtime}/cmdline" in output, output[-3000:]
    assert f"{CONTROL}={control}" in output, output[-3000:]  # the scan sees what it should
    for canary in canaries:
        assert canary not in output, f"{canary[:24]}... is readable in the instance"
    if f"READ /proc/{runtime}/environ" in output:
        return
    assert f"/proc/{runtime}/environ: Permission denied" in output, output[-3000:]
    blocks = host_environments()
    if os.geteuid() == 0:
        assert blocks, "no process of another pid namespace was readable from the host"
    for pid, block in blocks.items():
        for canary in canaries:
            assert canary.encode() not in block, f"{canary[:24]}... is in /proc/{pid}/environ"
