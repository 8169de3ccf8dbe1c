"""A user's own pod template (k8s_backend.templates, ``deployConfig.customPodTemplate``): the
placeholders, the merge in which aenv-ray's parts win (even over fields an operator allowed), a
golden pod, and the real API server's word on the merged pod and Deployment. The allow-list
itself is tested in tests/test_pod_template_policy.py.

Golden files live in tests/golden/k8s/; ``AENV_UPDATE_GOLDEN=1`` rewrites them (read the diff).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import ConfigurationError, Environment
from aenv_ray.config import DeployConfig, EnvConfig
from builtin_envs import builtin_refs
from k8s_backend.manifests import PodRecipe, instance_pod
from k8s_backend.services import ServiceRecipe, service_deployment
from k8s_backend.templates import (
    PLACEHOLDERS,
    PodTemplatePolicy,
    parse_pod_template,
    render_pod_template,
    template_of,
)
from tests._k8s import KubeCluster

GOLDEN = Path(__file__).parent / "golden" / "k8s"
VALUES: dict[str, Any] = {
    "COMMAND": ["python", "-m", "sandbox_runtime", "/env"],
    "ENV_NAME": "swe-task",
    "ENV_REF": "swe-task@2.1.0",
    "ENV_VERSION": "2.1.0",
    "IMAGE": "registry.local/aenv/swe-task:2.1.0",
    "INSTANCE_ID": "9c1e07b34f2a",
    "NAME": "aenv-swe-task-9c1e07b34f2a",
    "PORT": 8080,
}
TEMPLATE = """
apiVersion: v1
kind: Pod
metadata:
  labels:
    team: rl
    copy-of-ref: "${ENV_REF}"
    app.kubernetes.io/managed-by: someone-else   # aenv-ray's label wins
  annotations:
    note: "pod ${NAME} of ${ENV_NAME} ${ENV_VERSION}, literal $${NAME}"
    aenv-ray.io/expires-at: "never"              # aenv-ray's annotation wins
spec:
  nodeSelector: {pool: "${ENV_NAME}"}
  tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
  runtimeClassName: gvisor
  priorityClassName: batch
  restartPolicy: Always                          # aenv-ray's wins
  securityContext: {runAsUser: 1000}
  initContainers:
  - name: warm-cache
    image: busybox:1.36
    command: [sh, -c, "echo ${IMAGE} > /cache/image"]
    volumeMounts: [{name: cache, mountPath: /cache}]
  containers:
  - name: runtime
    image: not-this-one
    command: [tini, "--", "${COMMAND}"]
    args: [not, these]
    ports: [{name: metrics, containerPort: 9100}]
    env:
    - {name: CACHE_DIR, value: /cache}
    - {name: RETRIES, value: 3}
    - {name: POD_IP, value: spoofed}             # aenv-ray's wins
    resources: {limits: {nvidia.com/gpu: 1, cpu: "3", memory: 3Gi}}
    volumeMounts: [{name: cache, mountPath: /cache}]
    securityContext: {readOnlyRootFilesystem: false}
  - name: log-shipper
    image: registry.local/log-shipper:1
    args: ["--target", "http://${NAME}:${PORT}"]
    ports: [{containerPort: 9200}]
    resources: {limits: {cpu: 100m, memory: 64Mi}}
    securityContext: {readOnlyRootFilesystem: false}
  volumes:
  - {name: cache, emptyDir: {sizeLimit: 2Gi}}
  - name: info
    projected:
      sources:
      - downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
