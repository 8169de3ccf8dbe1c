"""The Kubernetes objects of an instance, as plain JSON-able dicts: its Pod and the namespace's
egress-denying NetworkPolicy.

Pure functions, no API calls and no ``kubernetes`` import: the engine sends what these return
(the official client takes dicts as bodies), and the golden tests read them. Everything an engine
or a reaper must find again later lives in the object itself (labels to select, annotations to
read), so that no state outside the cluster is needed.

    >>> pod = instance_pod(PodRecipe(instance_id="4f2a9c1e07b3", env_ref="mini-terminal@1.0.0",
    ...     image="registry.local/aenv/mini-terminal:1.0.0", command=["python", "-m",
    ...     "sandbox_runtime", "/env"], expires_at=1700000000.0))
    >>> pod["metadata"]["name"], pod["metadata"]["labels"]["aenv-ray.io/instance"]
    ('aenv-mini-terminal-4f2a9c1e07b3', '4f2a9c1e07b3')
    >>> pod["spec"]["containers"][0]["resources"]["limits"]
    {'cpu': '1000m', 'memory': '2048Mi'}
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aenv_ray.config import DeployConfig, parse_cpu, parse_memory
from aenv_ray.datasource import SOCKET_ENV
from aenv_ray.envref import EnvRef
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, READY_PATH, TOKEN_ENV, TOKEN_SHA256_ENV
from k8s_backend.exec_helper import ExecHelper
from k8s_backend.templates import (
    PodTemplatePolicy,
    check_pod_template,
    merge_pod_template,
    render_pod_template,
    template_of,
)

__all__ = [
    "ANNOTATION_CREATED",
    "ANNOTATION_ENV",
    "ANNOTATION_EXPIRES",
    "ANNOTATION_NONCE",
    "ANNOTATION_OWNER",
    "CLAIM_FREE",
    "JUDGE_ONLY",
    "JUDGE_PATH",
    "JUDGE_SOCKET_ENV",
    "JUDGE_WORKSPACE",
    "LABEL_CLAIM",
    "LABEL_ENV",
    "LABEL_INSTANCE",
    "LABEL_MANAGED",
    "LABEL_NETWORK",
    "LABEL_OWNER",
    "LABEL_POOL",
    "LABEL_SESSION",
    "LABEL_VERSION",
    "MANAGER",
    "NETWORK_POLICY_NAME",
    "OUR_LABELS",
    "SHARED_PATH",
    "STORAGE_PATH",
    "PodRecipe",
    "deny_egress_policy",
    "instance_pod",
    "label_value",
    "pod_name",
    "quantities",
    "refuse_nested_namespaces",
    "second_image",
]

MANAGER = "aenv-ray"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_ENV = "aenv-ray.io/env"
LABEL_VERSION = "aenv-ray.io/version"
LABEL_INSTANCE = "aenv-ray.io/instance"
LABEL_OWNER = "aenv-ray.io/owner"
LABEL_POOL = "aenv-ray.io/pool"
LABEL_SESSION = "aenv-ray.io/session"
LABEL_CLAIM = "aenv-ray.io/claim"  # on a warm pool's pods: "free" until a client claims it
CLAIM_FREE = "free"
LABEL_NETWORK = "aenv-ray.io/network"  # "false": the egress-denying policy selects the pod
ANNOTATION_EXPIRES = "aenv-ray.io/expires-at"  # seconds since the epoch: the reaper's only input
ANNOTATION_OWNER = "aenv-ray.io/owner"  # the owner in full (its label may be shortened)
ANNOTATION_ENV = "aenv-ray.io/env-ref"
ANNOTATION_CREATED = "aenv-ray.io/created-at"
ANNOTATION_NONCE = "aenv-ray.io/token-nonce"  # public; the token is derived from it (tokens.py)
NETWORK_POLICY_NAME = "aenv-ray-deny-egress"
NOBODY = 65534
STORAGE_PATH = "/storage"
JUDGE_PATH = "/aenv-judge"
"""The judge container's socket directory (``deployConfig.judgeContainer``); the runtime's
mount of it is read-only."""
JUDGE_SOCKET_ENV = "AENV_JUDGE_SOCKET"
"""The runtime's variable naming the judge's socket (``deployConfig.judgeContainer``)."""
JUDGE_WORKSPACE = "/aenv-work"
"""Where the judge container sees the agent's workspace (read-only)."""
JUDGE_ONLY = "/data"
"""What the image holds there only the judge container reads: the runtime container (the
agent's) has an empty read-only volume over it (``deployConfig.judgeContainer``)."""
SHARED_PATH = "/aenv-shared"
"""A DualContainer pod's volume shared by its containers: the exec helper and its socket."""

