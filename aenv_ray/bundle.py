"""Bundles: an environment project as one immutable, content-addressed ``.tar.gz``.

The format belongs to the SDK: ``aenv build``/``aenv push`` make bundles, the hub checks and
unpacks them, and both address them by :func:`digest_of`. Owns :func:`build_bundle` (a project
directory -> :class:`Bundle`, the same bytes for the same content), :func:`lock_requirements` (the
project's ``requirements.txt`` pinned from the packages installed in this interpreter),
:func:`inspect_bundle` (the hub's check of every upload, safe on hostile input, never
extracting), :func:`extract_bundle` (atomic, idempotent) and :func:`digest_of`. An image of a
bundle (its Dockerfile, the container builder) is the CLI's business (``aenv build``).

A bundle holds ``config.json``, everything under ``src/``, ``requirements.txt`` and ``README.md``
when present, and a generated ``aenv.lock``. The project's ``tests/`` stay out (they test the
project; the instance does not run them), as do hidden files and directories, ``__pycache__``,
``*.pyc`` and the build output directory.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "src").mkdir()
    ...     _ = Path(tmp, "src", "demo.py").write_text("X = 1")
    ...     _ = Path(tmp, "config.json").write_text('{"name": "demo", "version": "1.0.0"}')
    ...     bundle = build_bundle(tmp)
    >>> info = inspect_bundle(bundle.data, max_size=1 << 20)
    >>> info.config.ref, info.digest == bundle.digest == digest_of(bundle.data)
    ('demo@1.0.0', True)
    >>> info.files
    ('aenv.lock', 'config.json', 'src/demo.py')

May import: the standard library, ``aenv_ray`` (config, errors), packaging, pydantic (the
config's validation errors).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import ValidationError

from aenv_ray.config import EnvConfig
from aenv_ray.errors import ArtifactError, ArtifactTooLargeError, ConfigurationError

__all__ = [
    "DIGEST_MARKER",
    "LOCK_NAME",
    "Bundle",
    "BundleInfo",
    "build_bundle",
    "definition_digest",
    "digest_of",
    "extract_bundle",
    "inspect_bundle",
    "lock_requirements",
]

LOCK_NAME = "aenv.lock"
DIGEST_MARKER = ".aenv-digest"  # in an extracted bundle: the digest it was extracted from

_OPTIONAL_FILES = ("requirements.txt", "README.md")
_MAX_MEMBERS = 10_000
_MAX_NAME = 1024
_MAX_TEXT = 1 << 20  # config.json and aenv.lock: at most 1 MiB each
_HEADER_SLACK = 4096  # tar bytes per member beyond its content: header, padding, pax records
_EXTRACT_MIN_LIMIT = 1 << 30


@dataclass(frozen=True)
class Bundle:
    """A built bundle: the ``.tar.gz`` bytes, their digest, and what they hold."""

    data: bytes
    digest: str  # "sha256:<hex>" of data
    config: EnvConfig
    files: tuple[str, ...]  # the regular files inside, sorted
    lock: str  # the text of aenv.lock

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class BundleInfo:
    """What :func:`inspect_bundle` found in an upload."""

    digest: str
    size: int
    config: EnvConfig
    files: tuple[str, ...]


def digest_of(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``: how bundles are addressed (in the hub, its store and on
    the wire).

    >>> digest_of(b"")
    'sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'
    """
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _name_problem(name: str) -> str | None:
    """Why ``name`` may not be a member of a bundle, or None."""
    if not name or len(name) > _MAX_NAME:
        return "an empty or over-long name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a backslash or a control character in its name"
    parts = name.split("/")
    if ".." in parts:
        return "a `..` component"
    if any(part in ("", ".") for part in parts):
        return "an empty or `.` component"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    return None


# -- building ------------------------------------------------------------------------------------


def _is_excluded_name(name: str) -> bool:
    return name.startswith(".") or name == "__pycache__" or name.endswith((".pyc", ".pyo"))