"""
# what the frame above sets beyond the tenants' allow-list: an operator's widening (aenv-ray's
# own labels, annotation, restart policy and read-only root still win over it)
WIDENED = PodTemplatePolicy(
    allow=frozenset(
        {
            "metadata.labels[app.kubernetes.io/managed-by]",
            "metadata.annotations[aenv-ray.io/expires-at]",
            "spec.runtimeClassName",
            "spec.priorityClassName",
            "spec.restartPolicy",
            "spec.containers[].securityContext.readOnlyRootFilesystem",
            "spec.containers[].resources.limits[nvidia.com/gpu]",
            "spec.volumes[].projected",
        }
    )
)
RECIPE = PodRecipe(
    instance_id="9c1e07b34f2a",
    env_ref="swe-task@2.1.0",
    image="registry.local/aenv/swe-task:2.1.0",
    command=["python", "-m", "sandbox_runtime", "/env"],
    expires_at=1_700_000_600.5,
    deploy=DeployConfig(cpu="2", memory="4G", custom_pod_template=TEMPLATE),
    owner="alice@example.org",
    pod_policy=WIDENED,
)


def _golden(name: str, value: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if os.environ.get("AENV_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with AENV_UPDATE_GOLDEN=1 and read it"
    assert text == path.read_text(), f"{name} differs from {path} (AENV_UPDATE_GOLDEN=1 rewrites)"


def _with(template: str) -> PodRecipe:
    fields = {name: getattr(RECIPE, name) for name in RECIPE.__dataclass_fields__}
    return PodRecipe(**{**fields, "deploy": DeployConfig(custom_pod_template=template)})


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def test_golden_pod_from_a_user_template() -> None:
    _golden("pod-user-template", instance_pod(RECIPE))


def test_the_template_gives_the_frame() -> None:
    pod = instance_pod(RECIPE)
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "swe-task"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("gvisor", "batch")
    assert spec["securityContext"]["runAsUser"] == 1000  # a non-root user of the template's
    assert [c["name"] for c in spec["containers"]] == ["runtime", "log-shipper"]
    assert spec["initContainers"][0]["command"][2] == (
        "echo registry.local/aenv/swe-task:2.1.0 > /cache/image"
    )
    assert [v["name"] for v in spec["volumes"]] == ["tmp", "workspace", "cache", "info"]
    runtime = _container(pod, "runtime")
    assert runtime["command"] == ["tini", "--", "python", "-m", "sandbox_runtime", "/env"]
    assert runtime["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "CACHE_DIR", "value": "/cache"} in runtime["env"]
    assert {"name": "RETRIES", "value": "3"} in runtime["env"]  # env values are text
    assert {"name": "cache", "mountPath": "/cache"} in runtime["volumeMounts"]
    assert {"name": "metrics", "containerPort": 9100} in runtime["ports"]
    shipper = _container(pod, "log-shipper")
    assert shipper["args"] == ["--target", "http://aenv-swe-task-9c1e07b34f2a:8080"]
    assert pod["metadata"]["labels"]["team"] == "rl"
    assert pod["metadata"]["labels"]["copy-of-ref"].startswith("swe-task-2.1.0-")  # a label
    note = pod["metadata"]["annotations"]["note"]
    assert note == "pod aenv-swe-task-9c1e07b34f2a of swe-task 2.1.0, literal ${NAME}"


def test_aenv_rays_parts_win() -> None:
    pod = instance_pod(RECIPE)
    spec = pod["spec"]
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["app.kubernetes.io/managed-by"] == "aenv-ray"
    assert labels["aenv-ray.io/instance"] == "9c1e07b34f2a"
    assert labels["aenv-ray.io/network"] == "false"  # the egress policy still selects it
    assert annotations["aenv-ray.io/expires-at"] == "1700000600.500"
    assert pod["metadata"]["name"] == "aenv-swe-task-9c1e07b34f2a"
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    runtime = _container(pod, "runtime")
    assert runtime["image"] == "registry.local/aenv/swe-task:2.1.0"
    assert runtime["args"] == ["--host", "$(POD_IP)", "--port", "8080"]
    assert runtime["env"][0] == {
        "name": "POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    assert [v["name"] for v in runtime["env"]].count("POD_IP") == 1
    assert runtime["readinessProbe"]["httpGet"] == {"path": "/aenv/v1/ready", "port": 8080}
    # deployConfig's cpu and memory are what the hub's caps checked: a template cannot raise them
    assert runtime["resources"]["limits"]["cpu"] == "2000m"
    assert runtime["resources"]["limits"]["memory"] == "4096Mi"
    assert runtime["resources"]["requests"] == {"cpu": "2000m", "memory": "4096Mi"}
    assert runtime["securityContext"]["readOnlyRootFilesystem"] is True
    for container in [*spec["containers"], *spec["initContainers"]]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["runAsNonRoot"] is True
    # a sidecar may keep a writable root when the template says so; by default it is read-only
    assert _container(pod, "log-shipper")["securityContext"]["readOnlyRootFilesystem"] is False
    assert spec["initContainers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_a_template_may_be_a_mapping_and_a_bare_spec() -> None:
    frame = {"spec": {"nodeSelector": {"disk": "ssd"}}}
    pod = instance_pod(_with(json.dumps(frame)))
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    fields = {name: getattr(RECIPE, name) for name in RECIPE.__dataclass_fields__}
    from_object = instance_pod(
        PodRecipe(**{**fields, "deploy": DeployConfig(custom_pod_template=frame)})
    )
    assert from_object == pod


def test_a_parsed_template_is_shared_and_never_changed() -> None:
    """The builders parse a template's text once (it is cached): building must not change it,
    and what parse_pod_template hands out is the caller's own copy."""
    fresh = parse_pod_template(TEMPLATE)
    first = instance_pod(RECIPE)
    fresh["spec"]["containers"].clear()  # the caller's copy: the cache does not see this
    assert instance_pod(RECIPE) == first
    assert template_of(TEMPLATE) == parse_pod_template(TEMPLATE)
    assert template_of(TEMPLATE)["spec"]["containers"][0]["command"] == [
        "tini",
        "--",
        "${COMMAND}",
    ]


