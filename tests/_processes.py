"""Finding processes by what their command line carries (the engine's ``--owner`` id)."""

from __future__ import annotations

from pathlib import Path


def processes_of(owner: str) -> list[int]:
    """Pids of live processes whose command line contains ``owner``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if owner.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
