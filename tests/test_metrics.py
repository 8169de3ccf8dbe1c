"""Prometheus metrics (docs/observability.md), scraped after real work and parsed with the
official client's parser: the hub (``aenv serve``, a real one), the engine daemon's app over the
session's warm local engine (on a Unix socket, as the daemon serves it), and a real pool on the
session Ray (its node's metrics export, where Ray publishes the pool actors' and the driver's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from aenv_ray import Environment
from aenv_ray.engine import SandboxEngine
from aenv_ray.settings import Settings
from tests._hub import HubProcess, new_key
from tests._session_ray import SessionRay

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "envs" / "probe"
TOKEN = "a-scrape-token-of-the-tests-0123456789"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels (the official parser)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and want <= set(ls))


# -- the hub -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    data = tmp_path_factory.mktemp("metrics-hub")
    token_file = data / "scrape-token"
    token_file.write_text(TOKEN + "\n")
    with HubProcess(data, auth=True, extra=["--metrics-token-file", str(token_file)]) as process:
        yield process, new_key("metrics", process.store)


async def _scrape(url: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        return r.status, await r.text()


async def test_the_hub_counts_creates_their_latency_errors_and_proxied_calls(
    hub: tuple[HubProcess, str],
) -> None:
    process, key = hub
    url = f"{process.url}/metrics"
    status, before_text = await _scrape(url, TOKEN)
    assert status == 200, before_text
    before = samples(before_text)
    # real work: 2 creates, 3 tool calls through the hub's proxy, a create of an unknown env
    through_proxy = Settings(system_url=process.url, api_key=key, hub_route="proxy")
    envs = []
    for _ in range(2):
        env = Environment("mini-terminal@1.0.0", settings=through_proxy)
        await env.initialize()
        envs.append(env)
    try:
        for env in envs:
            await env.call_tool("execute_command", {"command": "echo hi"})
        await envs[0].call_tool("execute_command", {"command": "echo again"})
        with pytest.raises(Exception, match="nosuch"):
            await Environment("nosuch-env@9.9.9", settings=through_proxy).initialize()
        status, text = await _scrape(url, TOKEN)
    finally:
        for env in envs:
            await env.release()
    assert status == 200
    after = samples(text)
    grew = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert grew("aenv_hub_instance_creates_total") == 3
    assert grew("aenv_hub_instance_create_failures_total", kind="EnvironmentNotFoundError") == 1
    assert grew("aenv_hub_instance_create_duration_seconds_count", source="engine") == 2
    assert grew("aenv_hub_instance_create_duration_seconds_sum", source="engine") > 0
    assert grew("aenv_hub_errors_total", kind="EnvironmentNotFoundError") == 1
    assert grew("aenv_hub_proxy_requests_total", target="instance", endpoint="call") == 3
    assert grew("aenv_hub_proxy_request_duration_seconds_count", endpoint="call") == 3
    assert value(after, "aenv_hub_instances", state="running") >= 2
    # the histogram's buckets are cumulative and end in +Inf = count
    assert value(
        after, "aenv_hub_instance_create_duration_seconds_bucket", source="engine", le="+Inf"
    ) == value(after, "aenv_hub_instance_create_duration_seconds_count", source="engine")


async def test_the_hubs_metrics_need_its_scrape_token(hub: tuple[HubProcess, str]) -> None:
    process, key = hub
    status, text = await _scrape(f"{process.url}/metrics", None)
    assert status == 401, text
    assert "scrape token" in json.loads(text)["error"]
    status, text = await _scrape(f"{process.url}/metrics", key)  # a tenant's key is not it
    assert status == 401
    status, _ = await _scrape(f"{process.url}/metrics", TOKEN + "x")
    assert status == 401


async def test_without_a_scrape_token_any_api_key_may_scrape_the_hub(
    shared_hub: HubProcess,
) -> None:
    key = new_key("metrics-reader", shared_hub.store)
    status, text = await _scrape(f"{shared_hub.url}/metrics", key)
    assert status == 200, text
    found = samples(text)
    for state in ("pending", "running", "terminated"):  # every state shown, 0 when none
        assert ("aenv_hub_instances", (("state", state),)) in found
    assert ("aenv_hub_instance_creates_total", ()) in found
    status, _ = await _scrape(f"{shared_hub.url}/metrics", None)
    assert status == 401


def test_without_prometheus_client_metrics_answer_501_in_one_line_and_the_rest_works() -> None:
    code = """
import sys
sys.modules["prometheus_client"] = None  # as if the 'metrics' extra were not installed
import importlib.util
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "prometheus_client" else real(name, *a)
from fastapi.testclient import TestClient
from envhub.app import HubOptions, create_app
from envhub.store import open_store
from local_backend import LocalEngine
import asyncio, tempfile, pathlib
data = pathlib.Path(tempfile.mkdtemp())
store = asyncio.run(open_store("sqlite:///:memory:"))
options = HubOptions(auth=False, data_dir=data, secret=b"s" * 32)
app = create_app(store, LocalEngine(), options)
with TestClient(app, base_url="http://127.0.0.1") as client:
    r = client.get("/metrics")
    print(r.status_code, r.text.strip())
    print(client.get("/v1/health").status_code)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    assert first.startswith("501 aenv-ray: the hub's /metrics needs the 'metrics' extra: ")
    assert "pip install 'aenv-ray[metrics]'" in first
    assert second == "200"


# -- the engine daemon -------------------------------------------------------------------------


