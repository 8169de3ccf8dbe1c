"""SWE-bench's grading of a test run, written anew from its behaviour (``swebench`` 5.0).

A run's log holds the test output between two markers the evaluation script prints
(:data:`START_TEST_OUTPUT`, :data:`END_TEST_OUTPUT`) and the test command's exit status after
them (:data:`TEST_EXIT_CODE`). :func:`logs_eval` parses it into ``{test: status}`` or says the
run is not gradable; :func:`eval_tests_report` sorts the instance's ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` tests into success and failure; :func:`resolution_status` is
``RESOLVED_FULL`` (every F2P test passes and no P2P test broke), ``RESOLVED_PARTIAL`` or
``RESOLVED_NO``; :func:`eval_report` is the per-instance report of ``swebench``'s
``get_eval_report``. The rules, as SWE-bench has them:

- PASSED and XFAIL pass; FAILED and ERROR fail; a test missing from the log fails.
- An F2P test that is SKIPPED fails (skipping is no fix); a P2P test that is SKIPPED is kept.
- An expected id cut inside its ``[...]`` parameters (SWE-bench Verified has such ids) matches
  the logged ids it is a prefix of, when they agree on passing or not.
- A log with a failure marker (patch apply failed, reset failed, tests errored or timed out),
  without both output markers, with no parsed test and no sign a suite ran, or whose test
  command exited non-zero while no test failed, is not gradable: nothing resolves.
- ``fail_only`` repositories grade by the failures in the log alone.

``tests/test_swe_grading.py`` checks every function against the ``swebench`` package's own.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any

from builtin_envs.swe.log_parsers import Parser

__all__ = [
    "APPLY_PATCH_FAIL",
    "END_TEST_OUTPUT",
    "FAIL_TO_FAIL",
    "FAIL_TO_PASS",
    "PASS_TO_FAIL",
    "PASS_TO_PASS",
    "RESET_FAILED",
    "START_TEST_OUTPUT",
    "TESTS_ERROR",
    "TESTS_TIMEOUT",
    "TEST_EXIT_CODE",
    "EvalType",
    "ResolvedStatus",
    "TestStatus",
    "classify_infra_failure",
    "eval_report",
    "eval_tests_report",
    "logs_eval",
    "resolution_status",
]


class TestStatus(enum.StrEnum):
    """A test's status in a parsed log."""

    __test__ = False  # not a pytest test class

    FAILED = "FAILED"
    PASSED = "PASSED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


class ResolvedStatus(enum.StrEnum):
    """Whether an instance is resolved."""

    NO = "RESOLVED_NO"
    PARTIAL = "RESOLVED_PARTIAL"
    FULL = "RESOLVED_FULL"


class EvalType(enum.StrEnum):
    """How tests are graded: by passes and failures, or by failures alone."""

    PASS_AND_FAIL = "pass_and_fail"
    FAIL_ONLY = "fail_only"


FAIL_TO_PASS = "FAIL_TO_PASS"
FAIL_TO_FAIL = "FAIL_TO_FAIL"
PASS_TO_PASS = "PASS_TO_PASS"
PASS_TO_FAIL = "PASS_TO_FAIL"

APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
RESET_FAILED = ">>>>> Reset Failed"
TESTS_ERROR = ">>>>> Tests Errored"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"

_FAILURE_MARKERS = (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)
_PASSING = frozenset({TestStatus.PASSED.value, TestStatus.XFAIL.value})
_FAILING = frozenset({TestStatus.FAILED.value, TestStatus.ERROR.value})
_EXIT_CODE = re.compile(re.escape(TEST_EXIT_CODE) + r":\s*(-?\d+)")
# Signs that a runner ran although no test was parsed (SWE-bench's JavaScript runners' summaries)
_SUITE_RAN = re.compile(
    "|".join(
        (
            r"Executed [1-9]\d* of \d+",
            r"TOTAL: [1-9]\d* (?:SUCCESS|FAILED)",
            r"[1-9]\d* passing",
            r"Tests:\s+[1-9]\d*",
            r"Test Suites:\s+(?:\d+ \w+, )*[1-9]\d* total",
            r"^# tests [1-9]\d*",
            r"[1-9]\d* specs?, \d+ failures?",
            r"': ok$",
        )
    ),
    re.MULTILINE,
)


def recorded_exit_code(log: str) -> int | None:
    """The test command's exit status the evaluation script wrote, or None."""
    match = _EXIT_CODE.search(log)
    return int(match.group(1)) if match else None


def logs_eval(log: str, parser: Parser) -> tuple[dict[str, str], bool]:
    """``({test: status}, True)`` from a run's log, or ``({}, False)`` when it is not gradable."""
    if any(marker in log for marker in _FAILURE_MARKERS):
        return {}, False
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return {}, False
    between = log.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    statuses = parser(between) or parser(log)  # some runners print outside the markers
    if not statuses and not _SUITE_RAN.search(log):
        return {}, False
    code = recorded_exit_code(log)
    if code not in (None, 0) and statuses and not any(s in _FAILING for s in statuses.values()):
        return {}, False  # the log claims no failure but the command failed: not this run's log
    return statuses, True


def _key(test: str, statuses: Mapping[str, str]) -> str | None:
    """The logged id of ``test``: itself, or for an id cut inside its parameters, the ids it
    is a prefix of when they agree on passing."""
    if test in statuses:
        return test
    if test.count("[") > test.count("]"):
        matches = [name for name in statuses if name.startswith(test)]
        if matches and len({statuses[name] in _PASSING for name in matches}) == 1:
            return matches[0]
    return None


def _passed(test: str, statuses: Mapping[str, str]) -> bool:
    key = _key(test, statuses)
    return key is not None and statuses[key] in _PASSING


