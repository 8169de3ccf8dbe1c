"""Every task of ``../shared/data/terminal-bench/evoeval`` graded twice in real instances of the
local engine: with no action (not solved), then after its reference solution (solved); the tasks
whose ``tests/test_outputs.py`` is empty are invalid both times (no reward, neither pass nor
fail).

The dataset is the instances' datasource; a few warm instances share the tasks (``tb_reset``),
each grading "nothing", running ``solution.sh`` in the agent's box (``tb_run_solution``) and
grading again, so each task's two gradings reuse one instance and its warm pytest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import Environment
from aenv_ray.engine import SandboxEngine
from builtin_envs.terminal_bench import load_task, task_names
from local_backend._sandbox import namespaces_available

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(
    os.environ.get("AENV_TB_DATA") or ROOT.parent / "shared" / "data" / "terminal-bench" / "evoeval"
)
INVALID = {"5", "9", "15", "16"}  # their tests/test_outputs.py is empty
SOLUTION_FAILS = {"4"}  # its solution.sh fails its own tests (see the test below)
INSTANCES = 3

if not DATA.is_dir():
    pytest.skip(f"the evoeval tasks are not at {DATA} (set AENV_TB_DATA)", allow_module_level=True)
if (why := namespaces_available()) is not None:
    pytest.skip(f"terminal-bench's boxes need namespaces: {why}", allow_module_level=True)

log = logging.getLogger(__name__)


def test_the_dataset_is_what_the_tests_expect() -> None:
    names = task_names(DATA)
    assert len(names) == 80
    assert {n for n in names if not load_task(DATA / n).has_tests} == INVALID


def test_task_4s_own_solution_fails_its_tests_in_any_python() -> None:
    """The one reference solution that does not solve its task: it computes the weighted mean
    absolute deviation as 2.5499999999999994 where the test wants exactly 2.55 (float rounding,
    the same in every Python, so upstream too)."""
    script = (DATA / "4" / "solution.sh").read_text()
    source = script.split("<< 'EOL'\n", 1)[1].split("\nEOL", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(source, "solution.py", "exec"), namespace)
    case = [(7.1, 0.15), (2.3, 0.25), (9.6, 0.35), (5.2, 0.25)]
    assert namespace["weighted_mean_absolute_deviation"](case) == 2.5499999999999994
    tests = (DATA / "4" / "tests" / "test_outputs.py").read_text()
    assert '[(7.1, 0.15), (2.3, 0.25), (9.6, 0.35), (5.2, 0.25)]",\n    2.55' in tests


async def _grade_all(
    engine: SandboxEngine, names: list[str]
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    pending = list(names)
    graded: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    async def worker() -> None:
        async with Environment(
            "terminal-bench@1.0.0", engine=engine, datasource=str(DATA), ttl="30m"
        ) as env:
            while pending:
                name = pending.pop(0)
                await env.call_function("tb_reset", {"task": name})
                nothing = await env.call_reward({})
                ran = await env.call_function("tb_run_solution", {})
                assert ran["returncode"] == 0, (name, ran)
                graded[name] = (nothing, await env.call_reward({}))

    await asyncio.gather(*(worker() for _ in range(INSTANCES)))
    return graded


@pytest.mark.timeout(1200)
async def test_every_task_with_nothing_then_its_solution(warm_engine: SandboxEngine) -> None:
    names = task_names(DATA)
    started = time.monotonic()
    graded = await _grade_all(warm_engine, names)
    seconds = time.monotonic() - started
    log.warning("graded %d tasks twice in %.1f s", len(names), seconds)
    assert sorted(graded) == sorted(names)
    for name in names:
        nothing, solved = graded[name]
        if name in INVALID:
            for result in (nothing, solved):
                assert result["invalid"] is True, (name, result)
                assert result["reward"] is None
                assert result["outcome"] == "invalid"
                assert result["parser"] == "not_run"
            continue
        assert nothing["invalid"] is False
        assert (nothing["reward"], nothing["outcome"], nothing["resolved"]) == (
            0.0,
            "failed",
            False,
        ), (name, nothing["output_tail"])
        assert nothing["total"] >= 1
        assert solved["invalid"] is False
        if name not in SOLUTION_FAILS:
            assert (solved["reward"], solved["outcome"]) == (1.0, "passed"), (
                name,
                solved["output_tail"],
            )
            assert solved["passed"] == solved["total"] >= 1
            assert set(solved["tests"].values()) == {"passed"}
        else:  # its solution fails its tests here too
            assert (solved["reward"], solved["outcome"]) == (0.0, "failed"), name
            assert "failed" in solved["tests"].values()
