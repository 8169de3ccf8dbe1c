"""envhub: the registry of environment definitions and the control plane, served by ``aenv serve``.

Owns: the registry (:mod:`envhub.registry`: push, get, list, versions, tags, search; published
versions immutable; deprecate and delete; names guarded against lookalikes by :mod:`envhub.names`;
bundles in the SDK's format, :mod:`aenv_ray.bundle`), the instance and service API over an injected
engine (:mod:`envhub.control`; which code a tenant runs: :mod:`envhub.resolve`; what it may use:
:mod:`envhub.limits`), API keys and tenants (:mod:`envhub.keys`), the stores (:mod:`envhub.store`:
embedded SQLite by default, Redis for shared deployments), the rollout runs drivers push
(:mod:`envhub.runs`: run directories per tenant in its data directory), and the HTTP API with
its OpenAPI document (:mod:`envhub.app`, assembled from one router per concern in
:mod:`envhub.routes`, behind :mod:`envhub.guard`, run by :mod:`envhub.server`).

May import: ``aenv_ray``, fastapi, starlette, pydantic, uvicorn, aiohttp (the proxy's client),
redis (the Redis store), cryptography (the sealed tokens); lazily, inside functions:
platformdirs (the default store's place).
Must not import: ray, kubernetes (engines are injected).
Needs the ``hub`` extra (fastapi, cryptography; ``redis`` for the Redis store): checked here.
"""

from aenv_ray.extras import require_extra

require_extra("hub", "envhub (the hub, `aenv serve`)")

__all__: list[str] = []
