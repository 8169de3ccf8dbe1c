"""``KubernetesServices``: the Kubernetes engine's long-running services
(:class:`~aenv_ray.engine.ServiceEngine`), as the objects :mod:`k8s_backend.services` builds:
a Deployment of the replicas, a Service in front of them and, with storage, a
PersistentVolumeClaim.

The cluster keeps a service, not us: the Deployment replaces dead replicas, its rolling update
replaces old ones new-first, and the Service's Endpoints list the ready ones. This module sends
the objects, patches them, and reads the state back from three objects the API serves: the
Deployment's status (replicas wanted, updated, ready; a ``ReplicaFailure`` such as a full
ResourceQuota), the replicas' pods (why one does not start: unschedulable, an image that cannot
be pulled, a runtime that keeps exiting) and the Endpoints (who serves now). Every replica's
runtime asks for the service's token, kept in the Deployment's pod template (as an instance's
token is kept in its pod)::

    services = KubernetesEngine("rl").services
    info = await services.create(ServiceSpec("svc-1", "notes@1.0.0", replicas=2))
    info.url  # 'http://aenv-svc-svc-1.rl.svc:8080', inside the cluster
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aenv_ray.config import EnvConfig
from aenv_ray.engine import Route, ServiceInfo, ServiceSpec
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    CapacityError,
    ClusterError,
    ConfigurationError,
    ServiceNotFoundError,
    StartupTimeoutError,
)
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, TOKEN_SHA256_ENV
from aenv_ray.resolve import resolve_environment
from k8s_backend._api import Kube
from k8s_backend.delivery import Delivery, exec_helper_of
from k8s_backend.exec_helper import ExecHelper
from k8s_backend.manifests import ANNOTATION_ENV, ANNOTATION_NONCE
from k8s_backend.services import (
    ANNOTATION_SERVICE,
    DEFAULT_STORAGE_SIZE,
    LABEL_SERVICE,
    ServiceRecipe,
    service_deployment,
    service_name,
    service_objects,
    service_update_patch,
    service_url,
    storage_claim_name,
)
from k8s_backend.state import startup_failure, timestamp
from k8s_backend.templates import PodTemplatePolicy
from k8s_backend.tokens import KeyHolder, TokenKey, new_nonce
from k8s_backend.tokens import digest as token_digest

__all__ = ["KubernetesServices", "is_serving", "service_info", "service_problem"]

_DELETE_OPTIONS = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
_CRASHES = 2  # a replica not ready after this many restarts keeps failing: say why


class KubernetesServices:
    """Services in one namespace (see the module docstring); built by
    ``KubernetesEngine.services``, which gives it the engine's connection and delivery.

    Args:
        kube: the connection (its namespace is the services').
        delivery: chooses the replicas' image and command, as for an instance's pod.
        port: the runtime's port in every replica and on the Service.
        env_path: where names are looked up when a spec has no ``project``.
        prepare: called (in a worker thread) before replicas without network start: makes
            sure the namespace's egress-denying NetworkPolicy exists.
        check_open: raises :class:`~aenv_ray.errors.ClosedError` once the engine is closed.
        targets_ttl: seconds a service's :meth:`targets` are reused (the proxy asks per call).
        pod_policy: what the replicas' ``deployConfig.customPodTemplate`` may set.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        delivery: Delivery,
        port: int,
        env_path: str | None = None,
        prepare: Callable[[], None] = lambda: None,
        check_open: Callable[[], None] = lambda: None,
        targets_ttl: float = 1.0,
        pod_policy: PodTemplatePolicy | None = None,
        tokens: KeyHolder | None = None,
    ) -> None:
        self._kube = kube
        self._tokens = tokens or KeyHolder(kube)
        self.namespace = kube.namespace
        self.delivery = delivery
        self.port = port
        self.env_path = env_path
        self._prepare = prepare
        self._check_open = check_open
        self.targets_ttl = targets_ttl
        self.pod_policy = pod_policy or PodTemplatePolicy()
        self._targets: dict[str, tuple[float, list[Route]]] = {}

    def __repr__(self) -> str:
        return f"KubernetesServices(namespace={self.namespace!r}, delivery={self.delivery!r})"

    # -- plumbing ------------------------------------------------------------------------------
    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._kube.request, method, path, **kwargs)

    async def _token_key(self) -> TokenKey:
        key = self._tokens.key
        return key if key is not None else await asyncio.to_thread(self._tokens.load)

    def _info(
        self,
        deployment: Mapping[str, Any],
        endpoints: Mapping[str, Any],
        pods: builtins.list[dict[str, Any]],
    ) -> ServiceInfo:
        return service_info(
            deployment,
            endpoints,
            pods,
            namespace=self.namespace,
            token=self._tokens.of_service(deployment),
        )

    def _recipe(
        self, spec: ServiceSpec, token: tuple[str, str] | None
    ) -> tuple[ServiceRecipe, EnvConfig]:
        self._check_open()
        if spec.project is not None:
            project = Path(spec.project)
            config = EnvConfig.load(project)
            ref = spec.env_ref or config.ref
        else:
            where = spec.env_path if spec.env_path is not None else self.env_path
            ref, project = resolve_environment(spec.env_ref, where)
            config = EnvConfig.load(project)
        image, command = self.delivery.runtime(config, project)
        helper = ExecHelper()
        if config.deploy_config.pod_template == "DualContainer":
            placed = exec_helper_of(self.delivery)
            # the image only: a host-process cluster's per-pod directory has no per-replica name
            helper = ExecHelper(image=placed.image) if placed.host_dir else placed
        recipe = ServiceRecipe(
            service_id=spec.service_id,
            env_ref=str(EnvRef.parse(ref)),
            image=image,
            command=command,
            replicas=spec.replicas,
            deploy=config.deploy_config,
            arguments=list(spec.arguments),
            environment_variables=dict(spec.environment_variables),
            owner=spec.owner,
            labels=dict(spec.labels),
            storage=spec.storage,
            # AEnvironment's deployConfig.service.storageSize: the volume's size
            storage_size=config.deploy_config.service.storage_size or DEFAULT_STORAGE_SIZE,
            port=self.port,
            token_sha256=token[0] if token else None,
            token_nonce=token[1] if token else None,
            runtime_env=self.delivery.env(config),
            exec_helper=helper,
            pod_policy=self.pod_policy,
        )
        return recipe, config

    def _not_found(self, service_id: str) -> Callable[[str], AEnvError]:
        def make(said: str) -> AEnvError:
            return ServiceNotFoundError(
                f"no service `{service_id}` in namespace {self.namespace} ({said}); it was "
                "deleted, or never created here"
            )

        return make

    async def _deployment(self, service_id: str) -> dict[str, Any]:
        name = service_name(service_id)
        found: dict[str, Any] = await self._request(
            "GET",
            self._kube.path("apps/v1", "deployments", name),
            what=f"read deployment {name}",
            not_found=self._not_found(service_id),
        )
        return found

    async def _read(
        self, service_id: str
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        """The service's Deployment, Endpoints (empty when there are none yet) and pods."""
        deployment = await self._deployment(service_id)
        pods = self._request(
            "GET",
            self._kube.path("", "pods"),
            query={"labelSelector": _selector(deployment)},
            what=f"list the pods of service {service_id}",
        )
        endpoints, listing = await asyncio.gather(self._endpoints(service_id), pods)
        return deployment, endpoints, list(listing.get("items") or [])

    async def _endpoints(self, service_id: str) -> dict[str, Any]:
        """The Endpoints of the service's Service (empty until the controller makes them)."""
        name = service_name(service_id)
        try:
            found: dict[str, Any] = await self._request(
                "GET",
                self._kube.path("", "endpoints", name),
                what=f"read endpoints {name}",
                not_found=_Missing,
            )
        except _Missing:
            return {}
        return found

    # -- the contract --------------------------------------------------------------------------
    async def create(self, spec: ServiceSpec, *, timeout: float = 120.0) -> ServiceInfo:
        """Send the service's objects (claim, Deployment, Service) and return once
        ``spec.replicas`` serve behind the Service. When an object is refused, those already
        sent are deleted; when the replicas do not come up, the service stays and the error
        (and :meth:`get`'s ``detail``) says why."""
        deadline = time.monotonic() + timeout
        key, nonce = await self._token_key(), new_nonce()
        made = key.token(f"service/{spec.service_id}", nonce)
        recipe, config = self._recipe(spec, (token_digest(made), nonce))
        if not config.deploy_config.network:
            await asyncio.to_thread(self._prepare)
        sent: list[dict[str, Any]] = []
        try:
            for obj in service_objects(recipe):
                group, kind = _where(obj)
                await self._request(
                    "POST",
                    self._kube.path(group, kind),
                    body=obj,
                    what=f"create {obj['kind']} {obj['metadata']['name']}",
                )
                sent.append(obj)
        except BaseException:
            for obj in reversed(sent):
                group, kind = _where(obj)
                with contextlib.suppress(AEnvError):
                    await self._delete(group, kind, obj["metadata"]["name"])
            raise
        return await self._until_serving(spec.service_id, spec.replicas, deadline, timeout)

    async def get(self, service_id: str) -> ServiceInfo:
        """The service as the cluster has it now."""
        self._check_open()
        deployment, endpoints, pods = await self._read(service_id)
        return self._info(deployment, endpoints, pods)

    async def update(self, spec: ServiceSpec, *, timeout: float = 120.0) -> ServiceInfo:
        """Patch the Deployment to ``spec``: only its replica count when the replicas would run
        the same (image, command, arguments, variables, version), else its pod template too,
        which the Deployment rolls out new-first. Returns once it serves as asked."""
        deadline = time.monotonic() + timeout
        current = await self._deployment(spec.service_id)
        kept = _runtime_variables(current).get(TOKEN_SHA256_ENV)
        nonce = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NONCE)
        recipe, config = self._recipe(spec, (kept, str(nonce)) if kept and nonce else None)
        if recipe.storage != _has_claim(current):
            raise ConfigurationError(
                f"service {spec.service_id}: storage cannot be added to or removed from a "
                "running service; create a new service"
            )
        if not config.deploy_config.network:
            await asyncio.to_thread(self._prepare)
        name = service_name(spec.service_id)
        await self._request(
            "PATCH",
            self._kube.path("apps/v1", "deployments", name),
            body=service_update_patch(recipe, replicas_only=_same_runtime(current, recipe)),
            content_type="application/json-patch+json",
            what=f"update deployment {name}",
            not_found=self._not_found(spec.service_id),
        )
        self._targets.pop(spec.service_id, None)
        return await self._until_serving(spec.service_id, spec.replicas, deadline, timeout)

    async def delete(self, service_id: str, *, delete_storage: bool = False) -> ServiceInfo:
        """Delete the Deployment (its replicas with it) and the Service; the claim too when
        ``delete_storage``. Idempotent: what is already gone is skipped."""
        self._check_open()
        try:
            last = await self.get(service_id)
        except ServiceNotFoundError:
            last = ServiceInfo(id=service_id, env_ref="", replicas=0, ready=0)
        name = service_name(service_id)
        await self._delete("apps/v1", "deployments", name)
        await self._delete("", "services", name)
        if delete_storage:
            await self._delete("", "persistentvolumeclaims", storage_claim_name(service_id))
        self._targets.pop(service_id, None)
        return ServiceInfo(
            id=last.id,
            env_ref=last.env_ref,
            replicas=0,
            ready=0,
            url=last.url,
            storage=None if delete_storage else last.storage,
            detail=last.detail,
        )

    async def targets(self, service_id: str) -> builtins.list[Route]:
        """Each ready replica's address (from the Service's Endpoints) and the service's
        token, read again at most every ``targets_ttl`` seconds."""
        self._check_open()
        now = time.monotonic()
        cached = self._targets.get(service_id)
        if cached is not None and now - cached[0] < self.targets_ttl:
            return cached[1]
        deployment, endpoints = await asyncio.gather(
            self._deployment(service_id), self._endpoints(service_id)
        )
        await self._token_key()
        token = self._tokens.of_service(deployment)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        routes = [Route(url, headers) for url in _ready_urls(endpoints)]
        self._targets[service_id] = (now, routes)
        return routes

    # -- helpers -------------------------------------------------------------------------------
    async def _delete(self, group: str, kind: str, name: str) -> None:
        with contextlib.suppress(_Missing):
            await self._request(
                "DELETE",
                self._kube.path(group, kind, name),
                body=_DELETE_OPTIONS,
                what=f"delete {kind} {name}",
                not_found=_Missing,
            )

    async def _until_serving(
        self, service_id: str, replicas: int, deadline: float, timeout: float
    ) -> ServiceInfo:
        """Poll the service until ``replicas`` serve (:func:`is_serving`), a replica cannot
        start (:func:`service_problem`), or the deadline."""
        pause = 0.05
        while True:
            deployment, endpoints, pods = await self._read(service_id)
            if is_serving(deployment, endpoints, pods):
                return self._info(deployment, endpoints, pods)
            problem = service_problem(deployment, pods)
            if problem is not None:
                raise problem
            if time.monotonic() >= deadline:
                info = self._info(deployment, endpoints, pods)
                raise StartupTimeoutError(
                    f"service {service_id}: {info.ready} of {replicas} replicas served within "
                    f"{timeout:g} s; see `kubectl -n {self.namespace} describe deployment "
                    f"{service_name(service_id)}`",
                    timeout=timeout,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)


