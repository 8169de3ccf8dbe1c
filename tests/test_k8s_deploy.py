"""``deploy/``: the in-cluster EnvHub's manifests.

Statically: the kustomization lists every manifest, all in one namespace; the Role is the exact,
least-privilege set of rules (namespaced resources only, no wildcard, nothing that escalates);
the pods run with secure defaults; the image is the versioned generic image the Dockerfile
builds; the README's overlay renders (with ``kubectl kustomize`` when it is on PATH).

On a real API server with RBAC on (``rbac_cluster``): every object applied in the
kustomization's order, Redis and the hub brought up from them, the hub's readiness probe passing,
a key created as the README says, a project pushed, and an agent's episode through the hub whose
Kubernetes engine runs as the ServiceAccount ``aenv-hub`` (a static token of that user name, so
the shipped RoleBinding is what grants it): the Role is enough for instances.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import utils as k8s_utils

from aenv_cli._scaffold import write_project
from aenv_ray import InstanceSpec, InstanceState, PermissionDeniedError, __version__
from aenv_ray.bundle import build_bundle
from aenv_ray.hub import HubClient
from aenv_ray.testing import free_port
from k8s_backend import HostProcess, KubernetesEngine
from k8s_backend.exec_helper import IMAGE_PATH
from tests._k8s import KubeCluster

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
AENV = [sys.executable, "-m", "aenv_cli"]
NAMESPACE = "aenv-ray"
HUB_USER = f"system:serviceaccount:{NAMESPACE}:aenv-hub"
IMAGE = f"ghcr.io/aenv-ray/aenv-ray:{__version__}"

ROLE_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete", "deletecollection"],
    },
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["aenv-runtime-token-key"],
        "verbs": ["get"],
    },
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {
        "apiGroups": [""],
        "resources": ["services", "persistentvolumeclaims"],
        "verbs": ["create", "delete"],
    },
    {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["get"]},
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "create", "patch", "delete"],
    },
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "create", "update", "patch", "delete"],
    },
]
"""The Role, exactly: a change to deploy/role.yaml must change this too, on purpose."""

NAMESPACED = {
    "": {
        "pods",
        "pods/log",
        "services",
        "persistentvolumeclaims",
        "endpoints",
        "configmaps",
        "secrets",
    },
    "apps": {"deployments", "replicasets"},
    "networking.k8s.io": {"networkpolicies"},
    "coordination.k8s.io": {"leases"},
}
"""Namespaced resources a Role of ours may name at all (nodes, namespaces, persistentvolumes,
RBAC objects, pods/exec and the like may never appear; secrets only as READABLE_SECRETS says)."""
READABLE_SECRETS = ["aenv-runtime-token-key"]
"""The only Secret a Role of ours may read: the namespace's instance-token key
(k8s_backend/tokens.py); Secrets may otherwise only be created (to make that one)."""
ESCALATING_VERBS = {"*", "escalate", "bind", "impersonate"}


def manifests() -> list[dict[str, Any]]:
    """Every object of ``deploy/``, in the kustomization's order, with its namespace."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        for obj in yaml.safe_load_all((DEPLOY / name).read_text()):
            if obj is None:
                continue
            if obj["kind"] != "Namespace":
                assert obj["metadata"]["namespace"] == kustomization["namespace"], (name, obj)
            objects.append(obj)
    return objects


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


# -- static ----------------------------------------------------------------------------------------


def test_the_kustomization_lists_every_manifest_in_one_namespace() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == NAMESPACE
    shipped = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == shipped
    kinds = [(o["kind"], o["metadata"]["name"]) for o in manifests()]
    assert kinds[0] == ("Namespace", NAMESPACE)  # applied first
    assert len(set(kinds)) == len(kinds)
    assert not {k for k, _ in kinds} & {"ClusterRole", "ClusterRoleBinding"}


