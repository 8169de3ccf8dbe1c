"""Rollout benchmark: tool calls through RolloutPool futures vs a no-op Ray actor call vs the SDK.

    .venv/bin/python benchmarks/bench_rollout.py            # about 2 minutes
    .venv/bin/python benchmarks/bench_rollout.py --quick    # about 1 minute

In one run, on a local Ray on loopback (``rollout.init_local``), then on a simulated two-node
cluster (``ray.cluster_utils.Cluster``, both nodes on this machine):

- **floor**: a no-op async actor method (``num_cpus=0``) called with the same arguments as a
  tool call, 16/32/64 in flight: what one Ray actor call costs here;
- **SDK direct**: ``Environment.call_tool`` on instances of the same local engine, from one
  asyncio loop in the driver, the same number in flight (no Ray at all);
- **pool futures**: ``lease.call_tool(...)`` ObjectRefs over the pool's leases, 16/32/64 in
  flight (``ray.wait`` for one, submit the next);
- **batched stepping**: ``pool.step_many`` of 512 calls over the leases, all results taken;
- **acquire**: ``pool.acquire()`` latency from the driver while instances are free (back to
  back, no instance being created meanwhile).

The tool is ``echo`` of ``benchmarks/envs/echo`` (a sync tool: the runtime's usual path). Ratios
against the floor of the same run are printed and marked met or missed; exit status is 0 either
way: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

import rollout  # noqa: E402
from aenv_ray import Environment  # noqa: E402
from rollout import RolloutPool  # noqa: E402

ECHO_ENV = HERE / "envs" / "echo"
ARGS = {"text": "hello"}
TOOL = "echo"
T = 120.0
TARGET_FUTURES_RATIO = 0.6  # pool futures calls/s >= 0.6x the no-op floor
TARGET_BATCHED = 5000.0  # tool calls/s through step_many


@ray.remote(num_cpus=0)
class Noop:
    """The floor: an async actor method that does nothing."""

    async def call_tool(self, *args: Any) -> None:
        return None


def closed_loop(submit: Callable[[int], ray.ObjectRef], total: int, inflight: int) -> float:
    """Keep ``inflight`` refs outstanding until ``total`` resolved; calls/s."""
    started = time.perf_counter()
    pending = [submit(i) for i in range(inflight)]
    done, issued = 0, inflight
    while done < total:
        ready, pending = ray.wait(pending, num_returns=1, timeout=T)
        ray.get(ready, timeout=T)
        done += len(ready)
        for _ in ready:
            if issued < total:
                pending.append(submit(issued))
                issued += 1
    return total / (time.perf_counter() - started)


async def sdk_direct(total: int, inflight: int, instances: int) -> float:
    """calls/s of Environment.call_tool on local-engine instances, no Ray."""
    envs = [Environment.from_project(ECHO_ENV) for _ in range(instances)]
    await asyncio.gather(*(e.initialize() for e in envs))
    counter = iter(range(total))

    async def caller(k: int) -> None:
        for i in counter:
            await envs[(k + i) % instances].call_tool(TOOL, ARGS)

    try:
        for e in envs:
            await e.call_tool(TOOL, ARGS)  # warm
        started = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(inflight)))
        return total / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(e.release() for e in envs))


def batched(pool: RolloutPool, leases: list[Any], batch: int, seconds: float) -> float:
    steps = [(leases[i % len(leases)], TOOL, ARGS) for i in range(batch)]
    pool.step_many(steps).results(timeout=T)  # warm
    started, calls = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        calls += len(pool.step_many(steps).results(timeout=T))
    return calls / (time.perf_counter() - started)


def acquire_latency(pool: RolloutPool, samples: int) -> list[float]:
    """``acquire()`` from a warm pool, in ms: rounds of back-to-back acquires of all but one
    instance (so one is always free), then every lease released and the pool warm again."""
    out: list[float] = []
    while len(out) < samples:
        pool.wait_ready(timeout=T)
        leases = []
        for _ in range(pool.size - 1):
            started = time.perf_counter()
            leases.append(pool.acquire(timeout=T))
            out.append((time.perf_counter() - started) * 1000)
        for lease in leases:
            lease.release()
    return out[:samples]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.5) - 1))]


@contextlib.contextmanager
def ray_on(nodes: int) -> Iterator[None]:
    cluster = None
    if nodes == 1:
        rollout.init_local(num_cpus=2)
    else:
        from ray.cluster_utils import Cluster

        rollout._ray.loopback_only()
        node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
        cluster = Cluster(initialize_head=True, head_node_args=node)
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        rollout.init_local(address=cluster.address)
    try:
        yield
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def run(nodes: int, args: argparse.Namespace, rows: list[tuple[str, ...]], figures: dict) -> None:
    with ray_on(nodes):
        noop = Noop.remote()
        ray.get(noop.call_tool.remote(), timeout=T)
        with RolloutPool(project=ECHO_ENV, size=args.size, creation_rate=200.0, prefetch=0) as pool:
            leases = [pool.acquire(timeout=T) for _ in range(args.leases)]
            for lease in leases:
                rollout.get(lease.call_tool(TOOL, ARGS), timeout=T)
            for inflight in (16, 32, 64):
                floor = closed_loop(
                    lambda i: noop.call_tool.remote("lease", TOOL, ARGS, None), args.calls, inflight
                )
                futures = closed_loop(
                    lambda i: leases[i % len(leases)].call_tool(TOOL, ARGS), args.calls, inflight
                )
                figures[(nodes, "floor", inflight)] = floor
                figures[(nodes, "futures", inflight)] = futures
                rows.append(
                    (str(nodes), "no-op actor call (floor)", str(inflight), f"{floor:,.0f}")
                )
                rows.append((str(nodes), "pool futures", str(inflight), f"{futures:,.0f}"))
            rate = batched(pool, leases, 512, args.seconds)
            figures[(nodes, "batched")] = rate
            rows.append((str(nodes), "batched step_many (512/call)", "512", f"{rate:,.0f}"))
            for lease in leases:
                lease.release()
            pool.wait_ready(timeout=T)
            lat = acquire_latency(pool, args.acquires)
            figures[(nodes, "acquire")] = (pct(lat, 0.5), pct(lat, 0.99))
        with RolloutPool(
            project=ECHO_ENV, size=args.size, creation_rate=200.0, prefetch=args.prefetch
        ) as pool:
            lat = acquire_latency(pool, args.acquires)
            figures[(nodes, "acquire-prefetch")] = (pct(lat, 0.5), pct(lat, 0.99))
        if nodes == 1:
            for inflight in (16, 32, 64):
                sdk = asyncio.run(sdk_direct(args.calls, inflight, args.leases))
                figures[(1, "sdk", inflight)] = sdk
                rows.append(("1", "SDK direct (no Ray)", str(inflight), f"{sdk:,.0f}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, shorter runs")
    parser.add_argument("--calls", type=int, default=3000, help="calls per closed-loop figure")
    parser.add_argument("--seconds", type=float, default=5.0, help="per batched figure")
    parser.add_argument("--size", type=int, default=16, help="pool size")
    parser.add_argument("--leases", type=int, default=8, help="leases the calls go to")
    parser.add_argument("--acquires", type=int, default=200)
    parser.add_argument(
        "--prefetch",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="of the second acquire figure (the first asks an actor every time)",
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.seconds, args.acquires = 1000, 2.0, 100
    rows: list[tuple[str, ...]] = []
    figures: dict[Any, Any] = {}
    for nodes in (1, 2):
        run(nodes, args, rows, figures)
    print(
        f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        f", Ray {ray.__version__}; echo tool, {args.leases} leases of a pool of {args.size}\n"
    )
    print("| nodes | scenario | in flight | calls/s |\n|---:|---|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\n| measurement | 1 node | 2 nodes | target | |\n|---|---:|---:|---:|---|")
    for inflight in (16, 32, 64):
        ratios = [
            figures[(n, "futures", inflight)] / figures[(n, "floor", inflight)] for n in (1, 2)
        ]
        met = "met" if min(ratios) >= TARGET_FUTURES_RATIO else "missed"
        print(
            f"| pool futures / no-op floor, {inflight} in flight | {ratios[0]:.2f}x | "
            f"{ratios[1]:.2f}x | >= {TARGET_FUTURES_RATIO}x | {met} |"
        )
    b1, b2 = figures[(1, "batched")], figures[(2, "batched")]
    met = "met" if max(b1, b2) >= TARGET_BATCHED else "missed"
    print(f"| batched calls/s | {b1:,.0f} | {b2:,.0f} | >= {TARGET_BATCHED:,.0f} | {met} |")
    acquires = (("acquire", "acquire, prefetch 0"), ("acquire-prefetch", "acquire, prefetch"))
    for key, label in acquires:
        for n in (1, 2):
            p50, p99 = figures[(n, key)]
            what = f"{label} {args.prefetch}" if key != "acquire" else label
            print(
                f"| {what} p50 / p99, {n} node(s) | {p50:.2f} ms | {p99:.2f} ms | p50 <= 1 ms | "
                f"{'met' if p50 <= 1.0 else 'missed'} |"
            )
    for inflight in (16, 32, 64):
        ratio = figures[(1, "futures", inflight)] / figures[(1, "sdk", inflight)]
        print(f"| pool futures / SDK direct, {inflight} in flight | {ratio:.2f}x | | | info |")


if __name__ == "__main__":
    main()
