"""The control plane: instances and services of registry definitions, over an injected engine.

Every instance and service belongs to a tenant (the caller's API key); another tenant's ids are
unknown to you (:class:`~aenv_ray.errors.InstanceNotFoundError` /
:class:`~aenv_ray.errors.ServiceNotFoundError`, HTTP 404). Records live in the store, so a
restarted hub knows every instance it created: :meth:`ControlPlane.sync` asks the engine about
each on start (and every ``sync_interval``), and :meth:`ControlPlane.reap` terminates those past
their TTL. The engine enforces the TTL as well, so an instance expires even while the hub is
down.

A definition is resolved by :func:`envhub.resolve.resolve`: the hub's built-ins by name, the
caller's own tenant's versions by name, another tenant's only as ``tenant/name@version``.

What a tenant may use is the operator's (:mod:`envhub.limits`): every create, fork, renew and
service change is checked against the tenant's quotas (live instances, services, replicas) and
caps (what one instance's ``deployConfig`` and one request may ask; the network), and refused
with :class:`~aenv_ray.errors.QuotaExceededError` (or ``PermissionDeniedError`` for the
network) before the engine starts anything. Instances started by an API key that is revoked
later are terminated by the hub's upkeep: the key's holder knows their tokens.

A **service** keeps ``replicas`` instances of a definition running, with no TTL (the hub renews
them), and optional persistent storage: a directory ``data_dir/storage/<service id>`` the engine
mounts read-write at ``/storage`` in every replica. Dead replicas are replaced; changing the
version or variables replaces replicas new-first, so the service keeps serving. When the engine
keeps services itself (:func:`aenv_ray.engine.service_engine`: the Kubernetes engine's
Deployments, Services and PersistentVolumeClaims), the hub records the service and hands it to
the engine instead: the cluster replaces replicas and rolls updates, the storage is a volume
that a delete keeps unless asked, and the service has a stable address of its own (``url``).

**Warm pools.** With ``warm`` (``aenv serve --warm REF=N``) and an engine that keeps warm
pools (:class:`~aenv_ray.engine.WarmPoolEngine`: Kubernetes), the hub keeps ``N`` free instances
of each named definition started in the engine's pool :data:`WARM_POOL`, and a create that asks
nothing a free instance lacks (no variables, arguments, datasource or storage) claims one instead
of starting one. Hubs sharing a namespace share the pool, and a claim is atomic across them; the
engine refills it under a lock of the namespace's (:meth:`~aenv_ray.engine.WarmPoolEngine.fill`),
counting every hub's free instances, so hubs asking ``N`` keep ``N`` free, not one ``N`` each.

**No instance outlives its record.** Before the engine starts anything, the hub writes an
*intent* (``intents/<id>``: which hub, which tenant, until when) and labels the instance with it
(``aenv.intent``) and with the store's id (``aenv.store``); the record replaces the intent once
the instance runs. A hub that dies between the engine's create and the record leaves an
instance with a label and no record: :meth:`ControlPlane.reclaim` (on start and in the upkeep)
lists the engine's instances and ends every one of this store's that has no live record and no
live intent. An intent is live while its hub is: each hub renews a heartbeat in the store
(``hubs/<id>``), and a hub keeps its id across restarts in its data directory (held with a lock,
so two hubs on one directory never share one), so a restarted hub knows at once that its
predecessor's intents died with it; another hub's wait until its heartbeat lapses
(:data:`HUB_LEASE`). Hubs on other stores never touch these instances (the ``aenv.store`` label).

May import: the standard library, ``aenv_ray``, ``envhub`` (store, registry, resolve, limits,
keys, metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from aenv_ray.config import DeployConfig
from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    SandboxEngine,
    ServiceEngine,
    ServiceInfo,
    ServiceSpec,
    TerminationReason,
    WarmPoolEngine,
    info_to_json,
    service_engine,
)
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    ConfigurationError,
    EnvironmentNotFoundError,
    InstanceNotFoundError,
    ServiceNotFoundError,
)
from aenv_ray.protocol import IDEMPOTENCY_HEADER
from envhub import keys
from envhub.keys import Caller
from envhub.limits import (
    Limits,
    TenantLimits,
    check_deploy,
    check_per_request,
    check_ttl,
    instance_ttl,
    over,
)
from envhub.metrics import HubMetrics
from envhub.registry import VersionRegistry
from envhub.resolve import Definition, resolve
from envhub.store import Document, Store

__all__ = ["LOAD_CHECKS", "ControlPlane", "check_idempotency_key", "load_check_key"]

log = logging.getLogger("envhub.control")

INSTANCES = "instances"
SERVICES = "services"
SERVICE_TTL = 24 * 3600.0  # a replica's engine TTL; the hub renews it at half-life
MAX_REPLICAS = 64
WARM_POOL = "envhub"
"""The engine pool a hub keeps its warm instances in (shared by the hubs of one namespace)."""
INTENTS = "intents"
HUBS = "hubs"
META = "meta"
LOAD_CHECKS = "load-checks"
"""The store's kind of bundles that passed the load check, by :func:`load_check_key`: each
record is ``{"digest", "checker", "manifest", "at"}`` (``checker``: the fingerprint of
:func:`aenv_ray.loadcheck.checker_fingerprint`). Only the hub writes it, never a tenant."""
LABEL_INTENT = "aenv.intent"
"""The label naming the intent a hub wrote before the engine started the instance."""
LABEL_STORE = "aenv.store"
"""The label naming the store whose hubs own the instance (only they reclaim it)."""
HUB_LABELS = frozenset({"aenv.tenant", LABEL_INTENT, LABEL_STORE})
HUB_LEASE = 30.0
"""Seconds a hub's heartbeat holds: another hub's intents die this long after it did."""
INTENT_MARGIN = 60.0
"""Seconds an intent outlives its create's ``startup_timeout`` (however alive its hub)."""
CLAIMS = "idempotency"
"""The store's kind of idempotency keys taken (:meth:`ControlPlane.create_instance`): a chain
``<digest of tenant and key>~<n>`` of claims, each ``{"hub", "tenant", "created_at",
"deadline"}`` plus ``"instance"`` once its create recorded one, or ``"failed"``."""
CLAIM_POLL = (0.05, 1.0)
"""Seconds between a waiting retry's reads of another hub's claim: first, most (doubling)."""


def _claim_name(tenant: str, key: str, n: int) -> str:
    """The :data:`CLAIMS` key of link ``n`` of the chain of ``tenant``'s idempotency ``key``.

    >>> _claim_name("alice", "run-0001", 0)[-2:], len(_claim_name("alice", "run-0001", 3))
    ('~0', 34)
    """
    digest = hashlib.sha256(json.dumps([tenant, key]).encode()).hexdigest()[:32]
    return f"{digest}~{n}"


