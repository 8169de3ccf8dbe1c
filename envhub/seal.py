"""Instance tokens at rest: sealed with the hub's secret, useless to a reader of the store.

The hub must keep each instance's token (its proxy calls the instance's runtime with it, and a
restarted hub, or another hub sharing the store, must too), so a one-way hash will not do: the
store keeps ``token_sealed``, the token encrypted and authenticated (AES-256-GCM, a random nonce
each time, bound to the record's kind and id: a sealed token copied into another record does
not open) under a key derived from the **hub secret**. Whoever reads the store (a Redis
password that leaked, a copy of the SQLite file) learns no token; whoever can write it cannot
plant one that opens.

The hub secret is the operator's: ``AENV_HUB_SECRET`` (or a file, ``aenv serve --secret-file``);
without either, a hub keeps one of its own in ``DATA_DIR/hub-secret`` (mode 0600, made on first
start). Every hub sharing a store must use the same: the store keeps a check value (an HMAC of a
fixed text, which reveals nothing of the secret), and a hub whose secret does not match it
refuses to start with :class:`~aenv_ray.errors.ConfigurationError`. API keys are another matter:
they are kept as digests (:mod:`envhub.keys`), as before.

    >>> seal = TokenSeal(b"x" * 32)
    >>> sealed = seal.seal("t0ken", "instances", "i1")
    >>> seal.open(sealed, "instances", "i1")
    't0ken'

May import: the standard library, ``aenv_ray.errors``, ``envhub.store``; lazily, inside
functions: cryptography (AES-GCM).
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError, StoreError
from envhub.store import Document, Store

__all__ = [
    "SECRET_ENV",
    "SECRET_FILE",
    "SealedStore",
    "TokenSeal",
    "check_secret",
    "hub_secret",
]

SECRET_ENV = "AENV_HUB_SECRET"
"""The variable that holds the hub secret (any text of 16 characters or more)."""
SECRET_FILE = "hub-secret"
"""The file under the hub's data directory that keeps its secret when none is given."""
_META = "meta"  # the store's kind of the hub's own records
_CHECK = "hub-secret"
_PREFIX = "v1:"
_MIN_SECRET = 16


def hub_secret(data_dir: Path, *, given: str | None = None, file: Path | None = None) -> bytes:
    """The hub secret: ``given`` (``AENV_HUB_SECRET``), else ``file``'s contents, else
    ``data_dir``/:data:`SECRET_FILE` (made, random, when missing)."""
    if given is None and file is not None:
        try:
            given = file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the hub secret file {file}: {exc.strerror or exc}"
            ) from exc
    if given is not None:
        if len(given.strip()) < _MIN_SECRET:
            raise ConfigurationError(
                f"the hub secret is shorter than {_MIN_SECRET} characters; use a random one, "
                'e.g. `python -c "import secrets; print(secrets.token_urlsafe(32))"`'
            )
        return given.strip().encode()
    path = data_dir / SECRET_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigurationError(f"cannot read the hub secret {path}: {exc.strerror}") from exc
    made = secrets.token_urlsafe(32).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{SECRET_FILE}.{os.getpid()}")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(made + b"\n")
    try:
        os.link(scratch, path)  # the first hub to make one wins; the others read it
    except FileExistsError:
        made = path.read_bytes().strip()
    finally:
        scratch.unlink()
    return made


class TokenSeal:
    """Seal and open instance tokens with a key derived from the hub secret."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"aenv-hub token seal v1", hashlib.sha256).digest()
        self.check = hmac.new(secret, b"aenv-hub secret check v1", hashlib.sha256).hexdigest()

    def seal(self, token: str, kind: str, key: str) -> str:
        """``token`` encrypted for the record ``kind``/``key``."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = secrets.token_bytes(12)
        sealed = AESGCM(self._key).encrypt(nonce, token.encode(), f"{kind}/{key}".encode())
        return _PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, sealed: str, kind: str, key: str) -> str:
        """The token :meth:`seal` sealed for ``kind``/``key``; :class:`StoreError` when it
        does not open (another hub secret sealed it, or the record was tampered with)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            if not sealed.startswith(_PREFIX):
                raise ValueError("unknown format")
            raw = base64.urlsafe_b64decode(sealed[len(_PREFIX) :])
            plain = AESGCM(self._key).decrypt(raw[:12], raw[12:], f"{kind}/{key}".encode())
        except (ValueError, InvalidTag) as exc:
            raise StoreError(
                f"the token of {kind}/{key} in the store does not open with this hub's secret: "
                f"every hub sharing a store needs the same {SECRET_ENV}"
            ) from exc
        return plain.decode()


async def check_secret(store: Store, seal: TokenSeal) -> None:
    """Record the secret's check value in a store that has none; refuse a secret that is not
    the one the store's hubs use (:class:`ConfigurationError`)."""
    if await store.create(_META, _CHECK, {"check": seal.check}):
        return
    doc = await store.get(_META, _CHECK) or {}
    if not hmac.compare_digest(str(doc.get("check", "")), seal.check):
        raise ConfigurationError(
            "this hub's secret is not the one the hubs sharing its store use (their instance "
            f"tokens are sealed with theirs): give every hub the same {SECRET_ENV} (or "
            f"--secret-file; a hub without either keeps its own in DATA_DIR/{SECRET_FILE})"
        )


class SealedStore:
    """A :class:`~envhub.store.Store` whose documents keep a ``token`` only sealed: written as
    ``token_sealed``, read back as ``token``. Everything else passes through."""

    def __init__(self, inner: Store, seal: TokenSeal) -> None:
        self.inner = inner
        self.seal = seal
        self.url = inner.url

    def __getattr__(self, name: str) -> Any:  # the inner store's own attributes (its path)
        return getattr(self.inner, name)

    def _sealed(self, kind: str, key: str, doc: Document) -> Document:
        token = doc.get("token")
        if "token" not in doc:
            return doc
        out = {k: v for k, v in doc.items() if k != "token"}
        if token:
            out["token_sealed"] = self.seal.seal(str(token), kind, key)
        return out

    def _opened(self, kind: str, key: str, doc: Document | None) -> Document | None:
        if doc is None or "token_sealed" not in doc:
            return doc
        out = {k: v for k, v in doc.items() if k != "token_sealed"}
        out["token"] = self.seal.open(str(doc["token_sealed"]), kind, key)
        return out

    async def create(self, kind: str, key: str, doc: Document) -> bool:
        return await self.inner.create(kind, key, self._sealed(kind, key, doc))

    async def put(self, kind: str, key: str, doc: Document) -> None:
        await self.inner.put(kind, key, self._sealed(kind, key, doc))

    async def get(self, kind: str, key: str) -> Document | None:
        return self._opened(kind, key, await self.inner.get(kind, key))

    async def list(self, kind: str) -> dict[str, Document]:
        docs = await self.inner.list(kind)
        return {k: d for k, v in docs.items() if (d := self._opened(kind, k, v)) is not None}

    async def delete(self, kind: str, key: str) -> bool:
        return await self.inner.delete(kind, key)

    async def put_blob(self, digest: str, data: bytes) -> None:
        await self.inner.put_blob(digest, data)

    async def get_blob(self, digest: str) -> bytes | None:
        return await self.inner.get_blob(digest)

    async def delete_blob(self, digest: str) -> bool:
        return await self.inner.delete_blob(digest)

    async def list_blobs(self) -> builtins.list[str]:
        return await self.inner.list_blobs()

    async def aclose(self) -> None:
        await self.inner.aclose()
