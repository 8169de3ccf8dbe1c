"""Kubernetes-engine benchmark on the real API server of ``../shared/tools/k8s-real``.

    .venv/bin/python benchmarks/bench_k8s.py            # several minutes (a 3,700-pod pool)
    .venv/bin/python benchmarks/bench_k8s.py --quick    # about a minute, a 370-pod pool

Two clusters are started, one after the other (each a fresh kube-apiserver, etcd and fake kubelet
on loopback):

1. **with processes**: the fake kubelet runs each pod's command, so a pod is Ready when the
   sandbox runtime (this venv's Python) answers its readiness probe:
   - cold: ``KubernetesEngine.create`` -> Ready -> first tool call (raw POST);
   - warm: ``claim`` of a Ready free pod of a warm pool -> first tool call; and the SDK's
     ``Environment.adopt`` open + call on a claimed pod.
2. **without processes** (``FAKE_KUBELET_RUN_PROCESSES=0``: every pod Ready at once), so the API
   path alone is measured:
   - baseline, the bare API calls the engine makes: the official client's
     ``create_namespaced_pod`` of the same manifest + a watch of that pod until Ready; against
     ``KubernetesEngine.create`` (its limiter, POST, and its namespace-wide watch);
   - 100 creates at once; creation throughput under the default rate limiter;
   - reaper lag: seconds from a pod's ``expires-at`` to its deletion seen by the watch;
3. **no kubelet** (``NO_FAKE_KUBELET=1``), for the burst at the scale of
   kubernetes-sigs/agent-sandbox's reference test: a warm pool of 3,700 pods and 3,600 claims,
   issued open-loop at ``--rate`` claims/s, and all at once. The fake kubelet keeps a thread per
   pod, which 3,700 pods on a 2-core machine do not survive; so the benchmark plays the kubelet:
   it binds nothing and patches each pod's status to Running and Ready (what a kubelet reports),
   and the claims then meet the API server as they would on a real cluster.

``--kubeconfig PATH`` measures a real node instead (``../shared/tools/k8s-realnode``: images run
by containerd, readiness from the kubelet's probes), and only that, on two environments with
256 MiB and 250m each: ``benchmarks/envs/echo`` (``echo("hi")``, a call that starts nothing, as
on the fake kubelet) and mini-terminal (``execute_command("true")`` in its bash session). Their
images are this checkout's, built here when the node has none of that content (a layer on the
runtime image of deploy/Dockerfile, tagged under ``--image-prefix``). Each step is done both
ways, by the engine and with the plain official client (create the same manifest, watch it
Ready, call; claim: a PATCH of a Ready pod's label with its resourceVersion, call), and the warm
path is split: the claim, the first call, a second call, and the SDK's ``Environment.adopt`` open
and first call. The engine's warm claims are made as a rollout makes them, ``--pace`` seconds
apart, after a first claim of the pool that starts the engine's reservations (its reserved pods,
each with a connection opened ahead); its calls go through the SDK's client
(``aenv_ray._wire.WireClient``, one per instance), which takes that connection. The plain
client's call is aiohttp on a new connection, as before:

    .venv/bin/python benchmarks/bench_k8s.py --kubeconfig ~/.cache/k8s-real/realnode/kubeconfig \
        --image-prefix realnode.local/aenv --n 5          # --env echo|terminal, --no-cold

Exit status 0 either way: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import client as k8s_client  # noqa: E402
from kubernetes import watch as k8s_watch  # noqa: E402

from aenv_ray import (  # noqa: E402
    Environment,
    InstanceSpec,
    _wire,
)
from aenv_ray._wire import WireClient  # noqa: E402
from aenv_ray.config import EnvConfig  # noqa: E402
from k8s_backend import HostProcess, KubernetesEngine, RateLimiter  # noqa: E402
from k8s_backend.manifests import PodRecipe, instance_pod  # noqa: E402
from tests._k8s import KubeCluster  # noqa: E402

ECHO = HERE / "envs" / "echo"
SPEC = InstanceSpec("bench-echo@1.0.0", project=str(ECHO), ttl=3600.0)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)  # nearest rank
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1e3:8.1f} ms   p99 {pct(values, 0.99) * 1e3:8.1f} ms"


def row(label: str, values: list[float]) -> None:
    print(f"  {label:<44} {ms(values)}   (n={len(values)})", flush=True)


async def first_call(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
    body = {"name": "echo", "arguments": {"text": "hi"}}
    async with http.post(f"{url}/aenv/v1/call", json=body, headers=headers) as response:
        assert response.status == 200, response.status
        await response.read()


async def until_warm(
    engine: KubernetesEngine, pool: str, count: int, spec: InstanceSpec = SPEC
) -> None:
    while True:
        if (await engine.warm_count(spec, pool=pool)).ready >= count:
            return
        await asyncio.sleep(0.05)


def namespace(cluster: KubeCluster) -> str:
    return cluster.namespace(f"bench-{uuid.uuid4().hex[:6]}")


# -- 1. with processes: cold vs warm --------------------------------------------------------------


async def cold_and_warm(cluster: KubeCluster, n: int) -> dict[str, list[float]]:
    ns = namespace(cluster)
    engine = cluster.engine(ns, limiter=RateLimiter(rate=1000, burst=1000))
    results: dict[str, list[float]] = {"cold": [], "warm": [], "claim": [], "sdk": []}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(n):
                started = time.perf_counter()
                info = await engine.create(SPEC, timeout=120)
                await first_call(http, info.url or "", info.headers)
                results["cold"].append(time.perf_counter() - started)
                await engine.delete(info.id)
            await engine.prewarm(SPEC, pool="bench", count=2 * n)
            await until_warm(engine, "bench", 2 * n)
            for _ in range(n):
                started = time.perf_counter()
                claimed = await engine.claim(SPEC, pool="bench")
                assert claimed is not None
                results["claim"].append(time.perf_counter() - started)
                await first_call(http, claimed.url or "", claimed.headers)
                results["warm"].append(time.perf_counter() - started)
            for _ in range(n):
                started = time.perf_counter()
                claimed = await engine.claim(SPEC, pool="bench")
                assert claimed is not None
                async with Environment.adopt(engine, claimed) as env:
                    await env.call_tool("echo", {"text": "hi"})
                results["sdk"].append(time.perf_counter() - started)
    finally:
        await engine.aclose()
    return results


# -- 2. without processes: the API path ----------------------------------------------------------


def plain_create(api: k8s_client.ApiClient, ns: str, config: EnvConfig) -> float:
    """The bare calls: create the pod, watch it until Ready (the official client)."""
    iid = uuid.uuid4().hex[:12]
    now = time.time()
    pod = instance_pod(
        PodRecipe(
            instance_id=iid,
            env_ref=config.ref,
            image="unused",
            command=HostProcess().runtime(config, ECHO)[1],
            expires_at=now + 3600,
            deploy=config.deploy_config,
            created_at=now,
        )
    )
    core = k8s_client.CoreV1Api(api)
    started = time.perf_counter()
    created = core.create_namespaced_pod(ns, pod)
    name = created.metadata.name
    stream = k8s_watch.Watch().stream(
        core.list_namespaced_pod,
        ns,
        field_selector=f"metadata.name={name}",
        resource_version=created.metadata.resource_version,
        timeout_seconds=60,
    )
    for event in stream:
        status = event["object"].status
        conditions = status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            break
    elapsed = time.perf_counter() - started
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    return elapsed


async def api_path(cluster: KubeCluster, n: int) -> None:
    ns = namespace(cluster)
    config = EnvConfig.load(ECHO)
    fast = RateLimiter(rate=10_000, burst=10_000)
    engine = cluster.engine(ns, limiter=fast, lease_seconds=3)
    api = cluster.api_client()
    try:
        await engine.list()  # listed and watching
        plain, ours = [], []
        for _ in range(n):  # interleaved, so drift hits both alike
            plain.append(await asyncio.to_thread(plain_create, api, ns, config))
            started = time.perf_counter()
            info = await engine.create(SPEC, timeout=60)
            ours.append(time.perf_counter() - started)
            await engine.delete(info.id)
        print("\nthe API path (pods Ready at once: no processes)", flush=True)
        row("bare client: create + watch to Ready", plain)
        row("KubernetesEngine.create", ours)
        ratio = pct(ours, 0.5) / pct(plain, 0.5)
        print(f"  engine / bare client, p50: {ratio:.2f}x", flush=True)

        started = time.perf_counter()
        times: list[float] = []

        async def timed_create() -> str:
            began = time.perf_counter()
            info = await engine.create(SPEC, timeout=300)
            times.append(time.perf_counter() - began)
            return info.id

        ids = await asyncio.gather(*(timed_create() for _ in range(100)))
        total = time.perf_counter() - started
        row("100 creates at once, each", times)
        print(f"  100 creates at once: all Ready in {total:.2f} s", flush=True)
        await asyncio.gather(*(engine.delete(i) for i in ids))

        limited = cluster.engine(ns, limiter=RateLimiter())  # the default: 20/s, burst 20
        try:
            await limited.list()
            count = 100
            started = time.perf_counter()
            await limited.prewarm(SPEC, pool="rate", count=count)
            await until_warm(limited, "rate", count)
            took = time.perf_counter() - started
            print(
                f"  creation throughput, default limiter (20/s, burst 20): "
                f"{count / took:.1f} pods/s Ready ({count} in {took:.2f} s)",
                flush=True,
            )
        finally:
            await limited.aclose()

        await reaper_lag(engine)
    finally:
        await engine.aclose()
        api.close()


async def reaper_lag(engine: KubernetesEngine) -> None:
    infos = await asyncio.gather(
        *(
            engine.create(InstanceSpec(SPEC.env_ref, project=SPEC.project, ttl=2.0))
            for _ in range(20)
        )
    )
    lags: list[float] = []
    pending = {info.id: info.expires_at or 0.0 for info in infos}
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        for iid, expires in list(pending.items()):
            if not (await engine.get(iid)).is_running:
                lags.append(time.time() - expires)
                del pending[iid]
        await asyncio.sleep(0.02)
    row("reaper lag (expires-at -> deletion seen)", lags)


def mark_ready(api: k8s_client.ApiClient, pod: dict[str, Any], ip: str) -> None:
    """What a kubelet reports of a started pod: Running, its IP, Ready."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    status = {"status": {"phase": "Running", "podIP": ip, "conditions": [ready]}}
    meta = pod["metadata"]
    k8s_client.CoreV1Api(api).patch_namespaced_pod_status(meta["name"], meta["namespace"], status)


