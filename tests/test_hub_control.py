"""EnvHub's control plane end to end: a real ``aenv serve`` (auth on, in-process engine) and two
tenants' keys made with ``aenv keys create``; instances, services, the TTL reaper, the SDK's
remote mode, the CLI in hub mode, and the OpenAPI document with its auth rule."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import envhub.app
from aenv_ray import Environment
from aenv_ray.errors import (
    AuthenticationError,
    ConfigurationError,
    EnvironmentNotFoundError,
    HubUnreachableError,
    InstanceExpiredError,
    InstanceNotFoundError,
    ServiceNotFoundError,
    StartupTimeoutError,
)
from aenv_ray.hub import HubClient
from aenv_ray.settings import Settings
from tests._hub import HubProcess, aenv, eventually, free_port, new_key, raw, refused, run

MINI = "mini-terminal@1.0.0"
# the instance's own id (set by the engine) and its storage, isolated (/storage) or not
WHO = "echo $AENV_INSTANCE_ID"
STORAGE = "${AENV_STORAGE:-/storage}"


@dataclass(frozen=True)
class Hub:
    """The module's hub and one key per tenant."""

    proc: HubProcess
    alice: str
    bob: str

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def data_dir(self) -> Path:
        return self.proc.data_dir


@pytest.fixture(scope="module")
def hub(shared_hub: HubProcess) -> Hub:
    """The session's hub (tests/conftest.py: auth on, the local engine, and --auth-failures
    200, since test_every_route_but_health_needs_a_key sends 62 wrong keys in a few seconds;
    tests/test_hub_abuse.py tests that limit itself), with keys of this module's own."""
    return Hub(shared_hub, new_key("alice", shared_hub.store), new_key("bob", shared_hub.store))


@pytest.fixture
async def alice(hub: Hub) -> AsyncIterator[HubClient]:
    async with HubClient(hub.url, api_key=hub.alice) as client:
        yield client


@pytest.fixture
async def bob(hub: Hub) -> AsyncIterator[HubClient]:
    async with HubClient(hub.url, api_key=hub.bob) as client:
        yield client


# -- 1. instances ---------------------------------------------------------------------------------


async def test_instance_create_list_get_renew_delete(alice: HubClient, bob: HubClient) -> None:
    doc = await alice.create_instance(
        MINI,
        ttl="10m",
        environment_variables={"GREETING": "hello from the hub"},
        owner="job-42",
        labels={"team": "rl", "run": "7"},
    )
    iid = doc["id"]
    try:
        assert doc["state"] == "running"
        assert doc["env_ref"] == MINI
        assert doc["tenant"] == "alice"
        assert doc["owner"] == "job-42"
        assert doc["labels"] == {"team": "rl", "run": "7"}  # the hub's own tenant label hidden
        assert doc["service"] is None
        assert doc["proxy_url"] == f"{alice.url}/v1/instances/{iid}/proxy"
        assert doc["expires_at"] - doc["created_at"] == pytest.approx(600, abs=5)
        # the runtime answers at its own URL, with the variables given
        assert await run(doc, "echo $GREETING") == "hello from the hub"
        assert await run(doc, WHO) == iid

        listed = await alice.list_instances()
        assert iid in [d["id"] for d in listed]
        assert iid in [d["id"] for d in await alice.list_instances(env="mini-terminal")]
        assert iid in [d["id"] for d in await alice.list_instances(env=MINI)]
        assert await alice.list_instances(env="another-env") == []
        assert iid not in [d["id"] for d in await bob.list_instances(include_terminated=True)]

        got = await alice.get_instance(iid)
        assert (got["id"], got["state"], got["url"]) == (iid, "running", doc["url"])

        renewed = await alice.renew_instance(iid, "1h")
        assert renewed["expires_at"] > doc["expires_at"] + 2000
        assert renewed["expires_at"] == pytest.approx(time.time() + 3600, abs=30)
        assert (await alice.get_instance(iid))["expires_at"] == renewed["expires_at"]
        renewed = await alice.renew_instance(iid, 120)  # seconds work too, and it can shorten
        assert renewed["expires_at"] == pytest.approx(time.time() + 120, abs=30)
    finally:
        deleted = await alice.delete_instance(iid)
    assert deleted["state"] == "terminated"
    assert deleted["reason"] == "deleted"
    again = await alice.delete_instance(iid)  # idempotent
    assert (again["state"], again["reason"]) == ("terminated", "deleted")
    assert (await alice.get_instance(iid))["state"] == "terminated"
    assert iid not in [d["id"] for d in await alice.list_instances()]
    ended = [d for d in await alice.list_instances(include_terminated=True) if d["id"] == iid]
    assert [(d["state"], d["reason"]) for d in ended] == [("terminated", "deleted")]
    await eventually(lambda: refused(doc["url"]), "the deleted runtime stops serving")
    with pytest.raises(InstanceNotFoundError, match="ended"):
        await alice.renew_instance(iid, "1h")
    with pytest.raises(InstanceNotFoundError, match="deleted"):
        await alice.fork_instance(iid, 1)
    with pytest.raises(InstanceNotFoundError, match="terminated"):
        await alice.request("GET", f"/v1/instances/{iid}/proxy/health")


