"""The typer app: every command, mounted (``aenv_cli.app``); imported when a command runs.

``aenv``, ``aenv --help`` and ``aenv --version`` are answered without it when they can be
(:mod:`aenv_cli._fast`); the package's docstring says the exit codes and the layout.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from aenv_cli import (
    _build,
    _hub,
    _instance,
    _openenv,
    _project,
    _rollout,
    _serve,
    _service,
    _tau2,
    _ui,
)
from aenv_cli._common import EXIT_FAILURE, EXIT_USAGE, error_line, json_format
from aenv_ray import __version__
from aenv_ray.errors import AEnvError, ConfigurationError, EnvironmentNotFoundError

__all__ = ["app", "run"]

HELP_OPTIONS = ["-h", "--help"]

app = typer.Typer(
    name="aenv",
    help="aenv-ray: environments as code for agentic RL. Create, test and serve environments.",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": HELP_OPTIONS},
)


def _show_version(value: bool) -> None:
    if value:
        print(f"aenv-ray {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="print the version and exit", callback=_show_version, is_eager=True
        ),
    ] = False,
) -> None:
    """aenv-ray: environments as code for agentic RL. Create, test and serve environments."""


@app.command("version")
def version_command(
    short: Annotated[bool, typer.Option("--short", "-s", help="the version number only")] = False,
    as_json: Annotated[bool, typer.Option("--json", "-j", help="print JSON")] = False,
    output: Annotated[
        str, typer.Option("--format", "-f", help="table or json (AEnvironment's spelling)")
    ] = "table",
) -> None:
    """Print aenv-ray's version (and Python's and the platform's)."""
    import platform

    json_format(output)
    info = {
        "version": __version__,
        "package": "aenv-ray",
        "aenvironment_api": "0.1.7",
        "python_version": platform.python_version(),
        "platform": f"{sys.platform}/{platform.machine()}",
    }
    if short:
        print(__version__)
    elif as_json or output == "json":
        print(json.dumps(info, indent=2))
    else:
        print(f"aenv-ray {__version__}")
        print(f"AEnvironment API: {info['aenvironment_api']} (import aenv)")
        print(f"Python: {info['python_version']}")
        print(f"Platform: {info['platform']}")


_project.register(app)
_rollout.register(app)
_build.register(app)
_serve.register(app)
_hub.register(app)
_ui.register(app)
app.add_typer(_instance.app, name="instance")
# AEnvironment's spelling of `aenv instance list`, kept for the scripts of those who migrate
# (docs/migrating.md), hidden so that the help shows one command for instances: `instance`
app.command("instances", hidden=True)(_instance.instances)
app.add_typer(_service.app, name="service")
app.add_typer(_tau2.app, name="tau2")
app.add_typer(_openenv.app, name="openenv")


def _click_errors() -> tuple[type[BaseException], ...]:
    # typer >= 0.2x vendors click and roots its errors at TyperException; older typer builds on
    # click itself, which is then imported already. Catch whichever is in use.
    found: list[type[BaseException]] = []
    if hasattr(typer, "TyperException"):
        found.append(typer.TyperException)
    click = sys.modules.get("click")
    if click is not None:
        found.append(click.ClickException)
    return tuple(found)


def _usage_line(exc: Any) -> str:
    message = " ".join(exc.format_message().split())
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        message = message[0].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "aenv"
    return f"{error_line(message)}; see '{command} --help'"


def _commands(command: Any) -> Iterator[Any]:
    """``command`` and every command under it (click commands, as typer made them)."""
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def _for_output(command: Any, terminal: bool) -> None:
    """Lay the help of ``command`` (and of every command under it) out for where it goes.

    - On a terminal, typer's rich panels, as wide as the terminal. Brackets in help texts are
      text (``NAME[@VERSION]``), not rich markup, and a flag shows no ``<bool>``: it takes no
      value.
    - Elsewhere (a pipe, a file: what a program or a reader of a log gets), click's plain help,
      wrapped at 80 columns (fewer when ``COLUMNS`` says so), where nothing is cut: rich would
      lay its panels out for 80 columns and end a cell that does not fit with an ellipsis
      (``OpenAI-compatib…``), and click would cut a command's summary in a group's list
      (``...``), which is given whole here (the first paragraph of its help) and wrapped.
    """
    from rich.markup import escape

    for each in _commands(command):
        each.rich_markup_mode = "rich" if terminal else None
        if each.short_help is None and each.help:
            each.short_help = _first_paragraph(each.help)
        help_option = each.get_help_option(typer.Context(each, help_option_names=HELP_OPTIONS))
        for param in [*each.params, help_option]:
            if isinstance(param, typer.core.TyperOption) and param.is_flag:
                param.metavar = ""  # rich shows a type, `<bool>`, for what has no value
            if terminal and getattr(param, "help", None):
                param.help = escape(param.help)
        if terminal:
            each.help = escape(each.help) if each.help else each.help
            each.short_help = escape(each.short_help) if each.short_help else each.short_help


def run(args: list[str]) -> int:
    """Run ``aenv ARGS`` through the app; return the exit code. Help goes out as
    :func:`_for_output` lays it out for stdout (a terminal or not)."""
    command = typer.main.get_command(app)
    _for_output(command, terminal=sys.stdout.isatty())
    try:
        result = command.main(args=args or ["--help"], prog_name="aenv", standalone_mode=False)
    except (ConfigurationError, EnvironmentNotFoundError) as exc:  # fix the name or the project
        print(error_line(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except AEnvError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return EXIT_FAILURE
    except typer.Abort:
        print("aenv: aborted", file=sys.stderr)
        return EXIT_FAILURE
    except _click_errors() as exc:
        code = int(getattr(exc, "exit_code", EXIT_FAILURE))
        if code == EXIT_USAGE:
            print(_usage_line(exc), file=sys.stderr)
        else:
            # both TyperException and click's ClickException have format_message
            print(error_line(exc.format_message()), file=sys.stderr)  # type: ignore[attr-defined]
        return code
    return result if isinstance(result, int) else 0
