"""SWE-bench grading (``builtin_envs.swe.grading`` and ``.log_parsers``) against the official
``swebench`` package's own functions (``tests/_swebench_oracle.py``), on captured logs of edge
cases: every parser's map, ``get_logs_eval``, ``get_eval_tests_report``,
``get_resolution_status`` and ``get_eval_report`` must be equal. Logs of real runs in real
instances are compared in ``tests/test_swe_env.py``. Also: rows, test directives, the eval
script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builtin_envs.swe import grading
from builtin_envs.swe.log_parsers import parse_django, parser_for_repo, resolve_parser
from builtin_envs.swe.rows import (
    RowError,
    directives_from_patch,
    eval_script,
    load_rows,
    modified_files,
    parse_row,
)
from tests._swebench_oracle import Case, oracle, ours

START = "+ : '>>>>> Start Test Output'"
END = "+ : '>>>>> End Test Output'"
ALL_PARSERS = [
    "parse_log_pytest",
    "parse_log_pytest_options",
    "parse_log_pytest_v2",
    "parse_log_django",
    "parse_log_seaborn",
    "parse_log_sympy",
    "parse_log_matplotlib",
]


def _wrapped(body: str, code: int | None = None) -> str:
    tail = f"\n>>>>> Test Exit Code: {code}" if code is not None else ""
    return f"+ git apply -v -\nApplied patch cleanly.\n{START}\n{body}\n{END}{tail}\n"


PYTEST_SUMMARY = """\
============================= test session starts ==============================
collected 9 items

tests/test_a.py ..F.sxX.E                                              [100%]

=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_param[1-2]
PASSED tests/test_a.py::test_param[a b]
FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2 - and more
SKIPPED [1] tests/test_a.py:40: needs network
SKIPPED tests/test_a.py::test_skipped_by_name
XFAIL tests/test_a.py::test_known - reason: flaky
XPASS tests/test_a.py::test_surprise
ERROR tests/test_a.py::test_fixture - RuntimeError: boom
PASSED [100%]
PASSED
FAILED
=================== 1 failed, 4 passed, 1 skipped, 1 error in 0.12s ==================="""

DJANGO_LOG = """\
Testing against Django installed in '/testbed/django' with up to 1 processes
Creating test database for alias 'default'...
test_add (admin.tests.AdminTests) ... ok
test_change (admin.tests.AdminTests) ... FAIL
test_delete (admin.tests.AdminTests) ... ERROR
test_skip (admin.tests.AdminTests) ... skipped 'needs postgres'
test_output (admin.tests.AdminTests) ... some output printed here
ok
test_docstring (admin.tests.AdminTests)
The first line of a docstring. ... ok
test_upper (admin.tests.AdminTests) ...  OK
test_expected (admin.tests.AdminTests) ... expected failure
test_interrupted (admin.tests.AdminTests) ... System check identified no issues (0 silenced)
ok
Applying sites.0002_alter_domain_unique...test_no_migrations (migrate.tests.M) ... ok
--version is equivalent to version

======================================================================
FAIL: test_change (admin.tests.AdminTests)
----------------------------------------------------------------------
ERROR: test_delete (admin.tests.AdminTests)
----------------------------------------------------------------------
Ran 9 tests in 0.5s

