"""The Kubernetes objects of a long-running service (k8s_backend.services): golden files for its
Deployment, Service and PersistentVolumeClaim, the rules of names, storage and updates, and the
real API server's word: every object validated, and a real Deployment of mini-terminal scaled
1 -> 3 -> 1 and updated, its Service's Endpoints following the ready pods, every pod answering at
its IP, and the claim outliving the Deployment.

Golden files live in tests/golden/k8s/; ``AENV_UPDATE_GOLDEN=1`` rewrites them (read the diff).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import ConfigurationError, Environment
from aenv_ray.config import DeployConfig, EnvConfig
from builtin_envs import builtin_refs
from k8s_backend.manifests import PodRecipe, instance_pod
from k8s_backend.services import (
    DEFAULT_STORAGE_SIZE,
    LABEL_SERVICE,
    ServiceRecipe,
    service_deployment,
    service_name,
    service_objects,
    service_service,
    service_storage_claim,
    service_update_patch,
    service_url,
    storage_claim_name,
    storage_quantity,
)
from tests._k8s import KubeCluster

GOLDEN = Path(__file__).parent / "golden" / "k8s"
_DNS_1035 = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")

RECIPE = ServiceRecipe(
    service_id="7d1c2b9e4a01",
    env_ref="notes@1.2.0",
    image="registry.local/aenv/notes:1.2.0",
    command=["python", "-m", "sandbox_runtime", "/env"],
    replicas=2,
    deploy=DeployConfig(cpu="500m", memory="1G", env={"LEVEL": "easy"}),
    arguments=["--mode", "serve"],
    environment_variables={"TASK": "index"},
    owner="alice@example.org",
    labels={"team": "rl"},
    storage=True,
    storage_size="20G",
)


def _golden(name: str, value: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if os.environ.get("AENV_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with AENV_UPDATE_GOLDEN=1 and read it"
    assert text == path.read_text(), f"{name} differs from {path} (AENV_UPDATE_GOLDEN=1 rewrites)"


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("service-deployment", lambda: service_deployment(RECIPE)),
        ("service-service", lambda: service_service(RECIPE)),
        ("service-pvc", lambda: service_storage_claim(RECIPE)),
    ],
)
def test_golden(name: str, make: Callable[[], dict[str, Any]]) -> None:
    _golden(name, make())


def test_the_replicas_pod_is_an_instances_pod() -> None:
    """The replicas' pod comes from the same builder as an instance's: only what a Deployment
    needs differs (restart policy, identity, the claim's affinity)."""
    template = service_deployment(RECIPE)["spec"]["template"]
    pod = instance_pod(
        PodRecipe(
            instance_id="x",
            env_ref=RECIPE.env_ref,
            image=RECIPE.image,
            command=RECIPE.command,
            expires_at=0.0,
            deploy=RECIPE.deploy,
            arguments=RECIPE.arguments,
            environment_variables=RECIPE.environment_variables,
            storage_claim=storage_claim_name(RECIPE.service_id),
        )
    )
    mine, theirs = dict(template["spec"]), dict(pod["spec"])
    assert (mine.pop("restartPolicy"), theirs.pop("restartPolicy")) == ("Always", "Never")
    assert "podAffinity" in mine.pop("affinity")
    runtime, instance = mine["containers"][0], theirs["containers"][0]
    assert runtime.pop("env")[:2] == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "AENV_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    instance.pop("env")
    assert mine == theirs  # security, probe, resources, volumes, mounts: one source
    assert {"name": "storage", "mountPath": "/storage"} in runtime["volumeMounts"]


def test_labels_selector_and_annotations() -> None:
    deployment = service_deployment(RECIPE)
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {LABEL_SERVICE: "7d1c2b9e4a01"}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert "aenv-ray.io/instance" not in pod_labels  # not an instance: no reaper, no TTL
    assert "aenv-ray.io/expires-at" not in deployment["spec"]["template"]["metadata"]["annotations"]
    assert pod_labels["aenv-ray.io/network"] == "false"  # the egress policy selects replicas
    assert pod_labels["team"] == "rl"
    for obj in service_objects(RECIPE):
        metadata = obj["metadata"]
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "aenv-ray"
        assert metadata["labels"][LABEL_SERVICE] == "7d1c2b9e4a01"
        assert metadata["annotations"]["aenv-ray.io/service-id"] == "7d1c2b9e4a01"
        assert metadata["annotations"]["aenv-ray.io/owner"] == "alice@example.org"
        assert "ownerReferences" not in metadata  # the claim outlives the Deployment
    assert deployment["metadata"]["annotations"]["aenv-ray.io/env-ref"] == "notes@1.2.0"
    strategy = deployment["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }


def test_a_user_label_cannot_take_the_service_label() -> None:
    with pytest.raises(ConfigurationError, match="aenv-ray's own"):
        service_deployment(replace(RECIPE, labels={LABEL_SERVICE: "other"}))


def test_replicas_get_the_deliverys_variables_and_exec_helper_as_instances_do() -> None:
    """A hub key of bundle delivery, and a DualContainer's helper image, reach every replica."""
    from k8s_backend.delivery import HubBundle
    from k8s_backend.exec_helper import ExecHelper

    delivery = HubBundle("http://hub:8000", api_key_secret=("envhub-pods", "key"))
    recipe = replace(
        RECIPE,
        deploy=DeployConfig(pod_template="DualContainer"),
        datasource="postgres:16",
        runtime_env=delivery.env(EnvConfig(name="notes", version="1.2.0")),
        exec_helper=ExecHelper(image="registry.local/aenv-ray:9"),
    )
    spec = service_deployment(recipe)["spec"]["template"]["spec"]
    runtime = next(c for c in spec["containers"] if c["name"] == "runtime")
    key = next(v for v in runtime["env"] if v["name"] == "AENV_BUNDLE_KEY")
    assert key["valueFrom"] == {"secretKeyRef": {"name": "envhub-pods", "key": "key"}}
    (init,) = spec["initContainers"]
    assert init["image"] == "registry.local/aenv-ray:9"
    with pytest.raises(ConfigurationError, match="aenv-ray's own"):  # a user cannot replace it
        service_deployment(replace(recipe, environment_variables={"AENV_BUNDLE_KEY": "mine"}))


@pytest.mark.parametrize("taken", ["POD_IP", "AENV_INSTANCE_ID", "AENV_SERVICE_ID"])
def test_a_user_variable_cannot_replace_aenv_rays(taken: str) -> None:
    with pytest.raises(ConfigurationError, match=f"\\['{taken}'\\] are aenv-ray's own"):
        service_deployment(replace(RECIPE, environment_variables={taken: "x"}))
    with pytest.raises(ConfigurationError, match=f"\\['{taken}'\\] are aenv-ray's own"):
        service_deployment(replace(RECIPE, deploy=DeployConfig(env={taken: "x"})))


@pytest.mark.parametrize("replicas", [-1, 1001, True])
def test_replicas_are_checked(replicas: Any) -> None:
    with pytest.raises(ConfigurationError, match="replicas"):
        service_deployment(replace(RECIPE, replicas=replicas))
    with pytest.raises(ConfigurationError, match="replicas"):
        service_update_patch(replace(RECIPE, replicas=replicas), replicas_only=True)


@pytest.mark.parametrize(
    "ident", ["7d1c2b", "Web_Shop", "x" * 63, "x" * 80, "-lead", "a.b", "é", "0abc", "A"]
)
def test_names_are_dns_labels_stable_and_distinct(ident: str) -> None:
    for make in (service_name, storage_claim_name):
        name = make(ident)
        assert _DNS_1035.fullmatch(name), name  # a Service's name must start with a letter
        assert len(name) <= 63
        assert make(ident) == name
        assert make(ident + "x") != name
        assert make(ident.swapcase()) != name or ident.swapcase() == ident
    assert service_name(ident) != storage_claim_name(ident)


def test_names_keep_the_id_when_it_fits() -> None:
    assert service_name("7d1c2b9e4a01") == "aenv-svc-7d1c2b9e4a01"
    assert storage_claim_name("7d1c2b9e4a01") == "aenv-storage-7d1c2b9e4a01"
    with pytest.raises(ConfigurationError, match="empty"):
        service_name("")


def test_the_stable_url() -> None:
    assert service_url("7d1c2b9e4a01", "aenv") == "http://aenv-svc-7d1c2b9e4a01.aenv.svc:8080"
    assert service_url("7d1c2b9e4a01", "team-a", 9000).endswith(".team-a.svc:9000")
    service = service_service(replace(RECIPE, port=9000))
    assert service["metadata"]["name"] == "aenv-svc-7d1c2b9e4a01"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "runtime", "port": 9000, "targetPort": 9000, "protocol": "TCP"}
    ]