def test_without_a_template_nothing_changes() -> None:
    fields = {name: getattr(RECIPE, name) for name in RECIPE.__dataclass_fields__}
    plain = instance_pod(PodRecipe(**{**fields, "deploy": DeployConfig()}))
    empty = instance_pod(PodRecipe(**{**fields, "deploy": DeployConfig(custom_pod_template="")}))
    assert plain == empty
    assert "nodeSelector" not in plain["spec"]


def test_placeholders_are_typed_where_kubernetes_wants_it() -> None:
    template = parse_pod_template(
        """
        spec:
          containers:
          - name: probe
            command: ["${COMMAND}", "--extra"]
            args: ["${PORT}", "x${PORT}"]
            env: [{name: P, value: "${PORT}"}]
            ports: [{containerPort: "${PORT}"}]
            readinessProbe: {httpGet: {port: "${PORT}"}}
        """
    )
    container = render_pod_template(template, VALUES)["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "sandbox_runtime", "/env", "--extra"]
    assert container["args"] == ["8080", "x8080"]
    assert container["env"] == [{"name": "P", "value": "8080"}]
    assert container["ports"] == [{"containerPort": 8080}]
    assert container["readinessProbe"]["httpGet"]["port"] == 8080


def test_values_are_never_read_as_yaml() -> None:
    template = parse_pod_template('metadata: {annotations: {a: "${ENV_NAME}"}}')
    hostile = {**VALUES, "ENV_NAME": "x}\nspec: {hostNetwork: true}"}
    rendered = render_pod_template(template, hostile)
    assert rendered["metadata"]["annotations"]["a"] == hostile["ENV_NAME"]
    assert rendered["spec"] == {}


def test_unknown_placeholders_are_named_with_the_known_ones() -> None:
    template = parse_pod_template(
        'metadata: {labels: {a: "${NAMESPACE}", b: "${ENV_NAME}-${Image}"}}'
    )
    with pytest.raises(ConfigurationError) as info:
        render_pod_template(template, VALUES)
    message = str(info.value)
    assert "['Image', 'NAMESPACE']" in message
    for name in PLACEHOLDERS:
        assert "${" + name + "}" in message
    with pytest.raises(ConfigurationError, match=r"\['NAMESPACE'\]"):
        instance_pod(_with('metadata: {labels: {a: "${NAMESPACE}"}}'))


def test_a_list_placeholder_inside_text_is_an_error() -> None:
    template = parse_pod_template('spec: {containers: [{name: a, args: ["run ${COMMAND}"]}]}')
    with pytest.raises(ConfigurationError, match=r"COMMAND.*whole value"):
        render_pod_template(template, VALUES)


def test_the_runtime_command_must_still_run_the_runtime() -> None:
    with pytest.raises(ConfigurationError, match=r"without \$\{COMMAND\}"):
        instance_pod(_with("spec: {containers: [{name: runtime, command: [sleep, infinity]}]}"))


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("a: [", "not valid YAML"),
        ("- just\n- a list", "must be a mapping"),
        ("kind: Deployment\nspec: {}", "a v1/Deployment"),
        ("apiVersion: v2\nkind: Pod", "v2/Pod"),
        ("spek: {}", "unknown top-level fields ['spek']"),
        ("spec: [1]", "`spec` must be a mapping"),
        ("spec: {containers: {runtime: {}}}", "`spec.containers` must be a list"),
        ("spec: {volumes: [{emptyDir: {}}]}", "each with a name"),
        ("---\nspec: {}\n---\nspec: {}\n", "not valid YAML"),
    ],
)
def test_malformed_templates(source: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="pod template") as info:
        parse_pod_template(source)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("spec: {volumes: [{name: workspace, emptyDir: {}}]}", "['workspace']"),
        (
            "spec: {volumes: [{name: big, emptyDir: {}}], containers: [{name: runtime, "
            "volumeMounts: [{name: big, mountPath: /workspace}]}]}",
            "['/workspace']",
        ),
    ],
)
def test_the_template_cannot_take_aenv_rays_volumes(source: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="aenv-ray") as info:
        instance_pod(_with(source))
    assert fragment in str(info.value)