FAILED (failures=1, errors=1, skipped=1)"""

V2_LOG = (
    "\x1b[32mPASSED\x1b[0m astropy/tests/test_x.py::test_colour\n"
    "PASSED astropy/tests/test_x.py::test_with space[a b]\n"
    "FAILED astropy/tests/test_x.py::test_fail - assert 0 - detail\n"
    "astropy/tests/test_x.py::test_old_style PASSED\n"
    "astropy/tests/test_x.py::test_old_fail FAILED\n"
    "\tPASSED astropy/tests/test_x.py::test_tabbed\n"
    "SKIPPED [2] astropy/tests/test_x.py:9: skip"
)
OPTIONS_LOG = (
    "PASSED tests/test_r.py::test_path[/home/user/data/file.txt]\n"
    "PASSED tests/test_r.py::test_url[//host/path]\n"
    "FAILED tests/test_r.py::test_glob[/a/*/b] - boom\n"
    "PASSED tests/test_r.py::test_plain[x]\n"
    "PASSED tests/test_r.py::test_path[/other/dir/file.txt]\n"
    "FAILED tests/test_r.py::test_path[/third/file.txt]"
)
SYMPY_LOG = (
    "test_basic ok\n"
    "test_fails F\n"
    "test_errs E\n"
    "  test_indented ok\n"
    "________________ sympy/core/tests/test_basic.py:test_broken ________________\n"
    "test_slow ok [12.3s]"
)
SEABORN_LOG = (
    "FAILED tests/test_a.py::test_x - boom\n"
    "tests/test_a.py::test_y PASSED [ 50%]\n"
    "PASSED tests/test_a.py::test_z\n"
    "something PASSED here"
)
MATPLOTLIB_LOG = (
    "PASSED lib/tests/test_b.py::test_click[MouseButton.LEFT]\n"
    "FAILED lib/tests/test_b.py::test_click[MouseButton.RIGHT] - no"
)

CASES = [
    Case(
        "pytest-summary",
        _wrapped(PYTEST_SUMMARY, code=1),
        f2p=["tests/test_a.py::test_two", "tests/test_a.py::test_known"],
        p2p=[
            "tests/test_a.py::test_one",
            "tests/test_a.py::test_skipped_by_name",
            "tests/test_a.py::test_param[1-2]",
            "tests/test_a.py::test_missing",
            "tests/test_a.py::test_surprise",
        ],
        parsers=ALL_PARSERS,
    ),
    Case(
        "pytest-resolved",
        _wrapped("PASSED t.py::test_a\nPASSED t.py::test_b\nSKIPPED t.py::test_c", code=0),
        f2p=["t.py::test_a"],
        p2p=["t.py::test_b", "t.py::test_c"],
    ),
    Case(
        "pytest-f2p-skipped",
        _wrapped("SKIPPED t.py::test_a\nPASSED t.py::test_b", code=0),
        f2p=["t.py::test_a"],
        p2p=["t.py::test_b"],
    ),
    Case(
        "pytest-partial",
        _wrapped("PASSED t.py::test_a\nFAILED t.py::test_b - x\nPASSED t.py::test_c", code=1),
        f2p=["t.py::test_a", "t.py::test_b"],
        p2p=["t.py::test_c"],
    ),
    Case(
        "pytest-truncated-ids",
        _wrapped(
            "PASSED t.py::test_g[log(photon s)]\nPASSED t.py::test_g[log(photon m)]\n"
            "PASSED t.py::test_h[x-1]\nFAILED t.py::test_h[x-2]",
            code=1,
        ),
        f2p=["t.py::test_g[log(photon", "t.py::test_h[x-"],
        p2p=["t.py::test_g[log(photon s)]"],
    ),
    Case(
        "exit-code-disagrees",
        _wrapped("PASSED t.py::test_a\nPASSED t.py::test_b", code=2),
        f2p=["t.py::test_a"],
    ),
    Case("no-markers", "PASSED t.py::test_a\n", f2p=["t.py::test_a"]),
    Case(
        "apply-failed",
        ">>>>> Patch Apply Failed\n" + _wrapped("PASSED t.py::test_a"),
        f2p=["t.py::test_a"],
    ),
    Case(
        "timed-out",
        _wrapped("PASSED t.py::test_a")
        + ">>>>> Tests Timed Out\nTimeout error: 5 seconds exceeded.",
        f2p=["t.py::test_a"],
    ),
    Case(
        "nothing-ran",
        _wrapped("ImportError while loading conftest\nModuleNotFoundError: No module named 'x'"),
        f2p=["t.py::test_a"],
    ),
    Case(
        "results-outside-markers",
        "PASSED t.py::test_a\n" + _wrapped("collected 0 items"),
        f2p=["t.py::test_a"],
    ),
    Case(
        "markers-twice",
        _wrapped("PASSED t.py::test_a\n>>>>> Start Test Output\nFAILED t.py::test_a"),
        f2p=["t.py::test_a"],
    ),
    Case(
        "crlf",
        _wrapped("PASSED t.py::test_a\r\nFAILED t.py::test_b\rPASSED t.py::test_c", code=1),
        f2p=["t.py::test_a", "t.py::test_c"],
        p2p=["t.py::test_b"],
    ),
    Case(
        "fail-only",
        _wrapped("FAILED t.py::test_b - x\nERROR t.py::test_c", code=1),
        f2p=["t.py::test_a", "t.py::test_b"],
        p2p=["t.py::test_c"],
        eval_type="fail_only",
    ),
    Case("patch-none", _wrapped("PASSED t.py::test_a"), f2p=["t.py::test_a"], patch=None),
    Case("no-tests-at-all", _wrapped("PASSED t.py::test_a", code=0)),
    Case(
        "django",
        _wrapped(DJANGO_LOG, code=1),
        parser="parse_log_django",
        f2p=[
            "test_add (admin.tests.AdminTests)",
            "test_output (admin.tests.AdminTests)",
            "The first line of a docstring.",
        ],
        p2p=["test_skip (admin.tests.AdminTests)", "test_change (admin.tests.AdminTests)"],
        parsers=ALL_PARSERS,
    ),
    Case(
        "django-resolved",
        _wrapped(
            "test_a (m.T) ... ok\ntest_b (m.T) ... ok\ntest_c (m.T) ... skipped 'no'\n\n"
            "Ran 3 tests in 0.001s\n\nOK (skipped=1)",
            code=0,
        ),
        parser="parse_log_django",
        f2p=["test_a (m.T)"],
        p2p=["test_b (m.T)", "test_c (m.T)"],
        parsers=["parse_log_django"],
    ),
    Case(
        "pytest-v2",
        _wrapped(V2_LOG, code=1),
        parser="parse_log_pytest_v2",
        f2p=["astropy/tests/test_x.py::test_colour", "astropy/tests/test_x.py::test_old_style"],
        p2p=["astropy/tests/test_x.py::test_with space[a b]"],
        parsers=ALL_PARSERS,
    ),
    Case(
        "pytest-options",
        _wrapped(OPTIONS_LOG, code=1),
        parser="parse_log_pytest_options",
        f2p=["tests/test_r.py::test_path[/file.txt]"],
        p2p=["tests/test_r.py::test_url[//host/path]"],
        parsers=ALL_PARSERS,
    ),
    Case(
        "sympy",
        _wrapped(SYMPY_LOG, code=1),
        parser="parse_log_sympy",
        f2p=["test_basic", "sympy/core/tests/test_basic.py:test_broken"],
        p2p=["test_slow"],
        parsers=ALL_PARSERS,
    ),
    Case(
        "seaborn",
        _wrapped(SEABORN_LOG, code=1),
        parser="parse_log_seaborn",
        f2p=["tests/test_a.py::test_y"],
        parsers=ALL_PARSERS,
    ),
    Case(
        "matplotlib",
        _wrapped(MATPLOTLIB_LOG, code=1),
        parser="parse_log_matplotlib",
        f2p=["lib/tests/test_b.py::test_click[1]"],
        p2p=["lib/tests/test_b.py::test_click[3]"],
        parsers=ALL_PARSERS,
    ),
    Case(
        "infra-failure",
        _wrapped("Could not resolve host: github.com"),
        f2p=["t.py::test_a"],
    ),
]


@pytest.fixture(scope="module")
def official() -> dict[str, dict[str, object]]:
    return {case.id: answer for case, answer in zip(CASES, oracle(CASES), strict=True)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_grading_equals_swebench(case: Case, official: dict[str, dict[str, object]]) -> None:
    assert ours(case) == official[case.id]


def test_the_cases_cover_every_outcome(official: dict[str, dict[str, object]]) -> None:
    resolutions = {a["resolution"] for a in official.values()}
    assert resolutions == {"RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"}
    assert {a["found"] for a in official.values()} == {True, False}
    assert official["pytest-resolved"]["eval_report"]["pytest-resolved"]["resolved"] is True


def test_a_bare_fail_header_does_not_break_the_django_parser() -> None:
    # swebench's parser raises IndexError on a line that is only "FAIL:"; ours skips it
    assert parse_django("FAIL:\nERROR:\ntest_a (m.T) ... ok") == {"test_a (m.T)": "PASSED"}


def test_parsers_are_found_by_either_name() -> None:
    assert resolve_parser("django") is resolve_parser("parse_log_django")
    assert resolve_parser("parse_log_requests") is resolve_parser("pytest_options")
    assert parser_for_repo("django/django") == "django"
    assert parser_for_repo("someone/else") == "pytest"
    with pytest.raises(KeyError, match="unknown log parser `junit`"):
        resolve_parser("junit")


TEST_PATCH = """\
diff --git a/tests/admin/test_views.py b/tests/admin/test_views.py
--- a/tests/admin/test_views.py
+++ b/tests/admin/test_views.py
@@ -1 +1,2 @@
 x = 1
