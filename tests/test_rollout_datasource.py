"""``aenv rollout ENV --datasource DIR`` (issue 25, point 5): your own Terminal-Bench dataset,
written here in its format, rolled out from the command line (in this process, ``--no-ray``, on
the session's local engine); and a dataset the instances cannot see stops the command before
the run, with one line naming the path on this machine and in the instance (exit 2), instead
of an ``agent_error`` per episode. The direct run leaves none of its instances on the engine
(issue 25, point 7).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from aenv_ray.engine import InstanceState, SandboxEngine
from local_backend._sandbox import namespaces_available
from tests._cli import aenv, aenv_async

if (why := namespaces_available()) is not None:
    pytest.skip(f"terminal-bench's boxes need namespaces: {why}", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
RUN_TESTS = ROOT / "builtin_envs" / "terminal_bench" / "demo_tasks" / "hello-world" / "run-tests.sh"
TASKS: dict[str, dict[str, str]] = {
    "greet": {
        "task.yaml": "instruction: Write 'hi from my dataset' to /app/greeting.txt.\n",
        "solution.sh": "#!/bin/bash\necho 'hi from my dataset' > /app/greeting.txt\n",
        "tests/test_outputs.py": """
            from pathlib import Path

            def test_greeting():
                assert Path("/app/greeting.txt").read_text().strip() == "hi from my dataset"
        """,
    },
    "count": {
        "task.yaml": "instruction: Write the numbers 1 to 3, one a line, to /app/n.txt.\n",
        "solution.sh": "#!/bin/bash\nseq 1 3 > /app/n.txt\n",
        "tests/test_outputs.py": """
            from pathlib import Path

            def test_numbers():
                assert Path("/app/n.txt").read_text().split() == ["1", "2", "3"]
        """,
    },
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Terminal-Bench dataset of two tasks (neither a bundled demo task)."""
    root = tmp_path_factory.mktemp("my-tb-dataset")
    for name, files in TASKS.items():
        for relative, text in files.items():
            path = root / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text).lstrip("\n"))
        shutil.copy(RUN_TESTS, root / name / "run-tests.sh")
    for path in [root, *root.rglob("*")]:  # an instance's root is `nobody` on the host
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
async def test_your_own_dataset_is_rolled_out_and_leaves_no_instance(
    dataset: Path, tmp_path: Path, warm_engine: SandboxEngine
) -> None:
    out = tmp_path / "out"
    done = await aenv_async(
        "rollout", "terminal-bench@1.0.0", "--datasource", str(dataset), "-n", "2", "-c", "2",
        "--no-ray", "-o", str(out), cwd=ROOT, env={"COLUMNS": "120"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    # the dataset's tasks (not the demo's), each solved in the instance by its own solution.sh
    assert sorted(r["task_id"] for r in records) == ["count", "greet"]
    assert all(r["outcome"] == "ok" and r["reward"] == 1.0 for r in records), records
    # a direct run: the engine holds none of its instances any more
    ids = {r["instance_id"] for r in records}
    assert len(ids) == 2
    known = {i.id: i.state for i in await warm_engine.list()}
    assert ids <= set(known)  # the run's instances were this engine's
    assert {known[i] for i in ids} == {InstanceState.TERMINATED}


def _refused(*args: str, out: Path) -> str:
    """Run ``aenv rollout terminal-bench@1.0.0 ARGS``; it must stop before any episode."""
    done = aenv("rollout", "terminal-bench@1.0.0", "--no-ray", "-o", str(out), *args, cwd=ROOT)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("aenv: error: "), done.stderr
    records = out / "trajectories.jsonl"
    assert not records.exists() or not records.read_text()  # no episode ran, none recorded
    return lines[0]


def test_a_dataset_of_this_machine_named_by_a_variable_is_refused_before_the_run(
    dataset: Path, tmp_path: Path
) -> None:
    line = _refused("-e", f"TB_DATASET_DIR={dataset}", out=tmp_path / "out")
    assert f"TB_DATASET_DIR={dataset}" in line
    assert "cannot see" in line
    assert f"--datasource {dataset}" in line
    assert "/data" in line


def test_a_task_missing_from_the_datasource_is_refused_before_the_run(
    dataset: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    reset = {"function": "tb_reset", "arguments": {"task": "0"}}
    tasks.write_text(json.dumps({"id": "first", "prompt": "go", "setup": [reset]}) + "\n")
    line = _refused("--datasource", str(dataset), "--tasks", str(tasks), out=tmp_path / "a")
    assert f"{dataset / '0'}/task.yaml" in line
    assert "/data/0" in line
    # without a datasource the instance has nothing at /data: said before the run too
    line = _refused("--tasks", str(tasks), out=tmp_path / "b")
    assert "/data/0" in line
    assert "--datasource" in line


def test_swe_data_paths_are_checked_against_the_datasource(tmp_path: Path) -> None:
    data = tmp_path / "swe-data"
    data.mkdir()
    (data / "rows.jsonl").write_text("")
    done = aenv(
        "rollout", "swe@1.0.0", "--no-ray", "-o", str(tmp_path / "out"), "--datasource",
        str(data), "-e", "SWE_DATASET=/data/rows.jsonl", "-e", f"SWE_REPOS=/data:{data}",
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"SWE_REPOS=/data:{data} names {data}, which the instances cannot see" in done.stderr
    done = aenv(
        "rollout", "swe@1.0.0", "--no-ray", "-o", str(tmp_path / "out2"), "--datasource",
        str(data), "-e", "SWE_DATASET=/data/row.jsonl", cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"there is no {data / 'row.jsonl'} on this machine" in done.stderr


def test_a_datasource_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    line = _refused("--datasource", str(tmp_path / "nowhere"), out=tmp_path / "out")
    assert str(tmp_path / "nowhere") in line
    assert "no such directory" in line
