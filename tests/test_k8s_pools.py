"""Warm pod pools on the real API server: free pods claimed atomically by several engines (pool
actors, hubs), a claim that waits for a pod or meets a stale read, pools of different specs kept
apart, the rollout pool actor's logic on the shared pool, and ``aenv rollout`` on Kubernetes end
to end through Ray pool actors.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from aenv_ray import Environment, InstanceSpec, InstanceState
from aenv_ray.bundle import build_bundle
from aenv_ray.hub import HubClient
from envhub.control import INSTANCES, LABEL_STORE
from envhub.keys import Caller
from envhub.registry import VersionRegistry
from envhub.store import open_store
from k8s_backend import KubernetesEngine
from k8s_backend.manifests import (
    CLAIM_FREE,
    LABEL_CLAIM,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_SESSION,
)
from k8s_backend.warm import ANNOTATION_CLAIM, CLAIMED, claim_patch, claimed_by, is_claimable
from rollout._instance_pool import InstancePool
from rollout.lease import Owner
from rollout.spec import PoolSpec
from tests._hub import HubProcess, eventually, new_key, run
from tests._k8s import KubeCluster
from tests._session_ray import SessionRay

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(2400)]

HOST_PODS = pytest.mark.fake_kubelet(
    "warm pools of many pods, and hubs started with AENV_K8S_DELIVERY=host: each pod is this "
    "venv's runtime, up in a second where a real node's pod takes ten"
)

ROOT = Path(__file__).resolve().parent.parent
AENV = [sys.executable, "-m", "aenv_cli"]
SPEC = InstanceSpec("mini-terminal@1.0.0", ttl=600.0, owner="test")


@pytest.fixture(scope="module")
def cluster(kube_cluster: KubeCluster) -> KubeCluster:
    return kube_cluster


@pytest.fixture
def namespace(cluster: KubeCluster, request: pytest.FixtureRequest) -> str:
    name = "p-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    return cluster.namespace(name)


async def _warm(engine: KubernetesEngine, spec: InstanceSpec, pool: str, ready: int) -> None:
    async def enough() -> bool:
        return (await engine.warm_count(spec, pool=pool)).ready >= ready

    await eventually(enough, f"{ready} warm pods ready in pool {pool}", deadline=90)


def _pool_pods(cluster: KubeCluster, namespace: str) -> list[Any]:
    core = k8s_client.CoreV1Api(cluster.api_client())
    return list(core.list_namespaced_pod(namespace, label_selector=LABEL_POOL).items)


# -- pure parts -----------------------------------------------------------------------------------


def test_only_a_free_ready_unexpired_pod_is_claimable_and_a_claim_names_its_claimer() -> None:
    pod: dict[str, Any] = {
        "metadata": {
            "name": "aenv-x-1",
            "resourceVersion": "41",
            "labels": {LABEL_CLAIM: CLAIM_FREE, LABEL_INSTANCE: "1"},
            "annotations": {"aenv-ray.io/expires-at": "2000000000"},
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.3",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    assert is_claimable(pod, now=1_900_000_000)
    assert not is_claimable(pod, now=2_000_000_001)  # past its free expiry
    pending = {**pod, "status": {"phase": "Pending"}}
    assert not is_claimable(pending, now=1_900_000_000)
    patch = claim_patch(pod, claim="c1", expires_at=1_900_000_600, session="s1", owner=None)
    assert patch["metadata"]["resourceVersion"] == "41"  # the precondition
    assert patch["metadata"]["labels"] == {
        LABEL_CLAIM: CLAIMED,
        LABEL_SESSION: "s1",
        "aenv-ray.io/owner": None,  # a merge patch's null removes the label
    }
    taken = {"metadata": {**patch["metadata"], "labels": {LABEL_CLAIM: CLAIMED}}}
    assert claimed_by(taken) == "c1"
    assert claimed_by(pod) is None
    assert not is_claimable(taken, now=1_900_000_000)


# -- on the API server ----------------------------------------------------------------------------


@HOST_PODS
async def test_engines_racing_for_warm_pods_never_get_the_same_pod(
    cluster: KubeCluster, namespace: str
) -> None:
    # the maker reserves nothing (reserve=0): the last part has the rival claim a pod the maker
    # made, which a reserving maker keeps for itself (tests/test_k8s_realnode_warm.py); the
    # rival reserves its own pods during the race
    maker = cluster.engine(namespace, reserve=0)
    rival = cluster.engine(namespace)
    try:
        assert await maker.prewarm(SPEC, pool="race", count=3) == 3
        assert await rival.prewarm(SPEC, pool="race", count=3) == 3
        await _warm(maker, SPEC, "race", 3)
        await _warm(rival, SPEC, "race", 3)
        assert await maker.list() == []  # free pods are nobody's instances yet
        engines = [maker, rival] * 6
        claims = await asyncio.gather(*(e.claim(SPEC, pool="race") for e in engines))
        taken = [info for info in claims if info is not None]
        assert len(taken) == 6  # twelve claimers, six pods: six claims, never one twice
        assert len({info.id for info in taken}) == 6
        assert all(info.state is InstanceState.RUNNING for info in taken)
        assert (await maker.warm_count(SPEC, pool="race")).ready == 0

        pods = {p.metadata.labels[LABEL_INSTANCE]: p for p in _pool_pods(cluster, namespace)}
        assert len(pods) == 6
        assert len({pod.metadata.annotations[ANNOTATION_CLAIM] for pod in pods.values()}) == 6
        assert all(pod.metadata.labels[LABEL_CLAIM] == CLAIMED for pod in pods.values())
        for engine, info in zip(engines, claims, strict=True):  # each pod is its winner's
            if info is not None:
                assert pods[info.id].metadata.labels[LABEL_SESSION] == engine.session
        assert {info.id for info in await rival.list()} == set(pods)

        # a pod one engine made and another claimed is the claimer's: callable, and it
        # outlives its maker, whose close ends only its own session's pods
        await maker.prewarm(SPEC, pool="race", count=1)
        mine = await rival.claim(SPEC, pool="race", timeout=90)
        assert mine is not None
        await maker.aclose()
        assert (await rival.get(mine.id)).state is InstanceState.RUNNING
        async with Environment.adopt(rival, mine) as env:
            result = await env.call_tool("execute_command", {"command": "echo warm"})
            assert "warm" in json.dumps(result.structured)
        assert (await rival.get(mine.id)).state is InstanceState.TERMINATED  # released
    finally:
        await maker.aclose()
        await rival.aclose()


@HOST_PODS
async def test_a_claim_waits_for_a_starting_pod_and_survives_a_stale_read(
    cluster: KubeCluster, namespace: str
) -> None:
    engine = cluster.engine(namespace, reserve=0)  # the PATCH path, whose stale read this checks
    try:
        assert await engine.claim(SPEC, pool="wait") is None  # nothing warm, no wait
        await engine.prewarm(SPEC, pool="wait", count=1)
        first = await engine.claim(SPEC, pool="wait", timeout=90)  # not Ready yet: it waits
        assert first is not None
        assert first.is_running

        await engine.prewarm(SPEC, pool="wait", count=1)
        await _warm(engine, SPEC, "wait", 1)
        (free,) = [
            p
            for p in _pool_pods(cluster, namespace)
            if p.metadata.labels[LABEL_CLAIM] == CLAIM_FREE
        ]
        # someone changes the free pod: the engine's cached version is now stale, so its first
        # PATCH fails its precondition; it reads the pod again and still gets it
        k8s_client.CoreV1Api(cluster.api_client()).patch_namespaced_pod(
            free.metadata.name, namespace, {"metadata": {"annotations": {"touched": "yes"}}}
        )
        second = await engine.claim(SPEC, pool="wait", timeout=30)
        assert second is not None
        assert second.id == free.metadata.labels[LABEL_INSTANCE]
    finally:
        await engine.aclose()


@HOST_PODS
async def test_pools_of_different_specs_never_hand_out_each_others_pods(
    cluster: KubeCluster, namespace: str
) -> None:
    engine = cluster.engine(namespace)
    blue = InstanceSpec("mini-terminal@1.0.0", ttl=600.0, environment_variables={"TEAM": "blue"})
    red = InstanceSpec("mini-terminal@1.0.0", ttl=600.0, environment_variables={"TEAM": "red"})
    try:
        await engine.prewarm(blue, pool="teams", count=1)
        await _warm(engine, blue, "teams", 1)
        assert await engine.claim(red, pool="teams") is None
        assert await engine.claim(blue, pool="other") is None
        got = await engine.claim(blue, pool="teams")
        assert got is not None
        async with Environment.adopt(engine, got) as env:
            result = await env.call_tool("execute_command", {"command": "echo $TEAM"})
            assert "blue" in json.dumps(result.structured)
    finally:
        await engine.aclose()


@HOST_PODS
async def test_pool_actors_share_one_warm_pool_and_refill_it(
    cluster: KubeCluster, namespace: str
) -> None:
    """Two pool actors' logic (InstancePool, no Ray) on two engines: each keeps its share
    warm; leases come from either actor's pods; a release ends the pod; the share refills."""
    spec = PoolSpec("mini-terminal@1.0.0", name="shared", ttl=600.0)
    pools = [
        InstancePool(spec, 2, engine=cluster.engine(namespace)),
        InstancePool(spec, 2, engine=cluster.engine(namespace)),
    ]
    try:
        ready = await asyncio.gather(*(pool.start(wait=90) for pool in pools))
        assert ready == [2, 2]
        owner = Owner(job_id="test")
        # both actors race: six acquires at once for the four warm pods (each actor asks for
        # more than its own two); a pod refilled meanwhile may serve a fifth
        grants = await asyncio.gather(*(pool.acquire(owner) for pool in pools * 3))
        leases = [g.lease for g in grants if g.lease is not None]
        assert len(leases) >= 4
        assert len({lease.instance_id for lease in leases}) == len(leases)  # never one twice
        firsts = [g.lease for g in grants[0::2] if g.lease is not None]  # pools[0]'s
        assert firsts  # it got at least what the other could not take
        result = await pools[0].call_tool(
            firsts[0].lease_id, "execute_command", {"command": "echo hi"}
        )
        assert "hi" in json.dumps(result.structured)
        assert pools[0].report()["counters"]["acquired"] == len(firsts)

        leases = firsts
        await pools[0].release(leases[0].lease_id)
        engine = pools[0]._engine
        assert engine is not None
        assert (await engine.get(leases[0].instance_id)).state is InstanceState.TERMINATED

        async def refilled() -> bool:
            return [pool.ping() for pool in pools] == [2, 2]

        await eventually(refilled, "the pool refilled", deadline=90)
    finally:
        await asyncio.gather(*(pool.close() for pool in pools))
    assert _pool_pods(cluster, namespace) == [] or all(
        p.metadata.deletion_timestamp for p in _pool_pods(cluster, namespace)
    )


