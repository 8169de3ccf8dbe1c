"""Call-path benchmark: SDK ``call_tool`` vs the floor (raw aiohttp -> starlette) vs standard MCP.

    .venv/bin/python benchmarks/bench_calls.py            # about a minute
    .venv/bin/python benchmarks/bench_calls.py --quick    # about 20 s

Every server runs in its own child process on loopback, so its CPU time is read from
``/proc/PID/stat`` (utime + stime, all threads) before and after each measurement:

- **floor**: a trivial starlette JSON echo endpoint under uvicorn (httptools + uvloop, access log
  off: the runtime's settings), called with a raw aiohttp POST;
- **runtime**: ``python -m sandbox_runtime benchmarks/envs/echo`` (tools ``echo``, sync, and
  ``async_echo``), called through the SDK (``Environment.attach(url).call_tool``), through a raw
  aiohttp POST to its fast path (to split client from server cost), and through standard MCP with
  the official ``fastmcp.Client`` (``call_tool_mcp``), both as one client (one session) shared by
  all callers and as one client per caller; the MCP target is checked against the faster of the two;
- **httpx**: the same fast-path POST through one pooled ``httpx.AsyncClient``, the client the
  SDK's control plane (the hub) uses: its client CPU per call against the SDK's is why calls to
  instances go over :mod:`aenv_ray._wire` instead (docs/performance.md).

Each scenario runs with 1 and 16 concurrent callers, for a fixed number of calls and under a time
cap, after a warm-up. Scenarios are interleaved over ``--rounds`` rounds so that a noisy spell on
the machine hits them all alike; latencies are pooled over the rounds. The table is followed by
ratios against the floor measured in the same run, each marked met or missed. Exit status is 0
either way: this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from aenv_ray import Environment  # noqa: E402
from aenv_ray.testing import RuntimeProcess, free_port  # noqa: E402

ECHO_ENV = HERE / "envs" / "echo"
FLOOR_SERVER = HERE / "_floor_server.py"
TICKS = os.sysconf("SC_CLK_TCK")
CPUS = os.cpu_count() or 1
ARGS = {"text": "hello"}
TOOL_TIMEOUT = 30.0

# targets from the issue (foundation: call path)
TARGET_P50_RATIO = 2.0  # SDK p50 <= 2x the floor's p50 (1 caller)
TARGET_SERVER_CPU_MS = 0.3  # runtime CPU per SDK call
TARGET_MCP_SPEEDUP = 10.0  # SDK calls/s >= 10x standard MCP calls/s, 16 callers

Call = Callable[[], Awaitable[Any]]


# -- processes -------------------------------------------------------------------------------
def _stat_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime, in clock ticks


def _schedstat_cpu(pid: int) -> float:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        path = f"/proc/{pid}/task/{task}/schedstat"
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:  # may have exited
            total += int(f.read().split()[0])  # ns on the CPU
    return total / 1e9


def box_busy() -> float:
    """CPU seconds the whole machine has been busy (all CPUs, all processes), from /proc/stat."""
    with open("/proc/stat", "rb") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICKS  # user..steal; guest time is already in user


class CpuMeter:
    """CPU seconds (user + system, all threads) a process uses between two readings.

    ``/proc/PID/stat`` counts in clock ticks (10 ms), too coarse for a fraction of a second of
    work; the per-thread ``schedstat`` counters are in nanoseconds but lose the time of a thread
    that exits in between. Use the precise one unless the coarse one disagrees by over 2 ticks.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fine = self._coarse = 0.0

    def start(self) -> None:
        self._coarse, self._fine = _stat_cpu(self.pid), _schedstat_cpu(self.pid)

    def stop(self) -> float:
        fine = _schedstat_cpu(self.pid) - self._fine
        coarse = _stat_cpu(self.pid) - self._coarse
        return fine if abs(fine - coarse) <= 2 / TICKS else coarse


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


