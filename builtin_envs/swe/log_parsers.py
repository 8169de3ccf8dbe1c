"""SWE-bench's test-log parsers for Python repositories, written anew from their behaviour.

Each parser takes the text of a test run and returns ``{test name: status}``, the status one
of :class:`~builtin_envs.swe.grading.TestStatus`'s values (a pytest line's first word is taken
as it is, as SWE-bench does). :data:`PARSERS` names them as SWE-bench's registry does
(``parse_log_pytest``) and by short name (``pytest``); :func:`parser_for_repo` is SWE-bench's
choice per repository (``django/django`` -> Django's, ``sympy/sympy`` -> sympy's, any other ->
pytest's). ``tests/test_swe_grading.py`` compares every parser with the ``swebench`` package's on
real and edge-case logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "PARSERS",
    "REPO_PARSERS",
    "Parser",
    "parse_django",
    "parse_matplotlib",
    "parse_pytest",
    "parse_pytest_options",
    "parse_pytest_v2",
    "parse_seaborn",
    "parse_sympy",
    "parser_for_repo",
    "resolve_parser",
]

Parser = Callable[[str], dict[str, str]]

_STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
_COUNT_ONLY = re.compile(r"^\[\d+\]$")


def _starts_with_status(line: str) -> bool:
    return line.startswith(_STATUSES)


def _skip_summary(status: str, name: str) -> bool:
    """pytest's ``SKIPPED [3] path:line: reason`` summary line names no test."""
    return status == "SKIPPED" and _COUNT_ONLY.match(name) is not None


def _pytest_lines(
    log: str,
    rename: Callable[[str], str] | None = None,
    name_of: Callable[[str], str] | None = None,
) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in log.split("\n"):
        if rename is not None:
            line = rename(line)
        if not _starts_with_status(line):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        words = line.split()
        if len(words) < 2 or _skip_summary(words[0], words[1]):
            continue
        found[words[1] if name_of is None else name_of(words[1])] = words[0]
    return found


def parse_pytest(log: str) -> dict[str, str]:
    """``pytest -rA``'s short summary: ``PASSED tests/test_a.py::test_x`` and the like."""
    return _pytest_lines(log)


_OPTION = re.compile(r"(.*?)\[(.*)\]")


def parse_pytest_options(log: str) -> dict[str, str]:
    """pytest's summary, a parametrized id's absolute path option cut to its last part."""

    def name_of(name: str) -> str:
        match = _OPTION.search(name)
        if match is None:
            return name
        head, option = match.groups()
        if option.startswith("/") and not option.startswith("//") and "*" not in option:
            option = "/" + option.split("/")[-1]
        return f"{head}[{option}]"

    return _pytest_lines(log, name_of=name_of)


_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))


def parse_pytest_v2(log: str) -> dict[str, str]:
    """pytest's summary without colour codes, names with spaces kept, and old pytest's
    ``name STATUS`` lines (astropy, scikit-learn, sphinx)."""
    found: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _COLOUR.sub("", raw).translate(_CONTROL)
        if _starts_with_status(line):
            if line.startswith("FAILED"):
                line = line.split(" - ", 1)[0]
            words = line.split()
            if len(words) >= 2 and not _skip_summary(words[0], words[1]):
                found[" ".join(words[1:])] = words[0]
        elif line.endswith(_STATUSES):
            words = line.split()
            if len(words) >= 2:
                found[" ".join(words[:-1])] = words[-1]
    return found


def parse_matplotlib(log: str) -> dict[str, str]:
    """pytest's summary with matplotlib's mouse-button enum names as their numbers."""

    def rename(line: str) -> str:
        return line.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")

    return _pytest_lines(log, rename)


def parse_seaborn(log: str) -> dict[str, str]:
    """seaborn's pytest output: ``FAILED name``, ``name PASSED ...`` or ``PASSED name``."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith("FAILED"):
            found[words[1]] = "FAILED"
        elif " PASSED " in line:
            if words[1] == "PASSED":
                found[words[0]] = "PASSED"
        elif line.startswith("PASSED"):
            found[words[1]] = "PASSED"
    return found


_SYMPY_FAILURE = re.compile(r"(_*) (.*)\.py:(.*) (_*)")


def parse_sympy(log: str) -> dict[str, str]:
    """sympy's ``bin/test``: ``test_x ok`` / ``F`` / ``E`` lines and its failure headers."""
    found: dict[str, str] = {}
    for match in _SYMPY_FAILURE.finditer(log):
        found[f"{match.group(2)}.py:{match.group(3)}"] = "FAILED"
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        name = line.split()[0]
        if line.endswith(" E"):
            found[name] = "ERROR"
        if line.endswith(" F"):
            found[name] = "FAILED"
        if line.endswith(" ok"):
            found[name] = "PASSED"
    return found


