"""corridor@1.0.0: a small learnable environment for RL trainers (docs/training.md).

The agent stands in the middle of a corridor of cells ``0..6`` and must walk to the end its
task names (``reset_arguments: {"goal": "left"}`` or ``"right"``) with the tools ``left`` and
``right``. Each tool answers ``goal G, at P`` and ends the episode (``"done": true``) at either
end. The reward takes no arguments: 1.0 at the goal's end, else 0.0. A random walk reaches the
right end half the time; a policy that reads the goal always does, in 3 steps.

Each instance is its own process, so ``STATE`` is per instance.
"""

from __future__ import annotations

import random
from typing import Any

from aenv_ray import register_function, register_reward, register_tool

LAST = 6  # cells 0..LAST; the agent starts in the middle
STATE: dict[str, Any] = {"goal": "right", "position": LAST // 2}


@register_function
def reset(seed: int = 0, goal: str = "") -> dict[str, Any]:
    """Start an episode in the middle; ``goal`` ("left"/"right", default drawn from ``seed``).

    Args:
        seed: random seed for the goal when none is given.
        goal: the end to reach: "left" or "right".
    """
    if goal not in ("", "left", "right"):
        raise ValueError(f"goal must be 'left' or 'right', got {goal!r}")
    STATE.update(goal=goal or random.Random(seed).choice(["left", "right"]), position=LAST // 2)
    return dict(STATE)


def _move(delta: int) -> dict[str, Any]:
    STATE["position"] = min(LAST, max(0, STATE["position"] + delta))
    position = STATE["position"]
    return {"text": f"goal {STATE['goal']}, at {position}", "done": position in (0, LAST)}


@register_tool
def left() -> dict[str, Any]:
    """Step one cell to the left."""
    return _move(-1)


@register_tool
def right() -> dict[str, Any]:
    """Step one cell to the right."""
    return _move(+1)


@register_reward
def reached() -> float:
    """1.0 when the agent stands at the goal's end, else 0.0."""
    end = 0 if STATE["goal"] == "left" else LAST
    return 1.0 if STATE["position"] == end else 0.0
