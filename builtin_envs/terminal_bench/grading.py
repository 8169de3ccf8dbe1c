"""The reward of a task from its test run, as Terminal-Bench grades it.

:func:`grade` turns what ``run-tests.sh`` printed (and how it ended) into the reward's result:

- a task without tests is **invalid**: ``reward`` is None, neither passed nor failed;
- tests past ``max_test_timeout_sec``: ``outcome`` ``test_timeout``, reward 0;
- output without pytest's short summary: ``no_summary``, reward 0 (Terminal-Bench's parse
  error), and a summary naming no test: ``no_tests``, reward 0;
- else ``passed`` when every named test passed (:mod:`.pytest_parser`'s rule), ``failed``
  otherwise; the reward is 1 or 0 (``scoring="all"``, Terminal-Bench's), or the fraction of
  the named tests that passed (``scoring="fraction"``).

    >>> run = TestRun(output="== short test summary info ==\\nPASSED t.py::test_a\\n"
    ...               "FAILED t.py::test_b - x\\n", exit_code=1, seconds=0.4)
    >>> grade("demo", run)["reward"], grade("demo", run, scoring="fraction")["reward"]
    (0.0, 0.5)
    >>> grade("demo", None, invalid="the task has no tests/ directory")["invalid"]
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from builtin_envs.terminal_bench.pytest_parser import parse_pytest

__all__ = ["OUTPUT_TAIL", "Scoring", "TestRun", "grade"]

OUTPUT_TAIL = 4000
"""Characters of the test output's end kept in the result."""

Scoring = Literal["all", "fraction"]


@dataclass(frozen=True)
class TestRun:
    """How one run of ``run-tests.sh`` ended."""

    __test__ = False  # not a pytest test class

    output: str
    exit_code: int | None
    seconds: float
    timed_out: bool = False


def grade(
    task: str,
    run: TestRun | None,
    *,
    scoring: Scoring = "all",
    strict: bool = False,
    invalid: str | None = None,
    agent_timed_out: bool = False,
) -> dict[str, Any]:
    """The reward's result for ``task`` (see the module's rules). ``run`` is None only for an
    invalid task (``invalid`` says why); ``strict`` counts only ``PASSED`` tests as passed."""
    result: dict[str, Any] = {
        "task": task,
        "reward": None,
        "resolved": None,
        "invalid": invalid is not None,
        "outcome": "invalid",
        "scoring": scoring,
        "tests": {},
        "passed": 0,
        "total": 0,
        "parser": "not_run",
        "exit_code": None,
        "test_seconds": 0.0,
        "agent_timed_out": agent_timed_out,
        "output_tail": "",
    }
    if invalid is not None or run is None:
        result["reason"] = invalid or "the tests did not run"
        return result
    report = parse_pytest(run.output)
    good = set(report.passed_tests(strict=strict))
    passed = len(good)
    total = report.total
    if run.timed_out:
        outcome = "test_timeout"
    elif not report.summary_found:
        outcome = "no_summary"
    elif total == 0:
        outcome = "no_tests"
    else:
        outcome = "passed" if passed == total else "failed"
    resolved = outcome == "passed"
    if scoring == "fraction":
        reward = passed / total if total and outcome in ("passed", "failed") else 0.0
    else:
        reward = 1.0 if resolved else 0.0
    result.update(
        reward=reward,
        resolved=resolved,
        outcome=outcome,
        tests={name: status.lower() for name, status in report.statuses.items()},
        passed=passed if outcome in ("passed", "failed") else 0,
        total=total,
        parser="parsed" if report.summary_found else "no_summary",
        exit_code=run.exit_code,
        test_seconds=round(run.seconds, 3),
        output_tail=run.output[-OUTPUT_TAIL:],
    )
    return result
