"""OpenEnv on aenv-ray's Kubernetes engine, on the real API server (k8s-real: its kubelet runs
each pod's runtime as a process of this host), driven by OpenEnv's own clients (its package in a
virtual environment of its own, tests/_oracles.py ``OPENENV``; tests/openenv_driver.py):

- ``aenv openenv serve mini-terminal@1.0.0 --engine kubernetes`` (the engine chosen by name, as
  everywhere: ``KUBECONFIG``, ``AENV_K8S_NAMESPACE``, ``AENV_K8S_DELIVERY``): each session's
  instance is a pod, gone when the session ends;
- :class:`aenv_openenv.AenvRayProvider` on a Kubernetes engine: OpenEnv's own server for an
  OpenEnv project, inside a pod, played through the provider's bridge.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_openenv import AenvRayProvider
from aenv_ray import Environment
from k8s_backend.manifests import LABEL_ENV
from tests._k8s import KubeCluster
from tests._openenv import OpenEnvServe, counter_project, drive
from tests._oracles import OPENENV, oracle_python

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def openenv_python() -> Path:
    return oracle_python(OPENENV)


@pytest.fixture(scope="module")
def k8s(kube_cluster: KubeCluster) -> Iterator[tuple[KubeCluster, str]]:
    if not kube_cluster.runs_host_processes:
        pytest.skip("pods run this venv's runtime as host processes: a k8s-real cluster only")
    with kube_cluster.scratch_namespace("openenv") as (_api, namespace):
        yield kube_cluster, namespace


def _live_pods(cluster: KubeCluster, namespace: str, env_name: str) -> list[str]:
    from kubernetes import client

    with cluster.api_client() as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"{LABEL_ENV}={env_name}"
        )
    return [p.metadata.name for p in pods.items if p.metadata.deletion_timestamp is None]


def _none_left(cluster: KubeCluster, namespace: str, env_name: str) -> list[str]:
    """The environment's live pods once there are none (or as they are after 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        live = _live_pods(cluster, namespace, env_name)
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.2)  # the engine deletes the pod; the API server says when: no event here


def test_aenv_openenv_serve_on_kubernetes(
    openenv_python: Path, k8s: tuple[KubeCluster, str]
) -> None:
    cluster, namespace = k8s
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "host",
    }
    with OpenEnvServe("mini-terminal@1.0.0", sessions=1, env=env, engine="kubernetes") as server:
        seen = drive(openenv_python, "episode", server.url)
    assert seen["output"] == "on-k8s\n"
    assert (seen["reward"], seen["done"]) == (1.0, True)
    assert seen["state"]["step_count"] == 2
    assert seen["instance_id"]  # the session's pod ...
    assert _none_left(cluster, namespace, "mini-terminal") == []  # ... released with it


def test_an_openenv_environment_runs_in_a_pod_through_the_provider(
    openenv_python: Path, k8s: tuple[KubeCluster, str], tmp_path: Path
) -> None:
    cluster, namespace = k8s
    project = counter_project(tmp_path / "counter")
    engine = cluster.engine(namespace)
    # the pod's process is this host's: the OpenEnv server runs OpenEnv's venv's interpreter
    python = {"AENV_OPENENV_PYTHON": str(openenv_python)}

    def make(ref: str, env_vars: dict[str, str]) -> Environment:
        variables = {**env_vars, **python}
        return Environment.from_project(project, engine=engine, environment_variables=variables)

    try:
        with AenvRayProvider(environment_factory=make) as provider:
            url = provider.start_container("counter-openenv@1.0.0")
            provider.wait_for_ready(url)
            assert _live_pods(cluster, namespace, "counter-openenv") != []
            seen = drive(openenv_python, "counter", url)
        assert seen["steps"] == [{"total": 2, "reward": 2.0}, {"total": 5, "reward": 5.0}]
        assert seen["final"] == {"total": 10, "reward": 10.0}
        assert seen["other"] == 1  # OpenEnv's own second session, in the same pod
        assert "CAPACITY_REACHED" in seen["third"]
        assert _none_left(cluster, namespace, "counter-openenv") == []
    finally:
        engine.close()