async def test_fork_copies_see_the_parents_files(alice: HubClient) -> None:
    parent = await alice.create_instance(MINI, ttl="10m", labels={"role": "parent"})
    children: list[dict[str, Any]] = []
    try:
        await run(parent, "echo written-before-the-fork > note.txt")
        children = await alice.fork_instance(parent["id"], 2)
        assert len(children) == 2
        ids = {c["id"] for c in children}
        assert len(ids) == 2
        assert parent["id"] not in ids
        for child in children:
            assert child["state"] == "running"
            assert child["tenant"] == "alice"
            assert child["parent"] == parent["id"]
            assert child["proxy_url"] == f"{alice.url}/v1/instances/{child['id']}/proxy"
            assert await run(child, "cat note.txt") == "written-before-the-fork"
            assert await run(child, WHO) == child["id"]
        # copies are copies: a child's write is its own
        await run(children[0], "echo child > note.txt")
        assert await run(parent, "cat note.txt") == "written-before-the-fork"
        assert await run(children[1], "cat note.txt") == "written-before-the-fork"
        mine = {d["id"] for d in await alice.list_instances()}
        assert ids | {parent["id"]} <= mine
    finally:
        for doc in [*children, parent]:
            await alice.delete_instance(doc["id"])


async def test_bad_requests_raise_typed_errors(alice: HubClient) -> None:
    before = {d["id"] for d in await alice.list_instances()}
    for ttl in (-5, 0, "soon", "", "1x"):
        with pytest.raises(ConfigurationError):
            await alice.create_instance(MINI, ttl=ttl)
    with pytest.raises(EnvironmentNotFoundError) as missing:
        await alice.create_instance("no-such-env@1.0.0")
    assert "no-such-env@1.0.0" in str(missing.value)
    assert "aenv push" in str(missing.value)  # what to do about it
    with pytest.raises(EnvironmentNotFoundError) as version:
        await alice.create_instance("mini-terminal@9.9.9")
    assert "mini-terminal@9.9.9" in str(version.value)
    assert MINI in str(version.value)  # the version this hub does have
    with pytest.raises(EnvironmentNotFoundError, match="did you mean `mini-terminal`"):
        await alice.create_instance("mini-terminl@1.0.0")

    unknown = "0123456789ab"
    for call in (
        lambda: alice.get_instance(unknown),
        lambda: alice.delete_instance(unknown),
        lambda: alice.renew_instance(unknown, "1h"),
        lambda: alice.fork_instance(unknown, 1),
    ):
        with pytest.raises(InstanceNotFoundError, match=unknown):
            await call()
    with pytest.raises(InstanceNotFoundError, match="0123456789ab"):
        await alice.request("GET", "/v1/instances/0123456789ab/proxy/health")

    doc = await alice.create_instance(MINI, ttl="5m")
    try:
        for n in (0, 65):
            with pytest.raises(ConfigurationError, match="`n`"):
                await alice.fork_instance(doc["id"], n)
        for ttl in (0, "later"):
            with pytest.raises(ConfigurationError):
                await alice.renew_instance(doc["id"], ttl)
        assert (await alice.get_instance(doc["id"]))["state"] == "running"
    finally:
        await alice.delete_instance(doc["id"])
    assert {d["id"] for d in await alice.list_instances()} == before  # failures left nothing


