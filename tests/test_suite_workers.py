"""The suite on pytest-xdist workers (``AENV_TEST_WORKERS=N scripts/test``, docs/testing.md):
each group of ``tests/conftest.py``'s ``xdist_group_of`` (here: a file) runs whole on one worker,
through the suite's own scheduler (``GroupScheduling``): pytest-xdist's ``xdist_group`` mark
alone no longer groups anything under pytest 9."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import GROUPS_DIR

ROOT = Path(__file__).resolve().parent.parent
FILES = ("tests/test_retry.py", "tests/test_harbor_dockerfile.py")  # small, in-process tests


def _outside_any_worker() -> dict[str, str]:
    """This process's variables without those that tell a process it is a worker of this run
    (where the whole suite runs on workers, this test does in one): the pytest started here is
    a run of its own, its controller making its own groups' directory."""
    worker = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
    return {k: v for k, v in os.environ.items() if k not in (*worker, GROUPS_DIR)}


def test_each_file_runs_whole_on_one_worker() -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v"),
            *("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", *FILES),
        ],
        cwd=ROOT,
        env=_outside_any_worker(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, file in re.findall(
        r"^\[(gw\d+)\] .*? PASSED (tests/\S+?\.py)::", done.stdout, re.M
    ):
        workers[file].add(worker)
    assert set(workers) == set(FILES), done.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
    # two groups for two workers: one each, as pytest-xdist hands out whole groups
    assert workers[FILES[0]] != workers[FILES[1]], dict(workers)
