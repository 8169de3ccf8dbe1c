"""Which code an instance of ``env`` runs, for one tenant: :func:`resolve`.

The rule, in order:

1. ``name`` or ``name@version`` of an environment built into the hub (or on its
   ``AENV_ENV_PATH``) is that environment; nobody can publish such a name or a lookalike of it
   (:mod:`envhub.registry`), so it cannot be hijacked;
2. any other ``name[@version]`` is the caller's own tenant's, from the registry; a name another
   tenant publishes is :class:`~aenv_ray.errors.EnvironmentNotFoundError`, whose message names
   the explicit form;
3. ``tenant/name[@version]`` is that tenant's version, explicitly: the only way to run another
   tenant's code.

A tenant therefore never runs another's code because of a name alone: not when it mistypes a
name, not when another tenant publishes a name it uses later, and not through a service, whose
record keeps the resolved form (``alice/notes@1.0.0`` when another tenant's).

May import: the standard library, ``aenv_ray`` (the bundle format among it), ``envhub`` (registry).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv_ray.config import EnvConfig
from aenv_ray.envref import EnvRef, closest
from aenv_ray.errors import EnvironmentNotFoundError
from aenv_ray.resolve import available_environments
from envhub.registry import VersionRegistry
from envhub.store import Document

__all__ = ["Definition", "resolve"]


@dataclass(frozen=True)
class Definition:
    """A resolved environment definition."""

    ref: str  # name@version; tenant/name@version for another tenant's code
    project: Path
    config: EnvConfig
    publisher: str | None  # the tenant whose code it is; None: built into the hub
    warnings: list[str] = field(default_factory=list)
    calls: dict[str, Any] | None = None  # what its reward and functions take, when published


async def resolve(registry: VersionRegistry, data_dir: Path, tenant: str, ref: str) -> Definition:
    """The definition ``ref`` names for ``tenant`` (see the module's rule); its bundle is
    unpacked once into ``data_dir/bundles/<digest>``."""
    wanted = EnvRef.parse(ref)
    explicit, bare, name = wanted.tenant, wanted.bare, wanted.name
    local = available_environments()
    if explicit is None:
        found = _local(local, wanted)
        if found is not None:
            project = local[found]
            config = await asyncio.to_thread(EnvConfig.load, project)
            return Definition(found, project, config, None)
    try:
        doc = await registry.get(name, wanted.version)
    except EnvironmentNotFoundError as missing:
        raise (missing if explicit else _not_here(missing, name, list(local))) from None
    publisher = doc["publisher"]
    if publisher != (explicit or tenant):
        if explicit:
            raise EnvironmentNotFoundError(
                f"tenant `{explicit}` publishes no `{bare}`: `{doc['ref']}` is tenant "
                f"`{publisher}`'s; name it `{publisher}/{doc['ref']}` to run their code",
                env_name=ref,
            )
        raise EnvironmentNotFoundError(
            f"you (tenant `{tenant}`) publish no `{bare}`: `{doc['ref']}` is tenant "
            f"`{publisher}`'s code, which runs only when named with its publisher: "
            f"`{publisher}/{doc['ref']}`",
            env_name=ref,
        )
    warnings = []
    if doc.get("deprecated"):
        why = f": {doc['deprecation']}" if doc.get("deprecation") else ""
        warnings.append(f"`{doc['ref']}` is deprecated{why}")
    project = await _unpack(registry, data_dir, doc)
    config = await asyncio.to_thread(EnvConfig.load, project)
    qualified = doc["ref"] if publisher == tenant else f"{publisher}/{doc['ref']}"
    calls = doc.get("calls") if isinstance(doc.get("calls"), dict) else None
    return Definition(qualified, project, config, publisher, warnings, calls)


def _local(local: dict[str, Path], wanted: EnvRef) -> str | None:
    """The built-in (or ``AENV_ENV_PATH``) ref ``wanted`` (without a tenant) means, if any."""
    if wanted.bare in local:
        return wanted.bare
    mine = [ref for ref in map(EnvRef.parse, local) if ref.name == wanted.name]
    if wanted.is_latest and mine:
        return str(max(mine, key=EnvRef.sort_key))
    return None


async def _unpack(registry: VersionRegistry, data_dir: Path, doc: Document) -> Path:
    from aenv_ray.bundle import extract_bundle

    dest = data_dir / "bundles" / str(doc["digest"]).replace(":", "-")
    if (dest / ".aenv-digest").is_file():
        return dest
    _, data = await registry.bundle(doc["name"], doc["version"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpacked: Path = await asyncio.to_thread(extract_bundle, data, dest)
    return unpacked


def _not_here(
    missing: EnvironmentNotFoundError, name: str, local: list[str]
) -> EnvironmentNotFoundError:
    """The registry's not-found error, with what the hub has built in under that name (or a
    close one): the registry alone does not know the built-ins the hub also resolves."""
    refs = [EnvRef.parse(r) for r in local]
    mine = sorted((r for r in refs if r.name == name), key=EnvRef.sort_key)
    if mine:
        hint = f"; built into this hub: {', '.join(map(str, mine))}"
    else:
        close = closest(name, sorted({r.name for r in refs}))
        if close is None or "did you mean" in str(missing):
            return missing
        hint = f"; did you mean `{close}` (built into this hub)?"
    return EnvironmentNotFoundError(f"{missing}{hint}", env_name=missing.env_name)