def load_check_key(digest: str, checker: str) -> str:
    """The :data:`LOAD_CHECKS` key of the bundle ``digest`` checked by ``checker`` (a
    fingerprint): both, so that a bundle passes once per checker, never for another one.

        >>> load_check_key("sha256:ab", "cd")
        'sha256:ab|cd'
    """
    return f"{digest}|{checker}"


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def check_idempotency_key(key: str) -> None:
    """Refuse an idempotency key that is not 8 to 128 letters, digits, ``-_.:``.

    >>> check_idempotency_key("3f2a9c1e5b7d4a60")
    >>> check_idempotency_key("short")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    aenv_ray.errors.ConfigurationError: Idempotency-Key `short`: send 8 to 128 letters, ...
    """
    if not (8 <= len(key) <= 128 and set(key) <= _KEY_CHARS):
        raise ConfigurationError(
            f"{IDEMPOTENCY_HEADER} `{key[:40]}`: send 8 to 128 letters, digits, -, _, . or : "
            "(a random one per create, the same for its retries)"
        )


@dataclass
class ControlPlane:
    """Instances and services over ``engine``, recorded in ``store``."""

    store: Store
    engine: SandboxEngine
    registry: VersionRegistry
    data_dir: Path
    reap_interval: float = 1.0
    sync_interval: float = 5.0
    retention: float = 24 * 3600.0  # how long a terminated instance's record is kept
    startup_timeout: float = 120.0
    limits: Limits = field(default_factory=Limits)
    warm: Mapping[str, int] = field(default_factory=dict)  # ref -> free instances kept started
    metrics: HubMetrics = field(default_factory=HubMetrics)  # the hub's (envhub.metrics)
    warm_pool: str = WARM_POOL
    _warm_specs: dict[str, tuple[InstanceSpec, int]] = field(default_factory=dict, repr=False)
    _service_locks: dict[str, asyncio.Lock] = field(default_factory=dict, repr=False)
    _tenant_locks: dict[str, asyncio.Lock] = field(default_factory=dict, repr=False)
    _starting: dict[str, int] = field(default_factory=dict, repr=False)  # tenant -> creates
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _calls: dict[str, dict[str, Any] | None] = field(default_factory=dict, repr=False)
    hub_id: str = field(default="", init=False)
    store_id: str = field(default="", init=False)
    _intents: set[str] = field(default_factory=set, repr=False)  # this hub's, in flight
    _claims: set[str] = field(default_factory=set, repr=False)  # this hub's CLAIMS, in flight
    # (tenant, idempotency key) -> the create in flight with it, which a retry awaits
    _creating: dict[tuple[str, str], asyncio.Task[Document]] = field(
        default_factory=dict, repr=False
    )
    _id_lock: IO[str] | None = field(default=None, repr=False)
    _started_at: float = field(default_factory=time.time, repr=False)
    _beat_at: float = field(default=0.0, repr=False)  # monotonic time of the last heartbeat

    # -- definitions and limits ----------------------------------------------------------------
    async def resolve(self, caller: Caller, ref: str) -> Definition:
        """The definition ``ref`` names for ``caller`` (:func:`envhub.resolve.resolve`)."""
        return await resolve(self.registry, self.data_dir, caller.tenant, ref)

    async def describe(self, caller: Caller, ref: str) -> dict[str, Any]:
        """What ``ref`` means for ``caller``: the ref it resolves to, its publisher (``None``:
        built into the hub), warnings (deprecated), and ``calls``: what its reward, functions
        and tools take (``None`` when the engine cannot load definitions), so a client can check its
        tasks before it starts instances. The hub's own definitions are loaded in a sandbox
        for it once; a published version's were recorded when it was published."""
        found = await self.resolve(caller, ref)
        calls = found.calls
        if calls is None and found.publisher is None:
            key = str(found.project)
            if key not in self._calls:
                from aenv_ray.loadcheck import described_calls, load_in_sandbox

                manifest = await load_in_sandbox(
                    self.engine, found.project, timeout=self.startup_timeout
                )
                self._calls[key] = described_calls(manifest)
            calls = self._calls[key]
        return {
            "ref": found.ref,
            "publisher": found.publisher,
            "warnings": list(found.warnings),
            "calls": calls,
        }

    def _tenant_lock(self, tenant: str) -> asyncio.Lock:
        return self._tenant_locks.setdefault(tenant, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def _admit(self, tenant: str, count: int, limits: TenantLimits) -> AsyncIterator[None]:
        """Hold ``count`` of ``tenant``'s ``instances`` quota while the body starts them; refuse
        when its live instances and those being started would pass it."""
        if count == 0:
            yield
            return
        async with self._tenant_lock(tenant):
            live = sum(
                1
                for d in (await self.store.list(INSTANCES)).values()
                if d.get("tenant") == tenant
                and d.get("service") is None
                and d["state"] != InstanceState.TERMINATED.value
            )
            starting = self._starting.get(tenant, 0)
            if live + starting + count > limits.instances:
                raise over(
                    tenant,
                    "instances",
                    live + starting + count,
                    limits.instances,
                    f"{count} more would bring your live instances to",
                    "release instances you no longer use (`aenv instance delete ID`), or ask "
                    "the hub's operator",
                )
            self._starting[tenant] = starting + count
        try:
            yield
        finally:
            self._starting[tenant] -= count

    async def check_loads(self, data: bytes, digest: str) -> dict[str, Any] | None:
        """Load an uploaded bundle in a sandbox of the engine's; its manifest (None when the
        engine cannot inspect). A bundle that does not load raises DefinitionError and leaves
        nothing behind; one that does stays unpacked where instances will need it.

        A bundle whose ``digest`` (which the caller computed from ``data``) already passed the
        check with the same checker (:func:`aenv_ray.loadcheck.checker_fingerprint`: the
        code, Python, installed packages, engine kind and isolation, timeout) is not loaded
        again: its manifest is the one recorded in the store's :data:`LOAD_CHECKS` then, so
        every hub of the store checks a bundle once. A failed check is never recorded.
        """
        from aenv_ray.bundle import extract_bundle
        from aenv_ray.loadcheck import checker_fingerprint, load_in_sandbox

        if getattr(self.engine, "inspect", None) is None:
            return None
        dest = self.data_dir / "bundles" / digest.replace(":", "-")
        fresh = not (dest / ".aenv-digest").is_file()
        dest.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(extract_bundle, data, dest)
        checker = await asyncio.to_thread(checker_fingerprint, self.engine, self.startup_timeout)
        key = load_check_key(digest, checker)
        passed = await self.store.get(LOAD_CHECKS, key)
        if passed is not None and isinstance(passed.get("manifest"), dict):
            log.info("load check passed before; not repeated", extra={"digest": digest})
            manifest: dict[str, Any] = passed["manifest"]
            return manifest
        try:  # its errors name the bundle's files (src/x.py:3), never where the hub keeps them
            loaded = await load_in_sandbox(self.engine, dest, timeout=self.startup_timeout)
        except BaseException:
            if fresh:
                await asyncio.to_thread(shutil.rmtree, dest, True)
            raise
        if loaded is not None:
            record = {"digest": digest, "checker": checker, "manifest": loaded, "at": time.time()}
            await self.store.put(LOAD_CHECKS, key, record)
        return loaded

    # -- instances -----------------------------------------------------------------------------
    async def create_instance(
        self,
        caller: Caller,
        env: str,
        *,
        ttl: float | None = None,
        environment_variables: Mapping[str, str] | None = None,
        arguments: list[str] | None = None,
        datasource: str | None = None,
        owner: str | None = None,
        labels: Mapping[str, str] | None = None,
        service: str | None = None,
        storage: str | None = None,
        idempotency_key: str | None = None,
    ) -> Document:
        """Start an instance of ``env`` for ``caller``; return its record once it answers.

        The definition must fit the tenant's caps, and (unless it is a service's replica, whose
        lifetime the hub manages) its TTL too, and a new instance its ``instances`` quota.

        ``idempotency_key`` (the ``Idempotency-Key`` header; :func:`check_idempotency_key`):
        a create of the same tenant with a key seen before starts nothing and answers the
        instance that one started: the create still in flight on this hub (it runs to its end
        even when the request that began it is gone), or on another hub of the store, or the
        record in the store (kept with the key). So a client whose reply was lost retries,
        on any hub, without leaking or duplicating an instance. A create that failed left no
        record: its retry creates.

        Across hubs the key is claimed in the store (:data:`CLAIMS`, an atomic
        :meth:`~envhub.store.Store.create`): the hub that claims it creates; a retry on
        another hub finds the claim and waits for it (reading it again, :data:`CLAIM_POLL`)
        until it names the instance (answered) or failed (the retry creates). A claim whose
        hub died (its heartbeat lapsed, :data:`HUB_LEASE`; or past its deadline) is taken over
        by the next link of the key's chain (``~n+1``), as :meth:`reclaim` ends that hub's
        half-made instance: one instance stands for the key.
        """
        if idempotency_key is None:
            return await self._create_instance(
                caller,
                env,
                ttl=ttl,
                environment_variables=environment_variables,
                arguments=arguments,
                datasource=datasource,
                owner=owner,
                labels=labels,
                service=service,
                storage=storage,
            )
        check_idempotency_key(idempotency_key)
        slot = (caller.tenant, idempotency_key)
        running = self._creating.get(slot)
        if running is None:
            earlier = await self._created_with(caller.tenant, idempotency_key)
            if earlier is not None:
                log.info(
                    "create retried: the instance its key started",
                    extra={"instance": earlier["id"], "tenant": caller.tenant},
                )
                return earlier
            running = self._creating.get(slot)  # one may have begun while the store answered
        if running is None:

            def create() -> Awaitable[Document]:
                return self._create_instance(
                    caller,
                    env,
                    ttl=ttl,
                    environment_variables=environment_variables,
                    arguments=arguments,
                    datasource=datasource,
                    owner=owner,
                    labels=labels,
                    service=service,
                    storage=storage,
                    idempotency_key=idempotency_key,
                )

            running = asyncio.create_task(self._create_once(caller.tenant, idempotency_key, create))
            self._creating[slot] = running

            def done(task: asyncio.Task[Document]) -> None:
                self._creating.pop(slot, None)
                if not task.cancelled():
                    task.exception()  # its requests raised it; none may be left to

            running.add_done_callback(done)
        # shielded: a request that goes away (its client's connection dropped) leaves the
        # create to finish and be found by the retry
        return dict(await asyncio.shield(running))

    async def _create_once(
        self, tenant: str, key: str, create: Callable[[], Awaitable[Document]]
    ) -> Document:
        """Run ``create`` if this hub claims ``tenant``'s ``key`` in the store; else answer
        the instance of the hub that did (waiting for it), taking over from a dead one (see
        :meth:`create_instance`)."""
        await self._identify()
        n, pause, waited = 0, CLAIM_POLL[0], False
        while True:
            name = _claim_name(tenant, key, n)
            claim = await self.store.get(CLAIMS, name)
            if claim is None:
                now = time.time()
                mine: Document = {
                    "hub": self.hub_id,
                    "tenant": tenant,
                    "created_at": now,
                    "deadline": now + self.startup_timeout + INTENT_MARGIN,
                }
                self._claims.add(name)
                try:
                    if await self.store.create(CLAIMS, name, mine):
                        return await self._create_claimed(name, mine, create)
                finally:
                    self._claims.discard(name)
                continue  # another hub claimed it first: read its claim
            made = claim.get("instance")
            if made:
                record = await self.store.get(INSTANCES, str(made))
                if record is not None:
                    log.info(
                        "create retried: the instance its key started",
                        extra={"instance": made, "tenant": tenant},
                    )
                    return record
                n += 1  # its record is long gone: the key is free again
                continue
            if claim.get("failed") or not await self._claim_live(name, claim):
                earlier = await self._created_with(tenant, key)  # recorded, then its hub died
                if earlier is not None:
                    return earlier
                n += 1
                continue
            if not waited:
                waited = True
                log.info(
                    "create retried: another hub of the store has it under way",
                    extra={"hub": claim.get("hub"), "tenant": tenant},
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, CLAIM_POLL[1])

    async def _create_claimed(
        self, name: str, claim: Document, create: Callable[[], Awaitable[Document]]
    ) -> Document:
        """Run ``create`` under claim ``name``; the claim then names its instance, or says it
        failed (so a retry creates)."""
        try:
            doc = await create()
        except BaseException:
            with contextlib.suppress(AEnvError):
                await asyncio.shield(self.store.put(CLAIMS, name, {**claim, "failed": True}))
            raise
        await self.store.put(CLAIMS, name, {**claim, "instance": doc["id"]})
        return doc

    async def _claim_live(self, name: str, claim: Document) -> bool:
        """Whether the hub of an unfinished ``claim`` may still finish it."""
        if claim.get("hub") == self.hub_id:
            return name in self._claims
        hub = await self.store.get(HUBS, str(claim.get("hub")))
        return self._alive(claim, {str(claim.get("hub")): hub} if hub is not None else {})

    async def _created_with(self, tenant: str, key: str) -> Document | None:
        """``tenant``'s instance record started with idempotency key ``key``, if any."""
        for doc in (await self.store.list(INSTANCES)).values():
            if doc.get("tenant") == tenant and doc.get("idempotency_key") == key:
                return doc
        return None

    async def _create_instance(self, caller: Caller, env: str, **options: Any) -> Document:
        """:meth:`_start_instance`, counted in the hub's metrics (creates, failures by kind,
        the time of each successful one by source)."""
        metrics = self.metrics
        metrics.creates.inc()
        started = time.perf_counter()
        try:
            doc, source = await self._start_instance(caller, env, **options)
        except Exception as exc:
            metrics.create_failures.labels(type(exc).__name__).inc()
            raise
        metrics.create_seconds.labels(source).observe(time.perf_counter() - started)
        return doc

    async def _start_instance(
        self,
        caller: Caller,
        env: str,
        *,
        ttl: float | None = None,
        environment_variables: Mapping[str, str] | None = None,
        arguments: list[str] | None = None,
        datasource: str | None = None,
        owner: str | None = None,
        labels: Mapping[str, str] | None = None,
        service: str | None = None,
        storage: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[Document, str]:
        """Start an instance; its record and where it came from (``warm``: claimed from the
        warm pool; ``engine``: started)."""
        limits = self.limits.for_tenant(caller.tenant)
        found = await self.resolve(caller, env)
        deploy = found.config.deploy_config
        check_deploy(limits, caller.tenant, found.ref, deploy)
        warnings = list(found.warnings)
        if service is None:
            ttl, clamped = instance_ttl(limits, caller.tenant, found.ref, ttl, deploy)
            warnings += clamped
        spec = InstanceSpec(
            env_ref=found.ref,
            project=str(found.project),
            ttl=ttl,
            environment_variables=dict(environment_variables or {}),
            arguments=tuple(arguments or ()),
            datasource=datasource,
            owner=owner,
            labels={
                **{k: v for k, v in (labels or {}).items() if k not in HUB_LABELS},
                "aenv.tenant": caller.tenant,
            },
            storage=storage,
        )
        async with (
            self._admit(caller.tenant, 0 if service else 1, limits),
            self._intent(caller.tenant) as marks,
        ):
            spec = replace(spec, labels={**spec.labels, **marks})
            info, source = None, "warm"
            if service is None and self._claimable(spec):
                assert isinstance(self.engine, WarmPoolEngine)
                info = await self.engine.claim(spec, pool=WARM_POOL)
                self.metrics.warm_claims.labels("empty" if info is None else "claimed").inc()
            if info is None:
                source = "engine"
                info = await self.engine.create(spec, timeout=self.startup_timeout)
            doc = self._record(info, caller.tenant, service=service)
            doc.update(
                warnings=warnings,
                source=found.ref,
                publisher=found.publisher,
                key_id=caller.key_id,
                deploy=_deploy_snapshot(deploy),
            )
            if idempotency_key is not None:
                doc["idempotency_key"] = idempotency_key
            await self.store.put(INSTANCES, info.id, doc)  # before the intent goes
        log.info(
            "instance created",
            extra={"instance": info.id, "env": found.ref, "tenant": caller.tenant},
        )
        return doc, source

    def warm_specs(self) -> dict[str, tuple[InstanceSpec, int]]:
        """The warm pools this hub keeps: ref -> (the spec of its free instances, how many)."""
        return dict(self._warm_specs)

    def _claimable(self, spec: InstanceSpec) -> bool:
        """A free warm instance can serve ``spec``: same definition, nothing else asked."""
        warm = self._warm_specs.get(spec.env_ref)
        return (
            warm is not None
            and warm[0].project == spec.project
            and not spec.environment_variables
            and not spec.arguments
            and not spec.datasource
            and not spec.storage
        )

    async def _start_warm(self) -> None:
        """Resolve the definitions to keep warm; refuse what cannot be (at start)."""
        if not self.warm:
            return
        if not isinstance(self.engine, WarmPoolEngine):
            raise ConfigurationError(
                f"warm pools ({', '.join(self.warm)}) need an engine that keeps them: serve "
                "with --engine kubernetes, or drop --warm"
            )
        for ref, count in self.warm.items():
            if count < 1:
                raise ConfigurationError(f"--warm {ref}={count}: keep at least 1 warm")
            tenant = EnvRef.parse(ref).tenant or keys.LOCAL_TENANT
            try:
                found = await self.resolve(Caller(tenant), ref)
            except EnvironmentNotFoundError as exc:
                raise ConfigurationError(
                    f"--warm {ref}: {exc}. Name a built-in environment or a published version "
                    "as TENANT/NAME@VERSION"
                ) from None
            spec = InstanceSpec(env_ref=found.ref, project=str(found.project))
            self._warm_specs[found.ref] = (spec, count)
        await self.keep_warm()

    async def keep_warm(self) -> None:
        """Start the free instances each warm pool lacks (through the engine's limiter), counting
        every hub's free instances of the pool: the target is the namespace's, not this hub's."""
        if not isinstance(self.engine, WarmPoolEngine):
            return
        for ref, (spec, count) in self._warm_specs.items():
            started = await self.engine.fill(spec, pool=WARM_POOL, count=count)
            if started:
                log.info("warm instances started", extra={"env": ref, "count": started})

    @staticmethod
    def _record(info: InstanceInfo, tenant: str, *, service: str | None = None) -> Document:
        doc: Document = info_to_json(info)
        doc["labels"] = {k: v for k, v in doc["labels"].items() if k not in HUB_LABELS}
        doc["tenant"] = tenant
        doc["service"] = service
        return doc

    async def _mine(self, caller: Caller, instance_id: str) -> Document:
        doc = await self.store.get(INSTANCES, instance_id)
        if doc is None or doc.get("tenant") != caller.tenant:
            raise InstanceNotFoundError(
                f"no instance `{instance_id}` for tenant `{caller.tenant}`; see "
                "`aenv instance list`",
                instance_id=instance_id,
            )
        return doc

    async def get_instance(self, caller: Caller, instance_id: str) -> Document:
        """One of the caller's instances, its state refreshed from the engine."""
        return await self._refresh(await self._mine(caller, instance_id))

    async def preview_target(self, instance_id: str) -> tuple[str, str | None] | None:
        """``(url, token)`` of the running instance ``instance_id``, whatever its tenant, or
        None: for the preview route, where the capability in the path is the authority (the
        instance's runtime checks it) and no key is sent."""
        doc = await self.store.get(INSTANCES, instance_id)
        if doc is None:
            return None
        doc = await self._refresh(doc)
        if doc["state"] != InstanceState.RUNNING.value or not doc.get("url"):
            return None
        return str(doc["url"]), doc.get("token")

    async def list_instances(
        self, caller: Caller, *, env: str | None = None, include_terminated: bool = False
    ) -> list[Document]:
        """The caller's instances, newest first."""
        docs = [
            d
            for d in (await self.store.list(INSTANCES)).values()
            if d.get("tenant") == caller.tenant
            and (include_terminated or d["state"] != InstanceState.TERMINATED.value)
            and (env is None or EnvRef.parse(d["env_ref"]).is_selected_by(env))
        ]
        return sorted(docs, key=lambda d: d["created_at"], reverse=True)

    async def delete_instance(self, caller: Caller, instance_id: str) -> Document:
        """Terminate one of the caller's instances (idempotent)."""
        doc = await self._mine(caller, instance_id)
        if doc["state"] == InstanceState.TERMINATED.value:
            return doc
        return await self._terminate(doc, TerminationReason.DELETED)

    async def renew_instance(self, caller: Caller, instance_id: str, ttl: float) -> Document:
        """Make one of the caller's instances expire ``ttl`` seconds from now (at most the
        tenant's ``ttl`` cap: renew again to go on)."""
        check_ttl(self.limits.for_tenant(caller.tenant), caller.tenant, ttl)
        doc = await self._refresh(await self._mine(caller, instance_id))
        if doc["state"] == InstanceState.TERMINATED.value:
            raise InstanceNotFoundError(
                f"instance `{instance_id}` has ended ({doc.get('reason')}); create a new one",
                instance_id=instance_id,
            )
        info = await self.engine.renew(instance_id, ttl)
        doc = {**doc, **self._record(info, doc["tenant"], service=doc.get("service"))}
        await self.store.put(INSTANCES, instance_id, doc)
        return doc

    async def fork_instance(self, caller: Caller, instance_id: str, n: int) -> list[Document]:
        """``n`` copies of one of the caller's running instances (engines that can fork).

        The copies count against the tenant's ``instances`` quota and ``per_request`` cap, and
        the parent's definition is checked against the tenant's caps as they are now.
        """
        if not (isinstance(n, int) and 1 <= n <= MAX_REPLICAS):
            raise ConfigurationError(f"n must be an integer from 1 to {MAX_REPLICAS}, got {n!r}")
        limits = self.limits.for_tenant(caller.tenant)
        check_per_request(limits, caller.tenant, n)
        parent = await self._mine(caller, instance_id)
        deploy = DeployConfig.model_validate(parent.get("deploy") or {})
        check_deploy(limits, caller.tenant, parent.get("source") or parent["env_ref"], deploy)
        docs = []
        async with (
            self._admit(caller.tenant, n, limits),
            self._intent(caller.tenant, parent=instance_id),
        ):
            # the copies carry the parent's labels; the intent covers them by their parent
            infos = await self.engine.fork(instance_id, n, timeout=self.startup_timeout)
            for info in infos:
                doc = self._record(info, parent["tenant"])
                doc.update(
                    source=parent.get("source"),
                    publisher=parent.get("publisher"),
                    key_id=caller.key_id,
                    deploy=parent.get("deploy"),
                )
                await self.store.put(INSTANCES, info.id, doc)
                docs.append(doc)
        return docs

    async def _terminate(
        self, doc: Document, reason: TerminationReason, *, detail: str = ""
    ) -> Document:
        try:
            info = await self.engine.delete(doc["id"])
            updated = {**doc, **self._record(info, doc["tenant"], service=doc.get("service"))}
            if reason is not TerminationReason.DELETED:
                updated["reason"] = reason.value
        except InstanceNotFoundError:
            updated = {
                **doc,
                "state": InstanceState.TERMINATED.value,
                "reason": reason.value,
                "detail": "the engine no longer knew it",
            }
        if detail:
            updated["detail"] = detail
        updated["ended_at"] = time.time()
        await self.store.put(INSTANCES, doc["id"], updated)
        return updated

    async def _refresh(self, doc: Document) -> Document:
        """The record with the engine's current state (stored when it changed)."""
        if doc["state"] == InstanceState.TERMINATED.value:
            return doc
        try:
            info = await self.engine.get(doc["id"])
            fresh = {**doc, **self._record(info, doc["tenant"], service=doc.get("service"))}
        except InstanceNotFoundError:
            expired = doc.get("expires_at") is not None and doc["expires_at"] <= time.time()
            reason = TerminationReason.EXPIRED if expired else TerminationReason.CRASHED
            fresh = {
                **doc,
                "state": InstanceState.TERMINATED.value,
                "reason": reason.value,
                "detail": "" if expired else "the engine no longer knows it (it restarted?)",
            }
        if (fresh["state"], fresh["expires_at"], fresh["url"]) != (
            doc["state"],
            doc["expires_at"],
            doc["url"],
        ):
            if fresh["state"] == InstanceState.TERMINATED.value:
                fresh["ended_at"] = time.time()
            await self.store.put(INSTANCES, doc["id"], fresh)
        return fresh

    # -- every instance has a record from birth -----------------------------------------------
    async def _identify(self) -> None:
        """This hub's id (kept in ``data_dir/hub.id`` while it holds ``data_dir/hub.lock``: a
        restarted hub is its predecessor) and the store's id (one per store, made by its first
        hub). Idempotent."""
        if not self.store_id:
            await self.store.create(META, "store", {"id": secrets.token_hex(8)})
            found = await self.store.get(META, "store")
            if found is None or not isinstance(found.get("id"), str):
                raise ConfigurationError(
                    f"the hub store {self.store.url} has no id (`meta/store` is missing or "
                    "malformed though just written): check that nothing else writes its keys"
                )
            self.store_id = found["id"]
        if not self.hub_id:
            self.hub_id = await asyncio.to_thread(self._hold_identity)
            await self._heartbeat()

    def _hold_identity(self) -> str:
        """The id kept in ``data_dir`` if this process can lock it, else a fresh one."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            lock = (self.data_dir / "hub.lock").open("a")
        except OSError:
            return secrets.token_hex(8)
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another live hub serves this directory: be another hub
            lock.close()
            return secrets.token_hex(8)
        self._id_lock = lock  # held until this process ends
        path = self.data_dir / "hub.id"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            kept = path.read_text().strip()
            if kept.isalnum() and len(kept) <= 32:
                return kept
        made = secrets.token_hex(8)
        with contextlib.suppress(OSError):
            temp = path.with_suffix(".tmp")
            temp.write_text(made + "\n")
            os.replace(temp, path)
        return made

    async def _heartbeat(self) -> None:
        """Say in the store that this hub is alive (its intents are live)."""
        self._beat_at = time.monotonic()
        await self.store.put(
            HUBS,
            self.hub_id,
            {"heartbeat_at": time.time(), "started_at": self._started_at, "pid": os.getpid()},
        )

    @contextlib.asynccontextmanager
    async def _intent(
        self, tenant: str, *, parent: str | None = None
    ) -> AsyncIterator[dict[str, str]]:
        """Record that this hub is about to have the engine start instances for ``tenant``
        (copies of ``parent``, for a fork); yield the labels that tie them to it. The intent
        goes when the body ends: by then each instance has its record, or none will."""
        await self._identify()
        iid = secrets.token_hex(8)
        now = time.time()
        doc: Document = {
            "hub": self.hub_id,
            "tenant": tenant,
            "parent": parent,
            "created_at": now,
            "deadline": now + self.startup_timeout + INTENT_MARGIN,
        }
        self._intents.add(iid)
        try:
            await self.store.put(INTENTS, iid, doc)
            yield {LABEL_INTENT: iid, LABEL_STORE: self.store_id}
        finally:
            self._intents.discard(iid)
            with contextlib.suppress(AEnvError):  # reclaim removes what is left
                await asyncio.shield(self.store.delete(INTENTS, iid))

    def _live_intent(self, iid: str, doc: Document, hubs: Mapping[str, Document]) -> bool:
        if doc.get("hub") == self.hub_id:
            return iid in self._intents
        return self._alive(doc, hubs)

    @staticmethod
    def _alive(doc: Document, hubs: Mapping[str, Document]) -> bool:
        """Whether another hub's intent or claim ``doc`` is live: its hub's heartbeat holds
        and its deadline has not passed."""
        now = time.time()
        hub = hubs.get(str(doc.get("hub")))
        return (
            hub is not None
            and now - float(hub.get("heartbeat_at") or 0.0) < HUB_LEASE
            and now < float(doc.get("deadline") or 0.0)
        )

    async def reclaim(self) -> list[str]:
        """End the engine's instances of this store that no record owns: started for a create
        whose hub died before it wrote the record, or whose record says it ended. Instances
        of a create still under way (a live intent) are left alone. Returns the ids ended.

        Order matters: the engine's list is read before the intents and the records, so an
        instance listed has had its intent written already, and an intent gone means its
        record was written before: a live create is never mistaken for an orphan."""
        await self._identify()
        infos = await self.engine.list()
        intents = await self.store.list(INTENTS)
        hubs = await self.store.list(HUBS)
        records = await self.store.list(INSTANCES)
        live = {k: d for k, d in intents.items() if self._live_intent(k, d, hubs)}
        parents = {d["parent"] for d in live.values() if d.get("parent")}
        ended = []
        for info in infos:
            if info.labels.get(LABEL_STORE) != self.store_id:
                continue  # not made by a hub of this store
            if info.state is InstanceState.TERMINATED:
                continue
            record = records.get(info.id)
            if record is not None and record["state"] != InstanceState.TERMINATED.value:
                continue
            if record is None and (
                info.labels.get(LABEL_INTENT) in live or (info.parent and info.parent in parents)
            ):
                continue  # its create is under way
            with contextlib.suppress(InstanceNotFoundError):
                await self.engine.delete(info.id)
            ended.append(info.id)
            log.warning(
                "instance without a record ended",
                extra={
                    "instance": info.id,
                    "env": info.env_ref,
                    "tenant": info.labels.get("aenv.tenant"),
                    "record": "ended" if record is not None else "none",
                },
            )
        for key in intents.keys() - live.keys():
            await self.store.delete(INTENTS, key)
        await self._forget_claims(records)
        now = time.time()
        for key, hub in hubs.items():  # hubs gone long ago
            if key != self.hub_id and now - float(hub.get("heartbeat_at") or 0.0) > self.retention:
                await self.store.delete(HUBS, key)
        return ended

    async def _forget_claims(self, records: Mapping[str, Document]) -> None:
        """Delete the idempotency claims of keys used longer than ``retention`` ago whose
        instance has no record any more (a whole chain at once: a link gone from the middle
        would let its key be claimed again while a later link stands)."""
        chains: dict[str, list[tuple[str, Document]]] = {}
        for key, doc in (await self.store.list(CLAIMS)).items():
            chains.setdefault(key.rpartition("~")[0], []).append((key, doc))
        now = time.time()
        for links in chains.values():
            newest = max(float(doc.get("created_at") or 0.0) for _, doc in links)
            kept = any(str(doc.get("instance")) in records for _, doc in links)
            if now - newest > self.retention + self.startup_timeout + INTENT_MARGIN and not kept:
                for key, _ in links:
                    await self.store.delete(CLAIMS, key)

    # -- upkeep --------------------------------------------------------------------------------
    async def reap(self) -> list[str]:
        """Terminate live instances past their TTL; forget records ended long ago. Returns the
        ids reaped."""
        now = time.time()
        reaped = []
        for key, doc in (await self.store.list(INSTANCES)).items():
            if doc["state"] == InstanceState.TERMINATED.value:
                if now - float(doc.get("ended_at") or doc["created_at"]) > self.retention:
                    await self.store.delete(INSTANCES, key)
                continue
            if doc.get("expires_at") is not None and doc["expires_at"] <= now:
                await self._terminate(doc, TerminationReason.EXPIRED)
                reaped.append(key)
                log.info("instance expired", extra={"instance": key, "env": doc["env_ref"]})
        return reaped

    async def end_revoked(self) -> list[str]:
        """Terminate the live instances (not service replicas) that an API key revoked since
        started: whoever held the key knows their tokens. Returns their ids."""
        revoked = {
            key_id
            for key_id, key in (await self.store.list(keys.KIND)).items()
            if key.get("revoked_at") is not None
        }
        ended = []
        for key, doc in (await self.store.list(INSTANCES)).items():
            if (
                doc.get("key_id") in revoked
                and doc.get("service") is None
                and doc["state"] != InstanceState.TERMINATED.value
            ):
                detail = f"the API key {doc['key_id']} that started it was revoked"
                await self._terminate(doc, TerminationReason.DELETED, detail=detail)
                ended.append(key)
                log.info("instance of a revoked key ended", extra={"instance": key})
        return ended

    async def sync(self) -> None:
        """Refresh every live record from the engine (a restarted hub's first step)."""
        for doc in (await self.store.list(INSTANCES)).values():
            if doc["state"] != InstanceState.TERMINATED.value:
                with contextlib.suppress(AEnvError):
                    await self._refresh(doc)

    async def start(self) -> None:
        """Sync with the engine, reap, reclaim, then keep doing it all in the background."""
        await self._identify()
        await self.sync()
        await self.reap()
        try:
            await self.reclaim()
        except AEnvError as exc:  # the upkeep tries again
            log.warning("reclaiming instances without a record failed", extra={"error": str(exc)})
        await self.end_revoked()
        await self.reconcile_services()
        await self._start_warm()
        self._task = asyncio.create_task(self._upkeep(), name="envhub-upkeep")

    async def stop(self) -> None:
        """Stop the background upkeep (instances keep running in the engine)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.hub_id:
            with contextlib.suppress(AEnvError):
                await self.store.delete(HUBS, self.hub_id)
        lock, self._id_lock = self._id_lock, None
        if lock is not None:
            lock.close()

    async def _upkeep(self) -> None:
        last_sync = time.monotonic()
        while True:
            await asyncio.sleep(self.reap_interval)
            try:
                if time.monotonic() - self._beat_at >= HUB_LEASE / 6:
                    await self._heartbeat()
                await self.reap()
                await self.keep_warm()
                if time.monotonic() - last_sync >= self.sync_interval:
                    last_sync = time.monotonic()
                    await self.sync()
                    await self.reclaim()
                    await self.end_revoked()
                    await self.reconcile_services()
            except Exception:  # the loop must survive a store or engine hiccup
                log.exception("control-plane upkeep failed; retrying")

    # -- services ------------------------------------------------------------------------------
    async def create_service(
        self,
        caller: Caller,
        env: str,
        *,
        name: str | None = None,
        replicas: int = 1,
        storage: bool = False,
        environment_variables: Mapping[str, str] | None = None,
        arguments: list[str] | None = None,
    ) -> Document:
        """Start a service: ``replicas`` instances of ``env`` kept running, within the
        tenant's ``services``, ``replicas`` and ``per_request`` limits and its caps."""
        _check_replicas(replicas)
        limits = self.limits.for_tenant(caller.tenant)
        check_per_request(limits, caller.tenant, replicas)
        found = await self.resolve(caller, env)  # fail now on an unknown definition
        check_deploy(limits, caller.tenant, found.ref, found.config.deploy_config)
        sid = "svc-" + secrets.token_hex(5)
        kept = service_engine(self.engine)
        async with self._tenant_lock(caller.tenant):  # the check and the record at once
            await self._check_services(caller.tenant, limits, services=1, replicas=replicas)
            # an engine that keeps services names its own volume (``_describe`` shows it)
            storage_path = self._make_storage(sid) if storage and kept is None else None
            now = time.time()
            doc: Document = {
                "id": sid,
                "name": name or EnvRef.parse(found.ref).name,
                "tenant": caller.tenant,
                "env_ref": found.ref,
                "replicas": replicas,
                "storage": storage_path,
                "environment_variables": dict(environment_variables or {}),
                "arguments": list(arguments or []),
                "created_at": now,
                "updated_at": now,
                "kept_by_engine": kept is not None,
                "storage_wanted": storage,
            }
            await self.store.put(SERVICES, sid, doc)
        if kept is not None:
            await kept.create(_service_spec(doc, found), timeout=self.startup_timeout)
        else:
            await self.reconcile_service(sid)
        return await self.get_service(caller, sid)

    def _make_storage(self, sid: str) -> str:
        root = self.data_dir / "storage"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = root / sid
        path.mkdir(exist_ok=True)
        # the replicas' to write, whoever they run as (a local engine as root runs them as
        # nobody); the 0700 directory above keeps the host's other users out
        path.chmod(0o777)
        return str(path)

    async def _check_services(
        self,
        tenant: str,
        limits: TenantLimits,
        *,
        services: int,
        replicas: int,
        without: str | None = None,
    ) -> None:
        """Refuse ``services`` more services and ``replicas`` more replicas for ``tenant``
        (its service ``without`` left out of the count)."""
        mine = [
            d
            for d in (await self.store.list(SERVICES)).values()
            if d["tenant"] == tenant and d["id"] != without
        ]
        if services and len(mine) + services > limits.services:
            raise over(
                tenant,
                "services",
                len(mine) + services,
                limits.services,
                "this would bring your services to",
                "delete services you no longer use (`aenv service delete ID`), or ask the hub's "
                "operator",
            )
        total = sum(int(d["replicas"]) for d in mine) + replicas
        if total > limits.replicas:
            raise over(
                tenant,
                "replicas",
                total,
                limits.replicas,
                "this would bring the replicas of your services to",
                "scale services down (`aenv service update ID --replicas N`), or ask the hub's "
                "operator",
            )

    async def _my_service(self, caller: Caller, service_id: str) -> Document:
        doc = await self.store.get(SERVICES, service_id)
        if doc is None or doc.get("tenant") != caller.tenant:
            raise ServiceNotFoundError(
                f"no service `{service_id}` for tenant `{caller.tenant}`; see `aenv service list`"
            )
        return doc

    async def get_service(self, caller: Caller, service_id: str) -> Document:
        """A service with its replicas' current state."""
        return await self._describe(await self._my_service(caller, service_id))

    async def service_targets(
        self, caller: Caller, service_id: str
    ) -> list[tuple[str, str | None]]:
        """``(url, token)`` of each running replica of the caller's service (for the proxy)."""
        doc = await self._my_service(caller, service_id)
        if doc.get("kept_by_engine"):
            routes = await self._keeper(doc).targets(service_id)
            return [(r.url, _bearer(r.headers)) for r in routes]
        replicas = [await self._refresh(r) for r in await self._replicas(service_id)]
        return [
            (r["url"], r.get("token"))
            for r in replicas
            if r["state"] == InstanceState.RUNNING.value and r.get("url")
        ]

    async def list_services(self, caller: Caller) -> list[Document]:
        """The caller's services, newest first."""
        docs = [
            d for d in (await self.store.list(SERVICES)).values() if d["tenant"] == caller.tenant
        ]
        docs.sort(key=lambda d: d["created_at"], reverse=True)
        return [await self._describe(d) for d in docs]

    async def update_service(
        self,
        caller: Caller,
        service_id: str,
        *,
        replicas: int | None = None,
        env: str | None = None,
        environment_variables: Mapping[str, str] | None = None,
    ) -> Document:
        """Scale a service, move it to another version, or change its variables (within the
        tenant's ``replicas`` quota and ``per_request`` cap: one update adds at most that many
        replicas)."""
        if replicas is not None:
            _check_replicas(replicas)
        limits = self.limits.for_tenant(caller.tenant)
        ref = None
        found: Definition | None = None
        if env is not None:
            found = await self.resolve(caller, env)
            check_deploy(limits, caller.tenant, found.ref, found.config.deploy_config)
            ref = found.ref
        async with self._lock(service_id):  # read-modify-write: a delete must not be undone
            doc = await self._my_service(caller, service_id)
            async with self._tenant_lock(caller.tenant):  # the check and the record at once
                if replicas is not None:
                    check_per_request(limits, caller.tenant, replicas - int(doc["replicas"]))
                    await self._check_services(
                        caller.tenant, limits, services=0, replicas=replicas, without=service_id
                    )
                    doc["replicas"] = replicas
                if ref is not None:
                    doc["env_ref"] = ref
                if environment_variables is not None:
                    doc["environment_variables"] = dict(environment_variables)
                doc["updated_at"] = time.time()
                await self.store.put(SERVICES, service_id, doc)
        if doc.get("kept_by_engine"):
            definition = found or await self.resolve(caller, doc["env_ref"])
            spec = _service_spec(doc, definition)
            await self._keeper(doc).update(spec, timeout=self.startup_timeout)
        else:
            await self.reconcile_service(service_id)
        return await self.get_service(caller, service_id)

    async def delete_service(
        self, caller: Caller, service_id: str, *, keep_storage: bool | None = None
    ) -> Document:
        """Stop a service's replicas and forget it. Its storage: kept when ``keep_storage``,
        removed when it is False; when not said, an engine's volume (Kubernetes) is kept and a
        directory on the hub's machine removed."""
        doc = await self._my_service(caller, service_id)
        if doc.get("kept_by_engine"):
            async with self._lock(service_id):  # the engine first: a failure leaves the record
                info = await self._keeper(doc).delete(
                    service_id, delete_storage=keep_storage is False
                )
                await self.store.delete(SERVICES, service_id)
            return {**doc, "replicas": 0, "instances": [], "endpoints": [], "storage": info.storage}
        async with self._lock(service_id):
            await self.store.delete(SERVICES, service_id)
            for replica in await self._replicas(service_id):
                await self._terminate(replica, TerminationReason.DELETED)
        if doc.get("storage") and not keep_storage:
            await asyncio.to_thread(shutil.rmtree, doc["storage"], True)
        return {**doc, "replicas": 0, "instances": [], "endpoints": []}

    def _lock(self, service_id: str) -> asyncio.Lock:
        return self._service_locks.setdefault(service_id, asyncio.Lock())

    async def _replicas(self, service_id: str) -> list[Document]:
        return [
            d
            for d in (await self.store.list(INSTANCES)).values()
            if d.get("service") == service_id and d["state"] != InstanceState.TERMINATED.value
        ]

    def _keeper(self, doc: Document) -> ServiceEngine:
        """The engine that keeps service ``doc`` (the hub's, when it keeps services)."""
        kept = service_engine(self.engine)
        if kept is None:
            raise ConfigurationError(
                f"service `{doc['id']}` is kept by an engine with services of its own "
                f"(Kubernetes), and this hub's engine `{self.engine.name}` has none: serve the "
                "hub with that engine again (`aenv serve --engine kubernetes`) to manage it"
            )
        return kept

    async def _describe(self, doc: Document) -> Document:
        if doc.get("kept_by_engine"):
            try:
                info = await self._keeper(doc).get(doc["id"])
            except ServiceNotFoundError:
                info = ServiceInfo(
                    id=doc["id"],
                    env_ref=doc["env_ref"],
                    replicas=int(doc["replicas"]),
                    ready=0,
                    detail="the engine has none of its objects (never made, or deleted "
                    "behind the hub's back): delete the service and create it again",
                )
            return {
                **doc,
                "ready": info.ready,
                "instances": list(info.instances),
                "endpoints": list(info.endpoints),
                "url": info.url,
                "storage": info.storage,
                "detail": info.detail,
                "token": info.token,
            }
        replicas = [await self._refresh(r) for r in await self._replicas(doc["id"])]
        running = [r for r in replicas if r["state"] == InstanceState.RUNNING.value]
        return {
            **doc,
            "ready": len(running),
            "instances": [r["id"] for r in replicas],
            "endpoints": [r["url"] for r in running if r.get("url")],
        }

    async def reconcile_services(self) -> None:
        """Bring every service to its desired replicas (the hub's upkeep calls this)."""
        for sid in list(await self.store.list(SERVICES)):
            try:
                await self.reconcile_service(sid)
            except AEnvError as exc:
                log.warning("service reconcile failed", extra={"service": sid, "error": str(exc)})

    async def reconcile_service(self, service_id: str) -> None:
        """Replace dead replicas, add or remove some to match ``replicas``, replace those of an
        older version or variables (new ones first), and renew the rest."""
        async with self._lock(service_id):
            doc = await self.store.get(SERVICES, service_id)
            if doc is None or doc.get("kept_by_engine"):  # the engine keeps it (the cluster)
                return
            caller = Caller(tenant=doc["tenant"])
            replicas = [await self._refresh(r) for r in await self._replicas(service_id)]
            alive = [r for r in replicas if r["state"] != InstanceState.TERMINATED.value]
            current = [r for r in alive if r.get("spec_key") == _spec_key(doc)]
            stale = [r for r in alive if r.get("spec_key") != _spec_key(doc)]
            while len(current) < doc["replicas"]:
                created = await self.create_instance(
                    caller,
                    doc["env_ref"],
                    ttl=SERVICE_TTL,
                    environment_variables=doc["environment_variables"],
                    arguments=doc["arguments"],
                    owner=f"service:{service_id}",
                    labels={"aenv.service": service_id},
                    service=service_id,
                    storage=doc.get("storage"),
                )
                created["spec_key"] = _spec_key(doc)
                await self.store.put(INSTANCES, created["id"], created)
                current.append(created)
            for extra in current[doc["replicas"] :] + stale:
                await self._terminate(extra, TerminationReason.DELETED)
            now = time.time()
            for replica in current[: doc["replicas"]]:
                if (replica.get("expires_at") or now) - now < SERVICE_TTL / 2:
                    with contextlib.suppress(InstanceNotFoundError):
                        info = await self.engine.renew(replica["id"], SERVICE_TTL)
                        fresh = {
                            **replica,
                            **self._record(info, replica["tenant"], service=service_id),
                        }
                        await self.store.put(INSTANCES, replica["id"], fresh)


def _service_spec(service: Document, definition: Definition) -> ServiceSpec:
    """What an engine that keeps services needs to run service ``service`` of ``definition``."""
    return ServiceSpec(
        service_id=service["id"],
        env_ref=definition.ref,
        project=str(definition.project),
        replicas=int(service["replicas"]),
        environment_variables=dict(service["environment_variables"]),
        arguments=tuple(service["arguments"]),
        labels={"aenv.tenant": service["tenant"]},
        storage=bool(service.get("storage_wanted")),
    )


def _bearer(headers: Mapping[str, str]) -> str | None:
    """The token of a route's ``Authorization: Bearer`` header (None: it has none)."""
    value = headers.get("Authorization", "")
    return value.removeprefix("Bearer ") or None


def _spec_key(service: Document) -> str:
    variables = sorted(service["environment_variables"].items())
    return repr((service["env_ref"], variables, service["arguments"]))


def _deploy_snapshot(deploy: DeployConfig) -> dict[str, Any]:
    """What a record keeps of a definition's ``deployConfig``: what the caps check (a fork is
    checked again against the caps as they are then)."""
    return {
        "memory": deploy.memory,
        "cpu": deploy.cpu,
        "pids": deploy.pids,
        "network": deploy.network,
    }


def _check_replicas(replicas: Any) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise ConfigurationError(f"replicas must be an integer, got {replicas!r}")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ConfigurationError(f"replicas must be from 0 to {MAX_REPLICAS}, got {replicas}")