def _regular_file(path: Path, shown: str) -> bool:
    """True for a regular file; a symlink is an error; anything else (fifo, socket) is skipped."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        raise ConfigurationError(
            f"{shown} is a symbolic link; a bundle holds regular files only: put a copy of "
            "the file there instead, then build again"
        )
    return stat.S_ISREG(mode)


def _source_files(root: Path, excluded: set[Path]) -> Iterator[tuple[str, Path]]:
    """``(name in the bundle, path)`` of every file under ``root/src`` that goes in."""
    src = root / "src"
    if src.is_symlink() or not src.is_dir():
        raise ConfigurationError(
            f"{src} is not a directory; an environment's modules live in src/ "
            "(`aenv init NAME` writes an example project)"
        )
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        kept = []
        for dirname in sorted(dirnames):
            path = here / dirname
            if _is_excluded_name(dirname) or path.resolve() in excluded:
                continue
            if path.is_symlink():
                name = path.relative_to(root).as_posix()
                raise ConfigurationError(
                    f"{name} is a symbolic link; a bundle holds regular files only: put the "
                    "directory itself there instead, then build again"
                )
            kept.append(dirname)
        dirnames[:] = kept
        for filename in sorted(filenames):
            path = here / filename
            name = path.relative_to(root).as_posix()
            if _is_excluded_name(filename) or not _regular_file(path, name):
                continue
            yield name, path


def _collect(root: Path, excluded: set[Path]) -> dict[str, Path]:
    files: dict[str, Path] = {"config.json": root / "config.json"}
    _regular_file(root / "config.json", "config.json")
    for name in _OPTIONAL_FILES:
        path = root / name
        if (path.exists() or path.is_symlink()) and _regular_file(path, name):
            files[name] = path
    files.update(_source_files(root, excluded))
    for name in files:
        if problem := _name_problem(name):
            raise ConfigurationError(f"{name} cannot go in a bundle: it has {problem}; rename it")
    return files


def _tar_gz(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A deterministic ``.tar.gz`` of ``name -> (content, mode)``, parent directories added."""
    dirs = {parent for name in files for parent in _parents(name)}
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(dirs | set(files)):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if name in dirs:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                content, info.mode = files[name]
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def definition_digest(project: str | Path) -> str:
    """``"sha256:<hex>"`` of a project's definition: the names and bytes of the files a bundle of
    it holds (``config.json``, ``src/``, ``requirements.txt``, ``README.md``), without the
    ``aenv.lock`` (which depends on the interpreter), the modes or the archive. Two copies of
    one definition (a checkout's, a wheel's installed in an image) have the same digest; a
    built-in served from an image is checked with it (``sandbox_runtime --builtin``).

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "src").mkdir()
        ...     _ = Path(tmp, "src", "demo.py").write_text("X = 1")
        ...     _ = Path(tmp, "config.json").write_text('{"name": "demo"}')
        ...     before = definition_digest(tmp)
        ...     _ = Path(tmp, "src", "__pycache__").mkdir()  # not part of it
        ...     same = definition_digest(tmp) == before
        ...     _ = Path(tmp, "src", "demo.py").write_text("X = 2")
        ...     changed = definition_digest(tmp) != before
        >>> same, changed
        (True, True)
    """
    digest = hashlib.sha256()
    for name, path in sorted(_collect(Path(project), set()).items()):
        content = path.read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return "sha256:" + digest.hexdigest()


def build_bundle(project: str | Path, *, exclude: Iterable[str | Path] = ()) -> Bundle:
    """Bundle the environment project at ``project``: the same content gives the same bytes.

    Goes in: ``config.json`` (checked with :meth:`EnvConfig.load`), every file under ``src/``,
    ``requirements.txt`` and ``README.md`` when present, and ``aenv.lock`` (from
    :func:`lock_requirements`). Stays out: ``tests/`` (the project's own tests are not part of
    the instance), hidden files and directories, ``__pycache__``, ``*.pyc``, sockets and fifos,
    and the directories in ``exclude`` (the build output). A symbolic link in the project is a
    :class:`ConfigurationError` naming it. Modes are 0644, or 0755 for executables and
    directories; times and owners are fixed, so ``touch`` changes nothing.
    """
    root = Path(project)
    config = EnvConfig.load(root)
    excluded = {Path(path).resolve() for path in exclude}
    lock = lock_requirements(root)
    entries: dict[str, tuple[bytes, int]] = {}
    for name, path in _collect(root, excluded).items():
        executable = path.stat().st_mode & 0o111
        entries[name] = (path.read_bytes(), 0o755 if executable else 0o644)
    entries[LOCK_NAME] = (lock.encode("utf-8"), 0o644)
    data = _tar_gz(entries)
    return Bundle(data, digest_of(data), config, tuple(sorted(entries)), lock)


# -- the lock ------------------------------------------------------------------------------------


