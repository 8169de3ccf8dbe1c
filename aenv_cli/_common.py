"""What every command shares: exit codes, the one-line error format, `--work-dir`, the console
tables are printed on."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "WorkDir",
    "aenvironment_conflict",
    "console",
    "die",
    "error_line",
    "one_directory",
]

from aenv_cli._fast import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, aenvironment_conflict, error_line

UNCUT_WIDTH = 10_000
"""The width a console has when it writes to no terminal: wider than any line it prints, so that
a table takes the width its cells need (a pipe or a file has no width to cut them to)."""


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (``stderr``: stderr) for a command's tables: as wide as the
    terminal when it writes to one, else :data:`UNCUT_WIDTH` wide, so that output read by a
    program or kept in a file is never cut (rich would lay it out for 80 columns, ending long
    cells with an ellipsis).

    >>> import io, sys
    >>> from rich.table import Table
    >>> table = Table(box=None)
    >>> table.add_column("URL")
    >>> table.add_row("http://" + "x" * 100)
    >>> saved, sys.stdout = sys.stdout, io.StringIO()  # no terminal
    >>> try:
    ...     console().print(table)
    ...     printed = sys.stdout.getvalue()
    ... finally:
    ...     sys.stdout = saved
    >>> "x" * 100 in printed
    True
    """
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return Console(stderr=stderr, width=None if terminal else UNCUT_WIDTH)


def die(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``aenv: error: MESSAGE`` to stderr and exit with ``code``."""
    print(error_line(message), file=sys.stderr, flush=True)
    raise typer.Exit(code)


def pairs(values: list[str], option: str, *, from_environment: bool = False) -> dict[str, str]:
    """``KEY=VALUE`` options (``--env``) as a dict; a malformed one is a usage error.
    ``from_environment``: a bare ``KEY`` takes its value from this process's environment (so
    a key need not be on the command line)."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if from_environment and not sep and key:
            if key not in os.environ:
                raise typer.BadParameter(
                    f"`{key}` is not set here: write {key}=VALUE, or export it", param_hint=option
                )
            value, sep = os.environ[key], "="
        if not sep or not key:
            hint = " (or KEY, to copy it from this environment)" if from_environment else ""
            raise typer.BadParameter(f"`{item}` is not KEY=VALUE{hint}", param_hint=option)
        out[key] = value
    return out


WorkDir = Annotated[
    Path | None,
    typer.Option(
        "--work-dir",
        "-w",
        help="the project directory, as AEnvironment names it (the same as DIR)",
        exists=True,
        file_okay=False,
        dir_okay=True,
    ),
]


def one_directory(directory: Path, work_dir: Path | None) -> Path:
    """DIR or ``--work-dir`` (AEnvironment's spelling of it); both, when they differ, is an
    error."""
    if work_dir is None:
        return directory
    if directory != Path(".") and directory.resolve() != work_dir.resolve():
        raise typer.BadParameter(
            f"DIR {directory} and --work-dir {work_dir} differ; give one of them",
            param_hint="--work-dir",
        )
    return work_dir


def json_format(output: str, as_json: bool = False) -> bool:
    """``--format table|json`` (AEnvironment's spelling of ``--json``) -> print JSON?"""
    if output not in ("table", "json"):
        raise typer.BadParameter(f"`{output}`: use table or json", param_hint="--format")
    return as_json or output == "json"