def test_storage() -> None:
    assert [o["kind"] for o in service_objects(replace(RECIPE, storage=False))] == [
        "Deployment",
        "Service",
    ]
    plain = service_deployment(replace(RECIPE, storage=False))["spec"]["template"]["spec"]
    assert "affinity" not in plain
    assert all(v["name"] != "storage" for v in plain["volumes"])
    claim = service_storage_claim(RECIPE)
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "20Gi"}},
    }
    shared = replace(RECIPE, storage_access="ReadWriteMany", storage_class="nfs")
    assert service_storage_claim(shared)["spec"]["storageClassName"] == "nfs"
    # only a ReadWriteOnce volume ties the replicas to one node
    assert "affinity" not in service_deployment(shared)["spec"]["template"]["spec"]
    assert storage_quantity(DEFAULT_STORAGE_SIZE) == "10Gi"
    assert storage_quantity("1536M") == "1536Mi"
    with pytest.raises(ConfigurationError, match="size"):
        service_storage_claim(replace(RECIPE, storage_size="lots"))


def test_the_update_patch() -> None:
    scale = service_update_patch(replace(RECIPE, replicas=5), replicas_only=True)
    assert scale == [
        {
            "op": "test",
            "path": "/spec/selector/matchLabels/aenv-ray.io~1service",
            "value": RECIPE.service_id,
        },
        {"op": "replace", "path": "/spec/replicas", "value": 5},
    ]
    moved = replace(
        RECIPE,
        env_ref="notes@1.3.0",
        image="registry.local/aenv/notes:1.3.0",
        environment_variables={"TASK": "search"},
    )
    ops = {op["path"]: op for op in service_update_patch(moved)}
    assert ops["/spec/template"]["value"] == service_deployment(moved)["spec"]["template"]
    assert ops["/metadata/labels/aenv-ray.io~1version"] == {
        "op": "add",
        "path": "/metadata/labels/aenv-ray.io~1version",
        "value": "1.3.0",
    }
    assert ops["/metadata/annotations/aenv-ray.io~1env-ref"]["value"] == "notes@1.3.0"
    runtime = ops["/spec/template"]["value"]["spec"]["containers"][0]
    assert runtime["image"] == "registry.local/aenv/notes:1.3.0"
    assert {"name": "TASK", "value": "search"} in runtime["env"]


