"""A wheel of the aenv-ray that runs ``aenv build``, written offline, for the image's context.

The image ``aenv build`` prepares installs aenv-ray from this wheel, never from a package index
by name (the version that built the bundle may not be published there). It is written from
what is installed, with no build backend and no network:

- a regular install (from a wheel): the files its ``RECORD`` lists, less the scripts and byte
  code an installer makes;
- an editable install of a source checkout (what ``scripts/setup`` makes): the packages and
  package data that the checkout's ``pyproject.toml`` names in ``[tool.setuptools]``, found as
  setuptools finds them (its globs, hidden files skipped, ``exclude-package-data``), so that
  this wheel holds what ``uv build`` would put in one (tests/test_wheel.py compares them).

The same files give the same bytes (sorted members, fixed times, modes 644 or 755: an
executable stays one, as terminal-bench's offline tools must), so a context prepared again
does not invalidate an image builder's cached layers. Writing it costs tens of
milliseconds; nothing is cached between builds.

May import: the standard library, packaging, ``aenv_ray`` (errors).
"""

from __future__ import annotations

import base64
import fnmatch
import glob
import hashlib
import importlib.metadata
import io
import json
import os
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from aenv_ray.errors import ConfigurationError

__all__ = ["DISTRIBUTION", "Wheel", "build_wheel"]

DISTRIBUTION = "aenv-ray"
_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip member can carry
_MODE = 0o100644  # a regular file, rw-r--r--
_EXECUTABLE = 0o100755  # a regular file anyone may run, rwxr-xr-x
_IMPLICIT_DATA = ("*.pyi", "py.typed")  # what setuptools adds to every package's data
_DIST_INFO_FILES = ("METADATA", "entry_points.txt", "top_level.txt")


@dataclass(frozen=True)
class Wheel:
    """A wheel's file name (``NAME-VERSION-TAG.whl``) and bytes."""

    filename: str
    data: bytes


def build_wheel(dist: importlib.metadata.Distribution | None = None) -> Wheel:
    """The wheel of ``dist`` (default: the installed aenv-ray), from its installed files.

    A :class:`ConfigurationError` says when the files cannot be found: an editable install
    whose checkout moved, or a layout other than setuptools' ``packages.find``.
    """
    dist = _installed() if dist is None else dist
    name = canonicalize_name(dist.metadata["Name"] or DISTRIBUTION).replace("-", "_")
    try:
        version = str(Version(dist.version)).replace("-", "_")
    except InvalidVersion as exc:
        raise ConfigurationError(f"{name} {dist.version!r} is not a version: {exc}") from exc
    root = _editable_root(dist)
    files = _source_files(root) if root is not None else _recorded_files(dist)
    info = f"{name}-{version}.dist-info"
    tag = _tag(dist)
    members = {member: path.read_bytes() for member, path in sorted(files.items())}
    executables = {member for member, path in files.items() if os.access(path, os.X_OK)}
    for filename in _DIST_INFO_FILES:
        text = dist.read_text(filename)
        if text is not None:
            members[f"{info}/{filename}"] = text.encode("utf-8")
    members[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: aenv-ray (aenv build)\n"
        f"Root-Is-Purelib: {'true' if tag.endswith('-none-any') else 'false'}\nTag: {tag}\n"
    ).encode()
    members[f"{info}/RECORD"] = _record(members, f"{info}/RECORD")
    return Wheel(f"{name}-{version}-{tag}.whl", _zip(members, executables))


def _installed() -> importlib.metadata.Distribution:
    """The installed aenv-ray: the first on sys.path with a ``.dist-info`` (``METADATA`` and
    ``RECORD``); a checkout's ``aenv_ray.egg-info`` (setuptools' build files, found when the
    checkout is the current directory) is not an install."""
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        if dist.read_text("METADATA") is not None and dist.read_text("RECORD") is not None:
            return dist
    raise ConfigurationError(
        "aenv-ray has no installed metadata (a .dist-info) on sys.path; install it with pip "
        "(or `scripts/setup` in a checkout) so that aenv build can write its wheel"
    )


