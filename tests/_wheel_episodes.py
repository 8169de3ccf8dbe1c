"""One episode of every built-in environment, run by an installed aenv-ray (tests/test_wheel.py).

Not imported by the tests: tests/test_wheel.py copies this file out of the checkout and runs it
with the Python of a fresh virtual environment that has the wheel installed, ``python -I
episodes.py REQUEST`` (isolated: neither the script's directory nor ``PYTHON*`` variables on
``sys.path``), so that everything it imports comes from the installed wheel. ``REQUEST`` is a
JSON object: ``out`` (a directory), ``agent`` (the agent built-in's instance variables: a model
and a hub) and ``tau2`` (run it: without its data package, its entry says what is missing).

Each built-in runs as ``aenv rollout REF --no-ray`` does (:func:`rollout.synthesis.synthesize`,
the built-in's own demo policy, its instances on the local engine), all at once in this one
process. Prints one JSON object: the files the packages were imported from, the built-ins'
project directories, and each built-in's records (outcome, reward, reason, tools called) and
wall time.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

PACKAGES = ("aenv_ray", "aenv_cli", "sandbox_runtime", "local_backend", "rollout", "envhub")


def demo_tasks(module: str) -> list[dict[str, Any]]:
    """The demo tasks each episode plays: the first of each built-in's, and of every tau2
    domain the first whose reference calls a tool (telecom's reads its db.toml and
    user_db.toml in the instance)."""
    demo = importlib.import_module(f"builtin_envs.demos.{module}")
    tasks: list[dict[str, Any]] = demo.TASKS
    if module == "tau2":
        firsts: dict[str, dict[str, Any]] = {}
        for task in tasks:
            domain = task["id"].split("-", 1)[0]
            if domain not in firsts and demo.reference_solution(task).actions:
                firsts[domain] = task
        return list(firsts.values())
    if module == "terminal_bench":
        return [next(t for t in tasks if t["id"] == "hello-world")]
    return tasks[:1]


async def episodes(request: dict[str, Any]) -> dict[str, Any]:
    """Every built-in's episodes, at once; their records, by built-in."""
    from rollout.sources import SDKSource
    from rollout.synthesis import read_trajectories, synthesize

    plan = {
        "mini-terminal@1.0.0": ("mini_terminal", {}),
        "mini-program@1.0.0": ("mini_program", {}),
        "terminal-bench@1.0.0": ("terminal_bench", {}),
        "swe@1.0.0": ("swe", {}),
        "agent@1.0.0": ("agent", request["agent"]),
    }
    if request["tau2"]:
        plan["tau2@1.0.0"] = ("tau2", {})
    out = Path(request["out"])

    async def one(ref: str, module: str, variables: dict[str, str]) -> dict[str, Any]:
        if module == "tau2":  # its data is a package of its own: installed here, or not
            from builtin_envs.tau2.data import data_dir
            from builtin_envs.tau2.errors import Tau2DataError

            try:
                data_dir()
            except Tau2DataError as exc:
                return {"missing": str(exc), "records": [], "seconds": 0.0}
        tasks = demo_tasks(module)
        started = time.perf_counter()
        await synthesize(
            ref,
            episodes=len(tasks),
            concurrency=len(tasks),
            out=out / module,
            tasks=tasks,
            source=SDKSource(ref, environment_variables=variables),
        )
        records = [
            {
                "task_id": record["task_id"],
                "outcome": record["outcome"],
                "reward": record["reward"],
                "reason": record.get("reason"),
                "tools": [step.get("tool") for step in record["steps"]],
            }
            for record in read_trajectories(out / module)
        ]
        return {"records": records, "seconds": round(time.perf_counter() - started, 1)}

    done = await asyncio.gather(*(one(ref, *how) for ref, how in plan.items()))
    return dict(zip(plan, done, strict=True))


def main() -> None:
    request = json.loads(sys.argv[1])
    from builtin_envs import builtin_refs

    modules = {name: str(importlib.import_module(name).__file__) for name in PACKAGES}
    modules["builtin_envs"] = str(importlib.import_module("builtin_envs").__file__)
    report = {
        "prefix": sys.prefix,
        "modules": modules,
        "builtins": {ref: str(path) for ref, path in builtin_refs().items()},
        "episodes": asyncio.run(episodes(request)),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
