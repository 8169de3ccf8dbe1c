"""Services on Kubernetes, end to end: a real ``aenv serve --engine kubernetes`` on the real API
server, driven by ``aenv service ...`` and the SDK's hub client. A service is a Deployment, a
Service and (with ``--enable-storage``) a PersistentVolumeClaim: scaled 1 -> 3 -> 1 with the
Endpoints following, calls through the hub's service proxy reaching every replica, variables
rolled new-first, storage kept by a delete unless asked, another tenant answered 404, and a
replica the cluster refuses reported with the cluster's reason.

What the three objects say is read by pure functions (:mod:`k8s_backend.service_controller`),
tested first on the states a real kubelet reports and a test cluster cannot produce.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from aenv_ray.engine import service_engine
from aenv_ray.errors import (
    CapacityError,
    ConfigurationError,
    ServiceNotFoundError,
)
from aenv_ray.hub import HubClient
from aenv_ray.protocol import TOKEN_SHA256_ENV
from k8s_backend.service_controller import is_serving, service_info, service_problem
from k8s_backend.services import LABEL_SERVICE, service_name, storage_claim_name
from k8s_backend.tokens import TokenKey, digest
from tests._hub import HubProcess, aenv, new_key, raw, run
from tests._k8s import KubeCluster

MINI = "mini-terminal@1.0.0"
WHO = "echo $AENV_INSTANCE_ID"
KEY = TokenKey(b"k" * 32, "rl")
TOKEN = KEY.token("service/s1", "n0")  # what the Deployment below is given the digest of

# -- what the objects say -------------------------------------------------------------------------


def _deployment(wanted: int = 1, **status: Any) -> dict[str, Any]:
    """A Deployment of service ``s1`` asking ``wanted`` replicas, with ``status``."""
    return {
        "metadata": {
            "name": "aenv-svc-s1",
            "generation": 2,
            "labels": {LABEL_SERVICE: "s1"},
            "annotations": {
                "aenv-ray.io/service-id": "s1",
                "aenv-ray.io/env-ref": MINI,
                "aenv-ray.io/token-nonce": "n0",
            },
        },
        "spec": {
            "replicas": wanted,
            "selector": {"matchLabels": {LABEL_SERVICE: "s1"}},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "r.io/mini-terminal:1.0.0",
                            "ports": [{"containerPort": 8080}],
                            "env": [
                                {"name": "POD_IP", "valueFrom": {"fieldRef": {}}},
                                {"name": TOKEN_SHA256_ENV, "value": digest(TOKEN)},
                            ],
                        }
                    ],
                    "volumes": [{"name": "storage", "persistentVolumeClaim": {"claimName": "x"}}],
                }
            },
        },
        "status": {"observedGeneration": 2, **status},
    }


def _pod(name: str, ip: str, *, ready: bool = True, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "phase": "Running" if ready else "Pending",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **status,
        },
    }


def _endpoints(*ips: str) -> dict[str, Any]:
    return {
        "subsets": [
            {
                "addresses": [{"ip": ip} for ip in ips],
                "ports": [{"name": "runtime", "port": 8080}],
            }
        ]
    }


def test_a_serving_service_is_read_from_its_three_objects() -> None:
    deployment = _deployment(2, replicas=2, updatedReplicas=2, readyReplicas=2)
    pods = [_pod("p1", "10.0.0.1"), _pod("p2", "10.0.0.2")]
    endpoints = _endpoints("10.0.0.2", "10.0.0.1")
    assert is_serving(deployment, endpoints, pods)
    token = KEY.of_service(deployment)  # the replicas' token, derived: the Deployment has none
    assert token == TOKEN
    assert TOKEN not in str(deployment)
    assert TokenKey(b"x" * 32, "rl").of_service(deployment) is None  # another key: none
    info = service_info(deployment, endpoints, pods, namespace="rl", token=token)
    assert (info.id, info.env_ref, info.replicas, info.ready) == ("s1", MINI, 2, 2)
    assert info.endpoints == ("http://10.0.0.1:8080", "http://10.0.0.2:8080")
    assert info.instances == ("p1", "p2")
    assert info.url == "http://aenv-svc-s1.rl.svc:8080"
    assert info.storage == storage_claim_name("s1")
    assert (info.token, info.detail) == (TOKEN, "")
    assert TOKEN not in repr(info)


@pytest.mark.parametrize(
    ("deployment", "endpoints", "pods"),
    [
        # the controller has not seen the latest spec yet
        (_deployment(1, replicas=1, updatedReplicas=1, readyReplicas=1) | {"status": {}},
         _endpoints("10.0.0.1"), [_pod("p1", "10.0.0.1")]),
        # a rollout: an old replica is still counted
        (_deployment(1, replicas=2, updatedReplicas=1, readyReplicas=2),
         _endpoints("10.0.0.1", "10.0.0.2"), [_pod("p1", "10.0.0.1"), _pod("p2", "10.0.0.2")]),
        # the Endpoints lag behind the ready pod
        (_deployment(1, replicas=1, updatedReplicas=1, readyReplicas=1),
         {}, [_pod("p1", "10.0.0.1")]),
        # the Endpoints still list a replica that is gone
        (_deployment(1, replicas=1, updatedReplicas=1, readyReplicas=1),
         _endpoints("10.0.0.1", "10.0.0.9"), [_pod("p1", "10.0.0.1")]),
    ],
)  # fmt: skip
def test_a_service_between_states_is_not_serving(
    deployment: dict[str, Any], endpoints: dict[str, Any], pods: list[dict[str, Any]]
) -> None:
    assert not is_serving(deployment, endpoints, pods)


def test_no_replicas_is_serving_once_observed() -> None:
    assert is_serving(_deployment(0), {}, [])


def test_why_replicas_do_not_serve_in_the_clusters_words() -> None:
    quota = _deployment(
        conditions=[
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": 'pods "p" is forbidden: exceeded quota: q, requested: pods=1',
            }
        ]
    )
    problem = service_problem(quota, [])
    assert isinstance(problem, CapacityError)
    assert "exceeded quota: q" in str(problem)
    assert "aenv-svc-s1" in str(problem)

    unschedulable = _pod(
        "p1",
        "",
        ready=False,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu.",
            }
        ],
    )
    problem = service_problem(_deployment(), [unschedulable])
    assert isinstance(problem, CapacityError)
    assert "3 Insufficient cpu" in str(problem)

    pull = _pod(
        "p1",
        "",
        ready=False,
        containerStatuses=[
            {
                "name": "runtime",
                "image": "r.io/mini-terminal:9.9.9",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
            }
        ],
    )
    problem = service_problem(_deployment(), [pull])
    assert isinstance(problem, ConfigurationError)
    assert "r.io/mini-terminal:9.9.9" in str(problem)
    assert "ImagePullBackOff" in str(problem)

    crash = _pod(
        "p1",
        "10.0.0.1",
        ready=False,
        containerStatuses=[
            {
                "name": "runtime",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}},
            }
        ],
    )
    problem = service_problem(_deployment(), [crash])
    assert isinstance(problem, ConfigurationError)
    assert "keeps exiting" in str(problem)
    assert "exit code 3" in str(problem)
    # what the info says too
    info = service_info(_deployment(), {}, [crash], namespace="rl")
    assert (info.ready, info.detail) == (0, str(problem))

    # a ready replica, or one still starting, is no problem
    assert service_problem(_deployment(), [_pod("p1", "10.0.0.1")]) is None
    assert service_problem(_deployment(), [_pod("p1", "", ready=False)]) is None


def test_the_kubernetes_engine_keeps_services_and_the_local_one_does_not() -> None:
    from local_backend import LocalEngine

    assert service_engine(LocalEngine()) is None
    assert service_engine(object()) is None


@pytest.mark.k8s
@pytest.mark.timeout(2400)
def test_the_kubernetes_engine_offers_services(kube_cluster: KubeCluster) -> None:
    engine = kube_cluster.engine("default", session=False)
    try:
        assert service_engine(engine) is engine.services
        assert engine.services.namespace == "default"
    finally:
        engine.close()


# -- a hub on the real API server -----------------------------------------------------------------


@dataclass(frozen=True)
class K8sHub:
    proc: HubProcess
    namespace: str
    api: Any  # kubernetes.client.ApiClient
    alice: str
    bob: str

    @property
    def url(self) -> str:
        return self.proc.url


@pytest.fixture(scope="module")
def k8s_hub(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[K8sHub]:
    with kube_cluster.scratch_namespace("svc-hub") as (api, namespace):
        env = {
            "KUBECONFIG": str(kube_cluster.kubeconfig),
            "AENV_K8S_NAMESPACE": namespace,
            **kube_cluster.settings_env(),
        }
        proc = HubProcess(tmp_path_factory.mktemp("k8s-hub"), engine="kubernetes", env=env)
        alice, bob = new_key("alice", proc.store), new_key("bob", proc.store)
        with proc:
            yield K8sHub(proc, namespace, api, alice, bob)


@pytest.fixture
async def alice(k8s_hub: K8sHub) -> AsyncIterator[HubClient]:
    async with HubClient(k8s_hub.url, api_key=k8s_hub.alice) as client:
        yield client


def _cli(hub: K8sHub, *args: str) -> subprocess.CompletedProcess[str]:
    return aenv("service", *args, env={"AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": hub.alice})


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _wait(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _pods(hub: K8sHub, sid: str) -> dict[str, str]:
    """The service's live pods, all Ready: {name: IP} (None while one is not)."""
    from kubernetes import client

    pods = client.CoreV1Api(hub.api).list_namespaced_pod(
        hub.namespace, label_selector=f"{LABEL_SERVICE}={sid}"
    )
    live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
    ready = all(
        any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        for p in live
    )
    return {p.metadata.name: p.status.pod_ip for p in live} if ready else {}