@HOST_PODS
async def test_aenv_rollout_runs_its_episodes_on_kubernetes_through_ray_pool_actors(
    cluster: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    watcher = cluster.engine(namespace, session=False, reaper=False)
    await watcher.list()  # watching before the run: it sees every pod come and go
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "host",
        "AENV_ENGINE": "kubernetes",
        "PYTHONPATH": str(ROOT),
    }
    out = tmp_path / "run"
    command = [sys.executable, "-m", "aenv_cli", "rollout", "mini-terminal@1.0.0"]
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [*command, "-n", "4", "-c", "2", "--out", str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        records = [
            json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()
        ]
        assert len(records) == 4
        ids = {record["instance_id"] for record in records}
        assert len(ids) == 4  # a fresh instance per episode
        for iid in ids:  # each was a pod of this namespace, and ended with the run
            info = await watcher.get(iid)
            assert info.env_ref == "mini-terminal@1.0.0"
            assert info.state is InstanceState.TERMINATED
    finally:
        await watcher.aclose()


def _free_ids(cluster: KubeCluster, namespace: str, *, ready: bool = True) -> set[str]:
    """The pool's free pods: the Ready ones (a claim takes only those), or all."""
    return {
        p.metadata.labels[LABEL_INSTANCE]
        for p in _pool_pods(cluster, namespace)
        if p.metadata.labels.get(LABEL_CLAIM) == CLAIM_FREE
        and not p.metadata.deletion_timestamp
        and (
            not ready
            or any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        )
    }


@HOST_PODS
async def test_hubs_keep_a_shared_warm_pool_and_their_creates_claim_from_it(
    cluster: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    """Two hubs of one store on one namespace, each with a data dir of its own (where each
    unpacks the published version it keeps warm), started at once, each told to keep 3 free: 3
    free in all (one pool, keyed by the bundle's digest, not the directory; one target, counted
    across hubs, filled one hub at a time), a plain create claims one (no pod start), the pool
    refills to 3 again, and a create asking for variables starts a pod of its own."""
    env = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "host",
    }
    project = tmp_path / "warmterm"
    shutil.copytree(ROOT / "builtin_envs" / "mini_terminal", project)
    config = json.loads((project / "config.json").read_text())
    (project / "config.json").write_text(json.dumps({**config, "name": "warmterm"}))
    ref = f"warmterm@{config['version']}"
    warm = ["--warm", f"alice/{ref}=3"]
    first = HubProcess(tmp_path / "one", engine="kubernetes", env=env, extra=warm)
    second = HubProcess(
        tmp_path / "two", store=first.store, engine="kubernetes", env=env, extra=warm
    )
    key = new_key("alice", first.store)
    store = await open_store(first.store)
    try:
        await VersionRegistry(store).publish(Caller("alice"), build_bundle(project).data)
    finally:
        await store.aclose()
    try:
        # both start-ups count the pool at the same moment
        await asyncio.gather(asyncio.to_thread(first.start), asyncio.to_thread(second.start))

        async def three_free() -> set[str] | None:
            free = _free_ids(cluster, namespace)
            return free if len(free) == 3 else None

        before = await eventually(three_free, "three free pods in the shared pool", deadline=120)
        assert len(_free_ids(cluster, namespace, ready=False)) == 3  # none more starting
        async with HubClient(first.url, api_key=key) as hub:
            record = await hub.create_instance(ref, ttl=600)
            assert record["id"] in before  # claimed, not started
            assert await run(record, "echo claimed") == "claimed"
            taken = await eventually(three_free, "the pool refilled", deadline=120)
            assert record["id"] not in taken
            # two hubs, each keeping three: still three free in all, Ready or starting
            assert len(_free_ids(cluster, namespace, ready=False)) == 3

            own = await hub.create_instance(ref, ttl=600, environment_variables={"TEAM": "red"})
            assert own["id"] not in taken  # asked for more than a free pod has: a new pod
            assert await run(own, "echo $TEAM") == "red"
            for made in (record, own):
                await hub.delete_instance(made["id"])
    finally:
        first.close()
        second.close()


@HOST_PODS
async def test_a_hub_killed_mid_create_reclaims_the_pods_it_never_recorded(
    cluster: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    """SIGKILL of a hub while its creates' pods start: the pods have no record (and, a hub's
    engine having no session, nothing else would end them before their TTL); the restarted
    hub deletes them, and the tenant's quota holds exactly what it sees again."""
    env = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "host",
    }
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"default": {"instances": 3, "per_request": 3, "ttl": "1h"}}))
    hub = HubProcess(
        tmp_path / "hub", engine="kubernetes", env=env, extra=["--limits", str(limits)]
    )
    key = new_key("alice", hub.store)
    core = k8s_client.CoreV1Api(cluster.api_client())

    def hub_pods() -> dict[str, Any]:
        """The namespace's pods a hub made that are not being deleted, by instance id."""
        pods = core.list_namespaced_pod(namespace, label_selector=LABEL_STORE).items
        return {
            p.metadata.labels[LABEL_INSTANCE]: p for p in pods if not p.metadata.deletion_timestamp
        }

    async def recorded() -> set[str]:
        store = await open_store(hub.store)
        try:
            return set(await store.list(INSTANCES))
        finally:
            await store.aclose()

    with hub:
        async with HubClient(hub.url, api_key=key) as client:
            burst = [
                asyncio.create_task(client.create_instance("mini-terminal@1.0.0", ttl="1h"))
                for _ in range(3)
            ]

            async def sent() -> dict[str, Any]:
                return await asyncio.to_thread(hub_pods)

            await eventually(sent, "the hub sent a first pod", deadline=120)
            hub.kill()  # a crash while its pods start: no record, no cleanup
            await asyncio.gather(*burst, return_exceptions=True)
        orphans = set(hub_pods()) - await recorded()
        assert orphans, "control: the crash must leave pods the hub never recorded"
        for pod in hub_pods().values():  # a hub's pods: no session to end them with it
            assert LABEL_SESSION not in (pod.metadata.labels or {})

        hub.start()  # the restarted hub reclaims them

        async def reclaimed() -> bool:
            return not orphans & set(await asyncio.to_thread(hub_pods))

        await eventually(reclaimed, "the pods without a record deleted", deadline=60)
        assert set(hub_pods()) <= await recorded()
        async with HubClient(hub.url, api_key=key) as client:  # the quota is whole again
            for doc in await client.list_instances():
                await client.delete_instance(doc["id"])
            made = await asyncio.gather(
                *(client.create_instance("mini-terminal@1.0.0", ttl=600) for _ in range(3))
            )
            assert set(hub_pods()) == {d["id"] for d in made}
            for doc in made:
                await client.delete_instance(doc["id"])


