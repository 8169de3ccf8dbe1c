"""The test cluster itself (tests/_k8s.py): a real API server the official client talks to, whose
fake kubelet runs a pod's command on this host at the pod's own IP, with a readiness probe the
watch reports. The Kubernetes engine's tests stand on exactly this."""

from __future__ import annotations

import sys
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, watch

from tests._k8s import KubeCluster

# the first test to use the cluster pays for its one-time build (minutes) in its set-up
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(2400)]


@pytest.fixture
def core(kube_cluster: KubeCluster) -> Iterator[tuple[client.CoreV1Api, str]]:
    api = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    core = client.CoreV1Api(api)
    namespace = f"aenv-smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        yield core, namespace
    finally:
        core.delete_namespace(namespace)
        api.close()


HTTP_SERVER = ["-m", "http.server", "--bind", "$(POD_IP)", "8080"]


def _ready(pod: Any) -> bool:
    conditions = (pod.status and pod.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_a_pod_runs_here_becomes_ready_and_answers_at_its_ip(
    kube_cluster: KubeCluster, core: tuple[client.CoreV1Api, str]
) -> None:
    api, namespace = core
    # the fake kubelet runs the command on this host (this venv's Python); a real node runs
    # the image, one the kit builds offline (python:3.11-slim)
    host = kube_cluster.runs_host_processes
    container = client.V1Container(
        name="server",
        image="ignored-by-the-fake-kubelet" if host else "python:3.11-slim",
        command=[sys.executable if host else "python3", *HTTP_SERVER],
        env=[
            client.V1EnvVar(
                name="POD_IP",
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="status.podIP")
                ),
            )
        ],
        readiness_probe=client.V1Probe(
            http_get=client.V1HTTPGetAction(path="/", port=8080), period_seconds=1
        ),
    )
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="smoke", labels={"app": "smoke"}),
        spec=client.V1PodSpec(containers=[container], restart_policy="Never"),
    )
    created = api.create_namespaced_pod(namespace, pod)
    ready = None
    stream = watch.Watch()
    for event in stream.stream(
        api.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=smoke",
        resource_version=created.metadata.resource_version,
        timeout_seconds=60,
    ):
        if _ready(event["object"]):
            ready = event["object"]
            stream.stop()
    assert ready is not None, "the pod never became Ready"
    ip = ready.status.pod_ip
    assert ip.startswith("127.") == host  # the fake kubelet's pod IPs are loopback
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=10) as answer:
        assert answer.status == 200