async def claim_burst(cluster: KubeCluster, claims: int, rate: float) -> None:
    ns = namespace(cluster)
    engine = cluster.engine(ns, limiter=RateLimiter(rate=10_000, burst=10_000), reaper=False)
    api = cluster.api_client()
    size = claims + claims // 36  # 3,600 claims on a 3,700-pod pool
    print(f"\nthe burst: {claims} claims on a {size}-pod warm pool (no kubelet)", flush=True)
    try:
        started = time.perf_counter()
        sent = 0
        while sent < size:
            sent += await engine.prewarm(SPEC, pool="burst", count=min(500, size - sent))
        key, _ = engine._warm_key(SPEC, "burst")
        pods = engine._cache.free(key)  # every pod the engine sent
        assert len(pods) == size
        marks = [
            asyncio.to_thread(mark_ready, api, pod, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
            for i, pod in enumerate(pods)
        ]
        for chunk in range(0, len(marks), 64):
            await asyncio.gather(*marks[chunk : chunk + 64])
        await until_warm(engine, "burst", size)
        print(f"  pool of {size} Ready in {time.perf_counter() - started:.1f} s", flush=True)

        # baseline: the bare call a claim makes, a merge PATCH of a pod (the official client),
        # on pods of another pool; against claims one at a time
        await engine.prewarm(SPEC, pool="baseline", count=200)
        base_key, _ = engine._warm_key(SPEC, "baseline")
        core = k8s_client.CoreV1Api(api)
        bare: list[float] = []
        for pod in engine._cache.free(base_key):
            began = time.perf_counter()
            await asyncio.to_thread(
                core.patch_namespaced_pod,
                pod["metadata"]["name"],
                ns,
                {"metadata": {"annotations": {"bench": "1"}}},
            )
            bare.append(time.perf_counter() - began)
        single: list[float] = []
        for _ in range(200):
            began = time.perf_counter()
            assert await engine.claim(SPEC, pool="burst") is not None
            single.append(time.perf_counter() - began)
        base_pods = engine._cache.free(base_key)
        bare_open: list[float] = []

        def patch(name: str) -> None:
            began = time.perf_counter()
            core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {"bench": "2"}}})
            bare_open.append(time.perf_counter() - began)

        tasks = []
        started = time.perf_counter()
        for i in range(claims // 2):  # the same open loop as the claims' below
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            name = base_pods[i % len(base_pods)]["metadata"]["name"]
            tasks.append(asyncio.ensure_future(asyncio.to_thread(patch, name)))
        await asyncio.gather(*tasks)
        row("bare client: PATCH a pod", bare)
        row(f"bare client: PATCH, open loop at {rate:g}/s", bare_open)
        row("claim, one at a time", single)
        ratio = pct(single, 0.5) / pct(bare, 0.5)
        print(f"  claim / bare PATCH, p50: {ratio:.2f}x", flush=True)
        claims -= 200

        half = claims // 2
        open_loop: list[float] = []

        async def one(into: list[float]) -> None:
            began = time.perf_counter()
            got = await engine.claim(SPEC, pool="burst")
            assert got is not None, "the pool ran dry"
            into.append(time.perf_counter() - began)

        tasks = []
        started = time.perf_counter()
        for i in range(half):  # open loop: one claim every 1/rate s, whatever the answers do
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(open_loop)))
        await asyncio.gather(*tasks)
        row(f"claim, open loop at {rate:g}/s", open_loop)

        at_once: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(*(one(at_once) for _ in range(claims - half)))
        total = time.perf_counter() - started
        row(f"claim, {claims - half} at once", at_once)
        print(f"  {claims - half} at once: {(claims - half) / total:.0f} claims/s", flush=True)
    finally:
        await engine.aclose()
        api.close()


