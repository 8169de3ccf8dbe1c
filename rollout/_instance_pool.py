"""``InstancePool``: the logic of one pool actor, a plain async class (Ray wraps it at the edge).

It owns a share of a :class:`~rollout.pool.RolloutPool`'s warm instances, each an open
:class:`~aenv_ray.Environment` on this process's engine (one pooled HTTP client per instance):

- **warm**: a maintenance task tops the pool up to ``size`` (tokens from the shared creation-rate
  limit), renews idle instances before their TTL runs out and replaces dead or expired ones;
- **leases**: ``acquire`` pops an idle instance (or waits for one, up to ``wait`` seconds) and
  hands out a lease id; every call renews the lease; ``release`` deletes the instance (the next
  lease gets a fresh one); a lease idle past ``lease_timeout`` or whose owner's job ended is
  reclaimed and its calls raise :class:`~aenv_ray.errors.LeaseLostError`;
- **shared warm pools**: on an engine that keeps warm pools itself
  (:class:`~aenv_ray.engine.WarmPoolEngine`: Kubernetes), the warm instances are the engine's
  free pods, which every pool actor (and hub) of the cluster can claim; the actor keeps its
  share of them started, and ``acquire`` claims one (a PATCH, no start);
- **calls**: tool, function, reward and list calls run on this actor's event loop, concurrently;
  :meth:`step_many` runs many at once and yields them as they finish.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aenv_ray import Environment
from aenv_ray.engine import (
    InstanceSpec,
    InstanceState,
    SandboxEngine,
    TerminationReason,
    WarmCount,
    WarmPoolEngine,
)
from aenv_ray.errors import (
    AEnvError,
    ClosedError,
    InstanceBrokenError,
    InstanceClosedError,
    InstanceExpiredError,
    LeaseLostError,
)
from rollout.lease import LeaseInfo, Owner
from rollout.metrics import CALL_BUCKETS, COUNTERS, LatencyHistogram, Phase
from rollout.spec import PoolSpec
from rollout.stepping import StepResult

__all__ = ["Grant", "InstancePool", "TokenSource"]

log = logging.getLogger("rollout.pool.actor")

TokenSource = Callable[[int], Awaitable[tuple[int, float]]]
"""``take(n) -> (granted, seconds until more)``: the creation-rate limit."""

DeadOwners = Callable[[list[Owner]], Awaitable[dict[Owner, str]]]
"""Which of these lease owners are gone, each with why: for reclaiming their leases."""

_TICK = 0.25  # seconds between maintenance rounds (sooner when something changed)
_OWNER_CHECK = 2.0  # seconds between looks at the owners (job and actor tables, processes)
_FORGET_AFTER = 10_000  # ended leases remembered, for precise errors
_CLOSE_WAIT = 20.0  # seconds a close waits for creations under way (their instances it deletes)


@dataclass(frozen=True)
class Grant:
    """The answer to :meth:`InstancePool.acquire`: a lease or none, how many stay idle, and
    the extra leases a prefetching caller asked for (granted from idle surplus only)."""

    lease: LeaseInfo | None
    idle: int
    extra: tuple[LeaseInfo, ...] = ()


@dataclass(eq=False)
class _Slot:
    env: Environment
    instance_id: str
    ttl: float | None
    lease_id: str | None = None
    owner: Owner | None = None
    last_used: float = 0.0
    first_call: bool = True
    forked: bool = False
    dead: bool = False
    calls: int = 0
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


class InstancePool:
    """One actor's share of warm instances; see the module docstring."""

    def __init__(
        self,
        spec: PoolSpec,
        size: int,
        *,
        engine: SandboxEngine | None = None,
        take_tokens: TokenSource | None = None,
        dead_owners: DeadOwners | None = None,
        on_report: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.spec = spec
        self.size = size
        self._engine = engine
        self._take_tokens = take_tokens
        self._dead_owners = dead_owners
        self._on_report = on_report
        self._slots: dict[str, _Slot] = {}  # instance id -> slot
        self._idle: deque[_Slot] = deque()
        self._leases: dict[str, _Slot] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # lease id -> why it is gone
        self._waiters: deque[asyncio.Future[_Slot]] = deque()
        self._creating = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._in_create: set[asyncio.Task[Any]] = set()  # tasks awaiting the engine's create
        self._releasing: set[asyncio.Task[Any]] = set()  # deletions under way
        self._deleted_on_close = 0  # instances whose creation ended after the close began
        self._wake: asyncio.Event | None = None
        self._changed = asyncio.Event()  # an instance became idle
        self._maintainer: asyncio.Task[None] | None = None
        self._closed = False
        self._shared: WarmPoolEngine | None = None  # the engine, when it keeps the warm pool
        self._warm = WarmCount()  # its free instances of ours, as last counted
        self._create_failures = 0
        self._last_owner_check = 0.0
        self._last_report = 0.0
        self.phases = {p: LatencyHistogram() for p in Phase}
        self.counters = dict.fromkeys(COUNTERS, 0)
        # for Prometheus (rollout.metrics.RayMetrics): plain counts here, published once a second
        self.tool_calls: dict[tuple[str, str], int] = {}  # (tool, outcome) -> calls
        self.tool_buckets: dict[str, list[int]] = {}  # tool -> calls per CALL_BUCKETS bucket
        self.acquires = {"warm": 0, "waited": 0, "none": 0}  # acquire's results

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, *, wait: float = 0.0) -> int:
        """Start keeping the pool warm; wait up to ``wait`` s for it to fill. Returns idle count."""
        if self._closed:
            raise ClosedError(f"pool actor `{self.spec.name}` is closed; create a new pool")
        if self._engine is None:
            self._engine = self.spec.make_engine()
        if isinstance(self._engine, WarmPoolEngine):
            self._shared = self._engine
        if self._maintainer is None:
            self._wake = asyncio.Event()
            self._maintainer = asyncio.get_running_loop().create_task(self._maintain())
        deadline = time.monotonic() + wait
        while self._ready_count() < self.size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=left)
        return self._idle_count()

    def _ready_count(self) -> int:
        if self._shared is not None:
            return self._warm.ready
        return sum(1 for s in self._slots.values() if not (s.forked or s.dead))

    def _idle_count(self) -> int:
        return self._warm.ready if self._shared is not None else len(self._idle)

    async def close(self) -> int:
        """Delete every instance, stop every task, close the engine. Idempotent.

        A creation under way is not cut off but waited for (up to :data:`_CLOSE_WAIT` s) and
        its instance deleted: an engine that goes on with a create its caller gave up (a hub
        does) would keep the instance, unowned, until its TTL. A deletion under way is waited
        for too, before the engine closes under it. Returns how many instances were deleted.
        """
        if self._closed:
            return 0
        self._closed = True
        creating = set(self._in_create)
        tasks = [t for t in (self._maintainer, *self._tasks) if t is not None]
        for task in tasks:
            if task not in creating:
                task.cancel()
        if creating:  # each deletes its instance when it sees the pool closed
            _, late = await asyncio.wait(
                creating, timeout=min(_CLOSE_WAIT, self.spec.startup_timeout)
            )
            for task in late:
                log.warning(
                    "an instance creation outlasted the pool's close; cut off",
                    extra={"pool": self.spec.name},
                )
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters.clear()
        slots = list(self._slots.values())
        for slot in slots:
            if slot.lease_id is not None:
                self._end_lease(slot, "the pool was closed")
        self._slots.clear()
        self._idle.clear()
        await asyncio.gather(*(s.env.release() for s in slots), return_exceptions=True)
        await asyncio.gather(*self._releasing, return_exceptions=True)
        if self._engine is not None:
            with contextlib.suppress(AEnvError):
                await self._engine.aclose()
        deleted = len(slots) + self._deleted_on_close
        log.info("pool actor closed", extra={"pool": self.spec.name, "deleted": deleted})
        return deleted

    def ping(self) -> int:
        """Liveness check for the driver; returns the idle count."""
        return self._idle_count()

    # -- leases ----------------------------------------------------------------------------------
    async def acquire(
        self, owner: Owner, wait: float = 0.0, attempt: int = 0, extra: int = 0
    ) -> Grant:
        """Lease an idle instance, waiting up to ``wait`` seconds for one to become free.

        ``attempt`` > 0 counts a retry (an episode run again after an infrastructure error).
        ``extra``: lease up to that many more at once, from at most half of the instances left
        idle (a prefetching driver hands them out without a round trip).
        """
        self._check_open()
        started = time.perf_counter()
        if self._shared is not None:
            return await self._claim(owner, wait, attempt, started)
        slot = self._pop_idle()
        self.acquires["warm" if slot is not None else "waited" if wait > 0 else "none"] += 1
        if slot is None and wait > 0:
            waiter: asyncio.Future[_Slot] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._kick()
            await asyncio.wait({waiter}, timeout=wait)
            if waiter.done() and not waiter.cancelled():
                slot = waiter.result()
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
        if slot is None:
            if wait > 0:  # counted as waited above: it waited for nothing
                self.acquires["waited"] -= 1
                self.acquires["none"] += 1
            return Grant(None, len(self._idle))
        lease = self._lease(slot, owner)
        if attempt:
            self.counters["retried"] += 1
        more: list[LeaseInfo] = []
        for _ in range(min(extra, len(self._idle) // 2)):
            spare = self._pop_idle()
            if spare is None:
                break
            more.append(self._lease(spare, owner))
        self.phases[Phase.ACQUIRE].observe(time.perf_counter() - started)
        return Grant(lease, len(self._idle), tuple(more))

    async def _claim(self, owner: Owner, wait: float, attempt: int, started: float) -> Grant:
        """:meth:`acquire` from the engine's shared warm pool."""
        assert self._shared is not None
        assert self._engine is not None
        deadline = time.monotonic() + wait
        spec = self.spec.instance_spec()
        while True:
            self._kick()  # a claim takes a warm instance: refill now
            info = await self._shared.claim(
                spec, pool=self.spec.name, timeout=max(0.0, deadline - time.monotonic())
            )
            if info is None:
                self.acquires["none"] += 1
                return Grant(None, self._idle_count())
            self._warm = WarmCount(max(0, self._warm.ready - 1), self._warm.starting)
            env = self.spec.adopt(self._engine, info)
            try:
                await env.initialize()
            except AEnvError as exc:  # it died between its last Ready and our claim
                log.warning(
                    "claimed instance did not answer; claiming another",
                    extra={"pool": self.spec.name, "instance": info.id, "error": str(exc)},
                )
                self.counters["broken"] += 1
                with contextlib.suppress(AEnvError):
                    await env.release()
                if time.monotonic() >= deadline:
                    return Grant(None, self._idle_count())
                continue
            slot = _Slot(env, info.id, self.spec.ttl)
            self._slots[slot.instance_id] = slot
            lease = self._lease(slot, owner)
            self.acquires["warm"] += 1  # claimed from the engine's shared warm pool
            if attempt:
                self.counters["retried"] += 1
            self.phases[Phase.ACQUIRE].observe(time.perf_counter() - started)
            return Grant(lease, self._idle_count())

    async def count_retry(self) -> None:
        """Count a retry (``counters["retried"]``) that a prefetching driver served from a
        lease this actor granted earlier: its :meth:`acquire` did not know the attempt."""
        self.counters["retried"] += 1

    def _lease(self, slot: _Slot, owner: Owner) -> LeaseInfo:
        lease_id = uuid.uuid4().hex[:16]
        slot.lease_id, slot.owner = lease_id, owner
        slot.last_used = time.monotonic()
        self._leases[lease_id] = slot
        self.counters["acquired"] += 1
        return LeaseInfo(
            lease_id=lease_id,
            instance_id=slot.instance_id,
            env_name=slot.env.env_name,
            url=slot.env.url,
            pool=self.spec.name,
        )

    async def release(self, lease_id: str) -> bool:
        """End a lease and delete its instance (idempotent). True if the lease was held."""
        slot = self._leases.get(lease_id)
        if slot is None:
            return False
        self._end_lease(slot, "it was released")
        self.counters["released"] += 1
        await self._discard(slot)
        return True

    async def renew(self, lease_id: str) -> None:
        """Keep an idle lease from being reclaimed (every call does this too)."""
        self._slot(lease_id)

    def _end_lease(self, slot: _Slot, why: str) -> None:
        if slot.lease_id is not None:
            self._leases.pop(slot.lease_id, None)
            self._ended[slot.lease_id] = why
            while len(self._ended) > _FORGET_AFTER:
                self._ended.popitem(last=False)
        slot.lease_id = None

    def _slot(self, lease_id: str) -> _Slot:
        slot = self._leases.get(lease_id)
        if slot is None:
            why = self._ended.get(lease_id)
            if why == "it was released":
                raise InstanceClosedError(
                    f"lease {lease_id} of pool `{self.spec.name}` was released; acquire a new one"
                )
            raise LeaseLostError(
                f"lease {lease_id} is not held by pool `{self.spec.name}`: "
                f"{why or 'this pool actor never granted it (it was restarted?)'}; acquire a "
                "new lease"
            )
        slot.last_used = time.monotonic()
        return slot

    # -- calls -----------------------------------------------------------------------------------
    async def call_tool(
        self,
        lease_id: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``Environment.call_tool`` on the leased instance."""
        slot = self._slot(lease_id)
        return await self._timed(
            slot, Phase.TOOL_CALL, slot.env.call_tool(name, arguments, timeout), tool=name
        )

    async def call_function(
        self,
        lease_id: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``Environment.call_function`` on the leased instance."""
        slot = self._slot(lease_id)
        return await self._timed(slot, None, slot.env.call_function(name, arguments, timeout))

    async def call_reward(
        self, lease_id: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """``Environment.call_reward`` on the leased instance."""
        slot = self._slot(lease_id)
        return await self._timed(slot, Phase.REWARD, slot.env.call_reward(arguments, timeout))

    async def list_tools(self, lease_id: str) -> list[dict[str, Any]]:
        """``Environment.list_tools`` of the leased instance."""
        slot = self._slot(lease_id)
        tools: list[dict[str, Any]] = await self._timed(slot, None, slot.env.list_tools())
        return tools

    async def _timed(
        self, slot: _Slot, phase: Phase | None, call: Awaitable[Any], tool: str | None = None
    ) -> Any:
        started = time.perf_counter()
        outcome = "ok"
        try:
            result = await call
            if tool is not None and getattr(result, "is_error", False):
                kind = getattr(result, "error_kind", None)
                outcome = kind.value if kind is not None else "error"
            return result
        except (InstanceBrokenError, InstanceExpiredError) as exc:
            outcome = type(exc).__name__
            self._mark_dead(slot, expired=isinstance(exc, InstanceExpiredError))
            raise
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            elapsed = time.perf_counter() - started
            if tool is not None:
                self._count_tool(tool, outcome, elapsed)
            if phase is not None:
                self.phases[phase].observe(elapsed)
            if slot.first_call:
                slot.first_call = False
                self.phases[Phase.FIRST_CALL].observe(elapsed)
            slot.last_used = time.monotonic()

    async def step_many(
        self, steps: Sequence[tuple[int, str, str, dict[str, Any] | None, float | None]]
    ) -> AsyncIterator[list[StepResult]]:
        """Run many tool calls at once; yield their :class:`StepResult`\\ s as they finish.

        ``steps`` holds ``(index, lease_id, tool, arguments, timeout)``; everything finished
        since the last yield goes out together, so a busy batch needs few messages and a slow
        call never holds back the others.
        """
        finished: list[StepResult] = []
        arrived = asyncio.Event()

        def collect(task: asyncio.Task[StepResult]) -> None:
            if not task.cancelled():
                finished.append(task.result())
                arrived.set()

        tasks = []
        for step in steps:
            task = asyncio.ensure_future(self._step(*step))
            task.add_done_callback(collect)
            tasks.append(task)
        sent = 0
        try:
            while sent < len(tasks):
                await arrived.wait()
                arrived.clear()
                await asyncio.sleep(0)  # let calls finishing in this same moment join the message
                chunk, finished[:] = list(finished), []
                sent += len(chunk)
                yield chunk
        finally:
            for task in tasks:
                task.cancel()

    async def _step(
        self,
        index: int,
        lease_id: str,
        tool: str,
        arguments: dict[str, Any] | None,
        timeout: float | None,
    ) -> StepResult:
        started = time.perf_counter()
        try:
            result = await self.call_tool(lease_id, tool, arguments, timeout)
        except Exception as exc:  # failure is data here: the batch goes on
            return StepResult(index, lease_id, tool, None, exc, time.perf_counter() - started)
        return StepResult(index, lease_id, tool, result, None, time.perf_counter() - started)

    async def fork(
        self, lease_id: str, n: int, owner: Owner, timeout: float | None = None
    ) -> list[LeaseInfo]:
        """``n`` new leases on copies of the leased instance (they do not count toward size)."""
        slot = self._slot(lease_id)
        children = await slot.env.fork(n, timeout=timeout)
        leases = []
        for env in children:
            assert env.instance_id is not None
            child = _Slot(env, env.instance_id, slot.ttl, forked=True)
            self._slots[child.instance_id] = child
            leases.append(self._lease(child, owner))
        return leases

    def _count_tool(self, tool: str, outcome: str, seconds: float) -> None:
        """One tool call into the Prometheus counts: a name the instance does not know is
        ``<unknown>`` (an agent's made-up names must not grow the series without bound)."""
        if outcome == "not_found":
            tool = "<unknown>"
        key = (tool, outcome)
        self.tool_calls[key] = self.tool_calls.get(key, 0) + 1
        buckets = self.tool_buckets.get(tool)
        if buckets is None:
            buckets = self.tool_buckets[tool] = [0] * (len(CALL_BUCKETS) + 1)
        buckets[bisect.bisect_left(CALL_BUCKETS, seconds)] += 1

    # -- stats -----------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Gauges, counters and latency histograms of this actor, as plain data."""
        return {
            "pool": self.spec.name,
            "idle": self._idle_count(),
            "leased": len(self._leases),
            "creating": self._creating,
            "counters": dict(self.counters),
            "phases": {p.value: h.to_dict() for p, h in self.phases.items()},
            "size": self.size,
            "tool_calls": [[tool, outcome, n] for (tool, outcome), n in self.tool_calls.items()],
            "tool_buckets": {tool: list(b) for tool, b in self.tool_buckets.items()},
            "acquires": dict(self.acquires),
        }

    # -- warm keeping ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"pool actor `{self.spec.name}` is closed; create a new pool")

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _pop_idle(self) -> _Slot | None:
        while self._idle:
            slot = self._idle.popleft()
            if not slot.dead and slot.instance_id in self._slots:
                return slot
        return None

    def _offer(self, slot: _Slot) -> None:
        self._changed.set()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._idle.append(slot)

    def _warm_count(self) -> int:
        return self._creating + self._ready_count()

    async def _maintain(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool maintenance failed", extra={"pool": self.spec.name})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=_TICK)
            self._wake.clear()

    async def _tick(self) -> None:
        await self._sweep()
        await self._reclaim()
        await self._refill()
        now = time.monotonic()
        if self._on_report is not None and now - self._last_report >= 1.0:
            self._last_report = now
            self._on_report(self.report())

    async def _sweep(self) -> None:
        """Find instances that ended on their own; renew idle ones close to their TTL."""
        assert self._engine is not None
        if not self._slots:
            return
        infos = {i.id: i for i in await self._engine.list(env_ref=None)}
        now = time.time()
        for slot in list(self._slots.values()):
            info = infos.get(slot.instance_id)
            if info is None or info.state is InstanceState.TERMINATED:
                expired = info is not None and info.reason is TerminationReason.EXPIRED
                self._mark_dead(slot, expired=expired)
                if slot.lease_id is None:  # idle: drop it; a leased one fails its next call
                    await self._discard(slot)
                continue
            if slot.ttl is None and info.expires_at:
                slot.ttl = max(1.0, info.expires_at - info.created_at)
            if slot.ttl and info.expires_at and info.expires_at - now < max(5.0, slot.ttl / 10):
                with contextlib.suppress(AEnvError):
                    await self._engine.renew(slot.instance_id, slot.ttl)

    def _mark_dead(self, slot: _Slot, *, expired: bool) -> None:
        if not slot.dead:
            slot.dead = True
            self.counters["expired" if expired else "broken"] += 1
            self._kick()

    async def _reclaim(self) -> None:
        """Take back leases idle past ``lease_timeout`` and leases whose owner is gone."""
        now = time.monotonic()
        gone: dict[Owner, str] = {}
        if (
            self._dead_owners is not None
            and self._leases
            and now - self._last_owner_check > _OWNER_CHECK
        ):
            self._last_owner_check = now
            owners = list({s.owner for s in self._leases.values() if s.owner is not None})
            with contextlib.suppress(Exception):
                gone = await self._dead_owners(owners)
        for slot in list(self._leases.values()):
            idle = now - slot.last_used
            if slot.owner is not None and slot.owner in gone:
                why = gone[slot.owner]
            elif idle > self.spec.lease_timeout:
                why = f"it was idle {idle:.0f} s (lease_timeout={self.spec.lease_timeout:g} s)"
            else:
                continue
            log.warning(
                "lease reclaimed",
                extra={"pool": self.spec.name, "lease": slot.lease_id, "why": why},
            )
            self._end_lease(slot, f"the pool reclaimed it: {why}")
            self.counters["reclaimed"] += 1
            await self._discard(slot)

    async def _discard(self, slot: _Slot) -> None:
        self._slots.pop(slot.instance_id, None)
        slot.dead = True
        self._kick()
        await self._release(slot.env)

    async def _release(self, env: Environment) -> None:
        """Delete ``env``'s instance; a caller cancelled meanwhile (the maintenance task, at
        close) does not cut the deletion off: :meth:`close` waits for it."""
        task = asyncio.get_running_loop().create_task(env.release())
        self._releasing.add(task)
        task.add_done_callback(self._released)
        with contextlib.suppress(AEnvError):
            await asyncio.shield(task)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its awaiter may have been cancelled meanwhile

    async def _refill(self) -> None:
        if self._shared is not None:
            await self._refill_shared()
            return
        deficit = self.size - self._warm_count()
        if deficit <= 0 or self._closed:
            return
        granted, wait = (deficit, 0.0)
        if self._take_tokens is not None:
            granted, wait = await self._take_tokens(deficit)
        for _ in range(granted):
            self._creating += 1
            task = asyncio.get_running_loop().create_task(self._create_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if granted < deficit and wait > 0:
            await asyncio.sleep(min(wait, _TICK))

    async def _refill_shared(self) -> None:
        """Keep ``size`` free instances of ours in the engine's shared pool."""
        assert self._shared is not None
        spec = self.spec.instance_spec()
        before = self._warm.ready
        self._warm = await self._shared.warm_count(spec, pool=self.spec.name)
        if self._warm.ready > before:
            self._changed.set()
        deficit = self.size - self._warm.total - self._creating
        if deficit <= 0 or self._closed:
            return
        granted, wait = (deficit, 0.0)
        if self._take_tokens is not None:
            granted, wait = await self._take_tokens(deficit)
        if granted > 0:
            self._creating += granted
            task = asyncio.get_running_loop().create_task(self._prewarm(spec, granted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if granted < deficit and wait > 0:
            await asyncio.sleep(min(wait, _TICK))

    async def _back_off(self, what: str, exc: AEnvError) -> None:
        """A creation failed: log it and wait longer the more failed in a row (its slot stays
        counted as creating meanwhile, so the next round does not retry at once)."""
        self._create_failures += 1
        log.warning(
            what,
            extra={"pool": self.spec.name, "error": str(exc), "failures": self._create_failures},
        )
        await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self._create_failures, 6)))

    async def _prewarm(self, spec: InstanceSpec, count: int) -> None:
        assert self._shared is not None
        try:
            started = await self._shared.prewarm(spec, pool=self.spec.name, count=count)
        except AEnvError as exc:
            await self._back_off("warm instances could not be started", exc)
            return
        finally:
            self._creating -= count
        self._create_failures = 0
        self.counters["created"] += started
        self._warm = WarmCount(self._warm.ready, self._warm.starting + started)

    async def _create_one(self) -> None:
        started = time.perf_counter()
        task = asyncio.current_task()
        assert task is not None
        self._in_create.add(task)  # close waits for it rather than cut it off
        try:
            env = self.spec.environment(self._engine)
            try:
                await env.initialize()
            except BaseException:
                with contextlib.suppress(Exception):
                    await env.release()
                raise
        except AEnvError as exc:
            self._in_create.discard(task)
            if not self._closed:
                await self._back_off("instance creation failed", exc)
            return
        finally:
            self._in_create.discard(task)
            self._creating -= 1
        self._create_failures = 0
        assert env.instance_id is not None
        if self._closed:  # made as the pool closed: nobody will lease it
            with contextlib.suppress(AEnvError):
                await env.release()
            self._deleted_on_close += 1
            return
        self.phases[Phase.CREATE].observe(time.perf_counter() - started)
        self.counters["created"] += 1
        slot = _Slot(env, env.instance_id, self.spec.ttl)
        self._slots[slot.instance_id] = slot
        self._offer(slot)