# -- 2. tenants -----------------------------------------------------------------------------------


async def test_tenants_see_only_their_own(hub: Hub, alice: HubClient, bob: HubClient) -> None:
    doc = await alice.create_instance(MINI, ttl="10m")
    iid = doc["id"]
    svc = await alice.create_service(MINI, name="alice-svc", replicas=1)
    sid = svc["id"]
    try:
        for call in (
            lambda: bob.get_instance(iid),
            lambda: bob.delete_instance(iid),
            lambda: bob.renew_instance(iid, "1h"),
            lambda: bob.fork_instance(iid, 1),
        ):
            with pytest.raises(InstanceNotFoundError, match="bob"):
                await call()
        assert iid not in [d["id"] for d in await bob.list_instances(include_terminated=True)]
        assert svc["instances"][0] not in [
            d["id"] for d in await bob.list_instances(include_terminated=True)
        ]

        proxied = f"{hub.url}/v1/instances/{iid}/proxy/health"
        status, _, body = await raw("GET", proxied, key=hub.bob)
        assert status == 404
        assert body["type"] == "InstanceNotFoundError"
        status, _, body = await raw(
            "POST",
            f"{hub.url}/v1/instances/{iid}/proxy/aenv/v1/call",
            key=hub.bob,
            body={"name": "execute_command", "arguments": {"command": "id"}},
        )
        assert status == 404
        status, _, body = await raw("GET", proxied, key=hub.alice)
        assert status == 200
        assert body["success"] is True

        service_calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: bob.get_service(sid),
            lambda: bob.update_service(sid, replicas=3),
            lambda: bob.delete_service(sid),
        ]
        for scall in service_calls:
            with pytest.raises(ServiceNotFoundError, match=sid):
                await scall()
        assert sid not in [s["id"] for s in await bob.list_services()]
        status, _, body = await raw("GET", f"{hub.url}/v1/services/{sid}/proxy/health", key=hub.bob)
        assert status == 404
        assert body["type"] == "ServiceNotFoundError"

        # bob's attempts changed nothing of alice's
        assert (await alice.get_instance(iid))["state"] == "running"
        assert (await alice.renew_instance(iid, "10m"))["state"] == "running"
        kept = await alice.get_service(sid)
        assert (kept["replicas"], kept["ready"]) == (1, 1)
        assert sid in [s["id"] for s in await alice.list_services()]
        assert await alice.whoami() == {"tenant": "alice", "key_id": hub.alice.split("_")[1]}
        assert (await bob.whoami())["tenant"] == "bob"
    finally:
        await alice.delete_instance(iid)
        await alice.delete_service(sid)


# -- 3. TTL ---------------------------------------------------------------------------------------


async def test_an_expired_instance_is_reaped(hub: Hub, alice: HubClient) -> None:
    doc = await alice.create_instance(MINI, ttl=1)  # short: the test waits it out
    iid = doc["id"]
    assert doc["state"] == "running"

    async def ended() -> dict[str, Any] | None:
        got = await alice.get_instance(iid)
        return got if got["state"] == "terminated" else None

    final = await eventually(ended, "the hub reaps an instance past its TTL", deadline=60)
    assert final["reason"] == "expired"
    assert iid not in [d["id"] for d in await alice.list_instances()]
    with pytest.raises(InstanceExpiredError, match="expired"):
        await alice.request("GET", f"/v1/instances/{iid}/proxy/health")
    status, _, body = await raw("GET", f"{hub.url}/v1/instances/{iid}/proxy/health", key=hub.alice)
    assert (status, body["type"]) == (410, "InstanceExpiredError")
    with pytest.raises(InstanceNotFoundError, match="expired"):
        await alice.renew_instance(iid, "1h")
    await eventually(lambda: refused(doc["url"]), "the reaped runtime stops serving")


