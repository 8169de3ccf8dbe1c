"""The scan a hostile agent runs from mini-terminal's shell in an instance: every
``/proc/*/environ`` and ``/proc/*/cmdline`` it can read (tests/test_secrets.py,
tests/test_sandbox_attacks.py)."""

from __future__ import annotations

__all__ = ["CONTROL", "assert_clean", "scan_command"]

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


def assert_clean(output: str, canaries: list[str], control: str) -> None:
    """The scan read the runtime's own environment, found the control and no canary."""
    runtime = next(line.split()[1] for line in output.splitlines() if line.startswith("RUNTIME"))
    assert f"READ /proc/{runtime}/environ" in output, output[-3000:]
    assert f"READ /proc/{runtime}/cmdline" in output, output[-3000:]
    assert f"{CONTROL}={control}" in output, output[-3000:]  # the scan sees what it should
    for canary in canaries:
        assert canary not in output, f"{canary[:24]}... is readable in the instance"
