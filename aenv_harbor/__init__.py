"""aenv_harbor: aenv-ray as a Harbor environment provider, Harbor's tasks in aenv-ray instances.

Owns the provider (:class:`AenvRayEnvironment`, in ``aenv_harbor.environment``), the mapping of
a task's Dockerfile (``aenv_harbor.dockerfile``), the ``harbor-box`` project its local
instances serve (``aenv_harbor/box``), and on Kubernetes the task's derived image
(``aenv_harbor.kube``) and the ``harbor-pod`` project its pods serve (``aenv_harbor/pod``).
It composes engines by name only, through ``aenv_ray``.

``harbor run -p TASK_DIR -a oracle --env aenv_harbor:AenvRayEnvironment`` (``--ek
engine=kubernetes`` for another engine, by the names ``aenv_ray.engine.new_engine`` knows)
runs each trial in an instance of the ``harbor-box@1.0.0`` project this package ships
(``aenv_harbor/box``), with the task's ``environment/Dockerfile`` mapped onto it
(:mod:`aenv_harbor.dockerfile`); on Kubernetes in a pod of ``harbor-pod@1.0.0``
(``aenv_harbor/pod``) whose second container runs the task's own image, derived and built by
the operator's builder (:mod:`aenv_harbor.kube`). Harbor needs Python 3.12 or newer: ``pip install
'aenv-ray[harbor]'`` there. docs/ecosystem.md says what maps to what, and the limits.

    >>> from aenv_harbor.dockerfile import parse_dockerfile
    >>> parse_dockerfile("FROM python:3.13\\nWORKDIR /app").workdir
    '/app'

May import: aenv_ray, the standard library; lazily, inside functions: harbor.
Must not import: local_backend, k8s_backend, envhub, rollout, sandbox_runtime, aenv_cli.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aenv_harbor.dockerfile import DockerPlan, UnmappableTaskError, parse_dockerfile

if TYPE_CHECKING:
    from aenv_harbor.environment import AenvRayEnvironment as AenvRayEnvironment
    from aenv_harbor.environment import CommandTimeoutError as CommandTimeoutError
    from aenv_harbor.environment import TaskBuildError as TaskBuildError

# The provider's names load Harbor (Python 3.12+) when first named, as Harbor's
# `--env aenv_harbor:AenvRayEnvironment` does: they are not in __all__, whose names import
# without Harbor.
__all__ = ["DockerPlan", "UnmappableTaskError", "parse_dockerfile"]

_HARBOR = ("AenvRayEnvironment", "CommandTimeoutError", "TaskBuildError")


def __getattr__(name: str) -> Any:
    """``AenvRayEnvironment``, ``CommandTimeoutError`` and ``TaskBuildError``, from
    ``aenv_harbor.environment`` (which needs the ``harbor`` extra)."""
    if name in _HARBOR:
        from aenv_harbor import environment

        return getattr(environment, name)
    raise AttributeError(f"module 'aenv_harbor' has no attribute {name!r}")
