"""terminal-bench's pytest parser and grading on what real pytest runs print.

Every output here is captured from pytest itself (this interpreter's, run as a task's
``run-tests.sh`` runs it: ``pytest FILE -rA``): each outcome (passed, failed, error, skipped,
xfail, xpass, parametrized, a class's method), a collection error, a crash mid-run, a run without
``-rA`` (no short summary) and one cut before its last line. Each is checked against what the
rules say, and against Terminal-Bench's own parser (``terminal-bench`` 0.2.18 from PyPI, in a
virtual environment of its own with a Python >= 3.12: ``tests/_oracles.py``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builtin_envs.terminal_bench import TestRun, grade, parse_pytest
from tests._oracles import TERMINAL_BENCH, oracle_python

EVERY_OUTCOME = """
import pytest


@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")


def test_passes():
    assert True


def test_fails():
    assert 1 == 2, "one is not two - really"


def test_errors(broken):
    pass


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


@pytest.mark.xfail(reason="a known bug")
def test_xfails():
    assert False


@pytest.mark.xfail(reason="fixed already")
def test_xpasses():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1


class TestGroup:
    def test_method(self):
        pass
"""

CRASH = """
import os


def test_before():
    pass


def test_crashes():
    os._exit(3)  # the interpreter is gone mid-run: no summary is printed


def test_after():
    pass
"""

PASSING = """
def test_one():
    pass


def test_two():
    pass
"""

BROKEN = "import this_module_does_not_exist\n\n\ndef test_never():\n    pass\n"


def _pytest_output(directory: Path, name: str, source: str, *args: str) -> str:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", COLUMNS="160")
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(path), *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real pytest outputs, one per case."""
    where = tmp_path_factory.mktemp("runs")
    runs = {
        "every outcome": ("test_every.py", EVERY_OUTCOME, "-rA"),
        "crash mid-run": ("test_crash.py", CRASH, "-rA"),
        "no -rA": ("test_passing.py", PASSING),
        "all passed": ("test_passing2.py", PASSING, "-rA"),
        "collection error": ("test_broken.py", BROKEN, "-rA"),
    }
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        futures = {case: pool.submit(_pytest_output, where, *run) for case, run in runs.items()}
        found = {case: future.result() for case, future in futures.items()}
    # the same output without its last line ("== 2 failed, 3 passed, ... in 0.29s ==")
    found["no last line"] = found["every outcome"].rstrip("\n").rsplit("\n", 1)[0]
    found["nothing"] = ""
    return found


def test_every_outcome_is_read_with_terminal_benchs_rules(outputs: dict[str, str]) -> None:
    report = parse_pytest(outputs["every outcome"])
    assert report.summary_found
    skipped = [name for name, status in report.statuses.items() if status == "SKIPPED"]
    assert len(skipped) == 1
    assert skipped[0].startswith("[1] test_every.py:")
    assert skipped[0].endswith(": not today")
    # the name is what follows the path's first "::"; a FAILED line loses its last " - ..."
    # (a message holding " - " keeps the rest), other lines keep their message: Terminal-Bench's
    # quirks, kept
    assert report.statuses == {
        "test_passes": "PASSED",
        "test_param[1]": "PASSED",
        "TestGroup::test_method": "PASSED",
        skipped[0]: "SKIPPED",
        "test_xfails - a known bug": "XFAIL",
        "test_xpasses - fixed already": "XPASS",
        "test_errors - RuntimeError: the fixture broke": "ERROR",
        "test_fails - AssertionError: one is not two": "FAILED",
        "test_param[2]": "FAILED",
    }
    # SKIPPED and XFAIL count as passed; FAILED, ERROR and XPASS as failed
    assert set(report.passed_tests()) == {
        "test_passes",
        "test_param[1]",
        "TestGroup::test_method",
        skipped[0],
        "test_xfails - a known bug",
    }
    assert set(report.passed_tests(strict=True)) == {
        "test_passes",
        "test_param[1]",
        "TestGroup::test_method",
    }
    assert (report.passed, report.total, report.resolved) == (5, 9, False)


def test_runs_without_a_summary_have_no_results(outputs: dict[str, str]) -> None:
    for case in ("crash mid-run", "no -rA", "nothing"):
        report = parse_pytest(outputs[case])
        assert not report.summary_found, case
        assert report.statuses == {}
        assert not report.resolved
    # the crash left its progress line: tests ran, none is named in a summary
    assert "test_crash.py ." in outputs["crash mid-run"]


