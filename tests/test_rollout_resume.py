"""A run directory holds one run: resuming into the records of another environment, task file or
policy is refused (``--force`` overrides), and ``--retry-failed`` leaves one row per episode in
both files (issue 13, point 4). Through ``aenv rollout`` as a user runs it, and the parts alone.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from builtin_envs.demos import mini_terminal
from rollout.run_directory import JSONL, RunDirectory, RunMismatchError
from tests._cli import aenv as run_cli

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = "mini-terminal@1.0.0"
ROLLOUT = ["rollout", TERMINAL, "--no-ray", "-c", "2"]


def _rollout(*args: str) -> subprocess.CompletedProcess[str]:
    """``aenv rollout`` in this process (tests/_cli.py)."""
    return run_cli(*ROLLOUT, *args, cwd=ROOT)


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / JSONL).read_text().splitlines()]


def _tasks(path: Path, **extra: Any) -> Path:
    path.write_text("".join(json.dumps({**t, **extra}) + "\n" for t in mini_terminal.TASKS))
    return path


# -- the parts ------------------------------------------------------------------------------------


def test_another_runs_records_are_refused_by_name_and_force_takes_them(tmp_path: Path) -> None:
    ours = {"env": "a@1", "tasks": "sha256:1", "policy": "p:f"}
    with RunDirectory.open(tmp_path) as run:
        run.check_identity(ours)  # an empty directory takes any run
        asyncio.run(run.append({"episode_id": "000000-t", "outcome": "ok"}))
    with RunDirectory.open(tmp_path) as run:
        run.check_identity(ours)  # the same run resumes
        with pytest.raises(RunMismatchError) as refused:
            run.check_identity({**ours, "policy": "q:g"})
        assert refused.value.differences == {"policy": ("p:f", "q:g")}
        assert "--force" in str(refused.value)
        run.check_identity({**ours, "policy": "q:g"}, force=True)
    with RunDirectory.open(tmp_path) as run:
        run.check_identity({**ours, "policy": "q:g"})  # forced: now this run's


def test_compact_keeps_each_episodes_latest_record_once(tmp_path: Path) -> None:
    with RunDirectory.open(tmp_path) as run:
        for record in (
            {"episode_id": "000000-a", "outcome": "timeout"},
            {"episode_id": "000001-b", "outcome": "ok"},
            {"episode_id": "000000-a", "outcome": "ok"},
        ):
            asyncio.run(run.append(record))
        assert run.compact() == 1
        asyncio.run(run.append({"episode_id": "000002-c", "outcome": "ok"}))  # still appends
        assert run.compact() == 0
    assert _lines(tmp_path) == [
        {"episode_id": "000000-a", "outcome": "ok"},
        {"episode_id": "000001-b", "outcome": "ok"},
        {"episode_id": "000002-c", "outcome": "ok"},
    ]


# -- through the CLI ------------------------------------------------------------------------------


def test_resuming_into_another_runs_directory_is_refused_naming_the_difference(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    first = _rollout("-n", "2", "--out", str(out))
    assert first.returncode == 0, first.stderr
    other = _tasks(tmp_path / "other.jsonl", note="another task file")
    refused = _rollout("-n", "2", "--tasks", str(other), "--out", str(out))
    assert refused.returncode == 2
    assert "holds records of another run" in refused.stderr
    assert "tasks:" in refused.stderr
    assert "--force" in refused.stderr
    assert len(_lines(out)) == 2  # nothing written
    policy = _rollout("-n", "2", "--policy", "tests._paced_policy:policy", "--out", str(out))
    assert policy.returncode == 2
    assert "policy:" in policy.stderr
    forced = _rollout("-n", "3", "--tasks", str(other), "--force", "--out", str(out))
    assert forced.returncode == 0, forced.stderr
    assert len(_lines(out)) == 3


def test_retry_failed_leaves_one_row_per_episode_in_both_files(tmp_path: Path) -> None:
    out, marker = tmp_path / "run", tmp_path / "now-it-works"
    tasks = _tasks(tmp_path / "tasks.jsonl", stall_unless=str(marker))
    common = ["--tasks", str(tasks), "--policy", "tests._flaky_policy:policy"]
    common += ["--retries", "0", "--out", str(out)]
    # (the last -c wins) 3 time-outs at once: 2 s (the limit is no part of the run's identity)
    first = _rollout("-n", "3", "-c", "3", "--episode-timeout", "2", *common)
    assert first.returncode == 1  # episodes that did not end ok
    assert {r["outcome"] for r in _lines(out)} == {"timeout"}
    marker.touch()
    again = _rollout("-n", "3", "--retry-failed", "--episode-timeout", "120", *common)
    assert again.returncode == 0, again.stderr
    lines = _lines(out)
    assert [r["outcome"] for r in lines] == ["ok"] * 3
    assert len({r["episode_id"] for r in lines}) == len(lines) == 3
    table = pq.read_table(out / "trajectories.parquet").to_pylist()
    assert sorted(r["episode_id"] for r in table) == sorted(r["episode_id"] for r in lines)
