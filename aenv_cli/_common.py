"""What every command shares: exit codes, the one-line error format, `--work-dir`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "WorkDir",
    "aenvironment_conflict",
    "die",
    "error_line",
    "one_directory",
]

from aenv_cli._fast import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, aenvironment_conflict, error_line


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
