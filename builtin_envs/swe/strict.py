"""Strict grading's filter: which parts of the agent's diff reach the judge's checkout.

SWE-bench grades the agent's repository as the agent left it, so a change to how the tests run
(a ``conftest.py`` that turns failures into passes, a ``pytest.py`` that shadows pytest, an
``addopts`` that loads a plugin, a patched test runner) resolves any task. Strict grading runs
the tests on a fresh checkout of the base commit with only the agent's changes to *source*
files applied; :func:`split_patch` splits the agent's diff into those and the files it leaves
out, each with a reason (:class:`LeftOut`). Left out:

- ``test``: test files (a ``tests``/``testing``/``e2e`` directory on the path; ``test_*.py``,
  ``*_test.py``, ``tests.py``), the files the row's test patch touches and the files its test
  command names (a Django-style ``tests/runtests.py``, the test modules);
- ``conftest``: a ``conftest.py`` anywhere;
- ``startup``: ``sitecustomize.py``, ``usercustomize.py`` and ``.pth`` files anywhere;
- ``shadow``: a *new* top-level module or package (a file, or a package directory, at the root
  or in a directory that is no package) named like a standard library module, pytest, its
  dependencies or an installed pytest plugin; the repository's own modules, present at the base
  commit, are source (pytest's own repository fixes ``src/_pytest``);
- ``test-settings``: ``pytest.ini``, ``.pytest.ini``, ``tox.ini``; ``setup.cfg`` and
  ``pyproject.toml`` when their test sections (``[tool:pytest]``, ``[pytest]``, ``[tox]``...,
  ``[tool.pytest]``, ``[tool.tox]``...) changed or cannot be read;
- ``symlink``: a file the diff makes (or keeps) a symbolic link; ``submodule``: a nested
  repository (a gitlink);
- ``bytecode``: compiled Python (``.pyc``, ``.pyo``, anything in ``__pycache__``): an unchecked
  hash-based ``.pyc`` runs whatever it holds, whatever its source says;
- ``unparsable``: a part of the diff whose file cannot be told.

May import: the standard library.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["LeftOut", "Split", "file_patches", "shadowed_names", "split_patch"]

_TEST_DIRS = frozenset({"tests", "testing", "e2e"})
_TEST_FILE = re.compile(r"^(?:test_.*\.py|.*_test\.py|tests\.py)$")
_STARTUP = frozenset({"sitecustomize.py", "usercustomize.py"})
_SETTINGS = frozenset({"pytest.ini", ".pytest.ini", "tox.ini"})
_PYTEST_FAMILY = frozenset(
    {
        "pytest",
        "_pytest",
        "py",
        "pluggy",
        "iniconfig",
        "packaging",
        "exceptiongroup",
        "tomli",
        "colorama",
        "coverage",
        "hypothesis",
        "xdist",
        "nose",
        "mock",
        "sitecustomize",
        "usercustomize",
    }
)


@dataclass(frozen=True)
class LeftOut:
    """A file of the agent's diff that strict grading did not apply, and why."""

    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class Split:
    """The agent's diff, split: the part applied to the judge's checkout, and what was not."""

    applied: str
    applied_files: tuple[str, ...]
    left_out: tuple[LeftOut, ...]


def shadowed_names() -> frozenset[str]:
    """Top-level module names a repository's new module must not take: the standard library,
    pytest and its family, and the modules of the installed pytest plugins."""
    names = set(sys.stdlib_module_names) | _PYTEST_FAMILY
    try:
        for entry in importlib.metadata.entry_points(group="pytest11"):
            names.add(entry.value.split(":")[0].split(".")[0])
    except Exception:  # a broken distribution's metadata: the fixed names still hold
        pass
    return frozenset(names)


