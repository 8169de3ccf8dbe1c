"""The control plane: instances and services of registry definitions, over an injected engine.

Every instance and service belongs to a tenant (the caller's API key); another tenant's ids are
unknown to you (:class:`~aenv_ray.errors.InstanceNotFoundError` /
:class:`~aenv_ray.errors.ServiceNotFoundError`, HTTP 404). Records live in the store, so a
restarted hub knows every instance it created: :meth:`ControlPlane.sync` asks the engine about
each on start (and every ``sync_interval``), and :meth:`ControlPlane.reap` terminates those past
their TTL. The engine enforces the TTL as well, so an instance expires even while the hub is
down.

A definition is resolved from the registry (its bundle is unpacked once into
``data_dir/bundles/<digest>``), then from the hub's own built-in environments and
``AENV_ENV_PATH``.

A **service** keeps ``replicas`` instances of a definition running, with no TTL (the hub renews
them), and optional persistent storage: a directory ``data_dir/storage/<service id>`` the engine
mounts read-write at ``/storage`` in every replica. Dead replicas are replaced; changing the
version or variables replaces replicas new-first, so the service keeps serving.

May import: the standard library, ``aenv_ray``, ``envhub`` (store, registry, bundle, keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import math
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv_ray._resolve import _version_key, available_environments
from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    SandboxEngine,
    TerminationReason,
    info_to_json,
)
from aenv_ray.errors import (
    AEnvError,
    ConfigurationError,
    EnvironmentNotFoundError,
    InstanceNotFoundError,
    ServiceNotFoundError,
)
from envhub.keys import Caller
from envhub.registry import Registry, split_ref
from envhub.store import Document, Store

__all__ = ["ControlPlane"]

log = logging.getLogger("envhub.control")

INSTANCES = "instances"
SERVICES = "services"
SERVICE_TTL = 24 * 3600.0  # a replica's engine TTL; the hub renews it at half-life
MAX_REPLICAS = 64


@dataclass
class ControlPlane:
    """Instances and services over ``engine``, recorded in ``store``."""

    store: Store
    engine: SandboxEngine
    registry: Registry
    data_dir: Path
    reap_interval: float = 1.0
    sync_interval: float = 5.0
    retention: float = 24 * 3600.0  # how long a terminated instance's record is kept
    startup_timeout: float = 120.0
    _service_locks: dict[str, asyncio.Lock] = field(default_factory=dict, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    # -- definitions ---------------------------------------------------------------------------
    async def resolve(self, ref: str) -> tuple[str, Path, list[str]]:
        """``(name@version, project directory, warnings)`` for ``ref``."""
        name, version = split_ref(ref)
        try:
            doc = await self.registry.get(name, version)
        except EnvironmentNotFoundError as missing:
            local = available_environments()
            if ref in local:
                return ref, local[ref], []
            mine = [r for r in local if split_ref(r)[0] == name]
            if version in (None, "latest") and mine:
                found = max(mine, key=lambda r: _version_key(split_ref(r)[1] or ""))
                return found, local[found], []
            raise _not_here(missing, name, list(local)) from None
        warnings = []
        if doc.get("deprecated"):
            why = f": {doc['deprecation']}" if doc.get("deprecation") else ""
            warnings.append(f"`{doc['ref']}` is deprecated{why}")
        project = await self._unpack(doc)
        return doc["ref"], project, warnings

    async def check_loads(self, data: bytes, digest: str) -> dict[str, Any] | None:
        """Load an uploaded bundle in a sandbox of the engine's; its manifest (None when the
        engine cannot inspect). A bundle that does not load raises DefinitionError and leaves
        nothing behind; one that does stays unpacked where instances will need it."""
        from envhub.bundle import extract_bundle

        inspect = getattr(self.engine, "inspect", None)
        if inspect is None:
            return None
        dest = self.data_dir / "bundles" / digest.replace(":", "-")
        fresh = not (dest / ".aenv-digest").is_file()
        dest.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(extract_bundle, data, dest)
        try:
            manifest: dict[str, Any] = await inspect(str(dest), timeout=self.startup_timeout)
        except BaseException:
            if fresh:
                await asyncio.to_thread(shutil.rmtree, dest, True)
            raise
        return manifest

    async def _unpack(self, doc: Document) -> Path:
        from envhub.bundle import extract_bundle

        dest = self.data_dir / "bundles" / doc["digest"].replace(":", "-")
        if (dest / ".aenv-digest").is_file():
            return dest
        _, data = await self.registry.bundle(doc["name"], doc["version"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        return await asyncio.to_thread(extract_bundle, data, dest)

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
    ) -> Document:
        """Start an instance of ``env`` for ``caller``; return its record once it answers."""
        ref, project, warnings = await self.resolve(env)
        spec = InstanceSpec(
            env_ref=ref,
            project=str(project),
            ttl=ttl,
            environment_variables=dict(environment_variables or {}),
            arguments=tuple(arguments or ()),
            datasource=datasource,
            owner=owner,
            labels={**(labels or {}), "aenv.tenant": caller.tenant},
            storage=storage,
        )
        info = await self.engine.create(spec, timeout=self.startup_timeout)
        doc = self._record(info, caller.tenant, service=service)
        doc["warnings"] = warnings
        await self.store.put(INSTANCES, info.id, doc)
        log.info(
            "instance created", extra={"instance": info.id, "env": ref, "tenant": caller.tenant}
        )
        return doc

    @staticmethod
    def _record(info: InstanceInfo, tenant: str, *, service: str | None = None) -> Document:
        doc: Document = info_to_json(info)
        doc["labels"] = {k: v for k, v in doc["labels"].items() if k != "aenv.tenant"}
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

    async def list_instances(
        self, caller: Caller, *, env: str | None = None, include_terminated: bool = False
    ) -> list[Document]:
        """The caller's instances, newest first."""
        docs = [
            d
            for d in (await self.store.list(INSTANCES)).values()
            if d.get("tenant") == caller.tenant
            and (include_terminated or d["state"] != InstanceState.TERMINATED.value)
            and (env is None or d["env_ref"] == env or split_ref(d["env_ref"])[0] == env)
        ]
        return sorted(docs, key=lambda d: d["created_at"], reverse=True)

    async def delete_instance(self, caller: Caller, instance_id: str) -> Document:
        """Terminate one of the caller's instances (idempotent)."""
        doc = await self._mine(caller, instance_id)
        if doc["state"] == InstanceState.TERMINATED.value:
            return doc
        return await self._terminate(doc, TerminationReason.DELETED)

    async def renew_instance(self, caller: Caller, instance_id: str, ttl: float) -> Document:
        """Make one of the caller's instances expire ``ttl`` seconds from now."""
        if not (isinstance(ttl, int | float) and 0 < ttl < math.inf):
            raise ConfigurationError(f"ttl must be a positive number of seconds, got {ttl!r}")
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
        """``n`` copies of one of the caller's running instances (engines that can fork)."""
        if not (isinstance(n, int) and 1 <= n <= MAX_REPLICAS):
            raise ConfigurationError(f"n must be an integer from 1 to {MAX_REPLICAS}, got {n!r}")
        parent = await self._mine(caller, instance_id)
        infos = await self.engine.fork(instance_id, n, timeout=self.startup_timeout)
        docs = []
        for info in infos:
            doc = self._record(info, parent["tenant"])
            await self.store.put(INSTANCES, info.id, doc)
            docs.append(doc)
        return docs

    async def _terminate(self, doc: Document, reason: TerminationReason) -> Document:
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

    async def sync(self) -> None:
        """Refresh every live record from the engine (a restarted hub's first step)."""
        for doc in (await self.store.list(INSTANCES)).values():
            if doc["state"] != InstanceState.TERMINATED.value:
                with contextlib.suppress(AEnvError):
                    await self._refresh(doc)

    async def start(self) -> None:
        """Sync with the engine, reap, then keep doing both in the background."""
        await self.sync()
        await self.reap()
        await self.reconcile_services()
        self._task = asyncio.create_task(self._upkeep(), name="envhub-upkeep")

    async def stop(self) -> None:
        """Stop the background upkeep (instances keep running in the engine)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _upkeep(self) -> None:
        last_sync = time.monotonic()
        while True:
            await asyncio.sleep(self.reap_interval)
            try:
                await self.reap()
                if time.monotonic() - last_sync >= self.sync_interval:
                    last_sync = time.monotonic()
                    await self.sync()
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
        """Start a service: ``replicas`` instances of ``env`` kept running."""
        _check_replicas(replicas)
        ref, _, _ = await self.resolve(env)  # fail now on an unknown definition
        sid = "svc-" + secrets.token_hex(5)
        storage_path = None
        if storage:
            root = self.data_dir / "storage"
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = root / sid
            path.mkdir(exist_ok=True)
            # the replicas' to write, whoever they run as (a local engine as root runs them as
            # nobody); the 0700 directory above keeps the host's other users out
            path.chmod(0o777)
            storage_path = str(path)
        now = time.time()
        doc: Document = {
            "id": sid,
            "name": name or split_ref(ref)[0],
            "tenant": caller.tenant,
            "env_ref": ref,
            "replicas": replicas,
            "storage": storage_path,
            "environment_variables": dict(environment_variables or {}),
            "arguments": list(arguments or []),
            "created_at": now,
            "updated_at": now,
        }
        await self.store.put(SERVICES, sid, doc)
        await self.reconcile_service(sid)
        return await self.get_service(caller, sid)

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
        await self._my_service(caller, service_id)
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
        """Scale a service, move it to another version, or change its variables."""
        if replicas is not None:
            _check_replicas(replicas)
        ref = (await self.resolve(env))[0] if env is not None else None
        async with self._lock(service_id):  # read-modify-write: a delete must not be undone
            doc = await self._my_service(caller, service_id)
            if replicas is not None:
                doc["replicas"] = replicas
            if ref is not None:
                doc["env_ref"] = ref
            if environment_variables is not None:
                doc["environment_variables"] = dict(environment_variables)
            doc["updated_at"] = time.time()
            await self.store.put(SERVICES, service_id, doc)
        await self.reconcile_service(service_id)
        return await self.get_service(caller, service_id)

    async def delete_service(
        self, caller: Caller, service_id: str, *, keep_storage: bool = False
    ) -> Document:
        """Stop a service's replicas and forget it; its storage goes too unless kept."""
        doc = await self._my_service(caller, service_id)
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

    async def _describe(self, doc: Document) -> Document:
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
            if doc is None:
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


def _not_here(
    missing: EnvironmentNotFoundError, name: str, local: list[str]
) -> EnvironmentNotFoundError:
    """The registry's not-found error, with what the hub has built in under that name (or a
    close one): the registry alone does not know the built-ins the hub also resolves."""
    mine = [r for r in local if split_ref(r)[0] == name]
    mine.sort(key=lambda r: _version_key(split_ref(r)[1] or ""))
    if mine:
        hint = f"; built into this hub: {', '.join(mine)}"
    else:
        close = difflib.get_close_matches(name, sorted({split_ref(r)[0] for r in local}), n=1)
        if not close or "did you mean" in str(missing):
            return missing
        hint = f"; did you mean `{close[0]}` (built into this hub)?"
    return EnvironmentNotFoundError(f"{missing}{hint}", env_name=missing.env_name)


def _spec_key(service: Document) -> str:
    variables = sorted(service["environment_variables"].items())
    return repr((service["env_ref"], variables, service["arguments"]))


def _check_replicas(replicas: Any) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise ConfigurationError(f"replicas must be an integer, got {replicas!r}")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ConfigurationError(f"replicas must be from 0 to {MAX_REPLICAS}, got {replicas}")