# -- a real node -----------------------------------------------------------------------------

REAL_ENVS = ("echo", "terminal")
"""What ``--env`` may name: ``benchmarks/envs/echo`` (a call that starts nothing) and
mini-terminal (a bash session per instance), both run with 256 MiB and 250m."""


def _file_lines(project: Path) -> tuple[str, ...]:
    """Dockerfile lines that write ``project``'s config.json and ``src/*.py`` at ``/env``."""
    import base64

    files = [project / "config.json", *sorted((project / "src").glob("*.py"))]
    lines = ["RUN mkdir -p /env/src"]
    for file in files:
        text = base64.b64encode(file.read_bytes()).decode()
        lines.append(f"RUN echo {text} | base64 -d > /env/{file.relative_to(project)}")
    return (*lines, "WORKDIR /env")


def real_images(prefix: str) -> dict[str, str]:
    """Each environment's image of this checkout: a layer on the runtime image built from
    deploy/Dockerfile (tests/_realnode.py, keyed by content), with the project at ``/env`` as
    ``aenv build``'s image has it; built with the kit's ``build-image`` when the node has none
    of that content (the runtime image: minutes, once per checkout; a layer: seconds)."""
    from tests._k8s_images import layered_image
    from tests._realnode import runtime_image

    if prefix:
        os.environ["AENV_TEST_IMAGE_PREFIX"] = prefix
    base = runtime_image()
    terminal = (  # the installed built-in's files, as harbor-pod's test image takes its own
        'RUN python -c "import pathlib, shutil, builtin_envs; shutil.copytree('
        "pathlib.Path(builtin_envs.__file__).parent / 'mini_terminal', '/env', "
        "ignore=shutil.ignore_patterns('__pycache__'))\"",
        "WORKDIR /env",
    )
    return {
        "echo": layered_image(base, "bench-echo", _file_lines(ECHO), version="1.0.0"),
        "terminal": layered_image(base, "mini-terminal", terminal, version="1.0.0"),
    }


