"""The README's main job, run as `scripts/run` runs it (without the set-up step)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin", "TERM": "dumb"},
    )


def test_quickstart_runs_episodes_and_prints_a_summary() -> None:
    result = quickstart("--episodes", "3", "--concurrency", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "mini-terminal@1.0.0: 3 episodes" in out
    assert re.search(r"episodes ok\W+3 / 3", out), out
    assert re.search(r"mean reward\W+1\.00", out), out
    assert re.search(r"tool calls\W+12\b", out), out  # 4 per episode
    assert "failed" not in out


def test_quickstart_rejects_bad_arguments() -> None:
    result = quickstart("--episodes", "0")
    assert result.returncode == 2
    assert "--episodes and --concurrency must be at least 1" in result.stderr
