"""k8s_backend: the Kubernetes sandbox engine (being built).

Owns: Pods for instances (labels for env, version, instance id, owner; TTL annotation and a
reaper), readiness from the runtime's port, single- and dual-container templates, Deployments +
Services (+ PVC) for long-running services, and the translation of API errors into aenv-ray's
error tree. Implements ``aenv_ray``'s ``SandboxEngine`` protocol. Built so far:
:mod:`k8s_backend.manifests` (the objects of an instance, as plain dicts).

May import: ``aenv_ray``, kubernetes (in one module only). Must not import: ray, gymnasium.
"""

from k8s_backend.manifests import PodRecipe, deny_egress_policy, instance_pod

__all__ = ["PodRecipe", "deny_egress_policy", "instance_pod"]
