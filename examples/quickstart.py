"""Quickstart: serve the built-in mini-terminal and run scripted episodes against it.

    scripts/run                                   # sets up .venv, then runs this
    .venv/bin/python examples/quickstart.py --episodes 8 --concurrency 4

Each episode gets its own instance on the embedded local engine (isolated in its own
namespaces when the machine allows it, forked from a pre-imported template), plays a scripted
agent that solves a small shell task through the ``execute_command`` tool, asks the
environment's reward whether the task was solved, and releases the instance. A progress bar
follows the tool calls; a summary table ends the run. The exit status is 1 when an episode
failed.

Later releases run the same job on Ray pools (``aenv rollout``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from aenv_ray import AEnvError, Environment, ToolResult  # noqa: E402

ENV = "mini-terminal@1.0.0"


def script(n: int) -> list[str]:
    """The scripted agent's commands for task ``n``: sum 1..n into answer.txt."""
    return [
        "pwd && ls -A",
        f"seq 1 {n} > numbers.txt && wc -l < numbers.txt",
        "awk '{ total += $1 } END { print total }' numbers.txt > answer.txt",
        "cat answer.txt",
    ]


@dataclass
class Episode:
    """What one episode did: its task, tool calls, reward and outcome."""

    index: int
    n: int
    calls: list[tuple[str, float, bool]] = field(default_factory=list)  # command, seconds, error
    reward: float | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.reward == 1.0


async def run_episode(index: int, progress: Progress, task_id: object) -> Episode:
    episode = Episode(index=index, n=10 * (index + 1))
    start = time.perf_counter()
    try:
        async with Environment(ENV) as env:
            for command in script(episode.n):
                began = time.perf_counter()
                result: ToolResult = await env.call_tool("execute_command", {"command": command})
                episode.calls.append((command, time.perf_counter() - began, result.is_error))
                progress.advance(task_id)  # type: ignore[arg-type]
                if result.is_error:
                    episode.error = f"tool error: {result.text}"
                    break
            expected = str(episode.n * (episode.n + 1) // 2)
            episode.reward = await env.call_reward({"path": "answer.txt", "expected": expected})
    except AEnvError as exc:
        episode.error = f"{type(exc).__name__}: {exc}"
    finally:
        episode.seconds = time.perf_counter() - start
    return episode


async def main(episodes: int, concurrency: int, console: Console) -> list[Episode]:
    steps = len(script(1))
    limit = asyncio.Semaphore(concurrency)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tool calls"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task_id = progress.add_task(f"{ENV} x{episodes}", total=episodes * steps)

        async def bounded(index: int) -> Episode:
            async with limit:
                return await run_episode(index, progress, task_id)

        return list(await asyncio.gather(*(bounded(i) for i in range(episodes))))


def summary(results: list[Episode], wall: float) -> Table:
    latencies = sorted(seconds for episode in results for _, seconds, _ in episode.calls)
    rewards = [episode.reward for episode in results if episode.reward is not None]
    table = Table(title=f"{ENV}: {len(results)} episodes in {wall:.1f} s")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("episodes ok", f"{sum(e.ok for e in results)} / {len(results)}")
    table.add_row("mean reward", f"{statistics.fmean(rewards):.2f}" if rewards else "-")
    table.add_row("tool calls", str(len(latencies)))
    if latencies:
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        table.add_row("tool call p50 / p99", f"{p50 * 1e3:.1f} ms / {p99 * 1e3:.1f} ms")
    episode_seconds = [e.seconds for e in results]
    table.add_row("episode mean (incl. start)", f"{statistics.fmean(episode_seconds):.2f} s")
    for episode in results:
        if not episode.ok:
            reason = episode.error or f"reward {episode.reward}"
            table.add_row(f"episode {episode.index} failed", reason[:80])
    return table


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8, help="episodes to run (default 8)")
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at once (default 4)")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.concurrency < 1:
        parser.error("--episodes and --concurrency must be at least 1")
    console = Console()
    started = time.perf_counter()
    results = asyncio.run(main(args.episodes, args.concurrency, console))
    console.print(summary(results, time.perf_counter() - started))
    return 0 if all(episode.ok for episode in results) else 1


if __name__ == "__main__":
    sys.exit(cli())
