"""Loading a project before it is built or pushed: in a sandbox, never in this process.

``aenv build`` and ``aenv push`` check that what they bundle loads (its modules import, its
decorators register something), so that a project that cannot load is never published. The
check runs the project's import-time code, which is environment code like any other: it runs in
an instance's isolation (the local engine's template, whatever ``AENV_ENGINE`` says: the
project is on this machine), not in the CLI (:func:`aenv_ray.loadcheck.load_in_sandbox`).

A bundle that passed is remembered in the user's cache (``load-checks/`` under platformdirs'
``user_cache_dir("aenv-ray")``), by its digest and the checker's fingerprint
(:func:`aenv_ray.loadcheck.checker_fingerprint`: the SDK's and the runtime's code, the Python and
every installed package, the engine's kind and isolation, the timeout), as EnvHub remembers its
checks in its store: ``aenv push`` after ``aenv build`` of the same project, or a build again
of an unchanged one, does not load it again, and says the same. A changed project, or an
upgraded aenv-ray, Python or package, checks again; a failed check is never remembered; a
record that cannot be read is checked again. The cache is the user's own: the sandbox can write
nothing outside it (docs/security.md), and the hub checks every bundle it receives itself.

May import: ``aenv_ray`` (the engine contract, the bundle format; inside the function),
platformdirs (inside the function).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from aenv_cli._common import EXIT_USAGE, die
from aenv_cli._fast import keep_cached
from aenv_ray.errors import DefinitionError

__all__ = ["check_loads", "describe"]

_TIMEOUT = 120.0


def check_loads(data: bytes, what: str, shown: str = "") -> dict[str, Any] | None:
    """The manifest of the bundle ``data`` loaded in a sandbox of the local engine (None: it
    cannot load projects here); exit 2 with the load error, its files told below ``shown``
    (the project's directory as the user named it; ``""``: relative to the bundle), when it
    does not load."""
    from aenv_ray.bundle import digest_of, extract_bundle
    from aenv_ray.engine import named_engine
    from aenv_ray.loadcheck import checker_fingerprint, load_in_sandbox

    engine = named_engine("local")
    if getattr(engine, "inspect", None) is None:
        return None
    digest, checker = digest_of(data), checker_fingerprint(engine, _TIMEOUT)
    record = _record_path(digest, checker)
    passed = _passed(record, digest, checker)
    if passed is not None:
        return passed
    with tempfile.TemporaryDirectory(prefix="aenv-check-") as scratch:
        project = extract_bundle(data, Path(scratch) / "project")
        try:
            manifest = asyncio.run(load_in_sandbox(engine, project, shown=shown, timeout=_TIMEOUT))
        except DefinitionError as exc:
            die(f"{what} does not load: {exc}", EXIT_USAGE)
    if manifest is not None:
        _remember(record, {"digest": digest, "checker": checker, "manifest": manifest})
    return manifest


_KEEP = 256  # load checks remembered; the oldest go first


def _record_path(digest: str, checker: str) -> Path:
    """Where the check of the bundle ``digest`` by ``checker`` is remembered once it passed."""
    import platformdirs

    name = hashlib.sha256(f"{digest}|{checker}".encode()).hexdigest()[:40]
    return Path(platformdirs.user_cache_dir("aenv-ray")) / "load-checks" / f"{name}.json"


def _passed(path: Path, digest: str, checker: str) -> dict[str, Any] | None:
    """The manifest of a check remembered at ``path`` for ``digest`` and ``checker``; None when
    there is none (or it cannot be read, or is another's: then the bundle is checked again)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or (record.get("digest"), record.get("checker")) != (
        digest,
        checker,
    ):
        return None
    manifest = record.get("manifest")
    return manifest if isinstance(manifest, dict) else None


def _remember(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path``, keeping the newest ``_KEEP``; any failure is ignored: the
    next build or push checks again."""
    keep_cached(path, json.dumps(record), keep=_KEEP, mode=0o700)


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
