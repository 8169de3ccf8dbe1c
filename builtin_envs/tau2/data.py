"""Where the tau2 task data is: ``$AENV_TAU2_DATA``, else ``builtin_envs/tau2/data``.

``scripts/setup`` copies the data (``../shared/data/tau2`` beside the checkout) into the package's
``data/`` directory (not in git), so an installed package carries it into every instance. The
variable points elsewhere, e.g. at the shared copy itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from builtin_envs.tau2.errors import Tau2DataError

__all__ = ["DATA_ENV_VAR", "PACKAGE_DATA_DIR", "data_dir"]

DATA_ENV_VAR = "AENV_TAU2_DATA"
PACKAGE_DATA_DIR = Path(__file__).resolve().parent / "data"


def data_dir() -> Path:
    """The data directory (it holds ``domains/``), or :class:`Tau2DataError` naming both places."""
    override = os.environ.get(DATA_ENV_VAR)
    if override:
        path = Path(override)
        if (path / "domains").is_dir():
            return path
        raise Tau2DataError(
            f"{DATA_ENV_VAR}={override} has no domains/ directory: point it at the tau2 data "
            "(the directory holding domains/ and user_simulator/), or unset it to use "
            f"{PACKAGE_DATA_DIR}"
        )
    if (PACKAGE_DATA_DIR / "domains").is_dir():
        return PACKAGE_DATA_DIR
    raise Tau2DataError(
        f"tau2 data not found: {PACKAGE_DATA_DIR} has no domains/ and {DATA_ENV_VAR} is not set; "
        "run scripts/setup (it copies ../shared/data/tau2 there) or set "
        f"{DATA_ENV_VAR} to the data directory"
    )
