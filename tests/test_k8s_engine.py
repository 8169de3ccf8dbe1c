"""The Kubernetes engine beyond the conformance kit: what a pod's status means (every state a real
kubelet reports, as API objects), API errors translated into the error tree (from the real API
server, and from a loopback stand-in for the answers no test cluster gives on demand: 429, 503,
a watch's 410), and on the real API server: a pod deleted behind the engine's back, the reaper
across an engine restart, a dead engine's pods reclaimed, the SDK on the engine, engines by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client as k8s_client

from aenv_ray import (
    AEnvError,
    AuthenticationError,
    CapacityError,
    ClusterConflictError,
    ClusterUnreachableError,
    ConfigurationError,
    Environment,
    EnvironmentState,
    InstanceBrokenError,
    InstanceNotFoundError,
    InstanceSpec,
    InstanceState,
    NotSupportedError,
    PermissionDeniedError,
    TerminationReason,
)
from aenv_ray.engine import new_engine
from k8s_backend import KubernetesEngine
from k8s_backend._api import Kube, WatchExpired, connect, translate
from k8s_backend._cache import PodCache
from k8s_backend.manifests import ANNOTATION_ENV, ANNOTATION_EXPIRES, LABEL_INSTANCE
from k8s_backend.state import pod_info, pull_error, slim, startup_failure, startup_wait
from tests._hub import eventually
from tests._k8s import KubeCluster

REPO = str(Path(__file__).resolve().parent.parent)
SPEC = InstanceSpec("mini-terminal@1.0.0", ttl=600.0)


def _pod(status: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "aenv-demo-ab12",
            "labels": {LABEL_INSTANCE: "ab12", "team": "rl"},
            "annotations": {ANNOTATION_ENV: "demo@1.0.0", ANNOTATION_EXPIRES: "2000000000.0"},
            **meta,
        },
        "spec": {"containers": [{"name": "runtime", "image": "r.io/demo:1.0.0"}]},
        "status": status,
    }


# -- what a pod says ------------------------------------------------------------------------------


def test_a_ready_pod_is_running_at_its_ip_and_keeps_only_the_users_labels() -> None:
    ready = {
        "phase": "Running",
        "podIP": "10.0.0.7",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    info = pod_info(_pod(ready))
    assert info.state is InstanceState.RUNNING
    assert info.url == "http://10.0.0.7:8080"
    assert dict(info.labels) == {"team": "rl"}
    not_ready = {**ready, "conditions": [{"type": "Ready", "status": "False"}]}
    assert pod_info(_pod(not_ready)).state is InstanceState.PENDING


@pytest.mark.parametrize(
    ("status", "reason", "words"),
    [
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "runtime", "state": {"terminated": {"reason": "OOMKilled"}}}
                ],
            },
            TerminationReason.OUT_OF_MEMORY,
            "OOMKilled",
        ),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "node low on disk"},
            TerminationReason.CRASHED,
            "evicted: node low on disk",
        ),
        (
            {"phase": "Failed", "reason": "DeadlineExceeded"},
            TerminationReason.EXPIRED,
            "activeDeadlineSeconds",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "runtime",
                        "state": {"terminated": {"reason": "Error", "exitCode": 70}},
                    }
                ],
            },
            TerminationReason.CRASHED,
            "code 70",
        ),
    ],
)
def test_an_ended_pod_keeps_the_reason_the_cluster_gives(
    status: dict[str, Any], reason: TerminationReason, words: str
) -> None:
    info = pod_info(_pod(status))
    assert info.state is InstanceState.TERMINATED
    assert info.reason is reason
    assert words in info.detail
    assert info.url is None


def test_a_deleted_pod_is_expired_past_its_deadline_and_deleted_before_it() -> None:
    running = {"phase": "Running", "podIP": "10.0.0.7"}
    early = _pod(running, deletionTimestamp="2020-01-01T00:00:00Z", deletionGracePeriodSeconds=1)
    assert pod_info(early).reason is TerminationReason.DELETED
    late = _pod(running, deletionTimestamp="2040-01-01T00:00:00Z")
    assert pod_info(late).reason is TerminationReason.EXPIRED
    # what this process knows wins over the inference: it deleted it, or its session ended
    hinted = pod_info(early, deleted=True, reason=TerminationReason.OWNER_GONE)
    assert hinted.reason is TerminationReason.OWNER_GONE


def test_a_pod_that_will_never_start_says_why_as_the_error_its_create_raises() -> None:
    unschedulable = _pod(
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient memory.",
                }
            ],
        }
    )
    error = startup_failure(unschedulable)
    assert isinstance(error, CapacityError)
    assert "3 Insufficient memory" in str(error)
    pulling = _pod(
        {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "runtime",
                    "image": "r.io/demo:1.0.0",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ],
        }
    )
    error = startup_failure(pulling)
    assert isinstance(error, ConfigurationError)
    assert "r.io/demo:1.0.0" in str(error)
    assert "ImagePullBackOff" in str(error)
    assert startup_failure(_pod({"phase": "Pending"})) is None


def _unschedulable(message: str) -> dict[str, Any]:
    return _pod(
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        }
    )


@pytest.mark.parametrize(
    "message",
    [
        # a claim the provisioner binds a second later (seen on the real node)
        "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims.",
        "0/2 nodes are available: 1 node(s) had taint {node.kubernetes.io/not-ready: }, that the "
        "pod didn't tolerate, 1 node(s) had taint {node.kubernetes.io/memory-pressure: }, that "
        "the pod didn't tolerate.",
        "0/1 nodes are available: 1 node(s) had taint {node.kubernetes.io/disk-pressure: }, that "
        "the pod didn't tolerate. preemption: 0/1 nodes are available: 1 Preemption is not "
        "helpful for scheduling.",
    ],
)
def test_a_scheduling_wait_that_passes_by_itself_is_waited_on_and_quoted(message: str) -> None:
    pod = _unschedulable(message)
    assert startup_failure(pod) is None  # the create keeps waiting within its deadline
    assert startup_wait(pod) == f"not scheduled: {message}"
    assert pod_info(pod).detail == f"not scheduled: {message}"


@pytest.mark.parametrize(
    "message",
    [
        "0/3 nodes are available: 3 Insufficient cpu.",
        # one passing reason does not make the others pass
        "0/2 nodes are available: 1 Insufficient memory, 1 node(s) had taint "
        "{node.kubernetes.io/not-ready: }, that the pod didn't tolerate.",
        '0/1 nodes are available: 1 persistentvolumeclaim "data" not found.',
        "0/1 nodes are available: 1 node(s) were unschedulable.",
    ],
)
def test_a_scheduling_refusal_that_needs_a_person_fails_at_once(message: str) -> None:
    error = startup_failure(_unschedulable(message))
    assert isinstance(error, CapacityError)
    assert message.rstrip(".") in str(error)


def test_an_image_being_pulled_is_a_wait_not_a_failure() -> None:
    pod = _pod(
        {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "runtime", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        }
    )
    assert startup_failure(pod) is None
    assert startup_wait(pod) == "container runtime: ContainerCreating"


def test_a_failed_pull_is_retried_and_the_back_off_after_it_fails_with_its_reason() -> None:
    """As the real node reports a missing image: ErrImagePull with the registry's answer (the
    kubelet tries again: a wait), then ImagePullBackOff, whose own message is only "Back-off
    pulling image": the create's error quotes the failed pull it saw before."""

    def waiting(reason: str, message: str) -> dict[str, Any]:
        state = {"waiting": {"reason": reason, "message": message}}
        return _pod(
            {
                "phase": "Pending",
                "containerStatuses": [{"name": "runtime", "image": "r.io/x:1", "state": state}],
            }
        )

    failed = waiting("ErrImagePull", 'failed to resolve reference "r.io/x:1": not found')
    assert startup_failure(failed) is None
    assert "ErrImagePull" in startup_wait(failed)
    assert "not found" in startup_wait(failed)
    said = pull_error(failed)
    backing_off = waiting("ImagePullBackOff", 'Back-off pulling image "r.io/x:1"')
    assert pull_error(backing_off) == ""
    error = startup_failure(backing_off, pull_error=said)
    assert isinstance(error, ConfigurationError)
    assert "r.io/x:1" in str(error)
    assert "ImagePullBackOff" in str(error)
    assert 'the pull failed with: failed to resolve reference "r.io/x:1": not found' in str(error)