# -- the real API server ------------------------------------------------------------------------


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[tuple[Any, str]]:
    with kube_cluster.scratch_namespace("aenv-services") as made:
        yield made


def _create(api: Any, namespace: str, obj: dict[str, Any], **kw: Any) -> Any:
    from kubernetes import client

    if obj["kind"] == "Deployment":
        return client.AppsV1Api(api).create_namespaced_deployment(namespace, obj, **kw)
    core = client.CoreV1Api(api)
    if obj["kind"] == "Service":
        return core.create_namespaced_service(namespace, obj, **kw)
    return core.create_namespaced_persistent_volume_claim(namespace, obj, **kw)


@pytest.mark.k8s
@pytest.mark.timeout(2400)  # the first k8s test may pay for the cluster's one-time build
def test_the_api_server_accepts_every_object(namespace: tuple[Any, str]) -> None:
    api, name = namespace
    for recipe in (RECIPE, replace(RECIPE, storage=False, replicas=0)):
        for obj in service_objects(recipe):
            made = _create(api, name, obj, dry_run="All")
            assert made.metadata.name == obj["metadata"]["name"]
            assert made.kind == obj["kind"]


def _wait(what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _ready(pod: Any) -> bool:
    conditions = (pod.status and pod.status.conditions) or []
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in conditions
    )