def _requirement_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, requirement)`` of a requirements file: comments and blank lines dropped,
    backslash continuations joined."""
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line:
            yield start, line
    if pending.strip():
        yield start, pending.strip()


def _parse_requirements(path: Path) -> list[tuple[Requirement, str]]:
    found = []
    for number, line in _requirement_lines(path):
        where = f"{path.name} line {number}"
        if line.startswith("-"):
            raise ConfigurationError(
                f"{where}: `{line}`: pip options (-r, -e, --index-url ...) cannot go in a bundle; "
                "list the requirements themselves, one per line"
            )
        try:
            found.append((Requirement(line), where))
        except InvalidRequirement as exc:
            raise ConfigurationError(
                f"{where}: `{line}` is not a requirement ({exc}); write one per line, "
                "e.g. `orjson>=3.10`"
            ) from exc
    return found


def _installed() -> dict[str, importlib.metadata.Distribution]:
    """The distributions this interpreter imports, by canonical name (the first on sys.path)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist)
    return found


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras)


def _shown(requirement: Requirement) -> str:
    """The requirement without its marker (what ``pip install`` is given)."""
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    if requirement.url:
        return f"{requirement.name}{extras} @ {requirement.url}"
    return f"{requirement.name}{extras}{requirement.specifier}"


def _resolve(requirements: list[tuple[Requirement, str]]) -> dict[str, str]:
    """Canonical name -> installed version of every requirement and its dependencies."""
    installed = _installed()
    pinned: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    queue = deque(requirements)
    while queue:
        requirement, why = queue.popleft()
        name = canonicalize_name(requirement.name)
        dist = installed.get(name)
        shown = _shown(requirement)
        if dist is None:
            raise ConfigurationError(
                f"`{shown}` ({why}) is not installed in {sys.executable}; aenv build pins what "
                f"is installed: run `{sys.executable} -m pip install '{shown}'`, then build again"
            )
        version = dist.version
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            raise ConfigurationError(
                f"`{shown}` ({why}) is not satisfied: {dist.metadata['Name']} {version} is "
                f"installed in {sys.executable}; run `{sys.executable} -m pip install "
                f"'{shown}'`, then build again"
            )
        pinned[name] = version
        seen = extras_seen.setdefault(name, set())
        new = ({""} | set(requirement.extras)) - seen
        seen |= new
        for text in dist.requires or ():
            try:
                dependency = Requirement(text)
            except InvalidRequirement:
                continue  # metadata pip itself could not act on; nothing to pin
            if _applies(dependency, sorted(new)):
                queue.append((dependency, f"needed by {name}=={version}"))
    return pinned


def lock_requirements(project: str | Path) -> str:
    """The text of ``aenv.lock``: ``project/requirements.txt`` and everything it depends on,
    pinned ``name==version`` from the distributions installed in this interpreter.

    Markers are evaluated for this interpreter; requested extras pull in their dependencies. A
    requirement that is not installed, or whose installed version does not satisfy it, is a
    :class:`ConfigurationError` saying what to install. No requirements.txt (or an empty one)
    gives the header alone. The text holds no timestamp: the same environment gives the same lock.
    """
    path = Path(project) / "requirements.txt"
    requirements = _parse_requirements(path) if path.is_file() else []
    pinned = _resolve([(r, why) for r, why in requirements if _applies(r, [""])])
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [
        f"# {LOCK_NAME}: written by `aenv build`; do not edit (change requirements.txt instead).",
        f"# Python {python}; resolved from the distributions installed in the build environment,",
        "# not from a package index. Install with: pip install -r aenv.lock",
        *(f"{name}=={version}" for name, version in sorted(pinned.items())),
    ]
    return "\n".join(lines) + "\n"


# -- inspecting ----------------------------------------------------------------------------------


class _Bounded(io.RawIOBase):
    """Reads ``source`` and raises :class:`ArtifactTooLargeError` past ``limit`` bytes."""

    def __init__(self, source: gzip.GzipFile, limit: int, what: str) -> None:
        super().__init__()
        self._source, self._limit, self._what, self.count = source, limit, what, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:  # a writable buffer (memoryview, bytearray)
        wanted = min(len(buffer), self._limit - self.count + 1)
        chunk = self._source.read(wanted)
        buffer[: len(chunk)] = chunk
        self.count += len(chunk)
        if self.count > self._limit:
            raise ArtifactTooLargeError(
                f"the upload expands to more than {self._limit} bytes ({self._what}); it is "
                "not a bundle `aenv build` makes, or its contents are too large: keep data "
                "files out of src/"
            )
        return len(chunk)