_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_DNS_CHARS = re.compile(r"[^a-z0-9-]+")
OUR_LABELS = frozenset(
    {
        LABEL_MANAGED,
        LABEL_ENV,
        LABEL_VERSION,
        LABEL_INSTANCE,
        LABEL_OWNER,
        LABEL_POOL,
        LABEL_NETWORK,
        LABEL_SESSION,
        LABEL_CLAIM,
    }
)
"""The labels aenv-ray sets on its pods: a user's labels may not use them."""


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def label_value(text: str) -> str:
    """``text`` as a valid label value (at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both
    ends): kept when it is one, else cleaned and suffixed with a short hash, so distinct texts
    stay distinct.

        >>> label_value("1.0.0-rc.1"), label_value("alice@example.org")
        ('1.0.0-rc.1', 'alice-example.org-7a64adf2')
    """
    if len(text) <= 63 and re.fullmatch(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?", text):
        return text
    cleaned = _LABEL_CHARS.sub("-", text).strip("-._")[:54].rstrip("-._")
    return f"{cleaned}-{_digest(text)}" if cleaned else _digest(text)


def pod_name(env_name: str, instance_id: str) -> str:
    """A DNS-1123 name for an instance's pod: ``aenv-<env>-<id>`` (the env part cut to fit).

    >>> pod_name("Tau2_Airline", "4f2a9c1e07b3")
    'aenv-tau2-airline-4f2a9c1e07b3'
    """
    ident = _DNS_CHARS.sub("-", instance_id.lower()).strip("-")
    if not ident:
        raise ConfigurationError(f"instance id `{instance_id}` has no letters or digits")
    env = _DNS_CHARS.sub("-", env_name.lower()).strip("-")
    room = 63 - len("aenv--") - len(ident)
    env = env[: max(room, 0)].rstrip("-")
    return f"aenv-{env}-{ident}" if env else f"aenv-{ident}"[:63]


def _bytes_quantity(value: str | int) -> str:
    size = parse_memory(value)
    return f"{size >> 20}Mi" if size % (1 << 20) == 0 else str(size)


def quantities(deploy: DeployConfig) -> dict[str, str]:
    """``deployConfig``'s cpu and memory (and ``ephemeralStorage``, when given) as Kubernetes
    quantities (millicores, MiB when whole).

    >>> quantities(DeployConfig(cpu="500m", memory="4G"))
    {'cpu': '500m', 'memory': '4096Mi'}
    >>> quantities(DeployConfig(cpu="2C", memory=1000, ephemeralStorage="5Gi"))
    {'cpu': '2000m', 'memory': '1000', 'ephemeral-storage': '5120Mi'}
    """
    millicores = max(1, round(parse_cpu(deploy.cpu) * 1000))
    out = {"cpu": f"{millicores}m", "memory": _bytes_quantity(deploy.memory)}
    if deploy.ephemeral_storage is not None:
        out["ephemeral-storage"] = _bytes_quantity(deploy.ephemeral_storage)
    return out


def refuse_nested_namespaces(pod: Mapping[str, Any], deploy: DeployConfig, ref: str) -> None:
    """Refuse the pod of a definition whose code makes namespaces of its own inside its instance
    (``deployConfig.nestedNamespaces``: terminal-bench's and swe's boxes) when the pod cannot give
    them: its runtime container runs under the ``RuntimeDefault`` seccomp profile, which refuses
    ``unshare`` and ``clone`` of new namespaces without ``CAP_SYS_ADMIN`` (the pod has no
    capability). Such a pod would fail every episode's setup, recorded as the agent's; refused
    before any object is sent instead. A pod with a judge container passes (``deployConfig.
    judgeContainer``: terminal-bench's and swe's; the pod is the agent's box, the judge grades
    where the agent cannot reach, no namespace is made), a ``DualContainer`` pod passes (swe
    runs its commands and tests in the datasource container there, without namespaces), and so
    does a pod whose template gives a ``Localhost`` profile (an operator's, which may allow
    them).

    >>> pod = {"spec": {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    ...                 "containers": [{"name": "runtime"}]}}
    >>> refuse_nested_namespaces(pod, DeployConfig(), "notes@1.0.0")
    >>> refuse_nested_namespaces(pod, DeployConfig(nestedNamespaces=True), "tb@1.0.0")
    Traceback (most recent call last):
    ...
    aenv_ray.errors.ConfigurationError: tb@1.0.0 makes namespaces of its own inside its ...
    """
    if not deploy.nested_namespaces or deploy.pod_template == "DualContainer":
        return
    if deploy.judge_container:  # the pod is the agent's box, the judge another container
        return
    spec: Mapping[str, Any] = pod.get("spec") or {}
    containers: list[Mapping[str, Any]] = spec.get("containers") or []
    runtime = next((c for c in containers if c.get("name") == "runtime"), {})
    profile = (
        (runtime.get("securityContext") or {}).get("seccompProfile")
        or (spec.get("securityContext") or {}).get("seccompProfile")
        or {}
    )
    if profile.get("type") == "Localhost":
        return
    raise ConfigurationError(
        f"{ref} makes namespaces of its own inside its instance (deployConfig.nestedNamespaces: "
        "the boxes of its agent and its grader), which a Kubernetes pod under the RuntimeDefault "
        "seccomp profile may not: run it on the local engine (--engine local, AENV_ENGINE=local), "
        "or give its pods a Localhost seccomp profile that allows it (deployConfig."
        "customPodTemplate, where the operator allows it); docs/kubernetes.md, 'Which built-ins "
        "run in a pod', says why"
    )


def second_image(datasource: str, image_prefix: str) -> str:
    """The ``DualContainer`` template's second image: ``datasource`` itself when it is a full
    reference (it names a registry path or a tag), else ``image_prefix + datasource``.

        >>> second_image("postgres:16", "registry.local/aenv/"), second_image("db", "r.io/x/")
        ('postgres:16', 'r.io/x/db')
    """
    if not datasource:
        raise ConfigurationError(
            "podTemplate DualContainer needs a datasource: the second container's image"
        )
    if "/" in datasource or ":" in datasource or "@" in datasource or not image_prefix:
        return datasource
    return image_prefix + datasource


@dataclass(frozen=True)
class PodRecipe:
    """What an instance's pod is made of. ``image`` and ``command`` start the runtime (the
    environment's own image, a generic runtime image, or, on a test cluster whose kubelet runs
    commands on its host, this machine's Python); the runtime listens on ``port`` at the pod's
    IP (``$(POD_IP)``); ``arguments`` are the environment's own (after ``--``)."""

    instance_id: str
    env_ref: str
    image: str
    command: Sequence[str]
    expires_at: float
    deploy: DeployConfig = field(default_factory=DeployConfig)
    arguments: Sequence[str] = ()
    environment_variables: Mapping[str, str] = field(default_factory=dict)
    owner: str | None = None
    pool: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    datasource: str | None = None
    port: int = DEFAULT_FUNCTIONS_PORT
    storage_claim: str | None = None  # a PersistentVolumeClaim to mount at /storage
    token_sha256: str | None = None  # the token's digest: the runtime's AENV_RUNTIME_TOKEN_SHA256
    token_nonce: str | None = None  # the public nonce the token is derived from (tokens.py)
    session: str | None = None  # the engine session whose end reclaims the pod
    created_at: float | None = None  # seconds since the epoch, finer than creationTimestamp
    max_lifetime: int | None = None  # seconds: activeDeadlineSeconds, the backstop of any TTL
    warm: bool = False  # a warm pool's pod (``pool`` names it), free until claimed
    exec_helper: ExecHelper = field(default_factory=ExecHelper)  # DualContainer: where it is
    runtime_env: Sequence[Mapping[str, Any]] = ()  # the delivery's variables (EnvVar objects)
    pod_policy: PodTemplatePolicy = field(default_factory=PodTemplatePolicy)  # the template's


def _labels(recipe: PodRecipe, ref: EnvRef) -> dict[str, str]:
    labels = {
        LABEL_MANAGED: MANAGER,
        LABEL_ENV: label_value(ref.name),
        LABEL_VERSION: label_value(ref.version or ""),
        LABEL_INSTANCE: label_value(recipe.instance_id),
        LABEL_NETWORK: "true" if recipe.deploy.network else "false",
    }
    if recipe.owner:
        labels[LABEL_OWNER] = label_value(recipe.owner)
    if recipe.pool:
        labels[LABEL_POOL] = label_value(recipe.pool)
        if recipe.warm:
            labels[LABEL_CLAIM] = CLAIM_FREE
    if recipe.session:
        labels[LABEL_SESSION] = label_value(recipe.session)
    for key, value in recipe.labels.items():
        if key in OUR_LABELS:
            raise ConfigurationError(f"label `{key}` is aenv-ray's own; choose another name")
        labels[key] = label_value(value)
    return labels


def _environment(recipe: PodRecipe) -> list[dict[str, Any]]:
    return _runtime_env(
        [
            {"name": "AENV_INSTANCE_ID", "value": recipe.instance_id},
            *(
                [{"name": TOKEN_SHA256_ENV, "value": recipe.token_sha256}]
                if recipe.token_sha256
                else []
            ),
            *(dict(variable) for variable in recipe.runtime_env),
        ],
        {**recipe.deploy.env, **recipe.environment_variables},
    )


def _runtime_env(ours: list[dict[str, Any]], user: Mapping[str, str]) -> list[dict[str, Any]]:
    """The runtime's variables: the pod's IP and ``ours`` first (the runtime binds
    ``$(POD_IP)``), then the user's, sorted; a user's variable cannot replace one of ours."""
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        *ours,
    ]
    ours_names = {v["name"] for v in env} | {TOKEN_ENV, TOKEN_SHA256_ENV}
    taken = sorted(ours_names & {str(k) for k in user})
    if taken:
        raise ConfigurationError(
            f"environment variables {taken} are aenv-ray's own in a pod; choose other names"
        )
    env += [{"name": str(k), "value": str(v)} for k, v in sorted(user.items())]
    return env


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