@contextlib.contextmanager
def floor_server() -> Iterator[tuple[str, int]]:
    """The starlette floor in a child process: yields (base URL, pid)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(FLOOR_SERVER), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url + "/health", process)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- measurement -----------------------------------------------------------------------------
@dataclass
class Scenario:
    """One client path at one concurrency; figures accumulate over the rounds."""

    key: str
    label: str
    server: str  # "floor" or "runtime"
    callers: int
    calls: int  # total over all rounds
    open_callers: Callable[[Clients, int], Awaitable[list[Call]]]
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    box_cpu: float = 0.0  # all processes on the machine
    capped: bool = False

    @property
    def done(self) -> int:
        return len(self.latencies)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))  # nearest rank
        return ordered[index] * 1e3

    def row(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenario": self.label,
            "callers": self.callers,
            "calls": self.done,
            "p50_ms": self.percentile(0.50),
            "p99_ms": self.percentile(0.99),
            "calls_per_s": self.done / self.elapsed,
            "server_cpu_ms_per_call": self.server_cpu / self.done * 1e3,
            "client_cpu_ms_per_call": self.client_cpu / self.done * 1e3,
            "others_pct": max(0.0, self.box_cpu - self.server_cpu - self.client_cpu)
            / (self.elapsed * CPUS)
            * 100,
            "capped": self.capped,
        }


async def drive(callers: list[Call], calls: int, cap: float, out: list[float]) -> bool:
    """Make ``calls`` calls spread over the concurrent ``callers``; False if ``cap`` s ran out."""
    claimed = 0
    perf = time.perf_counter
    deadline = perf() + cap

    async def caller(call: Call) -> None:
        nonlocal claimed
        while claimed < calls and perf() < deadline:
            claimed += 1
            started = perf()
            await call()
            out.append(perf() - started)

    await asyncio.gather(*(caller(call) for call in callers))
    return len(out) >= calls


async def measure_round(
    scenario: Scenario, runtime: RuntimeProcess, floor: tuple[str, int], calls: int, cap: float
) -> None:
    """Open the scenario's clients, warm them up, measure ``calls`` calls, close them."""
    floor_url, floor_pid = floor
    meter = CpuMeter(floor_pid if scenario.server == "floor" else runtime.pid)
    clients = Clients(floor_url, runtime)
    try:
        callers = await scenario.open_callers(clients, scenario.callers)
        await drive(callers, max(10 * scenario.callers, calls // 5), cap / 4, [])
        gc.collect()
        out: list[float] = []
        meter.start()
        box0, client0, wall0 = box_busy(), time.process_time(), time.perf_counter()
        complete = await drive(callers, calls, cap, out)
        wall1, client1, box1 = time.perf_counter(), time.process_time(), box_busy()
        scenario.server_cpu += meter.stop()
    finally:
        await clients.aclose()
    scenario.latencies += out
    scenario.elapsed += wall1 - wall0
    scenario.client_cpu += client1 - client0
    scenario.box_cpu += box1 - box0
    scenario.capped |= not complete


# -- the clients -----------------------------------------------------------------------------
class Clients:
    """The clients of one scenario's round, closed together."""

    def __init__(self, floor_url: str, runtime: RuntimeProcess) -> None:
        self.floor_url = floor_url
        self.runtime = runtime
        self._closers: list[Callable[[], Awaitable[Any]]] = []

    async def aclose(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                await close()
        self._closers.clear()

    def _raw_post(self, url: str, callers: int) -> list[Call]:
        """A plain aiohttp POST of the fast path's request body; the reply is parsed."""
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            skip_auto_headers=("User-Agent",),
        )
        self._closers.append(session.close)
        body = orjson.dumps({"name": "echo", "arguments": ARGS, "timeout": TOOL_TIMEOUT})
        headers = {"content-type": "application/json"}

        async def call() -> Any:
            async with session.post(url, data=body, headers=headers) as response:
                data = orjson.loads(await response.read())
            if response.status != 200:
                raise RuntimeError(f"{url} answered HTTP {response.status}: {data}")
            return data

        return [call] * callers

    def _httpx_post(self, url: str, callers: int) -> list[Call]:
        """The fast path's request body POSTed with one pooled httpx.AsyncClient."""
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            timeout=TOOL_TIMEOUT,
        )
        self._closers.append(client.aclose)
        body = orjson.dumps({"name": "echo", "arguments": ARGS, "timeout": TOOL_TIMEOUT})
        headers = {"content-type": "application/json"}

        async def call() -> Any:
            response = await client.post(url, content=body, headers=headers)
            data = orjson.loads(response.content)
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered HTTP {response.status_code}: {data}")
            return data

        return [call] * callers

    async def fast_httpx(self, callers: int) -> list[Call]:
        return self._httpx_post(self.runtime.url + "/aenv/v1/call", callers)

    async def floor(self, callers: int) -> list[Call]:
        return self._raw_post(self.floor_url + "/echo", callers)

    async def fast_raw(self, callers: int) -> list[Call]:
        return self._raw_post(self.runtime.url + "/aenv/v1/call", callers)

    async def _sdk(self, tool: str, callers: int) -> list[Call]:
        """One attached Environment shared by all callers (its connection pool grows to fit)."""
        env = Environment.attach(self.runtime.url, timeout=TOOL_TIMEOUT)
        await env.initialize()
        self._closers.append(env.release)
        result = await env.call_tool(tool, ARGS)
        if result.is_error or result.text != ARGS["text"]:
            raise RuntimeError(f"SDK {tool} answered {result}")

        async def call() -> Any:
            return await env.call_tool(tool, ARGS)

        return [call] * callers

    async def sdk(self, callers: int) -> list[Call]:
        return await self._sdk("echo", callers)

    async def sdk_async(self, callers: int) -> list[Call]:
        return await self._sdk("async_echo", callers)

    async def _mcp_client(self) -> Any:
        import fastmcp

        client = fastmcp.Client(self.runtime.mcp_url, timeout=TOOL_TIMEOUT)
        await client.__aenter__()
        self._closers.append(lambda: client.__aexit__(None, None, None))
        result = await client.call_tool_mcp("echo", ARGS)
        if result.is_error:
            raise RuntimeError(f"MCP echo answered {result}")
        return client

    async def mcp(self, callers: int) -> list[Call]:
        """One fastmcp.Client (one MCP session), all callers' calls concurrent on it."""
        client = await self._mcp_client()

        async def call() -> Any:
            return await client.call_tool_mcp("echo", ARGS)

        return [call] * callers

    async def mcp_per_caller(self, callers: int) -> list[Call]:
        """One fastmcp.Client (one MCP session) per caller."""
        calls: list[Call] = []
        for _ in range(callers):
            client = await self._mcp_client()

            async def call(client: Any = client) -> Any:
                return await client.call_tool_mcp("echo", ARGS)

            calls.append(call)
        return calls


# -- the run ---------------------------------------------------------------------------------
def build_scenarios(args: argparse.Namespace) -> list[Scenario]:
    kinds: list[tuple[str, str, str, Any, int]] = [
        ("floor", "floor: aiohttp POST -> starlette", "floor", Clients.floor, args.calls),
        ("fast", "runtime fast path, raw aiohttp", "runtime", Clients.fast_raw, args.calls),
        ("httpx", "runtime fast path, httpx", "runtime", Clients.fast_httpx, args.calls),
        ("sdk", "SDK call_tool, sync echo", "runtime", Clients.sdk, args.calls),
        ("sdk_async", "SDK call_tool, async_echo", "runtime", Clients.sdk_async, args.calls),
        ("mcp", "MCP: fastmcp.Client, 1 session", "runtime", Clients.mcp, args.mcp_calls),
        (
            "mcp_each",
            "MCP: fastmcp.Client per caller",
            "runtime",
            Clients.mcp_per_caller,
            args.mcp_calls,
        ),
    ]
    return [
        Scenario(key, label, server, callers, calls, make)
        for callers in (1, 16)
        for key, label, server, make, calls in kinds
        if not (key == "mcp_each" and callers == 1)  # the same as one shared session
    ]


async def run(
    args: argparse.Namespace, floor: tuple[str, int], runtime: RuntimeProcess
) -> list[Scenario]:
    scenarios = build_scenarios(args)
    for round_no in range(args.rounds):
        for scenario in scenarios:
            calls = scenario.calls // args.rounds
            if round_no == args.rounds - 1:
                calls = scenario.calls - scenario.done
            await measure_round(scenario, runtime, floor, calls, args.cap / args.rounds)
            if args.verbose:
                print(f"round {round_no + 1}: {scenario.label} x{scenario.callers}", flush=True)
    return scenarios


def render(scenarios: list[Scenario], args: argparse.Namespace) -> dict[str, Any]:
    """Print the table and the ratios; return both as a JSON-able dict."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=132)
    table = Table(
        title="Tool calls over loopback, one run (latency in ms, CPU in ms per call)",
        caption="others: share of the machine's CPU that other processes used meanwhile (noise)",
    )
    columns = [
        "scenario",
        "callers",
        "calls",
        "p50",
        "p99",
        "calls/s",
        "server CPU",
        "client CPU",
        "others",
    ]
    for name in columns:
        table.add_column(name, justify="left" if name == "scenario" else "right")
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for scenario in scenarios:
        row = rows[scenario.key, scenario.callers] = scenario.row()
        table.add_row(
            scenario.label,
            str(scenario.callers),
            f"{scenario.done}{' (capped)' if scenario.capped else ''}",
            f"{row['p50_ms']:.3f}",
            f"{row['p99_ms']:.3f}",
            f"{row['calls_per_s']:,.0f}",
            f"{row['server_cpu_ms_per_call']:.3f}",
            f"{row['client_cpu_ms_per_call']:.3f}",
            f"{row['others_pct']:.0f}%",
        )
    console.print(table)

    def get(key: str, callers: int, metric: str) -> float:
        return float(rows[key, callers][metric])

    mcp16 = max(get(key, 16, "calls_per_s") for key in ("mcp", "mcp_each"))
    p50_ratio = get("sdk", 1, "p50_ms") / get("floor", 1, "p50_ms")
    server_cpu = max(get("sdk", callers, "server_cpu_ms_per_call") for callers in (1, 16))
    speedup = get("sdk", 16, "calls_per_s") / mcp16
    checks = [
        ("SDK p50 / floor p50, 1 caller", p50_ratio, "x", "<=", TARGET_P50_RATIO),
        (
            "runtime CPU per SDK call (worse of 1, 16 callers)",
            server_cpu,
            " ms",
            "<=",
            TARGET_SERVER_CPU_MS,
        ),
        ("SDK calls/s / best MCP calls/s, 16 callers", speedup, "x", ">=", TARGET_MCP_SPEEDUP),
    ]
    info = [
        ("SDK p50 / floor p50, 16 callers", get("sdk", 16, "p50_ms") / get("floor", 16, "p50_ms")),
        (
            "SDK calls/s / floor calls/s, 16 callers",
            get("sdk", 16, "calls_per_s") / get("floor", 16, "calls_per_s"),
        ),
        (
            "runtime CPU per SDK call / floor server CPU per call, 1 caller",
            get("sdk", 1, "server_cpu_ms_per_call") / get("floor", 1, "server_cpu_ms_per_call"),
        ),
        (
            "SDK async_echo p50 / floor p50, 1 caller",
            get("sdk_async", 1, "p50_ms") / get("floor", 1, "p50_ms"),
        ),
        *(
            (
                f"{name} client CPU per call / SDK client CPU per call, {callers} caller(s)",
                get(key, callers, "client_cpu_ms_per_call")
                / get("sdk", callers, "client_cpu_ms_per_call"),
            )
            for key, name in (("httpx", "httpx"), ("fast", "aiohttp"))
            for callers in (1, 16)
        ),
    ]
    ratios = Table(title="Against the baseline measured in this run")
    for name in ("ratio", "measured", "target", "verdict"):
        ratios.add_column(name, justify="left" if name == "ratio" else "right")
    results = []
    for name, value, unit, op, target in checks:
        met = value <= target if op == "<=" else value >= target
        verdict = "[green]met[/green]" if met else "[red]missed[/red]"
        ratios.add_row(name, f"{value:.2f}{unit}", f"{op} {target:g}{unit}", verdict)
        results.append({"ratio": name, "value": value, "target": f"{op} {target:g}", "met": met})
    for name, value in info:
        ratios.add_row(name, f"{value:.2f}x", "", "(info)")
    console.print(ratios)
    setup = (
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, client loop {args.loop}, "
        f"--calls {args.calls} --mcp-calls {args.mcp_calls} --rounds {args.rounds}"
    )
    console.print(setup, highlight=False)
    return {
        "setup": setup,
        "rows": list(rows.values()),
        "checks": results,
        "info": [{"ratio": name, "value": value} for name, value in info],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Tool-call latency, throughput and CPU: SDK vs the floor vs standard MCP."
    )
    parser.add_argument("--calls", type=int, default=10_000, help="calls per fast-path scenario")
    parser.add_argument("--mcp-calls", type=int, default=1500, help="calls per MCP scenario")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (noise)")
    parser.add_argument("--cap", type=float, default=12.0, help="seconds per scenario, at most")
    parser.add_argument("--quick", action="store_true", help="fewer calls, one round (~20 s)")
    parser.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the client's event loop"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="report progress")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.mcp_calls, args.rounds, args.cap = 2500, 400, 1, 4.0
    args.rounds = max(1, args.rounds)

    started = time.perf_counter()
    with floor_server() as floor, RuntimeProcess(ECHO_ENV) as runtime:
        if args.loop == "uvloop":
            import uvloop

            scenarios = uvloop.run(run(args, floor, runtime))
        else:
            scenarios = asyncio.run(run(args, floor, runtime))
    report = render(scenarios, args)
    print(f"finished in {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
