"""One SWE episode: a row's repository at its base commit, the agent's file and command tools,
and the grading of what the agent left: strict (the agent's source changes on a fresh
checkout, in a judge's view) or as SWE-bench grades.

:class:`Settings` come from ``SWE_*`` variables; :class:`Episode` sets the repository up (from a
directory or a git bundle, fetching only the history of ``base_commit``: later commits, the fix
among them, never reach the agent's repository), runs the tools in a :mod:`sandbox
<builtin_envs.swe.sandbox>` that hides the dataset and aenv-ray's source, and grades
(:meth:`Episode.grade`): the test patch is applied only then, the tests run, and
:mod:`~builtin_envs.swe.grading` reads the log.

May import: ``aenv_ray``'s public API.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from aenv_ray.errors import ConfigurationError
from builtin_envs.swe import grading
from builtin_envs.swe.log_parsers import resolve_parser
from builtin_envs.swe.rows import Row, RowError, eval_script, load_rows, modified_files
from builtin_envs.swe.sandbox import (
    CommandResult,
    DatasourceSandbox,
    Judge,
    LocalSandbox,
    Sandbox,
    hidden_around,
)
from builtin_envs.swe.strict import split_patch

__all__ = [
    "DEMO_DATASET",
    "Episode",
    "RepositoryError",
    "Settings",
    "added_files",
    "pick_row",
    "task_prompt",
]

log = logging.getLogger("swe")

DEMO_DATASET = Path(__file__).resolve().parent / "data" / "demo.jsonl"
"""The rows of the demo tasks, shipped with the environment (their repositories are bundles
beside it)."""
_CODE_ROOT = Path(__file__).resolve().parents[2]
"""Where this environment's code lies: an aenv-ray checkout (``pyproject.toml`` beside
``builtin_envs/``), or the ``site-packages`` it was installed into."""
_MAX_VIEW = 2_000_000
_DIFF_LIMIT = 128 << 20  # the most of the agent's diff read (a datasource container: 16 MiB)
_SYSTEM_DIRS = frozenset(
    {"/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/dev", "/sys", "/opt"}
)


class RepositoryError(ConfigurationError):
    """A row's repository cannot be set up: not found, or its base commit is not in it."""


def _float(environ: Mapping[str, str], key: str, default: float) -> float:
    raw = environ.get(key)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{key}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ConfigurationError(f"{key}={raw!r} must be positive")
    return value


@dataclass(frozen=True)
class Settings:
    """Where the rows and repositories are, and the limits (``SWE_*`` variables)."""

    dataset: str = str(DEMO_DATASET)
    repos: tuple[str, ...] = ()
    instance_id: str = ""
    repo_dir: str = ""
    isolation: str = "namespaces"
    command_timeout: float = 120.0
    test_timeout: float = 1800.0
    datasource: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """Settings from ``SWE_DATASET``, ``SWE_REPOS`` (``:``-separated), ``SWE_INSTANCE``,
        ``SWE_REPO_DIR``, ``SWE_ISOLATION`` (``namespaces`` or ``none``),
        ``SWE_COMMAND_TIMEOUT``, ``SWE_TEST_TIMEOUT``; ``SWE_DATASOURCE=1`` (or a configured
        datasource container) runs everything in the datasource container."""
        isolation = environ.get("SWE_ISOLATION") or "namespaces"
        if isolation not in ("namespaces", "none"):
            raise ConfigurationError(
                f"SWE_ISOLATION={isolation!r}: use namespaces (hide the dataset from the "
                "agent's commands) or none"
            )
        workspace = environ.get("AENV_WORKSPACE") or os.getcwd()
        datasource = environ.get("SWE_DATASOURCE", "")
        if datasource not in ("", "0", "1"):
            raise ConfigurationError(f"SWE_DATASOURCE={datasource!r}: use 1 or 0")
        if datasource == "":
            from aenv_ray import datasource as ds

            use_datasource = ds.Datasource().is_configured
        else:
            use_datasource = datasource == "1"
        return cls(
            dataset=environ.get("SWE_DATASET") or str(DEMO_DATASET),
            repos=tuple(p for p in (environ.get("SWE_REPOS") or "").split(":") if p),
            instance_id=environ.get("SWE_INSTANCE", ""),
            repo_dir=environ.get("SWE_REPO_DIR") or os.path.join(workspace, "testbed"),
            isolation=isolation,
            command_timeout=_float(environ, "SWE_COMMAND_TIMEOUT", 120.0),
            test_timeout=_float(environ, "SWE_TEST_TIMEOUT", 1800.0),
            datasource=use_datasource,
        )

    def repo_dirs(self) -> list[str]:
        """Where repositories are looked for: ``SWE_REPOS``, else beside the dataset (and its
        ``repos/``), then ``/data``."""
        if self.repos:
            return list(self.repos)
        here = os.path.dirname(os.path.abspath(self.dataset))
        return [here, os.path.join(here, "repos"), "/data"]


_PENDING: list[threading.Thread] = []
"""The background removals of judges' directories not yet joined."""


def wait_for_discards() -> None:
    """Wait until the judges' directories of earlier gradings are removed."""
    while _PENDING:
        _PENDING.pop().join()


