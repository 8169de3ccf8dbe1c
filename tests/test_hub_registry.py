"""The registry over real hubs (``aenv serve`` subprocesses), on each store: SQLite and Redis.

A new user's walkthrough (init -> build -> push -> list -> Environment -> call), versions and
search, immutability, tenants, and robustness: concurrent pushes, crashes mid-push, corrupt and
oversize uploads, restarts.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_cli._scaffold import write_project
from aenv_ray import Environment
from aenv_ray.bundle import Bundle, build_bundle, digest_of
from aenv_ray.errors import (
    ArtifactError,
    ArtifactTooLargeError,
    AuthenticationError,
    EnvironmentNotFoundError,
    PermissionDeniedError,
    StoreError,
    VersionConflictError,
)
from aenv_ray.hub import HubClient
from envhub.keys import create_key, revoke_key
from envhub.store import open_store
from tests._cli import aenv as run_cli
from tests._cli import environment
from tests._hub import HubProcess, eventually, raw
from tests._redis import RedisServer


async def _keys(store_url: str) -> dict[str, str]:
    store = await open_store(store_url)
    try:
        return {t: (await create_key(store, tenant=t))[1] for t in ("alice", "bob")}
    finally:
        await store.aclose()


class Hub:
    """A running hub and its tenants' keys."""

    def __init__(self, process: HubProcess, keys: dict[str, str]) -> None:
        self.process = process
        self.url = process.url
        self.keys = keys

    def client(self, tenant: str = "alice") -> HubClient:
        return HubClient(self.url, api_key=self.keys[tenant])

    def env(self, tenant: str = "alice") -> dict[str, str]:
        return {**os.environ, "AENV_SYSTEM_URL": self.url, "AENV_API_KEY": self.keys[tenant]}


def _store_url(kind: str, tmp: Path, redis: RedisServer | None) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp}/hub.db"
    assert redis is not None
    return f"{redis.url}?prefix=hub-{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def hub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A hub with auth on, engine in-process, on each store: on SQLite the session's
    (``shared_hub``: nothing here tests its lifecycle or flags, and every name published here
    is the test's own), on Redis one of this module's, with keys of this module's own."""
    if request.param == "sqlite":
        shared: HubProcess = request.getfixturevalue("shared_hub")
        yield Hub(shared, asyncio.run(_keys(shared.store)))
        return
    redis = request.getfixturevalue("redis_server")
    tmp = tmp_path_factory.mktemp(f"hub-{request.param}")
    store = _store_url(request.param, tmp, redis)
    keys = asyncio.run(_keys(store))
    with HubProcess(tmp, store=store) as process:
        yield Hub(process, keys)


_counter = iter(range(1_000_000))


def make_project(
    root: Path, name: str, version: str = "1.0.0", *, tags: list[str] | None = None, note: str = ""
) -> Path:
    """What `aenv init NAME` writes, at ``version``, with ``tags``; ``note`` changes the code."""
    project = root / f"{name}-{version}-{next(_counter)}"
    write_project(project, name)
    config = json.loads((project / "config.json").read_text())
    config.update(version=version, tags=tags or [])
    (project / "config.json").write_text(json.dumps(config, indent=2))
    if note:
        source = next((project / "src").glob("*.py"))
        source.write_text(source.read_text() + f"\n# {note}\n")
    return project


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# -- the walkthrough -------------------------------------------------------------------------------


def test_new_user_walkthrough(hub: Hub, tmp_path: Path) -> None:
    name = unique("demo")
    env = hub.env()
    cli = {"cwd": tmp_path, "environ": env}  # the CLI in this process (tests/_cli.py)
    assert run_cli("init", name, **cli).returncode == 0  # type: ignore[arg-type]
    built = run_cli("build", name, "--json", "--no-image", **cli)  # type: ignore[arg-type]
    assert built.returncode == 0, built.stderr
    manifest = json.loads(built.stdout)
    pushed = run_cli("push", name, **cli)  # type: ignore[arg-type]
    assert pushed.returncode == 0, pushed.stderr
    assert f"published {name}@1.0.0" in pushed.stdout
    listed = run_cli("list", "--json", **cli)  # type: ignore[arg-type]
    assert name in [e["name"] for e in json.loads(listed.stdout)]
    got = run_cli("get", f"{name}@1.0.0", "--json", **cli)  # type: ignore[arg-type]
    record = json.loads(got.stdout)
    assert record["digest"] == manifest["digest"]  # what was built is what is served
    assert {"type": "bundle", "digest": manifest["digest"], "size": manifest["size"]} in record[
        "config"
    ]["artifacts"]

    # the user's script, in this process with the user's environment (the hub and key from
    # AENV_SYSTEM_URL and AENV_API_KEY, as a script of theirs reads them)
    async def episode() -> tuple[str, float]:
        async with Environment(f"{name}@1.0.0") as instance:
            note = (await instance.call_tool("add_note", {"text": "buy milk"})).text
            return note, await instance.call_reward({"expected": "milk"})

    with environment(environ=env, cwd=tmp_path):
        note, reward = asyncio.run(episode())
    assert "buy milk" in note
    assert reward == 1.0

    dest = tmp_path / "pulled"
    pulled = run_cli("pull", f"{name}@1.0.0", "--dest", str(dest), **cli)  # type: ignore[arg-type]
    assert pulled.returncode == 0, pulled.stderr
    original = sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name / "src").rglob("*"))
    assert sorted(p.relative_to(dest) for p in (dest / "src").rglob("*")) == original
    assert (dest / "config.json").read_text() == (tmp_path / name / "config.json").read_text()


