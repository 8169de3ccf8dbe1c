"""The Kubernetes objects of a long-running service: a Deployment of its replicas, a ClusterIP
Service in front of them and, with storage, a PersistentVolumeClaim every replica mounts at
``/storage``; and the JSON Patch that updates a service in place.

Pure functions returning plain dicts, as :mod:`k8s_backend.manifests`; the replicas' pods are
built by the same code as an instance's Pod (same security, probe, resources and user template),
with ``restartPolicy: Always`` as a Deployment requires. All three objects are named from the
service id alone (:func:`service_name`, :func:`storage_claim_name`), and carry the id, the owner
and the environment in labels and annotations, so that an engine finds them again after any
restart. The claim has no owner reference: deleting the Deployment and the Service keeps the
data, and deleting the claim is a separate, explicit step.

    >>> recipe = ServiceRecipe(service_id="7d1c2b", env_ref="notes@1.0.0",
    ...     image="registry.local/aenv/notes:1.0.0", command=["python", "-m", "sandbox_runtime"],
    ...     replicas=2, storage=True)
    >>> [o["kind"] for o in service_objects(recipe)]
    ['PersistentVolumeClaim', 'Deployment', 'Service']
    >>> service_url("7d1c2b", "aenv")
    'http://aenv-svc-7d1c2b.aenv.svc:8080'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aenv_ray.config import DeployConfig, parse_memory
from aenv_ray.envref import EnvRef
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, TOKEN_SHA256_ENV
from k8s_backend.exec_helper import ExecHelper
from k8s_backend.manifests import (
    ANNOTATION_ENV,
    ANNOTATION_NONCE,
    ANNOTATION_OWNER,
    LABEL_ENV,
    LABEL_MANAGED,
    LABEL_NETWORK,
    LABEL_OWNER,
    LABEL_VERSION,
    MANAGER,
    OUR_LABELS,
    _digest,
    _framed,
    _pod_spec,
    _Runtime,
    _runtime_env,
    label_value,
)
from k8s_backend.templates import PodTemplatePolicy

__all__ = [
    "ANNOTATION_SERVICE",
    "DEFAULT_STORAGE_SIZE",
    "LABEL_SERVICE",
    "ServiceRecipe",
    "service_deployment",
    "service_name",
    "service_objects",
    "service_service",
    "service_storage_claim",
    "service_update_patch",
    "service_url",
    "storage_claim_name",
    "storage_quantity",
]

LABEL_SERVICE = "aenv-ray.io/service"
ANNOTATION_SERVICE = "aenv-ray.io/service-id"  # the id in full (its label may be shortened)
DEFAULT_STORAGE_SIZE = "10Gi"
_PREFIX = "aenv-svc-"
_STORAGE_PREFIX = "aenv-storage-"


@dataclass(frozen=True)
class ServiceRecipe:
    """What a service is made of: ``replicas`` pods of ``env_ref`` running the runtime as an
    instance's pod does (``image``, ``command``, ``arguments``, variables, ``deploy``), behind
    one Service on ``port``; with ``storage``, a claim of ``storage_size`` (a size as
    ``deployConfig.memory`` reads it: ``"10G"``, ``"512Mi"``) mounted at ``/storage``; with
    ``token_sha256``, every replica's runtime asks callers for the token of that digest, as an
    instance's does (derived from ``token_nonce``: :mod:`k8s_backend.tokens`)."""

    service_id: str
    env_ref: str
    image: str
    command: Sequence[str]
    replicas: int = 1
    deploy: DeployConfig = field(default_factory=DeployConfig)
    arguments: Sequence[str] = ()
    environment_variables: Mapping[str, str] = field(default_factory=dict)
    owner: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    datasource: str | None = None
    storage: bool = False
    storage_size: str = DEFAULT_STORAGE_SIZE
    storage_class: str | None = None  # None: the cluster's default StorageClass
    storage_access: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    port: int = DEFAULT_FUNCTIONS_PORT
    token_sha256: str | None = None  # the replicas' token digest (None: no token)
    token_nonce: str | None = None  # the public nonce it is derived from (the Deployment's)
    runtime_env: Sequence[Mapping[str, Any]] = ()  # the delivery's variables (EnvVar objects)
    exec_helper: ExecHelper = field(default_factory=ExecHelper)  # DualContainer: where it is
    pod_policy: PodTemplatePolicy = field(default_factory=PodTemplatePolicy)  # the template's


def _dns_part(service_id: str, room: int) -> str:
    """``service_id`` as the tail of a DNS-1035 label of at most ``room`` characters: kept when
    it is lower-case letters, digits and inner dashes, else cleaned and suffixed with a hash
    (so distinct ids keep distinct names)."""
    if not service_id:
        raise ConfigurationError("a service id cannot be empty")
    lowered = service_id.lower()
    clean = "".join(c if c.isascii() and (c.isalnum() or c == "-") else "-" for c in lowered)
    clean = clean.strip("-")
    if clean == service_id and len(clean) <= room:
        return clean
    return f"{clean[: room - 9].rstrip('-')}-{_digest(service_id)}".lstrip("-")


