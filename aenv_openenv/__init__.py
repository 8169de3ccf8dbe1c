"""aenv_openenv: aenv-ray in OpenEnv's interface, both ways.

Owns the OpenEnv server over aenv-ray instances, the provider that runs an OpenEnv server in
an instance, and the relay tools inside it:

- **OpenEnv's clients on aenv-ray environments**: :class:`OpenEnvServer` (:func:`create_app`,
  ``aenv openenv serve ENV@VERSION``) serves any aenv-ray environment, the built-ins included,
  at OpenEnv's endpoints (``/ws``, ``/mcp``, ``/health``, ``/schema``, ``/reset``, ``/step``):
  one instance per session, at most ``max_concurrent_envs`` at once
  (:mod:`aenv_openenv.server`; what an action does: :mod:`aenv_openenv.session`).
- **OpenEnv's environments on aenv-ray**: :class:`AenvRayProvider`, OpenEnv's provider interface
  (``ContainerProvider`` and ``RuntimeProvider`` shapes), runs an OpenEnv environment server
  inside an aenv-ray instance (its project gets a ``src/`` module calling
  :func:`aenv_openenv.relay.serve_openenv`), on the local engine's warm templates or on
  Kubernetes (:mod:`aenv_openenv.provider`).

- **OpenEnv's clients in a virtual environment of their own** (OpenEnv's pins are not
  aenv-ray's): :class:`~aenv_openenv.process_provider.AenvRayProcessProvider` runs the
  provider above in an ``aenv openenv provide`` child process and imports only the standard
  library; this package's names load on first use, so importing that module loads no aenv-ray
  code.

OpenEnv's own package is never imported: it is what the users run on their side (its clients)
or inside the instance (its server). docs/ecosystem.md says what maps to what, with the limits.

May import: ``aenv_ray``, starlette, uvicorn (the provider's bridge); httpx and websockets (the
relay inside an instance, :mod:`aenv_openenv.relay`, imported by the project that uses it).
Engines are made by name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aenv_openenv.provider import AenvRayProvider
    from aenv_openenv.server import OpenEnvServer, create_app

__all__ = ["AenvRayProvider", "OpenEnvServer", "create_app"]

_WHERE = {
    "AenvRayProvider": "aenv_openenv.provider",
    "OpenEnvServer": "aenv_openenv.server",
    "create_app": "aenv_openenv.server",
}


def __getattr__(name: str) -> Any:
    """The package's names, imported on first use (see the module)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'aenv_openenv' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
