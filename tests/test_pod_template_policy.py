"""The allow-list of a tenant's pod template (aenv_ray.pod_template): every field an attacker
used is refused with its full path and the entry that would allow it; every allowed field takes
values within its bounds and refuses them beyond; an operator's widening lets exactly the named
field through; the engine's own security settings win over any template, widened or not; the
hub refuses at push and at create with a 403 naming the field, widened per tenant by its
operator. Offline and fast; the real API server's part is tests/test_k8s_pod_template_hub.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aenv_ray.config import DeployConfig
from aenv_ray.errors import ConfigurationError, PermissionDeniedError, PodTemplateRefusedError
from aenv_ray.pod_template import (
    SAMPLE_VALUES,
    PodTemplatePolicy,
    check_deploy_template,
    check_pod_template,
    parse_pod_template,
    render_pod_template,
)
from envhub.limits import Limits, check_deploy, load_limits
from k8s_backend.manifests import PodRecipe, instance_pod


def _check(source: str, policy: PodTemplatePolicy | None = None) -> None:
    check_pod_template(render_pod_template(parse_pod_template(source), SAMPLE_VALUES), policy)


def _refused(source: str, policy: PodTemplatePolicy | None = None) -> PodTemplateRefusedError:
    with pytest.raises(PodTemplateRefusedError) as info:
        _check(source, policy)
    return info.value


# what the attacks of issue 22 set (and what the deny-list before it let through), then what the
# deny-list refused already: each with the full path the refusal names
ATTACKS = [
    # AppArmor unconfined: the annotation, the field (pod and container)
    (
        "metadata: {annotations: {container.apparmor.security.beta.kubernetes.io/runtime: "
        "unconfined}}",
        "metadata.annotations[container.apparmor.security.beta.kubernetes.io/runtime]",
    ),
    (
        "spec: {securityContext: {appArmorProfile: {type: Unconfined}}}",
        "spec.securityContext.appArmorProfile.type",
    ),
    (
        "spec: {containers: [{name: runtime, securityContext: {appArmorProfile: "
        "{type: Unconfined}}}]}",
        "spec.containers[runtime].securityContext.appArmorProfile.type",
    ),
    # SELinux spc_t (a super-privileged container's type)
    (
        "spec: {securityContext: {seLinuxOptions: {type: spc_t}}}",
        "spec.securityContext.seLinuxOptions",
    ),
    (
        "spec: {containers: [{name: s, securityContext: {seLinuxOptions: {type: spc_t}}}]}",
        "spec.containers[s].securityContext.seLinuxOptions",
    ),
    # the root group
    ("spec: {securityContext: {runAsGroup: 0}}", "spec.securityContext.runAsGroup"),
    (
        "spec: {containers: [{name: s, securityContext: {runAsGroup: 0}}]}",
        "spec.containers[s].securityContext.runAsGroup",
    ),
    ("spec: {securityContext: {fsGroup: 0}}", "spec.securityContext.fsGroup"),
    (
        "spec: {securityContext: {supplementalGroups: [0]}}",
        "spec.securityContext.supplementalGroups[0]",
    ),
    # a volume from the operator's ConfigMap
    (
        "spec: {volumes: [{name: cfg, configMap: {name: hub-settings}}]}",
        "spec.volumes[cfg].configMap",
    ),
    # onto the control plane: tolerate everything, select its nodes
    ("spec: {tolerations: [{operator: Exists}]}", "spec.tolerations[0].key"),
    (
        "spec: {tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists}]}",
        "spec.tolerations[0].key",
    ),
    (
        "spec: {nodeSelector: {node-role.kubernetes.io/control-plane: ''}}",
        "spec.nodeSelector[node-role.kubernetes.io/control-plane]",
    ),
    (
        "spec: {nodeSelector: {kubernetes.io/hostname: node-1}}",
        "spec.nodeSelector[kubernetes.io/hostname]",
    ),
    # what the deny-list accepted offline
    ("spec: {serviceAccountName: hub-admin}", "spec.serviceAccountName"),
    ("spec: {serviceAccount: hub-admin}", "spec.serviceAccount"),
    ("spec: {nodeName: control-plane-1}", "spec.nodeName"),
    (
        "spec: {containers: [{name: s, envFrom: [{configMapRef: {name: hub-settings}}]}]}",
        "spec.containers[s].envFrom",
    ),
    ("spec: {runtimeClassName: runc}", "spec.runtimeClassName"),
    ("spec: {hostUsers: true}", "spec.hostUsers"),
    ("spec: {imagePullSecrets: [{name: registry-admin}]}", "spec.imagePullSecrets"),
    ("spec: {priorityClassName: system-node-critical}", "spec.priorityClassName"),
    ("spec: {affinity: {nodeAffinity: {}}}", "spec.affinity"),
    ("spec: {dnsPolicy: None}", "spec.dnsPolicy"),
    ("spec: {dnsConfig: {nameservers: [10.0.0.10]}}", "spec.dnsConfig"),
    ("spec: {readinessGates: [{conditionType: x}]}", "spec.readinessGates"),
    ("spec: {shareProcessNamespace: true}", "spec.shareProcessNamespace"),
    ("spec: {hostAliases: [{ip: 10.0.0.1, hostnames: [hub]}]}", "spec.hostAliases"),
    ("metadata: {name: other-pod}", "metadata.name"),
    ("metadata: {namespace: kube-system}", "metadata.namespace"),
    ("metadata: {ownerReferences: []}", "metadata.ownerReferences"),
    ("metadata: {labels: {aenv-ray.io/owner: bob}}", "metadata.labels[aenv-ray.io/owner]"),
    (
        "metadata: {labels: {app.kubernetes.io/managed-by: x}}",
        "metadata.labels[app.kubernetes.io/managed-by]",
    ),
    (
        "metadata: {annotations: {seccomp.security.alpha.kubernetes.io/pod: unconfined}}",
        "metadata.annotations[seccomp.security.alpha.kubernetes.io/pod]",
    ),
    # what the deny-list refused already
    ("spec: {hostNetwork: true}", "spec.hostNetwork"),
    ("spec: {hostPID: true}", "spec.hostPID"),
    ("spec: {hostIPC: true}", "spec.hostIPC"),
    ("spec: {automountServiceAccountToken: true}", "spec.automountServiceAccountToken"),
    ("spec: {activeDeadlineSeconds: 60}", "spec.activeDeadlineSeconds"),
    ("spec: {ephemeralContainers: []}", "spec.ephemeralContainers"),
    ("spec: {securityContext: {runAsUser: 0}}", "spec.securityContext.runAsUser"),
    ("spec: {securityContext: {runAsNonRoot: false}}", "spec.securityContext.runAsNonRoot"),
    (
        "spec: {securityContext: {seccompProfile: {type: Unconfined}}}",
        "spec.securityContext.seccompProfile.type",
    ),
    (
        "spec: {securityContext: {sysctls: [{name: net.core.somaxconn, value: '1024'}]}}",
        "spec.securityContext.sysctls",
    ),
    ("spec: {volumes: [{name: root, hostPath: {path: /}}]}", "spec.volumes[root].hostPath"),
    (
        "spec: {volumes: [{name: keys, secret: {secretName: hub-admin}}]}",
        "spec.volumes[keys].secret",
    ),
    (
        "spec: {volumes: [{name: data, persistentVolumeClaim: {claimName: other-tenant}}]}",
        "spec.volumes[data].persistentVolumeClaim",
    ),
    (
        "spec: {volumes: [{name: t, projected: {sources: [{serviceAccountToken: {path: t}}]}}]}",
        "spec.volumes[t].projected",
    ),
    ("spec: {volumes: [{name: e, ephemeral: {}}]}", "spec.volumes[e].ephemeral"),
    ("spec: {volumes: [{name: c, csi: {driver: x}}]}", "spec.volumes[c].csi"),
    (
        "spec: {containers: [{name: s, securityContext: {privileged: true}}]}",
        "spec.containers[s].securityContext.privileged",
    ),
    (
        "spec: {containers: [{name: runtime, securityContext: {allowPrivilegeEscalation: true}}]}",
        "spec.containers[runtime].securityContext.allowPrivilegeEscalation",
    ),
    (
        "spec: {initContainers: [{name: i, securityContext: {capabilities: {add: [NET_ADMIN]}}}]}",
        "spec.initContainers[i].securityContext.capabilities.add",
    ),
    (
        "spec: {containers: [{name: s, securityContext: {runAsUser: 0}}]}",
        "spec.containers[s].securityContext.runAsUser",
    ),
    (
        "spec: {containers: [{name: s, securityContext: {procMount: Unmasked}}]}",
        "spec.containers[s].securityContext.procMount",
    ),
    (
        "spec: {containers: [{name: s, securityContext: {readOnlyRootFilesystem: false}}]}",
        "spec.containers[s].securityContext.readOnlyRootFilesystem",
    ),
    (
        "spec: {containers: [{name: s, ports: [{containerPort: 80, hostPort: 80}]}]}",
        "spec.containers[s].ports[0].hostPort",
    ),
    (
        "spec: {containers: [{name: s, env: [{name: K, valueFrom: {secretKeyRef: "
        "{name: hub, key: token}}}]}]}",
        "spec.containers[s].env[K].valueFrom",
    ),
    (
        "spec: {containers: [{name: s, env: [{name: K, valueFrom: {configMapKeyRef: "
        "{name: hub-settings, key: url}}}]}]}",
        "spec.containers[s].env[K].valueFrom",
    ),
    (
        "spec: {containers: [{name: s, securityContext: {windowsOptions: {hostProcess: true}}}]}",
        "spec.containers[s].securityContext.windowsOptions",
    ),
    (
        "spec: {containers: [{name: s, volumeMounts: [{name: v, mountPath: /v, "
        "mountPropagation: Bidirectional}]}]}",
        "spec.containers[s].volumeMounts[v].mountPropagation",
    ),
    (
        "spec: {containers: [{name: s, volumeMounts: [{name: v, mountPath: /v, subPath: ../..}]}]}",
        "spec.containers[s].volumeMounts[v].subPath",
    ),
    (
        "spec: {containers: [{name: s, readinessProbe: {httpGet: {host: 169.254.169.254, "
        "port: 80}}}]}",
        "spec.containers[s].readinessProbe.httpGet.host",
    ),
    (
        "spec: {containers: [{name: s, lifecycle: {postStart: {exec: {command: [x]}}}}]}",
        "spec.containers[s].lifecycle",
    ),
    (
        "spec: {containers: [{name: runtime, resources: {limits: {nvidia.com/gpu: 1}}}]}",
        "spec.containers[runtime].resources.limits[nvidia.com/gpu]",
    ),
]


@pytest.mark.parametrize(("source", "field"), ATTACKS, ids=[f for _, f in ATTACKS])
def test_every_field_off_the_allow_list_is_refused_by_its_path(source: str, field: str) -> None:
    refusal = _refused(source)
    assert refusal.field == f"customPodTemplate.{field}"
    message = str(refusal)
    assert message.startswith(f"customPodTemplate.{field} ")
    assert "deployConfig.customPodTemplate" in message  # where the tenant fixes it
    assert f"`{refusal.allow}`" in message  # what the operator adds
    assert "--pod-template-allow" in message
    assert isinstance(refusal, PermissionDeniedError)  # a 403 from a hub
    # the entry the message names lets exactly this template through: the control
    _check(source, PodTemplatePolicy(allow=frozenset({str(refusal.allow)})))
    # and the builders refuse it too: no pod is made of it
    with pytest.raises(PodTemplateRefusedError):
        instance_pod(_recipe(source))


def _recipe(source: str, policy: PodTemplatePolicy | None = None) -> PodRecipe:
    return PodRecipe(
        instance_id="9c1e07b34f2a",
        env_ref="swe-task@2.1.0",
        image="registry.local/aenv/swe-task:2.1.0",
        command=["python", "-m", "sandbox_runtime", "/env"],
        expires_at=1_700_000_600.5,
        deploy=DeployConfig(custom_pod_template=source),
        pod_policy=policy or PodTemplatePolicy(),
    )


ALLOWED_TEMPLATE = """
metadata:
  labels: {team: rl, app.kubernetes.io/name: swe, example.org/tier: "${ENV_NAME}"}
  annotations: {note: "pod ${NAME}", example.org/owner: research}
