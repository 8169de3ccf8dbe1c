"""swe grading cost: strict grading (the judge's fresh checkout) against SWE-bench's in-place
grading (``strict=False``, the path every reward took before), in one run on one instance.

    .venv/bin/python benchmarks/bench_swe_grading.py              # both demo rows, 5 rounds
    .venv/bin/python benchmarks/bench_swe_grading.py --rounds 10

Each round, for each demo row and each mode in turn: ``swe_reset``, the gold patch applied
through the tools (not timed), then the reward call, timed from the client (the reward's
``seconds`` too). Medians per row and mode, and the ratio strict / in-place (target <= 1.5).
A measurement, not a test: exit 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aenv_ray import Environment  # noqa: E402
from builtin_envs.demos import swe as demo  # noqa: E402


async def main(rounds: int) -> None:
    rows = [task["id"] for task in demo.TASKS]
    times: dict[tuple[str, bool], list[float]] = {(r, s): [] for r in rows for s in (False, True)}
    inside: dict[tuple[str, bool], list[float]] = {key: [] for key in times}
    async with Environment("swe@1.0.0", ttl="30m", timeout=600) as env:
        for row in rows:  # warm up: the bundles' mirrors, Python's caches
            await env.call_function("swe_reset", {"instance_id": row})
            await env.call_reward({"strict": True})
        for _ in range(rounds):
            for row in rows:
                for strict in (False, True):
                    await env.call_function("swe_reset", {"instance_id": row})
                    await demo.policy({"id": row}, env)
                    started = time.perf_counter()
                    graded = await env.call_reward({"strict": strict})
                    times[(row, strict)].append(time.perf_counter() - started)
                    inside[(row, strict)].append(float(graded["seconds"]))
                    assert graded["reward"] == 1.0, graded["test_log"]
    print(f"{'row':18} {'in place (s)':>13} {'strict (s)':>11} {'ratio':>6}   (median of {rounds})")
    for row in rows:
        before = statistics.median(times[(row, False)])
        after = statistics.median(times[(row, True)])
        print(f"{row:18} {before:13.3f} {after:11.3f} {after / before:6.2f}")
        before_in = statistics.median(inside[(row, False)])
        after_in = statistics.median(inside[(row, True)])
        ratio = after_in / before_in
        print(f"{'  (in the reward)':18} {before_in:13.3f} {after_in:11.3f} {ratio:6.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args().rounds))