def real_env(root: Path, which: str, image: str) -> InstanceSpec:
    """``bench-echo@1.0.0`` or ``mini-terminal@1.0.0`` run from ``image`` (not as a built-in),
    with 256 MiB and 250m."""
    import json
    import shutil

    source = ECHO if which == "echo" else ROOT / "builtin_envs" / "mini_terminal"
    project = root / which
    shutil.rmtree(project, ignore_errors=True)
    shutil.copytree(source, project, ignore=shutil.ignore_patterns("__pycache__"))
    config = json.loads((project / "config.json").read_text())
    config["artifacts"] = [{"type": "image", "content": image}]
    config["deployConfig"].update(memory="256M", cpu="250m")
    (project / "config.json").write_text(json.dumps(config))
    return InstanceSpec(f"{config['name']}@1.0.0", project=str(project), ttl=3600.0)


def real_call(which: str) -> tuple[str, dict[str, Any]]:
    """The tool call measured: ``echo("hi")``, or ``execute_command("true")``."""
    if which == "echo":
        return "echo", {"text": "hi"}
    return "execute_command", {"command": "true"}


async def post_call(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], which: str
) -> None:
    name, arguments = real_call(which)
    body = {"name": name, "arguments": arguments}
    async with http.post(f"{url}/aenv/v1/call", json=body, headers=headers) as response:
        assert response.status == 200, response.status
        data = await response.json()
        assert not data.get("is_error"), data