def _kept(test: str, statuses: Mapping[str, str]) -> bool:
    key = _key(test, statuses)
    return _passed(test, statuses) or (
        key is not None and statuses[key] == TestStatus.SKIPPED.value
    )


def _failed(test: str, statuses: Mapping[str, str]) -> bool:
    key = _key(test, statuses)
    return key is None or statuses[key] in _FAILING or statuses[key] == TestStatus.SKIPPED.value


def _sort(
    tests: Sequence[str], statuses: Mapping[str, str], eval_type: EvalType, *, kept: bool
) -> dict[str, list[str]]:
    success: list[str] = []
    failure: list[str] = []
    for test in tests:
        if eval_type is EvalType.FAIL_ONLY:
            failing = statuses.get(test) == TestStatus.FAILED.value
            (failure if failing else success).append(test)
        elif (_kept if kept else _passed)(test, statuses):
            success.append(test)
        elif _failed(test, statuses):
            failure.append(test)
        # any other status (a word pytest printed that is no status) counts as neither
    return {"success": success, "failure": failure}


def eval_tests_report(
    statuses: Mapping[str, str],
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    eval_type: EvalType | str = EvalType.PASS_AND_FAIL,
    *,
    fail_to_fail: Sequence[str] | None = None,
    pass_to_fail: Sequence[str] | None = None,
) -> dict[str, dict[str, list[str]]]:
    """``{FAIL_TO_PASS: {"success": [...], "failure": [...]}, PASS_TO_PASS: ..., FAIL_TO_FAIL:
    ..., PASS_TO_FAIL: ...}`` (the last two empty unless their tests are given)."""
    kind = EvalType(eval_type)
    return {
        FAIL_TO_PASS: _sort(fail_to_pass, statuses, kind, kept=False),
        PASS_TO_PASS: _sort(pass_to_pass, statuses, kind, kept=True),
        FAIL_TO_FAIL: _sort(fail_to_fail or (), statuses, kind, kept=False),
        PASS_TO_FAIL: _sort(pass_to_fail or (), statuses, kind, kept=False),
    }


def _ratio(part: Mapping[str, Sequence[str]]) -> float:
    total = len(part["success"]) + len(part["failure"])
    return 1.0 if total == 0 else len(part["success"]) / total


def resolution_status(report: Mapping[str, Mapping[str, Sequence[str]]]) -> ResolvedStatus:
    """FULL when every F2P and P2P test succeeded, PARTIAL when some F2P did and every P2P,
    else NO."""
    f2p = _ratio(report[FAIL_TO_PASS])
    p2p = _ratio(report[PASS_TO_PASS])
    if f2p == 1 and p2p == 1:
        return ResolvedStatus.FULL
    if 0 < f2p < 1 and p2p == 1:
        return ResolvedStatus.PARTIAL
    return ResolvedStatus.NO


_INFRA_SIGNATURES = tuple(
    (reason, tier, re.compile(pattern, re.MULTILINE))
    for reason, tier, pattern in (
        ("browser_launch_failed", "environment", r"Failed to launch|Failed to connect to the bus"),
        (
            "display_unavailable",
            "environment",
            r"cannot open display|Missing X server|unable to open X display",
        ),
        ("out_of_memory", "environment", r"Cannot allocate memory|OutOfMemoryError|^Killed$"),
        (
            "container_unavailable",
            "environment",
            r"Error response from daemon|Cannot connect to the Docker daemon",
        ),
        (
            "network_unreachable",
            "environment",
            r"Could not resolve host|Temporary failure in name resolution",
        ),
        (
            "missing_module",
            "ambiguous",
            r"Cannot find module|MODULE_NOT_FOUND|ModuleNotFoundError",
        ),
        ("no_tests_collected", "ambiguous", r"no tests ran|collected 0 items"),
        ("tests_timed_out", "ambiguous", r"Timeout error: \d+ seconds exceeded"),
    )
)


def classify_infra_failure(log: str) -> tuple[str, str] | None:
    """``(reason, tier)`` of the first infrastructure-failure signature in ``log``, or None;
    tier ``environment`` cannot come from a patch, ``ambiguous`` can."""
    if not log:
        return None
    for reason, tier, pattern in _INFRA_SIGNATURES:
        if pattern.search(log):
            return reason, tier
    return None


def eval_report(
    log: str,
    parser: Parser,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    eval_type: EvalType | str = EvalType.PASS_AND_FAIL,
    *,
    patch: str | None = "",
    include_tests_status: bool = True,
) -> dict[str, Any]:
    """One instance's report as ``swebench``'s ``get_eval_report`` makes it: ``patch_is_None``,
    ``patch_exists``, ``patch_successfully_applied``, ``resolved``, ``infra_failure`` (and
    ``infra_failure_reason``), ``tests_status``."""
    report: dict[str, Any] = {
        "patch_is_None": False,
        "patch_exists": False,
        "patch_successfully_applied": False,
        "resolved": False,
        "infra_failure": False,
    }
    if patch is None:
        report["patch_is_None"] = True
        return report
    report["patch_exists"] = True
    statuses, found = logs_eval(log, parser)
    if not found:
        classified = classify_infra_failure(log)
        if classified is not None:
            report["infra_failure"] = classified[1] == "environment"
            report["infra_failure_reason"] = classified[0]
        return report
    report["patch_successfully_applied"] = True
    tests = eval_tests_report(statuses, fail_to_pass, pass_to_pass, eval_type)
    report["resolved"] = resolution_status(tests) is ResolvedStatus.FULL
    if include_tests_status:
        report["tests_status"] = tests
    return report
