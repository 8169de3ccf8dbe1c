"""The embedded store: EnvHub's documents and blobs in one SQLite file.

:class:`SQLiteStore` keeps two tables, ``docs(kind, key, doc)`` (the document as JSON text) and
``blobs(digest, data)``. Every write is one transaction in WAL mode with ``synchronous=FULL``, so
a crash (even a SIGKILL mid-write) leaves each document whole or absent, and a busy timeout lets
two processes (two hub servers) share one file: :meth:`SQLiteStore.create` is an
``INSERT ... ON CONFLICT DO NOTHING``, atomic across connections and processes.

``sqlite3`` blocks, so every call runs on one worker thread of the store's own, which owns the
connection; the event loop never waits on the disk. Every ``sqlite3`` error leaves as a
:class:`~aenv_ray.errors.StoreError` that names the file and says what to do.

May import: the standard library, ``aenv_ray.errors``, ``envhub.document``.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from aenv_ray.errors import StoreError
from envhub.document import Document

__all__ = ["SQLiteStore"]

T = TypeVar("T")

MEMORY = ":memory:"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
"""


def _dumps(doc: Document) -> str:
    return json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class SQLiteStore:
    """A :class:`~envhub.store.Store` in one SQLite file (or in memory, for ``":memory:"``).

    Open it with :meth:`open`; close it with :meth:`aclose` (or ``async with``).
    """

    def __init__(self, path: str, connection: sqlite3.Connection, worker: ThreadPoolExecutor):
        # private: use `await SQLiteStore.open(path)`, which connects off the event loop
        self.path = path
        self.url = "sqlite:///" + quote(path, safe="/:")
        self._connection: sqlite3.Connection | None = connection
        self._worker = worker

    @classmethod
    async def open(cls, path: str, *, busy_timeout: float = 30.0) -> SQLiteStore:
        """Open (creating if need be) the store at ``path``; its parent directory too.

        ``busy_timeout`` is how long a write waits for another process's write to finish.
        """
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        future = worker.submit(_connect, path, busy_timeout)
        try:
            connection = await asyncio.wrap_future(future)
        except BaseException:
            # cancelled mid-connect: the connection still arrives on the worker; close it there
            future.add_done_callback(_close_connection)
            worker.shutdown(wait=False)
            raise
        return cls(path, connection, worker)

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.url!r})"

    # -- documents ------------------------------------------------------------------------------

    async def create(self, kind: str, key: str, doc: Document) -> bool:
        """Insert ``doc`` if ``key`` is absent, atomically; True if inserted, False if present."""
        text = _dumps(doc)

        def create(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                cursor = db.execute(
                    "INSERT INTO docs (kind, key, doc) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    (kind, key, text),
                )
                return cursor.rowcount == 1

        return await self._run(create)

    async def put(self, kind: str, key: str, doc: Document) -> None:
        """Insert or replace the document."""
        text = _dumps(doc)

        def put(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO docs (kind, key, doc) VALUES (?, ?, ?)"
                    " ON CONFLICT (kind, key) DO UPDATE SET doc = excluded.doc",
                    (kind, key, text),
                )

        await self._run(put)

    async def get(self, kind: str, key: str) -> Document | None:
        """The document, or None."""

        def get(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT doc FROM docs WHERE kind = ? AND key = ?", (kind, key)
            ).fetchone()
            return None if row is None else str(row[0])

        text = await self._run(get)
        return None if text is None else self._loads(text, kind, key)

    async def list(self, kind: str) -> dict[str, Document]:
        """Every document of ``kind``, by key (sorted by key)."""

        def list_(db: sqlite3.Connection) -> list[tuple[str, str]]:
            # TEXT compares as UTF-8 bytes, which orders like Python's str (by code point)
            rows = db.execute("SELECT key, doc FROM docs WHERE kind = ? ORDER BY key", (kind,))
            return [(str(key), str(text)) for key, text in rows]

        return {key: self._loads(text, kind, key) for key, text in await self._run(list_)}

    async def delete(self, kind: str, key: str) -> bool:
        """Remove the document; True if it existed."""

        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                cursor = db.execute("DELETE FROM docs WHERE kind = ? AND key = ?", (kind, key))
                return cursor.rowcount == 1

        return await self._run(delete)

    # -- blobs ----------------------------------------------------------------------------------

    async def put_blob(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` (idempotent: the same digest means the same bytes)."""

        def put_blob(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO blobs (digest, data) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    (digest, bytes(data)),
                )

        await self._run(put_blob)

    async def get_blob(self, digest: str) -> bytes | None:
        """The blob, or None."""

        def get_blob(db: sqlite3.Connection) -> bytes | None:
            row = db.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(get_blob)

    async def delete_blob(self, digest: str) -> bool:
        """Remove the blob; True if it existed."""

        def delete_blob(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                return db.execute("DELETE FROM blobs WHERE digest = ?", (digest,)).rowcount == 1

        return await self._run(delete_blob)

    async def list_blobs(self) -> builtins.list[str]:  # `list` is a method here
        """The digests of every stored blob, sorted."""

        def list_blobs(db: sqlite3.Connection) -> list[str]:
            return [str(row[0]) for row in db.execute("SELECT digest FROM blobs ORDER BY digest")]

        return await self._run(list_blobs)

    # -- lifecycle ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, connection.close)
        except sqlite3.Error as exc:
            raise StoreError(_explain(self.path, exc)) from exc
        finally:
            self._worker.shutdown(wait=False)

    async def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``operation`` on the worker thread, translating sqlite3 errors."""
        connection = self._connection
        if connection is None:
            raise StoreError(f"SQLite store {self.path} is closed; open it again to use it")
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._worker, operation, connection
            )
        except sqlite3.Error as exc:
            raise StoreError(_explain(self.path, exc)) from exc
        except RuntimeError as exc:  # the worker was shut down by a concurrent aclose()
            if self._connection is None:
                raise StoreError(
                    f"SQLite store {self.path} is closed; open it again to use it"
                ) from exc
            raise

    def _loads(self, text: str, kind: str, key: str) -> Document:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise StoreError(
                f"SQLite store {self.path}: document {kind}/{key} is not JSON ({exc}); "
                "the file was changed outside EnvHub: restore it from a backup"
            ) from exc
        if not isinstance(doc, dict):
            raise StoreError(
                f"SQLite store {self.path}: document {kind}/{key} is not a JSON object; "
                "the file was changed outside EnvHub: restore it from a backup"
            )
        return doc


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any error (a failed commit too).

    IMMEDIATE takes the write lock first, waiting out other writers through the busy timeout,
    so a read never has to be upgraded under a stale snapshot.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _close_connection(future: Future[sqlite3.Connection]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def _connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """Open ``path`` in WAL mode with FULL sync and create the tables (on the worker thread)."""
    if path != MEMORY:
        parent = Path(path).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocker = _file_in_the_way(parent)
            reason = (
                f"{blocker} is a file, not a directory"
                if blocker is not None
                else (exc.strerror or str(exc)).lower()
            )
            raise StoreError(
                f"cannot create the directory {parent} of SQLite store {path}: {reason}; "
                "point --store at a writable place"
            ) from exc
    connection: sqlite3.Connection | None = None
    try:
        connection = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if path != MEMORY and str(mode).lower() != "wal":
            raise StoreError(
                f"SQLite store {path} cannot use write-ahead logging (journal mode {mode}); "
                "put it on a local file system"
            )
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        with _transaction(connection):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    connection.execute(statement)
    except sqlite3.Error as exc:
        if connection is not None:
            connection.close()
        raise StoreError(_explain(path, exc)) from exc
    except BaseException:
        if connection is not None:
            connection.close()
        raise
    return connection


def _file_in_the_way(directory: Path) -> Path | None:
    """The nearest existing ancestor of ``directory`` (itself included) if it is not a directory."""
    for candidate in (directory, *directory.parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else candidate
        except OSError:  # cannot even look (permission denied): not a file in the way
            return None
    return None


def _explain(path: str, exc: sqlite3.Error) -> str:
    """What went wrong with the store at ``path``, and what to do about it."""
    text = str(exc)
    lowered = text.lower()
    target = Path(path)
    if "not a database" in lowered:
        return (
            f"SQLite store {path} is not a SQLite database ({text}); "
            "point --store at another file or move it away"
        )
    if "malformed" in lowered or "corrupt" in lowered:
        return (
            f"SQLite store {path} is damaged ({text}); restore it from a backup, "
            "or move it away to start empty"
        )
    if "unable to open" in lowered or "cannot open" in lowered:
        if os.path.isdir(target):  # os.path never raises: a probe must not hide the error
            return (
                f"cannot open SQLite store {path}: it is a directory; "
                f"point --store at a file, e.g. {target / 'hub.db'}"
            )
        if not os.access(target.parent, os.W_OK | os.X_OK) or (
            os.path.exists(target) and not os.access(target, os.R_OK | os.W_OK)
        ):
            reason = "permission denied"
        else:
            reason = text
        return f"cannot open SQLite store {path}: {reason}; point --store at a writable file"
    if "readonly" in lowered or "read-only" in lowered:
        return (
            f"SQLite store {path} is read-only ({text}); "
            "make it (and its directory) writable, or point --store at another file"
        )
    if "locked" in lowered or "busy" in lowered:
        return (
            f"SQLite store {path} stayed locked by another process ({text}); "
            "retry, or stop the other writer"
        )
    if "full" in lowered:
        return f"SQLite store {path} cannot grow ({text}); free disk space"
    return f"SQLite store {path} failed: {text}; check the file and its disk"