def _unquote(path: str) -> str:
    """A path as git prints it, C-quoted when it holds unusual bytes."""
    if not (path.startswith('"') and path.endswith('"')):
        return path
    body = path[1:-1].encode("latin-1", "backslashreplace")
    return body.decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a diff: its path (``None`` when it cannot be told), its text, and
    whether it makes the file a symbolic link."""

    path: str | None
    text: str
    symlink: bool
    submodule: bool = False


def _header_path(header: str) -> str | None:
    rest = header[len("diff --git ") :]
    if rest.startswith('"'):
        first, _, second = rest.partition('" "')
        if not second:
            return None
        a_side, b_side = _unquote(first + '"'), _unquote('"' + second)
        if a_side.startswith("a/") and b_side.startswith("b/") and a_side[2:] == b_side[2:]:
            return a_side[2:]
        return None
    # a/P b/P (no renames: both sides are the same path)
    if rest.startswith("a/") and (len(rest) - 5) % 2 == 0:
        n = (len(rest) - 5) // 2
        first, second = rest[2 : 2 + n], rest[5 + n :]
        if first == second and rest[2 + n : 5 + n] == " b/":
            return first
    return None


def _path_of(header: str, lines: Sequence[str]) -> str | None:
    """The one path a file's part of a diff names (its header and its ``---``/``+++`` lines
    must agree), normalised; None when they disagree or the path leaves the repository."""
    names: set[str | None] = {_header_path(header)}
    for line in lines:
        if line.startswith(("--- ", "+++ ")):
            rest = _unquote(line[4:].rstrip("\t"))
            if rest == "/dev/null":
                continue
            if not rest.startswith("a/" if line.startswith("-") else "b/"):
                return None
            names.add(rest[2:])
    if len(names) != 1:
        return None
    path = names.pop()
    if path is None or not path or path.startswith("/") or "\0" in path:
        return None
    if any(part in ("", ".", "..", ".git") for part in path.split("/")):
        return None
    return path


def file_patches(patch: str) -> list[FilePatch]:
    """The per-file parts of a ``git diff`` (made with ``--no-renames``)."""
    parts: list[FilePatch] = []
    chunks = re.split(r"(?m)^(?=diff --git )", patch)
    for chunk in chunks:
        if not chunk.startswith("diff --git "):
            if chunk.strip():
                parts.append(FilePatch(None, chunk, False))
            continue
        lines = chunk.split("\n")
        header, rest = lines[0], lines[1:]
        meta = []
        for line in rest:
            if line.startswith(("@@", "GIT binary patch")):
                break
            meta.append(line)
        modes = set()
        for line in meta:
            words = line.split()
            if line.startswith(("new file mode ", "new mode ")) or (
                line.startswith("index ") and len(words) == 3
            ):
                modes.add(words[-1])
        symlink = "120000" in modes
        submodule = "160000" in modes
        renamed = any(line.startswith(("rename ", "copy ")) for line in meta)
        path = None if renamed else _path_of(header, meta)
        parts.append(FilePatch(path, chunk, symlink, submodule))
    return parts


def _sections_changed(path: str, before: str | None, after: str | None) -> bool:
    """Whether a ``setup.cfg``/``pyproject.toml`` changed its test settings (or cannot be
    read)."""

    def cfg(text: str | None) -> dict[str, dict[str, str]] | None:
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        try:
            parser.read_string(text or "")
        except configparser.Error:
            return None
        wanted = {"tool:pytest", "pytest", "tox", "coverage:run", "options.entry_points"}
        return {
            name: dict(parser[name])
            for name in parser.sections()
            if name in wanted or name.startswith(("tox:", "testenv"))
        }

    def toml(text: str | None) -> object:
        try:
            data = tomllib.loads(text or "")
        except tomllib.TOMLDecodeError:
            return None
        tool = data.get("tool", {}) if isinstance(data.get("tool"), dict) else {}
        project = data.get("project", {}) if isinstance(data.get("project"), dict) else {}
        return (
            {k: v for k, v in tool.items() if k in ("pytest", "tox", "coverage", "hatch")},
            project.get("entry-points"),
        )

    read: Callable[[str | None], object] = cfg if path.endswith(".cfg") else toml
    old, new = read(before), read(after)
    return old is None or new is None or old != new


def _reason(
    path: str,
    *,
    base_files: frozenset[str],
    new_files: frozenset[str],
    test_files: frozenset[str],
    shadowed: frozenset[str],
    settings_changed: Callable[[str], bool],
) -> str | None:
    parts = path.split("/")
    name = parts[-1]
    if path in test_files or any(p in _TEST_DIRS for p in parts[:-1]) or _TEST_FILE.match(name):
        return "test"
    if name == "conftest.py":
        return "conftest"
    if name in _STARTUP or name.endswith(".pth"):
        return "startup"
    if "__pycache__" in parts[:-1] or name.endswith((".pyc", ".pyo")):
        return "bytecode"
    if name in _SETTINGS:
        return "test-settings"
    if name in ("setup.cfg", "pyproject.toml") and settings_changed(path):
        return "test-settings"
    # the top-level module the file belongs to: walk up while the directory is a package
    known = base_files | new_files
    depth = len(parts) - 1
    while depth > 0 and "/".join([*parts[:depth], "__init__.py"]) in known:
        depth -= 1
    if depth == len(parts) - 1:
        top, top_path = name.removesuffix(".py"), path
        is_module = name.endswith((".py", ".so", ".pyc", ".pyd"))
        top = top.split(".")[0]
    else:
        top = parts[depth]
        top_path = "/".join(parts[: depth + 1]) + "/"
        is_module = True
    existed = any(f == top_path or f.startswith(top_path) for f in base_files)
    if is_module and top in shadowed and not existed:
        return "shadow"
    return None


def split_patch(
    patch: str,
    *,
    base_files: Iterable[str],
    test_patch_files: Iterable[str] = (),
    test_command: str = "",
    read_base: Callable[[str], str | None] = lambda _path: None,
    read_agent: Callable[[str], str | None] = lambda _path: None,
    shadowed: frozenset[str] | None = None,
) -> Split:
    """Split the agent's ``patch`` (``git diff --no-renames --binary`` against the base commit)
    into the source changes strict grading applies and the files it leaves out.

    ``base_files``: the base commit's files; ``test_patch_files``: the files the row's test
    patch touches; ``test_command``: the command lines that run the tests (the files they name
    are the runner's); ``read_base``/``read_agent``: a settings file's text before and after."""
    base = frozenset(base_files)
    parts = file_patches(patch)
    new_files = frozenset(
        p.path for p in parts if p.path is not None and "\nnew file mode " in p.text
    )
    named = set(test_patch_files)
    for word in shlex.split(test_command, comments=False, posix=True) if test_command else []:
        candidate = os.path.normpath(word.split("::")[0]).removeprefix("./")
        if candidate in base or candidate in new_files:
            named.add(candidate)
    names = shadowed if shadowed is not None else shadowed_names()
    applied: list[str] = []
    applied_files: list[str] = []
    left_out: list[LeftOut] = []
    for part in parts:
        if part.path is None:
            first = part.text.split("\n", 1)[0][:200]
            left_out.append(LeftOut(first, "unparsable"))
            continue
        if part.symlink:
            left_out.append(LeftOut(part.path, "symlink"))
            continue
        if part.submodule:
            left_out.append(LeftOut(part.path, "submodule"))
            continue
        reason = _reason(
            part.path,
            base_files=base,
            new_files=new_files,
            test_files=frozenset(named),
            shadowed=names,
            settings_changed=lambda p: _sections_changed(p, read_base(p), read_agent(p)),
        )
        if reason is None:
            applied.append(part.text if part.text.endswith("\n") else part.text + "\n")
            applied_files.append(part.path)
        else:
            left_out.append(LeftOut(part.path, reason))
    return Split("".join(applied), tuple(applied_files), tuple(left_out))
