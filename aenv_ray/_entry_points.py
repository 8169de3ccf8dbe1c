"""The entry points of a group, read once per process: how aenv-ray finds engines
(``aenv_ray.engines``) and built-in environments (``aenv_ray.builtins``) by name, its own and
other packages' alike. Reading the installed metadata costs ~30 ms, so the first answer is kept.

May import: the standard library.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["entry_points_of"]


@functools.cache
def entry_points_of(group: str) -> dict[str, EntryPoint]:
    """``{name: entry point}`` of ``group``, sorted by name (the first of a name wins)."""
    from importlib.metadata import entry_points

    found: dict[str, EntryPoint] = {}
    for entry in sorted(entry_points(group=group), key=lambda ep: ep.name):
        found.setdefault(entry.name, entry)
    return found
