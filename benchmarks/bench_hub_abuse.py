"""The hub under a slowloris attack: its memory, descriptors and a keyed call's latency.

    .venv/bin/python benchmarks/bench_hub_abuse.py                     # 16,000 connections
    .venv/bin/python benchmarks/bench_hub_abuse.py --connections 4000  # quicker
    .venv/bin/python benchmarks/bench_hub_abuse.py --allocator pymalloc  # Python's allocator

A real ``aenv serve`` (in-process engine, its default defences) on loopback; the attacker
opens ``--connections`` connections from as many loopback addresses as it takes to stay under
the hub's per-client cap, each sending an unfinished request line and headers, and holds them.
Measured: the hub's RSS (and its ratio to the RSS before) and open descriptors before (after a
warm-up call), at the attack's height, and once the header timeout has closed the attack's
connections and the hub has trimmed its heap; the latency of keyed
calls from another address during the attack. This process needs a descriptor per connection:
its soft open files limit is raised to the hard one. Exit status is 0 either way: this is a
measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from envhub.allocator import ALLOCATOR_ENV  # noqa: E402
from envhub.connections import TRIM_DELAY  # noqa: E402
from tests._hub import HubProcess, new_key  # noqa: E402
from tests.test_hub_abuse import PARTIAL, keyed, open_fds, rss_mib  # noqa: E402

PER_ADDRESS = 200  # under the default --client-connections (256)


async def attack(port: int, count: int) -> list[asyncio.StreamWriter]:
    """``count`` slow connections from 127.2.x.y, ``PER_ADDRESS`` from each address."""

    async def one(index: int) -> asyncio.StreamWriter | None:
        host = index // PER_ADDRESS
        source = f"127.2.{host // 250}.{1 + host % 250}"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            writer.write(PARTIAL)
            await writer.drain()
        except OSError:
            return None
        return writer

    writers: list[asyncio.StreamWriter] = []
    for start in range(0, count, 500):  # in waves: the listening backlog is finite
        batch = await asyncio.gather(*(one(i) for i in range(start, min(count, start + 500))))
        writers += [w for w in batch if w is not None]
    return writers


async def main(count: int, calls: int, rounds: int, allocator: str | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = {ALLOCATOR_ENV: allocator} if allocator else {}
    with HubProcess(Path(tempfile.mkdtemp(prefix="bench-abuse-")), env=env) as hub:
        assert hub.proc is not None
        pid = hub.proc.pid
        key = new_key("bench", hub.store)
        for _ in range(20):  # warm: imports, the store, the routes
            await keyed(hub.url, key, "127.0.0.2")
        before = rss_mib(pid), open_fds(pid)
        rows = [("before", *before)]
        latencies: list[float] = []
        failed = opened = 0
        for round_ in range(1, rounds + 1):
            writers = await attack(hub.port, count)
            opened += len(writers)
            rows.append((f"attack {round_}", rss_mib(pid), open_fds(pid)))
            for _ in range(calls):
                begun = time.monotonic()
                try:
                    status, _ = await keyed(hub.url, key, "127.0.0.2")
                    failed += status != 200
                except (OSError, TimeoutError):
                    failed += 1
                latencies.append(time.monotonic() - begun)
            # the header timeout (10 s) closes the attack's connections; the heap is trimmed
            for _ in range(120):
                if open_fds(pid) <= before[1] + 4:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(TRIM_DELAY + 1)  # the gate trims the heap TRIM_DELAY later
            rows.append((f"after {round_}", rss_mib(pid), open_fds(pid)))
            for writer in writers:
                writer.close()
    shown = allocator or "malloc (aenv serve's own choice)"
    print(f"attack: {rounds} x {count} slow connections ({opened} opened); allocator {shown}")
    print(f"{'':>14} {'RSS MiB':>8} {'/before':>8} {'fds':>6}")
    for label, rss, fds in rows:
        print(f"{label:>14} {rss:8.1f} {rss / before[0]:8.2f} {fds:6d}")
    ordered = sorted(latencies)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    print(
        f"keyed calls during the attacks: {len(latencies)}, {failed} failed; latency median "
        f"{statistics.median(latencies) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=16000)
    parser.add_argument("--calls", type=int, default=50, help="keyed calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--allocator",
        help="PYTHONMALLOC for the hub (pymalloc: Python's own, what the hub ran with before)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.environ.pop(ALLOCATOR_ENV, None)
    asyncio.run(main(args.connections, args.calls, args.rounds, args.allocator))
