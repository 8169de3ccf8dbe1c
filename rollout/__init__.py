"""rollout: Ray pools of warm instances, futures, batched stepping, gymnasium, batch jobs.

Owns the driver-side :class:`RolloutPool` and its ``InstancePool`` actors (one per Ray node or
placement-group bundle, each with its own engine and its share of warm instances), leases whose
calls return Ray ``ObjectRef``\\ s (:class:`Lease`), first-K-ready batched stepping
(:class:`StepBatch`), the failure model (:class:`EpisodeOutcome`, :func:`classify`,
:func:`run_episode`), pool metrics (:class:`PoolStats`) and a loopback-only local Ray
(:func:`init_local`). Its modules ``rollout.gym`` (gymnasium ``Env``/``VectorEnv``),
``rollout.synthesis`` (batch trajectory synthesis, ``aenv rollout``), ``rollout.records`` (the
record on disk: what the model saw, one type per field), ``rollout.rewards`` (the one reading
of a reward's forms), ``rollout.hub_report`` (a run mirrored to a hub while it runs),
``rollout.areal``, ``rollout.rllib`` and ``rollout.trl`` (trainer adapters) say what they own
in their own docstrings.

May import: ``aenv_ray``, ray, gymnasium. Engines are chosen by name through
``aenv_ray.engine.new_engine`` (``engine="local"``, ``"daemon"``, ``"kubernetes"`` or another
installed engine, in each pool actor) or injected as factories. Must not import: kubernetes,
``local_backend``, ``k8s_backend``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aenv_ray.extras import require_extra

require_extra("ray", "rollout")

if TYPE_CHECKING:
    from rollout._ray import get, init_local
    from rollout.failures import (
        EpisodeOutcome,
        EpisodeResult,
        classify,
        is_retryable,
        run_episode,
    )
    from rollout.lease import Lease, LeaseInfo
    from rollout.metrics import PhaseSummary, PoolStats
    from rollout.pool import RolloutPool
    from rollout.spec import PoolSpec
    from rollout.stepping import StepBatch, StepResult

# Imported on first use, so that ``import rollout.gym`` (or any submodule that needs no pool)
# does not pay for Ray's import.
_LAZY = {
    "get": "rollout._ray",
    "init_local": "rollout._ray",
    "EpisodeOutcome": "rollout.failures",
    "EpisodeResult": "rollout.failures",
    "classify": "rollout.failures",
    "is_retryable": "rollout.failures",
    "run_episode": "rollout.failures",
    "Lease": "rollout.lease",
    "LeaseInfo": "rollout.lease",
    "PhaseSummary": "rollout.metrics",
    "PoolStats": "rollout.metrics",
    "RolloutPool": "rollout.pool",
    "PoolSpec": "rollout.spec",
    "StepBatch": "rollout.stepping",
    "StepResult": "rollout.stepping",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "EpisodeOutcome",
    "EpisodeResult",
    "Lease",
    "LeaseInfo",
    "PhaseSummary",
    "PoolSpec",
    "PoolStats",
    "RolloutPool",
    "StepBatch",
    "StepResult",
    "classify",
    "get",
    "init_local",
    "is_retryable",
    "run_episode",
]