def _endpoint_ips(hub: K8sHub, sid: str) -> set[str]:
    from kubernetes import client

    endpoints = client.CoreV1Api(hub.api).read_namespaced_endpoints(
        service_name(sid), hub.namespace
    )
    return {a.ip for s in endpoints.subsets or [] for a in s.addresses or []}


def _gone(read: Callable[[], Any]) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as exc:
        return exc.status == 404
    return False


@pytest.mark.k8s
@pytest.mark.timeout(2400)  # the first k8s test may pay for the cluster's one-time build
async def test_a_service_scales_up_and_down_through_the_cli(k8s_hub: K8sHub) -> None:
    from kubernetes import client

    hub = k8s_hub
    apps, core = client.AppsV1Api(hub.api), client.CoreV1Api(hub.api)
    made = _json(
        _cli(hub, "create", "mini-terminal", "--replicas", "1", "-e", "STAGE=one", "--json")
    )
    sid = made["id"]
    try:
        assert (made["replicas"], made["ready"], made["env_ref"]) == (1, 1, MINI)
        assert made["url"] == f"http://{service_name(sid)}.{hub.namespace}.svc:8080"
        assert made["storage"] is None
        assert made["address"] == f"{hub.url}/v1/services/{sid}/proxy"
        deployment = apps.read_namespaced_deployment(service_name(sid), hub.namespace)
        assert deployment.spec.replicas == 1
        assert deployment.spec.template.metadata.labels["aenv.tenant"] == "alice"
        assert core.read_namespaced_service(service_name(sid), hub.namespace)
        assert set(made["instances"]) == set(_pods(hub, sid))
        # the hub keeps no replicas of its own: the Deployment's pods are the service
        listed = aenv(
            "instance",
            "list",
            "--json",
            env={"AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": hub.alice},
        )
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == []

        # up to three: three pods Ready, the Endpoints follow, the proxy reaches each
        up = _json(_cli(hub, "update", sid, "--replicas", "3", "--json"))
        assert (up["replicas"], up["ready"], len(up["endpoints"])) == (3, 3, 3)
        pods = _pods(hub, sid)
        assert set(pods) == set(up["instances"])
        assert _endpoint_ips(hub, sid) == set(pods.values())
        assert {f"http://{ip}:8080" for ip in pods.values()} == set(up["endpoints"])
        assert set(made["instances"]) <= set(up["instances"])  # scaling replaces no one
        seen = [await run(up["address"], WHO, key=hub.alice) for _ in range(6)]
        assert set(seen) == set(pods)
        assert {await run(up["address"], "echo $STAGE", key=hub.alice) for _ in range(3)} == {"one"}
        # the stable address's replicas answer their tenant with the service's token
        status, _, _ = await raw("GET", up["endpoints"][0] + "/health")
        assert status == 401
        status, _, body = await raw("GET", up["endpoints"][0] + "/health", key=up["token"])
        assert (status, body["success"]) == (200, True)
        # ... which neither the Deployment nor a replica's pod holds (their digest only)
        stored = json.dumps(
            [
                hub.api.sanitize_for_serialization(o)
                for o in (
                    apps.read_namespaced_deployment(service_name(sid), hub.namespace),
                    *core.list_namespaced_pod(
                        hub.namespace, label_selector=f"{LABEL_SERVICE}={sid}"
                    ).items,
                )
            ]
        )
        assert digest(up["token"]) in stored  # control: the dump is the whole objects
        assert up["token"] not in stored

        # down to one: the others end, the Endpoints follow
        down = _json(_cli(hub, "update", sid, "--replicas", "1", "--json"))
        assert (down["replicas"], down["ready"], len(down["instances"])) == (1, 1, 1)
        assert set(down["instances"]) <= set(up["instances"])
        _wait("two replicas to end", lambda: len(_pods(hub, sid)) == 1)
        assert _endpoint_ips(hub, sid) == set(_pods(hub, sid).values())
        assert await run(down["address"], WHO, key=hub.alice) == down["instances"][0]

        # new variables roll the replica new-first
        changed = _json(_cli(hub, "update", sid, "-e", "STAGE=two", "--json"))
        assert changed["environment_variables"] == {"STAGE": "two"}
        assert (changed["replicas"], changed["ready"]) == (1, 1)
        assert not set(changed["instances"]) & set(down["instances"])
        assert await run(changed["address"], "echo $STAGE", key=hub.alice) == "two"
        assert await run(changed["address"], WHO, key=hub.alice) == changed["instances"][0]
        assert changed["token"] == up["token"]  # the rolled replicas keep the service's token

        shown = _cli(hub, "get", sid)
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"^replicas\s+1/1 ready$", shown.stdout, re.M)
        assert re.search(rf"^url\s+{re.escape(made['url'])}$", shown.stdout, re.M)
        table = _cli(hub, "list")
        assert sid in table.stdout
        assert "1/1" in table.stdout
    finally:
        deleted = _cli(hub, "delete", sid)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == f"deleted service {sid}"
    assert _gone(lambda: apps.read_namespaced_deployment(service_name(sid), hub.namespace))
    assert _gone(lambda: core.read_namespaced_service(service_name(sid), hub.namespace))
    _wait(
        "the replicas to go",
        lambda: (
            not core.list_namespaced_pod(
                hub.namespace, label_selector=f"{LABEL_SERVICE}={sid}"
            ).items
        ),
    )
    gone = _cli(hub, "get", sid)
    assert gone.returncode == 2
    assert sid in gone.stderr


