"""envhub: the registry of environment definitions and the control plane (not built yet).

Will own: the registry (push, get, list, versions, tags, search; published versions immutable),
the instance and service API over an injected engine, API keys, and its stores (embedded SQLite
by default, Redis for shared deployments), served by ``aenv serve``.

May import: ``aenv_ray``, starlette/uvicorn, redis (optional). Must not import: ray, kubernetes
(engines are injected).
"""

__all__: list[str] = []