@pytest.mark.parametrize("route", ["direct", "proxy"])
async def test_sdk_calls_to_an_expired_instance_raise_instance_expired(
    hub: Hub, alice: HubClient, route: str
) -> None:
    settings = Settings(hub_route=route)  # type: ignore[arg-type]
    env = Environment(MINI, aenv_url=hub.url, api_key=hub.alice, ttl=2, settings=settings)
    async with env:
        assert env.instance_id is not None
        iid = env.instance_id

        async def ended() -> bool:
            return bool((await alice.get_instance(iid))["state"] == "terminated")

        await eventually(ended, "the hub reaps the SDK's instance past its TTL")
        with pytest.raises(InstanceExpiredError, match="expired"):
            await env.call_tool("execute_command", {"command": "ls"})
        with pytest.raises(InstanceExpiredError, match="expired"):
            await env.check_health()


# -- 4. the SDK in remote mode --------------------------------------------------------------------


@pytest.mark.parametrize("route", ["direct", "proxy"])
async def test_sdk_remote_mode(hub: Hub, alice: HubClient, route: str) -> None:
    settings = Settings(hub_route=route)  # type: ignore[arg-type]
    env = Environment(MINI, aenv_url=hub.url, api_key=hub.alice, ttl="10m", settings=settings)
    async with env:
        iid = env.instance_id
        assert iid is not None
        record = await alice.get_instance(iid)
        assert record["state"] == "running"
        if route == "direct":
            assert env.url == record["url"]
        else:
            assert env.url == f"{hub.url}/v1/instances/{iid}/proxy"
            assert env.url == record["proxy_url"]
        names = [t["name"] for t in await env.list_tools()]
        assert f"{MINI}/execute_command" in names
        result = await env.call_tool("execute_command", {"command": f"{WHO}; echo 42 > out.txt"})
        assert not result.is_error
        assert result.structured["output"].strip() == iid
        assert await env.call_reward({"path": "out.txt", "expected": "42"}) == 1.0
        assert await env.call_reward({"path": "out.txt", "expected": "43"}) == 0.0
        assert (await env.check_health())["status"] == "healthy"

        children = await env.fork(2)
        try:
            assert len({c.instance_id for c in children} | {iid}) == 3
            for child in children:
                assert child.instance_id is not None
                copy = await alice.get_instance(child.instance_id)
                assert copy["parent"] == iid
                if route == "direct":
                    assert child.url == copy["url"]
                else:
                    assert child.url == copy["proxy_url"]
                assert await child.call_reward({"path": "out.txt", "expected": "42"}) == 1.0
                out = await child.call_tool("execute_command", {"command": WHO})
                assert out.structured["output"].strip() == child.instance_id
        finally:
            for child in children:
                await child.release()
        for child in children:
            assert child.instance_id is not None
            assert (await alice.get_instance(child.instance_id))["state"] == "terminated"
    released = await alice.get_instance(iid)
    assert (released["state"], released["reason"]) == ("terminated", "deleted")


