"""The registry of environment definitions: publish, look up, search, deprecate, delete.

A version is published once, from a bundle made by ``aenv build`` (see :mod:`aenv_ray.bundle`),
and never changes: its record holds the bundle's digest (in ``digest`` and in the config's
``artifacts``), and publishing the same ``name@version`` again is a
:class:`~aenv_ray.errors.VersionConflictError`, even after it was deleted (deletion leaves a
tombstone; versions are never reused): the error names the next free version, and for a
deleted one carries no ``existing_digest``, since nothing is published under it. A name belongs
to the tenant that first published it, and so does every name that looks like it
(:func:`envhub.names.name_key`: ``Notes_App`` is ``notes-app``); the names of the environments
built into the hub (and on its ``AENV_ENV_PATH``) and their lookalikes, more widely drawn
(:func:`envhub.names.imitated`: ``aegnt``, ``mini-program0``), belong to nobody. A
tenant's versions together may hold at most its ``bundle_bytes`` quota (:mod:`envhub.limits`).

Publishing is crash-safe: the bundle is stored first (content-addressed, marked as an upload in
progress), then the version record is created in one atomic step; a crash in between leaves an
unreferenced blob, which :meth:`VersionRegistry.collect_garbage` removes, never a partial version.

May import: the standard library, ``aenv_ray`` (the bundle format among it), ``envhub`` (store).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aenv_ray.config import EnvConfig
from aenv_ray.envref import EnvRef, did_you_mean, version_key
from aenv_ray.errors import (
    ConfigurationError,
    EnvironmentNotFoundError,
    PermissionDeniedError,
    VersionConflictError,
)
from aenv_ray.pod_template import check_deploy_template
from aenv_ray.resolve import available_environments
from envhub.keys import Caller
from envhub.limits import Limits, over
from envhub.names import imitated, name_key
from envhub.store import Document, Store

if TYPE_CHECKING:
    from aenv_ray.bundle import BundleInfo

__all__ = ["DEFAULT_MAX_BUNDLE", "VersionRegistry", "hub_names", "next_version"]

DEFAULT_MAX_BUNDLE = 64 * 1024 * 1024
"""Bytes a bundle may have (``aenv serve --max-bundle``)."""

VERSIONS = "versions"
NAMES = "names"  # name -> its owner (written before name keys existed; read at start)
NAME_KEYS = "name-keys"  # name_key(name) -> {"tenant", "name"}: who owns the name and lookalikes
UPLOADS = "uploads"
_STALE_UPLOAD = 3600.0  # an upload marker older than this belonged to a crashed push


def hub_names() -> list[str]:
    """The names of the environments the hub runs without its registry: the built-ins and
    those on its ``AENV_ENV_PATH`` (nobody may publish them or their lookalikes)."""
    return sorted({EnvRef.parse(ref).name for ref in available_environments()})


def next_version(used: Iterable[str]) -> str:
    """The version to publish after every one in ``used`` (deleted ones among them: their
    numbers are never reused): the highest's leading numbers with the last one bumped.

    >>> next_version(["1.0.0", "1.2.0", "1.10.0"])
    '1.10.1'
    >>> next_version(["2", "1.0.0-rc1"])
    '3'
    >>> next_version(["1.0.0-rc1"])
    '1.0.1'
    >>> next_version(["beta"])
    'beta.1'
    """
    taken = set(used)
    highest = max(taken, key=version_key, default="1.0.0")
    numbers = re.match(r"\d+(?:\.\d+)*", highest)
    parts = numbers.group(0).split(".") if numbers else [highest, "0"]
    while True:
        parts[-1] = str(int(parts[-1]) + 1)
        candidate = ".".join(parts)
        if candidate not in taken:
            return candidate


@dataclass
class VersionRegistry:
    """The hub's registry of published versions: its operations over a
    :class:`~envhub.store.Store` (not :class:`aenv_ray.registry.DefinitionRegistry`, what one
    environment's decorators register)."""

    store: Store
    max_bundle: int = DEFAULT_MAX_BUNDLE
    limits: Limits = field(default_factory=Limits)
    reserved: Callable[[], Iterable[str]] = hub_names
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict, repr=False)

    # -- publishing ----------------------------------------------------------------------------
    async def publish(
        self,
        caller: Caller,
        data: bytes,
        *,
        expected_digest: str | None = None,
        calls: Mapping[str, Any] | None = None,
    ) -> Document:
        """Check ``data`` (a bundle), then publish it as its config's ``name@version``, with
        ``calls``: what its reward, functions and tools take, as the sandbox that loaded it
        reported (:func:`aenv_ray.loadcheck.described_calls`)
        (callers check tasks against it before they start instances).

        Raises :class:`~aenv_ray.errors.ArtifactError` (corrupt), ``ArtifactTooLargeError``,
        :class:`~aenv_ray.errors.PermissionDeniedError` (a built-in's name, another tenant's,
        or a lookalike of either), :class:`~aenv_ray.errors.QuotaExceededError` (over the
        tenant's ``bundle_bytes``) and :class:`~aenv_ray.errors.VersionConflictError` (already
        published, or deleted).
        """
        from aenv_ray.bundle import inspect_bundle

        info = inspect_bundle(data, max_size=self.max_bundle, expected_digest=expected_digest)
        self.check_template(caller, info.config)
        # one push of a tenant at a time on this hub: its quota is checked against the others;
        # a push over the quota claims no name
        async with self._locks.setdefault(caller.tenant, asyncio.Lock()):
            await self._check_bytes(caller, info.digest, info.size)
            await self._claim_name(caller, info.config.name)
            await self.check_new(info.config.ref, info.digest)
            return await self._store_version(caller, info, data, calls)

    def check_template(self, caller: Caller, config: EnvConfig) -> None:
        """Raise the :class:`~aenv_ray.errors.PodTemplateRefusedError` the definition's
        ``deployConfig.customPodTemplate`` meets under the caller's pod-template policy
        (:mod:`aenv_ray.pod_template`, widened by the operator), if any: refused at push, not
        at the first create."""
        policy = self.limits.for_tenant(caller.tenant).pod_policy()
        check_deploy_template(config.deploy_config, policy, ref=config.ref)

    async def check_new(self, ref: str, digest: str) -> None:
        """Raise the :class:`~aenv_ray.errors.VersionConflictError` a push of ``digest`` as
        ``ref`` would meet (published, or deleted), if any: the hub asks before it spends a
        sandbox on loading the bundle."""
        existing = await self.store.get(VERSIONS, ref)
        if existing is not None:
            raise await self._conflict(existing, digest)

    async def _store_version(
        self, caller: Caller, info: BundleInfo, data: bytes, calls: Mapping[str, Any] | None
    ) -> Document:
        config = info.config
        ref = config.ref
        now = time.time()
        await self.store.put(UPLOADS, info.digest, {"started_at": now, "ref": ref})
        try:
            await self.store.put_blob(info.digest, data)
            artifacts = [a for a in config.artifacts if a.get("type") != "bundle"]
            artifacts.append({"type": "bundle", "digest": info.digest, "size": info.size})
            raw = config.model_dump(by_alias=True)
            raw["artifacts"] = artifacts
            record: Document = {
                "name": config.name,
                "version": config.version,
                "ref": ref,
                "digest": info.digest,
                "size": info.size,
                "files": list(info.files),
                "description": config.description,
                "tags": list(config.tags),
                "config": raw,
                "publisher": caller.tenant,
                "published_at": now,
                "deprecated": False,
                "deprecation": "",
                "deleted": False,
                "calls": dict(calls) if calls is not None else None,
            }
            if not await self.store.create(VERSIONS, ref, record):
                winner = await self.store.get(VERSIONS, ref) or {}
                raise await self._conflict(winner, info.digest)
        finally:
            await self.store.delete(UPLOADS, info.digest)
        return record

    def check_reserved(self, name: str) -> None:
        """Refuse ``name`` when it is a built-in's or imitates one
        (:func:`envhub.names.imitated`); the hub asks before it spends a sandbox on a push."""
        builtin = imitated(name, self.reserved())
        if builtin is not None:
            what = f"`{name}`" if builtin == name else f"`{name}` looks like `{builtin}`, which"
            raise PermissionDeniedError(
                f"environment {what} is built into this hub; nobody may publish a built-in's "
                "name or a lookalike of it (another case, separators, digits for letters, "
                "trailing digits, a letter added, dropped, changed or swapped). Publish under a "
                "name of your own",
                env_name=name,
            )

    async def check_name(self, caller: Caller, name: str) -> None:
        """Raise what publishing ``name`` as ``caller`` would meet for its name alone, claiming
        nothing: :class:`~aenv_ray.errors.PermissionDeniedError` for a built-in's name, a name
        another tenant owns or a lookalike of either,
        :class:`~aenv_ray.errors.ConfigurationError` for a lookalike of the caller's own name.
        The hub asks this first: who owns a name comes before whether its version is taken, so
        another tenant's ``notes@1.0.0`` is "belongs to tenant `alice`", never "already
        published" (nor "bump the version", which would not help)."""
        self.check_reserved(name)
        holder = await self.store.get(NAME_KEYS, name_key(name))
        if holder is not None:
            self._check_holder(caller, name, holder)

    async def _claim_name(self, caller: Caller, name: str) -> None:
        """Make ``name`` (and its lookalikes) the caller's, or refuse: a built-in's name, a
        name another tenant owns, or one that looks like either."""
        self.check_reserved(name)
        claim = {"tenant": caller.tenant, "name": name, "at": time.time()}
        if await self.store.create(NAME_KEYS, name_key(name), claim):
            return
        self._check_holder(caller, name, await self.store.get(NAME_KEYS, name_key(name)) or {})

    @staticmethod
    def _check_holder(caller: Caller, name: str, holder: Document) -> None:
        owner, owned = holder.get("tenant"), holder.get("name", name)
        if owner != caller.tenant:
            same = (
                "" if owned == name else f" (it looks like `{owned}`, which belongs to `{owner}`)"
            )
            raise PermissionDeniedError(
                f"environment `{name}` belongs to tenant `{owner}`{same}; you are "
                f"`{caller.tenant}`. Publish under a name of your own, or use a key of that tenant",
                env_name=name,
            )
        if owned != name:
            raise ConfigurationError(
                f"environment `{name}` looks like `{owned}`, which you publish already; publish "
                f"it as `{owned}` (two names a reader cannot tell apart would confuse your users)",
                env_name=name,
            )

    async def adopt_names(self) -> int:
        """Give every name claimed before lookalikes were checked its name key (the first
        claim of a key wins); the number of keys created. The hub calls this on start."""
        created = 0
        legacy = sorted((await self.store.list(NAMES)).items(), key=lambda kv: kv[1].get("at", 0))
        for name, claim in legacy:
            doc = {"tenant": claim.get("tenant"), "name": name, "at": claim.get("at", 0)}
            created += await self.store.create(NAME_KEYS, name_key(name), doc)
        return created

    async def _bundles_of(self, tenant: str) -> dict[str, int]:
        """digest -> size of the bundles ``tenant``'s live versions hold."""
        return {
            d["digest"]: int(d.get("size", 0))
            for d in (await self.store.list(VERSIONS)).values()
            if d.get("publisher") == tenant and not d.get("deleted")
        }

    async def _check_bytes(self, caller: Caller, digest: str, size: int) -> None:
        mine = await self._bundles_of(caller.tenant)
        if digest in mine:
            return  # already stored for this tenant: no new bytes
        used = sum(mine.values())
        allowed = self.limits.for_tenant(caller.tenant).bundle_bytes
        if used + size > allowed:
            raise over(
                caller.tenant,
                "bundle_bytes",
                used + size,
                allowed,
                f"with this bundle ({size} bytes) your versions' bundles would take",
                "delete versions you no longer need (`aenv delete NAME@VERSION`), or ask the "
                "hub's operator",
            )

    async def _conflict(self, existing: Document, digest: str) -> VersionConflictError:
        ref, name = existing.get("ref", "?"), existing.get("name", "")
        used = [d["version"] for d in await self.versions(name, include_deleted=True)]
        bump = (
            f'Set "version": "{next_version(used)}" in config.json (the next free version of '
            f"`{name}`) and push again"
        )
        if existing.get("deleted"):
            # no digest: a deleted version holds no bundle, so no push of it is "already there"
            return VersionConflictError(
                f"`{ref}` was deleted and is not published; its number is never reused. {bump}",
                env_name=ref,
            )
        if existing.get("digest") == digest:
            message = f"`{ref}` is already published with this very bundle ({digest})"
        else:
            message = (
                f"`{ref}` is already published (digest {existing.get('digest')}; yours is "
                f"{digest}); published versions are immutable. {bump}"
            )
        return VersionConflictError(message, env_name=ref, existing_digest=existing.get("digest"))

    # -- reading -------------------------------------------------------------------------------
    async def versions(self, name: str, *, include_deleted: bool = False) -> list[Document]:
        """Every version of ``name``, oldest first (by version order)."""
        found = [
            doc
            for doc in (await self.store.list(VERSIONS)).values()
            if doc["name"] == name and (include_deleted or not doc.get("deleted"))
        ]
        return sorted(found, key=lambda d: version_key(d["version"]))

    async def get(self, name: str, version: str | None = None) -> Document:
        """One version (``None`` or ``"latest"``: the highest not deprecated, else the highest).

        Raises :class:`~aenv_ray.errors.EnvironmentNotFoundError` naming what exists.
        """
        if version in (None, "latest"):
            versions = await self.versions(name)
            if not versions:
                raise await self._not_found(name)
            current = [v for v in versions if not v.get("deprecated")]
            return (current or versions)[-1]
        ref = str(EnvRef(name, version))
        doc = await self.store.get(VERSIONS, ref)
        if doc is None or doc.get("deleted"):
            raise await self._not_found(ref, deleted=bool(doc))
        return doc

    async def _not_found(self, ref: str, *, deleted: bool = False) -> EnvironmentNotFoundError:
        if deleted:
            return EnvironmentNotFoundError(
                f"`{ref}` was deleted from the registry; use another version "
                f"(`aenv get {EnvRef.parse(ref).name}`)",
                env_name=ref,
            )
        docs = [d for d in (await self.store.list(VERSIONS)).values() if not d.get("deleted")]
        name = EnvRef.parse(ref).name
        same = sorted(
            (EnvRef.parse(d["ref"]) for d in docs if d["name"] == name), key=EnvRef.sort_key
        )
        if same:
            hint = f"; published versions: {', '.join(map(str, same))}"
        else:
            hint = did_you_mean(name, sorted({d["name"] for d in docs}))
            hint = hint or "; `aenv list` shows what it has, `aenv push` publishes a project"
        return EnvironmentNotFoundError(f"no `{ref}` in the registry{hint}", env_name=ref)

    async def search(
        self,
        query: str = "",
        *,
        tags: list[str] | None = None,
        include_deprecated: bool = False,
    ) -> list[dict[str, Any]]:
        """One summary per name whose name or description contains ``query`` (case-blind) and
        whose latest version has every tag in ``tags``; sorted by name."""
        by_name: dict[str, list[Document]] = {}
        for doc in (await self.store.list(VERSIONS)).values():
            if not doc.get("deleted"):
                by_name.setdefault(doc["name"], []).append(doc)
        wanted = {t.lower() for t in tags or []}
        needle = query.lower()
        out = []
        for name, docs in sorted(by_name.items()):
            docs.sort(key=lambda d: version_key(d["version"]))
            current = [d for d in docs if not d.get("deprecated")]
            if not current and not include_deprecated:
                continue
            latest = (current or docs)[-1]
            if (
                needle
                and needle not in name.lower()
                and needle not in latest["description"].lower()
            ):
                continue
            if not wanted <= {t.lower() for t in latest["tags"]}:
                continue
            out.append(
                {
                    "name": name,
                    "latest": latest["version"],
                    "description": latest["description"],
                    "tags": latest["tags"],
                    "publisher": latest["publisher"],
                    "versions": [
                        d["version"] for d in docs if include_deprecated or not d["deprecated"]
                    ],
                }
            )
        return out

    async def tags(self) -> dict[str, int]:
        """How many names carry each tag (on their latest version)."""
        counts: dict[str, int] = {}
        for summary in await self.search():
            for tag in summary["tags"]:
                counts[tag] = counts.get(tag, 0) + 1
        return dict(sorted(counts.items()))

    async def bundle(self, name: str, version: str | None) -> tuple[Document, bytes]:
        """A version's record and its bundle's bytes."""
        doc = await self.get(name, version)
        data = await self.store.get_blob(doc["digest"])
        if data is None:
            raise EnvironmentNotFoundError(
                f"`{doc['ref']}`'s bundle {doc['digest']} is missing from the store; push the "
                "version's bundle again under a new version",
                env_name=doc["ref"],
            )
        return doc, data

    # -- changing ------------------------------------------------------------------------------
    async def deprecate(
        self, caller: Caller, name: str, version: str, *, deprecated: bool, message: str = ""
    ) -> Document:
        """Mark a version deprecated (still pullable and creatable, skipped by ``name`` alone and
        by listings) or not."""
        doc = await self.get(name, version)
        self._check_owner(caller, doc)
        doc = {**doc, "deprecated": deprecated, "deprecation": message if deprecated else ""}
        await self.store.put(VERSIONS, doc["ref"], doc)
        return doc

    async def delete(self, caller: Caller, name: str, version: str) -> Document:
        """Delete a version: its record becomes a tombstone (the number is never reused) and its
        bundle is removed unless another version has the same digest."""
        doc = await self.get(name, version)
        self._check_owner(caller, doc)
        tombstone = {**doc, "deleted": True, "deleted_at": time.time()}
        await self.store.put(VERSIONS, doc["ref"], tombstone)
        others = [
            d
            for d in (await self.store.list(VERSIONS)).values()
            if d["digest"] == doc["digest"] and not d.get("deleted")
        ]
        if not others:
            await self.store.delete_blob(doc["digest"])
        return tombstone

    @staticmethod
    def _check_owner(caller: Caller, doc: Document) -> None:
        if doc["publisher"] != caller.tenant:
            raise PermissionDeniedError(
                f"`{doc['ref']}` was published by tenant `{doc['publisher']}`; only that tenant "
                "may deprecate or delete it"
            )

    async def collect_garbage(self) -> list[str]:
        """Remove blobs no version references (left by pushes that crashed); return their
        digests. Uploads in progress (marked less than an hour ago) are kept."""
        live = {
            d["digest"] for d in (await self.store.list(VERSIONS)).values() if not d.get("deleted")
        }
        now = time.time()
        uploads = await self.store.list(UPLOADS)
        pending = set()
        for digest, marker in uploads.items():
            if now - float(marker.get("started_at", 0)) < _STALE_UPLOAD:
                pending.add(digest)
            else:
                await self.store.delete(UPLOADS, digest)
        removed = []
        for digest in await self.store.list_blobs():
            if digest not in live and digest not in pending:
                await self.store.delete_blob(digest)
                removed.append(digest)
        return removed
