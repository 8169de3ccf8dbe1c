"""TTL that survives us: engine sessions as Leases, and the reaper that ends expired pods and
pods whose session is gone, with no state but what the cluster stores.

- Each engine opened with ``session=True`` holds a coordination/v1 **Lease**
  ``aenv-session-<id>`` and renews it every few seconds; the pods it creates carry its id as a
  label. When the process dies, the Lease stops being renewed.
- One **reaper** per namespace runs at a time: every engine (with ``reaper=True``) competes for
  the Lease ``aenv-ray-reaper``; its holder deletes the pods whose ``aenv-ray.io/expires-at``
  annotation has passed, and the pods of sessions whose Lease lapsed (or is gone). A reaper
  that dies stops renewing; another engine takes over within ``LEASE_SECONDS``.
- The backstop when no reaper runs at all is each pod's ``activeDeadlineSeconds`` (the engine's
  ``max_lifetime``): the kubelet ends the pod then, whatever anyone renewed.

    >>> micro_time(0.5)
    '1970-01-01T00:00:00.500000Z'
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from aenv_ray.engine import TerminationReason
from aenv_ray.errors import (
    AEnvError,
    AuthenticationError,
    ClusterConflictError,
    PermissionDeniedError,
)
from k8s_backend._api import Kube
from k8s_backend._cache import PodCache
from k8s_backend.manifests import (
    ANNOTATION_EXPIRES,
    LABEL_MANAGED,
    LABEL_SESSION,
    MANAGER,
)
from k8s_backend.state import instance_id, timestamp

__all__ = [
    "LEASE_SECONDS",
    "REAPER_LEASE",
    "Housekeeper",
    "micro_time",
    "release_lease",
    "session_lease_name",
    "take_lease",
]

log = logging.getLogger("aenv_ray.k8s")

LEASE_SECONDS = 15
"""How long a Lease holds without renewal (sessions and the reaper's)."""
RENEW_EVERY = 4.0
REFUSED_PAUSE = 60.0
"""The longest pause between housekeeping rounds the cluster refuses (403, 401)."""
REAPER_LEASE = "aenv-ray-reaper"
LABEL_LEASE = "aenv-ray.io/lease"  # "session" or "reaper"
_LEASES = "coordination.k8s.io/v1"


def micro_time(seconds: float) -> str:
    """Seconds since the epoch as the API's MicroTime."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def session_lease_name(session: str) -> str:
    """The Lease of engine session ``session``."""
    return f"aenv-session-{session}"


def _lease(name: str, holder: str, kind: str, now: float, seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "labels": {LABEL_MANAGED: MANAGER, LABEL_LEASE: kind}},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
        },
    }


def _lapsed(lease: dict[str, Any], now: float, grace: float = 0.0) -> bool:
    """Whether ``lease`` has run out by ``now`` (plus ``grace`` seconds). A resigned Lease's
    ``renewTime`` is the epoch: lapsed at once, whenever it was acquired.

    >>> resigned = {"spec": {"renewTime": micro_time(0.0), "acquireTime": micro_time(100.0)}}
    >>> _lapsed(resigned, now=101.0)
    True
    >>> _lapsed({"spec": {"acquireTime": micro_time(100.0)}}, now=101.0)
    False
    """
    spec = lease.get("spec") or {}
    renewed = timestamp(spec.get("renewTime"))
    if renewed is None:  # never renewed: from its acquisition
        renewed = timestamp(spec.get("acquireTime")) or 0.0
    duration = float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
    return renewed + duration + grace < now


def take_lease(kube: Kube, name: str, holder: str, kind: str, seconds: int) -> bool:
    """Take Lease ``name`` for ``holder`` for ``seconds`` (made if absent) unless another
    holder's has not lapsed; True if taken. Atomic across clients: the create is refused when
    it exists, and the update carries the ``resourceVersion`` read, so of two takers one wins."""
    now = time.time()
    path = kube.path(_LEASES, "leases", name)
    try:
        lease = kube.request("GET", path, what=f"read lease {name}", not_found=_Absent)
    except _Absent:
        body = _lease(name, holder, kind, now, seconds)
        try:
            kube.request("POST", kube.path(_LEASES, "leases"), body=body, what=f"take lease {name}")
        except ClusterConflictError:
            return False
        return True
    spec = lease.setdefault("spec", {})
    if spec.get("holderIdentity") != holder and not _lapsed(lease, now):
        return False
    spec.update(
        holderIdentity=holder,
        leaseDurationSeconds=seconds,
        acquireTime=micro_time(now),
        renewTime=micro_time(now),
    )
    try:
        kube.request("PUT", path, body=lease, what=f"take lease {name}")
    except ClusterConflictError:
        return False
    return True


def release_lease(kube: Kube, name: str, holder: str) -> None:
    """Let Lease ``name`` lapse now if ``holder`` still holds it (best effort: otherwise it
    lapses by itself)."""
    path = kube.path(_LEASES, "leases", name)
    with contextlib.suppress(AEnvError):
        lease = kube.request("GET", path, what=f"read lease {name}")
        if (lease.get("spec") or {}).get("holderIdentity") == holder:
            lease["spec"]["renewTime"] = micro_time(0.0)
            lease["spec"].pop("acquireTime", None)
            kube.request("PUT", path, body=lease, what=f"release lease {name}")


class Housekeeper:
    """The engine's background duties, run by one thread: renew its session's Lease, and when
    it leads, reap. ``delete(pod, reason)`` deletes a pod (the engine's own call)."""

    def __init__(
        self,
        kube: Kube,
        cache: PodCache,
        *,
        identity: str,
        session: str | None,
        reap: bool,
        delete: Any,
        tick: float = 1.0,
        lease_seconds: int = LEASE_SECONDS,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.identity = identity
        self.session = session
        self.reap = reap
        self.delete = delete
        self.tick = tick
        self.lease_seconds = lease_seconds
        self.renew_every = max(min(RENEW_EVERY, lease_seconds / 3), tick)
        self.leading = False
        self._stop = threading.Event()
        self._renewed = 0.0
        self._led = 0.0
        self._sessions_checked = 0.0

    # -- the session -------------------------------------------------------------------------
    def open_session(self) -> None:
        """Create this engine's session Lease (before any pod names it)."""
        if self.session is None:
            return
        now = time.time()
        body = _lease(
            session_lease_name(self.session), self.identity, "session", now, self.lease_seconds
        )
        self.kube.request(
            "POST", self.kube.path(_LEASES, "leases"), body=body, what="create the session lease"
        )
        self._renewed = now

    def close_session(self) -> None:
        """Delete the session Lease (its pods were deleted first)."""
        if self.session is None:
            return
        name = session_lease_name(self.session)
        with contextlib.suppress(_Absent):
            self.kube.request(
                "DELETE",
                self.kube.path(_LEASES, "leases", name),
                what=f"delete lease {name}",
                not_found=_Absent,
            )

    def _renew_session(self, now: float) -> None:
        if self.session is None or now - self._renewed < self.renew_every:
            return
        name = session_lease_name(self.session)
        self.kube.request(
            "PATCH",
            self.kube.path(_LEASES, "leases", name),
            body={"spec": {"renewTime": micro_time(now)}},
            content_type="application/merge-patch+json",
            what=f"renew lease {name}",
        )
        self._renewed = now

    # -- leading -----------------------------------------------------------------------------
    def _lead(self, now: float) -> None:
        """Hold or take the reaper's Lease (every RENEW_EVERY seconds)."""
        if now - self._led < self.renew_every:
            return
        self._led = now
        path = self.kube.path(_LEASES, "leases", REAPER_LEASE)
        try:
            lease = self.kube.request("GET", path, what="read the reaper lease", not_found=_Absent)
        except _Absent:
            body = _lease(REAPER_LEASE, self.identity, "reaper", now, self.lease_seconds)
            try:
                self.kube.request(
                    "POST", self.kube.path(_LEASES, "leases"), body=body, what="lead the reaper"
                )
            except ClusterConflictError:
                self.leading = False
                return
            self._became_leader()
            return
        spec = lease.setdefault("spec", {})
        mine = spec.get("holderIdentity") == self.identity
        if not mine and not _lapsed(lease, now):
            self.leading = False
            return
        spec["holderIdentity"] = self.identity
        spec["renewTime"] = micro_time(now)
        spec["leaseDurationSeconds"] = self.lease_seconds
        if not mine:
            spec["acquireTime"] = micro_time(now)
        try:  # PUT carries the resourceVersion read: of two takers, one wins
            self.kube.request("PUT", path, body=lease, what="renew the reaper lease")
        except ClusterConflictError:
            self.leading = False
            return
        if not mine:
            self._became_leader()

    def _became_leader(self) -> None:
        self.leading = True
        log.info("leading the reaper", extra={"identity": self.identity})

    def resign(self) -> None:
        """Give the reaper's Lease up at once (on close), so another engine need not wait."""
        if not self.leading:
            return
        path = self.kube.path(_LEASES, "leases", REAPER_LEASE)
        try:
            lease = self.kube.request("GET", path, what="read the reaper lease")
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["renewTime"] = micro_time(0.0)
                self.kube.request("PUT", path, body=lease, what="resign the reaper lease")
        except AEnvError:
            pass
        self.leading = False

    # -- reaping -----------------------------------------------------------------------------
    def _reap(self, now: float) -> None:
        for pod in self.cache.pods():
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            try:
                expires = float((meta.get("annotations") or {}).get(ANNOTATION_EXPIRES, "inf"))
            except ValueError:
                continue
            if expires <= now:
                self._delete(pod, TerminationReason.EXPIRED)
        if now - self._sessions_checked >= self.renew_every:
            self._sessions_checked = now
            self._reap_orphans(now)

    def _reap_orphans(self, now: float) -> None:
        listing = self.kube.request(
            "GET",
            self.kube.path(_LEASES, "leases"),
            query={"labelSelector": f"{LABEL_MANAGED}={MANAGER},{LABEL_LEASE}=session"},
            what="list session leases",
        )
        alive = {
            str((lease.get("metadata") or {}).get("name", ""))
            for lease in listing.get("items") or []
            if not _lapsed(lease, now, grace=self.lease_seconds)
        }
        for pod in self.cache.pods():
            meta = pod.get("metadata") or {}
            session = (meta.get("labels") or {}).get(LABEL_SESSION)
            if not session or meta.get("deletionTimestamp"):
                continue
            if session_lease_name(session) not in alive:
                created = timestamp(meta.get("creationTimestamp")) or now
                if now - created > self.lease_seconds:  # a first pod may race its lease
                    self._delete(pod, TerminationReason.OWNER_GONE)

    def _delete(self, pod: dict[str, Any], reason: TerminationReason) -> None:
        iid = instance_id(pod)
        log.info(
            "reaping a pod",
            extra={"pod": (pod.get("metadata") or {}).get("name"), "reason": reason.value},
        )
        try:
            self.delete(pod, reason)
        except (PermissionDeniedError, AuthenticationError):
            raise  # not this pod's problem: the round stops, run() backs off
        except AEnvError as exc:
            log.warning("could not reap a pod", extra={"instance": iid, "error": str(exc)})

    # -- the thread --------------------------------------------------------------------------
    def run(self) -> None:
        """Until :meth:`stop`: renew, lead, reap; failures are logged and tried again, and
        refusals (403, 401: retrying alone does not mend them) ever more slowly, up to
        :data:`REFUSED_PAUSE` apart."""
        pause = 0.0
        while not self._stop.wait(self.tick + pause):
            now = time.time()
            try:
                self._renew_session(now)
                if self.reap:
                    self._lead(now)
                    if self.leading and self.cache.synced.is_set():
                        self._reap(now)
                pause = 0.0
            except (PermissionDeniedError, AuthenticationError) as exc:
                self.leading = False
                self._renewed = self._led = 0.0  # the next round asks again, after the pause
                pause = min(max(pause * 2, self.tick), REFUSED_PAUSE)
                log.error(
                    "housekeeping refused by the cluster; trying again later",
                    extra={"error": str(exc), "pause": pause},
                )
            except AEnvError as exc:
                log.warning("housekeeping failed; trying again", extra={"error": str(exc)})
            except Exception:
                log.exception("housekeeping failed unexpectedly")

    def stop(self) -> None:
        """End :meth:`run` at its next tick."""
        self._stop.set()


class _Absent(AEnvError):
    """A 404 the housekeeper expects (no reaper lease yet)."""