def test_an_out_of_memory_end_names_the_limit_it_passed() -> None:
    pod = _pod(
        {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "runtime", "state": {"terminated": {"reason": "OOMKilled"}}}
            ],
        }
    )
    pod["spec"]["containers"][0]["resources"] = {"limits": {"memory": "256Mi", "cpu": "1"}}
    info = pod_info(slim(pod))  # what the watch's cache keeps holds the limit
    assert info.reason is TerminationReason.OUT_OF_MEMORY
    assert "OOMKilled" in info.detail
    assert "its limit, 256Mi" in info.detail
    evicted = _pod(
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."}
    )
    evicted["spec"]["containers"][0]["resources"] = {"limits": {"memory": "2Gi"}}
    assert pod_info(evicted).detail == (
        "its pod was evicted: The node was low on memory. (its memory limit: 2Gi)"
    )


# -- API errors, translated in one place ----------------------------------------------------------


def test_each_status_becomes_its_own_error() -> None:
    def status(code: int, reason: str, message: str, **details: Any) -> Any:
        body = {"kind": "Status", "reason": reason, "message": message, "details": details}
        return translate(code, body, what="create pod p")

    assert isinstance(status(401, "Unauthorized", "Unauthorized"), AuthenticationError)
    forbidden = status(403, "Forbidden", 'pods is forbidden: User "bob" cannot create')
    assert isinstance(forbidden, PermissionDeniedError)
    assert "deploy/role.yaml" in str(forbidden)
    quota = status(403, "Forbidden", "exceeded quota: compute, requested: pods=1")
    assert isinstance(quota, CapacityError)
    missing = status(404, "NotFound", 'namespaces "rl" not found', kind="namespaces", name="rl")
    assert isinstance(missing, ConfigurationError)
    assert "kubectl create namespace rl" in str(missing)
    assert isinstance(status(409, "AlreadyExists", "exists"), ClusterConflictError)
    invalid = translate(
        422,
        {
            "reason": "Invalid",
            "message": "Pod is invalid",
            "details": {"causes": [{"field": "metadata.labels", "message": "bad value"}]},
        },
        what="create pod p",
    )
    assert isinstance(invalid, ConfigurationError)
    assert "metadata.labels: bad value" in str(invalid)
    assert isinstance(status(503, "ServiceUnavailable", "etcd down"), ClusterUnreachableError)


