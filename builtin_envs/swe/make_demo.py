"""Builds the demo tasks of ``swe@1.0.0``: two tiny repositories as git bundles and their
SWE-bench rows (``data/demo.jsonl``), the same commits on every run (fixed authors and dates).

``calc`` is graded from ``pytest -rA``'s output, ``textkit`` from a Django-style runner
(``tests/runtests.py --verbosity 2``: unittest's ``test_x (module.Class.test_x) ... ok``).
Each repository's history goes on past the base commit with the upstream fix, as a real
project's does; the environment fetches only the base commit's history. Run it again after
changing the content here::

    .venv/bin/python -m builtin_envs.swe.make_demo

May import: the standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["DATA", "build"]

DATA = Path(__file__).resolve().parent / "data"

CALC_OPS = '''"""Arithmetic helpers."""


def add(a, b):
    """a + b."""
    return a + b


def divide(a, b):
    """a / b; dividing by zero raises ZeroDivisionError."""
    return a / b


def mean(values):
    """The arithmetic mean of values."""
    return sum(values) / len(values)
'''
CALC_FIX = CALC_OPS.replace(
    '    """The arithmetic mean of values."""\n',
    '    """The arithmetic mean of values; no values is a ValueError."""\n'
    "    if not values:\n"
    '        raise ValueError("mean of no values")\n',
)
CALC_TESTS = """from calc.ops import add, divide, mean


def test_add():
    assert add(2, 3) == 5


def test_divide():
    assert divide(6, 3) == 2


def test_mean():
    assert mean([1, 2, 3]) == 2
"""
CALC_NEW_TEST = """

def test_mean_of_nothing():
    import pytest

    with pytest.raises(ValueError, match="no values"):
        mean([])
"""

SLUG = '''"""URL slugs."""


def slugify(text):
    """Lower-case words joined by hyphens."""
    return "-".join(text.lower().split())
'''
SLUG_FIX = '''"""URL slugs."""

import re


def slugify(text):
    """Lower-case words joined by hyphens; punctuation is dropped."""
    text = re.sub(r"[^\\w\\s-]", "", text)
    return "-".join(text.lower().split())
'''
RUNTESTS = '''#!/usr/bin/env python
"""Runs the test modules named on the command line, as Django's tests/runtests.py does."""

import argparse
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--settings")
parser.add_argument("--parallel")
args = parser.parse_args()
suite = unittest.defaultTestLoader.loadTestsFromNames(args.labels or ["test_slug"])
result = unittest.TextTestRunner(verbosity=args.verbosity).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
'''
SLUG_TESTS = """import unittest

from textkit.slug import slugify


class SlugTests(unittest.TestCase):
    def test_spaces(self):
        self.assertEqual(slugify("a  b c"), "a-b-c")

    def test_lowercase(self):
        self.assertEqual(slugify("Hello World"), "hello-world")
"""
SLUG_NEW_TEST = """
    def test_punctuation(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
"""


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "SWE Demo",
        "GIT_AUTHOR_EMAIL": "demo@example.invalid",
        "GIT_COMMITTER_NAME": "SWE Demo",
        "GIT_COMMITTER_EMAIL": "demo@example.invalid",
        "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
        "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
    }
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, text=True, capture_output=True, check=True
    )
    return done.stdout


def _write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _repository(
    work: Path,
    name: str,
    base: dict[str, str],
    fix: dict[str, str],
    tests: dict[str, str],
) -> tuple[Path, str, str, str]:
    """A repository whose ``main`` has the base commit then the fix; (bundle, base, patch,
    test_patch)."""
    repo = work / name
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, base)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{name}: the first version")
    base_commit = _git(repo, "rev-parse", "HEAD").strip()
    _write(repo, fix)
    patch = _git(repo, "diff")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{name}: fix")
    _write(repo, tests)
    _git(repo, "add", "-A")
    test_patch = _git(repo, "diff", "--cached")
    _git(repo, "commit", "-q", "-m", f"{name}: test the fix")
    bundle = work / f"demo__{name}.bundle"
    _git(repo, "bundle", "create", "-q", str(bundle), "--all")
    return bundle, base_commit, patch, test_patch


def build(out: Path = DATA) -> list[dict[str, Any]]:
    """Write the bundles and ``demo.jsonl`` into ``out``; the rows."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle, base, patch, test_patch = _repository(
            work,
            "calc",
            {"calc/__init__.py": "", "calc/ops.py": CALC_OPS, "tests/test_ops.py": CALC_TESTS},
            {"calc/ops.py": CALC_FIX},
            {"tests/test_ops.py": CALC_TESTS + CALC_NEW_TEST},
        )
        (out / "repos").mkdir(parents=True, exist_ok=True)
        (out / "repos" / bundle.name).write_bytes(bundle.read_bytes())
        rows.append(
            {
                "instance_id": "demo__calc-1",
                "repo": "demo/calc",
                "base_commit": base,
                "patch": patch,
                "test_patch": test_patch,
                "problem_statement": "calc.ops.mean([]) raises ZeroDivisionError. The mean of "
                "no values should raise ValueError('mean of no values') instead.",
                "hints_text": "",
                "version": "1.0",
                "created_at": "2024-01-01T00:00:00Z",
                "environment_setup_commit": base,
                "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_mean_of_nothing"]),
                "PASS_TO_PASS": json.dumps(
                    [f"tests/test_ops.py::test_{t}" for t in ("add", "divide", "mean")]
                ),
                "test_cmd": "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA "
                "-p no:cacheprovider",
            }
        )
        bundle, base, patch, test_patch = _repository(
            work,
            "textkit",
            {
                "textkit/__init__.py": "",
                "textkit/slug.py": SLUG,
                "tests/runtests.py": RUNTESTS,
                "tests/test_slug.py": SLUG_TESTS,
            },
            {"textkit/slug.py": SLUG_FIX},
            {"tests/test_slug.py": SLUG_TESTS + SLUG_NEW_TEST},
        )
        (out / "repos" / bundle.name).write_bytes(bundle.read_bytes())
        name = "test_{0} (test_slug.SlugTests.test_{0})"
        rows.append(
            {
                "instance_id": "demo__textkit-1",
                "repo": "demo/textkit",
                "base_commit": base,
                "patch": patch,
                "test_patch": test_patch,
                "problem_statement": "textkit.slug.slugify keeps punctuation: "
                "slugify('Hello, World!') gives 'hello,-world!'. Slugs should hold only word "
                "characters and hyphens: 'hello-world'.",
                "hints_text": "",
                "version": "1.0",
                "created_at": "2024-01-01T00:00:00Z",
                "environment_setup_commit": base,
                "FAIL_TO_PASS": json.dumps([name.format("punctuation")]),
                "PASS_TO_PASS": json.dumps([name.format(t) for t in ("spaces", "lowercase")]),
                "test_cmd": "python tests/runtests.py --verbosity 2",
                "log_parser": "django",
            }
        )
    with (out / "demo.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    for row in build():
        sys.stdout.write(f"{row['instance_id']} {row['base_commit']}\n")
