"""mini-program: a mini program IDE per instance (AEnvironment's "Mini Program IDE").

The agent builds a small web app (``index.html`` and its CSS, JavaScript, data) in the instance's
project directory with file tools, runs Python in it, checks the code with ``validate``, and a
person opens the result in a browser through the live preview (``await env.preview_url()``):
the runtime serves the project directory (:mod:`aenv_ray.preview`).

The project is ``$AENV_WORKSPACE/project`` (``/workspace/project`` in an engine's instance;
``aenv run``: a private temporary directory, exported as ``AENV_WORKSPACE`` at import), made on
first use: by the health check (which
every ``Environment`` calls before its first call), a tool, a function or the reward.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from _mp_checks import CHECKED_EXTENSIONS, check_file
from _mp_files import Project, ProjectError, split_path
from _mp_python import MAX_TIMEOUT, run_python
from _mp_render import render

from aenv_ray import register_function, register_health, register_reward, register_tool
from aenv_ray.errors import ConfigurationError
from aenv_ray.preview import set_preview_directory

ENTRY = "index.html"
_lock = threading.Lock()
_project: Project | None = None


def _workspace() -> Path:
    """``AENV_WORKSPACE``; without it (``aenv run``), a private temporary directory made now,
    at import, and exported as ``AENV_WORKSPACE`` (so the judge, whose seed is forked after the
    import, copies it), removed when the runtime exits."""
    workspace = os.environ.get("AENV_WORKSPACE")
    if not workspace:
        workspace = tempfile.mkdtemp(prefix="aenv-mini-program-")
        atexit.register(_remove, workspace, os.getpid())
        os.environ["AENV_WORKSPACE"] = workspace
    return Path(workspace)


def _remove(directory: str, owner: int) -> None:
    if os.getpid() == owner:  # not in a fork of the runtime's
        shutil.rmtree(directory, ignore_errors=True)


_workspace()


def project() -> Project:
    """This instance's project (made, and served as the preview, on first use)."""
    global _project
    with _lock:
        if _project is None:
            root = _workspace() / "project"
            _project = Project(root)
            set_preview_directory(root)
        return _project


def _after_fork_in_child() -> None:
    # A fork of a running instance (Environment.fork) has the parent's Python state and a copy
    # of its workspace, which an unisolated engine puts at another path: find the project again
    # (the health check the forked Environment calls first does, and serves it as the preview).
    global _project, _lock
    _lock = threading.Lock()
    _project = None
    set_preview_directory(None)


os.register_at_fork(after_in_child=_after_fork_in_child)


@register_tool
def write_file(file_path: str, content: str) -> dict[str, Any]:
    """Write a file of the mini program (made, or replaced), creating its directories.

    The entry point the preview opens is `index.html`. Paths are relative to the project root
    (`index.html`, `css/style.css`); `..` and hidden names are refused. At most 1 MB per file.

    Args:
        file_path: path of the file in the project, e.g. "index.html" or "js/app.js".
        content: the file's whole text.
    """
    size, created = project().write(file_path, content)
    path = "/".join(split_path(file_path))
    return {"file_path": path, "size": size, "created": created}


@register_tool
def read_file(file_path: str) -> dict[str, Any]:
    """Read a file of the mini program (the first 200,000 characters of a longer one).

    Args:
        file_path: path of the file in the project, e.g. "index.html".
    """
    text, size, truncated = project().read(file_path)
    return {
        "file_path": "/".join(split_path(file_path)),
        "content": text,
        "size": size,
        "truncated": truncated,
    }


@register_tool
def list_files(directory: str = "/") -> dict[str, Any]:
    """List the files of the mini program (below `directory`), with their sizes in bytes.

    Args:
        directory: a directory of the project; "/" (the default) is its root.
    """
    found = list(project().walk(directory))
    return {
        "directory": directory,
        "files": [path for path, _ in found],
        "sizes": dict(found),
        "count": len(found),
    }


@register_tool
def delete_file(file_path: str) -> dict[str, Any]:
    """Delete a file of the mini program (a directory goes with its last file).

    Args:
        file_path: path of the file in the project.
    """
    project().delete(file_path)
    return {"file_path": "/".join(split_path(file_path)), "deleted": True}


@register_tool(timeout=MAX_TIMEOUT + 10)
def execute_python_code(code: str, timeout: int = 30) -> dict[str, Any]:
    """Run Python code in the project directory (it can read and write the project's files and
    import its modules) and return its output.

    The code runs in a new Python process with no input; `success` is true when it exits with
    status 0 in time. stdout is `output`, stderr is `error` (each cut after 100 kB). Past
    `timeout` it is killed (returncode 124); processes it leaves running are killed when it ends.

    Args:
        code: the Python program to run.
        timeout: seconds before it is killed, 1 to 120.
    """
    if not 1 <= timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be between 1 and {MAX_TIMEOUT} seconds, got {timeout}")
    return run_python(code, cwd=project().root, timeout=timeout).describe()


@register_tool
def validate(file_path: str = "") -> dict[str, Any]:
    """Check the mini program's HTML, JavaScript, CSS and JSON for mistakes that break a page.

    HTML: unclosed or misnested elements, stray end tags, references to files that are not in
    the project (or start with `/`, or come from the network); JavaScript and CSS: unbalanced
    brackets, unterminated strings, comments, template literals and regular expressions; JSON:
    syntax. `valid` is true when there is no error (warnings do not count). Without `file_path`
    every such file is checked, and a missing `index.html` is an error.

    Args:
        file_path: one file to check; empty (the default): the whole project.
    """
    return _validate(project(), file_path)