async def test_the_engine_daemon_counts_creates_failures_and_instances(
    warm_engine: SandboxEngine, tmp_path: Path
) -> None:
    from local_backend.daemon import make_app

    runner = web.AppRunner(make_app(warm_engine), access_log=None)  # type: ignore[arg-type]
    await runner.setup()
    sock = str(tmp_path / "engine.sock")
    await web.UnixSite(runner, sock).start()
    connector = aiohttp.UnixConnector(path=sock)
    ids = []
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(2):
                async with http.post(
                    "http://daemon/v1/instances", json={"env": "probe", "project": str(PROBE)}
                ) as r:
                    assert r.status == 201, await r.text()
                    ids.append((await r.json())["id"])
            async with http.post(
                "http://daemon/v1/instances", json={"env": "nosuch-env@1.0.0"}
            ) as r:
                assert r.status == 404
            async with http.delete("http://daemon/v1/instances/no-such-id") as r:
                assert r.status == 404
            async with http.get("http://daemon/metrics") as r:
                assert r.status == 200
                found = samples(await r.text())
            for iid in ids:
                async with http.delete(f"http://daemon/v1/instances/{iid}") as r:
                    assert r.status == 200
    finally:
        await runner.cleanup()
    assert value(found, "aenv_engine_instance_creates_total") == 3
    assert value(found, "aenv_engine_instance_create_duration_seconds_count") == 2
    assert value(found, "aenv_engine_instance_create_failures_total") == 1
    assert (
        value(
            found,
            "aenv_engine_errors_total",
            operation="POST /v1/instances",
            kind="EnvironmentNotFoundError",
        )
        == 1
    )
    assert (
        value(
            found,
            "aenv_engine_errors_total",
            operation="DELETE /v1/instances/{id}",
            kind="InstanceNotFoundError",
        )
        == 1
    )
    assert value(found, "aenv_engine_instances", state="running") >= 2


# -- a pool on the session Ray -----------------------------------------------------------------

DRIVER = """
import json, sys, time, urllib.request
import ray, rollout
from rollout import RolloutPool

rollout.init_local()
with RolloutPool("probe", project=sys.argv[1], size=2) as pool:
    with pool.acquire(timeout=60) as lease:
        for _ in range(3):
            rollout.get(lease.call_tool("echo", {"text": "hi"}), timeout=60)
        rollout.get(lease.call_tool("fail", {"message": "no"}), timeout=60)  # a tool error
        rollout.get(lease.call_tool("made_up_tool", {}), timeout=60)  # not found
    def episode(lease):
        return rollout.get(lease.call_tool("echo", {"text": "x"}), timeout=60)
    rollout.run_episode(pool, episode)
    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
    deadline = time.monotonic() + 90  # Ray exports every ~10 s
    text = ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        wanted = ("tool_call_duration_seconds", "episodes_total", "acquires_total")
        if all("ray_aenv_rollout_" + w in text for w in wanted) and 'tool="echo"' in text:
            break
        time.sleep(2)
    print(json.dumps({"pool": pool.name, "text": text}))
"""


@pytest.mark.ray
def test_a_pool_on_ray_exports_calls_by_tool_errors_acquires_and_episodes(
    session_ray: SessionRay,
) -> None:
    env = {**os.environ, **session_ray.env}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(PROBE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    pool, found = out["pool"], samples(out["text"])
    prefix = "ray_aenv_rollout_"
    assert value(found, prefix + "tool_calls_total", pool=pool, tool="echo", outcome="ok") == 4
    assert (
        value(found, prefix + "tool_calls_total", pool=pool, tool="fail", outcome="execution") == 1
    )
    assert (
        value(found, prefix + "tool_calls_total", pool=pool, tool="<unknown>", outcome="not_found")
        == 1
    )
    assert value(found, prefix + "errors_total", pool=pool, kind="execution") == 1
    assert value(found, prefix + "errors_total", pool=pool, kind="not_found") == 1
    assert value(found, prefix + "tool_call_duration_seconds_count", pool=pool, tool="echo") == 4
    assert value(found, prefix + "acquires_total", pool=pool) == 2
    assert value(found, prefix + "episodes_total", pool=pool, outcome="ok") == 1
    assert value(found, prefix + "warm_target", pool=pool) == 2


async def test_a_daemon_asked_serves_only_its_metrics_on_a_loopback_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aenv_ray.engine import InstanceSpec
    from aenv_ray.testing import free_port
    from local_backend.client import DaemonEngine
    from local_backend.daemon import METRICS_PORT_ENV

    port = free_port()
    monkeypatch.setenv(METRICS_PORT_ENV, str(port))  # the daemon the client starts reads it
    state = Path(tempfile.mkdtemp(prefix="aenv-m-"))
    engine = DaemonEngine(state)
    try:
        info = await engine.create(InstanceSpec(env_ref="probe", project=str(PROBE)), timeout=60)
        status, text = await _scrape(f"http://127.0.0.1:{port}/metrics", None)
        assert status == 200, text
        found = samples(text)
        assert value(found, "aenv_engine_instance_creates_total") == 1
        assert value(found, "aenv_engine_instances", state="running") == 1
        status, _ = await _scrape(f"http://127.0.0.1:{port}/v1/instances", None)
        assert status == 404  # the instance routes stay on the socket (its user's only)
        await engine.delete(info.id)
    finally:
        await engine.shutdown()
        shutil.rmtree(state, ignore_errors=True)