def _serving(api: Any, namespace: str, recipe: ServiceRecipe, replicas: int) -> dict[str, str]:
    """Wait until exactly ``replicas`` pods of the service exist, all Ready, and the Service's
    Endpoints list exactly their IPs; return {pod name: IP}."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    selector = f"{LABEL_SERVICE}={recipe.service_id}"

    def check() -> dict[str, str] | None:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        if len(pods) != replicas or not all(_ready(p) for p in pods):
            return None
        ips = {p.metadata.name: p.status.pod_ip for p in pods}
        endpoints = core.read_namespaced_endpoints(service_name(recipe.service_id), namespace)
        ready = {a.ip for s in endpoints.subsets or [] for a in s.addresses or []}
        not_ready = {a.ip for s in endpoints.subsets or [] for a in s.not_ready_addresses or []}
        return ips if ready == set(ips.values()) and not not_ready else None

    return _wait(f"{replicas} ready replicas behind the Service", check)  # type: ignore[no-any-return]


def _answers(ips: dict[str, str], port: int) -> dict[str, str]:
    """Ask every pod, at its own IP, who it is: {pod name: what its tool printed}."""

    async def ask(ip: str) -> str:
        async with Environment.attach(f"http://{ip}:{port}") as env:
            result = await env.call_tool(
                "execute_command",
                {"command": 'echo "$AENV_INSTANCE_ID $AENV_SERVICE_ID $STAGE"'},
            )
            return str(result.structured["output"]).strip()

    async def ask_all() -> list[str]:
        return list(await asyncio.gather(*(ask(ip) for ip in ips.values())))

    return dict(zip(ips, asyncio.run(ask_all()), strict=True))


@pytest.mark.k8s
@pytest.mark.timeout(2400)
def test_a_service_scales_updates_and_keeps_its_storage(
    kube_cluster: KubeCluster, namespace: tuple[Any, str]
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api, name = namespace
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    image, command = kube_cluster.runtime(builtin_refs()["mini-terminal@1.0.0"])
    recipe = ServiceRecipe(
        service_id=uuid.uuid4().hex[:12],
        env_ref="mini-terminal@1.0.0",
        image=image,
        command=command,  # this host's runtime (the fake kubelet), else the image's
        replicas=1,
        environment_variables={"STAGE": "one"},
        storage=True,
        storage_size="1Gi",
    )
    for obj in service_objects(recipe):
        _create(api, name, obj)
    deployment = service_name(recipe.service_id)

    def patch(ops: list[dict[str, Any]]) -> Any:
        return apps.patch_namespaced_deployment(
            deployment, name, ops, _content_type="application/json-patch+json"
        )

    ips = _serving(api, name, recipe, 1)
    assert _answers(ips, recipe.port) == {pod: f"{pod} {recipe.service_id} one" for pod in ips}

    patch(service_update_patch(replace(recipe, replicas=3), replicas_only=True))
    ips = _serving(api, name, recipe, 3)
    assert _answers(ips, recipe.port) == {pod: f"{pod} {recipe.service_id} one" for pod in ips}

    patch(service_update_patch(replace(recipe, replicas=1), replicas_only=True))
    ips = _serving(api, name, recipe, 1)
    assert _answers(ips, recipe.port) == {pod: f"{pod} {recipe.service_id} one" for pod in ips}

    # an update of the variables rolls the pod new-first; the Service follows the new one
    updated = replace(recipe, environment_variables={"STAGE": "two"})
    patch(service_update_patch(updated))
    old = set(ips)

    def rolled() -> dict[str, str] | None:
        now = _serving(api, name, updated, 1)
        return now if not set(now) & old else None

    ips = _wait("the rolled replica", rolled)
    assert _answers(ips, recipe.port) == {pod: f"{pod} {recipe.service_id} two" for pod in ips}
    assert (
        apps.read_namespaced_deployment(
            deployment, name
        ).spec.strategy.rolling_update.max_unavailable
        == 0
    )

    # the patch tests the service label first: it cannot move another service's Deployment
    with pytest.raises(ApiException) as info:
        patch(service_update_patch(replace(recipe, service_id="someone-else", replicas=0)))
    assert info.value.status == 422
    assert apps.read_namespaced_deployment(deployment, name).spec.replicas == 1

    apps.delete_namespaced_deployment(deployment, name, propagation_policy="Background")
    core.delete_namespaced_service(deployment, name)
    _wait(
        "the replicas to go",
        lambda: (
            not core.list_namespaced_pod(
                name, label_selector=f"{LABEL_SERVICE}={recipe.service_id}"
            ).items
        ),
    )
    claim = core.read_namespaced_persistent_volume_claim(
        storage_claim_name(recipe.service_id), name
    )
    assert claim.metadata.deletion_timestamp is None  # storage is kept by default
    assert claim.metadata.annotations["aenv-ray.io/service-id"] == recipe.service_id