async def wire_call(wire: WireClient, which: str) -> None:
    """The call through the SDK's client (the connection opened ahead, if one waits)."""
    name, arguments = real_call(which)
    body = orjson.dumps({"name": name, "arguments": arguments})
    status, data = await wire.request("POST", "/aenv/v1/call", body, timeout=30.0)
    assert status == 200, status
    assert not orjson.loads(data).get("is_error"), data


def _opened_ahead(url: str) -> bool:
    """Whether a connection to ``url``'s pod waits, opened ahead by the engine."""
    host, _, port = url.split("//", 1)[-1].partition(":")
    shelves = _wire._shelves.get(asyncio.get_running_loop(), {})
    return any(not c.closed for c in shelves.get((False, host, int(port or 80)), []))


def plain_pod(spec: InstanceSpec, image: str, token: str, labels: dict[str, str]) -> Any:
    import hashlib

    config = EnvConfig.load(Path(spec.project or ""))
    now = time.time()
    return instance_pod(
        PodRecipe(
            instance_id=uuid.uuid4().hex[:12],
            env_ref=config.ref,
            image=image,
            command=["python", "-m", "sandbox_runtime", "/env"],
            expires_at=now + 3600,
            deploy=config.deploy_config,
            created_at=now,
            token_sha256=hashlib.sha256(token.encode()).hexdigest(),
            labels=labels,
        )
    )


def plain_ready(core: Any, ns: str, name: str, version: str) -> Any:
    stream = k8s_watch.Watch().stream(
        core.list_namespaced_pod,
        ns,
        field_selector=f"metadata.name={name}",
        resource_version=version,
        timeout_seconds=120,
    )
    for event in stream:
        pod = event["object"]
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            return pod
    raise TimeoutError(f"pod {name} not Ready")


