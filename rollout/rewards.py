"""The one reading of what an environment's reward returns, for every consumer of rewards:
``aenv rollout`` (:mod:`rollout.synthesis`), the gymnasium wrappers (:mod:`rollout.gym`), RLlib
(:mod:`rollout.rllib`, over the gym wrapper), AReaL (:mod:`rollout.areal`, over
:func:`rollout.synthesis.play_episode`) and TRL (:mod:`rollout.trl`'s ``get_reward``).

A reward returns one of:

- a number: the reward;
- an object with a number under ``"reward"`` and its components beside it
  (``{"reward": 0.5, "format": 1.0}``);
- ``{"reward": null, ...}``: an episode the environment does not score (an invalid task): no
  reward, its components kept;
- AEnvironment's template form, a number under ``"score"`` and no ``"reward"``
  (``{"score": 1.0, "passed": 3}``): that number is the reward, the rest its components.

    >>> split_reward(1)
    (1.0, None)
    >>> split_reward({"reward": 0.5, "format": 1.0})
    (0.5, {'format': 1.0})
    >>> split_reward({"score": 1.0, "passed": 3})
    (1.0, {'passed': 3})
    >>> split_reward({"reward": None, "invalid": True})
    (None, {'invalid': True})

Anything else is a ``ValueError`` whose message says what the reward returned and which forms
are taken; each caller raises its own typed error with it.

May import: the standard library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["split_reward"]


def _number(value: Any) -> bool:
    return isinstance(value, int | float)


def split_reward(value: Any) -> tuple[float | None, dict[str, Any] | None]:
    """``(reward, components)`` of what an environment's reward returned (see the module's
    docstring for the forms); ``ValueError`` for anything else."""
    if _number(value):
        return float(value), None
    if isinstance(value, dict) and "reward" not in value and _number(value.get("score")):
        value = {"reward": value["score"], **{k: v for k, v in value.items() if k != "score"}}
    if isinstance(value, dict) and (
        _number(value.get("reward")) or ("reward" in value and value["reward"] is None)
    ):
        number = value["reward"]
        components = {k: v for k, v in value.items() if k != "reward"}
        return (None if number is None else float(number)), components
    raise ValueError(
        f"the environment's reward returned {str(value)[:120]!r}, not a number or an object "
        'with a number under "reward" (or "score", AEnvironment\'s template) and its '
        "components beside it"
    )
