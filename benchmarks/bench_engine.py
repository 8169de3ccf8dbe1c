"""Local-engine benchmark: instance start, fork, creation rate, idle memory and CPU.

    .venv/bin/python benchmarks/bench_engine.py            # about a minute
    .venv/bin/python benchmarks/bench_engine.py --quick    # about 20 s

Measured in one run, next to baselines from the same run (the machine is noisy):

- **baseline**: a bare ``python -c pass`` from the same interpreter, and a cold subprocess start
  of the runtime (``python -m sandbox_runtime``) until its first answered call (wall time, and
  the runtime's own CPU time by then, median);
- **create -> first call**: ``LocalEngine.create`` of the echo environment, then one tool call
  over a raw aiohttp POST (the SDK's own set-up, health and info, is shown apart);
- **fork -> first call**: ``LocalEngine.fork`` of a running instance, then one call;
- **creations/s**: many creates in flight at once, each counted once its first call is answered;
- **idle instances**: PSS and USS per instance (every process of it) and CPU used while idle;
- **a definition's first instance**: create -> first call of an engine's first definition (its
  zygote exec'd cold, importing the runtime) against a second definition's (its zygote forked
  by the engine's launcher, ``local_backend/_launcher.py``), in wall time and in the zygote's
  own CPU time (which a loaded machine does not inflate as much).

Exit status 0 either way: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aenv_ray import Environment, InstanceSpec  # noqa: E402
from aenv_ray.testing import RuntimeProcess  # noqa: E402
from local_backend import LocalEngine  # noqa: E402

ECHO = HERE / "envs" / "echo"
TICKS = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)  # nearest rank
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1e3:7.1f} ms   p99 {pct(values, 0.99) * 1e3:7.1f} ms"


def bare_python(n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return times


async def first_call(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> None:
    body = {"name": "echo", "arguments": {"text": "hi"}}
    while True:
        try:
            async with http.post(f"{url}/aenv/v1/call", json=body, headers=headers) as response:
                assert response.status == 200, response.status
                await response.read()
                return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.001)


def cold_runtime(n: int) -> tuple[list[float], list[float]]:
    """Wall times of a cold runtime's start and first call, and the runtime's own CPU by then
    (an instance only called on the fast path: it never imports FastMCP)."""
    cpus: list[float] = []

    async def one() -> float:
        started = time.perf_counter()
        runtime = RuntimeProcess(ECHO)
        await asyncio.to_thread(runtime.start)
        async with aiohttp.ClientSession() as http:
            await first_call(http, runtime.url)
        elapsed = time.perf_counter() - started
        cpus.append(_cpu(runtime.pid))
        await asyncio.to_thread(runtime.stop)
        return elapsed

    return [asyncio.run(one()) for _ in range(n)], cpus


async def engine_runs(engine: LocalEngine, n: int, concurrent: int) -> dict[str, object]:
    spec = InstanceSpec("echo@1.0.0", project=str(ECHO))
    warm = await engine.create(spec)  # the template starts here, once
    results: dict[str, object] = {}
    async with aiohttp.ClientSession() as http:
        await first_call(http, warm.url or "", warm.headers)
        creates, deletes = [], []
        for _ in range(n):
            started = time.perf_counter()
            info = await engine.create(spec)
            await first_call(http, info.url or "", info.headers)
            creates.append(time.perf_counter() - started)
            began = time.perf_counter()
            await engine.delete(info.id)
            deletes.append(time.perf_counter() - began)
        results["create"], results["delete"] = creates, deletes

        sdk = []
        for _ in range(max(5, n // 4)):
            started = time.perf_counter()
            async with Environment.from_project(ECHO, engine=engine) as env:
                await env.call_tool("echo", {"text": "hi"})
            sdk.append(time.perf_counter() - started)
        results["sdk"] = sdk

        forks = []
        for _ in range(max(5, n // 2)):
            started = time.perf_counter()
            (child,) = await engine.fork(warm.id, 1)
            await first_call(http, child.url or "", child.headers)
            forks.append(time.perf_counter() - started)
            await engine.delete(child.id)
        results["fork"] = forks

        async def create_and_call() -> object:
            info = await engine.create(spec)
            await first_call(http, info.url or "", info.headers)
            return info

        started = time.perf_counter()
        infos = await asyncio.gather(*(create_and_call() for _ in range(concurrent)))
        results["rate"] = concurrent / (time.perf_counter() - started)  # answering, not forked
        results["idle"] = idle_usage(engine.owner, len(infos) + 1)
        await asyncio.gather(*(engine.delete(i.id) for i in infos))  # type: ignore[attr-defined]
    await engine.delete(warm.id)
    return results


def first_instances(rounds: int) -> dict[str, list[float]]:
    """Per round, a new engine: the first instance of ECHO (cold zygote), then of a copy of
    ECHO in another directory (another definition: a zygote from the launcher)."""
    import shutil
    import tempfile

    found: dict[str, list[float]] = {"cold": [], "warm": [], "cold_cpu": [], "warm_cpu": []}
    with tempfile.TemporaryDirectory(prefix="aenv-bench-") as scratch:
        other = Path(scratch) / "echo"
        shutil.copytree(ECHO, other)

        async def one(engine: LocalEngine, project: Path, key: Path, kind: str) -> None:
            started = time.perf_counter()
            info = await engine.create(InstanceSpec("echo@1.0.0", project=str(project)))
            assert info.url is not None
            async with aiohttp.ClientSession() as http:
                await first_call(http, info.url, info.headers)
            found[kind].append(time.perf_counter() - started)
            zygote = engine._zygotes[key]  # the engine's own record: a measurement
            found[f"{kind}_cpu"].append(_cpu(zygote.process.pid))

        for _ in range(rounds):
            engine = LocalEngine()
            try:
                asyncio.run(one(engine, ECHO, ECHO.resolve(), "cold"))
                asyncio.run(one(engine, other, other.resolve(), "warm"))
            finally:
                engine.close()
    return found


def _processes(owner: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if owner.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _memory(pid: int) -> tuple[int, int]:
    pss = uss = 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key == "Pss":
                pss = int(rest.split()[0])
            elif key in ("Private_Clean", "Private_Dirty"):
                uss += int(rest.split()[0])
    return pss * 1024, uss * 1024


def _cpu(pid: int) -> float:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    return 0.0


def idle_usage(owner: str, instances: int, seconds: float = 3.0) -> dict[str, float]:
    pids = _processes(owner)
    zygotes = [p for p in pids if _is_zygote(p)]
    members = [p for p in pids if p not in zygotes]
    memory = [_memory(p) for p in members]
    before = sum(_cpu(p) for p in members)
    time.sleep(seconds)
    after = sum(_cpu(p) for p in members)
    return {
        "instances": instances,
        "pss_mb": sum(m[0] for m in memory) / instances / 2**20,
        "uss_mb": sum(m[1] for m in memory) / instances / 2**20,
        "cpu_percent": (after - before) / seconds * 100,
    }


def _is_zygote(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("PPid:")[1].split()[0] == str(
            os.getpid()
        )
    except (OSError, IndexError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 10 if args.quick else 40
    concurrent = 50 if args.quick else 200

    bare = bare_python(n)
    cold, cold_cpus = cold_runtime(2 if args.quick else 4)
    firsts = first_instances(2 if args.quick else 5)
    engine = LocalEngine()
    try:
        results = asyncio.run(engine_runs(engine, n, concurrent))
    finally:
        engine.close()
    creates = results["create"]
    assert isinstance(creates, list)
    floor = pct(bare, 0.5)
    print(
        f"local engine ({'isolated' if engine.is_isolated else 'NOT isolated'}), "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(f"  python -c pass           {ms(bare)}")
    print(f"  cold runtime start+call  {ms(cold)}; its CPU {statistics.median(cold_cpus):.2f} s")
    print(f"  create -> first call     {ms(creates)}")
    print(f"  SDK open+call+release    {ms(results['sdk'])}")  # type: ignore[arg-type]
    print(f"  fork -> first call       {ms(results['fork'])}")  # type: ignore[arg-type]
    print(f"  delete                   {ms(results['delete'])}")  # type: ignore[arg-type]
    print(f"  creations/s ({concurrent} at once)  {results['rate']:.0f}")
    idle = results["idle"]
    assert isinstance(idle, dict)
    print(
        f"  idle instances ({idle['instances']}): PSS {idle['pss_mb']:.1f} MB, "
        f"USS {idle['uss_mb']:.1f} MB each; CPU {idle['cpu_percent']:.2f}% of a core in all"
    )
    ratio = pct(creates, 0.5) / floor
    print("ratios (targets from the local-engine issue)")
    print(
        f"  create->first call p50 / python -c pass p50 = {ratio:.2f}x (target <= 2x): "
        f"{'met' if ratio <= 2 else 'missed'}"
    )
    print(
        f"  create->first call vs cold runtime start: {pct(cold, 0.5) / pct(creates, 0.5):.0f}x "
        "faster"
    )
    rate = results["rate"]
    assert isinstance(rate, float)
    print(f"  creations/s {rate:.0f} (target >= 100): {'met' if rate >= 100 else 'missed'}")
    per_gib = 24 * 1024 / idle["pss_mb"]
    print(
        f"  idle instances in 24 GiB by PSS: {per_gib:.0f} (target >= 1000): "
        f"{'met' if per_gib >= 1000 else 'missed'}"
    )
    print(f"  median of {len(creates)} creates: {statistics.median(creates) * 1e3:.1f} ms")
    print("a definition's first instance (create -> first call; the zygote's own CPU)")
    print(f"  cold zygote (the engine's first)   {ms(firsts['cold'])}")
    print(f"  launched zygote (a second one)     {ms(firsts['warm'])}")
    cold_cpu = statistics.median(firsts["cold_cpu"])
    warm_cpu = statistics.median(firsts["warm_cpu"])
    print(
        f"  p50 ratio {pct(firsts['cold'], 0.5) / pct(firsts['warm'], 0.5):.1f}x faster; "
        f"zygote CPU {cold_cpu:.2f} s cold, {warm_cpu:.2f} s launched"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
