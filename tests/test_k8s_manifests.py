"""The Kubernetes objects of an instance (k8s_backend.manifests): golden files for the single- and
dual-container pods and the egress policy, the rules of names, labels and quantities, and the real
API server's word on them (server-side validation, and a pod that runs the runtime and answers).

Golden files live in tests/golden/k8s/; ``AENV_UPDATE_GOLDEN=1`` rewrites them (read the diff).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import ConfigurationError, Environment
from aenv_ray.config import DeployConfig
from builtin_envs import builtin_refs
from k8s_backend.exec_helper import IMAGE_PATH, RUNTIME_IMAGE, ExecHelper
from k8s_backend.manifests import (
    LABEL_INSTANCE,
    PodRecipe,
    deny_egress_policy,
    instance_pod,
    label_value,
    pod_name,
    quantities,
    second_image,
)
from tests._k8s import KubeCluster

GOLDEN = Path(__file__).parent / "golden" / "k8s"
_LABEL = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
_DNS = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

SINGLE = PodRecipe(
    instance_id="4f2a9c1e07b3",
    env_ref="mini-terminal@1.0.0",
    image="registry.local/aenv/mini-terminal:1.0.0",
    command=["python", "-m", "sandbox_runtime", "/env"],
    expires_at=1_700_000_000.0,
    deploy=DeployConfig(cpu="500m", memory="1Gi", env={"LEVEL": "easy"}),
    arguments=["--level", "hard"],
    environment_variables={"TASK": "write-42"},
    owner="alice@example.org",
    pool="p-1",
    labels={"team": "rl"},
)
DUAL = PodRecipe(
    instance_id="9c1e07b34f2a",
    env_ref="swe-task@2.1.0",
    image="registry.local/aenv/swe-task:2.1.0",
    command=["python", "-m", "sandbox_runtime", "/env"],
    expires_at=1_700_000_600.5,
    deploy=DeployConfig(
        cpu="2C",
        memory="4G",
        network=True,
        pod_template="DualContainer",
        image_prefix="registry.local/aenv/",
    ),
    datasource="django-repo",
    exec_helper=ExecHelper(image="registry.local/aenv-ray/aenv-ray:1.2.3"),
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
        ("pod-single", lambda: instance_pod(SINGLE)),
        ("pod-dual", lambda: instance_pod(DUAL)),
        ("network-policy", deny_egress_policy),
    ],
)
def test_golden(name: str, make: Any) -> None:
    _golden(name, make())


def test_the_pod_is_secure_by_default() -> None:
    pod = instance_pod(SINGLE)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    dual = instance_pod(DUAL)["spec"]
    for container in spec["containers"] + dual["containers"] + dual["initContainers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True
    assert pod["metadata"]["labels"]["aenv-ray.io/network"] == "false"  # the policy selects it
    assert instance_pod(DUAL)["metadata"]["labels"]["aenv-ray.io/network"] == "true"


def test_resources_are_requests_and_limits() -> None:
    runtime = instance_pod(SINGLE)["spec"]["containers"][0]
    assert runtime["resources"] == {
        "requests": {"cpu": "500m", "memory": "1024Mi"},
        "limits": {"cpu": "500m", "memory": "1024Mi"},
    }


@pytest.mark.parametrize(
    ("cpu", "memory", "expected"),
    [
        ("2", "4G", {"cpu": "2000m", "memory": "4096Mi"}),
        ("2C", "512M", {"cpu": "2000m", "memory": "512Mi"}),
        ("500m", "4Gi", {"cpu": "500m", "memory": "4096Mi"}),
        (0.25, 1_000_000, {"cpu": "250m", "memory": "1000000"}),
        ("0.0001", "1k", {"cpu": "1m", "memory": "1024"}),
    ],
)
def test_quantities(cpu: Any, memory: Any, expected: dict[str, str]) -> None:
    assert quantities(DeployConfig(cpu=cpu, memory=memory)) == expected


@pytest.mark.parametrize(
    "text", ["", "a", "1.0.0", "x" * 63, "x" * 64, "-lead", "trail.", "a b/c@d", "é" * 10]
)
def test_label_values_are_valid_and_keep_texts_apart(text: str) -> None:
    value = label_value(text)
    assert _LABEL.fullmatch(value), value
    assert len(value) <= 63
    assert value == text or value != label_value(text + "x")


def test_pod_names_are_dns_labels_within_63() -> None:
    assert pod_name("mini-terminal", "4f2a9c1e07b3") == "aenv-mini-terminal-4f2a9c1e07b3"
    long = pod_name("a_very_Long_environment_name" * 4, "4f2a9c1e07b3")
    assert _DNS.fullmatch(long)
    assert len(long) <= 63
    assert long.endswith("-4f2a9c1e07b3")  # the id is never cut: it is what tells pods apart
    with pytest.raises(ConfigurationError, match="no letters or digits"):
        pod_name("x", "--")


def test_the_second_image() -> None:
    assert second_image("django-repo", "registry.local/aenv/") == "registry.local/aenv/django-repo"
    assert second_image("docker.io/library/postgres:16", "r/") == "docker.io/library/postgres:16"
    with pytest.raises(ConfigurationError, match="needs a datasource"):
        instance_pod(PodRecipe(**{**_fields(DUAL), "datasource": None}))


def test_the_dual_pod_places_the_exec_helper_through_a_shared_volume() -> None:
    spec = instance_pod(DUAL)["spec"]
    runtime, second = spec["containers"]
    [install] = spec["initContainers"]
    assert install["image"] == "registry.local/aenv-ray/aenv-ray:1.2.3"
    assert install["command"] == [IMAGE_PATH, "--install", "/aenv-shared/aenv-exec"]
    # the second image's entrypoint is replaced by the helper, which ends the command line
    # with "--" so that a template's command or args run under it
    assert second["command"] == [
        "/aenv-shared/aenv-exec",
        "--socket",
        "/aenv-shared/exec.sock",
        "--",
    ]
    assert "args" not in second
    assert {"name": "AENV_DATASOURCE_SOCKET", "value": "/aenv-shared/exec.sock"} in runtime["env"]
    shared = {"name": "aenv-shared", "mountPath": "/aenv-shared"}
    assert {**shared, "readOnly": True} in runtime["volumeMounts"]  # connect() needs no write
    assert shared in second["volumeMounts"]
    assert shared in install["volumeMounts"]
    assert {"name": "datasource-tmp", "mountPath": "/tmp"} in second["volumeMounts"]
    assert {"name": "aenv-shared", "emptyDir": {"sizeLimit": "16Mi"}} in spec["volumes"]
    # by default the init container is the generic aenv-ray image of this version
    default = instance_pod(PodRecipe(**{**_fields(DUAL), "exec_helper": ExecHelper()}))
    assert default["spec"]["initContainers"][0]["image"] == RUNTIME_IMAGE
    # a single-container pod has none of it
    single = instance_pod(SINGLE)["spec"]
    assert "initContainers" not in single
    assert all(v["name"] != "AENV_DATASOURCE_SOCKET" for v in single["containers"][0]["env"])


def test_on_a_host_process_cluster_the_shared_directory_is_the_hosts() -> None:
    helper = ExecHelper(image="ignored", binary="/cache/aenv-exec-1", host_dir="/tmp/shared/")
    spec = instance_pod(PodRecipe(**{**_fields(DUAL), "exec_helper": helper}))["spec"]
    runtime, second = spec["containers"]
    here = "/tmp/shared/9c1e07b34f2a"  # one directory per pod, named by its instance id
    assert spec["initContainers"][0]["command"] == [
        "/cache/aenv-exec-1",
        "--install",
        f"{here}/aenv-exec",
    ]
    assert second["command"] == ["/cache/aenv-exec-1", "--socket", f"{here}/exec.sock", "--"]
    assert {"name": "AENV_DATASOURCE_SOCKET", "value": f"{here}/exec.sock"} in runtime["env"]


def test_the_datasource_socket_variable_is_aenv_rays_own() -> None:
    taken = {"AENV_DATASOURCE_SOCKET": "/elsewhere"}
    with pytest.raises(ConfigurationError, match="AENV_DATASOURCE_SOCKET"):
        instance_pod(PodRecipe(**{**_fields(DUAL), "environment_variables": taken}))


def test_a_user_label_cannot_take_an_aenv_label() -> None:
    with pytest.raises(ConfigurationError, match="aenv-ray's own"):
        instance_pod(PodRecipe(**{**_fields(SINGLE), "labels": {LABEL_INSTANCE: "x"}}))


def test_a_user_variable_cannot_replace_the_pods_own() -> None:
    for taken in ("POD_IP", "AENV_INSTANCE_ID"):  # the runtime binds $(POD_IP)
        with pytest.raises(ConfigurationError, match=taken):
            instance_pod(PodRecipe(**{**_fields(SINGLE), "environment_variables": {taken: "x"}}))


def test_the_workspace_is_mounted_where_deploy_config_says() -> None:
    deploy = DeployConfig(workspace="/app", pod_template="DualContainer")
    pod = instance_pod(PodRecipe(**{**_fields(DUAL), "deploy": deploy}))
    runtime, second = pod["spec"]["containers"]
    assert runtime["workingDir"] == "/app"
    for container in (runtime, second):  # the second container shares it at the same path
        assert {"name": "workspace", "mountPath": "/app"} in container["volumeMounts"]
        assert not any(m["mountPath"] == "/workspace" for m in container["volumeMounts"])


def test_storage_is_mounted_when_a_claim_is_given() -> None:
    assert all(v["name"] != "storage" for v in instance_pod(SINGLE)["spec"]["volumes"])
    pod = instance_pod(PodRecipe(**{**_fields(SINGLE), "storage_claim": "aenv-storage-x"}))
    assert {"name": "storage", "persistentVolumeClaim": {"claimName": "aenv-storage-x"}} in pod[
        "spec"
    ]["volumes"]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "storage", "mountPath": "/storage"} in mounts


def _fields(recipe: PodRecipe) -> dict[str, Any]:
    return {name: getattr(recipe, name) for name in recipe.__dataclass_fields__}


# -- the real API server ------------------------------------------------------------------------


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[tuple[Any, str]]:
    with kube_cluster.scratch_namespace("aenv-manifests") as made:
        yield made


@pytest.mark.k8s
@pytest.mark.timeout(2400)  # the first k8s test may pay for the cluster's one-time build
def test_the_api_server_accepts_every_object(namespace: tuple[Any, str]) -> None:
    from kubernetes import client

    api, name = namespace
    core = client.CoreV1Api(api)
    for recipe in (SINGLE, DUAL):
        checked = core.create_namespaced_pod(name, instance_pod(recipe), dry_run="All")
        assert checked.metadata.name == instance_pod(recipe)["metadata"]["name"]
    made = client.NetworkingV1Api(api).create_namespaced_network_policy(name, deny_egress_policy())
    assert made.spec.policy_types == ["Egress"]


@pytest.mark.k8s
@pytest.mark.timeout(2400)
def test_a_pod_from_a_recipe_serves_the_environment(
    kube_cluster: KubeCluster, namespace: tuple[Any, str]
) -> None:
    from kubernetes import client

    api, name = namespace
    core = client.CoreV1Api(api)
    image, command = kube_cluster.runtime(builtin_refs()["mini-terminal@1.0.0"])
    recipe = PodRecipe(
        instance_id="0123456789ab",
        env_ref="mini-terminal@1.0.0",
        image=image,
        command=command,  # this host's runtime (the fake kubelet), else the image's
        expires_at=time.time() + 600,
    )
    pod = core.create_namespaced_pod(name, instance_pod(recipe))
    deadline = time.monotonic() + 60
    while True:
        pod = core.read_namespaced_pod(pod.metadata.name, name)
        conditions = pod.status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            break
        assert time.monotonic() < deadline, f"never Ready: {pod.status}"
        time.sleep(0.2)

    async def call() -> Any:
        async with Environment.attach(f"http://{pod.status.pod_ip}:8080") as env:
            return await env.call_tool("execute_command", {"command": "echo $AENV_INSTANCE_ID"})

    import asyncio

    result = asyncio.run(call())
    assert result.structured == {"output": "0123456789ab\n", "returncode": 0}
