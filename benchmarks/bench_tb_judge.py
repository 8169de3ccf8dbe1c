"""terminal-bench's grading with the judge against today's, in one run (issue 23, point 6).

    .venv/bin/python benchmarks/bench_tb_judge.py                   # 5 rounds, 3 demo tasks
    .venv/bin/python benchmarks/bench_tb_judge.py --rounds 3 --base COMMIT

"Today's" is ``terminal-bench`` as it is at ``--base`` (default: ``b51f11a``, the commit before
the judge came, issue 23), its project and its library (the parser, ``grade``, the offline
tools) taken from git into a temporary directory and served as ``terminal-bench-today@1.0.0``
(``AENV_ENV_PATH``), so the difference is the grading path: the judge ends the
agent's box, checks ``/app``, makes a fresh ``/tmp`` and home, and reads and checks pytest's
report. One warm instance of each on the same local engine; each round does, per task and per
path, ``tb_reset``, the reference solution (``tb_run_solution``, not timed) and a timed
``call_reward`` (with a process the agent left running, which the judge ends). The two paths
alternate, so the machine's load falls on both. Prints the medians and the ratio judge/today
(the target: at most 1.5). A measurement, not a test: exit 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "builtin_envs/terminal_bench"


BEFORE_THE_JUDGE = "b51f11a"  # terminal-bench before its judge (69187ad added it)
LIBRARY_AS = "_tb_today_lib"  # today's library, inside today's project


# What the runtime has asked of every environment since (not grading): a process a call starts
# ends with the call unless kept (keep_processes), and the warm pytest, which joins the boxes'
# namespaces, starts outside the runtime's Landlock domain (unconfined). terminal-bench's own
# code has both; today's gets them here, where they apply, or it cannot run at all.
_PORTS = [
    (
        b"import _tb_today_lib as terminal_bench_library\n",
        b"import _tb_today_lib as terminal_bench_library\n"
        b"from aenv_ray import keep_processes\nfrom aenv_ray.processes import unconfined\n",
    ),
    (
        b"                env=_CLEAN_ENV,\n            )\n        finally:",
        b"                env=_CLEAN_ENV,\n            )\n"
        b"            keep_processes(self._process.pid)\n        finally:",
    ),
    (
        b"            self._process = subprocess.Popen(\n"
        b'                [sys.executable, "-I", "-B", str(PYTEST)],',
        b"            with unconfined():\n                self._process = subprocess.Popen(\n"
        b'                    [sys.executable, "-I", "-B", str(PYTEST)],',
    ),
    (
        b"                stdin=theirs.fileno(),\n                stdout=self._log,\n"
        b"                stderr=subprocess.STDOUT,\n"
        b'                env={**_CLEAN_ENV, "TB_SITE_PACKAGES": PYTEST_SITE or ""},\n'
        b"            )\n",
        b"                    stdin=theirs.fileno(),\n                    stdout=self._log,\n"
        b"                    stderr=subprocess.STDOUT,\n"
        b'                    env={**_CLEAN_ENV, "TB_SITE_PACKAGES": PYTEST_SITE or ""},\n'
        b"                )\n            keep_processes(self._process.pid)\n",
    ),
]


def _under_todays_runtime(source: bytes) -> bytes:
    """Today's ``_tb_runtime.py`` with :data:`_PORTS` applied (each must apply once)."""
    for old, new in _PORTS:
        if source.count(old) != 1:
            raise SystemExit(f"today's _tb_runtime.py does not have, once: {old.decode()!r}")
        source = source.replace(old, new)
    return source


def _today(base: str, into: Path) -> None:
    """Today's terminal-bench at ``base``, whole, in ``into``: its project (``config.json``,
    ``src/``), named ``terminal-bench-today``, and its library (the grading, the parser, the
    offline ``uv``/``apt-get``/``curl`` the tests run with, the demo tasks) as the package
    ``_tb_today_lib`` in the project's ``src/`` (every import of ``builtin_envs.terminal_bench``
    rewritten to it), so that today's path runs as it was, next to this checkout's."""
    listed = subprocess.run(
        ["git", "ls-tree", "-r", base, PROJECT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for line in listed:
        meta, name = line.split("\t", 1)
        mode = meta.split()[0]
        if "__pycache__" in name:
            continue
        data = subprocess.run(
            ["git", "show", f"{base}:{name}"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        relative = name[len(PROJECT) + 1 :]
        if relative == "config.json" or relative.startswith("src/"):
            target = into / relative
        else:
            target = into / "src" / LIBRARY_AS / relative
        if name.endswith(".py"):
            data = data.replace(b"builtin_envs.terminal_bench", LIBRARY_AS.encode())
        if relative == "src/_tb_runtime.py":
            data = _under_todays_runtime(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755 if mode == "100755" else 0o644)  # an instance's root is `nobody`
    config = json.loads((into / "config.json").read_text())
    config["name"] = "terminal-bench-today"
    (into / "config.json").write_text(json.dumps(config))
    for path in [into, *into.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)


async def _grade_once(env: object, task: str) -> float:
    """Seconds of one ``call_reward`` after the task's reference solution."""
    await env.call_function("tb_reset", {"task": task})  # type: ignore[attr-defined]
    await env.call_function("tb_run_solution", {})  # type: ignore[attr-defined]
    await env.call_tool(  # type: ignore[attr-defined]
        "run_command", {"command": "sleep 1000 > /dev/null 2>&1 &"}
    )
    started = time.perf_counter()
    result = await env.call_reward({})  # type: ignore[attr-defined]
    seconds = time.perf_counter() - started
    if result["reward"] != 1.0:
        raise SystemExit(f"{task}: the reference solution scored {result['reward']}")
    return seconds


async def main(rounds: int, tasks: list[str]) -> None:
    from aenv_ray import Environment
    from local_backend import LocalEngine

    engine = LocalEngine()
    try:
        async with (
            Environment("terminal-bench-today@1.0.0", engine=engine, timeout=120) as today,
            Environment("terminal-bench@1.0.0", engine=engine, timeout=120) as judged,
        ):
            times: dict[str, list[float]] = {"today": [], "judge": []}
            for task in tasks:  # warm-up: each instance's pytest imported
                await _grade_once(today, task)
                await _grade_once(judged, task)
            for round_ in range(rounds):
                for task in tasks:
                    order = [("today", today), ("judge", judged)]
                    for name, env in order if round_ % 2 == 0 else reversed(order):
                        times[name].append(await _grade_once(env, task))
    finally:
        engine.close()
    old = statistics.median(times["today"])
    new = statistics.median(times["judge"])
    print(f"gradings per path: {len(times['today'])} ({rounds} rounds of {', '.join(tasks)})")
    print(f"today's grading, median: {old * 1000:8.1f} ms")
    print(f"the judge's grading, median: {new * 1000:8.1f} ms")
    print(f"ratio judge/today: {new / old:.2f} (target <= 1.5)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", default="hello-world,word-count,fizzbuzz")
    parser.add_argument(
        "--base", default=BEFORE_THE_JUDGE, help="today's commit (default: before the judge)"
    )
    args = parser.parse_args()
    base = args.base
    with tempfile.TemporaryDirectory(prefix="tb-today-") as scratch:
        Path(scratch).chmod(0o755)
        project = Path(scratch) / "terminal-bench-today"
        _today(base, project)
        os.environ["AENV_ENV_PATH"] = scratch
        print(f"today: terminal-bench at {base[:12]}")
        asyncio.run(main(args.rounds, args.tasks.split(",")))
    sys.exit(0)