def test_the_role_is_least_privilege_namespaced_and_without_wildcards() -> None:
    objects = manifests()
    role = find(objects, "Role", "aenv-ray-engine")
    assert role["rules"] == ROLE_RULES
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}  # no URLs
        if "secrets" in rule["resources"]:  # one Secret read, by name; created, never listed
            assert rule["resources"] == ["secrets"]
            readable = rule.get("resourceNames") == READABLE_SECRETS and rule["verbs"] == ["get"]
            assert readable or rule["verbs"] == ["create"], rule
        for group in rule["apiGroups"]:
            assert group in NAMESPACED, f"API group {group!r} is not one of ours"
            for resource in rule["resources"]:
                assert resource in NAMESPACED[group], f"{group}/{resource} in the Role"
        assert "*" not in rule["apiGroups"] + rule["resources"]
        assert not set(rule["verbs"]) & ESCALATING_VERBS
    binding = find(objects, "RoleBinding", "aenv-hub")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "aenv-ray-engine",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "aenv-hub", "namespace": NAMESPACE}
    ]
    hub = find(objects, "Deployment", "aenv-hub")["spec"]["template"]["spec"]
    assert hub["serviceAccountName"] == "aenv-hub"


def test_the_translated_403_names_the_shipped_role() -> None:
    from k8s_backend._api import ROLE

    assert find(manifests(), "Role", ROLE)["metadata"]["name"] == ROLE