def _text(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    if member.size > _MAX_TEXT:
        raise ArtifactError(f"{member.name} in the upload is {member.size} bytes (at most 1 MiB)")
    handle = tar.extractfile(member)
    raw = handle.read() if handle is not None else b""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{member.name} in the upload is not UTF-8 text") from exc


def _config_from(text: str) -> EnvConfig:
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ArtifactError(f"the upload's config.json is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ArtifactError("the upload's config.json must hold a JSON object")
    try:
        return EnvConfig.model_validate(raw)
    except ValueError as exc:  # pydantic's ValidationError (a ValueError) lists each problem
        errors = exc.errors() if isinstance(exc, ValidationError) else None
        problems = (
            "; ".join(f"`{'.'.join(str(p) for p in e['loc'])}`: {e['msg']}" for e in errors)
            if errors
            else str(exc)
        )
        raise ArtifactError(f"the upload's config.json is invalid: {problems}") from exc


def _check_lock(text: str) -> None:
    """Every line of aenv.lock is a comment or ``name==version``: nothing else reaches pip."""
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            requirement = None
        specs = list(requirement.specifier) if requirement is not None else []
        if requirement is None or requirement.url or len(specs) != 1 or specs[0].operator != "==":
            raise ArtifactError(
                f"aenv.lock line {number} in the upload is not `name==version`: `{line[:80]}`"
            )


@dataclass
class _Seen:
    """The names an upload's members took so far."""

    names: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)  # directories the names imply


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _kind(member: tarfile.TarInfo) -> str | None:
    """What a member is when a bundle may not hold it, or None for a file or directory."""
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a fifo"
    if member.issparse():
        return "a sparse file"
    if member.isreg() or member.isdir():
        return None
    return f"of tar type {member.type!r}"


def _check_member(member: tarfile.TarInfo, seen: _Seen) -> str:
    """The member's name once it passed every check; ArtifactError naming it otherwise."""
    name = member.name.rstrip("/") if member.isdir() else member.name
    if problem := _name_problem(name):
        raise ArtifactError(f"the upload's member {member.name[:200]!r} has {problem}")
    if kind := _kind(member):
        raise ArtifactError(f"the upload's member `{name}` is {kind}; a bundle holds files only")
    if name == DIGEST_MARKER:
        raise ArtifactError(f"the upload's member `{name}` has a name aenv reserves")
    parents = _parents(name)
    if name in seen.names or any(parent in seen.files for parent in parents):
        raise ArtifactError(f"the upload holds `{name}` twice (or below a file of that name)")
    if member.isreg() and name in seen.parents:
        raise ArtifactError(f"the upload holds `{name}` both as a directory and as a file")
    seen.names.add(name)
    seen.parents.update(parents)
    if member.isreg():
        seen.files.add(name)
    return name


@contextmanager
def _reading(data: bytes, limit: int, what: str) -> Iterator[tarfile.TarFile]:
    """The ``.tar.gz`` in ``data`` as a streamed tar, at most ``limit`` bytes once decompressed.

    Whatever goes wrong reading it becomes an :class:`ArtifactError`; on leaving, the gzip is
    read to its end, so a truncated one fails its length and CRC check.
    """
    raw = _Bounded(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"), limit, what)
    stream = io.BufferedReader(raw)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            yield tar
        while stream.read(1 << 16):
            pass
    except ArtifactError:
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ArtifactError(
            f"the upload is not a bundle made by `aenv build` (not a complete .tar.gz: {reason}); "
            "rebuild it with `aenv build` and push again"
        ) from exc


def inspect_bundle(
    data: bytes,
    *,
    max_size: int,
    expected_digest: str | None = None,
    max_uncompressed: int | None = None,
    max_members: int = _MAX_MEMBERS,
) -> BundleInfo:
    """Check an uploaded bundle without extracting it; return its digest, config and files.

    Safe on hostile input: over ``max_size`` bytes -> :class:`ArtifactTooLargeError`; a digest
    other than ``expected_digest`` -> :class:`ArtifactError`; not a gzip, not a tar, truncated;
    a member with an absolute path, ``..``, a link, a device or fifo, a name given twice; more
    than ``max_members`` members; no ``config.json`` or ``aenv.lock``, or an invalid one ->
    :class:`ArtifactError`. Content expanding past ``max_uncompressed`` (default ten times
    ``max_size``) -> :class:`ArtifactTooLargeError` (a decompression bomb), found while reading.
    """
    size = len(data)
    if size > max_size:
        raise ArtifactTooLargeError(
            f"the upload is {size} bytes, over the hub's limit of {max_size} bytes; keep data "
            "files out of src/, or raise the limit (`aenv serve --max-bundle`)"
        )
    digest = digest_of(data)
    if expected_digest is not None:
        expected = expected_digest.lower()
        expected = expected if expected.startswith("sha256:") else f"sha256:{expected}"
        if expected != digest:
            raise ArtifactError(
                f"the upload is corrupted: expected {expected}, got {digest}; push it again"
            )
    content_limit = 10 * max_size if max_uncompressed is None else max_uncompressed
    what = f"at most {content_limit} bytes of content allowed"
    stream_limit = content_limit + _HEADER_SLACK * (max_members + 2)
    seen = _Seen()
    texts: dict[str, str] = {}
    total = 0
    with _reading(data, stream_limit, what) as tar:
        for member in tar:
            if len(seen.names) >= max_members:
                raise ArtifactError(f"the upload has more than {max_members} members")
            name = _check_member(member, seen)
            total += member.size
            if total > content_limit:
                raise ArtifactTooLargeError(
                    f"the upload's files add up to more than {content_limit} bytes ({what}; "
                    f"`{name}` alone is {member.size}); keep data files out of src/"
                )
            if name in ("config.json", LOCK_NAME):
                if not member.isreg():
                    raise ArtifactError(f"the upload's `{name}` is not a file")
                texts[name] = _text(tar, member)
    for required in ("config.json", LOCK_NAME):
        if required not in texts:
            raise ArtifactError(
                f"the upload has no {required}: it is not a bundle made by `aenv build`; "
                "build one with `aenv build` and push again"
            )
    config = _config_from(texts["config.json"])
    _check_lock(texts[LOCK_NAME])
    return BundleInfo(digest, size, config, tuple(sorted(seen.files)))


# -- extracting ----------------------------------------------------------------------------------


def _holds(dest: Path, digest: str) -> bool:
    try:
        return (dest / DIGEST_MARKER).read_text(encoding="utf-8").strip() == digest
    except OSError:
        return False


def _check_dest(dest: Path, digest: str) -> bool:
    """True when ``dest`` already holds this bundle; raise when it holds something else."""
    if not (dest.exists() or dest.is_symlink()):
        return False
    if dest.is_dir() and not dest.is_symlink():
        if _holds(dest, digest):
            return True
        if not any(dest.iterdir()):
            return False
    raise ConfigurationError(
        f"{dest} exists and does not hold bundle {digest}; remove it or extract elsewhere"
    )


def _write_members(data: bytes, into: Path) -> None:
    """Write the members of an inspected bundle under ``into`` (new files only, no links)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar:
        for member in tar:
            path = into / member.name.rstrip("/")
            if member.isdir():
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
                continue
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            mode = 0o755 if member.mode & 0o111 else 0o644
            source = tar.extractfile(member)
            with os.fdopen(os.open(path, flags, mode), "wb") as target:
                if source is not None:
                    shutil.copyfileobj(source, target)
            os.chmod(path, mode)  # the umask may have taken bits away


def extract_bundle(data: bytes, dest: str | Path) -> Path:
    """Extract the bundle ``data`` into the directory ``dest``, atomically; return ``dest``.

    The bundle is inspected first; the files go to a temporary directory next to ``dest`` that
    is renamed into place, so a crash leaves no half-extracted ``dest``. ``dest/.aenv-digest``
    records the bundle's digest: extracting the same bundle again returns at once. A ``dest``
    holding anything else (other than an empty directory) is a :class:`ConfigurationError`.
    """
    limit = max(_EXTRACT_MIN_LIMIT, 100 * len(data))
    info = inspect_bundle(data, max_size=len(data), max_uncompressed=limit)
    dest = Path(dest)
    if _check_dest(dest, info.digest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        _write_members(data, partial)
        (partial / DIGEST_MARKER).write_text(info.digest + "\n", encoding="utf-8")
        partial.chmod(0o755)
        try:
            os.rename(partial, dest)  # replaces an empty directory; fails on a non-empty one
        except OSError:
            if not _holds(dest, info.digest):  # else another process extracted it meanwhile
                raise
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigurationError(f"cannot extract the bundle into {dest}: {exc}") from exc
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(partial, ignore_errors=True)  # gone after a rename; left after a lost race
    return dest
