"""Warm pod pools: pods started ahead of demand, free until one client claims one.

A warm pod is an instance pod labelled ``aenv-ray.io/pool=<key>`` and
``aenv-ray.io/claim=free``. Any client of the namespace (pool actors on many nodes, hubs) may
claim one by patching it with a ``metadata.resourceVersion`` precondition: the API server
applies the patch only if the pod is still the version the client read, so of two clients that
race for one pod exactly one wins and the other gets a 409 and tries another. A claim moves the
pod to the claimer (``claim`` label, its session, its owner) and starts its TTL.

An engine with a session may also **reserve** a few of its own free pods ahead of demand
(:func:`reserve_patch`: the same precondition, ``claim=reserved``, its session, a reservation
id): a reserved pod is no longer free to anyone else, stays in its engine's session (so it
ends with the engine, or is reaped as an orphan if the engine dies), and the engine's next
claim takes it from memory and records the claim after answering (:func:`claim_patch` again).

The key names what the pods are interchangeable for: the pool's name and everything the
instance is made of (definition, variables, arguments, datasource, labels), so that two pools
that share a name but not a spec never hand out each other's pods.

Pure functions over plain dicts; the engine (:mod:`k8s_backend.engine`) sends what they build.

    >>> key = pool_key("tau2", {"env_ref": "tau2@1.0.0", "ttl": 600})
    >>> key.startswith("tau2-"), len(key) <= 63
    (True, True)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from k8s_backend.manifests import (
    ANNOTATION_EXPIRES,
    ANNOTATION_OWNER,
    CLAIM_FREE,
    LABEL_CLAIM,
    LABEL_OWNER,
    LABEL_SESSION,
    label_value,
)

__all__ = [
    "ANNOTATION_CLAIM",
    "CLAIMED",
    "RESERVED",
    "claim_patch",
    "claimed_by",
    "is_claimable",
    "is_warm",
    "pool_key",
    "reserve_patch",
    "reserved_by",
]

CLAIMED = "claimed"
RESERVED = "reserved"
ANNOTATION_CLAIM = "aenv-ray.io/claim-id"  # the claim that took the pod: its claimer checks it


def pool_key(pool: str, spec: Mapping[str, Any]) -> str:
    """The label value of pool ``pool`` holding instances made from ``spec`` (a JSON-able
    description of them): readable prefix, digest of the whole."""
    text = json.dumps({"pool": pool, "spec": spec}, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    prefix = label_value(pool)[:40].rstrip("-._")
    return f"{prefix}-{digest}" if prefix else digest


def is_claimable(pod: Mapping[str, Any], now: float) -> bool:
    """Free, Ready, not being deleted, and not yet past its (free) expiry."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_CLAIM) == CLAIM_FREE and is_warm(pod, now)


def is_warm(pod: Mapping[str, Any], now: float) -> bool:
    """Ready, not being deleted, and not yet past its (free) expiry, whatever its claim."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    try:
        if float((meta.get("annotations") or {}).get(ANNOTATION_EXPIRES, "inf")) <= now:
            return False
    except ValueError:
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def claim_patch(
    pod: Mapping[str, Any],
    *,
    claim: str,
    expires_at: float,
    session: str | None,
    owner: str | None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A JSON merge patch that claims ``pod`` if it is still the version read (its
    ``resourceVersion`` is the precondition): claimed by ``claim`` (a fresh id), expiring at
    ``expires_at``, owned by ``session`` and ``owner`` (None: neither, the pod outlives its
    claimer's engine until its TTL), carrying the claimer's ``labels`` from now on."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": str(meta.get("resourceVersion", "")),
            "labels": {
                **{str(k): label_value(str(v)) for k, v in (labels or {}).items()},
                LABEL_CLAIM: CLAIMED,
                LABEL_SESSION: label_value(session) if session else None,
                LABEL_OWNER: label_value(owner) if owner else None,
            },
            "annotations": {
                ANNOTATION_CLAIM: claim,
                ANNOTATION_EXPIRES: f"{expires_at:.3f}",
                ANNOTATION_OWNER: owner,
            },
        }
    }


def reserve_patch(pod: Mapping[str, Any], *, reservation: str, session: str) -> dict[str, Any]:
    """A JSON merge patch that reserves the free ``pod`` for engine session ``session`` if it
    is still the version read: ``claim=reserved``, the session's label (its Lease now covers
    the pod), ``reservation`` (a fresh id) as the claim id."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": str(meta.get("resourceVersion", "")),
            "labels": {LABEL_CLAIM: RESERVED, LABEL_SESSION: label_value(session)},
            "annotations": {ANNOTATION_CLAIM: reservation},
        }
    }


def reserved_by(pod: Mapping[str, Any]) -> str | None:
    """The reservation id holding ``pod`` (None: not reserved)."""
    return _held_by(pod, RESERVED)


def claimed_by(pod: Mapping[str, Any]) -> str | None:
    """The claim id that took ``pod`` (None: free, or not a pool's pod)."""
    return _held_by(pod, CLAIMED)


def _held_by(pod: Mapping[str, Any], state: str) -> str | None:
    """The id in ``pod``'s claim annotation when its claim label is ``state``, else None."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_CLAIM) != state:
        return None
    value = (meta.get("annotations") or {}).get(ANNOTATION_CLAIM)
    return str(value) if value else None
