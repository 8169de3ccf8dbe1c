"""k8s_backend: the Kubernetes sandbox engine.

Owns: Pods for instances (labels for env, version, instance id, owner; TTL annotation and a
reaper), readiness from the runtime's port, single- and dual-container templates, Deployments +
Services (+ PVC) for long-running services, and the translation of API errors into aenv-ray's
error tree. Implements ``aenv_ray``'s ``SandboxEngine`` protocol: :class:`KubernetesEngine`
(:mod:`k8s_backend.engine`), the objects it sends (:mod:`k8s_backend.manifests`; a service's
Deployment, Service and PersistentVolumeClaim in :mod:`k8s_backend.services`, kept by
:class:`KubernetesServices` in :mod:`k8s_backend.service_controller`; a user's own pod
template, checked and merged, in :mod:`k8s_backend.templates`), what a pod says about its
instance (:mod:`k8s_backend.state`), instance tokens no pod spec reveals (the namespace's key
and each pod's digest, :mod:`k8s_backend.tokens`), how code reaches a pod
(:mod:`k8s_backend.delivery`), sessions and the reaper (:mod:`k8s_backend.reaper`); the
client and its errors live in ``k8s_backend._api``, the watch's cache in
``k8s_backend._cache``.

May import: ``aenv_ray``, orjson, yaml (a user's own pod template), kubernetes and urllib3 (its
transport; both in one module only, ``k8s_backend._api``); lazily, inside functions:
platformdirs (where the exec helper's build is cached). Must not import: ray, gymnasium.
"""

from aenv_ray.extras import require_extra

require_extra("kubernetes", "k8s_backend (the Kubernetes engine)")

from k8s_backend.delivery import Delivery, HostProcess, HubBundle, OwnImage  # noqa: E402
from k8s_backend.engine import KubernetesEngine, RateLimiter  # noqa: E402
from k8s_backend.manifests import PodRecipe, deny_egress_policy, instance_pod  # noqa: E402
from k8s_backend.service_controller import KubernetesServices  # noqa: E402

__all__ = [
    "Delivery",
    "HostProcess",
    "HubBundle",
    "KubernetesEngine",
    "KubernetesServices",
    "OwnImage",
    "PodRecipe",
    "RateLimiter",
    "deny_egress_policy",
    "instance_pod",
]