+y = 2
diff --git a/tests/admin/fixtures/data.json b/tests/admin/fixtures/data.json
--- /dev/null
+++ b/tests/admin/fixtures/data.json
@@ -0,0 +1 @@
+{}
diff --git a/tests/new_test.py b/tests/new_test.py
new file mode 100644
--- /dev/null
+++ b/tests/new_test.py
@@ -0,0 +1 @@
+z = 3
"""


def _row(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "base_commit": "a" * 40,
        "patch": "",
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": '["t::a"]',
        "PASS_TO_PASS": [],
    }
    row.update(changes)
    return row


def test_test_directives_follow_swebench() -> None:
    assert directives_from_patch(TEST_PATCH) == ["tests/admin/test_views.py", "tests/new_test.py"]
    assert directives_from_patch(TEST_PATCH, django=True) == ["admin.test_views", "new_test"]
    assert modified_files(TEST_PATCH) == ["tests/admin/test_views.py"]
    django = parse_row(_row(repo="django/django"))
    assert django.test_command() == (
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
        "admin.test_views new_test"
    )
    pytest_row = parse_row(_row())
    assert pytest_row.test_command() == "pytest -rA tests/admin/test_views.py tests/new_test.py"
    own = parse_row(_row(test_cmd="python run.py", test_directives=["a b"]))
    assert own.test_command() == "python run.py 'a b'"


def test_the_eval_script_brackets_the_tests_with_swebench_markers() -> None:
    script = eval_script(parse_row(_row(eval_commands=["export X=1"])), "/w/repo")
    lines = script.splitlines()
    assert lines[0] == "set -uxo pipefail"
    assert "export X=1" in lines
    start = lines.index(f": '{grading.START_TEST_OUTPUT}'")
    assert lines[start + 1].startswith("pytest -rA ")
    assert lines[start + 2] == "SWEBENCH_TEST_EXIT_CODE=$?"
    assert lines[start + 3] == f": '{grading.END_TEST_OUTPUT}'"
    assert lines[start + 4] == f'echo "{grading.TEST_EXIT_CODE}: $SWEBENCH_TEST_EXIT_CODE"'
    assert script.count(f"git checkout {'a' * 40} -- tests/admin/test_views.py") == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_commit": "main"}, "`base_commit` must be a commit's hex id"),
        ({"repo": "../etc"}, "`repo` must look like owner/name"),
        ({"FAIL_TO_PASS": "[not json"}, "`FAIL_TO_PASS` is not a JSON list"),
        ({"PASS_TO_PASS": [1, 2]}, "`PASS_TO_PASS` must be a list of test names"),
        ({"log_parser": "junit"}, "unknown log parser `junit`"),
        ({"eval_type": "sometimes"}, "`eval_type` must be pass_and_fail or fail_only"),
        ({"test_patch": 3}, "`test_patch` must be a string"),
    ],
)
def test_bad_rows_are_refused_with_the_reason(change: dict[str, object], message: str) -> None:
    with pytest.raises(RowError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_row(_row(**change))


def test_rows_load_from_json_and_jsonl(tmp_path: Path) -> None:
    (tmp_path / "rows.json").write_text(json.dumps([_row(), _row(instance_id="o__r-2")]))
    assert [r.instance_id for r in load_rows(tmp_path / "rows.json")] == ["o__r-1", "o__r-2"]
    (tmp_path / "rows.jsonl").write_text(json.dumps(_row()) + "\n\n" + json.dumps(_row()) + "\n")
    with pytest.raises(RowError, match="appears twice"):
        load_rows(tmp_path / "rows.jsonl")
    (tmp_path / "bad.jsonl").write_text("{}\n")
    with pytest.raises(RowError, match=r"bad.jsonl:1: missing `instance_id`"):
        load_rows(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps(_row()) + "\n{nope\n")
    with pytest.raises(RowError, match=r"bad.jsonl:2 is not JSON"):
        load_rows(tmp_path / "bad.jsonl")
    with pytest.raises(RowError, match="cannot read the SWE-bench rows"):
        load_rows(tmp_path / "absent.jsonl")
    row = parse_row(_row(), "x")
    assert "test_patch" not in row.public()
    assert "patch" not in row.public()
