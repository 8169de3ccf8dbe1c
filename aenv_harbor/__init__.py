"""aenv-ray as a Harbor environment provider: Harbor's tasks in aenv-ray instances.

``harbor run -p TASK_DIR -a oracle --env aenv_harbor:AenvRayEnvironment`` (``--ek
engine=kubernetes`` for another engine, by the names ``aenv_ray.engine.new_engine`` knows)
runs each trial in an instance of the ``harbor-box@1.0.0`` project this package ships
(``aenv_harbor/box``), with the task's ``environment/Dockerfile`` mapped onto it
(:mod:`aenv_harbor.dockerfile`). Harbor needs Python 3.12 or newer: ``pip install
'aenv-ray[harbor]'`` there. docs/ecosystem.md says what maps to what, and the limits.

    >>> from aenv_harbor.dockerfile import parse_dockerfile
    >>> parse_dockerfile("FROM python:3.13\\nWORKDIR /app").workdir
    '/app'

May import: aenv_ray, the standard library; lazily, inside functions: harbor,
aenv_harbor.environment.
Must not import: local_backend, k8s_backend, envhub, rollout, sandbox_runtime, aenv_cli.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AenvRayEnvironment", "CommandTimeoutError", "TaskBuildError", "UnmappableTaskError"]

_HARBOR = ("AenvRayEnvironment", "CommandTimeoutError", "TaskBuildError")


def __getattr__(name: str) -> Any:
    """The provider loads Harbor when first named (``aenv_harbor:AenvRayEnvironment``)."""
    if name in _HARBOR:
        from aenv_ray.extras import require_extra

        require_extra("harbor", "aenv_harbor's Harbor provider (Python 3.12+)")
        from aenv_harbor import environment

        return getattr(environment, name)
    if name == "UnmappableTaskError":
        from aenv_harbor.dockerfile import UnmappableTaskError

        return UnmappableTaskError
    raise AttributeError(f"module 'aenv_harbor' has no attribute {name!r}")
