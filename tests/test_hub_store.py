"""The Store conformance suite: one set of behaviours, run over SQLite and over a real Redis.

Every test taking ``store_url`` runs twice: ``sqlite`` (a file in the test's tmp directory) and
``redis`` (the session's redis-server, under a key prefix of the test's own). Then the failures
each backend has of its own: files that are not databases, servers that do not answer, a writer
SIGKILLed mid-write.
"""

from __future__ import annotations

import asyncio
import doctest
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import envhub.store
from aenv_ray.errors import ConfigurationError, StoreError
from envhub.redis_store import RedisStore
from envhub.sqlite_store import SQLiteStore
from envhub.store import Store, open_store
from tests._redis import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty store of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hub.db'}"
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    opened = await open_store(store_url)
    yield opened
    await opened.aclose()


@pytest.fixture
def own_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """A redis-server of the test's own (restarting the session's would disturb other tests);
    asking for ``redis_server`` first skips the test where redis-server is missing."""
    with RedisServer() as server:
        yield server


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- documents --------------------------------------------------------------------------------


async def test_a_store_is_a_store(store: Store, store_url: str) -> None:
    assert isinstance(store, Store)
    assert store.url.split(":", 1)[0] == store_url.split(":", 1)[0]


async def test_create_inserts_once_and_keeps_the_first_document(store: Store) -> None:
    assert await store.create("versions", "echo@1.0.0", {"digest": "ab"}) is True
    assert await store.create("versions", "echo@1.0.0", {"digest": "cd"}) is False
    assert await store.get("versions", "echo@1.0.0") == {"digest": "ab"}
    assert await store.list("versions") == {"echo@1.0.0": {"digest": "ab"}}
    # a deleted key can be created again: create looks at the key, not at its history
    assert await store.delete("versions", "echo@1.0.0") is True
    assert await store.create("versions", "echo@1.0.0", {"digest": "ef"}) is True
    assert await store.get("versions", "echo@1.0.0") == {"digest": "ef"}


async def test_twenty_concurrent_creates_from_separate_connections_have_one_winner(
    store_url: str,
) -> None:
    stores = [await open_store(store_url) for _ in range(20)]
    try:
        won = await asyncio.gather(
            *(s.create("versions", "race@1.0.0", {"writer": i}) for i, s in enumerate(stores))
        )
        assert won.count(True) == 1
        winner = won.index(True)
        for s in stores:  # every connection sees the winner's document
            assert await s.get("versions", "race@1.0.0") == {"writer": winner}
    finally:
        for s in stores:
            await s.aclose()


