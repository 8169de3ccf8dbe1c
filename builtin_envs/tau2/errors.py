"""The errors of the tau2 library, under :class:`aenv_ray.errors.AEnvError`::

AEnvError
├── ConfigurationError
│   └── Tau2DataError              the task data is not where it is looked for; install it
├── Tau2NotFoundError (LookupError)  no such domain, task or split; check the name
└── TrajectoryError (ValueError)     a trajectory cannot be graded as given
    └── ReplayMismatchError          a stored tool result differs from the replay (tau2's rule)
"""

from __future__ import annotations

from aenv_ray.errors import AEnvError, ConfigurationError

__all__ = ["ReplayMismatchError", "Tau2DataError", "Tau2NotFoundError", "TrajectoryError"]


class Tau2DataError(ConfigurationError):
    """The tau2 data directory is missing or incomplete."""


class Tau2NotFoundError(AEnvError, LookupError):
    """No domain, task or split of that name."""


class TrajectoryError(AEnvError, ValueError):
    """A trajectory is malformed: a message of unknown shape, a tool call without its result."""


class ReplayMismatchError(TrajectoryError):
    """Replaying a tool call gave another result than the one stored in the trajectory.

    tau2's evaluator raises here too (``Environment.set_state``): the trajectory does not come
    from this environment's state, so it has no reward.
    """
