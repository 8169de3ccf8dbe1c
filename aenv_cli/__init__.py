"""aenv_cli: ``aenv``, the command line (a typer app; ``main`` is the console script).

Owns the commands, and with them the assembling of what the packages below provide: a hub with
its store and engine (``aenv serve``), pools and runs (``aenv rollout``), instances on an
engine chosen by name (``aenv instance``). It is the top floor of the house: it imports the
other packages, none imports it.

Exit codes, one rule for every command:

- ``0``: done (a server stopped by Ctrl-C or SIGTERM is done too);
- ``1``: the work failed: any :class:`~aenv_ray.errors.AEnvError` that is not a configuration
  error (an instance broke, a call timed out), a port already in use;
- ``2``: the command line or the project must change: an unknown command or option, a missing
  argument, a bad value, an unknown environment (:class:`~aenv_ray.errors.EnvironmentNotFoundError`,
  in every command), and :class:`~aenv_ray.errors.ConfigurationError` (with its subclass
  :class:`~aenv_ray.errors.DefinitionError`: a bad ``config.json``, a decorator misuse);
- ``130``: interrupted before serving, or ``aenv rollout`` interrupted (it says how to resume);
  ``aenv test`` exits with its script's code.

Every error is one line on stderr, ``aenv: error: WHAT``; usage errors end with
``; see 'aenv COMMAND --help'``. ``--help`` works on the app and on every command; a bare
``aenv`` prints the help.

Layout: a module per command group. Top-level commands on a project live in ``_project.py``
(``register(app)``); a group such as ``aenv instance ...`` goes in its own module holding a
``typer.Typer()`` that is mounted in ``_app.py`` with ``app.add_typer(module.app,
name="instance")``. Importing this package imports no typer: ``aenv``, ``aenv --help`` and
``aenv --version`` are answered without it when they can be (:mod:`aenv_cli._fast`); the app
(``aenv_cli.app``, :mod:`aenv_cli._app`) imports typer, and commands import the runtime when they
run.

May import: typer, rich, pydantic (a project's validation errors), packaging (the wheel
``aenv build`` writes), ``aenv_ray``; lazily, inside functions: ``sandbox_runtime`` (``aenv
run``), ``local_backend`` (the host's warnings before a rollout), ``rollout``, ``envhub`` (the
hub and its keys), ``builtin_envs`` (the built-ins' own commands), ``aenv_openenv`` (``aenv openenv
serve``), ``aenv_ui`` (``aenv ui``, the hub's page), aiohttp (``aenv ui``'s server), uvicorn,
platformdirs. Engines are
made by name (``aenv_ray.engine.new_engine``). Must not import at import time: ray,
kubernetes, gymnasium, the runtime.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aenv_cli._fast import EXIT_USAGE, aenvironment_conflict, answer, error_line

if TYPE_CHECKING:
    from aenv_cli._app import app

__all__ = ["app", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``aenv`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    conflict = aenvironment_conflict()
    if conflict is not None:  # which `aenv` runs depends on the order of the two installs
        print(error_line(conflict), file=sys.stderr)
        return EXIT_USAGE
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None and args[:1] == ["serve"]:
        _hub_allocator()
    code = answer(args, _run)  # --version and the help, without importing typer when it can
    return _run(args) if code is None else code


def _hub_allocator() -> None:
    """``aenv serve`` runs with glibc's allocator (:func:`envhub.allocator.use_system_allocator`
    execs this program again with it): done here, before the app's imports, which a re-exec
    would pay twice. Without the hub's extra, nothing: the command says what is missing."""
    try:
        from envhub.allocator import use_system_allocator
    except Exception:  # MissingExtraError and its like: `aenv serve` says what is missing
        return
    use_system_allocator()


def _run(args: list[str]) -> int:
    from aenv_cli._app import run

    return run(args)


def __getattr__(name: str) -> Any:
    """``aenv_cli.app``, the typer app, imported on first use (PEP 562)."""
    if name == "app":
        from aenv_cli import _app

        return _app.app
    raise AttributeError(f"module 'aenv_cli' has no attribute {name!r}")