class _StandIn(BaseHTTPRequestHandler):
    """Answers as an API server would for the cases a test cluster gives not on demand: the
    script is a list of (status, headers, body) for successive requests; a watch gets the
    server's ``watch`` lines."""

    script: ClassVar[list[tuple[int, dict[str, str], Any]]] = []
    watches: ClassVar[list[list[dict[str, Any]]]] = []
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if "watch=true" in self.path and type(self).watches:
            lines = type(self).watches.pop(0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for line in lines:
                self.wfile.write(json.dumps(line).encode() + b"\n")
                self.wfile.flush()
            time.sleep(0.2)
            return
        status, headers, body = type(self).script.pop(0) if type(self).script else (200, {}, {})
        payload = json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[Kube]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    _StandIn.script, _StandIn.watches, _StandIn.seen = [], [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = k8s_client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    kube = connect(api_client=k8s_client.ApiClient(configuration), namespace="ns")
    kube.retries = 3
    yield kube
    kube.close()
    server.shutdown()
    server.server_close()


def test_429_and_5xx_are_retried_with_backoff_and_then_answer(stand_in: Kube) -> None:
    _StandIn.script = [
        (429, {"Retry-After": "0"}, {"kind": "Status", "message": "slow down"}),
        (503, {}, {"kind": "Status", "message": "etcd leader changed"}),
        (200, {}, {"kind": "PodList", "items": [], "metadata": {"resourceVersion": "9"}}),
    ]
    listing = stand_in.request("GET", stand_in.path("", "pods"), what="list pods")
    assert listing["metadata"]["resourceVersion"] == "9"
    assert len(_StandIn.seen) == 3


def test_a_server_that_keeps_failing_is_unreachable_after_the_retries(stand_in: Kube) -> None:
    _StandIn.script = [(500, {}, {"kind": "Status", "message": "internal error"})] * 4
    with pytest.raises(ClusterUnreachableError, match="internal error"):
        stand_in.request("GET", stand_in.path("", "pods"), what="list pods")
    assert len(_StandIn.seen) == 4  # one try and three retries


def test_a_server_that_does_not_answer_is_unreachable() -> None:
    from aenv_ray.testing import free_port

    configuration = k8s_client.Configuration(host=f"http://127.0.0.1:{free_port()}")
    kube = connect(api_client=k8s_client.ApiClient(configuration))
    kube.retries = 1
    with pytest.raises(ClusterUnreachableError, match="does not answer"):
        kube.request("GET", kube.path("", "pods"), what="list pods")
    kube.close()


def test_a_watch_that_expires_is_followed_by_a_fresh_list(stand_in: Kube) -> None:
    pod = {
        "metadata": {
            "name": "p",
            "resourceVersion": "12",
            "labels": {LABEL_INSTANCE: "abc"},
            "annotations": {ANNOTATION_ENV: "demo@1.0.0"},
        },
        "status": {"phase": "Pending"},
    }
    listing = {"kind": "PodList", "items": [], "metadata": {"resourceVersion": "10"}}
    _StandIn.script = [(200, {}, listing), (200, {}, {**listing, "items": [pod]})]
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    _StandIn.watches = [[gone], []]
    with pytest.raises(WatchExpired):
        list(stand_in.watch(stand_in.path("", "pods"), resource_version="1"))
    _StandIn.watches = [[gone], []]
    cache = PodCache(stand_in, watch_timeout=1)
    thread = threading.Thread(target=cache.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while cache.pod("abc") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    cache.stop()
    thread.join(timeout=10)
    assert cache.pod("abc") is not None  # from the second list, after the 410
    assert cache.relists >= 2


# -- on the real API server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(kube_cluster: KubeCluster) -> KubeCluster:
    return kube_cluster


@pytest.fixture
def namespace(cluster: KubeCluster, request: pytest.FixtureRequest) -> str:
    # a name of its own each time: the last session's namespace may still be terminating
    name = "t-" + request.node.name.lower().replace("_", "-")[:36].strip("-")
    name = f"{name}-{uuid.uuid4().hex[:6]}"
    return cluster.namespace(name)


def _core(cluster: KubeCluster) -> k8s_client.CoreV1Api:
    return k8s_client.CoreV1Api(cluster.api_client())


async def _refused(url: str) -> bool:
    """Nothing listens at ``url``'s host and port any more."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except OSError:
        return True
    writer.close()
    return False


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_the_real_api_servers_refusals_are_typed(
    cluster: KubeCluster, namespace: str
) -> None:
    engine = cluster.engine("no-such-namespace-x")
    with pytest.raises(ConfigurationError, match="namespace"):
        await engine.create(SPEC, timeout=30)
    await engine.aclose()
    kube = connect(kubeconfig=cluster.kubeconfig, namespace=namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"twice-{uuid.uuid4().hex[:8]}"},
        "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]},
    }
    path = kube.path("", "pods")
    kube.request("POST", path, body=pod, what="create pod twice")
    with pytest.raises(ClusterConflictError, match="already exists"):
        kube.request("POST", path, body=pod, what="create pod twice")
    bad = {**pod, "metadata": {"name": "bad-1", "labels": {"x": "not a label value!"}}}
    with pytest.raises(ConfigurationError, match=r"metadata\.labels"):
        kube.request("POST", path, body=bad, what="create pod bad")
    kube.close()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_a_pod_deleted_behind_the_engines_back_ends_its_environment(
    cluster: KubeCluster, namespace: str
) -> None:
    engine = cluster.engine(namespace)
    try:
        env = Environment("mini-terminal@1.0.0", engine=engine, ttl=600)
        await env.initialize()
        assert (await env.call_tool("execute_command", {"command": "echo up"})).structured
        info = (await engine.list())[0]
        pod_name = f"aenv-mini-terminal-{info.id}"
        _core(cluster).delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)

        async def ended() -> bool:
            return (await engine.get(info.id)).state is InstanceState.TERMINATED

        await eventually(ended, "the deleted pod ended its environment", deadline=30)
        gone = await engine.get(info.id)
        assert gone.reason is TerminationReason.DELETED
        assert "deleted" in gone.describe_end()
        # the test kubelet kills the pod's process soon after the API says it is deleted (a
        # real kubelet too): until then it still answers
        url = (await engine.route(info)).url
        await eventually(lambda: _refused(url), f"{url} stops answering", deadline=30)
        with pytest.raises(AEnvError, match="deleted"):
            await env.call_tool("execute_command", {"command": "echo again"})
        assert env.state is EnvironmentState.BROKEN
        await env.release()
    finally:
        await engine.aclose()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _processes_of_instance(iid: str) -> list[int]:
    """Pids of this host's processes of instance ``iid`` (the test kubelet's pods are host
    processes carrying the pod's environment)."""
    mark = f"AENV_INSTANCE_ID={iid}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


@pytest.mark.k8s
@pytest.mark.timeout(2400)
@pytest.mark.fake_kubelet(
    "stops the pod's processes on this host (SIGSTOP) so that its IP goes silent with the "
    "connection open; on the real node test_a_pod_deleted_behind_the_engines_back_... deletes one"
)
async def test_a_call_to_a_pod_gone_silent_fails_with_the_watchs_word_not_a_timeout(
    cluster: KubeCluster, namespace: str
) -> None:
    """On a real network a deleted pod's IP does not refuse: it stays silent. Here the pod's
    processes are stopped (silent, their connections open) and the pod is deleted with a long
    grace period: the call in flight must fail with the engine's account of the deletion while
    the process is still there, not wait for its timeout or for the kill."""
    engine = cluster.engine(namespace)
    stopped: list[int] = []
    try:
        env = Environment("mini-terminal@1.0.0", engine=engine, ttl=600)
        await env.initialize()
        assert env.instance_id is not None
        assert (await env.call_tool("execute_command", {"command": "echo up"})).structured
        stopped = _processes_of_instance(env.instance_id)
        assert stopped, "no process of the pod found"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        in_flight = asyncio.create_task(
            env.call_tool("execute_command", {"command": "echo silent"}, timeout=600)
        )
        await asyncio.sleep(0.5)  # sent, and unanswered: the runtime is stopped
        assert not in_flight.done()
        pod_name = f"aenv-mini-terminal-{env.instance_id}"
        _core(cluster).delete_namespaced_pod(pod_name, namespace, grace_period_seconds=300)
        with pytest.raises(InstanceBrokenError, match="deleted") as raised:
            await asyncio.wait_for(in_flight, 120)  # a bound for a broken build, not a timing
        assert "create a new environment" in str(raised.value)
        # the process was never killed: the error came from the watch, not a dropped connection
        assert all(_alive(pid) for pid in stopped)
        assert env.state is EnvironmentState.BROKEN
        with pytest.raises(InstanceBrokenError, match="deleted"):  # and at once after
            await env.call_tool("execute_command", {"command": "echo again"})
        await env.release()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await engine.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_the_reaper_ends_expired_pods_after_the_engine_that_made_them_closed(
    cluster: KubeCluster, namespace: str
) -> None:
    maker = cluster.engine(namespace, session=False, reaper=False)
    info = await maker.create(InstanceSpec("mini-terminal@1.0.0", ttl=3.0), timeout=60)
    await maker.aclose()  # pods of an engine without a session outlive it
    later = cluster.engine(namespace, session=False, lease_seconds=3)
    try:
        assert (await later.get(info.id)).state is InstanceState.RUNNING

        async def reaped() -> bool:
            return (await later.get(info.id)).state is InstanceState.TERMINATED

        await eventually(reaped, "the expired pod reaped", deadline=60)
        assert (await later.get(info.id)).reason is TerminationReason.EXPIRED
    finally:
        await later.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(600)
async def test_an_engine_that_closes_hands_the_reaper_on_at_once(
    cluster: KubeCluster, namespace: str
) -> None:
    """A closing engine resigns the reaper's Lease, so the next engine in the namespace reaps
    at once, not when the Lease would have lapsed (here ten minutes: the first engine's
    ``lease_seconds``). The resignation's ``renewTime`` is the epoch, which once read as no
    renewal at all, the Lease lapsing from its acquisition instead: 15 s without a reaper
    after every engine's close, expired pods outliving their TTL that long."""
    from k8s_backend.reaper import REAPER_LEASE

    first = cluster.engine(namespace, lease_seconds=600)
    try:
        await first.create(InstanceSpec("mini-terminal@1.0.0", ttl=600), timeout=60)
        leases = k8s_client.CoordinationV1Api(cluster.api_client())

        async def leading() -> bool:
            try:
                lease = leases.read_namespaced_lease(REAPER_LEASE, namespace)
            except k8s_client.ApiException:
                return False
            return bool(lease.spec.lease_duration_seconds == 600)

        await eventually(leading, "the first engine leads the reaper", deadline=60)
    finally:
        await first.aclose()
    maker = cluster.engine(namespace, session=False, reaper=False)
    info = await maker.create(InstanceSpec("mini-terminal@1.0.0", ttl=2.0), timeout=60)
    await maker.aclose()
    later = cluster.engine(namespace, session=False, lease_seconds=600)
    try:

        async def reaped() -> bool:
            return (await later.get(info.id)).state is InstanceState.TERMINATED

        await eventually(reaped, "the next engine reaps (the closed one resigned)", deadline=120)
        assert (await later.get(info.id)).reason is TerminationReason.EXPIRED
    finally:
        await later.aclose()


_DIES = """
import asyncio, os, sys
sys.path.insert(0, {repo!r})
from aenv_ray import InstanceSpec
from k8s_backend import HostProcess, KubernetesEngine, OwnImage

async def main():
    engine = KubernetesEngine({namespace!r}, kubeconfig={kubeconfig!r}, delivery={delivery},
                              reaper=False, lease_seconds=3)
    info = await engine.create(InstanceSpec("mini-terminal@1.0.0", ttl=600), timeout=60)
    print(info.id, flush=True)
    os._exit(0)  # dies without closing: its session lease is never renewed again

asyncio.run(main())
"""


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_the_pods_of_an_engine_that_died_are_reclaimed(
    cluster: KubeCluster, namespace: str
) -> None:
    script = _DIES.format(
        repo=REPO,
        namespace=namespace,
        kubeconfig=str(cluster.kubeconfig),
        delivery=cluster.delivery_source(),
    )
    died = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert died.returncode == 0, died.stderr[-2000:]
    iid = died.stdout.split()[-1]
    reaper = cluster.engine(namespace, session=False, lease_seconds=3)
    try:
        assert (await reaper.get(iid)).state is InstanceState.RUNNING

        async def reclaimed() -> bool:
            return (await reaper.get(iid)).state is InstanceState.TERMINATED

        await eventually(reclaimed, "the dead engine's pods reclaimed", deadline=90)
        assert (await reaper.get(iid)).reason is TerminationReason.OWNER_GONE
    finally:
        await reaper.aclose()


_EXITS = """
import asyncio, sys
sys.path.insert(0, {repo!r})
from aenv_ray import InstanceSpec
from aenv_ray.engine import named_engine

engine = named_engine("kubernetes")  # closed by its atexit hook, never by this script
info = asyncio.run(engine.create(InstanceSpec("mini-terminal@1.0.0", ttl=600), timeout=60))
print(info.id, flush=True)
"""


@pytest.mark.k8s
async def test_the_process_wide_engine_deletes_its_pods_at_interpreter_exit(
    cluster: KubeCluster, namespace: str
) -> None:
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "host",
    }
    exited = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _EXITS.format(repo=REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert exited.returncode == 0, exited.stderr[-2000:]
    assert "Traceback" not in exited.stderr, exited.stderr[-2000:]
    iid = exited.stdout.split()[-1]
    watcher = cluster.engine(namespace, session=False, reaper=False)
    try:
        info = await watcher.get(iid)  # still terminating
        assert info.state is InstanceState.TERMINATED, info
    except InstanceNotFoundError:
        pass  # already gone
    finally:
        await watcher.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_a_broken_watch_is_resumed_and_misses_nothing(
    cluster: KubeCluster, namespace: str
) -> None:
    watcher = cluster.engine(namespace, session=False, reaper=False)
    maker = cluster.engine(namespace, reaper=False)
    try:
        await watcher.list()  # listed, and soon watching

        async def watching() -> bool:
            return watcher._cache._response is not None

        await eventually(watching, "the watch resumed", deadline=30)
        before = watcher._cache.relists
        watcher._cache._response.shutdown()  # the connection drops mid-stream
        info = await maker.create(SPEC, timeout=60)

        async def seen_running() -> bool:  # the pod's later changes reach it too
            return (await watcher.get(info.id)).is_running

        await eventually(seen_running, "the pod seen running", deadline=30)
        assert watcher._cache.relists > before
    finally:
        await maker.aclose()
        await watcher.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_engines_are_chosen_by_name_from_the_settings(
    cluster: KubeCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("AENV_K8S_NAMESPACE", namespace)
    for name, value in cluster.settings_env().items():
        monkeypatch.setenv(name, value)
    engine = new_engine("kubernetes")
    assert isinstance(engine, KubernetesEngine)
    assert engine.namespace == namespace
    assert type(engine.delivery) is type(cluster.delivery())  # HostProcess, or OwnImage
    try:
        info = await engine.create(SPEC, timeout=60)
        with pytest.raises(NotSupportedError, match="engine='local'"):
            await engine.fork(info.id, 1)
        assert engine.closes_instances
    finally:
        await engine.aclose()
    assert not await _none_left(cluster, namespace)  # its session's pods went with it
    with pytest.raises(ConfigurationError, match="unknown engine `kube`"):
        Environment("mini-terminal@1.0.0", engine="kube")


async def _none_left(cluster: KubeCluster, namespace: str) -> list[str]:
    core = _core(cluster)
    deadline = time.monotonic() + 30
    while True:
        pods = core.list_namespaced_pod(namespace).items
        live = [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]
        if not live or time.monotonic() > deadline:
            return live
        await asyncio.sleep(0.1)
