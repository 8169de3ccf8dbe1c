"""API keys: created and revoked on the hub's machine, checked on every request.

A key is ``aenv_<id>_<secret>``. The store keeps its id, tenant, name and the sha256 of the
secret (never the secret), under kind ``"keys"``; a request's key is looked up on every call, so
a revocation takes effect at once, on every hub sharing the store.

    >>> import asyncio
    >>> from envhub.store import open_store
    >>> async def demo():
    ...     store = await open_store("sqlite:///:memory:")
    ...     key, secret = await create_key(store, tenant="team-a", name="laptop")
    ...     who = await authenticate(store, f"Bearer {secret}")
    ...     await store.aclose()
    ...     return who.tenant, who.key_id == key.id
    >>> asyncio.run(demo())
    ('team-a', True)

May import: the standard library, ``aenv_ray.errors``, ``envhub.store``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import asdict, dataclass

from aenv_ray.errors import AuthenticationError, ConfigurationError
from envhub.store import Store

__all__ = [
    "LOCAL_TENANT",
    "ApiKey",
    "Caller",
    "authenticate",
    "create_key",
    "list_keys",
    "revoke_key",
]

KIND = "keys"
LOCAL_TENANT = "local"
"""The tenant of every request to a hub without auth (``aenv serve --no-auth``)."""
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$", re.IGNORECASE)
_KEY = re.compile(r"^aenv_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})$")


@dataclass(frozen=True)
class ApiKey:
    """A key's record (without its secret)."""

    id: str
    tenant: str
    name: str
    created_at: float
    revoked_at: float | None = None
    digest: str = ""

    @property
    def active(self) -> bool:
        """True until revoked."""
        return self.revoked_at is None

    def public(self) -> dict[str, object]:
        """The record without its digest, for listings."""
        data = asdict(self)
        data.pop("digest")
        return data


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the tenant owns what the request creates."""

    tenant: str
    key_id: str | None = None  # None when the hub runs without auth


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_key(store: Store, *, tenant: str, name: str = "") -> tuple[ApiKey, str]:
    """A new key for ``tenant``; returns its record and the full key (shown once, never stored)."""
    if not _TENANT.fullmatch(tenant):
        raise ConfigurationError(
            f"tenant `{tenant}` is invalid: use letters, digits, `.`, `_`, `-` (at most 63)"
        )
    while True:
        key_id = secrets.token_hex(6)
        secret = f"aenv_{key_id}_{secrets.token_urlsafe(24)}"
        record = ApiKey(
            id=key_id, tenant=tenant, name=name, created_at=time.time(), digest=_digest(secret)
        )
        if await store.create(KIND, key_id, asdict(record)):
            return record, secret


async def list_keys(store: Store) -> list[ApiKey]:
    """Every key, revoked ones included, oldest first."""
    keys = [ApiKey(**doc) for doc in (await store.list(KIND)).values()]
    return sorted(keys, key=lambda k: k.created_at)


async def revoke_key(store: Store, key_id: str) -> ApiKey:
    """Revoke a key by id (idempotent); requests with it get 401 from now on."""
    doc = await store.get(KIND, key_id)
    if doc is None:
        raise ConfigurationError(f"no API key with id `{key_id}`; see `aenv keys list`")
    key = ApiKey(**doc)
    if key.revoked_at is None:
        key = ApiKey(**{**doc, "revoked_at": time.time()})
        await store.put(KIND, key_id, asdict(key))
    return key


async def authenticate(store: Store, authorization: str | None) -> Caller:
    """The caller of a request from its ``Authorization`` header; :class:`AuthenticationError`
    (HTTP 401) when the key is missing, malformed, unknown or revoked."""
    if not authorization:
        raise AuthenticationError(
            "this hub needs an API key: send `Authorization: Bearer KEY` (set AENV_API_KEY or "
            "run `aenv config set api-key KEY`); create one on the hub's machine with "
            "`aenv keys create --tenant NAME`"
        )
    scheme, _, token = authorization.strip().partition(" ")
    match = _KEY.fullmatch(token.strip()) if scheme.lower() == "bearer" else None
    if match is None:
        raise AuthenticationError(
            "the Authorization header is not `Bearer aenv_...`: send the key `aenv keys create` "
            "printed"
        )
    doc = await store.get(KIND, match.group(1))
    if doc is None or not hmac.compare_digest(doc.get("digest", ""), _digest(token.strip())):
        raise AuthenticationError(
            "this API key is unknown to the hub (a typo, or another hub's key); check "
            "AENV_API_KEY or create a key with `aenv keys create`"
        )
    key = ApiKey(**doc)
    if not key.active:
        raise AuthenticationError(
            f"API key {key.id} ({key.name or 'unnamed'}) was revoked; ask for a new one"
        )
    return Caller(tenant=key.tenant, key_id=key.id)
