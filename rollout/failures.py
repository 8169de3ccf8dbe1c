"""The failure model: how an episode ended, and running one again on a fresh instance.

Every episode ends as one :class:`EpisodeOutcome`. :func:`classify` maps an exception to it
(Ray's wrappers are looked through); :func:`is_retryable` is the one retry rule of the rollout
layer (the errors' ``retryable``, and Ray's own failures); :func:`run_episode` runs an episode
callable on a leased instance and runs it again on a fresh one while the failure is retryable.

Programming errors are not outcomes: :func:`is_programming_error` says which exceptions of a
policy are its code's mistakes (a ``TypeError``, ``NameError``, ``AttributeError``,
``ImportError``, ``SyntaxError``, ``AssertionError`` or ``NotImplementedError`` that is not an
aenv-ray error), and a synthesis run stops on the first with :class:`PolicyCodeError`; a task
whose reward or setup call the environment rejects stops it with :class:`TaskCallError`.

Failures that are not the agent's are never recorded as its: a model endpoint that does not
answer, or answers 5xx or 429 (after the request's retries), or refuses the request with any
other 4xx (a wrong key, URL or model, a request it cannot take; a 4xx saying the conversation
is over the model's context is no failure: the episode is truncated) is
:class:`ModelEndpointError`, an ``infrastructure_error``; a run whose episodes keep losing
their endpoint the same way stops with :class:`ModelEndpointDownError`. A Ray that does not
start is :class:`RayStartError`.

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
import os
import sys
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import aenv_ray
from aenv_ray.errors import (
    AEnvError,
    AEnvTimeoutError,
    ConfigurationError,
    InstanceClosedError,
    InstanceError,
    ProtocolError,
)

if TYPE_CHECKING:
    from rollout.lease import Lease

__all__ = [
    "PROGRAMMING_ERRORS",
    "EpisodeOutcome",
    "EpisodeResult",
    "LeaseSource",
    "ModelEndpointDownError",
    "ModelEndpointError",
    "PolicyCodeError",
    "RayStartError",
    "TaskCallError",
    "classify",
    "is_programming_error",
    "is_retryable",
    "run_episode",
]

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

    Infrastructure: every retryable error (the instance died, expired, vanished, went silent
    past its call's timeout or was lost with its lease; no instance could be had or started;
    the hub did not answer), a runtime that speaks something else (:class:`ProtocolError`: not
    retryable), and every error of Ray's own (a dead actor, worker, node or raylet, a lost
    object, a cancelled task, ...). Timeout: a tool or wait that ran out of time and is not
    retryable (:class:`~aenv_ray.errors.ToolTimeoutError`, the episode's own limit). Anything
    else (a tool or function error, using an instance you released, the policy's own
    exception) is the agent's.

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


def _ray_error(exc: BaseException, kind: str) -> bool:
    """Whether ``exc`` is Ray's exception class ``kind`` (``RayError``, ``RayTaskError``): Ray
    is not imported for it, since no Ray exception exists in a process that never imported
    Ray (``aenv rollout`` with nothing left to do, ``--no-ray``)."""
    rex = sys.modules.get("ray.exceptions")
    return rex is not None and isinstance(exc, getattr(rex, kind))


def _classify_one(exc: BaseException, seen: set[int]) -> EpisodeOutcome:
    if _ray_error(exc, "RayTaskError"):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException) and cause is not exc:
            return _classify(cause, seen)
        return EpisodeOutcome.AGENT_ERROR  # a task's own code failed; Ray did not
    if isinstance(exc, InstanceClosedError):
        return EpisodeOutcome.AGENT_ERROR  # the episode used an instance after releasing it
    if isinstance(exc, AEnvError) and (exc.retryable or isinstance(exc, InstanceError)):
        return EpisodeOutcome.INFRASTRUCTURE_ERROR
    if isinstance(exc, ProtocolError | ModelEndpointError):
        return EpisodeOutcome.INFRASTRUCTURE_ERROR  # not the agent's; not retried either
    if isinstance(exc, (AEnvTimeoutError, TimeoutError)):  # Ray's GetTimeoutError is one
        return EpisodeOutcome.TIMEOUT
    if _ray_error(exc, "RayError"):
        return EpisodeOutcome.INFRASTRUCTURE_ERROR  # Ray's own failures (not a task's code)
    return EpisodeOutcome.AGENT_ERROR


def is_retryable(exc: BaseException | None) -> bool:
    """Whether an episode that failed with ``exc`` is run again on a fresh instance: the one
    retry rule of :func:`run_episode`, :func:`rollout.synthesize` and the AReaL adapter.

    An aenv-ray error answers with its class's ``retryable``
    (:func:`aenv_ray.errors.is_retryable`; the table is in docs/errors.md). Ray's own failures
    (a dead actor, worker, node or raylet, a lost object, a cancelled task) are retryable, but
    not its timeouts; a task's error (``RayTaskError``) is judged by its cause, any other
    exception by what it was raised ``from``, an exception group by its members (any).

        >>> from aenv_ray.errors import CallTimeoutError, ProtocolError, ToolTimeoutError
        >>> is_retryable(CallTimeoutError("silent")), is_retryable(ProtocolError("html"))
        (True, False)
        >>> from ray.exceptions import ActorDiedError
        >>> is_retryable(ToolTimeoutError("slow tool")), is_retryable(ActorDiedError())
        (False, True)
    """
    return _is_retryable(exc, set())


def _is_retryable(exc: BaseException | None, seen: set[int]) -> bool:
    if exc is None or id(exc) in seen:
        return False
    seen.add(id(exc))
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_retryable(inner, seen) for inner in exc.exceptions)
    if _ray_error(exc, "RayTaskError"):
        cause = getattr(exc, "cause", None)
        cause = cause if isinstance(cause, BaseException) else None
        return cause is not exc and _is_retryable(cause, seen)
    if isinstance(exc, AEnvError):
        return exc.retryable
    if _ray_error(exc, "RayError") and not isinstance(exc, TimeoutError):
        return True
    return _is_retryable(exc.__cause__, seen)


PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    NameError,
    AttributeError,
    ImportError,
    SyntaxError,
    AssertionError,
    NotImplementedError,
)
"""The exception types that mean a policy's own code is wrong (not that the agent failed)."""