RACER = textwrap.dedent(
    """
    import asyncio, json, sys
    from envhub.store import open_store

    async def main(url, writer):
        store = await open_store(url)
        print("ready", flush=True)
        sys.stdin.readline()  # "go": every racer starts at once
        won = [k for k in range(40) if await store.create("race", f"key-{k:02d}", {"w": writer})]
        await store.aclose()
        print(json.dumps(won), flush=True)

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def test_creates_race_across_processes_with_one_winner_per_key(store_url: str) -> None:
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, store_url, str(writer)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for writer in range(3)
    ]
    try:
        for racer in racers:
            assert racer.stdout is not None
            assert racer.stdout.readline() == "ready\n"
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        wins = [json.loads(racer.communicate(timeout=60)[0]) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
            racer.wait()
    assert all(racer.returncode == 0 for racer in racers)
    assert sorted(k for won in wins for k in won) == list(range(40))  # each key won exactly once

    async def stored() -> dict[str, object]:
        store = await open_store(store_url)
        try:
            return dict(await store.list("race"))
        finally:
            await store.aclose()

    expected = {f"key-{k:02d}": {"w": writer} for writer, won in enumerate(wins) for k in won}
    assert asyncio.run(stored()) == expected


async def test_put_get_delete_round_trip_unicode_and_nested_json(store: Store) -> None:
    key = "ünïcødé/ключ@1.0 🚀 \"quoted\" 'x' %20"
    doc = {
        "name": "日本語 ✓",
        "nested": {"list": [1, 2.5, -3, None, True, False, {"deep": ["a", {"b": {}}]}]},
        "empty": {},
        "escapes": "tab\t newline\n nul\u0000 backslash\\",
        "big": 2**53,
    }
    assert await store.get("instances", key) is None
    await store.put("instances", key, doc)
    assert await store.get("instances", key) == doc
    await store.put("instances", key, {"replaced": [1]})
    assert await store.get("instances", key) == {"replaced": [1]}
    assert await store.list("instances") == {key: {"replaced": [1]}}
    assert await store.delete("instances", key) is True
    assert await store.delete("instances", key) is False
    assert await store.get("instances", key) is None
    assert await store.list("instances") == {}


async def test_list_is_sorted_by_key(store: Store) -> None:
    keys = ["b", "a", "B", "a@2", "a@10", "z", "é", "ß", "日本", "🚀", "A-1", "0", "~"]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    for n, key in enumerate(shuffled):
        await store.put("versions", key, {"n": n})
    listed = await store.list("versions")
    assert list(listed) == sorted(keys)
    assert all(listed[key] == {"n": shuffled.index(key)} for key in keys)


async def test_kinds_are_isolated_from_each_other(store: Store) -> None:
    await store.put("a", "k", {"from": "a"})
    await store.put("b", "k", {"from": "b"})
    await store.put("a:b", "k", {"from": "a:b"})
    assert await store.create("b", "k", {"from": "b2"}) is False
    assert await store.create("c", "k", {"from": "c"}) is True
    assert await store.get("a", "k") == {"from": "a"}
    assert await store.list("a") == {"k": {"from": "a"}}
    assert await store.list("a:b") == {"k": {"from": "a:b"}}
    assert await store.delete("a", "k") is True
    assert await store.get("b", "k") == {"from": "b"}
    assert await store.get("c", "k") == {"from": "c"}
    assert await store.list("a") == {}
    assert await store.list("never-written") == {}


# -- blobs ------------------------------------------------------------------------------------


async def test_blobs_put_get_list_delete(store: Store) -> None:
    blobs = {_digest(data): data for data in (b"one", b"two", b"\x00\xff binary \x00", b"")}
    assert await store.list_blobs() == []
    for digest, data in blobs.items():
        assert await store.get_blob(digest) is None
        await store.put_blob(digest, data)
    for digest, data in blobs.items():
        assert await store.get_blob(digest) == data
    assert await store.list_blobs() == sorted(blobs)
    gone = _digest(b"one")
    assert await store.delete_blob(gone) is True
    assert await store.delete_blob(gone) is False
    assert await store.get_blob(gone) is None
    assert await store.list_blobs() == sorted(set(blobs) - {gone})
    # blobs and documents do not share a namespace
    assert await store.list(gone) == {}


async def test_put_blob_is_idempotent(store: Store) -> None:
    data = b"bundle bytes"
    digest = _digest(data)
    await store.put_blob(digest, data)
    await store.put_blob(digest, data)
    await asyncio.gather(*(store.put_blob(digest, data) for _ in range(5)))
    assert await store.list_blobs() == [digest]
    assert await store.get_blob(digest) == data
    assert await store.delete_blob(digest) is True
    assert await store.list_blobs() == []


async def test_a_large_blob_round_trips(store: Store) -> None:
    data = os.urandom(8 << 20)
    digest = _digest(data)
    await store.put_blob(digest, data)
    got = await store.get_blob(digest)
    assert got is not None
    assert len(got) == len(data)
    assert _digest(got) == digest


# -- lifecycle and durability -----------------------------------------------------------------


async def _fill(store: Store) -> None:
    await store.put("versions", "echo@1.0.0", {"digest": "ab", "tags": ["latest"]})
    await store.create("keys", "ключ", {"tenant": "t1"})
    await store.put_blob(_digest(b"bundle"), b"bundle")


async def _check_filled(store: Store) -> None:
    assert await store.list("versions") == {"echo@1.0.0": {"digest": "ab", "tags": ["latest"]}}
    assert await store.get("keys", "ключ") == {"tenant": "t1"}
    assert await store.create("keys", "ключ", {"tenant": "t2"}) is False
    assert await store.list_blobs() == [_digest(b"bundle")]
    assert await store.get_blob(_digest(b"bundle")) == b"bundle"


async def test_data_survives_close_and_reopen(store_url: str) -> None:
    first = await open_store(store_url)
    await _fill(first)
    await first.aclose()
    second = await open_store(store_url)
    try:
        await _check_filled(second)
    finally:
        await second.aclose()


async def test_the_url_attribute_opens_the_same_store(store_url: str) -> None:
    first = await open_store(store_url)
    try:
        await _fill(first)
        second = await open_store(first.url)
        try:
            await _check_filled(second)
        finally:
            await second.aclose()
    finally:
        await first.aclose()


async def test_aclose_is_idempotent_and_a_closed_store_says_so(store_url: str) -> None:
    store = await open_store(store_url)
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await store.get("versions", "x")
    with pytest.raises(StoreError, match="closed"):
        await store.put_blob("d", b"x")


async def test_redis_data_survives_a_server_restart(own_redis: RedisServer) -> None:
    url = own_redis.url + "?prefix=restart:"
    store = await open_store(url)
    try:
        await _fill(store)
        own_redis.restart()
        await _check_filled(store)  # the open store reconnects by itself
        fresh = await open_store(url)
        try:
            await _check_filled(fresh)
        finally:
            await fresh.aclose()
    finally:
        await store.aclose()


async def test_the_default_prefix_is_aenv(redis_server: RedisServer) -> None:
    store = await RedisStore.open(redis_server.url)
    try:
        assert store.prefix == "aenv:"
        assert store.url == redis_server.url
    finally:
        await store.aclose()


async def test_the_store_docstring_example_runs() -> None:
    # doctest's asyncio.run needs a thread without a running loop
    result = await asyncio.to_thread(doctest.testmod, envhub.store)
    assert result.attempted > 0
    assert result.failed == 0


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["ftp://host/hub", "postgres://localhost/hub", "hub.db"])
async def test_an_unknown_scheme_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="unknown scheme"):
        await open_store(url)


async def test_an_unreachable_redis_is_a_store_error_naming_it_without_its_password() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(StoreError) as caught:
        await open_store(f"redis://:sekrit@127.0.0.1:{port}/0")
    message = str(caught.value)
    assert f"redis://127.0.0.1:{port}/0" in message
    assert "does not answer" in message
    assert "start redis-server or fix --store" in message
    assert "sekrit" not in message


async def test_a_redis_that_goes_away_is_a_store_error(own_redis: RedisServer) -> None:
    store = await open_store(own_redis.url)
    try:
        own_redis.stop()
        with pytest.raises(StoreError, match=f"Redis at redis://127.0.0.1:{own_redis.port}/0"):
            await store.get("versions", "x")
    finally:
        await store.aclose()


async def test_a_sqlite_path_that_is_a_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory") as caught:
        await open_store(f"sqlite:///{tmp_path}")
    assert str(tmp_path) in str(caught.value)


async def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database\n" * 100)
    with pytest.raises(StoreError) as caught:
        await open_store(f"sqlite:///{path}")
    message = str(caught.value)
    assert str(path) in message
    assert "not a SQLite database" in message
    assert "point --store at another file or move it away" in message
    assert path.read_bytes().startswith(b"these are my notes")  # left untouched


async def test_a_sqlite_path_under_a_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "sub" / "hub.db"
    with pytest.raises(StoreError, match="is a file, not a directory") as caught:
        await open_store(f"sqlite:///{path}")
    assert str(path) in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes every file")
def test_an_unwritable_sqlite_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"

    async def open_and_write() -> None:
        store = await SQLiteStore.open(str(path))
        try:
            await store.put("versions", "x", {})
        finally:
            await store.aclose()

    asyncio.run(open_and_write())
    tmp_path.chmod(0o500)
    path.chmod(0o400)
    try:
        with pytest.raises(StoreError) as caught:
            asyncio.run(open_and_write())
        assert str(path) in str(caught.value)
    finally:
        tmp_path.chmod(0o700)
        path.chmod(0o600)


async def test_the_sqlite_parent_directory_is_created_and_relative_paths_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:///data/hubs/hub.db")
    try:
        assert store.url == "sqlite:///data/hubs/hub.db"
        await store.put("versions", "x", {"ok": True})
    finally:
        await store.aclose()
    assert (tmp_path / "data" / "hubs" / "hub.db").is_file()


WRITER = textwrap.dedent(
    """
    import asyncio, hashlib, sys
    from envhub.sqlite_store import SQLiteStore

    async def main(path):
        store = await SQLiteStore.open(path)
        n = 0
        while True:
            payload = (str(n) * 20000)[: 60000 + n % 5000]
            doc = {"n": n, "payload": payload, "sha": hashlib.sha256(payload.encode()).hexdigest()}
            await store.put("crash", f"doc-{n % 50:02d}", doc)  # replaces: torn would show
            await store.create("crash-new", f"doc-{n:06d}", doc)
            if n == 100:
                print("ready", flush=True)
            n += 1

    asyncio.run(main(sys.argv[1]))
    """
)


def test_a_sigkilled_writer_leaves_only_whole_documents(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "ready\n"  # 100 rounds in, still writing
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        if writer.stdout:
            writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL

    async def check() -> None:
        store = await SQLiteStore.open(str(path))
        try:
            replaced = await store.list("crash")
            created = await store.list("crash-new")
            assert len(replaced) == 50
            assert len(created) > 100
            for doc in [*replaced.values(), *created.values()]:
                assert set(doc) == {"n", "payload", "sha"}
                assert hashlib.sha256(doc["payload"].encode()).hexdigest() == doc["sha"]
                assert doc["payload"].startswith(str(doc["n"]))
            for key, doc in replaced.items():
                assert key == f"doc-{doc['n'] % 50:02d}"
            # and the store still works
            assert await store.create("crash-new", "after", {"ok": True}) is True
            await store.put("crash", "doc-00", {"ok": True})
            assert await store.get("crash", "doc-00") == {"ok": True}
        finally:
            await store.aclose()

    asyncio.run(check())
    check_db = sqlite3.connect(path)
    try:
        assert check_db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        check_db.close()