def test_warm_pools_need_an_engine_that_keeps_them(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aenv_cli", "serve", "--warm", "mini-terminal@1.0.0=2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "--engine kubernetes" in done.stderr


@HOST_PODS
async def test_aenv_rollout_through_a_hub_claims_its_warm_pods_and_calls_through_its_proxy(
    cluster: KubeCluster, namespace: str, tmp_path: Path, session_ray: SessionRay
) -> None:
    """With a hub configured, the Ray pool's actors create through the hub (which claims from
    its warm pool) and, told to (AENV_HUB_ROUTE=proxy, as when pod IPs are not routable from
    the Ray cluster), call through the hub's proxy. The run joins the session's Ray: its pool
    actors get the hub engine the driver made, so nothing of theirs comes from their own
    environment."""
    env = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "host",
    }
    hub = HubProcess(
        tmp_path / "hub", engine="kubernetes", env=env, extra=["--warm", "mini-terminal@1.0.0=2"]
    )
    key = new_key("alice", hub.store)
    with hub:

        async def two_free() -> set[str] | None:
            free = _free_ids(cluster, namespace)
            return free if len(free) == 2 else None

        warm = await eventually(two_free, "two free pods", deadline=120)
        out = tmp_path / "run"
        driver_env = {
            **os.environ,
            "AENV_SYSTEM_URL": hub.url,
            "AENV_API_KEY": key,
            "AENV_HUB_ROUTE": "proxy",
            "PYTHONPATH": str(ROOT),
            **session_ray.env,
        }
        done = await asyncio.to_thread(
            subprocess.run,
            [*AENV, "rollout", "mini-terminal@1.0.0", "-n", "3", "-c", "2", "--out", str(out)],
            cwd=ROOT,
            env=driver_env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (out / "trajectories.jsonl").read_text().splitlines()
        ids = {json.loads(line)["instance_id"] for line in lines}
        assert len(ids) == 3
        assert ids & warm  # the pool's first instances were the hub's warm pods
        async with HubClient(hub.url, api_key=key) as client:
            for iid in ids:  # every instance was the hub's, the tenant's, and is over
                record = await client.get_instance(iid)
                assert record["state"] == "terminated"