@dataclass(frozen=True)
class _Runtime:
    """What the runtime container and the pod around it are made of, shared by an instance's
    Pod and a service's Deployment (so both get the same security, probe and resources)."""

    image: str
    command: Sequence[str]
    arguments: Sequence[str]
    env: list[dict[str, Any]]
    port: int
    deploy: DeployConfig
    datasource: str | None
    storage_claim: str | None
    restart_policy: str
    exec_helper: ExecHelper = field(default_factory=ExecHelper)
    shared_key: str = ""  # names the pod's shared directory on a host-process cluster
    pod_policy: PodTemplatePolicy = field(default_factory=PodTemplatePolicy)
    user_env: Mapping[str, str] = field(default_factory=dict)  # the user's (a judge gets them)


def _shared_dir(runtime: _Runtime) -> str:
    """Where the pod's containers find the shared volume: its mount path, or on a host-process
    test cluster (which mounts no volumes) a directory of that host, one per pod."""
    host = runtime.exec_helper.host_dir
    return f"{host.rstrip('/')}/{runtime.shared_key}" if host else SHARED_PATH


def _second_container(runtime: _Runtime, containers: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``DualContainer`` parts: the ``datasource`` container, running the exec helper as its
    command (its image's entrypoint is replaced; a command of the user's template runs under
    the helper), the init container that copies the helper from the aenv-ray image into the
    shared volume, the volumes, and the runtime's mount of it (read-only: a unix socket is
    reachable on a read-only mount) with the socket's path in ``AENV_DATASOURCE_SOCKET``."""
    helper, shared = runtime.exec_helper, _shared_dir(runtime)
    mount = {"name": "aenv-shared", "mountPath": SHARED_PATH}
    runtime_container = containers[0]
    runtime_container["volumeMounts"].append({**mount, "readOnly": True})
    if any(v.get("name") == SOCKET_ENV for v in runtime_container["env"]):
        raise ConfigurationError(
            f"environment variable {SOCKET_ENV} is aenv-ray's own in a DualContainer pod; "
            "choose another name"
        )
    runtime_container["env"].insert(1, {"name": SOCKET_ENV, "value": f"{shared}/exec.sock"})
    # a host-process kubelet checks a command exists when it first sees the pod, before the
    # init container has run: there the second container runs the host's build directly
    command = helper.binary if helper.host_dir else f"{shared}/aenv-exec"
    containers.append(
        {
            "name": "datasource",
            "image": second_image(runtime.datasource or "", runtime.deploy.image_prefix),
            "command": [command, "--socket", f"{shared}/exec.sock", "--"],
            "securityContext": _container_security(),
            "volumeMounts": [
                {"name": "workspace", "mountPath": runtime.deploy.workspace},
                mount,
                {"name": "datasource-tmp", "mountPath": "/tmp"},
            ],
        }
    )
    small = {"cpu": "100m", "memory": "32Mi"}
    return {
        "initContainers": [
            {
                "name": "aenv-exec-install",
                "image": helper.image,
                "command": [helper.binary, "--install", f"{shared}/aenv-exec"],
                "resources": {"requests": dict(small), "limits": dict(small)},
                "securityContext": _container_security(),
                "volumeMounts": [mount],
            }
        ],
        "volumes": [
            {"name": "aenv-shared", "emptyDir": {"sizeLimit": "16Mi"}},
            {"name": "datasource-tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _judge_container(
    runtime: _Runtime, containers: list[dict[str, Any]], user: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The ``judge`` container (``deployConfig.judgeContainer``: a module of the runtime's
    image) and its volumes: the runtime's workspace read-only at :data:`JUDGE_WORKSPACE`, its
    own empty directories at the workspace's path (its copy), ``/tests`` and ``/tmp``, and the
    socket's directory, which the runtime mounts read-only (``AENV_JUDGE_SOCKET`` names the
    socket there). Its own pid namespace (the pod's default), the runtime's resources, the
    user's variables and none of the runtime's. The runtime container gets an empty read-only
    volume over :data:`JUDGE_ONLY` (unless its workspace lies there): what the image holds
    there only the judge reads."""
    deploy, runtime_container = runtime.deploy, containers[0]
    socket_path = f"{JUDGE_PATH}/judge.sock"
    if any(v.get("name") == JUDGE_SOCKET_ENV for v in runtime_container["env"]):
        raise ConfigurationError(
            f"environment variable {JUDGE_SOCKET_ENV} is aenv-ray's own in a pod with a judge "
            "container; choose another name"
        )
    runtime_container["env"] = list(runtime_container["env"])
    runtime_container["env"].insert(1, {"name": JUDGE_SOCKET_ENV, "value": socket_path})
    runtime_container["volumeMounts"].append(
        {"name": "aenv-judge", "mountPath": JUDGE_PATH, "readOnly": True}
    )
    # the image's /data (a dataset baked into it: rows, tests, answers) is the judge's alone
    judge_only = not _inside(deploy.workspace, JUDGE_ONLY)
    if judge_only:
        runtime_container["volumeMounts"].append(
            {"name": "judge-only", "mountPath": JUDGE_ONLY, "readOnly": True}
        )
    python = runtime.command[0] if runtime.command else "python"
    containers.append(
        {
            "name": "judge",
            "image": runtime.image,
            "command": [python, "-I", "-B", "-m", str(deploy.judge_container)],
            "args": [
                *("--socket", socket_path, "--workspace", JUDGE_WORKSPACE),
                *("--app", deploy.workspace, "--seen-as", deploy.workspace),
                *("--tests", "/tests", "--scratch", "/tmp"),
            ],
            "env": [{"name": str(k), "value": str(v)} for k, v in sorted(user.items())],
            "resources": copy.deepcopy(runtime_container["resources"]),
            "securityContext": _container_security(),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [
                {"name": "workspace", "mountPath": JUDGE_WORKSPACE, "readOnly": True},
                {"name": "aenv-judge", "mountPath": JUDGE_PATH},
                {"name": "judge-app", "mountPath": deploy.workspace},
                {"name": "judge-tests", "mountPath": "/tests"},
                {"name": "judge-tmp", "mountPath": "/tmp"},
            ],
            "workingDir": deploy.workspace,
        }
    )
    # the judge's copy stops at 1 GiB (its CopyLimits); the rest is room for what the tests write;
    # the socket's directory also holds what the judge hands the runtime (swe: the bundle of the
    # base commit's history, which the runtime clones the agent's repository from)
    return [
        {"name": "aenv-judge", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "judge-app", "emptyDir": {"sizeLimit": "2Gi"}},
        {"name": "judge-tests", "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": "judge-tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        *([{"name": "judge-only", "emptyDir": {"sizeLimit": "1Mi"}}] if judge_only else []),
    ]


def _pod_spec(runtime: _Runtime) -> dict[str, Any]:
    deploy = runtime.deploy
    resources = quantities(deploy)
    mounts = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "workspace", "mountPath": deploy.workspace},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "workspace", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    if runtime.storage_claim:
        mounts.append({"name": "storage", "mountPath": STORAGE_PATH})
        volumes.append(
            {"name": "storage", "persistentVolumeClaim": {"claimName": runtime.storage_claim}}
        )
    container: dict[str, Any] = {
        "name": "runtime",
        "image": runtime.image,
        "command": list(runtime.command),
        "args": [
            *("--host", "$(POD_IP)", "--port", str(runtime.port)),
            *(("--", *runtime.arguments) if runtime.arguments else ()),
        ],
        "env": runtime.env,
        "ports": [{"name": "runtime", "containerPort": runtime.port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "readinessProbe": {
            "httpGet": {"path": READY_PATH, "port": runtime.port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "securityContext": _container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",  # a failed start says why
        "volumeMounts": mounts,
        "workingDir": deploy.workspace,
    }
    containers = [container]
    dual: dict[str, Any] = {}
    if deploy.pod_template == "DualContainer":
        container["env"] = list(container["env"])
        dual = _second_container(runtime, containers)
        volumes += dual["volumes"]
    if deploy.judge_container:
        volumes += _judge_container(runtime, containers, runtime.user_env)
    return {
        "restartPolicy": runtime.restart_policy,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NOBODY,
            "runAsGroup": NOBODY,
            "fsGroup": NOBODY,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        **({"initContainers": dual["initContainers"]} if dual else {}),
        "containers": containers,
        "volumes": volumes,
    }


def _framed(
    pod: dict[str, Any], runtime: _Runtime, ref: EnvRef, *, name: str, ident: str
) -> dict[str, Any]:
    """``pod`` (its ``metadata`` and ``spec``) in the user's own template, when
    ``deployConfig.customPodTemplate`` gives one (see :mod:`k8s_backend.templates`)."""
    source = runtime.deploy.custom_pod_template
    if not source:
        return pod
    values: dict[str, str | int | Sequence[str]] = {
        "COMMAND": list(runtime.command),
        "ENV_NAME": ref.name,
        "ENV_REF": str(ref),
        "ENV_VERSION": ref.version or "",
        "IMAGE": runtime.image,
        "INSTANCE_ID": ident,
        "NAME": name,
        "PORT": runtime.port,
    }
    template = render_pod_template(template_of(source), values)
    check_pod_template(template, runtime.pod_policy)
    labels = (template["metadata"].get("labels") or {}).items()
    template["metadata"]["labels"] = {str(k): label_value(str(v)) for k, v in labels}
    return merge_pod_template(pod, template)


def instance_pod(recipe: PodRecipe) -> dict[str, Any]:
    """The Pod of one instance (see the module docstring): resources from ``deployConfig`` as
    requests and limits, non-root with no privilege and no capability, seccomp RuntimeDefault, no
    service-account token, ``restartPolicy: Never``, a readiness probe on the runtime's ready
    path, ``activeDeadlineSeconds`` from ``max_lifetime``, writable ``/tmp`` and the workspace
    (``deployConfig.workspace``, ``/workspace`` by default, the working directory) as emptyDirs
    (the root file system is read-only), the PersistentVolumeClaim
    ``storage_claim`` at ``/storage`` when given, all in the user's own template when
    ``deployConfig.customPodTemplate`` gives one."""
    ref = EnvRef.parse(recipe.env_ref)
    runtime = _Runtime(
        image=recipe.image,
        command=recipe.command,
        arguments=recipe.arguments,
        env=_environment(recipe),
        port=recipe.port,
        deploy=recipe.deploy,
        datasource=recipe.datasource,
        storage_claim=recipe.storage_claim,
        restart_policy="Never",
        exec_helper=recipe.exec_helper,
        shared_key=recipe.instance_id,
        pod_policy=recipe.pod_policy,
        user_env={**recipe.deploy.env, **recipe.environment_variables},
    )
    name = pod_name(ref.name, recipe.instance_id)
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": _labels(recipe, ref),
            "annotations": {
                ANNOTATION_EXPIRES: f"{recipe.expires_at:.3f}",
                ANNOTATION_ENV: str(ref),
                **({ANNOTATION_CREATED: f"{recipe.created_at:.6f}"} if recipe.created_at else {}),
                **({ANNOTATION_OWNER: recipe.owner} if recipe.owner else {}),
                **({ANNOTATION_NONCE: recipe.token_nonce} if recipe.token_nonce else {}),
            },
        },
        "spec": _pod_spec(runtime),
    }
    if recipe.max_lifetime:
        pod["spec"]["activeDeadlineSeconds"] = recipe.max_lifetime
    framed = _framed(pod, runtime, ref, name=name, ident=recipe.instance_id)
    refuse_nested_namespaces(framed, recipe.deploy, str(ref))
    return {"apiVersion": "v1", "kind": "Pod", **framed}


def deny_egress_policy() -> dict[str, Any]:
    """The namespace's NetworkPolicy that denies all egress of aenv-ray pods whose environment
    did not ask for the network (label ``aenv-ray.io/network: "false"``). One per namespace,
    not one per pod: creating an instance costs no extra API call."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": NETWORK_POLICY_NAME, "labels": {LABEL_MANAGED: MANAGER}},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_MANAGED: MANAGER, LABEL_NETWORK: "false"}},
            "policyTypes": ["Egress"],
            "egress": [],
        },
    }