def code_paths(repo_dir: str) -> list[str]:
    """What hides aenv-ray's own source from the agent: the local engine's instances see the
    checkout the runtime imports its code from (the demo tasks' gold fixes are in its
    ``builtin_envs/swe/make_demo.py``, its docs and its history). In a checkout, every entry
    of it but the runtime's Python (``sys.prefix``, a ``.venv`` in it, which the agent's
    commands and the tests run with); installed in ``site-packages``, the ``builtin_envs``
    package."""
    root = _CODE_ROOT
    keep = [sys.prefix, sys.base_prefix, repo_dir, os.environ.get("AENV_WORKSPACE") or ""]
    if (root / "pyproject.toml").is_file() and (root / "builtin_envs").is_dir():
        return hidden_around(str(root), [k for k in keep if k])
    return [str(root / "builtin_envs")]


def added_files(patch: str) -> list[str]:
    """The files a patch creates (``--- /dev/null`` followed by ``+++ b/PATH``)."""
    return re.findall(r"^--- /dev/null\s*\n\+\+\+ b/(.*?)\s*$", patch, re.MULTILINE)


def _git_env(home: str) -> dict[str, str]:
    """Git's environment for the runtime's own git calls: no global or system configuration
    (the agent can write ``$HOME/.gitconfig`` in the workspace), no prompts."""
    return {
        "PATH": os.environ.get("PATH") or "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }


_UPLOAD_PACK = (
    "git -c safe.directory=* -c uploadpack.allowAnySHA1InWant=true "
    "-c uploadpack.allowReachableSHA1InWant=true upload-pack"
)
# the base commit alone (no history) checked out at $1 from the repository $2 ($3: the commit,
# $4: the upload-pack command); prints the checkout's files, NUL-separated
_CLONE_BASE = (
    'git init -q "$1" && cd "$1" && '
    'git fetch -q --no-tags --depth=1 --upload-pack="$4" "$2" "$3" && '
    "git checkout -q --detach FETCH_HEAD && git ls-files -z"
)


class ToolGate:
    """Keeps the agent's tools and the grading apart: a grading waits for no tool (it ends the
    commands still running), and a tool called while a grading runs waits until it is done
    (so nothing of the agent runs in, or touches, the judge's checkout)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._judging = False

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """Around one tool call."""
        with self._cond:
            self._cond.wait_for(lambda: not self._judging)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def judging(self, stop: Callable[[], object]) -> Iterator[None]:
        """Around a grading: no new tool starts, ``stop`` ends the running ones, and the
        grading starts once they have returned."""
        with self._cond:
            self._cond.wait_for(lambda: not self._judging)
            self._judging = True
        try:
            stop()
            with self._cond:
                while self._active:
                    self._cond.wait(timeout=1.0)
                    if self._active:
                        stop()
            yield
        finally:
            with self._cond:
                self._judging = False
                self._cond.notify_all()


@dataclass
class Episode:
    """The current row, its repository and the sandbox the agent's commands run in."""

    settings: Settings
    row: Row
    private: str
    sandbox: Sandbox = field(init=False)
    started: float = field(default_factory=time.monotonic)
    graded: dict[str, Any] | None = None
    gate: ToolGate = field(default_factory=ToolGate)

    def __post_init__(self) -> None:
        if self.settings.datasource:
            self.sandbox = DatasourceSandbox()
        else:
            self.sandbox = LocalSandbox(
                self.hidden_paths(), isolate=self.settings.isolation == "namespaces"
            )

    # -- setting up ------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        settings: Settings,
        instance_id: str | None = None,
        index: int | None = None,
        row: Row | None = None,
        private: str | None = None,
    ) -> Self:
        """A new episode on ``row``, or the dataset's row ``instance_id`` (or ``index``, or the
        settings' instance, or the first); its repository set up at the base commit.
        ``private``: where the runtime keeps its own files (the bundles' mirrors; default
        ``/tmp/.swe-private``)."""
        if row is None:
            row = pick_row(settings, instance_id, index)
        if private is None:
            where = "/tmp" if os.path.isdir("/tmp") else os.getcwd()
            private = os.path.join(where, ".swe-private")
        os.makedirs(private, mode=0o700, exist_ok=True)
        episode = cls(settings, row, private)
        episode._check_hidden()
        episode.setup_repository()
        return episode

    def hidden_paths(self) -> list[str]:
        """What the agent's commands see empty: the private files, the dataset's directory,
        the repositories' directories, ``/data``, the demo data, and this environment's own
        code (see :func:`code_paths`)."""
        paths = [
            self.private,
            os.path.dirname(os.path.abspath(self.settings.dataset)),
            *self.settings.repo_dirs(),
            "/data",
            str(DEMO_DATASET.parent),
        ]
        found = [os.path.realpath(p) for p in paths if os.path.isdir(p)]
        return found + code_paths(self.settings.repo_dir)

    def _check_hidden(self) -> None:
        if self.settings.datasource:
            return
        repo = os.path.realpath(self.settings.repo_dir)
        for path in self.hidden_paths():
            inside = repo == path or repo.startswith(path.rstrip("/") + "/")
            if path in _SYSTEM_DIRS or inside or sys.prefix.startswith(path.rstrip("/") + "/"):
                raise ConfigurationError(
                    f"swe: {path} would be hidden from the agent's commands (it holds the "
                    "dataset or the repositories) but it is a system directory or holds the "
                    "agent's own files; put the dataset and the repositories in a directory "
                    "of their own (SWE_DATASET, SWE_REPOS)"
                )

    def _git(self, args: Sequence[str], cwd: str, timeout: float = 600) -> CommandResult:
        """The runtime's own git call: in the datasource container, or here (trusted: only on
        sources and on a repository the agent has not touched yet)."""
        return self._trusted(["git", *args], cwd, timeout)

    def _trusted(self, command: list[str], cwd: str, timeout: float) -> CommandResult:
        """Run one of the runtime's own commands (:meth:`_git`, :meth:`_sh`): in the datasource
        container, or here with the runtime's environment for git, output and errors together."""
        if self.settings.datasource:
            return self.sandbox.run(command, cwd=cwd, timeout=timeout)
        completed = subprocess.run(
            command,
            cwd=cwd,
            env=_git_env(self.private),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
        return CommandResult(completed.returncode, completed.stdout.decode(errors="replace"))

    def _exists(self, path: str, kind: str) -> bool:
        if not self.settings.datasource:
            return os.path.isdir(path) if kind == "d" else os.path.isfile(path)
        result = self.sandbox.run(["test", f"-{kind}", path], cwd="/", timeout=30)
        return result.returncode == 0

    def find_source(self) -> str:
        """The row's repository: a git directory or bundle in one of the repository dirs."""
        owner, _, name = self.row.repo.rpartition("/")
        stems = [f"{owner}__{name}", f"{owner}/{name}", name] if owner else [name]
        tried = []
        for base in self.settings.repo_dirs():
            for stem in stems:
                bundle = os.path.join(base, stem + ".bundle")
                directory = os.path.join(base, stem)
                tried += [bundle, directory]
                if self._exists(bundle, "f"):
                    return bundle
                if self._exists(os.path.join(directory, ".git"), "d") or self._exists(
                    os.path.join(directory, "objects"), "d"
                ):
                    return directory
        raise RepositoryError(
            f"swe: no repository for {self.row.repo} (instance {self.row.instance_id}); looked "
            f"for {', '.join(tried)}; put a clone or a git bundle there, or name the "
            "directory with SWE_REPOS"
        )

    def _mirror(self, bundle: str) -> str:
        """A bare repository of the bundle's refs, made once per bundle (in the private dir)."""
        digest = hashlib.sha256(bundle.encode()).hexdigest()[:16]
        root = self.private if not self.settings.datasource else "/tmp/.swe-private"
        mirror = os.path.join(root, "mirrors", digest + ".git")
        if self._exists(os.path.join(mirror, "swe-ready"), "f"):
            return mirror
        for args in (
            ["init", "-q", "--bare", mirror],
            ["-C", mirror, "fetch", "-q", "--no-tags", bundle, "+refs/*:refs/*"],
        ):
            result = self._git(args, cwd="/")
            if result.returncode != 0:
                raise RepositoryError(
                    f"swe: cannot read the git bundle {bundle}: {result.output.strip()[-500:]}"
                )
        if self.settings.datasource:
            self.sandbox.run(["touch", os.path.join(mirror, "swe-ready")], cwd="/", timeout=30)
        else:
            Path(mirror, "swe-ready").touch()
        return mirror

    def setup_repository(self) -> None:
        """Empty the workspace and fetch the base commit's history into the repository dir.

        Where the runtime's private directory is out of the agent's reach (see
        :meth:`_keeps_pristine`), the history is fetched once per repository and commit into
        it and each episode's repository is a full copy of that."""
        started = time.monotonic()
        source = self.find_source()
        if source.endswith(".bundle"):
            source = self._mirror(source)
        repo = self.settings.repo_dir
        self._clear_workspace(repo)
        if self._keeps_pristine():
            copied = self._from_pristine(
                source,
                "history",
                lambda tree: self._fetch_base(source, tree),
                'cp -a --reflink=auto -- "$1/tree" "$2"',
                repo,
            )
            if copied.returncode != 0:
                raise RepositoryError(
                    f"swe: setting up {self.row.repo} at {self.row.base_commit} from {source} "
                    f"failed (copy): {copied.output.strip()[-500:]}"
                )
        else:
            self._fetch_base(source, repo)
        log.info(
            "swe: repository ready",
            extra={
                "instance_id": self.row.instance_id,
                "repo": self.row.repo,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    def _fetch_base(self, source: str, repo: str) -> None:
        """A repository at ``repo`` holding the base commit's history from ``source``, checked
        out."""
        steps = [
            ["init", "-q", repo],
            [
                "-C",
                repo,
                "fetch",
                "-q",
                "--no-tags",
                f"--upload-pack={_UPLOAD_PACK}",
                source,
                self.row.base_commit,
            ],
            ["-C", repo, "checkout", "-q", "--detach", "FETCH_HEAD"],
            ["-C", repo, "config", "user.name", "swe"],
            ["-C", repo, "config", "user.email", "swe@localhost"],
        ]
        for args in steps:
            result = self._git(args, cwd="/")
            if result.returncode != 0:
                raise RepositoryError(
                    f"swe: setting up {self.row.repo} at {self.row.base_commit} from {source} "
                    f"failed (git {args[3] if args[0] == '-C' else args[0]}): "
                    f"{result.output.strip()[-500:]}"
                )

    def bundle_base(self, path: str) -> None:
        """Write the repository's history as it was set up (the base commit's, no later
        commit) as a git bundle at ``path``, its one branch ``swe-base``: what a pod's judge
        hands the runtime to set the agent's repository up from (:mod:`builtin_envs.swe.judge`).
        Only before the agent touched the repository."""
        repo = self.settings.repo_dir
        for args in (
            ["-C", repo, "update-ref", "refs/heads/swe-base", "HEAD"],
            ["-C", repo, "bundle", "create", "-q", path, "refs/heads/swe-base"],
        ):
            made = self._git(args, cwd="/")
            if made.returncode != 0:
                raise RepositoryError(
                    f"swe: cannot bundle {self.row.repo} at {self.row.base_commit}: "
                    f"{made.output.strip()[-500:]}"
                )

    def _clear_workspace(self, repo: str) -> None:
        """Remove the previous episode's repository, and when the repository lies directly in
        the workspace, whatever else the agent left there (a ``.gitconfig`` included)."""
        wait_for_discards()
        workspace = os.environ.get("AENV_WORKSPACE") or "/workspace"
        parent = os.path.dirname(os.path.normpath(repo))
        everything = os.path.normpath(parent) == os.path.normpath(workspace)
        if self.settings.datasource:
            target = shlex.quote(parent if everything else repo)
            command = (
                f"mkdir -p {target} && find {target} -mindepth 1 -delete"
                if everything
                else f"rm -rf {target} && mkdir -p {shlex.quote(parent)}"
            )
            self.sandbox.run(["sh", "-c", command], cwd="/", timeout=300)
            return
        folder = Path(parent)
        folder.mkdir(parents=True, exist_ok=True)
        entries = list(folder.iterdir()) if everything else [Path(repo)]
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():
                entry.unlink()

    # -- the agent's tools -----------------------------------------------------------------

    def _path(self, path: str) -> str:
        if not path or "\x00" in path:
            raise ValueError("give a path: a file or directory of the repository")
        full = path if os.path.isabs(path) else os.path.join(self.settings.repo_dir, path)
        return os.path.normpath(full)

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        """Run a bash command in the repository; its output and exit status."""
        limit = timeout if timeout is not None else self.settings.command_timeout
        if limit <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        result = self.sandbox.run(
            ["bash", "-c", command], cwd=self.settings.repo_dir, timeout=limit
        )
        return {"output": result.output, "returncode": result.returncode}

    def _read(self, path: str) -> str:
        script = (
            'if [ -d "$1" ]; then echo D; find "$1" -maxdepth 2 -not -path "*/.*" | sort '
            '| head -n 1000; elif [ -f "$1" ]; then echo F; head -c "$2" -- "$1"; '
            'else echo "no such file or directory: $1" >&2; exit 2; fi'
        )
        result = self.sandbox.run(
            ["sh", "-c", script, "sh", path, str(_MAX_VIEW)],
            cwd=self.settings.repo_dir,
            timeout=60,
            max_output=_MAX_VIEW + 100,
        )
        if result.returncode != 0:
            raise ValueError(result.output.strip() or f"cannot read {path}")
        return result.output

    def read_file(self, path: str) -> str:
        """The text of a file of the repository."""
        full = self._path(path)
        text = self._read(full)
        kind, _, body = text.partition("\n")
        if kind != "F":
            raise ValueError(f"{path} is a directory; give a file")
        return body

    def view(self, path: str, view_range: Sequence[int] | None = None) -> str:
        """A file with line numbers (``view_range``: first and last line, -1 for the end), or
        a directory's files two levels deep."""
        full = self._path(path)
        text = self._read(full)
        kind, _, body = text.partition("\n")
        if kind == "D":
            if view_range:
                raise ValueError("view_range applies to files, not directories")
            return f"Files and directories up to 2 levels deep in {full}:\n{body}"
        lines = body.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        first, last = 1, len(lines)
        if view_range:
            if len(view_range) != 2:
                raise ValueError("view_range is [first, last] (last -1: to the end)")
            first, last = int(view_range[0]), int(view_range[1])
            if last == -1:
                last = len(lines)
            if not 1 <= first <= max(len(lines), 1) or last < first or last > len(lines):
                raise ValueError(
                    f"view_range {list(view_range)} is outside the file's lines 1..{len(lines)}"
                )
        numbered = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, last + 1))
        return f"Here's the result of running `cat -n` on {full}:\n{numbered}\n"

    def _write(self, path: str, text: str, *, create: bool) -> None:
        script = (
            'if [ "$2" = new ] && [ -e "$1" ]; then '
            'echo "File already exists at $1; edit it with str_replace" >&2; exit 17; fi; '
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        )
        result = self.sandbox.run(
            ["sh", "-c", script, "sh", path, "new" if create else "old"],
            cwd=self.settings.repo_dir,
            timeout=60,
            stdin=text.encode(),
        )
        if result.returncode != 0:
            raise ValueError(result.output.strip() or f"cannot write {path}")

    def create(self, path: str, file_text: str) -> str:
        """Create a new file with ``file_text``."""
        full = self._path(path)
        self._write(full, file_text, create=True)
        return f"File created successfully at: {full}"

    def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the one occurrence of ``old_str`` in a file with ``new_str``."""
        if not old_str:
            raise ValueError("old_str is empty; give the exact text to replace")
        full = self._path(path)
        text = self.read_file(full)
        count = text.count(old_str)
        if count == 0:
            raise ValueError(
                f"No replacement was performed, old_str did not appear verbatim in {full}."
            )
        if count > 1:
            starts = [m.start() for m in re.finditer(re.escape(old_str), text)]
            lines = sorted({text.count("\n", 0, s) + 1 for s in starts})
            raise ValueError(
                f"No replacement was performed. Multiple occurrences of old_str in lines "
                f"{lines}. Please ensure it is unique"
            )
        start = text.index(old_str)
        changed = text.replace(old_str, new_str, 1)
        self._write(full, changed, create=False)
        first = text.count("\n", 0, start) + 1
        changed_lines = changed.split("\n")
        low = max(first - 4, 1)
        high = min(first + new_str.count("\n") + 4, len(changed_lines))
        snippet = "\n".join(f"{n:6}\t{changed_lines[n - 1]}" for n in range(low, high + 1))
        return (
            f"The file {full} has been edited. Here's the result of running `cat -n` on a "
            f"snippet of {full}:\n{snippet}\nReview the changes and make sure they are as "
            "expected. Edit the file again if necessary."
        )

    def search(
        self,
        pattern: str,
        path: str = ".",
        include: str | None = None,
        fixed_strings: bool = False,
        ignore_case: bool = False,
        max_results: int = 100,
    ) -> str:
        """Lines matching ``pattern`` (an extended regular expression, or plain text) under
        ``path``, as ``file:line:text``."""
        if not pattern:
            raise ValueError("pattern is empty")
        if max_results < 1:
            raise ValueError("max_results must be at least 1")
        args = ["grep", "-rnI", "--exclude-dir=.git", "-F" if fixed_strings else "-E"]
        if ignore_case:
            args.append("-i")
        if include:
            args.append(f"--include={include}")
        if not path or "\x00" in path:
            raise ValueError("give a path: a file or directory of the repository")
        args += ["-e", pattern, "--", path]  # a relative path is the repository's (the cwd)
        result = self.sandbox.run(args, cwd=self.settings.repo_dir, timeout=60)
        if result.returncode == 1:
            return f"No matches for {pattern!r} in {path}"
        if result.returncode != 0:
            raise ValueError(result.output.strip() or f"grep failed with {result.returncode}")
        lines = [line.removeprefix("./") for line in result.output.rstrip("\n").split("\n")]
        shown = "\n".join(lines[:max_results])
        more = len(lines) - max_results
        return shown + (f"\n[{more} more matches not shown]" if more > 0 else "")

    # -- grading ---------------------------------------------------------------------------

    def diff(self) -> str:
        """The agent's change against the base commit, new files included (the model patch)."""
        return self._diffs(binary=False)[0]

    def _diffs(self, *, binary: bool) -> tuple[str, str, bool]:
        """The model patch, and (``binary``) the same change as strict grading applies it:
        binary files whole, no renames, no diff drivers; one command for both. The last item
        says the output was cut (larger than the sandbox returns): neither is the whole change
        then."""
        marker = f"SWE-DIFF-{secrets.token_hex(8)}"
        second = (
            f'echo "{marker}"; git -c core.fileMode=false -c core.quotePath=false diff --cached '
            "--no-renames --no-ext-diff --no-textconv --no-color --no-relative --binary "
            '--src-prefix=a/ --dst-prefix=b/ "$1"'
            if binary
            else ""
        )
        script = (
            'export GIT_INDEX_FILE="$(mktemp -u /tmp/swe-index.XXXXXX)"; '
            "trap 'rm -f \"$GIT_INDEX_FILE\"' EXIT; "
            'git read-tree "$1" && git add -A . >/dev/null 2>&1; '
            'git -c core.fileMode=false diff --cached "$1" || exit 1; '
            f"{second}"
        )
        result = self.sandbox.run(
            ["sh", "-c", script, "sh", self.row.base_commit],
            cwd=self.settings.repo_dir,
            timeout=300,
            max_output=_DIFF_LIMIT,
        )
        if result.returncode != 0:
            return "", "", result.truncated
        plain, _, full = result.output.partition(f"{marker}\n")
        return plain, full, result.truncated

    def _sh(self, script: str, *args: str, timeout: float = 600) -> CommandResult:
        """The runtime's own shell command (trusted: on files only, never the agent's code)."""
        return self._trusted(["sh", "-c", script, "sh", *args], "/", timeout)

    def grade(self, strict: bool = True) -> dict[str, Any]:
        """Grade the episode: the reward's answer.

        ``strict`` (the default): end every command of the agent still running, then run the
        tests on a fresh checkout of the base commit with the agent's changes to source files
        applied (:mod:`builtin_envs.swe.strict` says which files are left out; the report
        lists them), in the judge's view: a fresh ``/tmp`` and home, the runtime's
        environment. ``strict=False``: as SWE-bench grades, in the agent's repository as the
        agent left it."""
        with self.gate.judging(self.sandbox.stop_all):
            wait_for_discards()
            if strict:
                return self._grade_strict()
            return self._grade_in_place()

    def _grade_in_place(self) -> dict[str, Any]:
        started = time.monotonic()
        patch = self.diff()
        result = self._run_eval(judge=None)
        return self._report(result, patch, started, strict=False)

    def _run_eval(self, judge: Judge | None) -> CommandResult:
        script = eval_script(self.row, self.settings.repo_dir)
        added = " ".join(shlex.quote(f) for f in added_files(self.row.test_patch))
        if added:
            script += f"rm -f -- {added}\n"  # the test patch's new files go with it
        where = judge.home if judge is not None else "/tmp"
        name = f"{where}/swe-eval-{secrets.token_hex(8)}.sh"
        self._put(name, script)
        try:
            return self.sandbox.run(
                ["bash", name],
                cwd=self.settings.repo_dir,
                timeout=self.settings.test_timeout,
                max_output=32 << 20,
                judge=judge,
            )
        finally:
            self._remove(name)

    def _grade_strict(self) -> dict[str, Any]:
        started = time.monotonic()
        repo = os.path.normpath(self.settings.repo_dir)
        parent = os.path.dirname(repo)
        token = secrets.token_hex(6)
        checkout = os.path.join(parent, f".swe-judge-{token}")
        aside = os.path.join(parent, f".swe-agent-{token}")
        home = os.path.join(parent, f".swe-judge-home-{token}")
        # the judge's checkout is made while the agent's diff is taken
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            made = pool.submit(self._checkout, checkout)
            patch, full, cut = self._diffs(binary=True)
            base_files = made.result()
        if cut:  # a part of the change would be graded as if it were all of it: none is
            self._discard(checkout)
            return self.ungraded(
                "the agent's change is larger than the grading reads whole (its diff against "
                f"the base commit was cut at {_DIFF_LIMIT >> 20} MiB, 16 in a datasource "
                "container): not graded",
                patch=patch,
                started=started,
            )

        def read_base(path: str) -> str | None:
            return self._read_trusted(os.path.join(checkout, path))

        def read_agent(path: str) -> str | None:
            try:
                return self.read_file(os.path.join(repo, path))
            except ValueError:
                return None

        split = split_patch(
            full,
            base_files=base_files,
            test_patch_files=[
                *modified_files(self.row.test_patch),
                *added_files(self.row.test_patch),
            ],
            test_command="\n".join([*self.row.eval_commands, self.row.test_command()]),
            read_base=read_base,
            read_agent=read_agent,
        )
        patch_file = os.path.join(checkout, ".git", "swe-source.patch")
        if split.applied:
            self._put(patch_file, split.applied)
        # apply the source changes (if any) to the judge's checkout, then set it in place of
        # the agent's repository (which goes aside, out of the tests' sight)
        prepared = self._sh(
            'if [ -s "$5" ]; then cd "$3" && git apply --binary --whitespace=nowarn "$5" 2>&1 '
            '|| { echo "SWE-APPLY-FAILED"; exit 3; }; rm -f "$5"; fi; '
            'mkdir -m 700 "$4" && mv -T "$1" "$2" && mv -T "$3" "$1"',
            repo,
            aside,
            checkout,
            home,
            patch_file if split.applied else "",
        )
        applied_ok = "SWE-APPLY-FAILED" not in prepared.output
        apply_log = prepared.output.replace("SWE-APPLY-FAILED", "").strip()[-2000:]
        try:
            if not applied_ok:
                result = CommandResult(1, f"{grading.APPLY_PATCH_FAIL}\n{apply_log}")
            elif prepared.returncode != 0:
                raise RepositoryError(
                    f"swe: cannot set the judge's checkout in place of {repo}: {apply_log}"
                )
            else:
                # a fresh /tmp, where the repository, the home and the runtime's Python show
                # if they lie under /tmp (nothing else of the agent's /tmp does)
                result = self._run_eval(Judge(home=home, hide=(aside,), keep=(repo,)))
        finally:
            # the agent's repository back in place (two renames); the judge's checkout and
            # home removed after the reward has answered
            trash = os.path.join(parent, f".swe-trash-{token}")
            restored = self._sh(
                'if [ -d "$2" ]; then mv -T "$1" "$3" && mv -T "$2" "$1"; fi',
                repo,
                aside,
                trash,
            )
            if restored.returncode != 0:
                log.error(
                    "swe: the agent's repository could not be put back",
                    extra={"output": restored.output[-500:]},
                )
            self._discard(trash, home, checkout)
        graded = self._report(result, patch, started, strict=True)
        graded["left_out"] = [item.to_json() for item in split.left_out]
        graded["graded_files"] = list(split.applied_files)
        if split.left_out:
            names = ", ".join(f"{i.path} ({i.reason})" for i in split.left_out[:10])
            more = len(split.left_out) - 10
            graded["reason"] += (
                f"; left out of the graded change: {names}{f' and {more} more' if more > 0 else ''}"
            )
        if not applied_ok:
            graded["reason"] = (
                "the agent's source changes do not apply to a fresh checkout of the base "
                f"commit: {apply_log.strip()[-500:]}"
            )
        self.graded = graded
        return graded

    def ungraded(
        self,
        reason: str,
        *,
        patch: str = "",
        started: float | None = None,
        strict: bool = True,
    ) -> dict[str, Any]:
        """The report of a grading that ran no test, for ``reason`` (the agent's doing: its
        change too large to read whole, its work past a judge's copy limits): reward 0."""
        graded = self._report(
            CommandResult(1, f"{grading.APPLY_PATCH_FAIL}\n{reason}"),
            patch,
            time.monotonic() if started is None else started,
            strict=strict,
        )
        graded.update(left_out=[], graded_files=[], reason=reason)
        self.graded = graded
        return graded

    def _discard(self, *paths: str) -> None:
        """Remove the judge's directories: in the background here (the next reset or grading
        waits for it), at once in the datasource container."""
        script = 'rm -rf -- "$@"'
        if self.settings.datasource:
            self._sh(script, *paths)
            return
        thread = threading.Thread(
            target=self._sh, args=(script, *paths), name="swe-discard", daemon=True
        )
        thread.start()
        _PENDING.append(thread)

    def _read_trusted(self, path: str) -> str | None:
        if self.settings.datasource:
            result = self.sandbox.run(["cat", "--", path], cwd="/", timeout=60)
            return result.output if result.returncode == 0 else None
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def _checkout(self, target: str) -> list[str]:
        """A fresh checkout of the base commit at ``target``, from the row's repository; its
        files.

        Where nothing the agent runs reaches the runtime's private directory (the local
        engine's namespaces hide it from the agent's commands and from the tests of every
        grading), the base commit is checked out once per repository and commit into it (a
        pristine checkout, never handed out) and each grading gets a full copy of it
        (``cp -a --reflink=auto``: copy-on-write where the file system has it, never links):
        what a grading's tests write stays in that grading's copy. Elsewhere (no isolation,
        a datasource container, swe's judge container) every grading clones anew."""
        source = self.find_source()
        if source.endswith(".bundle"):
            source = self._mirror(source)
        if self._keeps_pristine():

            def build(tree: str) -> None:
                files = self._clone_base(source, tree)
                Path(tree).with_name("files").write_text("\0".join(files), encoding="utf-8")

            script = 'cp -a --reflink=auto -- "$1/tree" "$2" && cat -- "$1/files"'
            copied = self._from_pristine(source, "base", build, script, target)
            if copied.returncode != 0:
                raise RepositoryError(
                    f"swe: the judge's copy of {self.row.repo} at {self.row.base_commit} "
                    f"failed: {copied.output.strip()[-500:]}"
                )
            return [f for f in copied.output.split("\0") if f]
        return self._clone_base(source, target)

    def _clone_base(self, source: str, target: str) -> list[str]:
        """The base commit alone checked out at ``target`` from ``source``; its files."""
        result = self._sh(_CLONE_BASE, target, source, self.row.base_commit, _UPLOAD_PACK)
        if result.returncode != 0:
            raise RepositoryError(
                f"swe: the judge's checkout of {self.row.repo} at {self.row.base_commit} "
                f"failed: {result.output.strip()[-500:]}"
            )
        return [f for f in result.output.split("\0") if f]

    def _keeps_pristine(self) -> bool:
        """Whether pristine copies may be kept in the private directory: only where nothing the
        agent runs reaches it (the local engine's namespaces hide it from the agent's commands
        and from every grading's tests); not without isolation, in a datasource container or
        in swe's judge container."""
        return self.settings.isolation == "namespaces" and not self.settings.datasource

    def _pristine(self, source: str, kind: str, build: Callable[[str], object]) -> str:
        """The private directory holding ``tree`` (``build`` makes it from ``source`` at the
        base commit; ``kind`` names what it holds) and whatever ``build`` wrote beside it, made
        once per repository, commit and kind: built aside, then renamed into place whole. One
        of each kind is kept (the current row's): making one removes the others."""
        named = f"{kind}\0{source}\0{self.row.base_commit}"
        key = f"{kind}-{hashlib.sha256(named.encode()).hexdigest()[:16]}"
        root = os.path.join(os.path.abspath(self.private), "pristine")
        done = os.path.join(root, key)
        if os.path.isdir(done):
            return done
        os.makedirs(root, mode=0o700, exist_ok=True)
        building = os.path.join(root, f"{key}.{secrets.token_hex(4)}")
        os.mkdir(building, 0o700)
        try:
            build(os.path.join(building, "tree"))
            os.rename(building, done)
        except OSError:  # another episode made it first
            if not os.path.isdir(done):
                raise
        finally:
            if os.path.isdir(building):
                shutil.rmtree(building)
        for entry in os.listdir(root):  # renamed first: a copy being made from it fails
            if entry.startswith(f"{kind}-") and "." not in entry and entry != key:
                gone = os.path.join(root, f"{entry}.gone-{secrets.token_hex(4)}")
                with contextlib.suppress(OSError):
                    os.rename(os.path.join(root, entry), gone)
                    shutil.rmtree(gone, ignore_errors=True)
        return done

    def _from_pristine(
        self,
        source: str,
        kind: str,
        build: Callable[[str], object],
        script: str,
        target: str,
    ) -> CommandResult:
        """Run ``script`` (``$1``: the pristine directory of ``kind``, ``$2``: ``target``);
        once more on one made anew if it was removed meanwhile (a runtime sharing the private
        directory moved to another row: its removal renames the directory first, so a copy it
        cut short failed)."""
        pristine = self._pristine(source, kind, build)
        result = self._sh(script, pristine, target)
        if result.returncode != 0 and not os.path.isdir(pristine):
            self._sh('rm -rf -- "$1"', target)
            result = self._sh(script, self._pristine(source, kind, build), target)
        return result

    def _report(
        self, result: CommandResult, patch: str, started: float, *, strict: bool
    ) -> dict[str, Any]:
        test_log = result.output
        if result.timed_out:
            test_log += (
                f"\n{grading.TESTS_TIMEOUT}\n"
                f"Timeout error: {self.settings.test_timeout:g} seconds exceeded."
            )
        parser = resolve_parser(self.row.parser_name)
        report = grading.eval_report(
            test_log,
            parser,
            self.row.fail_to_pass,
            self.row.pass_to_pass,
            self.row.eval_type,
            patch=patch,
        )
        statuses, gradable = grading.logs_eval(test_log, parser)
        resolution = (
            grading.resolution_status(report["tests_status"]).value
            if "tests_status" in report
            else grading.ResolvedStatus.NO.value
        )
        tests = report.get("tests_status") or {}
        failing = [
            *tests.get(grading.FAIL_TO_PASS, {}).get("failure", []),
            *tests.get(grading.PASS_TO_PASS, {}).get("failure", []),
        ]
        if report["resolved"]:
            reason = "resolved: every FAIL_TO_PASS and PASS_TO_PASS test passed"
        elif not gradable:
            reason = "the test run cannot be graded (no test result in its log)"
        else:
            reason = f"{resolution}: failing {failing[:10]}"
        self.graded = {
            "reward": 1.0 if report["resolved"] else 0.0,
            "reason": reason,
            "resolved": report["resolved"],
            "resolution": resolution,
            "gradable": gradable,
            "strict": strict,
            "instance_id": self.row.instance_id,
            "report": {self.row.instance_id: report},
            "test_statuses": statuses,
            "test_command": self.row.test_command(),
            "log_parser": self.row.parser_name,
            "test_log": test_log[-20_000:],
            "model_patch": patch[:200_000],
            "seconds": round(time.monotonic() - started, 3),
        }
        log.info(
            "swe: graded",
            extra={
                "instance_id": self.row.instance_id,
                "resolution": resolution,
                "strict": strict,
                "seconds": self.graded["seconds"],
            },
        )
        return self.graded

    def _put(self, path: str, text: str) -> None:
        if self.settings.datasource:
            result = self.sandbox.run(
                ["sh", "-c", 'cat > "$1"', "sh", path], cwd="/", timeout=60, stdin=text.encode()
            )
            if result.returncode != 0:
                raise RuntimeError(f"swe: cannot write {path}: {result.output.strip()}")
            return
        Path(path).write_text(text, encoding="utf-8")

    def _remove(self, path: str) -> None:
        if self.settings.datasource:
            self.sandbox.run(["rm", "-f", path], cwd="/", timeout=60)
            return
        Path(path).unlink(missing_ok=True)

    def public(self) -> dict[str, Any]:
        """What the agent may know of the task, and where the repository is."""
        return {
            **self.row.public(),
            "repo_dir": self.settings.repo_dir,
            "prompt": task_prompt(self.row, self.settings.repo_dir),
        }


def task_prompt(row: Row, repo_dir: str = "/workspace/testbed") -> str:
    """The task as the agent is told it: the problem statement and where the repository is."""
    return (
        f"{row.problem_statement.strip()}\n\n"
        f"The repository {row.repo} is checked out at {repo_dir} (commit "
        f"{row.base_commit[:12]}). Change its non-test files so that the issue above is "
        "resolved; hidden tests will check it. Use the tools to look around, edit files and "
        "run commands."
    )


def pick_row(settings: Settings, instance_id: str | None, index: int | None) -> Row:
    """The dataset's row ``instance_id``, or at ``index``, or the settings' instance, or the
    first."""
    rows = load_rows(settings.dataset)
    wanted = instance_id or (None if index is not None else settings.instance_id) or None
    if wanted:
        for row in rows:
            if row.instance_id == wanted:
                return row
        near = ", ".join(r.instance_id for r in rows[:10])
        raise RowError(
            f"no instance {wanted!r} in {settings.dataset} ({len(rows)} rows: {near}"
            f"{', ...' if len(rows) > 10 else ''})"
        )
    if index is not None:
        if not 0 <= index < len(rows):
            raise RowError(f"index {index} is outside 0..{len(rows) - 1} of {settings.dataset}")
        return rows[index]
    return rows[0]