def _validate(files: Project, file_path: str = "") -> dict[str, Any]:
    known = frozenset(path for path, _ in files.walk())
    errors: list[str] = []
    warnings: list[str] = []
    if file_path:
        targets = ["/".join(split_path(file_path))]
        files.read(targets[0], limit=None)  # a clear error when it is not there
    else:
        targets = [f for f in sorted(known) if f.rpartition(".")[2].lower() in CHECKED_EXTENSIONS]
        if ENTRY not in known:
            errors.append(f"{ENTRY}: missing: the preview opens it; write it with write_file")
    for target in targets:
        text, _, _ = files.read(target, limit=None)
        for problem in check_file(target, text, known):
            line = f"{target}:{problem.line}: {problem.message}"
            (errors if problem.severity == "error" else warnings).append(line)
    return {"valid": not errors, "checked": targets, "errors": errors, "warnings": warnings}


@register_function
def reset_project(files: dict[str, str] | None = None) -> dict[str, Any]:
    """Empty the project, then write `files` (path -> text): a task's starting point.

    Args:
        files: the files to start with; none by default.
    """
    current = project()
    current.clear()
    for path, content in (files or {}).items():
        current.write(path, content)
    return {"files": sorted(path for path, _ in current.walk())}


@register_function
def project_files() -> dict[str, str]:
    """Every file of the project as path -> text (to record what an episode built)."""
    current = project()
    return {path: current.read(path, limit=None)[0] for path, _ in current.walk()}


def _render_timeout() -> float:
    raw = os.environ.get("MINI_PROGRAM_RENDER_TIMEOUT") or "20"
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ConfigurationError(
            f"MINI_PROGRAM_RENDER_TIMEOUT={raw!r}: give the seconds a page may take to render"
        )
    return value


def _named(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


@register_reward
def page_reward(
    expected_text: list[str] | None = None,
    expected_files: list[str] | None = None,
    entry: str = ENTRY,
) -> dict[str, Any]:
    """Grade the mini program on what a person sees. The entry page must exist and show every
    expected text, else the reward is 0.0 (the task is not done, however well the rest goes);
    past that gate it is the share of checks passed (the page, each text, each expected file,
    `validate` finding no error). "Shown" is what a person sees: the page's visible text as
    headless Chromium lays it out once its scripts ran (text in the HTML source, a comment, a
    script, a `<noscript>`, a hidden or covered element, or one a script removed, is not shown).
    Below 1.0, `reason` says which checks failed.

    It runs in the judge (``config.json``): every process the agent started is ended first, and
    the page is read from a copy of the project (links out of it removed) by a Chromium of the
    judge's own, with a fresh home and temporary directory and the image's environment; the
    result's ``judge`` says what was ended or removed, ``ignored`` which programs and ``PATH``
    directories in the agent's reach were passed over to start Chromium.

    Args:
        expected_text: texts the page must show (case-sensitive, whitespace collapsed).
        expected_files: project files that must exist.
        entry: the page to check.
    """
    current = project()
    checks: dict[str, bool] = {}
    try:
        current.read(entry, limit=None)
    except ProjectError:
        return {
            "reward": 0.0,
            "checks": {f"page {entry}": False},
            "errors": [],
            "reason": f"there is no page {entry}",
        }
    checks[f"page {entry}"] = True
    entry = "/".join(split_path(entry))
    result: dict[str, Any] = {}
    unseen: list[str] = []
    if expected_text:

        def read(path: str) -> bytes | None:
            try:
                return current.read_bytes(split_path(path), path)
            except (ProjectError, ValueError, OSError):
                return None

        rendered = render(entry, read, timeout=_render_timeout())
        result["shown"] = rendered.text[:2000]
        if rendered.ignored:
            result["ignored"] = list(rendered.ignored)
        if rendered.error:
            result["render_error"] = rendered.error
        for text in expected_text:
            wanted = " ".join(text.split())
            checks[f"shows {text!r}"] = shown = bool(wanted) and wanted in rendered.text
            if not shown:
                unseen.append(text)
    missing = [path for path in expected_files or [] if not current.exists(path)]
    for path in expected_files or []:
        checks[f"file {path}"] = path not in missing
    report = _validate(current)
    checks["validate"] = report["valid"]
    graded: dict[str, Any] = {
        "reward": sum(checks.values()) / len(checks),
        "checks": checks,
        "errors": report["errors"][:5],
        **result,
    }
    failed = []
    if unseen:
        graded["reward"] = 0.0  # the gate: an expected text a person does not see
        failed.append(
            f"the page does not show {_named(unseen)} (text a person does not see, in the "
            "source, hidden or removed, does not count)"
        )
        if result.get("render_error"):
            failed.append(f"it did not render: {result['render_error']}")
    if missing:
        failed.append(f"no file {_named(missing)}")
    if not report["valid"]:
        failed.append(f"validate found {len(report['errors'])} error(s)")
    if failed:
        graded["reason"] = "; ".join(failed)
    return graded


@register_health
def health() -> dict[str, Any]:
    """Healthy while the project directory exists; makes it (and the preview) on first use."""
    root = project().root
    return {"status": "healthy" if root.is_dir() else "unhealthy", "project": str(root)}
