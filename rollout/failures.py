"""The failure model: how an episode ended, and running one again on a fresh instance.

Every episode ends as one :class:`EpisodeOutcome`. :func:`classify` maps an exception to it
(Ray's wrappers are looked through); :func:`run_episode` runs an episode callable on a leased
instance and retries it on a fresh one while the failure is the infrastructure's.

    >>> from aenv_ray.errors import InstanceBrokenError, ToolArgumentError
    >>> classify(InstanceBrokenError("gone")).value
    'infrastructure_error'
    >>> classify(ToolArgumentError("bad")).value
    'agent_error'
    >>> classify(None).value
    'ok'
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import ray.exceptions as rex

from aenv_ray.errors import (
    AcquireTimeoutError,
    AEnvTimeoutError,
    CapacityError,
    InstanceClosedError,
    InstanceError,
    ProtocolError,
    StartupTimeoutError,
)

if TYPE_CHECKING:
    from rollout.lease import Lease
    from rollout.pool import RolloutPool

__all__ = ["EpisodeOutcome", "EpisodeResult", "classify", "run_episode"]

log = logging.getLogger("rollout.failures")
T = TypeVar("T")


class EpisodeOutcome(enum.Enum):
    """How an episode ended."""

    OK = "ok"
    AGENT_ERROR = "agent_error"  # the policy, or what it asked the environment to do, failed
    INFRASTRUCTURE_ERROR = "infrastructure_error"  # the instance, pool, engine or Ray failed
    TIMEOUT = "timeout"  # something ran past its time limit


def classify(exc: BaseException | None) -> EpisodeOutcome:
    """The :class:`EpisodeOutcome` of an episode that raised ``exc`` (``None``: it did not).

    Infrastructure: the instance died, expired or was lost with its lease (but not one *you*
    released), no instance could be had or started, a runtime that speaks something else, and
    every error of Ray's own (a dead actor, worker, node or raylet, a lost object, a cancelled
    task, ...). Timeout: a call, tool or wait that ran out of time. Anything else (a tool or
    function error, the policy's own exception) is the agent's.

    Wrappers are looked through: Ray's ``RayTaskError`` is classified by its cause; an
    exception raised ``from`` an infrastructure failure is one (a policy that wraps a broken
    instance's error in its own still lost its instance); an exception group (a policy's
    ``TaskGroup``) is the infrastructure's if any of its exceptions is, else a timeout if any
    is, else the agent's.
    """
    return _classify(exc, set())


def _classify(exc: BaseException | None, seen: set[int]) -> EpisodeOutcome:
    if exc is None:
        return EpisodeOutcome.OK
    if id(exc) in seen:  # a cycle of causes
        return EpisodeOutcome.AGENT_ERROR
    seen.add(id(exc))
    if isinstance(exc, BaseExceptionGroup):
        found = {_classify(inner, seen) for inner in exc.exceptions}
        for outcome in (EpisodeOutcome.INFRASTRUCTURE_ERROR, EpisodeOutcome.TIMEOUT):
            if outcome in found:
                return outcome
        return EpisodeOutcome.AGENT_ERROR
    outcome = _classify_one(exc, seen)
    cause = exc.__cause__
    if outcome is not EpisodeOutcome.INFRASTRUCTURE_ERROR and cause is not None:
        infrastructure = _classify(cause, seen) is EpisodeOutcome.INFRASTRUCTURE_ERROR
        return EpisodeOutcome.INFRASTRUCTURE_ERROR if infrastructure else outcome
    return outcome


def _classify_one(exc: BaseException, seen: set[int]) -> EpisodeOutcome:
    if isinstance(exc, rex.RayTaskError):
        if isinstance(exc.cause, BaseException) and exc.cause is not exc:
            return _classify(exc.cause, seen)
        return EpisodeOutcome.AGENT_ERROR  # a task's own code failed; Ray did not
    if isinstance(exc, InstanceClosedError):
        return EpisodeOutcome.AGENT_ERROR  # the episode used an instance after releasing it
    infrastructure = (InstanceError, CapacityError, ProtocolError, StartupTimeoutError)
    if isinstance(exc, (*infrastructure, AcquireTimeoutError)):
        return EpisodeOutcome.INFRASTRUCTURE_ERROR
    if isinstance(exc, (AEnvTimeoutError, TimeoutError)):  # Ray's GetTimeoutError is one
        return EpisodeOutcome.TIMEOUT
    if isinstance(exc, rex.RayError):
        return EpisodeOutcome.INFRASTRUCTURE_ERROR  # Ray's own failures (not a task's code)
    return EpisodeOutcome.AGENT_ERROR


@dataclass(frozen=True)
class EpisodeResult(Generic[T]):
    """What :func:`run_episode` returns: the outcome, the value or error, the attempts made."""

    outcome: EpisodeOutcome
    value: T | None
    error: BaseException | None
    attempts: int

    @property
    def reason(self) -> str:
        """Why it failed, in one line (empty when it succeeded)."""
        if self.error is None:
            return ""
        return f"{type(self.error).__name__}: {self.error}"


def run_episode(
    pool: RolloutPool,
    episode: Callable[[Lease], T],
    *,
    max_attempts: int = 3,
    acquire_timeout: float = 60.0,
    retry_on: Collection[EpisodeOutcome] = (EpisodeOutcome.INFRASTRUCTURE_ERROR,),
) -> EpisodeResult[T]:
    """Run ``episode(lease)`` on a fresh lease; on a failure whose outcome is in ``retry_on``
    run it again on another fresh instance, at most ``max_attempts`` times in all.

    Never raises for the episode's failure: the result says how it ended (failure is data).
    Each lease is released whatever happens.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    error: BaseException | None = None
    outcome = EpisodeOutcome.OK
    for attempt in range(max_attempts):
        lease = None
        try:
            lease = pool.acquire(timeout=acquire_timeout, attempt=attempt)
            value = episode(lease)
            return EpisodeResult(EpisodeOutcome.OK, value, None, attempt + 1)
        except Exception as exc:
            error, outcome = exc, classify(exc)
            log.info(
                "episode failed",
                extra={"attempt": attempt + 1, "outcome": outcome.value, "error": str(exc)},
            )
            if outcome not in retry_on:
                break
        finally:
            if lease is not None:
                lease.release()
    return EpisodeResult(outcome, None, error, min(attempt + 1, max_attempts))
