"""Every module's doctests run: the examples in docstrings are executed, not just read.

Each module of the packages is one test (imported by name, so the examples see the module's own
globals). Examples that need what a doctest cannot give (a running engine, a network, an event
loop) are written as plain indented code, without ``>>>`` prompts: a ``# doctest: +SKIP`` line on
its own skips nothing (doctest refuses it), which is how such examples went unrun before.
"""

from __future__ import annotations

import asyncio
import doctest
import importlib
import sys

import pytest

from builtin_envs.tau2.errors import Tau2DataError
from tests._tau2 import require_tau2_data
from tests.test_architecture import PACKAGES, ROOT


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts or "src" in path.relative_to(ROOT).parts:
                continue  # environment projects' modules load in an instance, not here
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules()
# modules whose extra needs a newer Python than the suite's (their own tests run them there)
NEWER_PYTHON = {"aenv_harbor.environment": (3, 12)}  # Harbor: tests/test_harbor.py


def test_the_modules_are_found() -> None:
    assert {"aenv_ray.engine", "envhub.store", "local_backend.engine"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
async def test_module_doctests(name: str) -> None:
    if sys.version_info < NEWER_PYTHON.get(name, (3,)):
        pytest.skip(f"{name} needs Python {NEWER_PYTHON[name]} (its extra's)")
    try:
        module = importlib.import_module(name)
    except Tau2DataError:
        require_tau2_data()  # skips with the one line that says how to get the data
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module) if t.examples]
    if not tests:
        return
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    # an example may call asyncio.run: give it a thread without this test's running loop
    results = await asyncio.to_thread(_run_all, runner, tests)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed in {name}"


def _run_all(runner: doctest.DocTestRunner, tests: list[doctest.DocTest]) -> doctest.TestResults:
    for test in tests:
        runner.run(test)
    return runner.summarize(verbose=False)
