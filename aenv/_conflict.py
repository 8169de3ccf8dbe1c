"""The ``aenv`` import name is AEnvironment's too: refuse to run beside it, saying so.

AEnvironment (the ``aenvironment`` package) installs a top-level ``aenv`` package and an ``aenv``
command, as aenv-ray does; pip lets the second install overwrite the first one's files, which
leaves a mix of both. Importing this module raises :class:`ImportError` when AEnvironment is
installed in the same Python environment. It uses the standard library only, so the check runs
before anything else is imported.
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["CONFLICT_MESSAGE", "aenvironment_version", "refuse_aenvironment"]

CONFLICT_MESSAGE = (
    "AEnvironment (the `aenvironment` package, {version}) is installed in this Python "
    "environment, and aenv-ray provides the same import name `aenv` and the same `aenv` command: "
    "the two cannot share an environment (whichever was installed last overwrote the other's "
    "files). Give each its own virtual environment, or remove AEnvironment: "
    "`pip uninstall aenvironment`, then `pip install --force-reinstall --no-deps aenv-ray` "
    "(uninstalling AEnvironment also deletes the aenv/ files both installed). aenv-ray's `aenv` "
    "runs AEnvironment's code as it is: see docs/migrating.md"
)


def aenvironment_version() -> str | None:
    """The installed version of AEnvironment (``aenvironment``), or None when it is absent."""
    try:
        return importlib.metadata.version("aenvironment")
    except importlib.metadata.PackageNotFoundError:
        return None


def refuse_aenvironment() -> None:
    """Raise :class:`ImportError` (:data:`CONFLICT_MESSAGE`) when AEnvironment is installed."""
    version = aenvironment_version()
    if version is not None:
        raise ImportError(CONFLICT_MESSAGE.format(version=version), name="aenv")


refuse_aenvironment()