# -- versions, search, deprecation ---------------------------------------------------------


async def test_versions_latest_search_and_tags(hub: Hub, tmp_path: Path) -> None:
    name = unique("tasks")
    async with hub.client() as client:
        for version in ("1.0.0", "1.2.0", "1.10.0"):
            project = make_project(tmp_path, name, version, tags=["terminal", "swe"])
            await client.push(build_bundle(project).data)
        assert [v["version"] for v in await client.versions(name)] == ["1.0.0", "1.2.0", "1.10.0"]
        assert (await client.get_version(name))["version"] == "1.10.0"  # version order, not text

        await client.deprecate(name, "1.10.0", message="broken reward; use 1.2.0")
        latest = await client.get_version(name)
        assert latest["version"] == "1.2.0"
        deprecated = await client.get_version(name, "1.10.0")  # still there by its number
        assert deprecated["deprecated"]
        assert "broken reward" in deprecated["deprecation"]

        found = await client.search(tags=["terminal", "swe"])
        mine = next(e for e in found if e["name"] == name)
        assert mine["latest"] == "1.2.0"
        assert mine["versions"] == ["1.0.0", "1.2.0"]
        assert name in [e["name"] for e in await client.search(name[3:].upper())]
        assert name not in [e["name"] for e in await client.search(tags=["gpu"])]
        assert (await client.tags())["terminal"] >= 1

        await client.deprecate(name, "1.10.0", deprecated=False)
        assert (await client.get_version(name))["version"] == "1.10.0"
        with pytest.raises(EnvironmentNotFoundError, match=r"published versions: .*1\.2\.0"):
            await client.get_version(name, "9.9.9")
        with pytest.raises(EnvironmentNotFoundError, match="did you mean"):
            await client.get_version(name + "x")


