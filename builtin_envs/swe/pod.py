"""swe in a Kubernetes pod: the rows, the repositories and the grading are the judge container's.

The runtime container (the agent's box: no namespaces of its own) holds no row and no source
repository of the judge's; it asks the pod's judge container (:mod:`builtin_envs.swe.judge`)
over the socket the pod spec names (``AENV_JUDGE_SOCKET``, :data:`IN_POD`). The connection is
opened before the agent's first command runs (every tool and function of the environment
starts the episode first) and never again: the judge serves only the first connection it
accepts, so a process of the agent's that reaches the socket later is refused.

:func:`start` asks the judge for a row (its public part only) and a bundle of its base history,
from which the agent's repository is set up as on the local engine; :class:`JudgedEpisode`
runs the agent's tools as plain processes of the pod and has the judge grade.

May import: ``aenv_ray``'s public API.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from builtin_envs.swe import reap
from builtin_envs.swe.episode import Episode, Settings
from builtin_envs.swe.rows import Row
from builtin_envs.swe.sandbox import LocalSandbox
from builtin_envs.terminal_bench.judge_wire import SOCKET_ENV, JudgeClient, PodJudge

__all__ = ["IN_POD", "JudgedEpisode", "instances", "judge", "start"]

IN_POD = bool(os.environ.get(SOCKET_ENV))
"""Whether this runtime is a pod's with a judge container (the pod spec names its socket)."""
_JUDGE = PodJudge()
_GRADE_SLACK = 900.0  # seconds a grading may take beyond its tests (setting up, copying)


def judge() -> JudgeClient:
    """The connection to the pod's judge, opened on the first call;
    :class:`~builtin_envs.terminal_bench.JudgeUnavailableError` once it is lost."""
    return _JUDGE.get()


@dataclasses.dataclass
class JudgedEpisode(Episode):
    """An episode whose repository came from the judge's bundle, whose commands run as plain
    processes of the pod (the pod is the box), and which the judge grades."""

    def __post_init__(self) -> None:
        # each command under the reaper, as the judge's: once its shell ends, what it left
        # running (a server started with `&`, a daemon that called setsid) ends too, and the
        # call returns; the output pipe such a process held open would otherwise keep the call
        # waiting to its timeout (124, the agent's), where the local engine's pid namespace
        # ends them at once
        self.sandbox = LocalSandbox([], isolate=False, wrap=reap.COMMAND)

    def hidden_paths(self) -> list[str]:
        """Nothing to hide: the rows and the source repositories are not in this container."""
        return []

    def _mirror(self, bundle: str) -> str:
        """The judge's bundle itself, no mirror of it: each reset's bundle is a new file (the
        judge removes the previous one), read once, to set this episode's repository up, so a
        mirror of it would never be used again, and one per reset would fill the container's
        ``/tmp`` (a size-limited ``emptyDir``) episode after episode."""
        return bundle

    def grade(self, strict: bool = True) -> dict[str, Any]:
        """End the agent's commands, then have the judge grade the repository as it stands
        (:meth:`builtin_envs.swe.judge.SweJudge.grade`); its report, with what the judge's copy
        left out (``judge``)."""
        with self.gate.judging(self.sandbox.stop_all):
            answer = judge().request(
                "grade",
                timeout=self.settings.test_timeout + _GRADE_SLACK,
                repo=self.settings.repo_dir,
                strict=strict,
            )
        graded = dict(answer["graded"])
        copy = answer.get("copy") or {}
        graded["judge"] = {
            "files": copy.get("files"),
            "bytes": copy.get("bytes"),
            "removed": copy.get("removed") or [],
            "links_out": copy.get("links_out") or [],
            "over_limit": copy.get("over_limit"),
            "ended": [*(answer.get("killed_before") or []), *(answer.get("killed_after") or [])],
        }
        self.graded = graded
        return graded


def start(
    settings: Settings,
    instance_id: str | None = None,
    index: int | None = None,
    *,
    dataset: str | None = None,
    row: dict[str, Any] | None = None,
) -> JudgedEpisode:
    """A new episode on the judge's row (``instance_id``, ``index``, ``row``: as
    ``swe_reset``; ``dataset``: a file of the judge's), the agent's repository set up from the
    base history the judge bundled (fetched from the bundle directly: the runtime's private
    directory, ``.swe-private`` in ``TMPDIR`` or ``/tmp``, keeps no copy of it)."""
    answer = judge().request(
        "reset",
        timeout=1800,
        instance_id=instance_id,
        index=index,
        dataset=dataset,
        row=row,
        repo=settings.repo_dir,
    )
    task = answer["task"]
    public = Row(
        instance_id=str(task["instance_id"]),
        repo=str(task["repo"]),
        base_commit=str(task["base_commit"]),
        test_patch="",
        fail_to_pass=(),
        pass_to_pass=(),
        problem_statement=str(task.get("problem_statement") or ""),
        hints_text=str(task.get("hints_text") or ""),
        version=str(task.get("version") or ""),
    )
    local = dataclasses.replace(
        settings, repos=(str(answer["bundle_dir"]),), isolation="none", datasource=False
    )
    private = os.path.join(tempfile.gettempdir(), ".swe-private")
    return JudgedEpisode.start(local, row=public, private=private)


def instances(dataset: str | None) -> list[str]:
    """The instance ids of a dataset of the judge's (default: its ``SWE_DATASET``)."""
    answer = judge().request("instances", timeout=120, dataset=dataset or "")
    return [str(i) for i in answer["instances"]]