@pytest.mark.parametrize("name", ["aenv-hub", "aenv-redis"])
def test_the_pods_run_with_secure_defaults(name: str) -> None:
    spec = find(manifests(), "Deployment", name)["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["enableServiceLinks"] is False
    assert spec["automountServiceAccountToken"] is (name == "aenv-hub")  # the hub's engine only
    for container in spec["containers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True
        assert "limits" in container["resources"]
        assert "requests" in container["resources"]
        assert container["readinessProbe"]
        assert container["livenessProbe"]
    for volume in spec["volumes"]:
        assert set(volume) & {"emptyDir", "persistentVolumeClaim"}, volume  # no hostPath


def test_the_hub_serves_with_auth_on_the_kubernetes_engine_and_the_redis_store() -> None:
    objects = manifests()
    container = find(objects, "Deployment", "aenv-hub")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert container["command"] == ["aenv"]
    args = container["args"]
    assert args[0] == "serve"
    assert "--no-auth" not in args
    assert args[args.index("--engine") + 1] == "kubernetes"
    assert args[args.index("--host") + 1] == "0.0.0.0"  # kubectl port-forward needs loopback
    env = {e["name"]: e for e in container["env"]}
    service = find(objects, "Service", "aenv-redis")
    port = service["spec"]["ports"][0]["port"]
    assert env["AENV_HUB_STORE"]["value"] == f"redis://aenv-redis:{port}/0"
    assert env["AENV_K8S_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    # the README's overlay patches the image prefix and the runtime image at these indices
    assert container["env"][2]["name"] == "AENV_K8S_IMAGE_PREFIX"
    assert container["env"][3]["name"] == "AENV_K8S_RUNTIME_IMAGE"
    # the built-ins' pods run the hub's own image, which serves them (no image of their own)
    assert env["AENV_K8S_RUNTIME_IMAGE"]["value"] == IMAGE
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/health"
    hub_service = find(objects, "Service", "aenv-hub")
    assert hub_service["spec"]["selector"] == {"app.kubernetes.io/name": "aenv-hub"}
    policy = find(objects, "NetworkPolicy", "aenv-redis")
    assert policy["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "aenv-hub"}}}
    ]


def test_the_dockerfile_builds_every_package_into_the_named_image() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"-t {IMAGE} ." in dockerfile
    assert "FROM ${PYTHON_IMAGE}" in dockerfile
    assert "python:3.11" in dockerfile
    assert re.search(r"^USER (\d+)", dockerfile, re.M)
    assert "USER 0" not in dockerfile
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    for package in packages:
        assert f"COPY {package}/ {package}/" in dockerfile, package
        assert f"!{package}" in ignore, package
    assert "!README.md" in ignore
    assert "!pyproject.toml" in ignore
    # the hub's image runs EnvHub (hub), its Kubernetes engine and the Redis store: their extras
    assert re.search(r"pip install .*/wheels/\*\.whl\)\[hub,kubernetes,redis", dockerfile)
    # the DualContainer exec helper, static, where the pods' init containers copy it from
    assert "COPY k8s_backend/aenv_exec.c" in dockerfile
    assert " -static " in dockerfile
    assert f"COPY --from=aenv-exec /aenv-exec {IMAGE_PATH}" in dockerfile


def _readme_overlay() -> str:
    readme = (DEPLOY / "README.md").read_text()
    found = re.search(r"cat > kustomization.yaml <<'EOF'\n(.*?)\nEOF\n", readme, re.S)
    assert found, "the README's overlay"
    return found.group(1)


def _readme_agent() -> str:
    readme = (DEPLOY / "README.md").read_text()
    found = re.search(r"```python\n(# my_agent.py\n.*?)```\n", readme, re.S)
    assert found, "the README's my_agent.py"
    return found.group(1)


def test_the_readme_overlay_renders(tmp_path: Path) -> None:
    overlay = yaml.safe_load(_readme_overlay())
    assert overlay["resources"] == ["../deploy"]
    assert overlay["images"][0]["name"] == IMAGE.split(":")[0]
    # the instance pods of built-ins run the image the hub runs: the overlay names it twice
    ops = {op["path"]: op["value"] for op in yaml.safe_load(overlay["patches"][0]["patch"])}
    image = overlay["images"][0]
    runtime = "/spec/template/spec/containers/0/env/3/value"
    assert ops[runtime] == f"{image['newName']}:{image['newTag']}"
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: the overlay is not rendered")
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    (tmp_path / "my-hub").mkdir()
    (tmp_path / "my-hub" / "kustomization.yaml").write_text(_readme_overlay())
    rendered = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "my-hub")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in manifests()
    )
    hub = find(objects, "Deployment", "aenv-hub")["spec"]["template"]["spec"]["containers"][0]
    assert hub["image"] == f"registry.example.com/aenv/aenv-ray:{__version__}"
    env = {e["name"]: e.get("value") for e in hub["env"]}
    assert env["AENV_K8S_IMAGE_PREFIX"] == "registry.example.com/aenv"
    assert env["AENV_K8S_RUNTIME_IMAGE"] == hub["image"]


# -- on a real API server with RBAC ------------------------------------------------------------


def _set_arg(args: list[str], flag: str, value: str) -> None:
    at = args.index(flag)
    args[at + 1] = value


def _test_redis(deployment: dict[str, Any], port: int, data: Path) -> dict[str, Any]:
    """Redis's Deployment as a kustomize overlay for the test cluster would make it: its own
    free port (every pod of the fake kubelet shares this host's network) and a data directory
    of its own (the fake kubelet mounts no volume). The command is as shipped: Debian's
    ``redis-server`` on PATH."""
    changed = copy.deepcopy(deployment)
    container = changed["spec"]["template"]["spec"]["containers"][0]
    _set_arg(container["args"], "--port", str(port))
    _set_arg(container["args"], "--dir", str(data))
    container["ports"][0]["containerPort"] = port  # the probe's named port follows
    return changed


def _test_hub(
    deployment: dict[str, Any], *, port: int, store: str, data: Path, kubeconfig: Path
) -> dict[str, Any]:
    """The hub's Deployment as a kustomize overlay for the test cluster would make it, where
    the fake kubelet runs ``command`` + ``args`` as a process of this host (images ignored):

    - the command: this venv's Python running the same CLI (``-m aenv_cli``);
    - ``--host``: the pod's IP, not every interface of this host; ``--port``: a free one (all
      pods share this host's network);
    - ``--data-dir``: a directory of its own (no volumes are mounted);
    - the store: Redis's pod IP and port (no DNS, no Service routing);
    - ``KUBECONFIG``: the static token of user ``system:serviceaccount:aenv-ray:aenv-hub``
      (no service-account token is mounted), so the shipped RoleBinding grants it the Role;
    - ``AENV_K8S_DELIVERY=host``: instance pods run this venv's runtime (images ignored).

    Everything else (arguments, variables, probes, security) is as shipped."""
    changed = copy.deepcopy(deployment)
    container = changed["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [*AENV]
    _set_arg(container["args"], "--host", "$(POD_IP)")
    _set_arg(container["args"], "--port", str(port))
    _set_arg(container["args"], "--data-dir", str(data))
    container["ports"][0]["containerPort"] = port
    env = container["env"]
    for variable in env:
        if variable["name"] == "AENV_HUB_STORE":
            variable["value"] = store
    env[:0] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env += [
        {"name": "KUBECONFIG", "value": str(kubeconfig)},
        {"name": "AENV_K8S_DELIVERY", "value": "host"},
    ]
    return changed


def _ready_pod(core: k8s_client.CoreV1Api, app: str, seconds: float = 300.0) -> Any:
    """The Ready pod of Deployment ``app`` (its readiness probe passed)."""
    deadline = time.monotonic() + seconds
    while True:
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name={app}"
        ).items
        for pod in pods:
            conditions = pod.status.conditions or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                return pod
        assert time.monotonic() < deadline, f"no Ready pod of {app}: {pods}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def deployed(
    rbac_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """deploy/ applied (as transformed above), the hub Ready; its URL and store."""
    objects = manifests()
    tmp_path = tmp_path_factory.mktemp("deployed")
    redis_port, hub_port = free_port(), free_port()
    (tmp_path / "redis").mkdir()
    (tmp_path / "hub").mkdir()
    kubeconfig = rbac_cluster.kubeconfig_for(HUB_USER, namespace=NAMESPACE)
    with rbac_cluster.api_client() as api:
        core = k8s_client.CoreV1Api(api)
        try:
            store = ""
            for obj in objects:
                name = (obj["kind"], obj["metadata"]["name"])
                if name == ("Deployment", "aenv-redis"):
                    obj = _test_redis(obj, redis_port, tmp_path / "redis")
                if name == ("Deployment", "aenv-hub"):
                    redis = _ready_pod(core, "aenv-redis")  # as the Service would route
                    store = f"redis://{redis.status.pod_ip}:{redis_port}/0"
                    obj = _test_hub(
                        obj,
                        port=hub_port,
                        store=store,
                        data=tmp_path / "hub",
                        kubeconfig=kubeconfig,
                    )
                k8s_utils.create_from_dict(api, obj)
            hub = _ready_pod(core, "aenv-hub")
            yield {
                "url": f"http://{hub.status.pod_ip}:{hub_port}",
                "store": store,
                "pod": hub.metadata.name,
            }
        finally:
            _remove_namespace(core)


def _remove_namespace(core: k8s_client.CoreV1Api) -> None:
    """Delete the namespace and wait until its pods (host processes) are gone."""
    try:
        core.delete_namespace(NAMESPACE)
    except k8s_client.ApiException as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + 300
    while core.list_namespaced_pod(NAMESPACE).items and time.monotonic() < deadline:
        time.sleep(0.1)


def _hub_log(rbac_cluster: KubeCluster, pod: str) -> str:
    with rbac_cluster.api_client() as api:
        try:
            return str(k8s_client.CoreV1Api(api).read_namespaced_pod_log(pod, NAMESPACE))
        except k8s_client.ApiException as exc:
            return f"(no log: {exc.status})"


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_the_hub_comes_up_from_the_manifests_and_its_role_runs_instances(
    rbac_cluster: KubeCluster, deployed: dict[str, Any], tmp_path: Path
) -> None:
    url = deployed["url"]
    async with HubClient(url) as anonymous:
        health = await anonymous.health()
    assert health["status"] == "ok"
    assert health["auth"] is True

    # the README's step 4, `kubectl exec deploy/aenv-hub -- aenv keys create ...`: the same CLI
    # with the hub container's store variable (the fake kubelet has no exec)
    created = await _run(
        [*AENV, "keys", "create", "--tenant", "me", "--name", "test"],
        env={**_clean_env(), "AENV_HUB_STORE": deployed["store"]},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("aenv_")

    # step 6: publish a project and run an agent's episode through the hub
    agent_env = {**_clean_env(), "AENV_SYSTEM_URL": url, "AENV_API_KEY": key}
    run = {"cwd": tmp_path, "env": agent_env, "capture_output": True, "text": True, "timeout": 300}
    write_project(tmp_path / "my-env", "my-env")
    built = await _run([*AENV, "build", "my-env", "--no-image"], **run)
    assert built.returncode == 0, built.stderr
    pushed = await _run([*AENV, "push", "my-env"], **run)
    assert pushed.returncode == 0, pushed.stderr + _hub_log(rbac_cluster, deployed["pod"])
    agent = tmp_path / "my_agent.py"
    agent.write_text(_readme_agent())  # the README's my_agent.py, as it is written there
    episode = await _run([sys.executable, str(agent)], **run)
    assert episode.returncode == 0, episode.stderr + _hub_log(rbac_cluster, deployed["pod"])
    assert "buy milk" in episode.stdout

    # through the hub's API: create (pod + NetworkPolicy + Leases), renew (patch), delete
    async with HubClient(url, api_key=key) as hub:
        record = await hub.create_instance("my-env@1.0.0", ttl=600)
        with rbac_cluster.api_client() as api:
            pods = (
                k8s_client.CoreV1Api(api)
                .list_namespaced_pod(
                    NAMESPACE, label_selector=f"aenv-ray.io/instance={record['id']}"
                )
                .items
            )
        assert len(pods) == 1  # a pod of the hub's engine, in the hub's namespace
        renewed = await hub.renew_instance(record["id"], 1200)
        assert renewed["expires_at"] > record["expires_at"]
        ended = await hub.delete_instance(record["id"])
        assert ended["state"] == "terminated"

        # a service (Deployment + Service + PVC), scaled, called through the hub, deleted with
        # its storage: the Role's other rules, used for real
        service = await hub.create_service("my-env@1.0.0", replicas=1, storage=True)
        scaled = await hub.update_service(service["id"], replicas=2)
        assert scaled["ready"] == 2
        assert len(scaled["endpoints"]) == 2
        gone = await hub.delete_service(service["id"], keep_storage=False)
        assert gone["id"] == service["id"]
        with rbac_cluster.api_client() as api:
            claims = k8s_client.CoreV1Api(api).list_namespaced_persistent_volume_claim(NAMESPACE)
        left = {
            c.metadata.name: c.metadata.deletion_timestamp
            for c in claims.items
            if c.metadata.name == f"aenv-storage-{service['id']}"
        }
        assert all(left.values())  # gone, or going once no replica holds it (pvc-protection)
    with rbac_cluster.api_client() as api:
        policies = k8s_client.NetworkingV1Api(api).list_namespaced_network_policy(NAMESPACE)
        leases = k8s_client.CoordinationV1Api(api).list_namespaced_lease(NAMESPACE)
    assert "aenv-ray-deny-egress" in {p.metadata.name for p in policies.items}
    assert "aenv-ray-reaper" in {lease.metadata.name for lease in leases.items}


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_the_role_allows_what_engines_and_services_do_and_nothing_else(
    rbac_cluster: KubeCluster, deployed: dict[str, Any]
) -> None:
    """What the hub's account may do, asked of the API server itself (SelfSubjectAccessReview:
    RBAC's own answer); and an SDK engine (with a session) on the same account: create, renew,
    close (its session's pods deleted by label, its Lease deleted)."""
    with rbac_cluster.api_client(HUB_USER) as api:
        authorization = k8s_client.AuthorizationV1Api(api)

        def allowed(
            verb: str, resource: str, group: str = "", namespace: str = NAMESPACE, name: str = ""
        ) -> bool:
            attributes = {
                "verb": verb,
                "resource": resource,
                "group": group,
                "namespace": namespace,
                **({"name": name} if name else {}),
            }
            review = authorization.create_self_subject_access_review(
                {"spec": {"resourceAttributes": attributes}}
            )
            return bool(review.status.allowed)

        for rule in ROLE_RULES:  # the services' Deployments, Services and PVCs among them
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames", [""]):
                            assert allowed(verb, resource, group, name=name), (verb, resource)
        assert not allowed("get", "secrets")
        assert not allowed("get", "secrets", name="aenv-hub-secret")  # the hub's own secret
        assert not allowed("list", "secrets")
        assert not allowed("create", "pods/exec")
        assert not allowed("update", "pods")
        assert not allowed("create", "roles", "rbac.authorization.k8s.io")
        assert not allowed("create", "pods", namespace="default")
        assert not allowed("list", "nodes", namespace="")

    engine = KubernetesEngine(
        NAMESPACE,
        kubeconfig=rbac_cluster.kubeconfig_for(HUB_USER, namespace=NAMESPACE),
        delivery=HostProcess(),
    )
    try:
        info = await engine.create(InstanceSpec("mini-terminal@1.0.0", ttl=600.0), timeout=120)
        assert info.state is InstanceState.RUNNING
        renewed = await engine.renew(info.id, 900.0)
        assert renewed.expires_at is not None
        assert renewed.expires_at > (info.expires_at or 0)
    finally:
        await engine.aclose()  # deletecollection of its pods, then its Lease

    async def gone() -> bool:
        with rbac_cluster.api_client() as api:
            pods = (
                k8s_client.CoreV1Api(api)
                .list_namespaced_pod(
                    NAMESPACE, label_selector=f"aenv-ray.io/session={engine.session}"
                )
                .items
            )
            leases = k8s_client.CoordinationV1Api(api).list_namespaced_lease(NAMESPACE).items
        names = {lease.metadata.name for lease in leases}
        return not pods and f"aenv-session-{engine.session}" not in names

    deadline = time.monotonic() + 120
    while not await gone():
        assert time.monotonic() < deadline, "the session's pods or Lease outlived the engine"
        await asyncio.sleep(0.1)


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_without_its_rolebinding_the_hub_is_refused_and_says_what_to_bind(
    rbac_cluster: KubeCluster, deployed: dict[str, Any], tmp_path: Path
) -> None:
    """The control: the hub's engine runs as the ServiceAccount, so taking its RoleBinding
    away makes the cluster refuse it, and the refusal reaches the client saying what to do."""
    created = await _run(
        [*AENV, "keys", "create", "--tenant", "control"],
        env={**_clean_env(), "AENV_HUB_STORE": deployed["store"]},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    key = created.stdout.strip()
    project = tmp_path / "control-env"
    write_project(project, "control-env")
    async with HubClient(deployed["url"], api_key=key) as hub:
        await hub.push(build_bundle(project).data)
        with rbac_cluster.api_client() as api:
            rbac = k8s_client.RbacAuthorizationV1Api(api)
            binding = rbac.read_namespaced_role_binding("aenv-hub", NAMESPACE)
            rbac.delete_namespaced_role_binding("aenv-hub", NAMESPACE)
            try:
                with rbac_cluster.api_client(HUB_USER) as own:
                    authorization = k8s_client.AuthorizationV1Api(own)
                    review = {
                        "spec": {
                            "resourceAttributes": {
                                "verb": "create",
                                "resource": "pods",
                                "namespace": NAMESPACE,
                            }
                        }
                    }
                    deadline = time.monotonic() + 60  # RBAC takes a moment to see the change
                    while authorization.create_self_subject_access_review(review).status.allowed:
                        assert time.monotonic() < deadline, "the RoleBinding's removal never took"
                        await asyncio.sleep(0.1)
                with pytest.raises(PermissionDeniedError) as refused:
                    await hub.create_instance("control-env@1.0.0", ttl=600)
            finally:
                binding.metadata.resource_version = None
                rbac.create_namespaced_role_binding(NAMESPACE, binding)
    said = str(refused.value)
    # its first refusal: the pod, or before it the namespace's egress NetworkPolicy (which the
    # engine makes once, on its first create without network)
    assert re.search(rf"{re.escape(HUB_USER)} may not create \S+ in namespace {NAMESPACE}", said)
    assert f"--serviceaccount={NAMESPACE}:aenv-hub" in said
    assert "deploy/role.yaml" in said


async def _run(command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` off the event loop."""
    return await asyncio.to_thread(subprocess.run, command, **options)


def _clean_env() -> dict[str, str]:
    """This process's environment without the test cluster's admin KUBECONFIG."""
    return {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}


def test_the_readme_path_names_the_shipped_objects() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert "kubectl apply -k" in readme
    assert "kubectl -n aenv-ray exec deploy/aenv-hub -- aenv keys create" in readme
    assert "kubectl -n aenv-ray port-forward svc/aenv-hub 8000:8000" in readme
    assert "AENV_SYSTEM_URL=http://127.0.0.1:8000 AENV_API_KEY=" in readme
    assert json.dumps(__version__).strip('"') in readme


def test_the_optional_bundle_egress_policy_reaches_the_shipped_hub_and_dns_only() -> None:
    (policy,) = yaml.safe_load_all(
        (DEPLOY / "optional" / "bundle-delivery-egress.yaml").read_text()
    )
    hub = find(manifests(), "Service", "aenv-hub")
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["namespace"] == hub["metadata"]["namespace"]
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "aenv-ray"}
    }
    assert policy["spec"]["policyTypes"] == ["Egress"]
    to_hub, to_dns = policy["spec"]["egress"]
    assert to_hub["to"] == [{"podSelector": {"matchLabels": hub["spec"]["selector"]}}]
    deployment = find(manifests(), "Deployment", "aenv-hub")
    (serving,) = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert serving["name"] == hub["spec"]["ports"][0]["targetPort"]  # the Service's target
    assert to_hub["ports"] == [{"protocol": "TCP", "port": serving["containerPort"]}]
    assert to_dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert {p["port"] for p in to_dns["ports"]} == {53}
    assert "bundle-delivery-egress.yaml" not in (DEPLOY / "kustomization.yaml").read_text()
