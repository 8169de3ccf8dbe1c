"""The mini program's project: a directory of the instance, read and written only below itself.

Paths are relative to the project root (a leading ``/`` or ``./`` is dropped); ``..``, hidden
names (``.git``), backslashes and control characters are refused. Every operation opens the
path one component at a time from the root with ``O_NOFOLLOW``: a symbolic link (which code run
by ``execute_python_code`` could make) is never followed, so no operation reaches outside the
project. Limits: :data:`MAX_FILE_BYTES` per file written, :data:`MAX_FILES` files and
:data:`MAX_PROJECT_BYTES` in all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_PROJECT_BYTES",
    "MAX_READ_CHARS",
    "Project",
    "ProjectError",
    "split_path",
]

MAX_FILE_BYTES = 1_000_000
"""A file written by ``write_file`` holds at most this many bytes (UTF-8)."""
MAX_PROJECT_BYTES = 20_000_000
"""The project's files hold at most this many bytes in all (``write_file`` refuses more)."""
MAX_FILES = 500
"""The project holds at most this many files (``write_file`` refuses more)."""
MAX_READ_CHARS = 200_000
"""``read_file`` returns at most this many characters of a file (and says it cut the rest)."""
_MAX_DEPTH = 16
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class ProjectError(ValueError):
    """A file operation the project refuses; the message says why and what to do."""


def split_path(file_path: str, *, allow_root: bool = False) -> list[str]:
    """``file_path`` as its components under the project root.

    >>> split_path("/pages/./index.html")
    ['pages', 'index.html']
    >>> split_path("../etc/passwd")
    Traceback (most recent call last):
    ...
    _mp_files.ProjectError: `../etc/passwd` leaves the project: paths are relative to its root ...
    """
    if not isinstance(file_path, str):
        raise ProjectError("a path is a string such as `index.html`")
    parts = [part for part in file_path.split("/") if part not in ("", ".")]
    if not parts and not allow_root:
        raise ProjectError("give a file path, e.g. `index.html`")
    for part in parts:
        if part == "..":
            raise ProjectError(
                f"`{file_path}` leaves the project: paths are relative to its root "
                "(e.g. `index.html`, `js/app.js`)"
            )
        if part.startswith("."):
            raise ProjectError(
                f"`{file_path}`: hidden names (starting with `.`) are not part of a mini "
                "program (the preview does not serve them); choose another name"
            )
        if "\\" in part or any(ord(c) < 32 or ord(c) == 127 for c in part):
            raise ProjectError(
                f"`{file_path}` holds a backslash or a control character; use `/` between "
                "directories and plain names"
            )
        if len(part.encode()) > 255:
            raise ProjectError(f"`{part[:40]}...` is longer than 255 bytes")
    if len(parts) > _MAX_DEPTH:
        raise ProjectError(f"`{file_path}` is deeper than {_MAX_DEPTH} directories")
    return parts