class _Missing(AEnvError):
    """A 404 this module expects (an object already gone, Endpoints not made yet)."""


def _where(obj: Mapping[str, Any]) -> tuple[str, str]:
    kinds = {
        "Deployment": ("apps/v1", "deployments"),
        "Service": ("", "services"),
        "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
    }
    return kinds[str(obj["kind"])]


def _selector(deployment: Mapping[str, Any]) -> str:
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _runtime(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    template = (deployment.get("spec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    return next((c for c in containers if c.get("name") == "runtime"), {})


def _runtime_variables(deployment: Mapping[str, Any]) -> dict[str, str]:
    """The runtime container's literal variables (those from a fieldRef left out)."""
    return {
        str(v["name"]): str(v["value"])
        for v in _runtime(deployment).get("env") or []
        if "value" in v and v.get("name")
    }


def _has_claim(deployment: Mapping[str, Any]) -> bool:
    template = (deployment.get("spec") or {}).get("template") or {}
    volumes = (template.get("spec") or {}).get("volumes") or []
    return any("persistentVolumeClaim" in v for v in volumes)


def _same_runtime(deployment: Mapping[str, Any], recipe: ServiceRecipe) -> bool:
    """True when ``recipe``'s replicas would run what the Deployment's run now: a change of
    replicas alone, which needs no rollout."""
    wanted = service_deployment(recipe)
    notes = (deployment.get("metadata") or {}).get("annotations") or {}
    mine, theirs = _runtime(wanted), _runtime(deployment)
    return (
        notes.get(ANNOTATION_ENV) == recipe.env_ref
        and mine.get("image") == theirs.get("image")
        and list(mine.get("command") or []) == list(theirs.get("command") or [])
        and list(mine.get("args") or []) == list(theirs.get("args") or [])
        and _runtime_variables(wanted) == _runtime_variables(deployment)
    )


def _ready_urls(endpoints: Mapping[str, Any]) -> list[str]:
    urls = []
    for subset in endpoints.get("subsets") or []:
        ports = subset.get("ports") or []
        port = next((p.get("port") for p in ports if p.get("name") == "runtime"), None)
        if port is None and ports:
            port = ports[0].get("port")
        for address in subset.get("addresses") or []:
            if address.get("ip") and port:
                urls.append(f"http://{address['ip']}:{port}")
    return sorted(urls)


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods not being deleted, oldest first."""
    alive = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    return sorted(
        alive, key=lambda p: timestamp((p.get("metadata") or {}).get("creationTimestamp")) or 0.0
    )


def _is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_serving(
    deployment: Mapping[str, Any], endpoints: Mapping[str, Any], pods: list[dict[str, Any]]
) -> bool:
    """True when the Deployment has rolled out its current spec (every replica updated and
    ready, no old one left) and the Service's Endpoints list exactly the ready replicas."""
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    wanted = int(spec.get("replicas") or 0)
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return False
    counts = (
        int(status.get("replicas") or 0),
        int(status.get("updatedReplicas") or 0),
        int(status.get("readyReplicas") or 0),
    )
    if counts != (wanted, wanted, wanted):
        return False
    live = _live(pods)
    if len(live) != wanted or not all(_is_ready(p) for p in live):
        return False
    ips = {str((p.get("status") or {}).get("podIP")) for p in live}
    served = {url.split("//", 1)[1].rsplit(":", 1)[0] for url in _ready_urls(endpoints)}
    return served == ips


def service_problem(deployment: Mapping[str, Any], pods: list[dict[str, Any]]) -> AEnvError | None:
    """Why the service's replicas will not all serve without someone acting, as an error in
    the cluster's words (None while they may): the Deployment's ``ReplicaFailure`` (a full
    ResourceQuota: :class:`CapacityError`) or a missed progress deadline, a replica the
    scheduler cannot place or whose image cannot be pulled
    (:func:`k8s_backend.state.startup_failure`), a runtime that keeps exiting.

        >>> deployment = {"metadata": {"name": "aenv-svc-a"}, "status": {"conditions": [
        ...     {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
        ...      "message": 'pods "p" is forbidden: exceeded quota: q, requested: pods=1'}]}}
        >>> type(service_problem(deployment, [])).__name__
        'CapacityError'
    """
    name = (deployment.get("metadata") or {}).get("name", "?")
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        kind, status = condition.get("type"), condition.get("status")
        said = f"{condition.get('reason', '')}: {condition.get('message', '')}"
        if kind == "ReplicaFailure" and status == "True":
            text = f"deployment {name} cannot create its replicas ({said})"
            if "exceeded quota" in said or "forbidden" in said:
                return CapacityError(
                    f"{text}. The namespace's ResourceQuota (or a policy) refuses them: free "
                    "capacity, ask fewer replicas or less deployConfig.cpu/memory"
                )
            return ClusterError(text)
        if kind == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return StartupTimeoutError(
                f"deployment {name} made no progress ({said}); see `kubectl describe "
                f"deployment {name}`"
            )
    for pod in _live(pods):
        if _is_ready(pod):
            continue
        problem = startup_failure(pod)
        if problem is not None:
            return problem
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            restarts = int(container.get("restartCount") or 0)
            if waiting.get("reason") == "CrashLoopBackOff" or restarts >= _CRASHES:
                last = (container.get("lastState") or {}).get("terminated") or {}
                pod_name = (pod.get("metadata") or {}).get("name", "?")
                return ConfigurationError(
                    f"replica {pod_name}: container {container.get('name')} keeps exiting "
                    f"({restarts} restarts; last exit code {last.get('exitCode', '?')}, "
                    f"{last.get('reason') or waiting.get('reason') or 'Error'}). Read its log "
                    f"(`kubectl logs {pod_name} --previous`) and fix the environment, its "
                    "variables or arguments"
                )
    return None


def service_info(
    deployment: Mapping[str, Any],
    endpoints: Mapping[str, Any],
    pods: list[dict[str, Any]],
    *,
    namespace: str,
    token: str | None = None,
) -> ServiceInfo:
    """The :class:`~aenv_ray.engine.ServiceInfo` the three objects describe: ``replicas`` as
    the Deployment asks, ``ready`` and ``endpoints`` as the Service's Endpoints list, the
    replicas by pod name, and ``detail`` from :func:`service_problem`; ``token``: the
    replicas' token, which the Deployment does not hold (:mod:`k8s_backend.tokens`)."""
    meta = deployment.get("metadata") or {}
    notes = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    service_id = str(notes.get(ANNOTATION_SERVICE) or labels.get(LABEL_SERVICE) or "")
    urls = _ready_urls(endpoints)
    problem = service_problem(deployment, pods)
    ports = _runtime(deployment).get("ports") or [{}]
    port = int(ports[0].get("containerPort") or DEFAULT_FUNCTIONS_PORT)
    return ServiceInfo(
        id=service_id,
        env_ref=str(notes.get(ANNOTATION_ENV, "")),
        replicas=int((deployment.get("spec") or {}).get("replicas") or 0),
        ready=len(urls),
        url=service_url(service_id, namespace, port),
        endpoints=tuple(urls),
        instances=tuple(str((p.get("metadata") or {}).get("name")) for p in _live(pods)),
        storage=storage_claim_name(service_id) if _has_claim(deployment) else None,
        detail=str(problem) if problem is not None else "",
        token=token,
    )
