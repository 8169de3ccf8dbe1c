"""A judge reward against the same reward without the judge, in one run (issue 23, point 5).

    .venv/bin/python benchmarks/bench_reward_judge.py                  # 20 calls, 50 files
    .venv/bin/python benchmarks/bench_reward_judge.py --calls 40 --files 500

One project, served twice on the same local engine: ``bench-plain`` (its reward in the runtime)
and ``bench-judge`` (``"reward": {"judge": true}``). The reward reads ``answer.txt`` from a
workspace of ``--files`` small files (4 KiB each) and compares it, so what is measured is the
judge's own cost: ending the agent's processes (one ``sleep`` left running before each call),
forking the judge from its seed, copying the workspace, the fresh context. The two alternate call
by call, so the machine's load falls on both. Prints the medians (ms) and the ratio judge/plain.
A measurement, not a test: exit 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from aenv_ray import Environment
from aenv_ray.settings import Settings
from local_backend import LocalEngine

MODULE = '''
import subprocess
from pathlib import Path

from aenv_ray import keep_processes, register_reward, register_tool


@register_tool
def prepare(files: int) -> int:
    """Write the answer and ``files`` files of 4 KiB."""
    Path("answer.txt").write_text("42")
    for index in range(files):
        Path(f"f{index:05d}.txt").write_bytes(b"x" * 4096)
    return files


@register_tool
def leave_one() -> int:
    """Leave a process running (the judge ends it; a plain reward does not)."""
    process = subprocess.Popen(["sleep", "1000"])
    keep_processes(process.pid)
    return process.pid


@register_reward
def grade(expected: str) -> float:
    return float(Path("answer.txt").read_text() == expected)
'''


def _projects(root: Path) -> None:
    root.chmod(0o755)
    for name, judge in (("bench-plain", False), ("bench-judge", True)):
        project = root / f"{name}-1.0.0"
        (project / "src").mkdir(parents=True)
        config: dict[str, object] = {"name": name}
        if judge:
            config["reward"] = {"judge": True}
        (project / "config.json").write_text(json.dumps(config))
        (project / "src" / "bench_task.py").write_text(MODULE)
    for path in [root, *root.rglob("*")]:  # an instance's root is `nobody` on the host
        path.chmod(0o755 if path.is_dir() else 0o644)


async def _measure(calls: int, files: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
        root = Path(tmp)
        _projects(root)
        settings = Settings(dummy_instance_ip=None, system_url=None, env_path=str(root))
        engine = LocalEngine()
        times: dict[str, list[float]] = {"plain": [], "judge": []}
        try:
            async with (
                Environment("bench-plain@1.0.0", engine=engine, settings=settings) as plain,
                Environment("bench-judge@1.0.0", engine=engine, settings=settings) as judged,
            ):
                envs = {"plain": plain, "judge": judged}
                for env in envs.values():
                    await env.call_tool("prepare", {"files": files})
                    await env.call_reward({"expected": "42"})  # warm
                for _ in range(calls):
                    for name, env in envs.items():
                        await env.call_tool("leave_one", {})
                        started = time.perf_counter()
                        value = await env.call_reward({"expected": "42"})
                        times[name].append(time.perf_counter() - started)
                        assert value == 1.0, value
        finally:
            engine.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--files", type=int, default=50)
    args = parser.parse_args()
    times = asyncio.run(_measure(args.calls, args.files))
    plain = statistics.median(times["plain"]) * 1e3
    judge = statistics.median(times["judge"]) * 1e3
    print(f"workspace: {args.files} files of 4 KiB; {args.calls} calls each (medians)")
    print(f"plain reward  {plain:8.2f} ms")
    print(f"judge reward  {judge:8.2f} ms")
    print(f"ratio judge/plain: {judge / plain:.1f}  (+{judge - plain:.1f} ms a call)")


if __name__ == "__main__":
    main()