_OURS = tuple(f"{Path(m).resolve().parent}{os.sep}" for m in (__file__, aenv_ray.__file__))


def is_programming_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised out of a policy, is a mistake in the policy's code: one of
    :data:`PROGRAMMING_ERRORS` (``TypeError``, ``NameError`` and ``UnboundLocalError``,
    ``AttributeError``, ``ImportError``, ``SyntaxError``, ``AssertionError``,
    ``NotImplementedError``) that is not an aenv-ray error, or a group holding one. Such an
    exception would fail every episode the same way: it stops the run instead of becoming the
    agent's outcome. Any other exception a policy raises (``ValueError``, ``KeyError``, a
    class of its own) ends the episode as ``agent_error``.

        >>> is_programming_error(TypeError("bad operand")), is_programming_error(KeyError("x"))
        (True, False)
        >>> from aenv_ray.errors import NotSupportedError
        >>> is_programming_error(NotSupportedError("no fork here"))  # an aenv error: an outcome
        False
    """
    if isinstance(exc, AEnvError):
        return False
    if isinstance(exc, BaseExceptionGroup):
        return any(is_programming_error(inner) for inner in exc.exceptions)
    return isinstance(exc, PROGRAMMING_ERRORS)


class PolicyCodeError(ConfigurationError):
    """The policy's own code raised a programming error (:func:`is_programming_error`): the run
    stopped at the first one, since every episode would fail the same way. Fix the policy and run
    again; the episodes recorded before it are kept. ``policy`` names it, ``error_type`` is the
    exception's class, ``location`` the innermost frame of the policy's code
    (``"path.py:LINE in function"``), ``details`` the traceback from the policy's call down, and
    ``__cause__`` the exception itself."""

    def __init__(
        self,
        message: str = "",
        *,
        policy: str | None = None,
        error_type: str | None = None,
        location: str | None = None,
        details: str = "",
        episode_id: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.policy = policy
        self.error_type = error_type
        self.location = location
        self.details = details
        self.episode_id = episode_id

    @classmethod
    def of(cls, exc: BaseException, *, policy: str, episode_id: str) -> PolicyCodeError:
        """The error for ``exc``, raised out of ``policy`` in episode ``episode_id`` and caught
        in the frame that awaited the policy."""
        frames = _policy_frames(exc.__traceback__)
        inner = _innermost(exc)
        what = f"{type(inner).__name__}: {inner}"
        if frames:
            where = _user_frame(frames)
            location = f"{where.filename}:{where.lineno} in {where.name}"
            message = (
                f"the policy `{policy}` raised {what} at {location} (episode {episode_id}); a "
                "programming error in the policy stops the run instead of being recorded as the "
                "agent's: fix it and run again (the episodes already recorded are kept)"
            )
        else:  # raised by the call itself: a wrong signature, a policy that is not async
            location = None
            message = (
                f"the policy `{policy}` cannot be called as `await policy(task, env)`: {what}; a "
                "policy is `async def policy(task: dict, env: AgentEnv) -> str | None`"
            )
        details = "".join(
            [
                "Traceback (the policy's frames):\n",
                *traceback.format_list(frames),
                *traceback.format_exception_only(exc),
            ]
        )
        return cls(
            message,
            policy=policy,
            error_type=type(inner).__name__,
            location=location,
            details=details,
            episode_id=episode_id,
        )


class TaskCallError(ConfigurationError):
    """A task's call of the environment was refused as a call, not as the agent's doing: the
    reward (or a ``setup`` function) does not exist or rejected the task's arguments, or the
    reward returned no number. Every episode of the task would fail the same way, so the run
    stops. Fix the task (``reward_arguments``, ``setup``) or the environment's reward.
    ``function`` names the call (``"reward"``, a function's name), ``task_id`` the task."""

    def __init__(
        self,
        message: str = "",
        *,
        function: str | None = None,
        task_id: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.function = function
        self.task_id = task_id


class ModelEndpointError(AEnvError):
    """The model endpoint of an episode failed, not the agent: it did not answer (connection
    refused, reset, timed out) or answered 5xx or 429 after every retry of the request, or
    refused the request (any other 4xx: 401 or 403 a wrong key, 404 a wrong URL or model, 400 a
    request it cannot take, such as a tool's schema; not one saying the conversation is over
    the model's context, which truncates the episode). The message names the endpoint, the
    status and the endpoint's own error message. The episode is
    an ``infrastructure_error``; it is not run again on a fresh instance (the request was
    retried already). ``endpoint`` is the URL, ``status`` the HTTP status (``None``: no
    answer), ``kind`` what went wrong in a few words (``"HTTP 500"``, ``"no answer"``):
    ``(endpoint, kind)`` is what makes two failures the same one.

        >>> classify(ModelEndpointError("down", endpoint="http://x/v1", kind="no answer")).value
        'infrastructure_error'
    """

    def __init__(
        self,
        message: str = "",
        *,
        endpoint: str = "",
        status: int | None = None,
        kind: str = "",
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.endpoint = endpoint
        self.status = status
        self.kind = kind

    @property
    def signature(self) -> tuple[str, str]:
        """What two identical failures share: the endpoint and the kind of failure."""
        return self.endpoint, self.kind


class ModelEndpointDownError(ModelEndpointError):
    """A synthesis run stopped: ``count`` episodes in a row lost their model endpoint the same
    way (:class:`ModelEndpointError`, with no model reply in any episode between them). The
    run's records so far are kept; fix the endpoint and run the same command again (the
    episodes recorded as ``infrastructure_error`` run again with ``--retry-failed``)."""

    def __init__(self, message: str = "", *, count: int = 0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.count = count


class RayStartError(AEnvError):
    """Ray did not start (or a running Ray could not be joined): its cause in ``__cause__``.
    Run without Ray (``aenv rollout --no-ray``, :class:`rollout.sources.SDKSource`) or start
    Ray yourself and join it (``RAY_ADDRESS=HOST:PORT``)."""


def _innermost(exc: BaseException) -> BaseException:
    """The programming error inside a group (the exception itself otherwise)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if is_programming_error(inner):
                return _innermost(inner)
    return exc


def _policy_frames(tb: TracebackType | None) -> traceback.StackSummary:
    """The frames from the policy's call down: the first frame, which awaited the policy and
    caught its exception, dropped."""
    return traceback.StackSummary.from_list(traceback.extract_tb(tb)[1:])


def _user_frame(frames: traceback.StackSummary) -> traceback.FrameSummary:
    """The innermost frame outside aenv-ray's own packages (else the innermost)."""
    for frame in reversed(frames):
        if not frame.filename.startswith(_OURS):
            return frame
    return frames[-1]


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


class LeaseSource(Protocol):
    """What :func:`run_episode` leases from: a :class:`rollout.RolloutPool`, or anything with
    its ``name`` and ``acquire``."""

    @property
    def name(self) -> str:
        """The pool's name (the ``pool`` label of the episode counts)."""
        ...

    def acquire(self, *, timeout: float = ..., attempt: int = ...) -> Lease:
        """A fresh lease, waiting up to ``timeout`` s; ``attempt`` counts the tries before."""
        ...


def run_episode(
    pool: LeaseSource,
    episode: Callable[[Lease], T],
    *,
    max_retries: int = 2,
    acquire_timeout: float = 60.0,
    retry_on: Collection[EpisodeOutcome] = (EpisodeOutcome.INFRASTRUCTURE_ERROR,),
) -> EpisodeResult[T]:
    """Run ``episode(lease)`` on a fresh lease; on a failure that :func:`is_retryable` and
    whose outcome is in ``retry_on`` run it again on another fresh instance, at most
    ``max_retries`` times (``max_retries + 1`` attempts in all; ``result.attempts`` says how
    many ran).

    Never raises for the episode's failure: the result says how it ended (failure is data).
    Each lease is released whatever happens.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    error: BaseException | None = None
    outcome = EpisodeOutcome.OK
    max_attempts = max_retries + 1
    for attempt in range(max_attempts):
        lease = None
        try:
            lease = pool.acquire(timeout=acquire_timeout, attempt=attempt)
            value = episode(lease)
            _count(pool, EpisodeOutcome.OK)
            return EpisodeResult(EpisodeOutcome.OK, value, None, attempt + 1)
        except Exception as exc:
            error, outcome = exc, classify(exc)
            log.info(
                "episode failed",
                extra={"attempt": attempt + 1, "outcome": outcome.value, "error": str(exc)},
            )
            if outcome not in retry_on or not is_retryable(exc):
                break
        finally:
            if lease is not None:
                lease.release()
    _count(pool, outcome)
    return EpisodeResult(outcome, None, error, min(attempt + 1, max_attempts))


def _count(pool: LeaseSource, outcome: EpisodeOutcome) -> None:
    """An episode's outcome into the driver's Ray metrics (never a reason for it to fail)."""
    from rollout.metrics import count_episode

    try:
        count_episode(pool.name, outcome.value)
    except Exception:  # metrics are a nicety
        log.debug("episode not counted", exc_info=True)
