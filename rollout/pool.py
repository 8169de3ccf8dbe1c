"""``RolloutPool``: warm instances on every Ray node, leased as futures.

    from rollout import RolloutPool, get

    with RolloutPool("mini-terminal@1.0.0", size=8) as pool:
        lease = pool.acquire(timeout=10)
        ref = lease.call_tool("execute_command", {"command": "echo hi"})
        print(get(ref, timeout=30).text)
        lease.release()

The pool starts one pool actor per alive Ray node (or per bundle of ``placement_group``), each
owning its share of ``size`` warm instances on its own engine. ``acquire`` is one actor round
trip when an instance is free. A pool actor found dead is replaced by a fresh one on the same
node; leases it held are lost (:class:`~aenv_ray.errors.LeaseLostError`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import ray
import ray.exceptions as rex
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AcquireTimeoutError,
    ClosedError,
    ConfigurationError,
    LeaseLostError,
)
from aenv_ray.settings import get_settings
from rollout._actor import limiter_actor, pool_actor_class
from rollout._ray import alive_nodes, ensure_ray, get, translate
from rollout.lease import Lease, LeaseInfo, current_owner
from rollout.metrics import PoolStats
from rollout.spec import EngineFactory, HubEngine, PoolSpec
from rollout.stepping import StepBatch

__all__ = ["RolloutPool"]

log = logging.getLogger("rollout.pool")
T = TypeVar("T")

_CONTROL_TIMEOUT = 30.0  # seconds for control calls (report, fork, close) unless told
_WAIT_SLICE = 0.5  # a waiting acquire asks one actor for at most this long, then looks again


class RolloutPool:
    """A pool of ``size`` warm instances of ``env_name`` spread over Ray nodes.

    Args:
        env_name: ``name@version`` (or ``name``); with ``project=`` it may be omitted.
        size: warm instances in total, split evenly across pool actors.
        engine: ``"local"`` (a local engine per pool actor), ``"kubernetes"`` (a Kubernetes
            engine per pool actor, configured by the ``AENV_K8S_*`` settings in the actor's
            process; the warm pods are shared by the pool's actors, each claims one per
            acquire, and its pods end with the actor), or a picklable zero-argument callable
            returning a :class:`~aenv_ray.SandboxEngine` (such as
            :class:`~rollout.spec.HubEngine`); default: the hub that ``AENV_SYSTEM_URL`` names,
            if any (not with ``project=``), else ``AENV_ENGINE`` (``local``).
        project: a project directory instead of a name.
        ttl, environment_variables, arguments, datasource: as for :class:`aenv_ray.Environment`.
        call_timeout: default per-call timeout of the instances (``AENV_TIMEOUT`` if None).
        lease_timeout: seconds a lease may go without a call before the pool takes it back.
        placement_group: one pool actor per bundle of this placement group instead of per node.
        creation_rate, creation_burst: the creation-rate limit shared by every pool of the
            Ray namespace (set by the first pool; instances per second, at most at once).
        ready_timeout: wait this long for the pool to be warm (0: return at once).
        prefetch: lease up to this many extra instances on each actor round trip (from at
            most half of an actor's idle ones) and hand them out from the driver, without a
            round trip, on later ``acquire`` calls (0: every acquire asks an actor). Prefetched
            leases belong to this driver; unused ones go back on ``close()`` or past half the
            lease timeout. ``"auto"`` (the default): none on a process's first acquire (a task
            that leases once keeps nothing back), then up to 4 (a quarter of an actor's share of
            the pool, at least 1).
        name: the pool's name in logs and metrics.
    """

    def __init__(
        self,
        env_name: str | None = None,
        size: int = 1,
        *,
        engine: str | EngineFactory | None = None,
        project: str | Path | None = None,
        ttl: str | float | None = None,
        environment_variables: Mapping[str, str] | None = None,
        arguments: Sequence[str] = (),
        datasource: str = "",
        call_timeout: float | None = None,
        startup_timeout: float = 60.0,
        lease_timeout: float = 600.0,
        placement_group: Any = None,
        creation_rate: float = 50.0,
        creation_burst: int = 16,
        ready_timeout: float = 120.0,
        name: str | None = None,
        prefetch: int | Literal["auto"] = "auto",
    ) -> None:
        _check_sizes(size, prefetch)
        if engine is None:
            engine = _default_engine(project)
        # a hub resolves names itself (its registry and its tenants): nothing to check here
        env_name, project_dir = _target(env_name, project, here=not isinstance(engine, HubEngine))
        ensure_ray()
        self.spec = PoolSpec(
            env_name=env_name,
            name=name or f"{EnvRef.parse(env_name).name}-{uuid.uuid4().hex[:6]}",
            project=project_dir,
            engine=engine,
            ttl=PoolSpec.parse_ttl(ttl),
            environment_variables=dict(environment_variables or {}),
            arguments=tuple(arguments),
            datasource=datasource,
            call_timeout=call_timeout,
            startup_timeout=startup_timeout,
            lease_timeout=lease_timeout,
        )
        self.size = size
        self.prefetch = prefetch
        # the pool actors: one per node (or bundle), each warming its share of ``size``
        self._strategies = _placements(placement_group)
        n = len(self._strategies)
        self._sizes = _shares(size, n)
        self._rate, self._burst = creation_rate, creation_burst
        self._limiter = limiter_actor(creation_rate, creation_burst)
        self._cls = pool_actor_class()
        self._started: dict[int, ray.ObjectRef[int]] = {}
        self._actors = [self._start_actor(i) for i in range(n)]
        self._replaced = 0
        self._replacing = threading.Lock()
        # the driver's side of leasing
        self._idle_hint = [0] * n
        self._rotation = itertools.count()
        self._closed = False
        self._acquired = 0  # acquires by this process (``prefetch="auto"`` starts after one)
        # leases granted ahead of time: (actor index, actor, lease, when granted)
        self._stash: collections.deque[tuple[int, Any, LeaseInfo, float]] = collections.deque()
        log.info(
            "pool starting",
            extra={"pool": self.spec.name, "env": env_name, "size": size, "actors": n},
        )
        if ready_timeout > 0:
            self.wait_ready(timeout=ready_timeout)

    def _start_actor(self, index: int) -> Any:
        actor = self._cls.options(scheduling_strategy=self._strategies[index]).remote(
            self.spec, self._sizes[index], self._limiter, self._rate, self._burst
        )
        self._started[index] = actor.start.remote()  # warming starts now; checked by wait_ready
        return actor

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def actors(self) -> list[Any]:
        """The pool actors' handles (for inspection and fault-injection tests)."""
        return list(self._actors)

    def wait_ready(self, *, timeout: float = 120.0) -> int:
        """Wait until every pool actor holds its share warm; returns the idle count.

        Raises :class:`~aenv_ray.errors.AEnvTimeoutError` if that takes longer than ``timeout``.
        """
        refs = [a.start.remote(wait=timeout) for a in self._actors]
        what = f"warming pool `{self.name}`"
        idle = get(refs, timeout=timeout + _CONTROL_TIMEOUT, what=what)
        get(list(self._started.values()), timeout=_CONTROL_TIMEOUT, what=what)
        self._started.clear()
        self._idle_hint = [int(n) for n in idle]
        return sum(self._idle_hint)

    @property
    def name(self) -> str:
        """The pool's name (logs, metrics)."""
        return self.spec.name

    def close(self, *, timeout: float = _CONTROL_TIMEOUT) -> int:
        """Delete every instance and stop every pool actor. Idempotent.

        Returns how many instances were deleted. Outstanding leases end
        (:class:`~aenv_ray.errors.LeaseLostError`).
        """
        if self._closed:
            return 0
        self._closed = True
        self._stash.clear()  # the actors' close ends those leases with the rest
        refs = [a.close.remote() for a in self._actors]
        deleted = 0
        for actor, ref in zip(self._actors, refs, strict=True):
            try:
                deleted += int(get(ref, timeout=timeout, what="closing a pool actor"))
            except (LeaseLostError, TimeoutError) as exc:
                log.warning("pool actor did not close cleanly", extra={"error": str(exc)})
            ray.kill(actor, no_restart=True)  # its engine's instances die with its process
        log.info("pool closed", extra={"pool": self.name, "deleted": deleted})
        return deleted

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"pool `{self.name}` is closed; create a new RolloutPool")

    # -- leases ----------------------------------------------------------------------------------
    def acquire(self, *, timeout: float = 60.0, attempt: int = 0) -> Lease:
        """Lease a warm instance; wait up to ``timeout`` s for one to be free.

        One actor round trip when the actor with the most idle instances has one. Raises
        :class:`~aenv_ray.errors.AcquireTimeoutError` when none became free in time.
        ``attempt`` > 0 marks a retry in the pool's counters.
        """
        self._check_open()
        stashed = self._from_stash()
        if stashed is not None:
            self._acquired += 1
            if attempt:  # its actor granted it before it knew this would be a retry
                self._count_retry(stashed)
            return stashed
        owner = current_owner()
        deadline = time.monotonic() + timeout
        while True:
            order = self._order()
            for index in order:  # a free instance anywhere, without waiting
                lease = self._try(index, owner, 0.0, attempt)
                if lease is not None:
                    self._acquired += 1
                    return lease
            left = deadline - time.monotonic()
            if left <= 0:
                raise AcquireTimeoutError(
                    f"no instance of pool `{self.name}` ({self.size} instances) became free "
                    f"within {timeout:g} s; release leases or grow the pool",
                    timeout=timeout,
                    env_name=self.spec.env_name,
                )
            slice_ = min(left, _WAIT_SLICE) if len(order) > 1 else left
            lease = self._try(order[0], owner, slice_, attempt)
            if lease is not None:
                self._acquired += 1
                return lease

    def _order(self) -> list[int]:
        n = len(self._actors)
        start = next(self._rotation) % n
        rotated = [(start + i) % n for i in range(n)]
        return sorted(rotated, key=lambda i: -self._idle_hint[i])

    def __getstate__(self) -> dict[str, Any]:
        # a pool sent to a task or actor: its prefetched leases are this process's, not theirs
        state = dict(self.__dict__)
        state["_stash"] = collections.deque()
        state["_acquired"] = 0
        del state["_replacing"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._replacing = threading.Lock()

    def _extra(self) -> int:
        """How many extra leases to ask for on this round trip."""
        if self.prefetch != "auto":
            return int(self.prefetch)
        if self._acquired == 0:
            return 0
        return min(4, max(1, self.size // (4 * len(self._actors))))

    def _from_stash(self) -> Lease | None:
        """A prefetched lease still fresh and of a live actor (stale ones go back)."""
        fresh_for = self.spec.lease_timeout / 2
        while self._stash:
            index, actor, info, granted = self._stash.popleft()
            if self._actors[index] is actor and time.monotonic() - granted < fresh_for:
                return Lease(info, actor)
            if self._actors[index] is actor:
                actor.release.remote(info.lease_id)  # unused too long: give it back
        return None

    def _count_retry(self, lease: Lease) -> None:
        """Count a retry served from the stash on the lease's actor (awaited: the next
        :meth:`stats` sees it). A dead actor counts nothing: the lease is lost with it."""
        try:
            ray.get(lease.actor.count_retry.remote(), timeout=_CONTROL_TIMEOUT)
        except (rex.RayActorError, rex.GetTimeoutError) as exc:
            log.warning(
                "a retry went uncounted", extra={"pool": self.name, "error": type(exc).__name__}
            )

    def _try(self, index: int, owner: Any, wait: float, attempt: int) -> Lease | None:
        actor = self._actors[index]
        try:
            grant = ray.get(
                actor.acquire.remote(owner, wait, attempt, self._extra()),
                timeout=wait + _CONTROL_TIMEOUT,
            )
        except rex.RayTaskError as exc:
            raise translate(exc, what="acquire") from exc
        except (rex.RayActorError, rex.GetTimeoutError) as exc:
            self._replace(index, actor, exc)
            return None
        self._idle_hint[index] = grant.idle
        now = time.monotonic()
        self._stash.extend((index, actor, info, now) for info in grant.extra)
        return Lease(grant.lease, actor) if grant.lease is not None else None

    def _replace(self, index: int, actor: Any, exc: BaseException) -> None:
        if isinstance(exc, rex.GetTimeoutError):
            log.warning("pool actor slow to answer", extra={"pool": self.name, "actor": index})
            return
        with self._replacing:  # threads acquiring at once (PoolSource) find it dead together
            if self._actors[index] is not actor or isinstance(exc, rex.ActorUnavailableError):
                return  # replaced already, or restarting (Ray brings it back itself)
            log.warning(
                "pool actor died; replacing it",
                extra={"pool": self.name, "actor": index, "error": type(exc).__name__},
            )
            self._actors[index] = self._start_actor(index)
            self._idle_hint[index] = 0
            self._replaced += 1

    def heal(self, *, timeout: float = _CONTROL_TIMEOUT) -> int:
        """Ping every pool actor and replace the dead ones; returns how many were replaced."""
        before = self._replaced
        actors = list(self._actors)
        refs = [a.ping.remote() for a in actors]
        for index, (actor, ref) in enumerate(zip(actors, refs, strict=True)):
            try:
                self._idle_hint[index] = int(ray.get(ref, timeout=timeout))
            except (rex.RayActorError, rex.GetTimeoutError) as exc:
                self._replace(index, actor, exc)
        return self._replaced - before

    def fork(self, lease: Lease, n: int, *, timeout: float = _CONTROL_TIMEOUT) -> list[Lease]:
        """``n`` new leases on copies of ``lease``'s instance (state and files), same actor."""
        self._check_open()
        ref = lease.actor.fork.remote(lease.lease_id, n, current_owner(), timeout)
        infos = get(ref, timeout=timeout + _CONTROL_TIMEOUT, what=f"forking {lease.lease_id}")
        return [Lease(info, lease.actor) for info in infos]

    # -- batched stepping ------------------------------------------------------------------------
    def step_many(
        self,
        steps: Sequence[tuple[Lease, str, dict[str, Any] | None]],
        *,
        timeout: float | None = None,
    ) -> StepBatch:
        """Send many tool calls, one Ray call per pool actor; results come back as they finish.

        ``steps`` holds ``(lease, tool, arguments)``; ``timeout`` is each call's limit. See
        :class:`~rollout.stepping.StepBatch` for taking the first K.
        """
        groups: dict[Any, list[tuple[int, str, str, dict[str, Any] | None, float | None]]] = {}
        for index, (lease, tool, arguments) in enumerate(steps):
            groups.setdefault(lease.actor, []).append(
                (index, lease.lease_id, tool, arguments, timeout)
            )
        submitted = []
        for actor, items in groups.items():
            generator = actor.step_many.options(num_returns="streaming").remote(items)
            submitted.append((generator, {i: (lid, tool) for i, lid, tool, _, _ in items}))
        return StepBatch(submitted)

    @staticmethod
    def wait(
        refs: Sequence[ray.ObjectRef[T]], *, num_returns: int = 1, timeout: float
    ) -> tuple[list[ray.ObjectRef[T]], list[ray.ObjectRef[T]]]:
        """:func:`ray.wait` over lease calls' refs with a required ``timeout``: (ready, pending)."""
        refs = list(refs)
        if not refs:
            return [], []
        ready, pending = ray.wait(refs, num_returns=min(num_returns, len(refs)), timeout=timeout)
        return list(ready), list(pending)

    # -- stats -----------------------------------------------------------------------------------
    def stats(self, *, timeout: float = _CONTROL_TIMEOUT) -> PoolStats:
        """Latency per phase (p50/p99) and counters, summed over the live pool actors."""
        self._check_open()
        actors = list(self._actors)
        refs = [a.report.remote() for a in actors]
        reports = []
        for index, (actor, ref) in enumerate(zip(actors, refs, strict=True)):
            try:
                reports.append(ray.get(ref, timeout=timeout))
            except (rex.RayActorError, rex.GetTimeoutError) as exc:
                self._replace(index, actor, exc)
        return PoolStats.merge(reports, actor_restarts=self._replaced)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"RolloutPool({self.spec.env_name!r}, size={self.size}, {state}, name={self.name!r})"


def _default_engine(project: str | Path | None) -> str | EngineFactory:
    """A pool's engine when none is given: the configured hub (as the SDK does), else the
    ``AENV_ENGINE`` setting."""
    settings = get_settings()
    if settings.system_url and project is None:
        return HubEngine(
            settings.system_url,
            api_key=settings.api_key,
            route=settings.hub_route,
            connect_timeout=settings.connect_timeout,
        )
    return settings.engine


def _check_sizes(size: int, prefetch: int | Literal["auto"]) -> None:
    """Refuse a pool of no instances and a prefetch that is neither ``"auto"`` nor a count."""
    if size < 1:
        raise ConfigurationError(f"a pool needs size >= 1, got {size}")
    if prefetch != "auto" and (not isinstance(prefetch, int) or prefetch < 0):
        raise ConfigurationError(f"prefetch must be an int >= 0 or 'auto', got {prefetch!r}")


def _target(
    env_name: str | None, project: str | Path | None, *, here: bool = True
) -> tuple[str, str | None]:
    """``(env_name, project directory)`` of what the pool runs: a project directory (absolute;
    its config names it unless ``env_name`` does) or a name resolved now, in the driver, so a
    wrong one fails here rather than in every pool actor (``here``: names are looked up on
    this machine; else the engine, a hub, looks them up)."""
    if project is not None:
        from aenv_ray.config import EnvConfig

        directory = str(Path(project).resolve())
        return env_name or EnvConfig.load(directory).ref, directory
    if env_name is None:
        raise ConfigurationError("name an environment (`name@version`) or pass project=")
    if here:
        from aenv_ray.resolve import resolve_environment

        resolve_environment(env_name, _env_path())
    return env_name, None


def _shares(size: int, actors: int) -> list[int]:
    """``size`` split over ``actors`` as evenly as it goes (the first ones get the remainder)."""
    return [size // actors + (1 if i < size % actors else 0) for i in range(actors)]


def _placements(placement_group: Any) -> list[Any]:
    """One scheduling strategy per pool actor: each bundle, or each alive node."""
    if placement_group is not None:
        return [
            PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=i)
            for i in range(placement_group.bundle_count)
        ]
    nodes = alive_nodes()
    if not nodes:
        raise ConfigurationError("the Ray cluster has no alive node")
    return [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]


def _env_path() -> str:
    from aenv_ray.settings import get_settings

    return get_settings().env_path