async def real_node(
    kubeconfig: Path, which: str, image: str, n: int, *, cold: bool = True, pace: float = 0.2
) -> dict[str, list[float]]:
    """Every step on one environment, by the engine and by the plain client (``cold``: the
    cold starts too)."""
    import tempfile

    from kubernetes import config as k8s_config

    from k8s_backend import OwnImage

    cluster = KubeCluster(kubeconfig)
    spec = real_env(Path(tempfile.mkdtemp(prefix="bench-k8s-")), which, image)
    ns = cluster.namespace(f"bench-real-{uuid.uuid4().hex[:6]}")
    engine = KubernetesEngine(
        ns,
        kubeconfig=cluster.kubeconfig,
        delivery=OwnImage(""),
        limiter=RateLimiter(rate=1000, burst=1000),
    )
    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core = k8s_client.CoreV1Api(api)
    token = uuid.uuid4().hex
    headers = {"Authorization": f"Bearer {token}"}
    out: dict[str, list[float]] = {}
    loop = asyncio.get_running_loop()
    name, arguments = real_call(which)
    group = 8

    def add(key: str, began: float) -> None:
        out.setdefault(key, []).append(time.perf_counter() - began)

    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(n if cold else 0):  # the engine, cold
                started = time.perf_counter()
                info = await engine.create(spec, timeout=180)
                await post_call(http, info.url or "", info.headers, which)
                add("cold", started)
                await engine.delete(info.id)
            for _ in range(n if cold else 0):  # the plain client, cold
                pod = plain_pod(spec, image, token, {})
                started = time.perf_counter()
                created = await loop.run_in_executor(None, core.create_namespaced_pod, ns, pod)
                ready = await loop.run_in_executor(
                    None,
                    plain_ready,
                    core,
                    ns,
                    created.metadata.name,
                    created.metadata.resource_version,
                )
                await post_call(http, f"http://{ready.status.pod_ip}:8080", headers, which)
                add("plain cold", started)
                core.delete_namespaced_pod(created.metadata.name, ns, grace_period_seconds=0)
            warm = 3 * n + group + 1 + engine.reserve
            await engine.prewarm(spec, pool="bench", count=warm)
            await until_warm(engine, "bench", warm, spec)
            # the pool's first claim is a PATCH; it starts the engine's reservations
            assert await engine.claim(spec, pool="bench") is not None
            for _ in range(n):  # the engine, warm: claim, first call, second, the SDK's client
                await asyncio.sleep(pace)  # a rollout's pace: the reserver refills meanwhile
                started = time.perf_counter()
                claimed = await engine.claim(spec, pool="bench")
                assert claimed is not None
                add("claim", started)
                ahead = _opened_ahead(claimed.url or "")
                wire = WireClient(claimed.url or "", headers=claimed.headers)
                began = time.perf_counter()
                await wire_call(wire, which)
                add("first call", began)
                add("warm", started)
                out.setdefault("ahead", []).append(float(ahead))
                began = time.perf_counter()
                await wire_call(wire, which)
                add("second call", began)
                await wire.aclose()
            for _ in range(n):  # the SDK: claim, adopt (its readiness check and info), call
                await asyncio.sleep(pace)
                started = time.perf_counter()
                claimed = await engine.claim(spec, pool="bench")
                assert claimed is not None
                env = Environment.adopt(engine, claimed)
                began = time.perf_counter()
                await env.initialize()
                add("sdk open", began)
                began = time.perf_counter()
                await env.call_tool(name, arguments)
                add("sdk call", began)
                add("sdk", started)
                await env.release()
            # the same with an engine that reserves nothing: the claim's PATCH, a new connection
            patcher = KubernetesEngine(
                ns,
                kubeconfig=cluster.kubeconfig,
                delivery=OwnImage(""),
                limiter=RateLimiter(rate=1000, burst=1000),
                reserve=0,
            )
            try:
                for _ in range(n):
                    await asyncio.sleep(pace)
                    started = time.perf_counter()
                    claimed = await patcher.claim(spec, pool="bench")
                    assert claimed is not None
                    add("patch claim", started)
                    wire = WireClient(claimed.url or "", headers=claimed.headers)
                    await wire_call(wire, which)
                    add("patch warm", started)
                    await wire.aclose()
            finally:
                await patcher.aclose()
            started = time.perf_counter()  # a GRPO group: 8 claims at once, a call each
            infos = await asyncio.gather(*(engine.claim(spec, pool="bench") for _ in range(group)))
            await asyncio.gather(
                *(post_call(http, i.url or "", i.headers, which) for i in infos if i is not None)
            )
            assert all(infos)
            out["group"] = [time.perf_counter() - started]
            # the plain client's claim: Ready pods of our own labelled free, PATCHed claimed
            free = []
            for _ in range(n):
                pod = plain_pod(spec, image, token, {"bench-claim": "free"})
                created = core.create_namespaced_pod(ns, pod)
                free.append(created.metadata)
            for meta in free:
                ready = plain_ready(core, ns, meta.name, meta.resource_version)
                started = time.perf_counter()
                patch = {
                    "metadata": {
                        "labels": {"bench-claim": "claimed"},
                        "resourceVersion": ready.metadata.resource_version,
                    }
                }
                await loop.run_in_executor(None, core.patch_namespaced_pod, meta.name, ns, patch)
                add("plain patch", started)
                began = time.perf_counter()
                await post_call(http, f"http://{ready.status.pod_ip}:8080", headers, which)
                add("plain call", began)
                add("plain warm", started)
    finally:
        await engine.aclose()
        core.delete_namespace(ns)
        api.close()
    return out


