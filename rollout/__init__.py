"""rollout: Ray pools of warm instances, futures, batched stepping, gymnasium, batch jobs.

Owns the driver-side :class:`RolloutPool` and its ``InstancePool`` actors (one per Ray node or
placement-group bundle, each with its own engine and its share of warm instances), leases whose
calls return Ray ``ObjectRef``\\ s (:class:`Lease`), first-K-ready batched stepping
(:class:`StepBatch`), the failure model (:class:`EpisodeOutcome`, :func:`classify`,
:func:`run_episode`), pool metrics (:class:`PoolStats`) and a loopback-only local Ray
(:func:`init_local`). Its modules ``rollout.gym`` (gymnasium ``Env``/``VectorEnv``),
``rollout.synthesis`` (batch trajectory synthesis, ``aenv rollout``), ``rollout.areal`` and
``rollout.rllib`` (trainer adapters) say what they own in their own docstrings.

May import: ``aenv_ray``, ray, gymnasium; lazily, inside functions: ``sandbox_runtime.local``
(``engine="local"``: the local engine each pool actor runs). Must not import: kubernetes
(engines are injected).
"""

from rollout._ray import get, init_local
from rollout.failures import EpisodeOutcome, EpisodeResult, classify, run_episode
from rollout.lease import Lease, LeaseInfo
from rollout.metrics import PhaseSummary, PoolStats
from rollout.pool import RolloutPool
from rollout.spec import PoolSpec
from rollout.stepping import StepBatch, StepResult

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
    "run_episode",
]
