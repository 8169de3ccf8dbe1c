"""The engine's view of its namespace's instance pods, kept by one watch: a list, then a watch
from the list's resourceVersion, a fresh list when the watch expires (410 Gone) or breaks.

Readers (the engine's async methods, on any event loop) see the pods as of the last event and
wait for news of one instance through :meth:`PodCache.changed`; the watch thread writes.
Free (and reserved) pods of warm pools are also indexed by pool, so a claim looks at its pool's
pods only.
Deleted pods leave a tombstone (their final :class:`~aenv_ray.engine.InstanceInfo`), kept for
the last :data:`TOMBSTONES` deletions, so ``get`` still answers why an instance ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aenv_ray.engine import InstanceInfo, InstanceState, TerminationReason
from aenv_ray.errors import (
    AEnvError,
    AuthenticationError,
    ConfigurationError,
    PermissionDeniedError,
)
from k8s_backend._api import Kube, WatchExpired
from k8s_backend.manifests import CLAIM_FREE, LABEL_CLAIM, LABEL_MANAGED, LABEL_POOL, MANAGER
from k8s_backend.state import instance_id, pod_info, resource_version, slim
from k8s_backend.tokens import KeyHolder
from k8s_backend.warm import RESERVED

__all__ = ["TOMBSTONES", "PodCache", "pool_waiter"]

log = logging.getLogger("aenv_ray.k8s")

TOMBSTONES = 4096
SELECTOR = f"{LABEL_MANAGED}={MANAGER}"
REFUSED = (PermissionDeniedError, AuthenticationError, ConfigurationError)
"""Failures that retrying alone does not mend (403, 401, a missing namespace): waiters are
told at once, and the watch retries them slowly (up to :data:`REFUSED_PAUSE` apart)."""
REFUSED_PAUSE = 30.0


class PodCache:
    """Pods by instance id, plus tombstones, fed by :meth:`run` (the watch thread)."""

    def __init__(
        self, kube: Kube, *, watch_timeout: int = 60, tokens: KeyHolder | None = None
    ) -> None:
        self.kube = kube
        self.tokens = tokens or KeyHolder(kube)
        """Derives a live pod's token (:mod:`k8s_backend.tokens`) once the key is loaded."""
        self.watch_timeout = watch_timeout
        self.synced = threading.Event()
        self._settled = threading.Event()  # synced, or refused by the cluster (see REFUSED)
        self.error: AEnvError | None = None  # the last failure of list/watch, while unsynced
        self.relists = 0  # how many times the cache listed (1 + one per expired/broken watch)
        self._pods: dict[str, dict[str, Any]] = {}
        self._tombs: OrderedDict[str, InstanceInfo] = OrderedDict()
        self._hints: dict[str, TerminationReason] = {}
        self._free: dict[str, dict[str, dict[str, Any]]] = {}  # pool -> iid -> unclaimed pod
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._enders: dict[str, list[Callable[[InstanceInfo], None]]] = {}  # see on_end
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._response: Any = None

    # -- reading -----------------------------------------------------------------------------
    def wait_synced(self, timeout: float) -> bool:
        """Wait until the first list answered (True), or the cluster refused it in a way
        retrying alone does not mend, or ``timeout`` passed (False: see :attr:`error`)."""
        self._settled.wait(timeout)
        return self.synced.is_set()

    def pod(self, iid: str) -> dict[str, Any] | None:
        """The pod of instance ``iid``, as last seen (None: none live)."""
        with self._lock:
            return self._pods.get(iid)

    def tombstone(self, iid: str) -> InstanceInfo | None:
        """The final state of instance ``iid`` when its pod is gone."""
        with self._lock:
            return self._tombs.get(iid)

    def pods(self) -> list[dict[str, Any]]:
        """Every live pod of ours, as last seen."""
        with self._lock:
            return list(self._pods.values())

    def free(self, pool: str) -> list[dict[str, Any]]:
        """The pods of warm pool ``pool`` labelled free or reserved (Ready or not yet), oldest
        first: nobody's instance yet."""
        with self._lock:
            return list(self._free.get(pool, {}).values())

    def info(self, pod: dict[str, Any]) -> InstanceInfo:
        """The instance of a live ``pod``; one being deleted ends for the reason this process
        deleted it for, when it did (expired, its owner gone)."""
        meta = pod.get("metadata") or {}
        hint = None
        if meta.get("deletionTimestamp"):
            with self._lock:
                hint = self._hints.get(instance_id(pod) or "")
        return pod_info(pod, reason=hint, token=self.tokens.of_pod(pod))

    def changed(self, iid: str) -> asyncio.Future[None]:
        """A future of the running loop, done at the next change of instance ``iid``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.setdefault(iid, []).append((loop, future))
        return future

    def pool_changed(self, pool: str) -> asyncio.Future[None]:
        """A future of the running loop, done at the next change of a free pod of ``pool``
        (forget it with :meth:`forget_waiter` ``(pool_waiter(pool), future)``)."""
        return self.changed(pool_waiter(pool))

    def forget_waiter(self, iid: str, future: asyncio.Future[None]) -> None:
        """Drop a waiter that no longer waits (its caller timed out or was cancelled)."""
        with self._lock:
            waiting = self._waiters.get(iid, [])
            waiting[:] = [(loop, f) for loop, f in waiting if f is not future]
            if not waiting:
                self._waiters.pop(iid, None)

    def on_end(self, iid: str, callback: Callable[[InstanceInfo], None]) -> Callable[[], None]:
        """Call ``callback(info)`` once when instance ``iid`` ends (its pod deleted, being
        deleted, or terminated), from the watch thread; at once, here, if it has. Returns the
        function that cancels it."""
        with self._lock:
            tomb = self._tombs.get(iid)
            if tomb is None:
                self._enders.setdefault(iid, []).append(callback)
        if tomb is not None:
            callback(tomb)
            return _nothing
        pod = self.pod(iid)
        if pod is not None:
            self._ended(iid, pod)

        def cancel() -> None:
            with self._lock:
                waiting = self._enders.get(iid, [])
                waiting[:] = [c for c in waiting if c is not callback]
                if not waiting:
                    self._enders.pop(iid, None)

        return cancel

    def _ended(self, iid: str, pod: dict[str, Any]) -> None:
        """Tell who waits for instance ``iid``'s end if ``pod`` says it ended."""
        info = self.info(pod)
        if info.state is not InstanceState.TERMINATED:
            return
        with self._lock:
            told = self._enders.pop(iid, [])
        _tell(told, info)

    # -- writing -----------------------------------------------------------------------------
    def hint(self, iid: str, reason: TerminationReason) -> None:
        """This process is ending instance ``iid`` for ``reason``: its tombstone will say so."""
        with self._lock:
            self._hints[iid] = reason
            if len(self._hints) > TOMBSTONES:
                self._hints.pop(next(iter(self._hints)))

    def put(self, pod: dict[str, Any]) -> None:
        """Record ``pod`` unless the cache holds a newer version of it (an API answer may
        arrive after the watch's event of a later change)."""
        iid = instance_id(pod)
        if iid is None:
            return
        pod = slim(pod)
        with self._lock:
            known = self._pods.get(iid)
            if known is not None and resource_version(known) > resource_version(pod):
                return
            if iid in self._tombs:  # a pod already seen deleted does not come back
                return
            self._pods[iid] = pod
            wake = self._waiters.pop(iid, [])
            wake += self._index(iid, pod)
            watched = iid in self._enders
        _wake(wake)
        if watched:
            self._ended(iid, pod)

    def remove(self, pod: dict[str, Any], *, reason: TerminationReason | None = None) -> None:
        """Pod ``pod`` is gone: leave its tombstone."""
        iid = instance_id(pod)
        if iid is None:
            return
        with self._lock:
            hinted = self._hints.pop(iid, None) or reason
            self._pods.pop(iid, None)
            wake = self._index(iid, None, pool=_pool(pod))
            self._tombs[iid] = pod_info(pod, deleted=True, reason=hinted)
            while len(self._tombs) > TOMBSTONES:
                self._tombs.popitem(last=False)
            wake += self._waiters.pop(iid, [])
            told = self._enders.pop(iid, [])
            tomb = self._tombs[iid]
        _wake(wake)
        _tell(told, tomb)

    def disown(self, pod: dict[str, Any], info: InstanceInfo) -> None:
        """This process no longer holds ``pod``'s instance (a claim it could not record): it
        ends here as ``info`` says, whoever holds the pod now; later events of it are ignored."""
        iid = instance_id(pod)
        if iid is None:
            return
        with self._lock:
            self._pods.pop(iid, None)
            wake = self._index(iid, None, pool=_pool(pod))
            self._tombs[iid] = info
            while len(self._tombs) > TOMBSTONES:
                self._tombs.popitem(last=False)
            wake += self._waiters.pop(iid, [])
            told = self._enders.pop(iid, [])
        _wake(wake)
        _tell(told, info)

    def _index(
        self, iid: str, pod: dict[str, Any] | None, *, pool: str | None = None
    ) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]:
        """Keep the free-pod index of ``iid`` (``pod`` None: gone); the pool's waiters to wake.
        Called with the lock held."""
        pool = pool or (_pool(pod) if pod is not None else None)
        if pool is None:
            return []
        meta = (pod or {}).get("metadata") or {}
        free = (meta.get("labels") or {}).get(LABEL_CLAIM) in (CLAIM_FREE, RESERVED)
        members = self._free.get(pool, {})
        if pod is not None and free and not meta.get("deletionTimestamp"):
            self._free[pool] = members
            members[iid] = pod
        elif members.pop(iid, None) is None:
            return []  # neither free before nor now: nobody waits on this
        elif not members:
            del self._free[pool]
        return self._waiters.pop(pool_waiter(pool), [])

    def _replace(self, pods: list[dict[str, Any]]) -> None:
        fresh = {iid: pod for pod in pods if (iid := instance_id(pod)) is not None}
        with self._lock:
            vanished = [pod for iid, pod in self._pods.items() if iid not in fresh]
        for pod in vanished:  # deleted while we did not watch
            self.remove(pod)
        for pod in fresh.values():
            self.put(pod)

    # -- the watch thread --------------------------------------------------------------------
    def run(self) -> None:
        """List and watch until :meth:`stop` (the body of the engine's watch thread)."""
        pause = 0.1
        path = self.kube.path("", "pods")
        while not self._stop.is_set():
            try:
                listing = self.kube.request(
                    "GET", path, query={"labelSelector": SELECTOR}, what="list pods"
                )
                self.relists += 1
                self._replace(list(listing.get("items") or []))
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                self.error = None
                self.synced.set()
                self._settled.set()
                pause = 0.1
                while not self._stop.is_set():
                    version = self._watch(path, version)
            except WatchExpired:
                log.info(
                    "pod watch expired; listing again", extra={"namespace": self.kube.namespace}
                )
            except AEnvError as exc:
                if self._stop.is_set():
                    return
                self.error = exc
                refused = isinstance(exc, REFUSED)
                if refused:
                    self._settled.set()  # nobody waits for what may never come
                log.warning(
                    "pod list or watch refused; retrying slowly"
                    if refused
                    else "pod list or watch failed; retrying",
                    extra={"namespace": self.kube.namespace, "error": str(exc), "pause": pause},
                )
                self._stop.wait(pause)
                pause = min(pause * 2, REFUSED_PAUSE if refused else 5.0)
            except Exception:  # a bug must not end the watch silently
                log.exception("pod watch failed unexpectedly; retrying")
                self._stop.wait(pause)
                pause = min(pause * 2, 5.0)

    def _watch(self, path: str, version: str) -> str:
        """One watch from ``version`` until the server ends it; the last version seen."""
        events = self.kube.watch(
            path,
            resource_version=version,
            query={"labelSelector": SELECTOR},
            timeout_seconds=self.watch_timeout,
            stop=self._stop,
            on_response=self._track,
        )
        for event in events:
            version = str((event.object.get("metadata") or {}).get("resourceVersion") or version)
            if event.type in ("ADDED", "MODIFIED"):
                self.put(event.object)
            elif event.type == "DELETED":
                self.remove(event.object)
        return version

    def _track(self, response: Any) -> None:
        self._response = response

    def stop(self) -> None:
        """End :meth:`run` soon: the open watch is shut down, not waited for."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()


def pool_waiter(pool: str) -> str:
    """The waiter key of pool ``pool`` (no instance id has a slash)."""
    return f"pool/{pool}"


def _pool(pod: dict[str, Any]) -> str | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL)
    return str(value) if value else None


def _wake(waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    for loop, future in waiting:
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits there
            loop.call_soon_threadsafe(_done, future)


def _tell(callbacks: list[Callable[[InstanceInfo], None]], info: InstanceInfo) -> None:
    for callback in callbacks:
        try:
            callback(info)
        except Exception:  # one listener's bug must not stop the watch
            log.exception("an instance-end callback failed", extra={"instance": info.id})


def _nothing() -> None:
    return None


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