def test_a_summary_without_its_last_line_still_counts(outputs: dict[str, str]) -> None:
    every, cut = parse_pytest(outputs["every outcome"]), parse_pytest(outputs["no last line"])
    assert "failed" not in outputs["no last line"].splitlines()[-1]
    assert cut.summary_found
    assert cut.statuses == every.statuses


def test_all_passed_and_collection_error(outputs: dict[str, str]) -> None:
    passed = parse_pytest(outputs["all passed"])
    assert passed.statuses == {"test_one": "PASSED", "test_two": "PASSED"}
    assert passed.resolved
    broken = parse_pytest(outputs["collection error"])
    assert list(broken.statuses.values()) == ["ERROR"]  # "ERROR test_broken.py": the file
    assert not broken.resolved


def test_grading_each_outcome(outputs: dict[str, str]) -> None:
    def graded(case: str, **kw: object) -> dict[str, object]:
        run = TestRun(output=outputs[case], exit_code=1, seconds=0.5)
        return grade("t", run, **kw)  # type: ignore[arg-type]

    passed = graded("all passed")
    assert (passed["reward"], passed["outcome"], passed["passed"], passed["total"]) == (
        1.0,
        "passed",
        2,
        2,
    )
    every = graded("every outcome")
    assert (every["reward"], every["outcome"], every["resolved"]) == (0.0, "failed", False)
    fraction = graded("every outcome", scoring="fraction")
    assert fraction["reward"] == pytest.approx(5 / 9)
    strict = graded("every outcome", scoring="fraction", strict=True)
    assert strict["reward"] == pytest.approx(3 / 9)
    crash = graded("crash mid-run")
    assert (crash["reward"], crash["outcome"], crash["parser"]) == (0.0, "no_summary", "no_summary")
    assert crash["output_tail"].endswith(outputs["crash mid-run"][-100:])
    timeout = grade("t", TestRun(outputs["all passed"], None, 9.0, timed_out=True))
    assert (timeout["reward"], timeout["outcome"]) == (0.0, "test_timeout")
    bare = grade("t", TestRun("=== short test summary info ===\n", 0, 0.1))
    assert (bare["reward"], bare["outcome"]) == (0.0, "no_tests")  # Terminal-Bench: resolved
    invalid = grade("t", None, invalid="the task has no tests/ directory")
    assert (invalid["reward"], invalid["invalid"], invalid["outcome"]) == (None, True, "invalid")


# -- Terminal-Bench's own parser, as the oracle -------------------------------------------------

_ORACLE_DRIVER = r"""
import importlib.util, json, sys, types
from pathlib import Path

site = Path(sys.argv[1])
for name in ("terminal_bench", "terminal_bench.parsers", "terminal_bench.utils"):
    package = types.ModuleType(name)
    package.__path__ = [str(site / name.replace(".", "/"))]
    sys.modules[name] = package  # the real modules below, without the packages' __init__
for name in ("terminal_bench.utils.logger", "terminal_bench.parsers.base_parser",
             "terminal_bench.parsers.pytest_parser"):
    spec = importlib.util.spec_from_file_location(name, site / (name.replace(".", "/") + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
parser = sys.modules["terminal_bench.parsers.pytest_parser"].PytestParser()
answers = []
for text in json.load(sys.stdin):
    try:
        results = parser.parse(text)
    except Exception as exc:
        answers.append({"error": type(exc).__name__})
        continue
    statuses = {name: status.value for name, status in results.items()}
    answers.append({"results": statuses, "resolved": all(s == "passed" for s in statuses.values())})
print(json.dumps(answers))
"""


def _oracle() -> tuple[Path, Path]:
    """``(python, site-packages)`` of Terminal-Bench's environment (tests/_oracles.py)."""
    python = oracle_python(TERMINAL_BENCH)
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return python, Path(found.stdout.strip())


def test_terminal_benchs_own_parser_reads_every_output_the_same(outputs: dict[str, str]) -> None:
    python, site = _oracle()
    cases = sorted(outputs)
    done = subprocess.run(
        [str(python), "-I", "-c", _ORACLE_DRIVER, str(site)],
        input=json.dumps([outputs[c] for c in cases]),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for case, theirs in zip(cases, json.loads(done.stdout), strict=True):
        ours = parse_pytest(outputs[case])
        if "error" in theirs:  # Terminal-Bench: a parse error, the task unresolved
            assert not ours.summary_found, case
            continue
        verdicts = {n: "passed" if n in ours.passed_tests() else "failed" for n in ours.statuses}
        assert verdicts == theirs["results"], case
        # one deliberate difference: a summary naming no test is not resolved here
        assert ours.resolved == (theirs["resolved"] and bool(theirs["results"])), case