def service_name(service_id: str) -> str:
    """The name of a service's Deployment and Service: ``aenv-svc-<id>``, a DNS-1035 label of at
    most 63 characters (a Service's name must start with a letter), stable for the id.

        >>> service_name("7d1c2b"), service_name("Web_Shop")
        ('aenv-svc-7d1c2b', 'aenv-svc-web-shop-ccc8726f')
    """
    return _PREFIX + _dns_part(service_id, 63 - len(_PREFIX))


def storage_claim_name(service_id: str) -> str:
    """The name of a service's PersistentVolumeClaim: ``aenv-storage-<id>``.

    >>> storage_claim_name("7d1c2b")
    'aenv-storage-7d1c2b'
    """
    return _STORAGE_PREFIX + _dns_part(service_id, 63 - len(_STORAGE_PREFIX))


def service_url(service_id: str, namespace: str, port: int = DEFAULT_FUNCTIONS_PORT) -> str:
    """The service's stable in-cluster URL, through its Service's cluster DNS name."""
    return f"http://{service_name(service_id)}.{namespace}.svc:{port}"


def storage_quantity(size: str | int) -> str:
    """A storage size as a Kubernetes quantity, read as ``deployConfig.memory`` is (one letter
    is binary: ``"10G"`` is 10 GiB); GiB or MiB when whole.

        >>> storage_quantity("10G"), storage_quantity("512Mi"), storage_quantity(1000)
        ('10Gi', '512Mi', '1000')
    """
    size_bytes = parse_memory(size)
    for unit, shift in (("Gi", 30), ("Mi", 20)):
        if size_bytes % (1 << shift) == 0:
            return f"{size_bytes >> shift}{unit}"
    return str(size_bytes)


def _service_label(recipe: ServiceRecipe) -> dict[str, str]:
    return {LABEL_SERVICE: label_value(recipe.service_id)}


def _object_meta(recipe: ServiceRecipe, name: str) -> dict[str, Any]:
    ref = EnvRef.parse(recipe.env_ref)
    return {
        "name": name,
        "labels": {
            LABEL_MANAGED: MANAGER,
            **_service_label(recipe),
            LABEL_ENV: label_value(ref.name),
            **({LABEL_OWNER: label_value(recipe.owner)} if recipe.owner else {}),
        },
        "annotations": {
            ANNOTATION_SERVICE: recipe.service_id,
            **({ANNOTATION_OWNER: recipe.owner} if recipe.owner else {}),
        },
    }


def _pod_template(recipe: ServiceRecipe) -> dict[str, Any]:
    """The replicas' pod: an instance's pod without a TTL or an instance label, named by the
    Deployment; each replica reads its own pod name as ``AENV_INSTANCE_ID``."""
    ref = EnvRef.parse(recipe.env_ref)
    if isinstance(recipe.replicas, bool) or not 0 <= recipe.replicas <= 1000:
        raise ConfigurationError(f"replicas must be from 0 to 1000, got {recipe.replicas!r}")
    env = _runtime_env(
        [
            {"name": "AENV_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "AENV_SERVICE_ID", "value": recipe.service_id},
            *(
                [{"name": TOKEN_SHA256_ENV, "value": recipe.token_sha256}]
                if recipe.token_sha256
                else []
            ),
            *(dict(variable) for variable in recipe.runtime_env),
        ],
        {**recipe.deploy.env, **recipe.environment_variables},
    )
    runtime = _Runtime(
        image=recipe.image,
        command=recipe.command,
        arguments=recipe.arguments,
        env=env,
        port=recipe.port,
        deploy=recipe.deploy,
        datasource=recipe.datasource,
        storage_claim=storage_claim_name(recipe.service_id) if recipe.storage else None,
        restart_policy="Always",
        exec_helper=recipe.exec_helper,
        pod_policy=recipe.pod_policy,
        user_env={**recipe.deploy.env, **recipe.environment_variables},
    )
    labels = {
        LABEL_MANAGED: MANAGER,
        **_service_label(recipe),
        LABEL_ENV: label_value(ref.name),
        LABEL_VERSION: label_value(ref.version or ""),
        LABEL_NETWORK: "true" if recipe.deploy.network else "false",
        **({LABEL_OWNER: label_value(recipe.owner)} if recipe.owner else {}),
    }
    for key, value in recipe.labels.items():
        if key in OUR_LABELS or key == LABEL_SERVICE:
            raise ConfigurationError(f"label `{key}` is aenv-ray's own; choose another name")
        labels[key] = label_value(value)
    spec = _pod_spec(runtime)
    if recipe.storage and recipe.storage_access == "ReadWriteOnce":
        # a ReadWriteOnce volume is attached to one node: every replica (and a rolling update's
        # new pod) must run there; the first replica, matching none, may go anywhere
        spec["affinity"] = {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": _service_label(recipe)},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    pod = {
        "metadata": {
            "labels": labels,
            "annotations": {
                ANNOTATION_SERVICE: recipe.service_id,
                ANNOTATION_ENV: str(ref),
                **({ANNOTATION_OWNER: recipe.owner} if recipe.owner else {}),
            },
        },
        "spec": spec,
    }
    name = service_name(recipe.service_id)
    framed = _framed(pod, runtime, ref, name=name, ident=recipe.service_id)
    framed["metadata"].pop("name", None)  # the Deployment names its pods
    return framed


def service_deployment(recipe: ServiceRecipe) -> dict[str, Any]:
    """The service's Deployment (apps/v1): ``replicas`` pods selected by the service label, and a
    rolling update that starts a new pod before it stops an old one (``maxUnavailable: 0``), so
    an update keeps serving."""
    ref = EnvRef.parse(recipe.env_ref)
    metadata = _object_meta(recipe, service_name(recipe.service_id))
    metadata["labels"][LABEL_VERSION] = label_value(ref.version or "")
    metadata["annotations"][ANNOTATION_ENV] = str(ref)
    if recipe.token_nonce:
        metadata["annotations"][ANNOTATION_NONCE] = recipe.token_nonce
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": recipe.replicas,
            "selector": {"matchLabels": _service_label(recipe)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "revisionHistoryLimit": 3,
            "template": _pod_template(recipe),
        },
    }


