"""swe's judge container: the dataset, the repositories and the grading, out of the agent's reach.

On Kubernetes a pod's container may not make the namespaces swe's view of the instance is made
of on the local engine (:mod:`builtin_envs.swe.sandbox`). There the pod is the agent's box, and
this runs as a second container of the pod (``python -I -B -m builtin_envs.swe.judge``, the
same image as the runtime; ``deployConfig.judgeContainer``): its own pid namespace, the agent's
workspace mounted read-only (``--workspace``), its own empty directories for its repository
(``--app``, where the agent's workspace is in the runtime container: ``--seen-as``) and its
``/tmp`` (``--scratch``), the rows and the repositories from its own image (``SWE_DATASET``,
``SWE_REPOS``, ``/data``, the demo rows), and the socket's directory (``--share``, by default
the socket's), which the runtime container mounts read-only.

It serves one connection, the runtime's, as terminal-bench's judge does (the same protocol,
:mod:`builtin_envs.terminal_bench.judge_wire`, and the same server,
:func:`builtin_envs.terminal_bench.judge.serve`): every later connection is refused. The ops:

- ``ping``; ``instances`` (``dataset``: the instance ids of a dataset of the judge's);
- ``reset`` (``instance_id``, ``index``, ``dataset`` or ``row``, and ``repo``: where the runtime
  keeps the agent's repository): picks the row (held here from then on), sets its repository up
  at the base commit (only the base commit's history, as on the local engine) and writes that
  history as a git bundle into a fresh directory of the share, named in the answer
  (``bundle_dir``) with what the agent may know of the row (``task``); the runtime clones the
  agent's repository from it. No other file of the judge's reaches the runtime container.
- ``grade`` (``repo``, ``strict``), after the runtime ended the agent's commands: what a
  previous run left below the judge is ended, its repository and ``/tmp`` emptied and set up
  anew at the base commit (nothing a previous grading's tests wrote is used), the agent's
  repository copied over it **as files** (:func:`~builtin_envs.terminal_bench.judge.copy_files`:
  its ``.git`` left out, FIFOs, sockets and devices removed, links out of the repository
  removed, past :class:`~builtin_envs.terminal_bench.judge.CopyLimits` nothing runs and the
  episode is graded 0), and :meth:`Episode.grade <builtin_envs.swe.episode.Episode.grade>` grades
  that repository exactly as the local engine grades the agent's (strict: the source changes
  only, on a fresh checkout of the base commit, the test patch, FAIL_TO_PASS / PASS_TO_PASS;
  ``strict=False``: as SWE-bench, in the copy), with the judge's own ``git`` configuration and
  environment, never the agent's. The answer: ``graded`` (the reward's report), ``copy``,
  ``killed_before`` and ``killed_after``.

The judge is not dumpable and a child subreaper (nothing the tests start escapes it), and ends
what each run left (:func:`~builtin_envs.terminal_bench.judge.end_below`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError
from builtin_envs.swe import reap
from builtin_envs.swe.episode import Episode, Settings, pick_row, wait_for_discards
from builtin_envs.swe.rows import Row, load_rows, parse_row
from builtin_envs.swe.sandbox import LocalSandbox
from builtin_envs.terminal_bench.judge import (
    CopyLimits,
    copy_files,
    empty_dir,
    end_below,
    harden,
    listen_and_serve,
)

__all__ = ["HELLO", "SweJudge", "main", "repository_stem"]

HELLO = "swe judge"
_BUNDLES = "swe-base-"  # the share's directories of base bundles (one per reset)


def repository_stem(repo: str) -> str:
    """The name a row's repository is looked up by (``owner__name``, as
    :meth:`Episode.find_source <builtin_envs.swe.episode.Episode.find_source>` tries first).

    >>> repository_stem("demo/calc")
    'demo__calc'
    """
    owner, _, name = repo.rpartition("/")
    return f"{owner}__{name}" if owner else name


@dataclasses.dataclass
class _JudgeEpisode(Episode):
    """An episode of the judge's: every command it runs (git, the tests) runs under the
    reaper (:mod:`builtin_envs.swe.reap`), so that what a command leaves running (a daemon the
    tests' code started, holding the output pipe) ends when the command does, as it does with
    the pid namespace of the local engine's judge."""

    def __post_init__(self) -> None:
        self.sandbox = LocalSandbox([], isolate=False, wrap=reap.COMMAND)


class SweJudge:
    """What swe's judge container does for the runtime's requests (see the module docstring).

    ``workspace``: the agent's workspace (read-only here), which the agent sees at ``seen_as``;
    ``app``: the judge's own directory in its place (its repository lies where the agent's
    does); ``scratch``: its ``/tmp`` (the runtime's private files, the tests' home); ``share``:
    where the base bundles go (the runtime reads them); ``settings``: where the rows and
    repositories are (``SWE_*`` of the judge container)."""

    def __init__(
        self,
        *,
        workspace: str,
        app: str,
        scratch: str,
        share: str,
        seen_as: str,
        settings: Settings,
        limits: CopyLimits | None = None,
    ) -> None:
        self.workspace, self.app, self.scratch = Path(workspace), Path(app), Path(scratch)
        self.share, self.seen_as = Path(share), os.path.normpath(seen_as)
        self.settings = dataclasses.replace(settings, isolation="none", datasource=False)
        self.limits = limits or CopyLimits()
        self.row: Row | None = None
        self.busy = False  # a grading runs (the tests, the agent's code among them)
        self.stop_after = False  # asked to stop during one: stop once it is answered

    def _relative(self, repo: object) -> str:
        """The agent's repository (the runtime's path) relative to its workspace."""
        if not isinstance(repo, str) or not repo or "\0" in repo:
            raise ConfigurationError("give repo: the agent's repository, as the runtime sees it")
        relative = os.path.relpath(os.path.normpath(repo), self.seen_as)
        if relative == "." or relative.startswith("..") or os.path.isabs(relative):
            raise ConfigurationError(
                f"the repository {repo} is not inside the workspace {self.seen_as} the judge "
                "copies: set SWE_REPO_DIR inside AENV_WORKSPACE"
            )
        return relative

    def _fresh(self, relative: str) -> Episode:
        """The held row's repository at its base commit in the judge's emptied directories."""
        if self.row is None:
            raise ConfigurationError("no task yet: the runtime resets before it grades")
        end_below()
        wait_for_discards()
        empty_dir(self.app, 0o755)
        empty_dir(self.scratch, 0o1777)
        settings = dataclasses.replace(self.settings, repo_dir=str(self.app / relative))
        private = str(self.scratch / ".swe-private")
        return _JudgeEpisode.start(settings, row=self.row, private=private)

    def reset(self, request: dict[str, Any]) -> dict[str, Any]:
        """Pick the row, set its repository up, bundle its base history for the runtime."""
        relative = self._relative(request.get("repo"))
        settings = self.settings
        if request.get("dataset"):
            settings = dataclasses.replace(settings, dataset=str(request["dataset"]))
        raw, index = request.get("row"), request.get("index")
        if raw is not None:
            self.row = parse_row(raw, "row")
        else:
            if index is not None and not isinstance(index, int):
                raise ConfigurationError(f"index must be a whole number, not {index!r}")
            self.row = pick_row(settings, request.get("instance_id") or None, index)
        episode = self._fresh(relative)
        for entry in self.share.glob(f"{_BUNDLES}*"):
            empty_dir(entry, 0o755)
            entry.rmdir()
        folder = self.share / f"{_BUNDLES}{secrets.token_hex(6)}"
        folder.mkdir(mode=0o755)
        bundle = folder / f"{repository_stem(self.row.repo)}.bundle"
        episode.bundle_base(str(bundle))
        bundle.chmod(0o644)
        return {"task": self.row.public(), "bundle_dir": str(folder)}

    def grade(self, request: dict[str, Any]) -> dict[str, Any]:
        """Copy the agent's repository over a fresh checkout, grade it (module docstring)."""
        relative = self._relative(request.get("repo"))
        strict = request.get("strict", True) is not False
        killed = end_below()
        started = time.monotonic()
        episode = self._fresh(relative)
        repo = Path(episode.settings.repo_dir)
        for entry in list(repo.iterdir()):  # the base commit's files: the agent's replace them
            if entry.name != ".git":
                if entry.is_dir() and not entry.is_symlink():
                    empty_dir(entry, 0o755)
                    entry.rmdir()
                else:
                    entry.unlink()
        source, seen = self.workspace / relative, os.path.join(self.seen_as, relative)
        try:
            copy = copy_files(
                str(source), str(repo), seen_as=seen, limits=self.limits, skip=(".git",)
            )
        except OSError as exc:
            copy = {"files": 0, "bytes": 0, "removed": [], "links_out": [], "over_limit": None}
            refused = f"is not a directory the judge can read ({exc.strerror}): not graded"
        else:
            limit = copy["over_limit"]
            refused = limit and (
                f"holds more than {limit['cap']} {limit['limit']} (at {limit['path']!r}): the "
                "judge copied no more of it and ran no test"
            )
        if refused:
            reason = f"the agent's repository {seen} {refused}"
            graded = episode.ungraded(reason, started=started, strict=strict)
            return {"graded": graded, "copy": copy, "killed_before": killed, "ran": False}
        graded = episode.grade(strict=strict)
        return {
            "graded": graded,
            "copy": copy,
            "killed_before": killed,
            "killed_after": end_below(),
            "ran": True,
        }

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request (``ok`` and its fields, or ``ok: false`` and ``error``)."""
        op = request.get("op")
        try:
            if op == "ping":
                return {"ok": True, "pid": os.getpid()}
            if op == "instances":
                dataset = str(request.get("dataset") or self.settings.dataset)
                return {"ok": True, "instances": [r.instance_id for r in load_rows(dataset)]}
            if op in ("reset", "grade"):
                self.busy = True
                try:
                    answer = self.reset(request) if op == "reset" else self.grade(request)
                finally:
                    self.busy = False
                return {"ok": True, **answer}
            raise ValueError(f"unknown request {op!r}")
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        """End what runs below the judge."""
        end_below()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -I -B -m builtin_envs.swe.judge --socket PATH --workspace DIR``."""
    given = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=HELLO, description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="the unix socket to listen on")
    parser.add_argument("--workspace", required=True, help="the agent's work (read-only)")
    parser.add_argument("--app", default="/workspace", help="the judge's repository (emptied)")
    parser.add_argument("--scratch", default="/tmp", help="the judge's /tmp (emptied)")
    parser.add_argument("--seen-as", default="/workspace", help="where the agent saw its work")
    parser.add_argument("--share", help="where the base bundles go (the socket's directory)")
    parser.add_argument("--tests", help="unused (the pod spec gives every judge one)")
    parser.add_argument("--max-bytes", type=int, default=CopyLimits.bytes)
    parser.add_argument("--max-files", type=int, default=CopyLimits.files)
    args = parser.parse_args(given)
    harden(HELLO)
    judge = SweJudge(
        workspace=args.workspace,
        app=args.app,
        scratch=args.scratch,
        share=args.share or os.path.dirname(os.path.abspath(args.socket)),
        seen_as=args.seen_as,
        settings=Settings.from_environ({**os.environ, "SWE_DATASOURCE": "0"}),
        limits=CopyLimits(files=args.max_files, bytes=args.max_bytes),
    )
    print(f"{HELLO}: rows from {judge.settings.dataset}", file=sys.stderr, flush=True)
    listen_and_serve(args.socket, judge, hello=HELLO)


if __name__ == "__main__":
    main()
