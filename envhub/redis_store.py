"""The shared store: EnvHub's documents and blobs in Redis, for hubs that share state.

:class:`RedisStore` keeps every key under a prefix (``?prefix=`` in the URL, ``aenv:`` by
default), so several hubs (or test runs) can share one database:

- ``{prefix}doc:{kind}``: a hash per kind, field = key, value = the document as JSON;
  :meth:`RedisStore.create` is ``HSETNX``, atomic across every client of the server;
- ``{prefix}blob:{digest}``: one string per blob, and ``{prefix}blobs``, the set of digests,
  kept in step with the strings inside ``MULTI``/``EXEC``.

Durability is the server's (``appendonly yes`` keeps writes across restarts). Every ``redis``
exception leaves as a :class:`~aenv_ray.errors.StoreError` naming the server (never its
password) and saying what to do.

May import: redis (the ``redis`` extra, checked here), ``aenv_ray.errors`` and ``aenv_ray.extras``,
``envhub.document``.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from aenv_ray.errors import StoreError
from aenv_ray.extras import require_extra

require_extra("redis", "the hub's Redis store (redis://)")

import redis.asyncio as aioredis  # noqa: E402
from redis.asyncio.retry import Retry  # noqa: E402
from redis.backoff import ExponentialWithJitterBackoff  # noqa: E402
from redis.exceptions import RedisError  # noqa: E402

from envhub.document import Document  # noqa: E402

__all__ = ["RedisStore"]


DEFAULT_PREFIX = "aenv:"


def _dumps(doc: Document) -> bytes:
    return json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _split_url(url: str) -> tuple[str, str, str]:
    """``(url for redis-py, url to show, prefix)``: ``?prefix=`` taken out, the password hidden."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in query if name == "prefix"]
    prefix = prefixes[-1] if prefixes else DEFAULT_PREFIX
    rest = urlencode([(name, value) for name, value in query if name != "prefix"])
    connect = urlunsplit(parts._replace(query=rest))
    netloc = parts.netloc.rpartition("@")[2]
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    shown = urlunsplit(parts._replace(netloc=netloc))
    return connect, shown, prefix


class RedisStore:
    """A :class:`~envhub.store.Store` in a Redis database.

    Open it with :meth:`open`; close it with :meth:`aclose` (or ``async with``).
    """

    def __init__(self, client: aioredis.Redis, url: str, prefix: str) -> None:
        # private: use `await RedisStore.open(url)`, which checks that the server answers
        self.url = url
        self.prefix = prefix
        self._client: aioredis.Redis | None = client
        self._blobs = f"{prefix}blobs"

    @classmethod
    async def open(cls, url: str, *, timeout: float = 5.0) -> RedisStore:
        """Connect to the server at ``url`` and check that it answers ``PING``.

        ``url`` is ``redis://[[user]:password@]host[:port][/db][?prefix=aenv:]`` (``rediss://``
        for TLS, ``unix:///path/redis.sock?db=0``). ``timeout`` bounds each connect and reply;
        a lost connection is retried a few times (for about a second) before an error.
        """
        connect, shown, prefix = _split_url(url)
        retry = Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.02), retries=5)
        try:
            client = aioredis.Redis.from_url(
                connect,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=retry,
            )
        except (ValueError, TypeError, RedisError) as exc:
            raise StoreError(
                f"Redis store URL {shown} is invalid ({exc}); "
                "use redis://host:6379/0 (optionally ?prefix=aenv:)"
            ) from exc
        store = cls(client, shown, prefix)
        try:
            await client.ping()
        except (RedisError, OSError) as exc:
            await store.aclose()
            raise StoreError(
                f"Redis at {shown} does not answer ({_reason(exc)}); "
                "start redis-server or fix --store"
            ) from exc
        return store

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    # -- documents ------------------------------------------------------------------------------

    async def create(self, kind: str, key: str, doc: Document) -> bool:
        """Insert ``doc`` if ``key`` is absent, atomically (``HSETNX``); True if inserted."""
        data = _dumps(doc)
        added = await self._run("create", lambda r: r.hsetnx(self._hash(kind), key, data))
        return bool(added)

    async def put(self, kind: str, key: str, doc: Document) -> None:
        """Insert or replace the document."""
        data = _dumps(doc)
        await self._run("put", lambda r: r.hset(self._hash(kind), key, data))

    async def get(self, kind: str, key: str) -> Document | None:
        """The document, or None."""
        data = await self._run("get", lambda r: r.hget(self._hash(kind), key))
        return None if data is None else self._loads(data, kind, key)

    async def list(self, kind: str) -> dict[str, Document]:
        """Every document of ``kind``, by key (sorted by key)."""
        found: dict[bytes, bytes] = await self._run("list", lambda r: r.hgetall(self._hash(kind)))
        docs = {field.decode(): data for field, data in found.items()}
        return {key: self._loads(docs[key], kind, key) for key in sorted(docs)}

    async def delete(self, kind: str, key: str) -> bool:
        """Remove the document; True if it existed."""
        return bool(await self._run("delete", lambda r: r.hdel(self._hash(kind), key)))

    # -- blobs ----------------------------------------------------------------------------------

    async def put_blob(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` (idempotent: the same digest means the same bytes)."""

        async def put_blob(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(self._blob(digest), bytes(data), nx=True)
                pipe.sadd(self._blobs, digest)
                await pipe.execute()

        await self._run("put_blob", put_blob)

    async def get_blob(self, digest: str) -> bytes | None:
        """The blob, or None."""
        data = await self._run("get_blob", lambda r: r.get(self._blob(digest)))
        return None if data is None else bytes(data)

    async def delete_blob(self, digest: str) -> bool:
        """Remove the blob; True if it existed."""

        async def delete_blob(r: aioredis.Redis) -> bool:
            async with r.pipeline(transaction=True) as pipe:
                pipe.delete(self._blob(digest))
                pipe.srem(self._blobs, digest)
                deleted, _ = await pipe.execute()
            return bool(deleted)

        return bool(await self._run("delete_blob", delete_blob))

    async def list_blobs(self) -> builtins.list[str]:  # `list` is a method here
        """The digests of every stored blob, sorted."""
        members: set[bytes] = await self._run("list_blobs", lambda r: r.smembers(self._blobs))
        return sorted(member.decode() for member in members)

    # -- lifecycle ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connections. Idempotent."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _hash(self, kind: str) -> str:
        return f"{self.prefix}doc:{kind}"

    def _blob(self, digest: str) -> str:
        return f"{self.prefix}blob:{digest}"

    async def _run(self, what: str, operation: Callable[[aioredis.Redis], Awaitable[Any]]) -> Any:
        """Await ``operation`` on the client, translating redis errors."""
        client = self._client
        if client is None:
            raise StoreError(f"Redis store {self.url} is closed; open it again to use it")
        try:
            return await operation(client)
        except (RedisError, OSError) as exc:
            raise StoreError(
                f"Redis at {self.url} failed on {what} ({_reason(exc)}); "
                "check that redis-server runs and that --store points at it"
            ) from exc

    def _loads(self, data: bytes, kind: str, key: str) -> Document:
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise StoreError(
                f"Redis at {self.url}: document {kind}/{key} is not JSON ({exc}); "
                f"something else writes under the prefix {self.prefix!r}: give EnvHub its own"
            ) from exc
        if not isinstance(doc, dict):
            raise StoreError(
                f"Redis at {self.url}: document {kind}/{key} is not a JSON object; "
                f"something else writes under the prefix {self.prefix!r}: give EnvHub its own"
            )
        return doc


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
