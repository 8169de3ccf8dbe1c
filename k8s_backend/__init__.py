"""k8s_backend: the Kubernetes sandbox engine (being built).

Owns: Pods for instances (labels for env, version, instance id, owner; TTL annotation and a
reaper), readiness from the runtime's port, single- and dual-container templates, Deployments +
Services (+ PVC) for long-running services, and the translation of API errors into aenv-ray's
error tree. Implements ``aenv_ray``'s ``SandboxEngine`` protocol. Built so far:
:mod:`k8s_backend.manifests` (the objects of an instance, as plain dicts),
:mod:`k8s_backend.services` (a service's Deployment, Service and PersistentVolumeClaim) and
:mod:`k8s_backend.templates` (a user's own pod template, checked and merged).

May import: ``aenv_ray``, kubernetes (in one module only), yaml (a user's own pod template).
Must not import: ray, gymnasium.
"""

from k8s_backend.manifests import PodRecipe, deny_egress_policy, instance_pod

__all__ = ["PodRecipe", "deny_egress_policy", "instance_pod"]
