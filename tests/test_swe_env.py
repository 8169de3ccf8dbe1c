"""swe@1.0.0 in real instances of the local engine: the gold patch resolves its instance, an
empty patch does not, a patch that breaks a kept test does not; the logs those runs produced are
graded as the official ``swebench`` package grades them; the agent's commands and tools cannot
reach the dataset, the gold patch, the test patch or the later commits; the tools; the errors.

One instance serves the module (``swe_reset`` switches rows): its datasource is a directory this
test makes, holding a tiny git repository (a failing test and its fix) and its rows.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from aenv_ray import Environment
from aenv_ray.errors import FunctionError
from builtin_envs.demos import swe as demo
from tests._swebench_oracle import Case, oracle, ours

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET_TEST = "SECRET_TEST_PATCH_MARKER_7f3a"
SECRET_FIX = "SECRET_GOLD_PATCH_MARKER_91c2"
BASE_FILES = {
    "shapes/__init__.py": "",
    "shapes/area.py": "def square(side):\n    return side * side\n\n\n"
    "def rectangle(w, h):\n    return w + h\n",
    "tests/test_area.py": "from shapes.area import rectangle, square\n\n\n"
    "def test_square():\n    assert square(3) == 9\n",
}
FIXED_AREA = (
    "def square(side):\n    return side * side\n\n\n"
    f"def rectangle(w, h):\n    # {SECRET_FIX}\n    return w * h\n"
)
NEW_TESTS = BASE_FILES["tests/test_area.py"] + (
    f"\n\ndef test_rectangle():\n    # {SECRET_TEST}\n    assert rectangle(2, 3) == 6\n"
)


def _git(repo: Path, *args: str) -> str:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(repo),
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


def write_dataset(
    root: Path,
    repository: str,
    row: dict[str, Any],
    files: tuple[dict[str, str], dict[str, str], dict[str, str]],
    messages: tuple[str, str] = ("fix", "test"),
) -> dict[str, Any]:
    """``root/rows.jsonl`` with ``row`` and its repository ``root/<repository>``: a base commit
    of ``files[0]``, then upstream's fix (``files[1]``) and its test (``files[2]``) as later
    commits, whose diffs are the row's ``patch`` and ``test_patch``. The row, with its
    ``base_commit`` and (not in the file) its ``fix_commit``."""
    repo = root / repository
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, files[0])
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    _write(repo, files[1])
    patch = _git(repo, "diff")
    _git(repo, "commit", "-qam", messages[0])
    fix_commit = _git(repo, "rev-parse", "HEAD").strip()
    _write(repo, files[2])
    test_patch = _git(repo, "diff")
    _git(repo, "commit", "-qam", messages[1])
    commits = {"base_commit": base, "patch": patch, "test_patch": test_patch}
    named = {key: row[key] for key in ("instance_id", "repo")}  # the fields' order as upstream's
    row = {**named, **commits, **{k: v for k, v in row.items() if k not in named}}
    (root / "rows.jsonl").write_text(json.dumps(row) + "\n")
    return {**row, "fix_commit": fix_commit}


def make_dataset(root: Path) -> dict[str, Any]:
    """``root/rows.jsonl`` and ``root/acme__shapes``: a repository whose base commit has a
    bug, then upstream's fix and its test as later commits. The row, with its fix commit."""
    row = {
        "instance_id": "acme__shapes-1",
        "repo": "acme/shapes",
        "problem_statement": "rectangle(w, h) adds instead of multiplying.",
        "FAIL_TO_PASS": json.dumps(["tests/test_area.py::test_rectangle"]),
        "PASS_TO_PASS": json.dumps(["tests/test_area.py::test_square"]),
        "test_cmd": "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider",
    }
    files = (BASE_FILES, {"shapes/area.py": FIXED_AREA}, {"tests/test_area.py": NEW_TESTS})
    return write_dataset(root, "acme__shapes", row, files, ("fix rectangle", "test rectangle"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("swe-data")
    root.chmod(0o755)
    return root, make_dataset(root)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(dataset: tuple[Path, dict[str, Any]]) -> AsyncIterator[Environment]:
    root, _ = dataset
    async with Environment(
        "swe@1.0.0", datasource=str(root), ttl="20m", timeout=300
    ) as environment:
        yield environment


async def _run(env: Environment, command: str) -> dict[str, Any]:
    result = await env.call_tool("run_command", {"command": command})
    assert not result.is_error, result.text
    assert isinstance(result.structured, dict)
    return result.structured


async def _reset_shapes(env: Environment) -> dict[str, Any]:
    task: dict[str, Any] = await env.call_function(
        "swe_reset", {"dataset": "/data/rows.jsonl", "instance_id": "acme__shapes-1"}
    )
    return task


async def _apply(env: Environment, patch: str) -> None:
    done = await _run(env, f"git apply - <<'EOF_PATCH'\n{patch}\nEOF_PATCH")
    assert done["returncode"] == 0, done["output"]


GRADED: list[tuple[str, dict[str, Any], dict[str, Any]]] = []  # (what, row, reward) of real runs


def _case(what: str, row: dict[str, Any], reward: dict[str, Any]) -> Case:
    parser = "parse_log_" + reward["log_parser"]
    return Case(
        id=row["instance_id"],
        log=reward["test_log"],
        parser=parser,
        f2p=json.loads(row["FAIL_TO_PASS"]),
        p2p=json.loads(row["PASS_TO_PASS"]),
        patch=reward["model_patch"],
        parsers=[parser],
    )


def _demo_rows() -> dict[str, dict[str, Any]]:
    from builtin_envs.swe.episode import DEMO_DATASET

    rows = [json.loads(line) for line in DEMO_DATASET.read_text().splitlines()]
    return {row["instance_id"]: row for row in rows}


@pytest.mark.parametrize("instance_id", ["demo__calc-1", "demo__textkit-1"])
async def test_the_demo_gold_patch_resolves_and_an_empty_patch_does_not(
    env: Environment, instance_id: str
) -> None:
    row = _demo_rows()[instance_id]
    task = await env.call_function("swe_reset", {"instance_id": instance_id})
    assert task["instance_id"] == instance_id
    assert task["repo_dir"] == "/workspace/testbed"
    assert "patch" not in task
    assert "test_patch" not in task
    empty = await env.call_reward({"strict": False})
    assert empty["reward"] == 0.0
    assert empty["resolution"] == "RESOLVED_NO"
    assert empty["gradable"] is True  # the tests ran; the F2P test failed
    status = empty["report"][instance_id]["tests_status"]
    assert status["FAIL_TO_PASS"]["failure"] == json.loads(row["FAIL_TO_PASS"])
    assert status["PASS_TO_PASS"]["failure"] == []
    GRADED.append(("empty", row, empty))

    await env.call_function("swe_reset", {"instance_id": instance_id})
    answer = await demo.policy(next(t for t in demo.TASKS if t["id"] == instance_id), env)
    assert answer is not None
    strict = await env.call_reward({})  # the judge's checkout, the source change alone
    assert strict["reward"] == 1.0, strict["test_log"]
    assert strict["strict"] is True
    assert strict["left_out"] == []
    assert strict["model_patch"].strip() == row["patch"].strip()
    gold = await env.call_reward({"strict": False})  # as SWE-bench grades
    assert gold["reward"] == 1.0, gold["test_log"]
    assert gold["resolved"] is True
    assert gold["resolution"] == "RESOLVED_FULL"
    assert gold["model_patch"].strip() == row["patch"].strip()
    GRADED.append(("gold", row, gold))


async def test_a_local_repository_gold_resolves_empty_and_breaking_do_not(
    env: Environment, dataset: tuple[Path, dict[str, Any]]
) -> None:
    _, row = dataset
    task = await _reset_shapes(env)
    assert task["base_commit"] == row["base_commit"]
    assert (await env.call_reward({}))["resolution"] == "RESOLVED_NO"

    await _reset_shapes(env)
    await _apply(env, row["patch"])
    gold = await env.call_reward({"strict": False})
    assert gold["resolution"] == "RESOLVED_FULL", gold["test_log"]
    assert gold["test_statuses"] == {
        "tests/test_area.py::test_square": "PASSED",
        "tests/test_area.py::test_rectangle": "PASSED",
    }
    GRADED.append(("gold", row, gold))

    # fixes rectangle, breaks square: F2P passes, a P2P test fails
    await _reset_shapes(env)
    await _apply(env, row["patch"])
    await env.call_tool(
        "str_replace",
        {"path": "shapes/area.py", "old_str": "return side * side", "new_str": "return side"},
    )
    broken = await env.call_reward({"strict": False})
    assert broken["resolution"] == "RESOLVED_NO"
    status = broken["report"]["acme__shapes-1"]["tests_status"]
    assert status["FAIL_TO_PASS"]["success"] == ["tests/test_area.py::test_rectangle"]
    assert status["PASS_TO_PASS"]["failure"] == ["tests/test_area.py::test_square"]
    GRADED.append(("breaking", row, broken))

    # the agent changed a test file to pass: the grading resets it first
    await _reset_shapes(env)
    await _apply(env, row["patch"])
    await _run(env, "echo 'def test_square(): pass' > tests/test_area.py")
    cheat = await env.call_reward({})
    assert cheat["resolution"] == "RESOLVED_FULL"  # the real tests ran, and pass
    assert cheat["left_out"] == [{"path": "tests/test_area.py", "reason": "test"}]
    after = await _run(env, "git status --short; ls tests")
    assert "test_area.py" in after["output"]
    assert SECRET_TEST not in after["output"]


async def test_the_real_runs_are_graded_as_swebench_grades_them() -> None:
    assert {what for what, _, _ in GRADED} >= {"empty", "gold", "breaking"}, "run the module"
    cases = [_case(what, row, reward) for what, row, reward in GRADED]
    official = oracle(cases)
    for (what, row, reward), case, answer in zip(GRADED, cases, official, strict=True):
        mine = ours(case)
        assert mine == answer, (what, row["instance_id"])
        assert reward["report"] == answer["eval_report"], (what, row["instance_id"])
        assert reward["test_statuses"] == answer["statuses"]
        assert reward["resolution"] == answer["resolution"]


HOSTILE = [
    "cat /data/rows.jsonl",
    "ls -la /data /tmp /tmp/.swe-private",
    f"grep -rl -e {SECRET_TEST} -e {SECRET_FIX} / --exclude-dir=proc --exclude-dir=sys "
    "--exclude-dir=usr --exclude-dir=dev --exclude-dir=.venv --exclude-dir=node_modules "
    "2>/dev/null",
    "git log --all --oneline; git count-objects -v; git fsck --lost-found 2>&1",
    "for p in /proc/[0-9]*; do echo $p; cat $p/cmdline | tr '\\0' ' '; echo; done",
    "umount /data; umount -l /data; ls /data",
    "mount -t proc proc /mnt 2>&1; ls /mnt | head",
    "unshare -U -r -m sh -c 'umount /data; ls /data'",
    "cat /proc/1/environ | tr '\\0' '\\n'; cat /proc/self/mountinfo",
]


async def test_the_agent_cannot_see_the_dataset_the_patches_or_later_commits(
    env: Environment, dataset: tuple[Path, dict[str, Any]]
) -> None:
    _, row = dataset
    await _reset_shapes(env)
    seen = ""
    for command in HOSTILE:
        seen += (await _run(env, command))["output"]
    for secret in (SECRET_TEST, SECRET_FIX, row["fix_commit"], row["fix_commit"][:7]):
        assert secret not in seen
    assert "acme__shapes" not in seen  # the repository's source
    hidden = await _run(env, "ls -A /data /tmp/.swe-private | wc -l")
    assert hidden["output"].split() == ["3"]  # two headers and a blank line: both empty
    fix = await _run(env, f"git cat-file -t {row['fix_commit']}")
    assert fix["returncode"] != 0
    # the file tools run in the same view: a link to the dataset leads nowhere
    await _run(env, "ln -s /data/rows.jsonl leak.txt")
    for name, args in [
        ("view", {"path": "/data/rows.jsonl"}),
        ("view", {"path": "leak.txt"}),
        ("view", {"path": "/data"}),
        ("search", {"pattern": "MARKER", "path": "/data"}),
        ("search", {"pattern": "MARKER", "path": "/tmp"}),
    ]:
        result = await env.call_tool(name, args)
        assert SECRET_TEST not in result.text
        assert "test_patch" not in result.text
    # nothing a command starts outlives it
    await _run(env, "setsid sleep 300 & (sleep 300 &) ; nohup sleep 300 >/dev/null 2>&1 &")
    listing = await _run(env, "ps -eo pid,comm")
    assert "sleep" not in listing["output"]
    # the task the agent may know
    task = await env.call_function("swe_task", {})
    assert SECRET_TEST not in json.dumps(task)
    assert SECRET_FIX not in json.dumps(task)


async def test_the_file_tools(env: Environment) -> None:
    await _reset_shapes(env)
    made = await env.call_tool("create_file", {"path": "notes/a.txt", "file_text": "x\ny\nx\n"})
    assert not made.is_error
    assert "notes/a.txt" in made.text
    again = await env.call_tool("create_file", {"path": "notes/a.txt", "file_text": ""})
    assert again.is_error
    assert "already exists" in again.text
    shown = await env.call_tool("view", {"path": "notes/a.txt", "view_range": [2, -1]})
    assert shown.text.endswith("     2\ty\n     3\tx\n")
    bad_range = await env.call_tool("view", {"path": "notes/a.txt", "view_range": [5, 9]})
    assert bad_range.is_error
    assert "outside the file's lines 1..3" in bad_range.text
    twice = await env.call_tool("str_replace", {"path": "notes/a.txt", "old_str": "x"})
    assert twice.is_error
    assert "Multiple occurrences of old_str in lines [1, 3]" in twice.text
    absent = await env.call_tool("str_replace", {"path": "notes/a.txt", "old_str": "zz"})
    assert absent.is_error
    assert "did not appear verbatim" in absent.text
    edited = await env.call_tool(
        "str_replace", {"path": "notes/a.txt", "old_str": "y\n", "new_str": "why\n"}
    )
    assert not edited.is_error
    assert "     2\twhy" in edited.text
    assert (await _run(env, "cat notes/a.txt"))["output"] == "x\nwhy\nx\n"
    listing = await env.call_tool("view", {"path": "."})
    assert "notes/a.txt" in listing.text
    assert "shapes/area.py" in listing.text
    found = await env.call_tool("search", {"pattern": "def (square|rectangle)", "include": "*.py"})
    assert found.text.splitlines() == [
        "shapes/area.py:1:def square(side):",
        "shapes/area.py:5:def rectangle(w, h):",
    ]
    none = await env.call_tool("search", {"pattern": "nothing-like-this", "fixed_strings": True})
    assert none.text.startswith("No matches")
    missing = await env.call_tool("view", {"path": "no/such/file.py"})
    assert missing.is_error
    assert "no such file or directory" in missing.text
    slow = await env.call_tool("run_command", {"command": "echo started; sleep 30", "timeout": 1})
    assert slow.structured is not None
    assert slow.structured["returncode"] == 124
    assert "started" in slow.structured["output"]
    assert "killed after 1 s" in slow.structured["output"]
    diff = await env.call_function("swe_diff", {})
    assert "+++ b/notes/a.txt" in diff["patch"]


async def test_a_bad_task_is_refused_with_the_reason(env: Environment) -> None:
    with pytest.raises(FunctionError, match="no instance 'nope' in"):
        await env.call_function("swe_reset", {"instance_id": "nope"})
    row = {
        "instance_id": "x-1",
        "repo": "acme/absent",
        "base_commit": "a" * 40,
        "test_patch": "",
        "FAIL_TO_PASS": [],
        "PASS_TO_PASS": [],
    }
    with pytest.raises(FunctionError, match="no repository for acme/absent"):
        await env.call_function("swe_reset", {"row": row})
    with pytest.raises(FunctionError, match=r"setting up acme/shapes at a{40} .* failed"):
        await env.call_function(
            "swe_reset", {"row": {**row, "repo": "acme/shapes"}, "dataset": "/data/rows.jsonl"}
        )
    with pytest.raises(FunctionError, match="`base_commit` must be a commit's hex id"):
        await env.call_function("swe_reset", {"row": {**row, "base_commit": "HEAD"}})
    ids = await env.call_function("swe_instances", {"dataset": "/data/rows.jsonl"})
    assert ids == ["acme__shapes-1"]