@pytest.mark.k8s
@pytest.mark.timeout(600)
async def test_storage_is_a_claim_that_a_delete_keeps_unless_asked(k8s_hub: K8sHub) -> None:
    from kubernetes import client

    hub = k8s_hub
    core = client.CoreV1Api(hub.api)
    kept = _json(_cli(hub, "create", "mini-terminal", "--enable-storage", "--json"))
    claim = storage_claim_name(kept["id"])
    assert kept["storage"] == claim
    found = core.read_namespaced_persistent_volume_claim(claim, hub.namespace)
    assert found.metadata.annotations["aenv-ray.io/service-id"] == kept["id"]
    # every replica mounts it at /storage (the test cluster does not materialise volumes)
    deployment = client.AppsV1Api(hub.api).read_namespaced_deployment(
        service_name(kept["id"]), hub.namespace
    )
    volumes = {v.name: v for v in deployment.spec.template.spec.volumes}
    assert volumes["storage"].persistent_volume_claim.claim_name == claim

    done = _cli(hub, "delete", kept["id"])
    assert done.returncode == 0, done.stderr
    still = core.read_namespaced_persistent_volume_claim(claim, hub.namespace)
    assert still.metadata.deletion_timestamp is None  # kept by default
    assert _gone(
        lambda: client.AppsV1Api(hub.api).read_namespaced_deployment(
            service_name(kept["id"]), hub.namespace
        )
    )

    dropped = _json(_cli(hub, "create", "mini-terminal", "--enable-storage", "--json"))
    other = storage_claim_name(dropped["id"])
    assert core.read_namespaced_persistent_volume_claim(other, hub.namespace)
    done = _cli(hub, "delete", dropped["id"], "--delete-storage")
    assert done.returncode == 0, done.stderr

    def deleted() -> bool:
        try:
            pvc = core.read_namespaced_persistent_volume_claim(other, hub.namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return pvc.metadata.deletion_timestamp is not None  # held until its pods are gone

    _wait("the claim to be deleted", deleted)
    core.delete_namespaced_persistent_volume_claim(claim, hub.namespace)


@pytest.mark.k8s
@pytest.mark.timeout(600)
async def test_another_tenant_gets_404(k8s_hub: K8sHub, alice: HubClient) -> None:
    hub = k8s_hub
    svc = await alice.create_service(MINI, replicas=0)
    sid = svc["id"]
    try:
        assert (svc["replicas"], svc["ready"], svc["endpoints"]) == (0, 0, [])
        async with HubClient(hub.url, api_key=hub.bob) as bob:
            for call in (
                lambda: bob.get_service(sid),
                lambda: bob.update_service(sid, replicas=2),
                lambda: bob.delete_service(sid, keep_storage=False),
            ):
                with pytest.raises(ServiceNotFoundError, match=sid):
                    await call()
            assert sid not in [s["id"] for s in await bob.list_services()]
        status, _, body = await raw("GET", f"{svc['address']}/health", key=hub.bob)
        assert (status, body["type"]) == (404, "ServiceNotFoundError")
        # untouched for its owner
        mine = await alice.get_service(sid)
        assert (mine["replicas"], mine["tenant"]) == (0, "alice")
        # no replica serves: the proxy says so
        status, _, body = await raw("GET", f"{svc['address']}/health", key=hub.alice)
        assert (status, body["type"]) == (503, "CapacityError")
    finally:
        await alice.delete_service(sid)
    with pytest.raises(ServiceNotFoundError):
        await alice.get_service(sid)


@pytest.mark.k8s
@pytest.mark.timeout(600)
async def test_replicas_the_cluster_refuses_are_reported_with_its_reason(
    k8s_hub: K8sHub, alice: HubClient
) -> None:
    from kubernetes import client

    hub = k8s_hub
    core = client.CoreV1Api(hub.api)
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    core.create_namespaced_resource_quota(hub.namespace, quota)
    sid = None
    try:
        _wait(
            "the quota's status",
            lambda: core.read_namespaced_resource_quota("no-pods", hub.namespace).status.hard,
        )
        with pytest.raises(CapacityError, match="exceeded quota") as refused:
            await alice.create_service(MINI, name="refused", replicas=1)
        assert "ResourceQuota" in str(refused.value)
        (record,) = [s for s in await alice.list_services() if s["name"] == "refused"]
        sid = record["id"]
        assert (record["replicas"], record["ready"]) == (1, 0)
        assert "exceeded quota: no-pods" in record["detail"]
        shown = _cli(hub, "get", sid)
        assert re.search(r"^detail\s+.*exceeded quota: no-pods", shown.stdout, re.M)
    finally:
        core.delete_namespaced_resource_quota("no-pods", hub.namespace)

    # once the quota is gone the cluster starts the replica by itself
    async def serving() -> bool:
        now = await alice.get_service(sid)
        return bool(now["ready"] == 1 and not now["detail"])

    deadline = time.monotonic() + 180
    while not await serving():
        assert time.monotonic() < deadline, "the replica never started after the quota went"
        await asyncio.sleep(0.1)
    await alice.delete_service(sid)