def service_service(recipe: ServiceRecipe) -> dict[str, Any]:
    """The service's Service: a ClusterIP on the runtime's port, in front of its ready replicas
    (its Endpoints follow their readiness); :func:`service_url` is its address."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _object_meta(recipe, service_name(recipe.service_id)),
        "spec": {
            "type": "ClusterIP",
            "selector": _service_label(recipe),
            "ports": [
                {
                    "name": "runtime",
                    "port": recipe.port,
                    "targetPort": recipe.port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def service_storage_claim(recipe: ServiceRecipe) -> dict[str, Any]:
    """The service's PersistentVolumeClaim (``storage_access``, ReadWriteOnce by default, of
    ``storage_size``), with no owner: it outlives the Deployment."""
    spec: dict[str, Any] = {
        "accessModes": [recipe.storage_access],
        "resources": {"requests": {"storage": storage_quantity(recipe.storage_size)}},
    }
    if recipe.storage_class is not None:
        spec["storageClassName"] = recipe.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _object_meta(recipe, storage_claim_name(recipe.service_id)),
        "spec": spec,
    }


def service_objects(recipe: ServiceRecipe) -> list[dict[str, Any]]:
    """Everything to create for a service, in order: the claim (with storage) before the
    Deployment whose pods mount it, the Service last."""
    claim = [service_storage_claim(recipe)] if recipe.storage else []
    return [*claim, service_deployment(recipe), service_service(recipe)]


def service_update_patch(
    recipe: ServiceRecipe, *, replicas_only: bool = False
) -> list[dict[str, Any]]:
    """A JSON Patch (RFC 6902; the official client sends a list body as one) that moves the
    service's Deployment to ``recipe``: its replicas and, unless ``replicas_only``, its whole pod
    template (image, variables, arguments, version) and the version label and env-ref
    annotation. It first tests the service label, so it fails (422) on any other Deployment.
    The Deployment rolls the pods new-first; the Service and the claim stay as they are."""
    ref = EnvRef.parse(recipe.env_ref)
    patch: list[dict[str, Any]] = [
        {
            "op": "test",
            "path": "/spec/selector/matchLabels/" + _pointer(LABEL_SERVICE),
            "value": label_value(recipe.service_id),
        },
        {"op": "replace", "path": "/spec/replicas", "value": recipe.replicas},
    ]
    if replicas_only:
        if isinstance(recipe.replicas, bool) or not 0 <= recipe.replicas <= 1000:
            raise ConfigurationError(f"replicas must be from 0 to 1000, got {recipe.replicas!r}")
        return patch
    return [
        *patch,
        {"op": "replace", "path": "/spec/template", "value": _pod_template(recipe)},
        {
            "op": "add",
            "path": "/metadata/labels/" + _pointer(LABEL_VERSION),
            "value": label_value(ref.version or ""),
        },
        {
            "op": "add",
            "path": "/metadata/annotations/" + _pointer(ANNOTATION_ENV),
            "value": str(ref),
        },
    ]


def _pointer(key: str) -> str:
    """``key`` as one JSON Pointer token (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")
