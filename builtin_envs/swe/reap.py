"""swe's judge container's reaper: ``python -I -B -m builtin_envs.swe.reap -- COMMAND...`` runs
one command of a grading (git, the tests) and then ends everything it left below itself.

Its own module so that each command starts only what it needs (not the judge's episode code):
the judge runs every command of a grading under it (:mod:`builtin_envs.swe.judge`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence

from builtin_envs.terminal_bench.judge import end_below, harden

__all__ = ["COMMAND", "main", "reap"]

COMMAND = (sys.executable, "-I", "-B", "-m", "builtin_envs.swe.reap", "--")
"""What a command runs under: ``[*COMMAND, *argv]``."""


def reap(argv: Sequence[str]) -> int:
    """Run ``argv`` (its standard streams this process's), then end everything it left below
    this process (a child subreaper); its exit status."""
    harden("swe judge (reaper)")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        child = subprocess.Popen(list(argv), restore_signals=True)
    except OSError as exc:
        print(f"{argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    code = child.wait()
    end_below()
    return code if code >= 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> None:
    """``-- COMMAND...``: :func:`reap`."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] != ["--"] or len(given) < 2:
        raise SystemExit("usage: python -I -B -m builtin_envs.swe.reap -- COMMAND...")
    raise SystemExit(reap(given[1:]))


if __name__ == "__main__":
    main()