_DJANGO_PASS = (" ... ok", " ... OK", " ...  OK")
_DJANGO_MIGRATION_PREFIX = "Applying sites.0002_alter_domain_unique...test_no_migrations"
_DJANGO_INTERRUPTED = tuple(
    re.compile(pattern, re.MULTILINE)
    for pattern in (
        r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
        r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
        r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$",
    )
)


def parse_django(log: str) -> dict[str, str]:
    """Django's ``runtests.py --verbosity 2`` (unittest's verbose form):
    ``test_x (module.Class) ... ok``, ``... skipped '...'``, ``... FAIL``, ``... ERROR``,
    ``FAIL: name`` / ``ERROR: name`` headers, and an ``ok`` on a line of its own after output."""
    found: dict[str, str] = {}
    previous: str | None = None
    for raw in log.split("\n"):
        line = raw.strip()
        if "--version is equivalent to version" in line:
            found["--version is equivalent to version"] = "PASSED"
        if " ... " in line:
            previous = line.split(" ... ")[0]
        for suffix in _DJANGO_PASS:
            if line.endswith(suffix):
                if line.startswith(_DJANGO_MIGRATION_PREFIX):  # django__django-7188's output
                    line = line.split("...", 1)[-1].strip()
                found[line.rsplit(suffix, 1)[0]] = "PASSED"
                break
        if " ... skipped" in line:
            found[line.split(" ... skipped")[0]] = "SKIPPED"
        if line.endswith(" ... FAIL"):
            found[line.split(" ... FAIL")[0]] = "FAILED"
        if line.startswith("FAIL:"):
            words = line.split()
            if len(words) > 1:  # SWE-bench's parser raises IndexError on a bare "FAIL:"
                found[words[1]] = "FAILED"
        if line.endswith(" ... ERROR"):
            found[line.split(" ... ERROR")[0]] = "ERROR"
        if line.startswith("ERROR:"):
            words = line.split()
            if len(words) > 1:  # likewise on a bare "ERROR:"
                found[words[1]] = "ERROR"
        if line.startswith("ok") and previous is not None:
            found[previous] = "PASSED"  # output came between "..." and "ok"
    for pattern in _DJANGO_INTERRUPTED:
        for match in pattern.finditer(log):
            found[match.group(1)] = "PASSED"
    return found


PARSERS: dict[str, Parser] = {
    "pytest": parse_pytest,
    "pytest_options": parse_pytest_options,
    "pytest_v2": parse_pytest_v2,
    "django": parse_django,
    "seaborn": parse_seaborn,
    "sympy": parse_sympy,
    "matplotlib": parse_matplotlib,
}
# SWE-bench's registry names, and its per-repository aliases
for _short in list(PARSERS):
    PARSERS[f"parse_log_{_short}"] = PARSERS[_short]
for _alias in ("astroid", "flask", "marshmallow", "pvlib", "pyvista", "sqlfluff", "xarray"):
    PARSERS[f"parse_log_{_alias}"] = parse_pytest
for _alias in ("pydicom", "requests", "pylint"):
    PARSERS[f"parse_log_{_alias}"] = parse_pytest_options
for _alias in ("astropy", "scikit", "sphinx"):
    PARSERS[f"parse_log_{_alias}"] = parse_pytest_v2

REPO_PARSERS: dict[str, str] = {
    "astropy/astropy": "pytest_v2",
    "django/django": "django",
    "marshmallow-code/marshmallow": "pytest",
    "matplotlib/matplotlib": "matplotlib",
    "mwaskom/seaborn": "seaborn",
    "pallets/flask": "pytest",
    "psf/requests": "pytest_options",
    "pvlib/pvlib-python": "pytest",
    "pydata/xarray": "pytest",
    "pydicom/pydicom": "pytest_options",
    "pylint-dev/astroid": "pytest",
    "pylint-dev/pylint": "pytest_options",
    "pytest-dev/pytest": "pytest",
    "pyvista/pyvista": "pytest",
    "scikit-learn/scikit-learn": "pytest_v2",
    "sqlfluff/sqlfluff": "pytest",
    "sphinx-doc/sphinx": "pytest_v2",
    "sympy/sympy": "sympy",
}
"""SWE-bench's parser of each Python repository (by short name)."""


def parser_for_repo(repo: str) -> str:
    """SWE-bench's parser name for ``repo`` (``owner/name``); pytest's for any other."""
    return REPO_PARSERS.get(repo, "pytest")


def resolve_parser(name: str) -> Parser:
    """The parser called ``name`` (``pytest``, ``django``, ``parse_log_pytest``, ...)."""
    try:
        return PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(n for n in PARSERS if not n.startswith("parse_log_")))
        raise KeyError(
            f"unknown log parser `{name}`; known: {known} (or SWE-bench's parse_log_* names)"
        ) from None