def report_real(kubeconfig: Path, which: str, image: str, n: int, out: dict[str, Any]) -> None:
    name, arguments = real_call(which)
    print(f"\nreal node ({kubeconfig}), {which}: {image}, `{name}({arguments})`, n={n}")
    if "cold" in out:
        row("engine cold: create -> Ready -> first call", out["cold"])
        row("plain client cold: create -> watch Ready -> call", out["plain cold"])
    row("engine warm: claim -> first call", out["warm"])
    row("  of which the claim (a reserved pod)", out["claim"])
    row("  of which the first call", out["first call"])
    row("  then a second call (same connection)", out["second call"])
    ahead = int(sum(out["ahead"]))
    print(f"    first calls on a connection opened ahead: {ahead} of {len(out['ahead'])}")
    row("engine warm, reserve=0: claim -> first call", out["patch warm"])
    row("  of which the claim (a PATCH)", out["patch claim"])
    row("SDK warm: claim + adopt + call", out["sdk"])
    row("  of which the SDK's open (ready + info)", out["sdk open"])
    row("  of which the SDK's first call", out["sdk call"])
    row("plain client warm: PATCH claim -> call", out["plain warm"])
    row("  of which the PATCH", out["plain patch"])
    row("  of which the call", out["plain call"])
    group = out["group"][0]
    print(f"  GRPO group of 8: 8 claims at once + a call each: {group * 1e3:.0f} ms", flush=True)
    print(f"  claims/s in that group: {8 / group:.0f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rate", type=float, default=100.0, help="open-loop claims per second")
    parser.add_argument("--kubeconfig", help="a real node's kubeconfig: measure it alone")
    parser.add_argument(
        "--image-prefix", default="", help="where to tag the real node's images (built here)"
    )
    parser.add_argument("--n", type=int, default=5, help="samples per step on a real node")
    parser.add_argument("--no-cold", action="store_true", help="on a real node: warm steps only")
    parser.add_argument(
        "--pace", type=float, default=0.2, help="on a real node: seconds between warm claims"
    )
    parser.add_argument(
        "--env",
        choices=[*REAL_ENVS, "both"],
        default="both",
        help="on a real node: the environment measured",
    )
    args = parser.parse_args()
    if args.kubeconfig:
        kubeconfig = Path(args.kubeconfig).expanduser()
        images = real_images(args.image_prefix)
        load = os.getloadavg()
        print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        for which in REAL_ENVS if args.env == "both" else (args.env,):
            out = asyncio.run(
                real_node(
                    kubeconfig,
                    which,
                    images[which],
                    args.n,
                    cold=not args.no_cold,
                    pace=args.pace,
                )
            )
            report_real(kubeconfig, which, images[which], args.n, out)
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        return 0
    n = 5 if args.quick else 20
    claims = 360 if args.quick else 3600

    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(KubeCluster.start())
        results = asyncio.run(cold_and_warm(cluster, n))
        print("cold vs warm (pods run the runtime: this venv's Python)", flush=True)
        row("cold: create -> Ready -> first call", results["cold"])
        row("warm: claim -> first call", results["warm"])
        row("  of which the claim", results["claim"])
        row("warm, SDK: claim + adopt + call + release", results["sdk"])
        ratio = pct(results["cold"], 0.5) / pct(results["warm"], 0.5)
        print(f"  cold / warm, p50: {ratio:.0f}x", flush=True)
        stack.close()

        os.environ["FAKE_KUBELET_RUN_PROCESSES"] = "0"
        try:
            cluster = stack.enter_context(KubeCluster.start())
        finally:
            del os.environ["FAKE_KUBELET_RUN_PROCESSES"]
        asyncio.run(api_path(cluster, n))
        stack.close()

        os.environ["NO_FAKE_KUBELET"] = "1"
        try:
            cluster = stack.enter_context(KubeCluster.start())
        finally:
            del os.environ["NO_FAKE_KUBELET"]
        asyncio.run(claim_burst(cluster, claims, args.rate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
