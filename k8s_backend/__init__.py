"""k8s_backend: the Kubernetes sandbox engine (not built yet).

Will own: Pods for instances (labels for env, version, instance id, owner; TTL annotation and a
reaper), readiness from the runtime's health endpoint, single- and dual-container templates,
Deployments + Services (+ PVC) for long-running services, and the translation of API errors into
aenv-ray's error tree. Implements ``aenv_ray``'s ``SandboxEngine`` protocol.

May import: ``aenv_ray``, kubernetes (in one module only). Must not import: ray, gymnasium.
"""

__all__: list[str] = []