async def test_sdk_reads_the_hub_from_the_environment(
    hub: Hub, alice: HubClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AENV_SYSTEM_URL", hub.url)
    monkeypatch.setenv("AENV_API_KEY", hub.alice)
    async with Environment(MINI) as env:
        assert env.instance_id in [d["id"] for d in await alice.list_instances()]
        result = await env.call_tool("execute_command", {"command": "echo remote"})
        assert result.structured["output"].strip() == "remote"
        iid = env.instance_id
    assert iid is not None
    assert (await alice.get_instance(iid))["state"] == "terminated"


async def test_sdk_remote_errors(hub: Hub, alice: HubClient) -> None:
    before = {d["id"] for d in await alice.list_instances()}
    wrong = "aenv_000000000000_" + "x" * 32
    with pytest.raises(AuthenticationError, match="unknown"):
        async with Environment(MINI, aenv_url=hub.url, api_key=wrong):
            pass
    with pytest.raises(AuthenticationError, match="API key"):
        async with Environment(MINI, aenv_url=hub.url):  # no key at all
            pass
    nowhere = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(HubUnreachableError, match=re.escape(nowhere)):
        async with Environment(MINI, aenv_url=nowhere, api_key=hub.alice):
            pass
    with pytest.raises(EnvironmentNotFoundError, match="no-such-env"):
        async with Environment("no-such-env@1.0.0", aenv_url=hub.url, api_key=hub.alice):
            pass
    assert {d["id"] for d in await alice.list_instances()} == before


# -- 5. services ----------------------------------------------------------------------------------


async def test_service_lifecycle(hub: Hub, alice: HubClient) -> None:
    svc = await alice.create_service(MINI, replicas=2, storage=True)
    sid = svc["id"]
    try:
        assert sid.startswith("svc-")
        assert (svc["name"], svc["env_ref"], svc["tenant"]) == ("mini-terminal", MINI, "alice")
        assert (svc["replicas"], svc["ready"]) == (2, 2)
        assert len(svc["instances"]) == 2
        assert len(svc["endpoints"]) == 2
        assert svc["address"] == f"{hub.url}/v1/services/{sid}/proxy"
        storage = Path(svc["storage"])
        assert storage == hub.data_dir / "storage" / sid
        assert await asyncio.to_thread(storage.is_dir)
        replicas = [await alice.get_instance(i) for i in svc["instances"]]
        for replica in replicas:
            assert replica["service"] == sid
            assert replica["state"] == "running"
            assert replica["url"] in svc["endpoints"]
        first, second = replicas

        # one storage for every replica
        await run(first, f"echo hi > {STORAGE}/x")
        assert await run(second, f"cat {STORAGE}/x") == "hi"
        assert (storage / "x").read_text() == "hi\n"
        # and their own workspaces
        await run(first, "echo mine > local.txt")
        assert await run(second, "cat local.txt 2>/dev/null || echo absent") == "absent"

        # the service's address: round-robin over the running replicas
        seen = [await run(svc["address"], WHO, key=hub.alice) for _ in range(4)]
        assert set(seen) == {first["id"], second["id"]}
        status, _, body = await raw("GET", svc["address"] + "/health", key=hub.alice)
        assert status == 200
        assert body["success"] is True
        status, headers, _ = await raw("GET", svc["address"] + "/health")
        assert status == 401
        assert headers["WWW-Authenticate"] == "Bearer"
        # the SDK attaches the address as it is (its path kept), with the hub key
        async with Environment.attach(svc["address"] + "/", token=hub.alice) as env:
            assert (env.env_name, env.instance_id, env.url) == (MINI, None, svc["address"])
            outputs = set()
            for _ in range(4):
                done = await env.call_tool("execute_command", {"command": WHO})
                outputs.add(str(done.structured["output"]).strip())
            assert outputs == {first["id"], second["id"]}
        # an address that is not a runtime's fails naming it, not `unknown`, with what to attach
        wrong = f"{hub.url}/v1/services/svc-none/proxy"
        with pytest.raises(StartupTimeoutError, match="HTTP 404") as missed:
            await Environment.attach(wrong, token=hub.alice, startup_timeout=0.2).initialize()
        assert str(missed.value).startswith(f"the runtime at {wrong} did not become healthy")
        assert "service is attached at its `address`" in str(missed.value)

        # a replica that dies is replaced by the hub's upkeep; the storage stays
        await alice.delete_instance(first["id"])

        async def replaced() -> dict[str, Any] | None:
            now = await alice.get_service(sid)
            fresh = set(now["instances"]) - {first["id"], second["id"]}
            return now if now["ready"] == 2 and len(fresh) == 1 else None

        healed = await eventually(replaced, "the hub replaces a dead replica", deadline=90)
        assert second["id"] in healed["instances"]
        assert first["id"] not in healed["instances"]
        (newcomer,) = set(healed["instances"]) - {second["id"]}
        incoming = await alice.get_instance(newcomer)
        assert incoming["service"] == sid
        assert await run(incoming, f"cat {STORAGE}/x") == "hi"

        # scale up and down
        up = await alice.update_service(sid, replicas=3)
        assert (up["replicas"], up["ready"], len(up["endpoints"])) == (3, 3, 3)
        assert set(healed["instances"]) <= set(up["instances"])
        down = await alice.update_service(sid, replicas=1)
        assert (down["replicas"], down["ready"], len(down["instances"])) == (1, 1, 1)
        for gone in set(up["instances"]) - set(down["instances"]):
            record = await alice.get_instance(gone)
            assert (record["state"], record["reason"]) == ("terminated", "deleted")
        assert (await alice.get_service(sid))["instances"] == down["instances"]

        # new variables: the replicas are replaced, the storage kept
        changed = await alice.update_service(
            sid, replicas=2, environment_variables={"MODE": "blue"}
        )
        assert (changed["replicas"], changed["ready"]) == (2, 2)
        assert changed["environment_variables"] == {"MODE": "blue"}
        assert not set(changed["instances"]) & set(down["instances"])
        assert (await alice.get_instance(down["instances"][0]))["state"] == "terminated"
        for iid in changed["instances"]:
            replica = await alice.get_instance(iid)
            assert await run(replica, "echo $MODE") == "blue"
            assert await run(replica, f"cat {STORAGE}/x") == "hi"
        assert Path(changed["storage"]) == storage

        with pytest.raises(ConfigurationError, match="replicas"):
            await alice.update_service(sid, replicas=65)
        with pytest.raises(ConfigurationError, match="replicas"):
            await alice.update_service(sid, replicas=-1)
        with pytest.raises(EnvironmentNotFoundError):
            await alice.update_service(sid, env="no-such-env@1.0.0")
        assert (await alice.get_service(sid))["instances"] == changed["instances"]
    finally:
        final = await alice.get_service(sid)
        deleted = await alice.delete_service(sid)
    assert deleted["id"] == sid
    assert deleted["instances"] == []
    assert deleted["endpoints"] == []
    for iid in final["instances"]:
        record = await alice.get_instance(iid)
        assert (record["state"], record["reason"]) == ("terminated", "deleted")
    assert not await asyncio.to_thread(storage.exists)
    with pytest.raises(ServiceNotFoundError, match=sid):
        await alice.get_service(sid)
    with pytest.raises(ServiceNotFoundError):
        await alice.delete_service(sid)
    assert sid not in [s["id"] for s in await alice.list_services()]
    # its replicas are never brought back
    assert [d["id"] for d in await alice.list_instances() if d["service"] == sid] == []


async def test_service_keep_storage_and_limits(hub: Hub, alice: HubClient) -> None:
    with pytest.raises(ConfigurationError, match="replicas"):
        await alice.create_service(MINI, replicas=65)
    with pytest.raises(EnvironmentNotFoundError, match="no-such-env"):
        await alice.create_service("no-such-env@1.0.0")
    assert await alice.list_services() == []

    svc = await alice.create_service(MINI, name="keeper", replicas=1, storage=True)
    storage = Path(svc["storage"])
    await run(await alice.get_instance(svc["instances"][0]), f"echo kept > {STORAGE}/data.txt")
    idle = await alice.update_service(svc["id"], replicas=0)
    assert (idle["ready"], idle["instances"], idle["endpoints"]) == (0, [], [])
    status, _, body = await raw("GET", svc["address"] + "/health", key=hub.alice)
    assert (status, body["type"]) == (503, "CapacityError")
    await alice.delete_service(svc["id"], keep_storage=True)
    assert (storage / "data.txt").read_text() == "kept\n"
    assert [s for s in await alice.list_services() if s["id"] == svc["id"]] == []


# -- 6. the CLI in hub mode -----------------------------------------------------------------------


def test_cli_instances_on_a_hub(hub: Hub) -> None:
    env = {"AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": hub.alice}
    made = aenv("instance", "create", "mini-terminal", "--ttl", "10m", "--json", env=env)
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    iid = doc["id"]
    assert (doc["state"], doc["env_ref"], doc["tenant"]) == ("running", MINI, "alice")
    try:
        listed = aenv("instance", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert iid in [d["id"] for d in json.loads(listed.stdout)]

        shown = aenv("instance", "get", iid, env=env)
        assert shown.returncode == 0, shown.stderr
        assert re.search(rf"^id\s+{iid}$", shown.stdout, re.M)
        assert re.search(r"^state\s+running$", shown.stdout, re.M)
        assert re.search(rf"^url\s+{re.escape(doc['url'])}$", shown.stdout, re.M)

        renewed = aenv("instance", "renew", iid, "--ttl", "1h", "--json", env=env)
        assert renewed.returncode == 0, renewed.stderr
        assert json.loads(renewed.stdout)["expires_at"] > doc["expires_at"] + 2000
    finally:
        deleted = aenv("instance", "delete", iid, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert re.search(r"^state\s+terminated$", deleted.stdout, re.M)
    assert re.search(r"^ended\s+deleted", deleted.stdout, re.M)
    listed = aenv("instance", "list", "--json", env=env)
    assert iid not in [d["id"] for d in json.loads(listed.stdout)]
    listed = aenv("instance", "list", "--all", "--json", env=env)
    assert iid in [d["id"] for d in json.loads(listed.stdout)]

    # bob's key: alice's instance is unknown to him
    other = aenv("instance", "get", iid, env={**env, "AENV_API_KEY": hub.bob})
    assert other.returncode == 2
    assert other.stderr.startswith("aenv: error: ")
    assert other.stderr.count("\n") == 1
    assert iid in other.stderr


def test_cli_services_on_a_hub(hub: Hub) -> None:
    env = {"AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": hub.alice}
    made = aenv("service", "create", "mini-terminal", "--replicas", "1", "--json", env=env)
    assert made.returncode == 0, made.stderr
    svc = json.loads(made.stdout)
    sid = svc["id"]
    assert (svc["replicas"], svc["ready"], svc["env_ref"]) == (1, 1, MINI)
    try:
        listed = aenv("service", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert sid in [s["id"] for s in json.loads(listed.stdout)]
        table = aenv("service", "list", env=env)
        assert table.returncode == 0, table.stderr
        assert sid in table.stdout
        assert "1/1" in table.stdout

        shown = aenv("service", "get", sid, env=env)
        assert shown.returncode == 0, shown.stderr
        assert re.search(rf"^id\s+{sid}$", shown.stdout, re.M)
        assert re.search(r"^replicas\s+1/1 ready$", shown.stdout, re.M)
        assert f"{hub.url}/v1/services/{sid}/proxy" in shown.stdout

        scaled = aenv("service", "update", sid, "--replicas", "2", "--json", env=env)
        assert scaled.returncode == 0, scaled.stderr
        grown = json.loads(scaled.stdout)
        assert (grown["replicas"], grown["ready"], len(grown["endpoints"])) == (2, 2, 2)
    finally:
        deleted = aenv("service", "delete", sid, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == f"deleted service {sid}"
    gone = aenv("service", "get", sid, env=env)
    assert gone.returncode == 2, gone.stderr
    assert gone.stderr.startswith("aenv: error: ")
    assert gone.stderr.count("\n") == 1
    assert sid in gone.stderr


def test_cli_errors_in_hub_mode(hub: Hub) -> None:
    env = {"AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": hub.alice}
    for args in (
        ("instance", "get", "0123456789ab"),
        ("instance", "delete", "0123456789ab"),
        ("instance", "renew", "0123456789ab", "--ttl", "1h"),
        ("service", "get", "svc-0000000000"),
        ("service", "update", "svc-0000000000", "--replicas", "2"),
        ("service", "delete", "svc-0000000000"),
        ("instance", "create", "no-such-env"),
        ("service", "create", "no-such-env"),
    ):
        done = aenv(*args, env=env)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("aenv: error: "), (args, done.stderr)
        assert done.stderr.count("\n") == 1, (args, done.stderr)
        assert args[2] in done.stderr, (args, done.stderr)

    nohub = aenv("service", "list")
    assert nohub.returncode == 2
    assert nohub.stderr.startswith("aenv: error: no hub configured")
    assert nohub.stderr.count("\n") == 1

    for group in ("instance", "service"):
        nokey = aenv(group, "list", env={"AENV_SYSTEM_URL": hub.url})
        assert nokey.returncode == 1, (group, nokey.stderr)
        assert nokey.stderr.startswith("aenv: error: this hub needs an API key"), nokey.stderr
        assert nokey.stderr.count("\n") == 1

    wrong = aenv("service", "list", env={**env, "AENV_API_KEY": "aenv_000000000000_" + "x" * 32})
    assert wrong.returncode == 1
    assert "unknown to the hub" in wrong.stderr


# -- 7. the OpenAPI document and the auth rule ----------------------------------------------------


def _documented_routes() -> set[tuple[str, str]]:
    """``(METHOD, path)`` of every row of envhub.app's docstring table, the abbreviated rows
    ("create, list, get, ...") spelled out; path parameters as ``{}``."""
    doc = envhub.app.__doc__ or ""
    rows = re.findall(r"^``(?:([A-Z]+)\s+)?(/\S+?)``\s*(\.\.\.)?\s+(.*)$", doc, re.M)
    assert len(rows) == 21, rows
    routes: set[tuple[str, str]] = set()
    proxy_methods = ("GET", "POST", "PUT", "PATCH", "DELETE")
    for method, path, more, _ in rows:
        path = re.sub(r"\{[^}]*\}", "{}", path.split("?")[0])
        if path.endswith("/proxy/{}"):
            routes |= {(m, path) for m in proxy_methods}
        elif "/proxy/aenv/v1/preview/" in path:
            routes |= {("GET", path), ("HEAD", path)}
        elif more and path == "/v1/instances":
            routes |= {
                ("POST", path),
                ("GET", path),
                ("GET", path + "/{}"),
                ("DELETE", path + "/{}"),
                ("POST", path + "/{}/renew"),
                ("POST", path + "/{}/fork"),
            }
        elif more and path == "/v1/services":
            routes |= {
                ("POST", path),
                ("GET", path),
                ("GET", path + "/{}"),
                ("PATCH", path + "/{}"),
                ("DELETE", path + "/{}"),
            }
        else:
            assert not more, path
            routes.add((method, path))
    return routes


async def test_openapi_documents_every_route(hub: Hub) -> None:
    status, _, spec = await raw("GET", f"{hub.url}/openapi.json")
    assert status == 200
    assert spec["info"]["title"] == "EnvHub"
    served = {
        (method.upper(), re.sub(r"\{[^}]*\}", "{}", path))
        for path, item in spec["paths"].items()
        for method in item
    }
    documented = _documented_routes()
    assert len(documented) == 39
    missing = documented - served
    assert not missing, f"documented but not served: {sorted(missing)}"
    assert served - documented == {("GET", "/v1/health"), ("GET", "/v1/whoami")}
    # the bodies are described
    for schema in ("CreateInstance", "CreateService", "UpdateService", "Instance", "Service"):
        assert schema in spec["components"]["schemas"]
    assert "ErrorBody" in spec["components"]["schemas"]
    # every status an error can travel with is documented, e.g. 410 (expired) on the proxy
    statuses = {str(status) for _, status in envhub.app._STATUS}
    assert {"410", "502"} <= statuses
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if path != "/v1/health":
                assert statuses <= set(operation["responses"]), (method, path)

    status, headers, page = await raw("GET", f"{hub.url}/docs")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert "openapi.json" in page

    status, _, health = await raw("GET", f"{hub.url}/v1/health")
    assert status == 200
    assert health["status"] == "ok"
    assert health["auth"] is True


async def test_every_route_but_health_needs_a_key(hub: Hub) -> None:
    status, _, spec = await raw("GET", f"{hub.url}/openapi.json")
    assert status == 200
    checked = 0
    for path, item in spec["paths"].items():
        if path == "/v1/health":
            continue
        url = hub.url + re.sub(r"\{[^}]*\}", "x", path)
        if "/aenv/v1/preview/" in path:  # a browser's: the capability in the path is the key
            for method in item:
                status, _, body = await raw(method.upper(), url)
                assert status == 404, (method, path, body)
            continue
        for method in item:
            for key in (None, "not-a-key", "aenv_000000000000_" + "x" * 32):
                status, headers, body = await raw(method.upper(), url, key=key)
                where = f"{method.upper()} {path} key={key}"
                assert status == 401, (where, status, body)
                assert headers.get("WWW-Authenticate") == "Bearer", where
                assert body["type"] == "AuthenticationError", where
                assert body["error"], where
            checked += 1
    assert checked == 38  # the 38 documented routes but the preview's, and whoami
