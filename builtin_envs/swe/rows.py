"""SWE-bench rows: reading them from JSON or JSON-lines files, and the evaluation script of one.

A row has SWE-bench's fields (``instance_id``, ``repo``, ``base_commit``, ``patch``,
``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS`` as JSON strings or lists, ``problem_statement``,
``hints_text``, ``version``, ...) and may add: ``test_cmd`` (the test runner's command line),
``test_directives`` (what it runs: files, modules), ``log_parser`` (``pytest``, ``django``, ...
or SWE-bench's ``parse_log_*`` names), ``eval_type`` (``pass_and_fail`` or ``fail_only``) and
``eval_commands`` (shell lines run before the tests). Without them the test command is SWE-bench's
convention: the runner (``./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1``
for ``django/django``, ``pytest -rA`` otherwise) followed by the files the test patch touches,
minus data files, as Django module names for Django.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError
from builtin_envs.swe import grading
from builtin_envs.swe.log_parsers import parser_for_repo, resolve_parser

__all__ = [
    "DJANGO_TEST_CMD",
    "NON_TEST_EXTENSIONS",
    "PYTEST_TEST_CMD",
    "Row",
    "RowError",
    "directives_from_patch",
    "eval_script",
    "load_rows",
    "modified_files",
    "parse_row",
]

PYTEST_TEST_CMD = "pytest -rA"
DJANGO_TEST_CMD = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
NON_TEST_EXTENSIONS = (
    ".json",
    ".png",
    "csv",
    ".txt",
    ".md",
    ".jpg",
    ".jpeg",
    ".pkl",
    ".yml",
    ".yaml",
    ".toml",
)
"""Files of a test patch that are not run as tests (SWE-bench's list, ``csv`` without its dot
included)."""
EXIT_CODE_VARIABLE = "SWEBENCH_TEST_EXIT_CODE"
_REQUIRED = ("instance_id", "repo", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
_SHA = re.compile(r"^[0-9a-f]{7,64}$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")


class RowError(ConfigurationError):
    """A dataset row or file that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Row:
    """One SWE-bench task instance."""

    instance_id: str
    repo: str
    base_commit: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    patch: str = ""
    problem_statement: str = ""
    hints_text: str = ""
    version: str = ""
    test_cmd: str = ""
    test_directives: tuple[str, ...] | None = None
    log_parser: str = ""
    eval_type: str = grading.EvalType.PASS_AND_FAIL.value
    eval_commands: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def parser_name(self) -> str:
        """The log parser: the row's, else SWE-bench's for its repository."""
        return self.log_parser or parser_for_repo(self.repo)

    @property
    def is_django(self) -> bool:
        return self.repo == "django/django" or self.parser_name in ("django", "parse_log_django")

    def directives(self) -> list[str]:
        """What the test command runs: the row's ``test_directives``, else derived."""
        if self.test_directives is not None:
            return list(self.test_directives)
        return directives_from_patch(self.test_patch, django=self.is_django)

    def test_command(self) -> str:
        """The full test command line."""
        runner = self.test_cmd or (
            DJANGO_TEST_CMD if self.repo == "django/django" else PYTEST_TEST_CMD
        )
        return " ".join([runner, *(shlex.quote(d) for d in self.directives())])

    def public(self) -> dict[str, Any]:
        """What the agent may know: no patch, no test patch, no test lists."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "version": self.version,
            "problem_statement": self.problem_statement,
            "hints_text": self.hints_text,
        }


def _tests(value: Any, what: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise RowError(f"{where}: `{what}` is not a JSON list of test names: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise RowError(f"{where}: `{what}` must be a list of test names (or its JSON text)")
    return tuple(value)


def _text(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RowError(f"{where}: `{key}` must be a string, got {type(value).__name__}")
    return value


def parse_row(row: Mapping[str, Any], where: str = "row") -> Row:
    """A :class:`Row` from a dict of SWE-bench's fields; :class:`RowError` names what is wrong."""
    if not isinstance(row, Mapping):
        raise RowError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    missing = [key for key in _REQUIRED if key not in row]
    if missing:
        raise RowError(f"{where}: missing {', '.join(f'`{k}`' for k in missing)}")
    instance_id = _text(row, "instance_id", where)
    where = f"{where} ({instance_id})" if instance_id else where
    repo = _text(row, "repo", where)
    if not _REPO.match(repo) or ".." in repo:
        raise RowError(f"{where}: `repo` must look like owner/name, got {repo!r}")
    base_commit = _text(row, "base_commit", where).lower()
    if not _SHA.match(base_commit):
        raise RowError(f"{where}: `base_commit` must be a commit's hex id, got {base_commit!r}")
    directives = row.get("test_directives")
    if directives is not None:
        directives = _tests(directives, "test_directives", where)
    eval_commands = row.get("eval_commands") or ()
    if isinstance(eval_commands, str):
        eval_commands = (eval_commands,)
    if not all(isinstance(c, str) for c in eval_commands):
        raise RowError(f"{where}: `eval_commands` must be a list of shell lines")
    parser = _text(row, "log_parser", where)
    if parser:
        try:
            resolve_parser(parser)
        except KeyError as exc:
            raise RowError(f"{where}: {exc.args[0]}") from None
    eval_type = _text(row, "eval_type", where) or grading.EvalType.PASS_AND_FAIL.value
    if eval_type not in {e.value for e in grading.EvalType}:
        raise RowError(f"{where}: `eval_type` must be pass_and_fail or fail_only")
    known = {
        *_REQUIRED,
        "patch",
        "problem_statement",
        "hints_text",
        "version",
        "test_cmd",
        "test_directives",
        "log_parser",
        "eval_type",
        "eval_commands",
    }
    return Row(
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        test_patch=_text(row, "test_patch", where),
        fail_to_pass=_tests(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
        pass_to_pass=_tests(row["PASS_TO_PASS"], "PASS_TO_PASS", where),
        patch=_text(row, "patch", where),
        problem_statement=_text(row, "problem_statement", where),
        hints_text=_text(row, "hints_text", where),
        version=str(row.get("version") or ""),
        test_cmd=_text(row, "test_cmd", where),
        test_directives=directives,
        log_parser=parser,
        eval_type=eval_type,
        eval_commands=tuple(eval_commands),
        extra={k: v for k, v in row.items() if k not in known},
    )


def load_rows(path: str | Path) -> list[Row]:
    """Every row of a ``.json`` file (a list of rows, or one row) or a ``.jsonl`` file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RowError(f"cannot read the SWE-bench rows at {path}: {exc.strerror}") from None
    records: Iterable[tuple[str, Any]]
    if path.suffix == ".jsonl":
        parsed = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                parsed.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise RowError(f"{path}:{number} is not JSON: {exc}") from None
        records = parsed
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RowError(f"{path} is not JSON: {exc}") from None
        data = data if isinstance(data, list) else [data]
        records = [(f"{path}[{i}]", item) for i, item in enumerate(data)]
    rows = [parse_row(item, where) for where, item in records]
    if not rows:
        raise RowError(f"{path} holds no rows")
    seen: set[str] = set()
    for row in rows:
        if row.instance_id in seen:
            raise RowError(f"{path}: instance_id {row.instance_id!r} appears twice")
        seen.add(row.instance_id)
    return rows


_DIFF_FILE = re.compile(r"diff --git a/.* b/(.*)")
_HUNK_OLD = re.compile(r"^--- (?:a/(.*)|/dev/null)\s*$", re.MULTILINE)


def directives_from_patch(test_patch: str, *, django: bool = False) -> list[str]:
    """The files a test patch touches, minus data files (Django: as module names without the
    ``tests/`` prefix)."""
    found = [d for d in _DIFF_FILE.findall(test_patch) if not d.endswith(NON_TEST_EXTENSIONS)]
    if not django:
        return found
    modules = []
    for directive in found:
        directive = directive.removesuffix(".py")
        directive = directive.removeprefix("tests/")
        modules.append(directive.replace("/", "."))
    return modules


def modified_files(patch: str) -> list[str]:
    """The existing files a patch changes (its ``--- a/PATH`` sides; new files are left out)."""
    files: list[str] = []
    for match in _HUNK_OLD.finditer(patch):
        name = match.group(1)
        if name is not None and name not in files:
            files.append(name)
    return files


def eval_script(row: Row, repo_dir: str) -> str:
    """The bash script that grades ``row`` in ``repo_dir``, as SWE-bench's: reset the test
    files, apply the test patch, run the tests between the markers, record the exit status,
    reset the test files again."""
    delimiter = "EOF_SWE_TEST_PATCH"
    while delimiter in row.test_patch:
        delimiter += "_"
    files = " ".join(shlex.quote(f) for f in modified_files(row.test_patch))
    reset = f"git checkout {row.base_commit} -- {files}" if files else ":"
    lines = [
        "set -uxo pipefail",
        f"cd {shlex.quote(repo_dir)}",
        *row.eval_commands,
        "git status",
        f"git -c core.fileMode=false diff {row.base_commit}",
        reset,
        f"git apply -v - <<'{delimiter}'\n{row.test_patch}\n{delimiter}",
        f": '{grading.START_TEST_OUTPUT}'",
        row.test_command(),
        f"{EXIT_CODE_VARIABLE}=$?",
        f": '{grading.END_TEST_OUTPUT}'",
        f'echo "{grading.TEST_EXIT_CODE}: ${EXIT_CODE_VARIABLE}"',
        reset,
    ]
    return "\n".join(lines) + "\n"