spec:
  nodeSelector: {pool: gpu, kubernetes.io/arch: amd64, topology.kubernetes.io/zone: z1}
  tolerations:
  - {key: gpu, operator: Exists, effect: NoSchedule}
  - {key: dedicated, operator: Equal, value: rl, effect: NoExecute, tolerationSeconds: 60}
  terminationGracePeriodSeconds: 30
  hostUsers: false
  hostNetwork: false
  automountServiceAccountToken: false
  shareProcessNamespace: false
  securityContext:
    runAsUser: 1000
    runAsGroup: 1000
    fsGroup: 1000
    supplementalGroups: [2000]
    fsGroupChangePolicy: OnRootMismatch
    runAsNonRoot: true
    seccompProfile: {type: Localhost, localhostProfile: profiles/strict.json}
    appArmorProfile: {type: RuntimeDefault}
  initContainers:
  - name: warm-cache
    image: busybox:1.36
    command: [sh, -c, "echo ${IMAGE} > /cache/image"]
    volumeMounts: [{name: cache, mountPath: /cache}]
    resources: {limits: {cpu: 500m, memory: 128Mi}}
  containers:
  - name: runtime
    command: [tini, "--", "${COMMAND}"]
    env: [{name: CACHE_DIR, value: /cache}, {name: RETRIES, value: 3}]
    ports: [{name: metrics, containerPort: 9100, protocol: TCP}]
    volumeMounts: [{name: cache, mountPath: /cache, readOnly: true}]
    securityContext:
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      privileged: false
      runAsNonRoot: true
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
  - name: log-shipper
    image: registry.local/log-shipper:1
    imagePullPolicy: IfNotPresent
    args: ["--target", "http://localhost:${PORT}"]
    workingDir: /cache
    resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: "1", memory: 1Gi,
      ephemeral-storage: 1Gi}}
    readinessProbe: {httpGet: {path: /health, port: 9200, scheme: HTTP}, periodSeconds: 5}
    livenessProbe: {tcpSocket: {port: metrics}, failureThreshold: 3}
    startupProbe: {exec: {command: [cat, /tmp/ok]}}
    terminationMessagePolicy: FallbackToLogsOnError
  volumes:
  - {name: cache, emptyDir: {sizeLimit: 2Gi}}
  - {name: scratch, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
"""


def test_a_template_using_every_allowed_field_passes_and_reaches_the_pod() -> None:
    _check(ALLOWED_TEMPLATE)
    check_deploy_template(DeployConfig(custom_pod_template=ALLOWED_TEMPLATE), ref="swe@1.0.0")
    pod = instance_pod(_recipe(ALLOWED_TEMPLATE))
    spec = pod["spec"]
    assert spec["tolerations"][0] == {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert spec["hostUsers"] is False
    assert spec["securityContext"]["seccompProfile"]["type"] == "Localhost"
    assert spec["securityContext"]["appArmorProfile"] == {"type": "RuntimeDefault"}
    assert [c["name"] for c in spec["containers"]] == ["runtime", "log-shipper"]
    assert pod["metadata"]["labels"]["example.org/tier"] == "swe-task"


def _in(path: str, value: str) -> str:
    """A template setting ``value`` (YAML) at the dotted ``path`` under a sidecar ``s``."""
    return f"spec: {{containers: [{{name: s, {path}: {value}}}]}}"


# (template, the refused field or None when it is within bounds)
BOUNDS = [
    ("spec: {securityContext: {runAsUser: 1}}", None),
    ("spec: {securityContext: {runAsUser: 2147483647}}", None),
    ("spec: {securityContext: {runAsUser: 2147483648}}", "spec.securityContext.runAsUser"),
    ("spec: {securityContext: {runAsUser: '1000'}}", "spec.securityContext.runAsUser"),
    ("spec: {securityContext: {runAsUser: true}}", "spec.securityContext.runAsUser"),
    ("spec: {securityContext: {runAsNonRoot: true}}", None),
    ("spec: {securityContext: {seccompProfile: {type: RuntimeDefault}}}", None),
    (
        "spec: {securityContext: {seccompProfile: {type: Localhost, localhostProfile: ../x}}}",
        "spec.securityContext.seccompProfile.localhostProfile",
    ),
    ("spec: {securityContext: {seccompProfile: {}}}", "spec.securityContext.seccompProfile.type"),
    ("spec: {terminationGracePeriodSeconds: 300}", None),
    ("spec: {terminationGracePeriodSeconds: 301}", "spec.terminationGracePeriodSeconds"),
    ("spec: {hostUsers: false}", None),
    (
        "spec: {tolerations: [{key: a, tolerationSeconds: 86401}]}",
        "spec.tolerations[0].tolerationSeconds",
    ),
    ("spec: {tolerations: [{key: a, operator: Gt}]}", "spec.tolerations[0].operator"),
    ("spec: {tolerations: [" + ", ".join(["{key: a}"] * 9) + "]}", "spec.tolerations"),
    (
        "spec: {nodeSelector: {" + ", ".join(f"k{i}: v" for i in range(17)) + "}}",
        "spec.nodeSelector",
    ),
    ("metadata: {labels: {'bad key!': x}}", "metadata.labels[bad key!]"),
    ("metadata: {annotations: {a: " + "x" * 4097 + "}}", "metadata.annotations[a]"),
    ("metadata: {labels: {version: 2}, annotations: {retries: 3}}", None),
    ("metadata: {labels: {a: [x]}}", "metadata.labels[a]"),
    ("spec: {volumes: [{name: v, emptyDir: {sizeLimit: 16Gi}}]}", None),
    (
        "spec: {volumes: [{name: v, emptyDir: {sizeLimit: 17Gi}}]}",
        "spec.volumes[v].emptyDir.sizeLimit",
    ),
    (
        "spec: {volumes: [{name: v, emptyDir: {medium: HugePages}}]}",
        "spec.volumes[v].emptyDir.medium",
    ),
    ("spec: {volumes: [{name: Bad_Name, emptyDir: {}}]}", "spec.volumes[Bad_Name].name"),
    (_in("resources", "{limits: {cpu: '4', memory: 4Gi}}"), None),
    (_in("resources", "{limits: {cpu: 4001m}}"), "spec.containers[s].resources.limits[cpu]"),
    (
        _in("resources", "{requests: {memory: 5Gi}}"),
        "spec.containers[s].resources.requests[memory]",
    ),
    (_in("resources", "{limits: {memory: lots}}"), "spec.containers[s].resources.limits[memory]"),
    (
        _in("resources", "{limits: {ephemeral-storage: 17Gi}}"),
        "spec.containers[s].resources.limits[ephemeral-storage]",
    ),
    (_in("resources", "{claims: [{name: gpu}]}"), "spec.containers[s].resources.claims"),
    (_in("env", "[{name: A, value: " + "x" * 32768 + "}]"), None),
    (_in("env", "[{name: A, value: " + "x" * 32769 + "}]"), "spec.containers[s].env[A].value"),
    (_in("env", "[{name: A, value: [1]}]"), "spec.containers[s].env[A].value"),
    (_in("env", "[{name: '1=2', value: x}]"), "spec.containers[s].env[1=2].name"),
    (_in("command", "[" + ", ".join(["x"] * 64) + "]"), None),
    (_in("command", "[" + ", ".join(["x"] * 65) + "]"), "spec.containers[s].command"),
    (_in("ports", "[{containerPort: 65535}]"), None),
    (_in("ports", "[{containerPort: 65536}]"), "spec.containers[s].ports[0].containerPort"),
    (_in("workingDir", "relative/dir"), "spec.containers[s].workingDir"),
    (
        _in("volumeMounts", "[{name: v, mountPath: /a/../etc}]"),
        "spec.containers[s].volumeMounts[v].mountPath",
    ),
    (_in("securityContext", "{capabilities: {drop: [ALL, NET_RAW]}}"), None),
    (
        _in("securityContext", "{capabilities: {drop: ['all; rm']}}"),
        "spec.containers[s].securityContext.capabilities.drop[0]",
    ),
    (_in("securityContext", "{privileged: false, allowPrivilegeEscalation: false}"), None),
    (
        _in("readinessProbe", "{periodSeconds: 0}"),
        "spec.containers[s].readinessProbe.periodSeconds",
    ),
    (
        "spec: {containers: [" + ", ".join(f"{{name: c{i}}}" for i in range(9)) + "]}",
        "spec.containers",
    ),
    # the template's own containers together, not only each one
    (
        "spec: {containers: [{name: a, resources: {limits: {cpu: '3'}}}, "
        "{name: b, resources: {limits: {cpu: '2'}}}]}",
        "spec.containers[*].resources.limits[cpu]",
    ),
    (
        "spec: {containers: [{name: a, resources: {requests: {memory: 3Gi}}}, "
        "{name: b, resources: {requests: {memory: 2Gi}}}]}",
        "spec.containers[*].resources.requests[memory]",
    ),
]


@pytest.mark.parametrize(("source", "field"), BOUNDS, ids=[s[:60] for s, _ in BOUNDS])
def test_allowed_fields_take_values_within_their_bounds_only(
    source: str, field: str | None
) -> None:
    if field is None:
        _check(source)
        return
    refusal = _refused(source)
    assert refusal.field == f"customPodTemplate.{field}", str(refusal)


def test_caps_follow_the_policy() -> None:
    sidecar = _in("resources", "{limits: {cpu: '6', memory: 6Gi}}")
    assert _refused(sidecar).field == "customPodTemplate.spec.containers[s].resources.limits[cpu]"
    _check(sidecar, PodTemplatePolicy(cpu=8.0, memory=8 * 1024**3))
    assert PodTemplatePolicy().widened(cpu=1.0).cpu == 4.0  # widening never lowers a cap


def test_an_allow_entry_lets_through_that_field_and_nothing_beside_it() -> None:
    policy = PodTemplatePolicy(allow=frozenset({"spec.securityContext.seLinuxOptions"}))
    _check("spec: {securityContext: {seLinuxOptions: {type: spc_t}}}", policy)
    # the same name in a container, or a sibling field, is still refused
    refusal = _refused(
        "spec: {containers: [{name: s, securityContext: {seLinuxOptions: {type: spc_t}}}]}",
        policy,
    )
    assert refusal.allow == "spec.containers[].securityContext.seLinuxOptions"
    assert _refused("spec: {securityContext: {sysctls: []}}", policy).allow == (
        "spec.securityContext.sysctls"
    )
    # a map key is its own entry: one GPU resource, not every extended resource
    gpu = PodTemplatePolicy(allow=frozenset({"spec.containers[].resources.limits[nvidia.com/gpu]"}))
    _check(_in("resources", "{limits: {nvidia.com/gpu: 2}}"), gpu)
    assert _refused(_in("resources", "{limits: {example.com/fpga: 1}}"), gpu).allow == (
        "spec.containers[].resources.limits[example.com/fpga]"
    )


@pytest.mark.parametrize("entry", ["", "spec..x", "status.phase", "spec.containers[", "spec x"])
def test_allow_entries_must_be_field_paths(entry: str) -> None:
    with pytest.raises(ConfigurationError, match="not field paths"):
        PodTemplatePolicy(allow=frozenset({entry}))


def test_the_engines_own_security_wins_over_a_widened_template() -> None:
    """An operator who widens whole security contexts still gets aenv-ray's defaults: the merge
    puts them last."""
    hostile = """
spec:
  automountServiceAccountToken: true
  restartPolicy: Always
  securityContext: {runAsNonRoot: false, seccompProfile: {type: Unconfined}}
  initContainers:
  - name: i
    securityContext: {privileged: true, allowPrivilegeEscalation: true,
      capabilities: {add: [SYS_ADMIN]}, runAsNonRoot: false}
  containers:
  - name: runtime
    securityContext: {privileged: true, allowPrivilegeEscalation: true,
      capabilities: {add: [SYS_PTRACE]}, readOnlyRootFilesystem: false, runAsNonRoot: false}
  - name: s
    securityContext: {privileged: true, capabilities: {add: [NET_ADMIN]}}
"""
    wide = PodTemplatePolicy(
        allow=frozenset(
            {
                "spec.automountServiceAccountToken",
                "spec.restartPolicy",
                "spec.securityContext",
                "spec.initContainers[].securityContext",
                "spec.containers[].securityContext",
            }
        )
    )
    pod = instance_pod(_recipe(hostile, wide))
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in [*spec["containers"], *spec["initContainers"]]:
        security = container["securityContext"]
        assert security["privileged"] is False, container["name"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["runAsNonRoot"] is True
    runtime = next(c for c in spec["containers"] if c["name"] == "runtime")
    assert runtime["securityContext"]["readOnlyRootFilesystem"] is True
    # the control: the same template is refused without the widening
    with pytest.raises(PodTemplateRefusedError):
        instance_pod(_recipe(hostile))


# -- the hub's limits ---------------------------------------------------------------------------

SELINUX = "spec: {securityContext: {seLinuxOptions: {level: 's0:c1,c2'}}}"


def test_the_hub_checks_each_tenants_policy(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_text(
        json.dumps(
            {
                "tenants": {
                    "gpu-lab": {"pod_template_allow": ["spec.securityContext.seLinuxOptions"]}
                }
            }
        )
    )
    limits = load_limits(path, pod_template_allow=frozenset({"spec.tolerations"}))
    deploy = DeployConfig(custom_pod_template=SELINUX)
    check_deploy(limits.for_tenant("gpu-lab"), "gpu-lab", "x@1.0.0", deploy)
    with pytest.raises(PodTemplateRefusedError) as info:
        check_deploy(limits.for_tenant("alice"), "alice", "x@1.0.0", deploy)
    assert str(info.value).startswith("`x@1.0.0`: customPodTemplate.spec.securityContext.seLinux")
    assert info.value.env_name == "x@1.0.0"
    # the flag widens every tenant, and the engine's backstop holds what any tenant may set
    anything = DeployConfig(custom_pod_template="spec: {tolerations: [{operator: Exists}]}")
    check_deploy(limits.for_tenant("alice"), "alice", "x@1.0.0", anything)
    engine = limits.engine_pod_policy()
    assert engine.allow == {"spec.tolerations", "spec.securityContext.seLinuxOptions"}
    # a tenant's cpu and memory caps bound its template's containers
    big = DeployConfig(custom_pod_template=_in("resources", "{limits: {memory: 6Gi}}"))
    roomy = Limits.parse({"tenants": {"big": {"memory": "8G"}}})
    check_deploy(roomy.for_tenant("big"), "big", "x@1.0.0", big)
    with pytest.raises(PodTemplateRefusedError):
        check_deploy(roomy.for_tenant("alice"), "alice", "x@1.0.0", big)


@pytest.mark.parametrize("value", ['"spec.x"', '["spec x"]', "[1]"])
def test_a_limits_file_with_a_bad_allow_entry_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ConfigurationError, match="pod_template_allow"):
        Limits.parse(json.loads(f'{{"default": {{"pod_template_allow": {value}}}}}'))


def test_values_are_checked_as_they_will_be_rendered() -> None:
    """A placeholder's value lands where the check looks (the engines check what they render),
    and an unknown placeholder is the render's error."""
    template = parse_pod_template('spec: {nodeSelector: {pool: "${ENV_NAME}"}}')
    check_pod_template(render_pod_template(template, SAMPLE_VALUES))
    rendered = render_pod_template(template, {**SAMPLE_VALUES, "ENV_NAME": "a\nb"})
    with pytest.raises(PodTemplateRefusedError, match=r"spec\.nodeSelector\[pool\]"):
        check_pod_template(rendered)
    with pytest.raises(ConfigurationError, match="unknown placeholders"):
        check_deploy_template(
            DeployConfig(custom_pod_template='metadata: {labels: {a: "${NAMESPACE}"}}')
        )