async def test_published_versions_are_immutable_and_never_reused(hub: Hub, tmp_path: Path) -> None:
    name = unique("immutable")
    first = build_bundle(make_project(tmp_path, name, note="first"))
    second = build_bundle(make_project(tmp_path, name, note="second"))
    assert first.digest != second.digest
    async with hub.client() as client:
        await client.push(first.data)
        with pytest.raises(VersionConflictError, match="immutable") as other:
            await client.push(second.data)
        assert other.value.existing_digest == first.digest
        with pytest.raises(VersionConflictError, match="this very bundle"):
            await client.push(first.data)
        record, data = await client.pull(name, "1.0.0")
        assert data == first.data
        assert record["digest"] == first.digest

        await client.delete_version(name, "1.0.0")
        with pytest.raises(EnvironmentNotFoundError, match="was deleted"):
            await client.get_version(name, "1.0.0")
        for data in (second.data, first.data):  # the deleted bundle itself too
            with pytest.raises(VersionConflictError, match="deleted and is not published") as gone:
                await client.push(data)
            assert gone.value.existing_digest is None  # nothing is published under it
            assert '"version": "1.0.1"' in str(gone.value)
        bumped = build_bundle(make_project(tmp_path, name, "1.0.1"))
        assert (await client.push(bumped.data))["ref"] == f"{name}@1.0.1"
        with pytest.raises(VersionConflictError, match=r'immutable\. Set "version": "1\.0\.2"'):
            await client.push(build_bundle(make_project(tmp_path, name, "1.0.1", note="x")).data)


def test_pushing_a_deleted_version_says_so_and_names_the_next_free_one(
    hub: Hub, tmp_path: Path
) -> None:
    """Through the CLI, as a user would: the re-push of a deleted version (the very same project)
    is never reported as published, and names the version to use instead."""
    name = unique("deleted")
    project = make_project(tmp_path, name, "2.3.0")
    env = hub.env()
    pushed = run_cli("push", str(project), environ=env)
    assert pushed.returncode == 0, pushed.stderr
    deleted = run_cli("delete", f"{name}@2.3.0", "--yes", environ=env)
    assert deleted.returncode == 0, deleted.stderr
    again = run_cli("push", str(project), environ=env)
    assert again.returncode == 2, again
    assert again.stdout == ""  # no "published", no "already published"
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, again.stderr
    assert f"`{name}@2.3.0` was deleted and is not published" in lines[0]
    assert '"version": "2.3.1"' in lines[0]


async def test_a_name_belongs_to_the_tenant_that_published_it(hub: Hub, tmp_path: Path) -> None:
    name = unique("owned")
    async with hub.client("alice") as alice, hub.client("bob") as bob:
        await alice.push(build_bundle(make_project(tmp_path, name)).data)
        with pytest.raises(PermissionDeniedError, match="belongs to tenant `alice`"):
            await bob.push(build_bundle(make_project(tmp_path, name, "2.0.0")).data)
        with pytest.raises(PermissionDeniedError):
            await bob.deprecate(name, "1.0.0")
        with pytest.raises(PermissionDeniedError):
            await bob.delete_version(name, "1.0.0")
        assert (await bob.get_version(name))["publisher"] == "alice"  # reading is open
        await alice.push(build_bundle(make_project(tmp_path, name, "2.0.0")).data)


ORPHAN = b"bundle bytes of a push that never finished"


