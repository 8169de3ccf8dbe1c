"""The hub's storage contract: JSON documents by kind and key, and content-addressed blobs.

Everything EnvHub remembers goes through a :class:`Store`: published versions, instance and
service records, API keys (documents), and bundles (blobs, keyed by their sha256 digest). Two
implementations pass one conformance suite (``tests/test_hub_store.py``):

- ``sqlite:///path/to/hub.db``: :class:`envhub.sqlite_store.SQLiteStore`, the embedded default
  (one file; every write is one transaction, so a crash leaves each document whole or absent);
- ``redis://host:port/db``: :class:`envhub.redis_store.RedisStore`, for hubs that share state.

The registry's guarantees rest on :meth:`Store.create`: it inserts a document only when the key
is absent, atomically, so two hubs publishing one version at once see exactly one ``True``.

    >>> import asyncio
    >>> async def demo():
    ...     store = await open_store("sqlite:///:memory:")
    ...     first = await store.create("versions", "echo@1.0.0", {"digest": "ab"})
    ...     second = await store.create("versions", "echo@1.0.0", {"digest": "cd"})
    ...     doc = await store.get("versions", "echo@1.0.0")
    ...     await store.aclose()
    ...     return first, second, doc
    >>> asyncio.run(demo())
    (True, False, {'digest': 'ab'})

May import: the standard library, ``aenv_ray.errors``, ``envhub`` (the stores it opens; redis
only inside ``envhub.redis_store``); lazily, inside functions: platformdirs (the default
store's place).
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from aenv_ray.errors import ConfigurationError
from envhub.document import Document

__all__ = ["Document", "Store", "default_store_url", "open_store"]


@runtime_checkable
class Store(Protocol):
    """Documents grouped by ``kind`` (``"versions"``, ``"instances"``, ...) and blobs by digest.

    Kinds and keys are non-empty strings without NUL. Every method raises
    :class:`~aenv_ray.errors.StoreError` when the backend fails (file unwritable, Redis gone),
    never a backend-specific exception.
    """

    url: str

    async def create(self, kind: str, key: str, doc: Document) -> bool:
        """Insert ``doc`` if ``key`` is absent, atomically; True if inserted, False if present."""
        ...

    async def put(self, kind: str, key: str, doc: Document) -> None:
        """Insert or replace the document."""
        ...

    async def get(self, kind: str, key: str) -> Document | None:
        """The document, or None."""
        ...

    async def list(self, kind: str) -> dict[str, Document]:
        """Every document of ``kind``, by key (sorted by key)."""
        ...

    async def delete(self, kind: str, key: str) -> bool:
        """Remove the document; True if it existed."""
        ...

    async def put_blob(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` (idempotent: the same digest means the same bytes)."""
        ...

    async def get_blob(self, digest: str) -> bytes | None:
        """The blob, or None."""
        ...

    async def delete_blob(self, digest: str) -> bool:
        """Remove the blob; True if it existed."""
        ...

    async def list_blobs(self) -> builtins.list[str]:  # `list` is a method here
        """The digests of every stored blob, sorted."""
        ...

    async def aclose(self) -> None:
        """Release connections and files. Idempotent."""
        ...


def default_store_url() -> str:
    """``sqlite:///<user data dir>/aenv-ray/hub.db``: the embedded default store."""
    import platformdirs

    return "sqlite:///" + str(Path(platformdirs.user_data_dir("aenv-ray")) / "hub.db")


async def open_store(url: str | None = None) -> Store:
    """Open the store named by ``url`` (default :func:`default_store_url`).

    ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite:///:memory:``;
    ``redis://[:password@]host[:port][/db]`` (``rediss://`` for TLS). Raises
    :class:`~aenv_ray.errors.ConfigurationError` for any other scheme and
    :class:`~aenv_ray.errors.StoreError` when the store cannot be reached.
    """
    url = url or default_store_url()
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        from envhub.sqlite_store import SQLiteStore

        path = unquote(url[len("sqlite://") :])
        path = path[1:] if path.startswith("/") else path  # sqlite:////abs keeps one slash
        return await SQLiteStore.open(path or ":memory:")
    if scheme in ("redis", "rediss", "unix"):
        from envhub.redis_store import RedisStore

        return await RedisStore.open(url)
    raise ConfigurationError(
        f"store URL `{url}` has an unknown scheme; use sqlite:///path/to/hub.db or "
        "redis://host:6379/0"
    )
