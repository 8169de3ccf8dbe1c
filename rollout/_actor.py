"""The Ray edge: ``InstancePool`` and the creation-rate limiter as actors.

:class:`PoolActor` is :class:`~rollout._instance_pool.InstancePool` with its Ray wiring (tokens
from the shared limiter actor, the GCS job and actor tables for dead owners, Ray metrics); the
logic stays in the plain class. Both actors reserve no CPU: the work happens in the instances.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray

from rollout._instance_pool import Grant, InstancePool
from rollout._limiter import LIMITER_NAME, TokenBucket
from rollout.lease import Owner
from rollout.metrics import RayMetrics
from rollout.spec import PoolSpec

__all__ = ["CreationLimiter", "PoolActor", "limiter_actor", "pool_actor_class"]

log = logging.getLogger("rollout.pool.actor")

_TOKEN_TIMEOUT = 10.0


async def _dead_owners(owners: list[Owner]) -> dict[Owner, str]:
    """Which lease owners are gone, and why: their job ended (the GCS job table), their actor
    died (the actor table), or their process on this node exited. A task that ended without
    releasing, in a worker that lives on, is not seen here: the lease's idle timeout is."""
    # the GCS tables have no public accessor without the dashboard
    from ray._private import state

    here = ray.get_runtime_context().get_node_id()

    def look() -> dict[Owner, str]:
        ended = {str(job["JobID"]) for job in state.jobs() if job.get("IsDead")}
        gone: dict[Owner, str] = {}
        for owner in owners:
            if owner.job_id in ended:
                gone[owner] = f"its owner's job {owner.job_id} ended"
            elif owner.actor_id and _actor_dead(state, owner.actor_id):
                gone[owner] = f"its owner, actor {owner.actor_id}, died"
            elif owner.node_id == here and owner.pid and not _process_alive(owner.pid):
                gone[owner] = f"its owner's process {owner.pid} exited"
        return gone

    return await asyncio.to_thread(look)


def _actor_dead(state: Any, actor_id: str) -> bool:
    info = state.actors(actor_id=actor_id)
    return bool(info) and info.get("State") == "DEAD"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PoolActor(InstancePool):
    """One pool actor; see :class:`~rollout._instance_pool.InstancePool`."""

    def __init__(self, spec: PoolSpec, size: int, limiter: Any, rate: float, burst: int) -> None:
        self._limiter = limiter
        self._fallback = TokenBucket(rate, burst)
        self._metrics: RayMetrics | None = None
        try:
            self._metrics = RayMetrics(spec.name)
        except Exception:  # metrics are a nicety; never a reason for a pool not to start
            log.warning("ray metrics unavailable", extra={"pool": spec.name}, exc_info=True)
        super().__init__(
            spec,
            size,
            take_tokens=self._take_tokens_from_limiter,
            dead_owners=_dead_owners,
            on_report=self._metrics.publish if self._metrics is not None else None,
        )

    async def _take_tokens_from_limiter(self, n: int) -> tuple[int, float]:
        try:
            granted, wait = await asyncio.wait_for(self._limiter.take.remote(n), _TOKEN_TIMEOUT)
        except (ray.exceptions.RayActorError, TimeoutError):
            # the shared limiter is gone or slow: hold this actor's share of the rate alone
            log.warning("creation limiter unavailable", extra={"pool": self.spec.name})
            return self._fallback.take(n)
        return int(granted), float(wait)

    def node_id(self) -> str:
        """The Ray node this actor runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())

    async def acquire(
        self, owner: Owner, wait: float = 0.0, attempt: int = 0, extra: int = 0
    ) -> Grant:
        if self._maintainer is None:  # a restarted actor warms itself on first use
            await self.start()
        return await super().acquire(owner, wait, attempt, extra)


class CreationLimiter(TokenBucket):
    """The cluster's creation-rate limit as an actor (see :mod:`rollout._limiter`)."""

    # async overrides of TokenBucket's methods (ignore[override]): an async actor's methods run
    # on its event loop; only Ray calls them, never through a TokenBucket reference
    async def take(self, n: int) -> tuple[int, float]:  # type: ignore[override]
        return super().take(n)

    async def configure(self, rate: float, burst: int) -> None:  # type: ignore[override]
        super().configure(rate, burst)


def pool_actor_class() -> Any:
    """``ray.remote(PoolActor)``: async, reserves no CPU; the driver replaces it if it dies."""
    # ray's typed overloads of ray.remote(**options) list the task options only: an actor's
    # max_concurrency is missing
    options = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=10_000)  # type: ignore[call-overload]
    return options(PoolActor)


_limiters: dict[tuple[str, str], Any] = {}


def limiter_actor(rate: float, burst: int) -> Any:
    """The namespace's shared limiter actor, created by the first pool that needs it.

    This process keeps a handle for as long as its Ray session lasts: a named actor dies with
    the last reference to it, and pools come and go.
    """
    context = ray.get_runtime_context()
    key = (context.get_job_id(), context.namespace)
    if key not in _limiters:
        cls = ray.remote(num_cpus=0, max_restarts=-1)(CreationLimiter)
        _limiters.clear()  # handles of an earlier session are useless
        _limiters[key] = cls.options(name=LIMITER_NAME, get_if_exists=True).remote(rate, burst)
    return _limiters[key]