@pytest.fixture(scope="module")
def old_store_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A hub started (once) on a store that hubs of before left behind: name claims from
    before name keys (only the exact name's claim, and an old squat), and the bundle of a
    push killed between storing it and recording its version. The tests of what a hub does
    with such a store when it starts share it."""
    tmp = tmp_path_factory.mktemp("old-store")
    store_url = f"sqlite:///{tmp}/hub.db"

    async def seed() -> dict[str, str]:
        keys = await _keys(store_url)
        store = await open_store(store_url)
        try:
            await store.create("names", "old-notes", {"tenant": "alice", "at": 1.0})
            await store.create("names", "Old_Notes", {"tenant": "bob", "at": 2.0})  # a squat
            await store.put_blob(digest_of(ORPHAN), ORPHAN)
            await store.put("uploads", digest_of(ORPHAN), {"started_at": time.time() - 7200})
        finally:
            await store.aclose()
        return keys

    keys = asyncio.run(seed())
    with HubProcess(tmp, store=store_url) as process:
        yield Hub(process, keys)


async def test_names_claimed_before_lookalike_checks_are_guarded_after_an_upgrade(
    old_store_hub: Hub, tmp_path: Path
) -> None:
    # a store written by a hub from before name keys: only the exact name's claim
    async with old_store_hub.client("bob") as bob:
        for squat in ("old-notes", "OLD-NOTES", "Old_Notes", "o1d-notes"):
            with pytest.raises(PermissionDeniedError, match="belongs to tenant `alice`"):
                await bob.push(build_bundle(make_project(tmp_path, squat)).data)
    async with old_store_hub.client("alice") as alice:
        published = await alice.push(build_bundle(make_project(tmp_path, "old-notes")).data)
        assert published["publisher"] == "alice"


async def test_requests_need_a_valid_key(hub: Hub) -> None:
    async with HubClient(hub.url) as anonymous:
        assert (await anonymous.health())["auth"] is True
        with pytest.raises(AuthenticationError, match="needs an API key"):
            await anonymous.search()
    async with HubClient(hub.url, api_key="aenv_0123456789ab_" + "x" * 30) as forged:
        with pytest.raises(AuthenticationError, match="unknown"):
            await forged.search()
    async with HubClient(hub.url, api_key="not-a-key") as malformed:
        with pytest.raises(AuthenticationError, match="Bearer"):
            await malformed.whoami()
    async with hub.client("bob") as bob:
        assert (await bob.whoami())["tenant"] == "bob"


async def test_a_revoked_key_is_refused_at_once(hub: Hub) -> None:
    store = await open_store(hub.process.store)
    try:
        key, secret = await create_key(store, tenant="carol")
        async with HubClient(hub.url, api_key=secret) as carol:
            assert (await carol.whoami())["tenant"] == "carol"
            await revoke_key(store, key.id)
            with pytest.raises(AuthenticationError, match="revoked"):
                await carol.whoami()
    finally:
        await store.aclose()


# -- concurrency -----------------------------------------------------------------------------------


async def push_at_once(clients: list[HubClient], bundles: list[Bundle]) -> list[object]:
    """Each client pushes its bundle, all at once; the records and errors, in order."""
    try:
        return await asyncio.gather(
            *(c.push(b.data) for c, b in zip(clients, bundles, strict=True)),
            return_exceptions=True,
        )
    finally:
        for client in clients:
            await client.aclose()


async def test_concurrent_pushes_of_one_version_one_wins(hub: Hub, tmp_path: Path) -> None:
    name = unique("race")
    bundles = [build_bundle(make_project(tmp_path, name, note=f"n{i}")) for i in range(6)]
    results = await push_at_once([hub.client() for _ in bundles], bundles)
    winners = [r for r in results if isinstance(r, dict)]
    losers = [r for r in results if isinstance(r, VersionConflictError)]
    assert len(winners) == 1, results
    assert len(losers) == len(bundles) - 1, results
    async with hub.client() as client:
        assert (await client.get_version(name, "1.0.0"))["digest"] == winners[0]["digest"]


async def test_two_hubs_on_one_store_still_publish_a_version_once(hub: Hub, tmp_path: Path) -> None:
    name = unique("shared")
    with HubProcess(tmp_path / "second", store=hub.process.store) as second:
        bundles = [build_bundle(make_project(tmp_path, name, note=f"h{i}")) for i in range(4)]
        clients = [
            HubClient(url, api_key=hub.keys["alice"])
            for url in (hub.url, second.url, hub.url, second.url)
        ]
        results = await push_at_once(clients, bundles)
        assert sum(isinstance(r, dict) for r in results) == 1, results
        assert sum(isinstance(r, VersionConflictError) for r in results) == 3, results
        async with HubClient(second.url, api_key=hub.keys["alice"]) as client:
            assert (await client.get_version(name, "1.0.0"))["publisher"] == "alice"


# -- bad uploads -----------------------------------------------------------------------------------


async def test_corrupt_uploads_are_rejected_and_nothing_is_published(
    hub: Hub, tmp_path: Path
) -> None:
    name = unique("corrupt")
    good = build_bundle(make_project(tmp_path, name))
    async with hub.client() as client:
        with pytest.raises(ArtifactError, match="corrupted"):
            await client.push(good.data, digest=digest_of(b"something else"))
        flipped = bytearray(good.data)
        flipped[len(flipped) // 2] ^= 0xFF
        with pytest.raises(ArtifactError):
            await client.push(bytes(flipped))
        with pytest.raises(ArtifactError):
            await client.push(good.data[: len(good.data) // 2])
        with pytest.raises(ArtifactError):
            await client.push(b"definitely not a tarball")
        with pytest.raises(ArtifactError, match="empty"):
            await client.push(b"")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            info = tarfile.TarInfo("../escape.py")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(ArtifactError, match="escape"):
            await client.push(buffer.getvalue())
        with pytest.raises(EnvironmentNotFoundError):
            await client.get_version(name, "1.0.0")
        await client.push(good.data)  # the real one still goes in


async def test_oversize_uploads_are_rejected(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/hub.db"
    with HubProcess(tmp_path, store=store, auth=False, extra=["--max-bundle", "4K"]) as small:
        project = make_project(tmp_path, "big")
        (project / "src" / "blob.py").write_text("DATA = " + repr(os.urandom(8000).hex()) + "\n")
        bundle = build_bundle(project)
        assert len(bundle.data) > 4096
        async with HubClient(small.url) as client:
            with pytest.raises(ArtifactTooLargeError, match="at most 4096"):
                await client.push(bundle.data)

            async def chunks() -> object:  # no Content-Length: the hub counts as it reads
                for start in range(0, len(bundle.data), 1024):
                    yield bundle.data[start : start + 1024]

            with pytest.raises(ArtifactTooLargeError, match="over 4096"):
                await client.request(
                    "POST",
                    "/v1/envs",
                    data=chunks(),  # type: ignore[arg-type]
                    headers={"Content-Type": "application/gzip"},
                )
            with pytest.raises(EnvironmentNotFoundError):
                await client.get_version("big")


# -- crashes and restarts ------------------------------------------------------------------------


def _half_upload(url: str, size: int) -> socket.socket:
    """Start a push that promises ``size`` bytes and sends half of them."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        (
            f"POST /v1/envs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/gzip\r\n"
            f"Content-Length: {size}\r\n\r\n"
        ).encode()
        + b"\x1f\x8b" * (size // 4)
    )
    return sock


