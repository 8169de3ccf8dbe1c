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

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError, DefinitionError

__all__ = [
    "LOAD_CHECKER_VERSION",
    "MAX_MESSAGE",
    "checker_fingerprint",
    "described_calls",
    "load_in_sandbox",
    "scrub_paths",
]

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

    A value that ends in ``/`` (a directory as the user wrote it) is joined with one ``/``:

    >>> scrub_paths("at /tmp/x/src/a.py:3", {"/tmp/x": "./proj/"})
    'at ./proj/src/a.py:3'
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
            return label.rstrip("/") + "/" if label else ""
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


def described_calls(manifest: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a loaded project's calls take, from its sandbox's manifest: ``{"reward":
    described or None, "functions": [...], "tools": [...]}`` (each ``{"name",
    "description", "inputSchema", ...}``), or None when the manifest does not describe them
    (an engine that cannot load projects, an older template). The hub stores it with each
    version it publishes and serves it (``calls`` of ``GET /v1/envs/NAME/VERSION``).

    >>> described_calls({"tools": [{"name": "echo"}], "calls": {"reward": None, "functions": []}})
    {'reward': None, 'functions': [], 'tools': [{'name': 'echo'}]}
    >>> described_calls({"tools": []}) is None
    True
    """
    if manifest is None:
        return None
    calls = manifest.get("calls")
    if not isinstance(calls, Mapping) or not isinstance(calls.get("functions"), list):
        return None
    tools = manifest.get("tools")
    listed = [dict(t) for t in tools if isinstance(t, Mapping)] if isinstance(tools, list) else []
    return {**calls, "tools": listed}


LOAD_CHECKER_VERSION = 1
"""The version of what a load check asks of a project; bump it when that changes in a way the
code fingerprint of :func:`checker_fingerprint` would not show (a rule kept in data, say)."""

_SOURCES = ("aenv_ray", "sandbox_runtime")  # the SDK and the runtime that load the project
_fingerprints: dict[tuple[str, float], str] = {}


def _package_files(name: str, *, deep: bool = True) -> list[tuple[str, Path]]:
    """The Python files of the package ``name`` (found, not imported), by relative path; its
    subpackages' too when ``deep``."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return [(name, Path(spec.origin))] if spec is not None and spec.origin else []
    return sorted(
        (str(path.relative_to(location)), path)
        for location in spec.submodule_search_locations
        for path in (Path(location).rglob if deep else Path(location).glob)("*.py")
        if path.is_file()
    )


def checker_fingerprint(engine: object, timeout: float) -> str:
    """What a load check by ``engine`` (with ``timeout``) depends on besides the bundle, as a
    sha256 hex digest: :data:`LOAD_CHECKER_VERSION`; the code that loads the project (the
    files of ``aenv_ray`` and ``sandbox_runtime``, the modules of the engine's package); the
    Python that runs it (version and executable) and every distribution installed for it (a
    project may import any of them); the engine's kind and isolation; and the timeout (a slow
    import passes under a longer one only). Two checks with one fingerprint and one bundle
    digest give one answer, so EnvHub need not check a bundle twice
    (:meth:`envhub.control.ControlPlane.check_loads`). Computed once per process for each
    engine kind, isolation and timeout.

        >>> class NoEngine: ...
        >>> first = checker_fingerprint(NoEngine(), 120.0)
        >>> first == checker_fingerprint(NoEngine(), 120.0)
        True
        >>> first == checker_fingerprint(NoEngine(), 5.0)
        False
    """
    kind = f"{type(engine).__module__}.{type(engine).__qualname__}"
    isolation = str(getattr(engine, "isolation", ""))
    cache = (f"{kind}|{isolation}", timeout)
    found = _fingerprints.get(cache)
    if found is not None:
        return found
    digest = hashlib.sha256()
    head = [
        f"checker={LOAD_CHECKER_VERSION}",
        f"engine={kind}",
        f"isolation={isolation}",
        f"timeout={timeout!r}",
        f"python={sys.version}",
        f"executable={sys.executable}",
    ]
    installed = sorted(
        {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()}
    )
    digest.update("\n".join([*head, *installed]).encode())
    engine_package = type(engine).__module__.split(".", 1)[0]
    files = [(p, *f) for p in _SOURCES for f in _package_files(p)]
    if engine_package not in _SOURCES:  # the engine's own modules (local_backend's are flat)
        files += [(engine_package, *f) for f in _package_files(engine_package, deep=False)]
    for package, relative, path in files:
        digest.update(f"\n{package}/{relative}:".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    found = digest.hexdigest()
    _fingerprints[cache] = found
    return found
