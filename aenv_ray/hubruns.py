"""Runs pushed to a hub: what ``aenv rollout`` sends, what the hub keeps, when a run is live.

A run that ``aenv rollout`` makes against a hub (``AENV_SYSTEM_URL``) is mirrored there, so the
hub's Environment Center lists it next to the environments it ran: the driver registers the
run (``POST /v1/runs``: a name, its settings, who drives it), then sends its records as they
are written (``POST /v1/runs/{id}/records``: the bytes of ``trajectories.jsonl`` from an
offset) and a heartbeat, and says when it ends (``PATCH /v1/runs/{id}``). The hub keeps each
run as a run directory of its own (``run.json``, ``trajectories.jsonl``) with :data:`STATE`
beside them, under its data directory, one directory per tenant; the UI reads it as it reads
any run directory.

This module is the contract the three parties share (the driver's reporter, the hub's store
and the UI's reader): the state file's name and fields and the rule that says a run is live.

    >>> state = {"state": "live", "beat_at": 1000.0}
    >>> is_live(state, now=1000.0 + STALE_AFTER - 1), is_live(state, now=1000.0 + STALE_AFTER)
    (True, False)
    >>> is_live({"state": "finished", "beat_at": 1000.0}, now=1000.0)
    False

May import: the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

__all__ = ["BEAT_EVERY", "MAX_POST", "STALE_AFTER", "STATE", "is_live"]

STATE = "hub-run.json"
"""The hub's account of a pushed run, in its run directory: ``{"id", "name", "state"
("live"|"finished"), "created_at", "beat_at", "ended_at", "driver" (pid, host, started,
command, as ``rollout.lock`` names them), "received" (bytes of trajectories.jsonl held)}``."""

BEAT_EVERY = 5.0
"""Seconds between a driver's posts while nothing new is recorded (a heartbeat)."""

STALE_AFTER = 60.0
"""Seconds without a post after which a run not ended is no longer live (its driver died, or
lost the hub): shown as ``stalled``, and live again at its driver's next post."""

MAX_POST = 8 << 20
"""Bytes of records one post carries at most (a driver sends more in several)."""


def is_live(state: Mapping[str, Any], *, now: float | None = None) -> bool:
    """Whether the run ``state`` (a :data:`STATE` document) describes is live: not ended, and
    its driver posted within :data:`STALE_AFTER` seconds."""
    beat = state.get("beat_at")
    if state.get("state") != "live" or not isinstance(beat, int | float):
        return False
    return (time.time() if now is None else now) - float(beat) < STALE_AFTER