class Project:
    """The project directory ``root`` (made when missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    # -- walking -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _folder(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory ``parts`` below the root, opened without following
        links (``create``: make missing directories)."""
        opened = [os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            for index, part in enumerate(parts):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=opened[-1])
                try:
                    opened.append(os.open(part, _DIR, dir_fd=opened[-1]))
                except OSError as exc:
                    where = "/".join(parts[: index + 1])
                    raise _explain(exc, where, opened[-1], part, folder=True) from None
            yield opened[-1]
        finally:
            for fd in reversed(opened):
                os.close(fd)

    # -- operations --------------------------------------------------------------------------
    def read(self, file_path: str, *, limit: int | None = MAX_READ_CHARS) -> tuple[str, int, bool]:
        """``(text, size in bytes, truncated)`` of a file (undecodable bytes replaced)."""
        parts = split_path(file_path)
        data = self.read_bytes(parts, file_path)
        text = data.decode("utf-8", errors="replace")
        if limit is not None and len(text) > limit:
            return text[:limit], len(data), True
        return text, len(data), False

    def read_bytes(self, parts: list[str], shown: str) -> bytes:
        """The bytes of the regular file ``parts`` (at most :data:`MAX_PROJECT_BYTES`)."""
        *folders, name = parts
        with self._folder(folders) as parent:
            try:
                fd = os.open(name, _READ, dir_fd=parent)
            except OSError as exc:
                raise _explain(exc, shown, parent, name, folder=False) from None
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISDIR(mode):
                    raise ProjectError(f"`{shown}` is a directory; list_files shows its files")
                if not stat.S_ISREG(mode):
                    raise ProjectError(f"`{shown}` is not a regular file")
            except BaseException:
                os.close(fd)
                raise
            with os.fdopen(fd, "rb") as stream:
                return stream.read(MAX_PROJECT_BYTES)

    def exists(self, file_path: str) -> bool:
        """True when ``file_path`` is a regular file of the project (links are not)."""
        try:
            self.read_bytes(split_path(file_path), file_path)
        except (ProjectError, OSError):
            return False
        return True

    def write(self, file_path: str, content: str) -> tuple[int, bool]:
        """Write ``content`` (UTF-8) to ``file_path``, making its directories; return
        ``(bytes written, created)``."""
        parts = split_path(file_path)
        data = content.encode("utf-8", errors="surrogatepass")
        if len(data) > MAX_FILE_BYTES:
            raise ProjectError(
                f"`{file_path}` would hold {len(data)} bytes, over the limit of "
                f"{MAX_FILE_BYTES} per file; split it into smaller files"
            )
        files = dict(self.walk())
        old = files.get("/".join(parts))
        if old is None and len(files) >= MAX_FILES:
            raise ProjectError(
                f"the project has {len(files)} files, the most it may hold; delete some first"
            )
        total = sum(files.values()) - (old or 0) + len(data)
        if total > MAX_PROJECT_BYTES:
            raise ProjectError(
                f"the project would hold {total} bytes, over its limit of {MAX_PROJECT_BYTES}; "
                "delete or shrink files first"
            )
        *folders, name = parts
        with self._folder(folders, create=True) as parent:
            try:
                fd = os.open(name, _WRITE, 0o644, dir_fd=parent)
            except OSError as exc:
                raise _explain(exc, file_path, parent, name, folder=False) from None
            with os.fdopen(fd, "wb") as stream:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ProjectError(f"`{file_path}` exists and is not a regular file")
                stream.truncate(0)
                stream.write(data)
        return len(data), old is None

    def delete(self, file_path: str) -> None:
        """Remove the file ``file_path`` (a link is removed, never followed), then the
        directories it leaves empty."""
        parts = split_path(file_path)
        *folders, name = parts
        with self._folder(folders) as parent:
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise ProjectError(
                    f"no file `{file_path}` in the project; list_files shows what there is"
                ) from None
            if stat.S_ISDIR(info.st_mode):
                raise ProjectError(
                    f"`{file_path}` is a directory; delete its files (it goes with the last one)"
                )
            os.unlink(name, dir_fd=parent)
        for depth in range(len(folders), 0, -1):  # the directories left empty
            with self._folder(folders[: depth - 1]) as above:
                try:
                    os.rmdir(folders[depth - 1], dir_fd=above)
                except OSError:
                    break

    def walk(self, directory: str = "") -> Iterator[tuple[str, int]]:
        """``(path, size)`` of every regular file below ``directory``, sorted; links and hidden
        names are skipped."""
        base = split_path(directory, allow_root=True)
        with self._folder(base) as fd:
            found = sorted(_walk(fd, "/".join(base)))
        yield from found

    def clear(self) -> None:
        """Remove every file and directory of the project (the root stays)."""
        for entry in os.scandir(self.root):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _walk(fd: int, prefix: str) -> Iterator[tuple[str, int]]:
    for entry in os.scandir(fd):
        if entry.name.startswith("."):
            continue
        path = f"{prefix}/{entry.name}" if prefix else entry.name
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(info.st_mode):
            yield path, info.st_size
        elif stat.S_ISDIR(info.st_mode):
            try:
                child = os.open(entry.name, _DIR, dir_fd=fd)
            except OSError:
                continue
            try:
                yield from _walk(child, path)
            finally:
                os.close(child)


def _explain(exc: OSError, shown: str, parent: int, name: str, *, folder: bool) -> ProjectError:
    """A clear error for ``exc``, raised when opening ``name`` (``shown`` to the agent)."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISLNK(mode):
        return ProjectError(
            f"`{shown}` is a symbolic link: the project's tools do not follow links"
        )
    if exc.errno == errno.ENOENT:
        what = "directory" if folder else "file"
        return ProjectError(f"no {what} `{shown}` in the project; list_files shows what there is")
    if exc.errno == errno.ENOTDIR or (folder and mode is not None and not stat.S_ISDIR(mode)):
        return ProjectError(f"`{shown}` is not a directory")
    if exc.errno == errno.EISDIR:
        return ProjectError(f"`{shown}` is a directory; give a file inside it")
    if exc.errno == errno.ENXIO:
        return ProjectError(f"`{shown}` exists and is not a regular file")
    return ProjectError(f"`{shown}`: {exc.strerror}")
