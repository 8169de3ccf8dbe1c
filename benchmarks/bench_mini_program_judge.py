"""mini-program's reward in the judge against the same reward in the runtime (issue 23, point 6).

    .venv/bin/python benchmarks/bench_mini_program_judge.py              # 6 gradings each
    .venv/bin/python benchmarks/bench_mini_program_judge.py --gradings 10

Two standalone runtimes of mini-program (``python -m sandbox_runtime``): ``judge`` (the
built-in, whose reward runs in the judge: the agent's processes ended, the workspace copied, a
Chromium started for the grading and ended with it) and ``plain`` (the same project without
``"reward": {"judge": true}``: the reward in the runtime's process, with one Chromium for the
runtime's life, warm after the first grading: the path before the judge). Each grades the demo
tasks' reference solutions in turn. What is compared is **CPU time**: this process is a child
subreaper, so the runtime, its seed, every judge, every Chromium process (renderers and
zygotes too) are reaped here and counted in ``RUSAGE_CHILDREN``; each variant is run with
``--gradings`` gradings and with none (the runtime's start alone), and a grading's cost is the
difference divided by the count. Wall medians per grading are printed too (the machine's load
moves them). A measurement, not a test: exit 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aenv_ray.testing import RuntimeProcess
from builtin_envs.demos import mini_program as demo

MINI_PROGRAM = Path(__file__).resolve().parent.parent / "builtin_envs" / "mini_program"
_PR_SET_CHILD_SUBREAPER = 36


def _project(root: Path, judge: bool) -> Path:
    target = root / ("judge" if judge else "plain")
    shutil.copytree(MINI_PROGRAM, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = json.loads((target / "config.json").read_text())
    if not judge:
        config.pop("reward", None)
    (target / "config.json").write_text(json.dumps(config))
    return target


def _reap_all() -> None:
    """Kill and reap every process left under this one (orphans come here)."""
    me = os.getpid()
    while True:
        for name in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError, ValueError):
                stat = Path(f"/proc/{name}/stat").read_bytes()
                if int(stat[stat.rindex(b")") + 2 :].split()[1]) == me:
                    os.kill(int(name), signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _grade(project: Path, gradings: int, workspace: Path) -> tuple[float, list[float]]:
    """CPU seconds of a runtime of ``project`` that grades ``gradings`` times, and the wall
    time of each grading."""
    os.mkdir(workspace)
    before = _cpu()
    walls: list[float] = []
    runtime = RuntimeProcess(project, env={"AENV_WORKSPACE": str(workspace)})
    runtime.start(timeout=300)
    try:
        async with runtime.environment() as env:
            for index in range(gradings):
                task = demo.TASKS[index % len(demo.TASKS)]
                for step in task["setup"]:
                    await env.call_function(step["function"], step["arguments"])
                assert await demo.policy(task, env) == "valid"
                started = time.perf_counter()
                value: Any = await env.call_reward(task["reward_arguments"])
                walls.append(time.perf_counter() - started)
                assert value["reward"] == 1.0, value
    finally:
        runtime.stop()
        _reap_all()
    return _cpu() - before, walls


async def _measure(gradings: int) -> dict[str, dict[str, float]]:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-mp-judge-") as tmp:
        root = Path(tmp)
        projects = {"plain": _project(root, False), "judge": _project(root, True)}
        for name, project in projects.items():
            idle, _ = await _grade(project, 0, root / f"{name}-idle")
            busy, walls = await _grade(project, gradings, root / f"{name}-busy")
            results[name] = {
                "start_cpu": idle,
                "grading_cpu": (busy - idle) / gradings,
                "grading_wall": statistics.median(walls),
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradings", type=int, default=6)
    args = parser.parse_args()
    results = asyncio.run(_measure(args.gradings))
    print(f"{args.gradings} gradings of the demo tasks' reference solutions per variant")
    for name, row in results.items():
        print(
            f"{name:6}  runtime start {row['start_cpu']:6.2f} s CPU   a grading "
            f"{row['grading_cpu']:6.2f} s CPU, {row['grading_wall']:6.2f} s wall (median)"
        )
    ratio = results["judge"]["grading_cpu"] / results["plain"]["grading_cpu"]
    print(f"ratio judge/plain, CPU a grading: {ratio:.2f}")


if __name__ == "__main__":
    main()
