"""What ``aenv`` answers before typer is imported: ``--version``, the help, the conflict check.

Importing typer and rich and building every command costs about 30 times starting Python; a user
who types ``aenv``, ``aenv --help`` or ``aenv --version`` should not wait for it (issue 24:
at most 8 times). This module uses the standard library only (and platformdirs, to find the
cache directory).

- ``aenv --version``: one line, ``aenv-ray VERSION``, the same as the typer option prints.
- ``aenv``, ``aenv --help``, ``aenv -h``: the top-level help exactly as typer and rich render
  it. The first time, the full app renders it and the text is kept in the user cache directory
  (``<user cache dir>/aenv-ray/help``), under a key of everything the rendering depends on: the
  version, the size and time of every file of this package and of typer's and rich's, the time
  of every directory on ``sys.path`` but the working one (an install or uninstall changes it),
  the variables rich and typer read (``COLUMNS``, ``TERM``, ``NO_COLOR``, ...), whether stdout
  is a terminal and the terminal's size. Any change of those renders it again; a cache that
  cannot be read or written only costs the time it would have saved.
- :func:`aenvironment_conflict`: whether AEnvironment is installed beside aenv-ray, found by
  listing the directories on ``sys.path`` (``importlib.metadata`` asked only when a name there
  could be it).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "HELP_ARGS",
    "aenvironment_conflict",
    "answer",
    "error_line",
    "keep_cached",
]

EXIT_OK = 0
EXIT_FAILURE = 1  # something went wrong while doing the work (port taken, instance broken)
EXIT_USAGE = 2  # the command line or the project must change (bad option, bad config.json)

# the command lines that print the top-level help (a bare `aenv` does too)
HELP_ARGS: tuple[tuple[str, ...], ...] = ((), ("--help",), ("-h",))

# what rich and typer read from the environment to render the help (their sources, grepped)
_RENDER_VARIABLES = (
    "COLORTERM",
    "COLUMNS",
    "DATABRICKS_RUNTIME_VERSION",
    "FORCE_COLOR",
    "GITHUB_ACTIONS",
    "JUPYTER_COLUMNS",
    "JUPYTER_LINES",
    "LINES",
    "NO_COLOR",
    "PY_COLORS",
    "TERM",
    "TERMINAL_WIDTH",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "TYPER_USE_RICH",
    "_TYPER_FORCE_DISABLE_TERMINAL",
    "_TYPER_STANDARD_TRACEBACK",
)
_KEEP = 32  # rendered helps kept (one per terminal size and settings seen); the oldest go first


def error_line(message: str) -> str:
    """``aenv: error: MESSAGE`` on one line (newlines folded, a trailing period dropped)."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return f"aenv: error: {text.rstrip('.') or 'failed'}"


def aenvironment_conflict() -> str | None:
    """Why ``aenv`` cannot run here, when AEnvironment (``aenvironment``) is installed beside
    aenv-ray: both install the ``aenv`` command and the ``aenv`` package (see the ``aenv``
    package's ``_conflict``); None when it is not installed."""
    if not _may_be_installed("aenvironment"):
        return None
    import importlib.metadata

    try:
        version = importlib.metadata.version("aenvironment")
    except importlib.metadata.PackageNotFoundError:
        return None
    return (
        f"AEnvironment (the `aenvironment` package, {version}) is installed in this Python "
        "environment; it installs an `aenv` command and an `aenv` package as aenv-ray does, and "
        "the two cannot share an environment. Give each its own virtual environment, or run "
        "`pip uninstall aenvironment` and then `pip install --force-reinstall --no-deps aenv-ray`"
    )


def _may_be_installed(distribution: str) -> bool:
    """False only when no directory on ``sys.path`` holds metadata that could be
    ``distribution``'s (``NAME-VERSION.dist-info``, ``NAME.egg-info``, in any case); an entry
    that is a file (a zip) may hold it, so it answers True."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except NotADirectoryError:
            return True
        except OSError:
            continue  # absent, or a path hook's marker: importlib.metadata finds nothing there
        if any(name.lower().startswith(distribution) for name in names):
            return True
    return False


def answer(args: list[str], run: Callable[[list[str]], int]) -> int | None:
    """The exit code of ``aenv ARGS`` when it is answered here, else None: the caller runs the
    full app. ``run`` is that full app, which renders the help when it is not kept yet."""
    if args == ["--version"]:
        from aenv_ray import __version__

        print(f"aenv-ray {__version__}")
        return EXIT_OK
    if tuple(args) not in HELP_ARGS or "_AENV_COMPLETE" in os.environ:
        return None
    try:
        path = _help_path(args)
    except Exception:
        return run(args)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError):
        text = None
    if text is not None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return EXIT_OK
    with _recorded(sys.stdout) as written:
        code = run(args)
    if code == EXIT_OK and written:
        _keep(path, "".join(written))
    return code


def _help_path(args: list[str]) -> Path:
    """Where the help rendered under today's conditions is kept (see the module's docstring)."""
    import platformdirs

    from aenv_ray import __version__

    parts: list[object] = [__version__, sys.version, tuple(args)]
    here = Path(__file__).parent
    sources = [*here.rglob("*.py"), *_package_files("typer"), *_package_files("rich")]
    for path in sorted(sources):
        stat = path.stat()
        parts.append((str(path), stat.st_mtime_ns, stat.st_size))
    here_now = {"", os.getcwd()}  # `python -m aenv_cli` puts the working directory first
    for entry in sys.path:  # a directory's time changes when a package is installed or removed
        if entry in here_now:
            continue
        try:
            parts.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            parts.append((entry, None))
    parts.append([(name, os.environ.get(name)) for name in _RENDER_VARIABLES])
    stdout = sys.stdout
    parts.append((stdout.isatty(), getattr(stdout, "encoding", None)))
    for fd in (0, 1, 2):
        try:
            parts.append(tuple(os.get_terminal_size(fd)))
        except (OSError, ValueError):
            parts.append(None)
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:32]
    return Path(platformdirs.user_cache_dir("aenv-ray")) / "help" / f"{digest}.txt"


def _package_files(name: str) -> list[Path]:
    """The ``__init__.py`` of an installed package and its ``.dist-info`` (changed by an
    upgrade), without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return []
    origin = Path(spec.origin)
    return [origin, *origin.parent.parent.glob(f"{name}-*.dist-info")]


def _keep(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (a rendered help); see :func:`keep_cached`."""
    keep_cached(path, text, keep=_KEEP)


def keep_cached(path: Path, text: str, *, keep: int, mode: int = 0o777) -> None:
    """Write ``text`` to ``path`` atomically, its directory made with ``mode`` if missing; of
    the files with ``path``'s suffix there, drop the oldest beyond ``keep``. Any failure is
    ignored: a cache the next call makes again (the CLI's rendered helps, its load checks)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=mode)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
        kept = sorted(path.parent.glob(f"*{path.suffix}"), key=lambda p: p.stat().st_mtime_ns)
        for old in kept[:-keep]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


class _Recorder:
    """A text stream that writes through to ``stream`` and keeps what it wrote; everything else
    (``isatty``, ``fileno``, ``encoding``) is ``stream``'s, so that rich renders as it would."""

    def __init__(self, stream: TextIO, written: list[str]) -> None:
        self._stream = stream
        self._written = written

    def write(self, text: str) -> int:
        count = self._stream.write(text)  # click probes with b"": the stream refuses it
        self._written.append(text)
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _recorded(stream: TextIO) -> Iterator[list[str]]:
    written: list[str] = []
    sys.stdout = _Recorder(stream, written)
    try:
        yield written
    finally:
        sys.stdout = stream
