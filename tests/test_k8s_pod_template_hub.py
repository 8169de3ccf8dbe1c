"""A tenant's pod template through a real ``aenv serve --engine kubernetes`` on the real API
server: an allowed template reaches the pod (and the instance serves); a refused one is a 403
naming the field at push, and at create it never makes a pod; an operator's widening for one
tenant (``pod_template_allow`` in ``--limits``) lets that tenant's field reach the pod while
another tenant creating the same definition is refused. The allow-list itself is
tests/test_pod_template_policy.py (offline).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.bundle import build_bundle
from aenv_ray.errors import PodTemplateRefusedError
from aenv_ray.hub import HubClient
from builtin_envs import builtin_refs
from k8s_backend.manifests import LABEL_ENV
from tests._hub import HubProcess, new_key, run
from tests._k8s import KubeCluster

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(2400)]

HOST_PODS = pytest.mark.fake_kubelet(
    "its hub runs with AENV_K8S_DELIVERY=host: pods are this venv's runtime as host processes"
)

SELINUX = "spec.securityContext.seLinuxOptions"
ALLOWED = """
metadata:
  labels: {team: rl}
  annotations: {example.org/note: "pod ${NAME}"}
spec:
  tolerations: [{key: example.org/gpu, operator: Exists, effect: NoSchedule}]
  terminationGracePeriodSeconds: 5
  containers:
  - name: runtime
    env: [{name: FROM_TEMPLATE, value: "${ENV_NAME}"}]
"""
WIDENED = "spec: {securityContext: {seLinuxOptions: {level: 's0:c7,c8'}}}"
REFUSED = "spec: {serviceAccountName: default, nodeName: control-plane-1}"


@dataclass(frozen=True)
class Hub:
    proc: HubProcess
    namespace: str
    api: Any  # kubernetes.client.ApiClient
    alice: str  # the default allow-list
    lab: str  # tenant gpu-lab: seLinuxOptions allowed by the operator


@pytest.fixture(scope="module")
def hub(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("podtpl-hub")
    limits = root / "limits.json"
    limits.write_text(json.dumps({"tenants": {"gpu-lab": {"pod_template_allow": [SELINUX]}}}))
    with kube_cluster.scratch_namespace("podtpl") as (api, namespace):
        env = {
            "KUBECONFIG": str(kube_cluster.kubeconfig),
            "AENV_K8S_NAMESPACE": namespace,
            "AENV_K8S_DELIVERY": "host",
        }
        proc = HubProcess(
            root / "hub", engine="kubernetes", env=env, extra=["--limits", str(limits)]
        )
        alice, lab = new_key("alice", proc.store), new_key("gpu-lab", proc.store)
        with proc:
            yield Hub(proc, namespace, api, alice, lab)


@pytest.fixture
async def alice(hub: Hub) -> AsyncIterator[HubClient]:
    async with HubClient(hub.proc.url, api_key=hub.alice) as client:
        yield client


@pytest.fixture
async def lab(hub: Hub) -> AsyncIterator[HubClient]:
    async with HubClient(hub.proc.url, api_key=hub.lab) as client:
        yield client


def _bundle(root: Path, template: str) -> tuple[str, bytes]:
    """mini-terminal's code as a definition of its own with ``template``: (name, bundle)."""
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    project = root / name
    shutil.copytree(builtin_refs()["mini-terminal@1.0.0"], project)
    config = json.loads((project / "config.json").read_text())
    config.update(name=name, version="1.0.0")
    config.setdefault("deployConfig", {})["customPodTemplate"] = template
    (project / "config.json").write_text(json.dumps(config))
    return name, build_bundle(project).data


def _pods(hub: Hub, name: str) -> list[Any]:
    from kubernetes import client

    found = client.CoreV1Api(hub.api).list_namespaced_pod(
        hub.namespace, label_selector=f"{LABEL_ENV}={name}"
    )
    return list(found.items)


@HOST_PODS
async def test_an_allowed_template_reaches_the_pod(
    hub: Hub, alice: HubClient, tmp_path: Path
) -> None:
    name, data = _bundle(tmp_path, ALLOWED)
    await alice.push(data)
    record = await alice.create_instance(f"{name}@1.0.0", ttl=600)
    try:
        assert await run(record, "echo $FROM_TEMPLATE") == name
        (pod,) = _pods(hub, name)
        assert pod.metadata.labels["team"] == "rl"
        assert pod.metadata.annotations["example.org/note"] == f"pod {pod.metadata.name}"
        assert [t.key for t in pod.spec.tolerations or []].count("example.org/gpu") == 1
        assert pod.spec.termination_grace_period_seconds == 5
        runtime = next(c for c in pod.spec.containers if c.name == "runtime")
        assert runtime.security_context.privileged is False
        assert runtime.security_context.allow_privilege_escalation is False
    finally:
        await alice.delete_instance(record["id"])


@HOST_PODS
async def test_a_refused_template_is_a_403_at_push_naming_the_field(
    hub: Hub, alice: HubClient, tmp_path: Path
) -> None:
    name, data = _bundle(tmp_path, REFUSED)
    with pytest.raises(PodTemplateRefusedError) as info:
        await alice.push(data)
    assert "customPodTemplate.spec.serviceAccountName is not allowed" in str(info.value)
    assert info.value.allow == "spec.serviceAccountName"
    # nothing was published, so nothing can start
    assert name not in {e["name"] for e in await alice.search(name)}
    assert _pods(hub, name) == []


@HOST_PODS
async def test_an_operators_widening_holds_for_its_tenant_only(
    hub: Hub, alice: HubClient, lab: HubClient, tmp_path: Path
) -> None:
    """gpu-lab may set seLinuxOptions, and its pod gets them; alice may not push the same
    template, and creating gpu-lab's definition by its full name is refused without a pod."""
    name, data = _bundle(tmp_path, WIDENED)
    with pytest.raises(PodTemplateRefusedError, match=SELINUX.replace(".", r"\.")):
        await alice.push(data)
    await lab.push(data)
    record = await lab.create_instance(f"{name}@1.0.0", ttl=600)
    try:
        assert await run(record, "echo served") == "served"
        (pod,) = _pods(hub, name)
        assert pod.spec.security_context.se_linux_options.level == "s0:c7,c8"
        assert pod.spec.security_context.run_as_non_root is True  # the engine's still wins
        # alice names gpu-lab's definition in full: the hub checks alice's policy, no pod
        with pytest.raises(PodTemplateRefusedError) as info:
            await alice.create_instance(f"gpu-lab/{name}@1.0.0", ttl=600)
        assert info.value.field == f"customPodTemplate.{SELINUX}"
        assert [p.metadata.name for p in _pods(hub, name)] == [pod.metadata.name]
        assert [r["id"] for r in await alice.list_instances()] == []
    finally:
        await lab.delete_instance(record["id"])