def test_a_dual_pods_template_keeps_the_exec_helper_and_its_init_container_first() -> None:
    source = """
spec:
  initContainers:
  - {name: warm-cache, image: busybox:1.36, command: [sh, -c, "true"]}
  containers:
  - name: datasource
    command: [postgres]
    args: [-D, /workspace/db]
    resources: {limits: {cpu: 500m, memory: 256Mi}}
"""
    deploy = DeployConfig(
        pod_template="DualContainer", image_prefix="registry.local/", custom_pod_template=source
    )
    fields = {name: getattr(RECIPE, name) for name in RECIPE.__dataclass_fields__}
    pod = instance_pod(PodRecipe(**{**fields, "deploy": deploy, "datasource": "postgres:16"}))
    second = _container(pod, "datasource")
    # the helper stays the command and runs the template's under it, with the template's args
    assert second["command"] == [
        "/aenv-shared/aenv-exec",
        "--socket",
        "/aenv-shared/exec.sock",
        "--",
        "postgres",
    ]
    assert second["args"] == ["-D", "/workspace/db"]
    assert second["image"] == "postgres:16"
    assert second["resources"] == {"limits": {"cpu": "500m", "memory": "256Mi"}}
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["aenv-exec-install", "warm-cache"]
    assert all(
        c["securityContext"]["allowPrivilegeEscalation"] is False
        for c in pod["spec"]["initContainers"]
    )
    clash = "spec: {initContainers: [{name: aenv-exec-install, image: x}]}"
    dual_clash = DeployConfig(pod_template="DualContainer", custom_pod_template=clash)
    with pytest.raises(ConfigurationError, match="aenv-exec-install"):
        instance_pod(PodRecipe(**{**fields, "deploy": dual_clash, "datasource": "postgres:16"}))
    taken = "spec: {containers: [{name: datasource, volumeMounts: [{name: x, mountPath: /tmp}]}]}"
    dual_taken = DeployConfig(pod_template="DualContainer", custom_pod_template=taken)
    with pytest.raises(ConfigurationError, match="/tmp"):
        instance_pod(PodRecipe(**{**fields, "deploy": dual_taken, "datasource": "postgres:16"}))


def test_a_services_replicas_use_the_template_too() -> None:
    recipe = ServiceRecipe(
        service_id="7d1c2b",
        env_ref="swe-task@2.1.0",
        image="registry.local/aenv/swe-task:2.1.0",
        command=["python", "-m", "sandbox_runtime", "/env"],
        deploy=DeployConfig(custom_pod_template=TEMPLATE),
        pod_policy=WIDENED,
    )
    template = service_deployment(recipe)["spec"]["template"]
    assert "name" not in template["metadata"]  # the Deployment names its pods
    assert template["spec"]["restartPolicy"] == "Always"  # a Deployment's must
    assert template["spec"]["nodeSelector"] == {"pool": "swe-task"}
    shipper = _container(template, "log-shipper")
    assert shipper["args"] == ["--target", "http://aenv-svc-7d1c2b:8080"]  # NAME: the Deployment
    assert template["metadata"]["labels"]["aenv-ray.io/service"] == "7d1c2b"