def _editable_root(dist: importlib.metadata.Distribution) -> Path | None:
    """The source checkout of an editable install (PEP 610 ``direct_url.json``), or None."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        direct: Any = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(direct, dict) or not (direct.get("dir_info") or {}).get("editable"):
        return None
    url = urlsplit(str(direct.get("url", "")))
    root = Path(unquote(url.path))
    if url.scheme != "file" or not (root / "pyproject.toml").is_file():
        raise ConfigurationError(
            f"aenv-ray is installed in editable mode from {direct.get('url')!r}, which holds no "
            "pyproject.toml; reinstall it (`scripts/setup` in a checkout, or `pip install "
            "aenv-ray`) so that aenv build can write its wheel"
        )
    return root


def _source_files(root: Path) -> dict[str, Path]:
    """Wheel member -> file of a setuptools ``packages.find`` project at ``root``: every module
    and package-data file of the packages it finds (namespace packages included, setuptools'
    default for pyproject.toml)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    config = setuptools.get("tool", {}).get("setuptools", {})
    find = (
        config.get("packages", {}).get("find") if isinstance(config.get("packages"), dict) else None
    )
    if not isinstance(find, dict):
        raise ConfigurationError(
            f"{root / 'pyproject.toml'} does not use [tool.setuptools.packages.find]; aenv build "
            "cannot tell which files its wheel holds: install aenv-ray from a wheel instead"
        )
    include = find.get("include", ["*"])
    exclude = find.get("exclude", [])
    data: dict[str, list[str]] = config.get("package-data", {})
    excluded: dict[str, list[str]] = config.get("exclude-package-data", {})
    files: dict[str, Path] = {}
    for where in find.get("where", ["."]):
        base = root / where
        for dirpath, dirnames, filenames in os.walk(base):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if d.isidentifier())  # as setuptools finds
            if here == base:  # no walk through tests/, node_modules/ ...: top levels that match
                dirnames[:] = [d for d in dirnames if _may_hold(d, include)]
                continue
            package = ".".join(here.relative_to(base).parts)
            found = any(fnmatch.fnmatchcase(package, p) for p in include)
            if not found or any(fnmatch.fnmatchcase(package, p) for p in exclude):
                continue
            for filename in filenames:
                if filename.endswith(".py"):
                    files[(here / filename).relative_to(base).as_posix()] = here / filename
            for path in _package_data(
                here,
                [*data.get("*", []), *data.get(package, [])],
                [*excluded.get("*", []), *excluded.get(package, [])],
            ):
                files[path.relative_to(base).as_posix()] = path
    return files


def _package_data(here: Path, patterns: list[str], excluded: list[str]) -> list[Path]:
    """The package data of the package at ``here``, as setuptools' ``build_py`` finds it: its
    globs (``**`` recursive, hidden files skipped) relative to the package, which may reach
    into directories that are no packages (``demo_tasks/hello-world/tests/*``), less what an
    ``exclude-package-data`` pattern matches (``*`` matching ``/`` too, as ``fnmatch`` does)."""
    found = [
        match
        for pattern in [*_IMPLICIT_DATA, *patterns]
        for match in glob.glob(os.path.join(here, pattern), recursive=True)
        if os.path.isfile(match)
    ]
    bad = {m for pattern in excluded for m in fnmatch.filter(found, os.path.join(here, pattern))}
    return [Path(match) for match in dict.fromkeys(found) if match not in bad]


def _may_hold(top: str, include: list[str]) -> bool:
    """Whether a package matching ``include`` may be ``top`` or below it."""
    return any(fnmatch.fnmatchcase(top, p) or p.startswith(f"{top}.") for p in include)


def _recorded_files(dist: importlib.metadata.Distribution) -> dict[str, Path]:
    """Wheel member -> file of an installed distribution, from its ``RECORD``."""
    files: dict[str, Path] = {}
    for entry in dist.files or ():
        parts = entry.parts
        if parts[0] == ".." or parts[0].endswith(".dist-info") or "__pycache__" in parts:
            continue  # scripts and data outside site-packages, the metadata, byte code
        files[entry.as_posix()] = Path(str(dist.locate_file(entry)))
    if not files:
        raise ConfigurationError(
            f"{dist.metadata['Name']} {dist.version} lists no files (no RECORD); reinstall it "
            "with pip so that aenv build can write its wheel"
        )
    return files


def _tag(dist: importlib.metadata.Distribution) -> str:
    """The first ``Tag`` of the installed ``WHEEL`` file; ``py3-none-any`` without one."""
    for line in (dist.read_text("WHEEL") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Tag" and value.strip():
            return value.strip()
    return "py3-none-any"


def _record(members: dict[str, bytes], record: str) -> bytes:
    """The ``RECORD`` of ``members``: each file's sha256 (urlsafe base64) and size."""
    lines = []
    for name, content in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
        lines.append(f"{name},sha256={digest.decode()},{len(content)}")
    lines.append(f"{record},,")
    return ("\n".join(lines) + "\n").encode()


def _zip(members: dict[str, bytes], executables: set[str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.external_attr = (_EXECUTABLE if name in executables else _MODE) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, content)
    return buffer.getvalue()
