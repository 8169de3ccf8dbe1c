"""The ``aenv`` command line run in this process: for the tests whose subject is parsing, output
and exit codes, not the process around them.

A child ``aenv`` costs 1-1.5 s of imports; :func:`aenv` costs what the command does. It returns
what :func:`subprocess.run` with ``capture_output=True, text=True`` returns (a
:class:`subprocess.CompletedProcess` with ``args``, ``returncode``, ``stdout``, ``stderr``), so a
test switches by changing the helper it calls, not its assertions.

What a fresh ``aenv`` process starts without, each call here starts without too, and leaves as
it found it: ``os.environ`` (``env`` entries set, ``unset`` names removed, then restored), the
working directory (``cwd``), ``sys.stdin`` (empty, or ``input``), ``sys.stdout``/``sys.stderr``
(captured), the logging tree (each logger's handlers, level and propagation: ``aenv serve`` and
``aenv test`` configure logging; a warning with no handler goes to stderr as in a child, not to
pytest's log capture), the engine set with ``set_default_engine``, the config notes logged
"once per process", ``sys.path``, the test's own modules the command imported, and the handlers
of SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGALRM. Its stdout and stderr are no terminal, as a
child's pipe: the help is click's plain text, tables are as wide as their cells; ``COLUMNS`` is
80 (what a child writing to a pipe sees) unless ``env`` sets it. An exception the CLI
does not turn into an exit code ends the call as it ends a child: its traceback on stderr, exit
code 1. Warnings stay errors (the suite's ``filterwarnings``), stricter than a child.

Keep a subprocess (and say why in the test: ``# subprocess: ...``) where the subject is what only
a process has: signals, import weight, a server that runs until stopped (``aenv serve``, ``aenv
run``), another user, isolation between processes. A command whose own child writes to the
inherited descriptors (``aenv test`` runs a script) runs here with ``fds=True``.

This module is the one place the tests import the CLI's entry point, so moving the CLI is a
one-line change here.

>>> done = aenv("--version")
>>> done.returncode, done.stdout.startswith("aenv-ray ")
(0, True)
>>> aenv("no-such-command").returncode
2
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TextIO

import aenv_ray.config
import aenv_ray.engine
from aenv_cli import main as _main  # the CLI's entry point: the one import of it in tests

__all__ = ["ARGV0", "CHILD", "aenv", "aenv_async", "environment", "imported_by"]

ARGV0 = "aenv"
"""``args[0]`` of the results: what a child would have run."""

CHILD = [sys.executable, "-m", "aenv_cli"]
"""The CLI as a child process, for the tests that need one (signals, servers, other users)."""

COLUMNS = "80"
"""The width rich and typer lay out for: a child writing to a pipe sees 80 columns."""


class _Captured(io.StringIO):
    """A text stream that says it is no terminal, as a pipe does."""

    def isatty(self) -> bool:
        return False


@contextmanager
def environment(
    env: Mapping[str, str] | None = None,
    *,
    unset: Iterable[str] = (),
    cwd: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """Set ``env``, remove ``unset``, enter ``cwd``; restore all three on the way out.
    ``environ``: the whole environment to start from (as ``subprocess.run(env=...)``), instead
    of this process's."""
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    try:
        if environ is not None:
            os.environ.clear()
            os.environ.update(environ)
        for name in unset:
            os.environ.pop(name, None)
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGALRM)


_OURS = tuple(
    str(Path(place).resolve())
    for place in (Path(__file__).parent.parent, sys.prefix, sys.base_prefix, sys.exec_prefix)
)


def _foreign(module: ModuleType) -> bool:
    """A module from none of this repository, the virtual environment and the standard library
    (a test's project or policy, imported by the command)."""
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and not str(Path(file).resolve()).startswith(_OURS)


def _loggers() -> list[logging.Logger]:
    found = [logging.getLogger()]
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            found.append(logger)
    return found


def _closed(handler: logging.Handler) -> bool:
    """A handler writing to a stream closed since: an earlier command's captured descriptors
    (``fds=True``), kept by a logger a thread of that command configured after it returned.
    Writing to it could only fail ("--- Logging error ---" in the next command's stderr)."""
    stream = getattr(handler, "stream", None)
    return bool(getattr(stream, "closed", False))


@contextmanager
def _fresh_process_state() -> Iterator[None]:
    """The logging tree, the default engine and the config's once-per-process notes as a new
    process has them; the caller's restored afterwards (without handlers of closed streams)."""
    logs = [
        (lg, [h for h in lg.handlers if not _closed(h)], lg.level, lg.propagate, lg.disabled)
        for lg in _loggers()
    ]
    for logger, kept, *_ in logs:
        logger.handlers[:] = kept
        # a new process has no logger disabled (an earlier logging.config.dictConfig in this
        # one, uvicorn's or Ray's, disables every logger that existed then)
        logger.disabled = False
    root = logging.getLogger()
    root.handlers[:] = []  # no pytest capture: a handler-less warning reaches stderr (lastResort)
    root.setLevel(logging.WARNING)
    engine = aenv_ray.engine._default_engine
    aenv_ray.engine._default_engine = None
    noted = set(aenv_ray.config._NOTED)
    aenv_ray.config._NOTED.clear()
    path = list(sys.path)  # loading a project puts its src first
    pythonpath = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:0] = [entry for entry in pythonpath if entry not in sys.path]
    modules = set(sys.modules)
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {number: signal.getsignal(number) for number in _SIGNALS} if main_thread else {}
    try:
        yield
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:  # a policy or project module of the test's
            if _foreign(sys.modules[name]):  # next call's module of the same name is another
                del sys.modules[name]
        for number, handler in handlers.items():
            if handler is not None:
                signal.signal(number, handler)
        present = {id(lg) for lg, *_ in logs}
        for logger in _loggers():
            if id(logger) not in present:  # made by the command: quiet it again
                logger.handlers[:] = []
                logger.setLevel(logging.NOTSET)
                logger.propagate = True
        for logger, kept, level, propagate, disabled in logs:
            logger.handlers[:] = kept
            logger.setLevel(level)
            logger.propagate = propagate
            logger.disabled = disabled
        aenv_ray.engine._default_engine = engine
        aenv_ray.config._NOTED.clear()
        aenv_ray.config._NOTED.update(noted)


