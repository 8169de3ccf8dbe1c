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


def children_of(pid: int) -> dict[int, str]:
    """The live (not zombie) children of ``pid``: their pids and command names."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        state, parent = rest.split()[:2]
        if int(parent) == pid and state != "Z":
            found[int(entry.name)] = name
    return found
