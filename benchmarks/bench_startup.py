"""Start-up a user feels: ``import aenv_ray``, ``aenv --help``, ``aenv --version``.

    .venv/bin/python benchmarks/bench_startup.py            # 10 rounds, about 30 s
    .venv/bin/python benchmarks/bench_startup.py --runs 5   # quicker, noisier

Each command runs as a fresh process, in rounds that interleave it with the baseline, a bare
``python -c pass`` from the same interpreter, so that a noisy spell of the machine hits all of
them alike. Per command: CPU time (user + system of the child, from ``getrusage``) and wall
time, min and median over the runs, and the ratio to the baseline's (median to median, min to
min). Issue 24's targets: ``import aenv_ray`` at most 6x the baseline, ``aenv --help`` and
``aenv --version`` at most 8x.

``aenv --help`` is answered from the help the app rendered once before (``aenv_cli._fast``): the
benchmark keeps that cache in a temporary directory, renders it in a warm-up and also shows the
first, cold, rendering (the cache emptied before each run) and ``from aenv_ray import
Environment`` (the SDK's first use), for comparison; those two have no target.

Exit status 0 either way: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

AENV = str(Path(sys.executable).with_name("aenv"))
PY = sys.executable
SDK_FIRST_USE = "from aenv_ray import Environment"


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``argv`` as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10, help="rounds (runs of each command)")
    args = parser.parse_args()

    cache = Path(tempfile.mkdtemp(prefix="aenv-bench-startup-"))
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": "80"}
    empty_cache: Callable[[], None] = lambda: shutil.rmtree(cache / "aenv-ray", True)  # noqa: E731
    commands: list[tuple[str, list[str], float | None, Callable[[], None] | None]] = [
        ("python -c pass (baseline)", [PY, "-c", "pass"], None, None),
        ("import aenv_ray", [PY, "-c", "import aenv_ray"], 6.0, None),
        ("aenv --help", [AENV, "--help"], 8.0, None),
        ("aenv --version", [AENV, "--version"], 8.0, None),
        ("aenv --help, first (cold)", [AENV, "--help"], None, empty_cache),
        (
            "from aenv_ray import Environment",
            [PY, "-c", "from aenv_ray import Environment"],
            None,
            None,
        ),
    ]
    cpu: dict[str, list[float]] = {name: [] for name, *_ in commands}
    wall: dict[str, list[float]] = {name: [] for name, *_ in commands}
    try:
        for _, argv, _, before in commands:  # warm-up: the page cache, .pyc files, the help
            if before is not None:
                before()
            run_once(argv, env)
        run_once([AENV, "--help"], env)  # the cold row emptied it: the warm rows find it again
        for _ in range(args.runs):
            for name, argv, _, before in commands:
                if before is not None:
                    before()
                c, w = run_once(argv, env)
                if before is not None:
                    run_once([AENV, "--help"], env)  # kept again for the next round's warm row
                cpu[name].append(c)
                wall[name].append(w)
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    base = commands[0][0]
    print(
        f"start-up, {args.runs} runs of each, interleaved; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs"
    )
    header = (
        f"{'command':34} {'cpu min':>8} {'median':>8} {'wall min':>9} {'median':>8}"
        f"   {'x cpu (med/min)':>16} {'x wall (med)':>12}  target"
    )
    print(header)
    print("-" * len(header))
    for name, _, target, _ in commands:
        c, w = cpu[name], wall[name]
        row = (
            f"{name:34} {min(c) * 1e3:6.0f}ms {statistics.median(c) * 1e3:6.0f}ms "
            f"{min(w) * 1e3:7.0f}ms {statistics.median(w) * 1e3:6.0f}ms"
        )
        if name != base:
            x_cpu = statistics.median(c) / statistics.median(cpu[base])
            x_cpu_min = min(c) / min(cpu[base])
            x_wall = statistics.median(w) / statistics.median(wall[base])
            verdict = ""
            if target is not None:
                verdict = f"<= {target:.0f}x {'met' if x_cpu <= target else 'MISSED'}"
            row += f"   {x_cpu:7.2f}/{x_cpu_min:<7.2f}  {x_wall:11.2f}   {verdict}"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
