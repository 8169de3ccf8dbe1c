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

May import: the standard library, ``aenv_ray``, ``envhub`` (registry, bundle).
"""

from __future__ import annotations

import asyncio
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from aenv_ray.config import EnvConfig
from aenv_ray.errors import EnvironmentNotFoundError
from aenv_ray.resolve import available_environments, version_key
from envhub.registry import Registry, split_ref
from envhub.store import Document

__all__ = ["Definition", "resolve", "split_tenant"]


@dataclass(frozen=True)
class Definition:
    """A resolved environment definition."""

    ref: str  # name@version; tenant/name@version for another tenant's code
    project: Path
    config: EnvConfig
    publisher: str | None  # the tenant whose code it is; None: built into the hub
    warnings: list[str] = field(default_factory=list)


def split_tenant(ref: str) -> tuple[str | None, str]:
    """``"alice/notes@1.0"`` -> ``("alice", "notes@1.0")``; ``"notes"`` -> ``(None, "notes")``."""
    tenant, sep, rest = ref.partition("/")
    return (tenant, rest) if sep else (None, ref)


async def resolve(registry: Registry, data_dir: Path, tenant: str, ref: str) -> Definition:
    """The definition ``ref`` names for ``tenant`` (see the module's rule); its bundle is
    unpacked once into ``data_dir/bundles/<digest>``."""
    explicit, bare = split_tenant(ref)
    name, version = split_ref(bare)
    local = available_environments()
    if explicit is None:
        found = _local(local, bare, name, version)
        if found is not None:
            project = local[found]
            config = await asyncio.to_thread(EnvConfig.load, project)
            return Definition(found, project, config, None)
    try:
        doc = await registry.get(name, version)
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
    return Definition(qualified, project, config, publisher, warnings)


def _local(local: dict[str, Path], bare: str, name: str, version: str | None) -> str | None:
    """The built-in (or ``AENV_ENV_PATH``) ref ``bare`` means, if any."""
    if bare in local:
        return bare
    mine = [r for r in local if split_ref(r)[0] == name]
    if version in (None, "latest") and mine:
        return max(mine, key=lambda r: version_key(split_ref(r)[1] or ""))
    return None


async def _unpack(registry: Registry, data_dir: Path, doc: Document) -> Path:
    from envhub.bundle import extract_bundle

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
    mine = [r for r in local if split_ref(r)[0] == name]
    mine.sort(key=lambda r: version_key(split_ref(r)[1] or ""))
    if mine:
        hint = f"; built into this hub: {', '.join(mine)}"
    else:
        close = difflib.get_close_matches(name, sorted({split_ref(r)[0] for r in local}), n=1)
        if not close or "did you mean" in str(missing):
            return missing
        hint = f"; did you mean `{close[0]}` (built into this hub)?"
    return EnvironmentNotFoundError(f"{missing}{hint}", env_name=missing.env_name)
