"""Loading a project in a sandbox before it is published, and saying why it does not load.

``aenv build``, ``aenv push`` and EnvHub (on every bundle it receives) load what they would
publish through :func:`load_in_sandbox`: in a sandbox of an engine that can ``inspect`` it (the
local engine's template), never in the calling process, since environment code is untrusted. A
load error names the file and line relative to the project (``src/demo.py:42``), never the
directory the bundle was unpacked into; :func:`scrub_paths` hides the other paths of the
machine that checked it (EnvHub's data directory, its Python installation).

May import: the standard library, ``aenv_ray`` (errors).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError, DefinitionError

__all__ = ["MAX_MESSAGE", "load_in_sandbox", "scrub_paths"]

MAX_MESSAGE = 4000
"""Characters of a load error kept (the project's own exception message may be any size)."""


def scrub_paths(text: str, roots: Mapping[str, str]) -> str:
    """``text`` with every path under a key of ``roots`` told below its value instead (``""``:
    relative to it), in one pass: the longest root that matches wins, what it becomes is never
    matched again, and ``/`` alone is never a root.

    >>> scrub_paths("at /srv/hub/bundles/x/src/a.py:3", {"/srv/hub/bundles/x": ""})
    'at src/a.py:3'
    >>> scrub_paths("in /srv/hub and /srv/hub2/y", {"/srv/hub": "<hub>"})
    'in <hub> and /srv/hub2/y'
    """
    labels = {root.rstrip("/"): label for root, label in roots.items()}
    labels = {root: label for root, label in labels.items() if len(Path(root).parts) >= 2}
    if not labels:
        return text
    alternatives = "|".join(re.escape(root) for root in sorted(labels, key=len, reverse=True))
    # a root ends at `/` or where a name cannot go on (a full stop ending a sentence can)
    pattern = re.compile(rf"({alternatives})(/|(?![\w+-]|\.[\w.]))")

    def put(match: re.Match[str]) -> str:
        label = labels[match.group(1)]
        if match.group(2) == "/":
            return label + "/" if label else ""
        return label or "."

    return pattern.sub(put, text)


def _told_below(exc: ConfigurationError, project: Path, shown: str) -> DefinitionError:
    """``exc`` with the project's files told below ``shown`` (its real path too: the loader
    resolves symlinks such as macOS's /tmp)."""
    below = "" if shown in (".", "./") else shown
    roots = {str(project): below, os.path.realpath(project): below}
    location = getattr(exc, "location", None)
    return DefinitionError(
        _clip(scrub_paths(exc.message, roots)),
        location=scrub_paths(location, roots) if location else None,
    )


def _clip(text: str) -> str:
    if len(text) <= MAX_MESSAGE:
        return text
    return f"{text[:MAX_MESSAGE]}... ({len(text) - MAX_MESSAGE} more characters)"


async def load_in_sandbox(
    engine: object, project: Path, *, shown: str = "", timeout: float = 120.0
) -> dict[str, Any] | None:
    """The manifest of ``project`` loaded in a sandbox of ``engine`` (``None`` when the engine
    cannot load projects in a sandbox: it has no ``inspect``).

    A project that does not load raises :class:`~aenv_ray.errors.DefinitionError` whose
    message and location tell its files below ``shown`` (``""``: relative to the project), e.g.
    ``importing src/demo.py failed at src/demo.py:42: SyntaxError: invalid syntax``.
    """
    inspect = getattr(engine, "inspect", None)
    if inspect is None:
        return None
    try:
        manifest: dict[str, Any] = await inspect(str(project), timeout=timeout)
    except ConfigurationError as exc:  # DefinitionError among them: the project is at fault
        raise _told_below(exc, project, shown) from None
    return manifest