def test_config_json_takes_a_template_as_text_or_object(tmp_path: Path) -> None:
    for template in (TEMPLATE, {"spec": {"nodeSelector": {"disk": "ssd"}}}):
        config = {"name": "x", "deployConfig": {"customPodTemplate": template}}
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert EnvConfig.load(tmp_path).deploy_config.custom_pod_template == template
    (tmp_path / "config.json").write_text(
        json.dumps({"name": "x", "deployConfig": {"customPodTemplate": ["spec"]}})
    )
    with pytest.raises(ConfigurationError, match="customPodTemplate"):
        EnvConfig.load(tmp_path)


# -- the real API server ------------------------------------------------------------------------


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[tuple[Any, str]]:
    with kube_cluster.scratch_namespace("aenv-templates") as made:
        yield made


@pytest.mark.k8s
@pytest.mark.timeout(2400)  # the first k8s test may pay for the cluster's one-time build
def test_the_api_server_accepts_templated_objects(namespace: tuple[Any, str]) -> None:
    from kubernetes import client

    api, name = namespace
    # admission checks that the template's priority and runtime classes exist
    scheduling, node = client.SchedulingV1Api(api), client.NodeV1Api(api)
    scheduling.create_priority_class({"metadata": {"name": "batch"}, "value": 1000})
    node.create_runtime_class({"metadata": {"name": "gvisor"}, "handler": "runsc"})
    try:
        pod = instance_pod(RECIPE)
        checked = client.CoreV1Api(api).create_namespaced_pod(name, pod, dry_run="All")
    finally:
        scheduling.delete_priority_class("batch")
        node.delete_runtime_class("gvisor")
    assert [c.name for c in checked.spec.containers] == ["runtime", "log-shipper"]
    assert checked.spec.security_context.run_as_non_root is True
    recipe = ServiceRecipe(
        service_id="7d1c2b",
        env_ref="swe-task@2.1.0",
        image="registry.local/aenv/swe-task:2.1.0",
        command=["python", "-m", "sandbox_runtime", "/env"],
        deploy=DeployConfig(custom_pod_template=TEMPLATE),
        storage=True,
        pod_policy=WIDENED,
    )
    made = client.AppsV1Api(api).create_namespaced_deployment(
        name, service_deployment(recipe), dry_run="All"
    )
    assert made.spec.template.spec.node_selector == {"pool": "swe-task"}


@pytest.mark.k8s
@pytest.mark.timeout(2400)
def test_a_templated_pod_serves_the_environment(
    kube_cluster: KubeCluster, namespace: tuple[Any, str]
) -> None:
    """A template with a wrapper command, an extra variable and a sidecar: the runtime still
    starts, becomes Ready and answers, and sees the template's variable."""
    from kubernetes import client

    api, name = namespace
    core = client.CoreV1Api(api)
    image, command = kube_cluster.runtime(builtin_refs()["mini-terminal@1.0.0"])
    template = """
    spec:
      containers:
      - name: runtime
        command: [/usr/bin/env, "${COMMAND}"]
        env: [{name: FROM_TEMPLATE, value: "${ENV_NAME}/${INSTANCE_ID}"}]
    """
    recipe = PodRecipe(
        instance_id="0123456789ab",
        env_ref="mini-terminal@1.0.0",
        image=image,
        command=command,  # this host's runtime (the fake kubelet), else the image's
        expires_at=time.time() + 600,
        deploy=DeployConfig(custom_pod_template=template),
    )
    pod = core.create_namespaced_pod(name, instance_pod(recipe))
    deadline = time.monotonic() + 60
    while True:
        pod = core.read_namespaced_pod(pod.metadata.name, name)
        conditions = pod.status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            break
        assert time.monotonic() < deadline, f"never Ready: {pod.status}"
        time.sleep(0.1)

    async def call() -> Any:
        async with Environment.attach(f"http://{pod.status.pod_ip}:8080") as env:
            return await env.call_tool("execute_command", {"command": "echo $FROM_TEMPLATE"})

    import asyncio

    result = asyncio.run(call())
    assert result.structured == {"output": "mini-terminal/0123456789ab\n", "returncode": 0}
