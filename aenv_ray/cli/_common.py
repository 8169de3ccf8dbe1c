"""What every command shares: exit codes and the one-line error format."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "die", "error_line"]

EXIT_OK = 0
EXIT_FAILURE = 1  # something went wrong while doing the work (port taken, instance broken)
EXIT_USAGE = 2  # the command line or the project must change (bad option, bad config.json)


def error_line(message: str) -> str:
    """``aenv: error: MESSAGE`` on one line (newlines folded, a trailing period dropped)."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return f"aenv: error: {text.rstrip('.') or 'failed'}"


def die(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``aenv: error: MESSAGE`` to stderr and exit with ``code``."""
    print(error_line(message), file=sys.stderr, flush=True)
    raise typer.Exit(code)


def pairs(values: list[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` options (``--env``) as a dict; a malformed one is a usage error."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"`{item}` is not KEY=VALUE", param_hint=option)
        out[key] = value
    return out