def _call(args: list[str], input: str | None, fds: bool) -> tuple[int, str, str]:
    streams = sys.stdin, sys.stdout, sys.stderr
    with _streams(fds) as (out, err, read):
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(input or ""), out, err
        try:
            try:
                code = _main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=err)
            except Exception:  # what a child prints before it dies of it
                traceback.print_exc(file=err)
                code = 1
            out.flush()
            err.flush()
        finally:
            sys.stdin, sys.stdout, sys.stderr = streams
        stdout, stderr = read()
    return code, stdout, stderr


@contextmanager
def _streams(fds: bool) -> Iterator[tuple[TextIO, TextIO, Callable[[], tuple[str, str]]]]:
    """Where the command writes: two strings; with ``fds``, two files that descriptors 1 and 2
    point to meanwhile (a child the command runs inherits them, as ``aenv test``'s script)."""
    if not fds:
        out_text, err_text = _Captured(), _Captured()
        yield out_text, err_text, lambda: (out_text.getvalue(), err_text.getvalue())
        return
    sys.stdout.flush()
    sys.stderr.flush()
    with (
        tempfile.TemporaryFile() as out_file,
        tempfile.TemporaryFile() as err_file,
        open(1, "wb", buffering=0, closefd=False) as raw_out,
        open(2, "wb", buffering=0, closefd=False) as raw_err,
    ):
        saved = os.dup(1), os.dup(2)
        os.dup2(out_file.fileno(), 1)
        os.dup2(err_file.fileno(), 2)
        # Python writes through to the same descriptors, in order with the child's output
        out = io.TextIOWrapper(raw_out, write_through=True)
        err = io.TextIOWrapper(raw_err, write_through=True)

        def read() -> tuple[str, str]:
            texts = []
            for file in (out_file, err_file):
                file.seek(0)
                texts.append(file.read().decode("utf-8", errors="replace"))
            return texts[0], texts[1]

        try:
            yield out, err, read
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def aenv(
    *args: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    fds: bool = False,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process: ``env`` entries override this process's environment,
    ``unset`` names are removed from it, ``cwd`` is the working directory, ``input`` the
    standard input (none: empty, as a child's ``/dev/null``). ``fds``: capture file descriptors
    1 and 2 as well, for a command whose own child writes to them (``aenv test`` runs a script);
    whatever else this process writes meanwhile is captured too. ``environ``: the whole
    environment to start from instead of this process's (``subprocess.run``'s ``env``).
    ``PYTHONPATH`` entries go first on ``sys.path`` meanwhile, as in a child; modules the command
    imported from outside this repository and the virtual environment (a test's policy, a
    project's tools) are forgotten afterwards, as a child's are.

    Called from a coroutine (a running event loop in this thread), the command runs on a thread
    of its own while this one waits: ``asyncio.run`` inside a command needs a thread without a
    loop. Use :func:`aenv_async` when the test's loop must keep running meanwhile (it serves
    what the command talks to).
    """
    argv = [os.fspath(arg) for arg in args]
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(argv, env, unset, cwd, input, fds, environ)
    box: list[subprocess.CompletedProcess[str] | BaseException] = []

    def target() -> None:
        try:
            box.append(_run(argv, env, unset, cwd, input, fds, environ))
        except BaseException as exc:  # handed to the caller's thread
            box.append(exc)

    thread = threading.Thread(target=target, name=f"aenv {' '.join(argv[:2])}")
    thread.start()
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


async def aenv_async(
    *args: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    fds: bool = False,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """:func:`aenv` on a worker thread while this event loop keeps running."""
    argv = [os.fspath(arg) for arg in args]
    return await asyncio.to_thread(_run, argv, env, unset, cwd, input, fds, environ)


_LOCK = threading.Lock()  # one command at a time: each swaps process-wide state


def _run(
    argv: list[str],
    env: Mapping[str, str] | None,
    unset: Iterable[str],
    cwd: str | os.PathLike[str] | None,
    input: str | None,
    fds: bool,
    environ: Mapping[str, str] | None,
) -> subprocess.CompletedProcess[str]:
    settings = {"COLUMNS": COLUMNS, **(env or {})}
    with (
        _LOCK,
        environment(settings, unset=unset, cwd=cwd, environ=environ),
        _fresh_process_state(),  # after the environment: it reads PYTHONPATH
    ):
        code, out, err = _call(argv, input, fds)
    return subprocess.CompletedProcess([ARGV0, *argv], code, out, err)


def imported_by(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``python -X importtime -m aenv_cli ARGS`` in a child process (what a fresh process
    imports is the subject, so never in this one): its result and every module it imported (a
    sandbox that loads a project is another process, not counted)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "aenv_cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return result, {line.rsplit("|", 1)[1].strip() for line in lines}
