"""Loading a project before it is built or pushed: in a sandbox, never in this process.

``aenv build`` and ``aenv push`` check that what they bundle loads (its modules import, its
decorators register something), so that a project that cannot load is never published. The
check runs the project's import-time code, which is environment code like any other: it runs in
an instance's isolation (the local engine's template, whatever ``AENV_ENGINE`` says: the
project is on this machine), not in the CLI (:func:`aenv_ray.loadcheck.load_in_sandbox`).

May import: ``aenv_ray`` (the engine contract, the bundle format; inside the function).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from aenv_cli._common import EXIT_USAGE, die
from aenv_ray.errors import DefinitionError

__all__ = ["check_loads", "describe"]

_TIMEOUT = 120.0


def check_loads(data: bytes, what: str, shown: str = "") -> dict[str, Any] | None:
    """The manifest of the bundle ``data`` loaded in a sandbox of the local engine (None: it
    cannot load projects here); exit 2 with the load error, its files told below ``shown``
    (the project's directory as the user named it; ``""``: relative to the bundle), when it
    does not load."""
    from aenv_ray.bundle import extract_bundle
    from aenv_ray.engine import named_engine
    from aenv_ray.loadcheck import load_in_sandbox

    engine = named_engine("local")
    with tempfile.TemporaryDirectory(prefix="aenv-check-") as scratch:
        project = extract_bundle(data, Path(scratch) / "project")
        try:
            manifest = asyncio.run(load_in_sandbox(engine, project, shown=shown, timeout=_TIMEOUT))
        except DefinitionError as exc:
            die(f"{what} does not load: {exc}", EXIT_USAGE)
    return manifest


def describe(manifest: dict[str, Any] | None) -> str:
    """``3 tools, 1 function, a reward`` (or why nothing was checked)."""
    if manifest is None:
        return "not checked (no engine here can load it in a sandbox)"
    tools = len(manifest.get("tools") or [])
    functions = len(manifest.get("functions") or [])
    parts = [f"{tools} tool{'s' * (tools != 1)}", f"{functions} function{'s' * (functions != 1)}"]
    if manifest.get("reward"):
        parts.append("a reward")
    return ", ".join(parts) + " (loaded in a sandbox)"
