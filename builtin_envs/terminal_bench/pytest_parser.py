"""Terminal-Bench's ``pytest`` parser: the tests' results from what ``run-tests.sh`` printed.

The rules (Terminal-Bench 1's, re-implemented):

- Only what follows the first ``=== short test summary info ===`` line counts (the heading is
  matched without regard to case or the number of ``=``). Output without it has no results:
  the run *has no summary* (a crash, a timeout, no test collected), which fails the task.
- Each following line that starts with a status word names a test: ``PASSED``, ``FAILED``,
  ``ERROR``, ``SKIPPED``, ``XFAIL`` or ``XPASS`` (a trailing ``:`` is ignored), then its path;
  the test's name is what follows the path's first ``::`` (the whole path when it has none). A
  ``FAILED`` line loses its last `` - message``. Other lines are ignored; a later line about
  the same name wins.
- ``PASSED``, ``SKIPPED`` and ``XFAIL`` count as passed; ``FAILED``, ``ERROR`` and ``XPASS`` as
  failed.

    >>> report = parse_pytest('''
    ... =========================== short test summary info ============================
    ... PASSED ../tests/test_outputs.py::test_exists
    ... FAILED ../tests/test_outputs.py::test_value - assert 1 == 2
    ... ========================= 1 failed, 1 passed in 0.05s =========================
    ... ''')
    >>> report.summary_found, report.statuses
    (True, {'test_exists': 'PASSED', 'test_value': 'FAILED'})
    >>> report.passed, report.total, report.resolved
    (1, 2, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["COUNTS_AS_PASSED", "STATUSES", "PytestReport", "parse_pytest"]

STATUSES = ("PASSED", "FAILED", "SKIPPED", "XFAIL", "XPASS", "ERROR")
"""The status words of pytest's short summary (``-rA``)."""
COUNTS_AS_PASSED = frozenset({"PASSED", "SKIPPED", "XFAIL"})
"""The statuses Terminal-Bench counts as a passed test."""

_HEADING = re.compile(r"=+\s*short test summary info\s*=+", re.IGNORECASE)
_MESSAGE = " - "


@dataclass(frozen=True)
class PytestReport:
    """The parse of one test run."""

    summary_found: bool
    statuses: dict[str, str] = field(default_factory=dict)  # test name -> status word

    def passed_tests(self, *, strict: bool = False) -> list[str]:
        """The tests that count as passed (``strict``: ``PASSED`` only)."""
        good = frozenset({"PASSED"}) if strict else COUNTS_AS_PASSED
        return [name for name, status in self.statuses.items() if status in good]

    @property
    def passed(self) -> int:
        """How many tests count as passed (Terminal-Bench's rule)."""
        return len(self.passed_tests())

    @property
    def total(self) -> int:
        """How many tests the summary names."""
        return len(self.statuses)

    @property
    def resolved(self) -> bool:
        """Every named test passed, and there is at least one."""
        return self.summary_found and self.total > 0 and self.passed == self.total


def _result(line: str) -> tuple[str, str] | None:
    """``(name, status)`` of one summary line, or None when it names no test."""
    if line.startswith("FAILED"):
        parts = line.split(_MESSAGE)
        if len(parts) > 1:
            line = _MESSAGE.join(parts[:-1])
    words = line.split(maxsplit=1)
    if len(words) < 2:
        return None
    status = words[0].strip().strip(":")
    if status not in STATUSES:
        return None
    name = words[1].strip().split("::", 1)[-1]
    return (name, status) if name else None


def parse_pytest(output: str) -> PytestReport:
    """The tests' statuses in ``output`` (see the module's rules)."""
    parts = _HEADING.split(output, maxsplit=1)
    if len(parts) < 2:
        return PytestReport(summary_found=False)
    statuses: dict[str, str] = {}
    for line in parts[1].splitlines():
        found = _result(line)
        if found is not None:
            statuses[found[0]] = found[1]
    return PytestReport(summary_found=True, statuses=statuses)