async def test_a_crash_mid_push_leaves_no_partial_version(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/hub.db"
    project = make_project(tmp_path, "crashy")
    bundle = build_bundle(project)
    with HubProcess(tmp_path, store=store, auth=False) as process:
        _half_upload(process.url, 200_000).close()  # the client dies mid-upload
        async with HubClient(process.url) as client:
            with pytest.raises(EnvironmentNotFoundError):
                await client.get_version("crashy")
        pending = _half_upload(process.url, 200_000)
        process.kill()  # the hub dies mid-upload
        pending.close()
        process.start()
        async with HubClient(process.url) as client:
            with pytest.raises(EnvironmentNotFoundError):
                await client.get_version("crashy")
            assert (await client.push(bundle.data))["digest"] == bundle.digest


async def test_a_restarted_hub_drops_bundles_of_pushes_that_crashed(old_store_hub: Hub) -> None:
    # what a hub killed between storing a bundle and recording its version leaves behind
    # (ORPHAN, in old_store_hub's store before it started) is gone once the hub serves
    store = await open_store(old_store_hub.process.store)
    try:
        assert await store.get_blob(digest_of(ORPHAN)) is None
        assert await store.get("uploads", digest_of(ORPHAN)) is None
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_restarted_hub_keeps_versions_and_live_instances_and_reaps_expired(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    store = _store_url(kind, tmp_path, redis)
    keys = await _keys(store)
    name = unique("durable")
    bundle = build_bundle(make_project(tmp_path, name))
    with HubProcess(tmp_path / "hub", store=store, engine="daemon") as process:
        async with HubClient(process.url, api_key=keys["alice"]) as client:
            await client.push(bundle.data)
            keeper = await client.create_instance(f"{name}@1.0.0", ttl="1h")
            brief = await client.create_instance(f"{name}@1.0.0", ttl=2)
        process.kill()  # a crash: no cleanup at all
        # brief's TTL runs out while the hub is down: until its expiry, not a fixed time
        await asyncio.sleep(max(0.0, brief["expires_at"] - time.time()) + 0.05)
        process.start()
        async with HubClient(process.url, api_key=keys["alice"]) as client:
            assert (await client.get_version(name, "1.0.0"))["digest"] == bundle.digest
            alive = await client.get_instance(keeper["id"])
            assert alive["state"] == "running"
            assert alive["url"] == keeper["url"]
            ended = await client.get_instance(brief["id"])
            assert ended["state"] == "terminated"
            assert ended["reason"] == "expired"
            listed = {i["id"] for i in await client.list_instances()}
            assert keeper["id"] in listed
            assert brief["id"] not in listed
        async with Environment.attach(keeper["url"], token=keeper.get("token")) as env:
            result = await env.call_tool("add_note", {"text": "still here"})
            assert not result.is_error, result.text


async def test_health_reports_the_store(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (scripts/setup installs it)")
    with RedisServer() as redis:  # a server of its own: this test stops it
        store = f"{redis.url}?prefix=health-{uuid.uuid4().hex[:8]}:"
        key = (await _keys(store))["alice"]
        with HubProcess(tmp_path, store=store) as process:
            async with (
                HubClient(process.url) as anonymous,
                HubClient(process.url, api_key=key) as alice,
            ):
                health = await anonymous.health()
                assert health["status"] == "ok"
                assert health["store"] == {"ok": True, "detail": "redis answers"}
                assert await alice.search() is not None

                redis.stop()
                degraded = await anonymous.health()  # a 503 with the body, not an error
                assert degraded["status"] == "degraded"
                assert degraded["store"]["ok"] is False
                assert redis.url.split("/0")[0] in degraded["store"]["detail"]
                assert "redis-server" in degraded["store"]["detail"]  # what to do
                with pytest.raises(StoreError):
                    await alice.search()
                status, _, body = await raw("GET", f"{process.url}/v1/health")
                assert (status, body["status"]) == (503, "degraded")

                redis.start()  # the same port and data: the hub recovers by itself

                async def healthy() -> bool:
                    return bool((await anonymous.health())["status"] == "ok")

                await eventually(healthy, "the hub sees its store again")
                assert await alice.search() is not None


def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    result = run_cli("serve", "--no-auth", "--host", "0.0.0.0", "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--no-auth on 0.0.0.0" in result.stderr
    assert "127.0.0.1" in result.stderr


def test_keys_cli_create_list_revoke(tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path}/keys.db"]
    created = run_cli("keys", "create", "--tenant", "team-a", "--name", "ci", *store, "--json")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    assert key["key"].startswith(f"aenv_{key['id']}_")
    assert "digest" not in key
    listed = run_cli("keys", "list", *store, "--json")
    assert [k["id"] for k in json.loads(listed.stdout)] == [key["id"]]
    revoked = run_cli("keys", "revoke", key["id"], *store)
    assert revoked.returncode == 0
    assert "revoked" in revoked.stdout
    listed = run_cli("keys", "list", *store, "--json")
    assert json.loads(listed.stdout)[0]["revoked_at"] is not None
    bad = run_cli("keys", "create", "--tenant", "no spaces", *store)
    assert bad.returncode == 2
    assert "tenant" in bad.stderr
