"""The reward of a task from its test run, as Terminal-Bench grades it.

:func:`grade` turns what ``run-tests.sh`` printed (and how it ended) into the reward's result:

- a task without tests is **invalid**: ``reward`` is None, neither passed nor failed;
- tests past ``max_test_timeout_sec``: ``outcome`` ``test_timeout``, reward 0;
- output without pytest's short summary: ``no_summary``, reward 0 (Terminal-Bench's parse
  error), and a summary naming no test: ``no_tests``, reward 0;
- else ``passed`` when every named test passed (:mod:`.pytest_parser`'s rule), ``failed``
  otherwise; the reward is 1 or 0 (``scoring="all"``, Terminal-Bench's), or the fraction of
  the named tests that passed (``scoring="fraction"``).

With the judge's reports (``TestRun.reports``: pytest's own outcomes, one per pytest run, from
a channel only the judge holds), :func:`judge_verdict` must also hold: every test pytest
collected from ``/tests`` passed in its report (a skip or xfail counts only when the test's own
``skip``/``skipif``/``xfail`` marker made it), and the summary names exactly those tests with the
same outcomes. Else the outcome is ``failed``, reward 0 whatever the scoring, and ``reason``
says why: a summary naming a test pytest did not collect, or fewer than it collected, a killed
or crashed pytest (no report), a summary that disagrees with the report, a test that raised
whose report was rewritten to passed (status ``altered``).

    >>> run = TestRun(output="== short test summary info ==\\nPASSED t.py::test_a\\n"
    ...               "FAILED t.py::test_b - x\\n", exit_code=1, seconds=0.4)
    >>> grade("demo", run)["reward"], grade("demo", run, scoring="fraction")["reward"]
    (0.0, 0.5)
    >>> grade("demo", None, invalid="the task has no tests/ directory")["invalid"]
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from builtin_envs.terminal_bench.pytest_parser import parse_pytest

__all__ = ["OUTPUT_TAIL", "TESTS_DIR", "Scoring", "TestRun", "grade", "judge_verdict"]

TESTS_DIR = "/tests"
"""Where the task's tests are in the judge's box: only tests collected from there count."""
_FOLDED = re.compile(r"^\[(\d+)\] ")  # a SKIPPED line: "[N] path:line: reason"

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
    reports: tuple[dict[str, Any], ...] | None = None
    """What the judge's channel carried, one item per pytest run (None: no judge)."""


def grade(
    task: str,
    run: TestRun | None,
    *,
    scoring: Scoring = "all",
    strict: bool = False,
    invalid: str | None = None,
    agent_timed_out: bool = False,
    judge: dict[str, Any] | None = None,
    tests_dir: str = TESTS_DIR,
) -> dict[str, Any]:
    """The reward's result for ``task`` (see the module's rules). ``run`` is None only for an
    invalid task (``invalid`` says why); ``strict`` counts only ``PASSED`` tests as passed.
    ``judge`` (what the judge removed or ignored before the run) goes into the result's
    ``judge``, with the verdict on ``run.reports`` (tests collected from ``tests_dir``)."""
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
    if judge is not None:
        result["judge"] = dict(judge)
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
    forged = False
    if run.reports is not None and not run.timed_out:
        reason, seen = judge_verdict(
            run.reports, report.statuses, strict=strict, tests_dir=tests_dir
        )
        judged = result.setdefault("judge", {})
        judged.update(report=seen, verdict=reason or "agrees")
        if reason is not None:
            result["reason"] = reason
            forged = seen.get("agrees") is False
            if outcome == "passed" or forged:
                outcome = "failed"
    resolved = outcome == "passed"
    if forged:
        reward = 0.0
    elif scoring == "fraction":
        reward = passed / total if total and outcome in ("passed", "failed") else 0.0
        judged_report = result.get("judge", {}).get("report", {})
        if judged_report.get("total"):  # never more than pytest's own report says
            reward = min(reward, judged_report["passed"] / judged_report["total"])
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


def _status_of(report: dict[str, Any], nodeid: str) -> str:
    found = report.get("outcomes", {}).get(nodeid)
    return str(found.get("status")) if isinstance(found, dict) else "not run"


