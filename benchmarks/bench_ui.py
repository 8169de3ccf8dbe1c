"""The Environment Center on a large run: does a run of 100,000 episodes open in under a second?

    .venv/bin/python benchmarks/bench_ui.py                  # 100,000 episodes (~1-2 min)
    .venv/bin/python benchmarks/bench_ui.py --episodes 20000 # quicker

Writes a run directory of N records shaped as ``aenv rollout`` writes them (a system prompt, a
user prompt, two tool calls and their results, a final answer; ~3 kB a record: the JSONL is
N x 3 kB), over 200 tasks and three tools, with a tenth failed. Then measures, each with a
fresh :class:`~aenv_ui.index.RunIndex` as a new ``aenv ui`` would have:

- **first index**: reading the whole file once (what ``aenv ui`` does the first time it sees a
  run; a live run is indexed as it grows, so this cost is spread over the run);
- **open**: what the browser asks when the run is opened, on an index already built: the run's
  summary, the first page of episodes, the tools and kinds (``GET /api/runs/RUN``, a page); the
  first time the aggregates are computed, then kept in the index until the run grows (**open
  again**);
- **filtered page**: a page of a task's failed episodes, sorted by reward, deep in the list;
- **rewards**: the Rewards page's aggregates (histogram, per-tool and per-turn quantiles,
  per-task table);
- **episode**: one whole record by its id (a seek);
- **append**: indexing 100 records appended to the live file.

Wall time and CPU time (``time.process_time``) are printed; the goal (open < 1 s) marked met or
missed. Exit status 0 either way: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from aenv_ui.index import EpisodeQuery, RunIndex  # noqa: E402

TOOLS = ("bench@1.0.0/execute_command", "bench@1.0.0/read_file", "bench@1.0.0/write_file")


def record(n: int, rng: random.Random) -> dict[str, Any]:
    task = f"task-{n % 200:03d}"
    failed = rng.random() < 0.1
    now = 1.75e9 + n * 0.05
    calls = [
        {
            "id": f"call-{k}",
            "type": "function",
            "function": {
                "name": TOOLS[(n + k) % 3],
                "arguments": json.dumps({"command": "x" * 80}),
            },
        }
        for k in range(2)
    ]
    return {
        "episode_id": f"{n:06d}-{task}",
        "task_id": task,
        "env": "bench",
        "outcome": "infrastructure_error" if failed else "ok",
        "reason": "InstanceBrokenError: the instance died" if failed else None,
        "truncated": False,
        "reward": None if failed else rng.choice([0.0, 0.5, 1.0]),
        "answer": "done",
        "steps": [
            {
                "tool": TOOLS[(n + k) % 3],
                "arguments_json": calls[k]["function"]["arguments"],
                "text": "y" * 400,
                "is_error": rng.random() < 0.05,
                "started": now + k,
                "seconds": rng.random() / 10,
                "structured_json": None,
                "tool_call_id": f"call-{k}",
            }
            for k in range(2)
        ],
        "attempts": 1,
        "seconds": rng.random() * 20,
        "task": {"id": task, "prompt": "p" * 200},
        "retried": [],
        "messages": [
            {"role": "system", "content": "s" * 300},
            {"role": "user", "content": "u" * 300},
            {"role": "assistant", "content": None, "tool_calls": calls},
            *(
                {"role": "tool", "content": "y" * 400, "tool_call_id": f"call-{k}"}
                for k in range(2)
            ),
            {"role": "assistant", "content": "done"},
        ],
        "turns": [
            {
                "message_index": i,
                "started": now + i,
                "seconds": rng.random(),
                "usage": {"prompt_tokens": 500, "completion_tokens": 50, "total_tokens": 550},
            }
            for i in (2, 5)
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
        "format": 4,
    }


def timed(what: str, work: Callable[[], Any], rows: list[tuple[str, float, float]]) -> Any:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    rows.append((what, time.perf_counter() - wall, time.process_time() - cpu))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        jsonl = run / "trajectories.jsonl"
        with jsonl.open("w") as file:
            for n in range(args.episodes):
                file.write(json.dumps(record(n, rng)) + "\n")
        size = jsonl.stat().st_size
        rows: list[tuple[str, float, float]] = []
        index_dir = Path(tmp) / "index"
        with RunIndex.open(run, index_dir) as index:
            timed("first index (whole file)", index.refresh, rows)

        def open_run() -> None:
            with RunIndex.open(run, index_dir) as index:
                index.refresh()
                index.summary()
                index.tools()
                index.kinds()
                index.tasks()
                index.episodes(limit=50)

        timed("open: summary + tools + tasks + page 1", open_run, rows)
        timed("open again (aggregates kept in the index)", open_run, rows)
        with RunIndex.open(run, index_dir) as index:
            timed(
                "filtered page (task, failed, by reward, offset 40)",
                lambda: index.episodes(
                    EpisodeQuery(task="task-007", kind="failed"), offset=40, sort="-reward"
                ),
                rows,
            )
            timed("page 1,000 of all (offset 49,950)", lambda: index.episodes(offset=49_950), rows)
            timed("rewards page (whole run)", index.rewards, rows)
            timed("rewards page (one task)", lambda: index.rewards(task="task-042"), rows)
            last = f"{args.episodes - 1:06d}-task-{(args.episodes - 1) % 200:03d}"
            timed("one episode by id", lambda: index.episode(last), rows)
            with jsonl.open("a") as file:
                for n in range(args.episodes, args.episodes + 100):
                    file.write(json.dumps(record(n, rng)) + "\n")
            timed("append: index 100 new records", index.refresh, rows)
    print(f"{args.episodes:,} episodes, trajectories.jsonl {size / 1e6:.0f} MB")
    print(f"{'what':<52} {'wall s':>8} {'cpu s':>8}")
    for what, wall, cpu in rows:
        print(f"{what:<52} {wall:>8.3f} {cpu:>8.3f}")
    opened = rows[1][1]
    print(f"open under a second: {'met' if opened < 1.0 else 'missed'} ({opened:.3f} s)")


if __name__ == "__main__":
    main()
