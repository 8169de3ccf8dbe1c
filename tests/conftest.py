"""Shared fixtures: real runtimes in child processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray.testing import RuntimeProcess

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "envs" / "probe"
MINI_TERMINAL = ROOT / "builtin_envs" / "mini_terminal"


@pytest.fixture(scope="session")
def probe_runtime() -> Iterator[RuntimeProcess]:
    """One probe runtime for the session (tests that kill it use `fresh_probe`)."""
    with RuntimeProcess(PROBE) as runtime:
        yield runtime


@pytest.fixture
def fresh_probe() -> Iterator[RuntimeProcess]:
    """A probe runtime of the test's own."""
    with RuntimeProcess(PROBE) as runtime:
        yield runtime


@pytest.fixture(scope="session")
def terminal_runtime() -> Iterator[RuntimeProcess]:
    """The built-in mini-terminal, served once for the session."""
    with RuntimeProcess(MINI_TERMINAL) as runtime:
        yield runtime