def judge_verdict(
    reports: tuple[dict[str, Any], ...],
    statuses: dict[str, str],
    *,
    strict: bool = False,
    tests_dir: str = TESTS_DIR,
) -> tuple[str | None, dict[str, Any]]:
    """Whether pytest's own ``reports`` (the judge's channel) back the parsed summary
    (``statuses``: name -> status word): ``(None, what was seen)`` when every test pytest
    collected from ``tests_dir`` (where the judge put the task's tests) passed and the summary
    says the same, else ``(reason, ...)``.
    ``seen["agrees"]`` is False when the summary contradicts the report (a forgery), True
    when they agree (the tests may still have failed)."""
    seen: dict[str, Any] = {"runs": len(reports), "tests": {}, "ignored": [], "agrees": None}
    if not reports:
        seen["agrees"] = False
        return (
            "pytest's own report never reached the judge: run-tests.sh ran no pytest "
            "through uv, or pytest was killed before it started",
            seen,
        )
    tests: dict[str, str] = {}
    marks: dict[str, set[str]] = {}
    for run in reports:
        if run.get("error"):
            seen["agrees"] = False
            return f"the judge's pytest failed: {run['error']}", seen
        if run.get("signal"):
            seen["agrees"] = False
            return f"pytest was killed by signal {run['signal']} before its session ended", seen
        report = run.get("report")
        if not isinstance(report, dict):
            seen["agrees"] = False
            why = run.get("report_error") or "it crashed, or was made to exit early"
            return f"pytest exited ({run.get('exit')}) without its report: {why}", seen
        if report.get("exitstatus") != run.get("exit"):
            seen["agrees"] = False
            return (
                f"pytest exited with {run.get('exit')} but its session ended with "
                f"{report.get('exitstatus')}: something else ended the process",
                seen,
            )
        if report.get("collect_errors"):
            seen["agrees"] = True
            return f"pytest could not collect {', '.join(report['collect_errors'])}", seen
        for item in report.get("collected", []):
            nodeid, path = str(item.get("nodeid", "")), str(item.get("path", ""))
            if not path.startswith(tests_dir.rstrip("/") + "/"):
                seen["ignored"].append(nodeid)
                continue
            name = nodeid.split("::", 1)[-1]
            status = _status_of(report, nodeid)
            if tests.get(name, "passed") == "passed" or status != "passed":
                tests[name] = status
            marks.setdefault(name, set()).update(str(m) for m in item.get("marks", []))
    seen["tests"] = dict(tests)
    altered = [name for name, status in tests.items() if status == "altered"]
    if altered:
        seen["agrees"] = False
        return (
            f"the outcome of {', '.join(altered)} was rewritten in pytest's process: the test "
            "raised, its report says it passed",
            seen,
        )
    if not tests:
        seen["agrees"] = True
        return "pytest collected no test from the task's tests/", seen
    # the summary's lines, matched to the collected tests
    summary: dict[str, str] = {}
    folded_skips = 0
    unknown: list[str] = []
    for line_name, word in statuses.items():
        folded = _FOLDED.match(line_name)
        if word == "SKIPPED" and folded is not None:
            folded_skips += int(folded.group(1))
            continue
        name = line_name if line_name in tests else line_name.split(" - ", 1)[0]
        if name not in tests:
            unknown.append(line_name)
            continue
        status = word.lower()
        if summary.get(name, "passed") == "passed" or status != "passed":
            summary[name] = status
    if unknown:
        seen["agrees"] = False
        return f"the summary names tests pytest did not collect: {', '.join(unknown)}", seen
    skipped = [n for n, s in tests.items() if s == "skipped" and n not in summary]
    missing = [n for n in tests if n not in summary and n not in skipped]
    if missing or folded_skips != len(skipped):
        seen["agrees"] = False
        named = len(summary) + folded_skips
        return (
            f"the summary names {named} of the {len(tests)} tests pytest collected"
            + (f" (not named: {', '.join(missing)})" if missing else ""),
            seen,
        )
    wrong = [
        f"{n}: {summary[n]} in the summary, {tests[n]}" for n in summary if summary[n] != tests[n]
    ]
    if wrong:
        seen["agrees"] = False
        return f"the summary disagrees with pytest's report ({'; '.join(wrong)})", seen
    seen["agrees"] = True
    good = {"passed"} if strict else {"passed", "skipped", "xfail"}
    failing = []
    for name, status in tests.items():
        if status not in good:
            failing.append(f"{name} {status}")
        elif status == "skipped" and not marks[name] & {"skip", "skipif"}:
            failing.append(f"{name} skipped while it ran (by no skip marker of its own)")
        elif status == "xfail" and "xfail" not in marks[name]:
            failing.append(f"{name} xfail without an xfail marker of its own")
    seen.update(passed=len(tests) - len(failing), total=len(tests))
    if failing:
        return f"not every test passed: {'; '.join(failing)}", seen
    return None, seen
