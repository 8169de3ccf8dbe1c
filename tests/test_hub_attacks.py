"""Tenants of one hub attack each other and the hub; each attack is a test here.

A real ``aenv serve`` (auth on, in-process engine) with a limits file of small quotas, and four
tenants: alice and bob (ordinary), carol (the operator let her instances have the network),
erin (a small bundle quota). The session's hub without auth
(``open_hub``, tests/conftest.py) takes the cross-site requests.

Attacks: squatting a built-in's or another tenant's name with lookalikes; making another
tenant's code run by a name alone (instances, services, forks); exhausting a quota so others
starve; evading caps (deployConfig, TTL, renew, fork n, replicas); the network without the
operator's consent; reaching another tenant's instance directly and through both proxies (and
reading its token); requests a web page can make a browser send; using a key revoked
mid-session.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from aenv_ray import Environment
from aenv_ray.bundle import LOCK_NAME, _tar_gz, build_bundle
from aenv_ray.errors import (
    ArtifactError,
    AuthenticationError,
    ConfigurationError,
    EnvironmentNotFoundError,
    InstanceNotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    ServiceNotFoundError,
)
from aenv_ray.hub import HubClient
from aenv_ray.settings import Settings
from envhub.keys import create_key, revoke_key
from envhub.store import open_store
from tests._cli import aenv
from tests._hub import HubProcess, call_tool, eventually, raw, refused, run

MINI = "mini-terminal@1.0.0"
TENANTS = ("alice", "bob", "carol", "erin")
LIMITS = {
    "default": {
        "instances": 3,
        "services": 2,
        "replicas": 3,
        "per_request": 2,
        "ttl": "1h",
        "memory": "2G",
        "cpu": 2,
        "pids": 512,
        "bundle_bytes": "1M",
    },
    "tenants": {"carol": {"network": True}, "erin": {"bundle_bytes": "48K"}},
}

TOOLS = '''"""Tools of the attack tests' environments."""

from __future__ import annotations

import urllib.error
import urllib.request

from aenv_ray import register_tool


@register_tool
def fetch(url: str, token: str = "") -> dict[str, object]:
    """GET ``url`` (with ``Authorization: Bearer token``); the status and the body's start."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return {"status": reply.status, "body": reply.read(400).decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read(400).decode(errors="replace")}
    except OSError as exc:
        return {"status": 0, "body": str(exc)}


@register_tool
def whose() -> dict[str, object]:
    """Which environment's code this is."""
    return {"owner": "OWNER"}
'''


@dataclass(frozen=True)
class Hub:
    """The attack hub and each tenant's key."""

    proc: HubProcess
    keys: dict[str, str]

    @property
    def url(self) -> str:
        return self.proc.url

    def client(self, tenant: str) -> HubClient:
        return HubClient(self.url, api_key=self.keys[tenant])


async def _keys(store_url: str) -> dict[str, str]:
    store = await open_store(store_url)
    try:
        return {t: (await create_key(store, tenant=t))[1] for t in TENANTS}
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("attacked")
    (tmp / "limits.json").write_text(json.dumps(LIMITS))
    proc = HubProcess(tmp, extra=["--limits", str(tmp / "limits.json")])
    keys = asyncio.run(_keys(proc.store))
    with proc:
        yield Hub(proc, keys)


@pytest.fixture
async def alice(hub: Hub) -> AsyncIterator[HubClient]:
    async with hub.client("alice") as client:
        yield client


@pytest.fixture
async def bob(hub: Hub) -> AsyncIterator[HubClient]:
    async with hub.client("bob") as client:
        yield client


@pytest.fixture
async def carol(hub: Hub) -> AsyncIterator[HubClient]:
    async with hub.client("carol") as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def project(
    root: Path,
    name: str,
    version: str = "1.0.0",
    *,
    deploy: dict[str, Any] | None = None,
    owner: str = "",
    padding: int = 0,
) -> Path:
    """A project whose tools are ``fetch`` and ``whose`` (answers ``owner``); ``padding`` bytes
    of incompressible data make its bundle that much bigger."""
    path = root / f"{name}-{version}-{uuid.uuid4().hex[:6]}"
    (path / "src").mkdir(parents=True)
    config = {"name": name, "version": version, "description": f"{name} for the attack tests"}
    if deploy:
        config["deployConfig"] = deploy
    (path / "config.json").write_text(json.dumps(config))
    (path / "src" / "attack_tools.py").write_text(TOOLS.replace("OWNER", owner or name))
    if padding:
        text = base64.b64encode(os.urandom(padding * 3 // 4)).decode()
        (path / "src" / "padding.txt").write_text(text)
    return path


async def push(client: HubClient, path: Path) -> dict[str, Any]:
    return await client.push(build_bundle(path).data)


async def cleanup(client: HubClient, *ids: str) -> None:
    for iid in ids:
        await client.delete_instance(iid)


# -- 1. name squatting ---------------------------------------------------------------------------

BUILTIN_LOOKALIKES = [
    "mini-terminal",
    "Mini-Terminal",
    "MINI_TERMINAL",
    "mini_terminal",
    "miniterminal",
    "mini--terminal",
    "m1ni-terminal",
    "mini-termina1",
    "rnini-terminal",
]


@pytest.mark.parametrize("name", BUILTIN_LOOKALIKES)
async def test_nobody_publishes_a_builtins_name_or_a_lookalike(
    alice: HubClient, bob: HubClient, tmp_path: Path, name: str
) -> None:
    with pytest.raises(PermissionDeniedError, match="built into this hub") as refused_push:
        await push(alice, project(tmp_path, name))
    assert f"`{name}`" in str(refused_push.value)
    assert "name of your own" in str(refused_push.value)  # what to do
    with pytest.raises(EnvironmentNotFoundError):
        await bob.get_version(name)
    # the built-in is still what the name runs, for everyone
    doc = await bob.create_instance("mini-terminal", ttl="5m")
    try:
        assert (doc["env_ref"], doc["publisher"], doc["source"]) == (MINI, None, MINI)
    finally:
        await cleanup(bob, doc["id"])


async def test_nobody_publishes_a_near_miss_of_a_builtins_name(
    alice: HubClient, tmp_path: Path
) -> None:
    # a trailing digit, two letters swapped, a letter dropped, digits for letters: each is
    # refused naming the built-in it imitates, before the hub spends a sandbox on loading it
    near = {
        "mini-program0": "mini-program",
        "aegnt": "agent",
        "terminal-bnech": "terminal-bench",
        "mini-pr0gr4m": "mini-program",
    }
    for name, builtin in near.items():
        with pytest.raises(PermissionDeniedError, match="built into this hub") as refused_push:
            await push(alice, project(tmp_path, name))
        assert f"`{name}` looks like `{builtin}`" in str(refused_push.value)
        assert "letter added, dropped, changed or swapped" in str(refused_push.value)
    # (a word of its own after a built-in's, `agent-b`, is a name of its own:
    # tests/test_hub_names.py)


@pytest.mark.parametrize(
    "name",
    ["mini.terminal", "mіni-terminal", "mini-tеrminal", "ｍｉｎｉ-terminal", "mini terminal"],
    ids=["dot", "cyrillic-i", "cyrillic-e", "fullwidth", "space"],
)
async def test_lookalikes_outside_the_name_syntax_cannot_be_published(
    alice: HubClient, tmp_path: Path, name: str
) -> None:
    # the registry's name syntax is ASCII letters, digits, - and _; these never get that far
    lock = build_bundle(project(tmp_path, "carrier"))
    files = {
        "config.json": (json.dumps({"name": name, "version": "1.0.0"}).encode(), 0o644),
        LOCK_NAME: (lock.lock.encode(), 0o644),
        "src/attack_tools.py": (TOOLS.encode(), 0o644),
    }
    with pytest.raises(ArtifactError, match=r"config\.json"):
        await alice.push(_tar_gz(files))


async def test_nobody_publishes_another_tenants_name_or_a_lookalike(
    alice: HubClient, bob: HubClient, tmp_path: Path
) -> None:
    name = unique("notes")
    await push(alice, project(tmp_path, name))
    squats = [name, name.upper(), name.replace("-", "_"), name.replace("-", ""), "n0" + name[2:]]
    for squat in squats:
        with pytest.raises(PermissionDeniedError, match="belongs to tenant `alice`") as denied:
            await push(bob, project(tmp_path, squat, "2.0.0"))
        assert f"`{squat}`" in str(denied.value)
        if squat != name:
            assert f"looks like `{name}`" in str(denied.value)
    # the owner's own lookalike is refused too (two names nobody can tell apart), with advice
    with pytest.raises(ConfigurationError, match=f"publish it as `{name}`"):
        await push(alice, project(tmp_path, name.upper(), "2.0.0"))
    assert (await push(alice, project(tmp_path, name, "2.0.0")))["publisher"] == "alice"
    assert [v["version"] for v in await bob.versions(name)] == ["1.0.0", "2.0.0"]


async def test_another_tenants_version_is_refused_for_its_name_not_its_version(
    hub: Hub, alice: HubClient, bob: HubClient, tmp_path: Path
) -> None:
    # bob pushes alice's name at her version: her very bundle, then another one. The answer is
    # the refusal (the name is hers), never "already published; nothing to do" (exit 0: bob
    # thinks he published) nor "bump the version" (which would only meet the refusal after)
    name = unique("owned")
    mine = build_bundle(project(tmp_path, name))
    await alice.push(mine.data)
    for data in (mine.data, build_bundle(project(tmp_path, name, owner="bob")).data):
        with pytest.raises(PermissionDeniedError, match="belongs to tenant `alice`") as denied:
            await bob.push(data)
        assert "already published" not in str(denied.value)
    env = {"AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": hub.keys["bob"]}
    pushed = aenv("push", str(project(tmp_path, name)), env=env)
    assert pushed.returncode != 0
    assert "belongs to tenant `alice`" in pushed.stderr
    assert "already published" not in pushed.stdout + pushed.stderr
    assert [v["publisher"] for v in await bob.versions(name)] == ["alice"]


# -- 2. resolution never crosses tenants unasked ------------------------------------------------


async def test_a_name_alone_never_runs_another_tenants_code(
    hub: Hub, alice: HubClient, bob: HubClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique("shared")
    # bob uses a name nobody publishes yet; then alice publishes it
    with pytest.raises(EnvironmentNotFoundError):
        await bob.create_instance(name)
    await push(alice, project(tmp_path, name, owner="alice's code"))
    before = {d["id"] for d in await bob.list_instances()}
    for ref in (name, f"{name}@1.0.0", f"{name}@latest", f"bob/{name}@1.0.0"):
        with pytest.raises(EnvironmentNotFoundError, match=f"alice/{name}@1.0.0") as missing:
            await bob.create_instance(ref)
        assert "alice" in str(missing.value)
    with pytest.raises(EnvironmentNotFoundError, match=f"alice/{name}"):
        async with Environment(name, aenv_url=hub.url, api_key=hub.keys["bob"]):
            pass
    with pytest.raises(EnvironmentNotFoundError):
        await bob.create_instance(f"carol/{name}@1.0.0")  # carol publishes no such thing
    assert {d["id"] for d in await bob.list_instances()} == before

    # named explicitly, it is alice's code, and the record says so
    doc = await bob.create_instance(f"alice/{name}@1.0.0", ttl="5m")
    try:
        assert (doc["tenant"], doc["publisher"]) == ("bob", "alice")
        assert doc["source"] == f"alice/{name}@1.0.0"
        assert doc["env_ref"] == f"{name}@1.0.0"
        answer = await call_tool(doc, "whose", {})
        assert answer["structured"] == {"owner": "alice's code"}
    finally:
        await cleanup(bob, doc["id"])
    # the SDK takes the explicit form too, and knows that is what it asked for
    with caplog.at_level(logging.WARNING, logger="aenv_ray.environment"):
        explicit = Environment(f"alice/{name}@1.0.0", aenv_url=hub.url, api_key=hub.keys["bob"])
        async with explicit as env:
            assert (await env.call_tool("whose", {})).structured == {"owner": "alice's code"}
    assert "serves another environment" not in caplog.text
    # alice runs it by its name
    own = await alice.create_instance(name, ttl="5m")
    try:
        assert (own["publisher"], own["source"]) == ("alice", f"{name}@1.0.0")
    finally:
        await cleanup(alice, own["id"])


async def test_services_and_forks_never_run_another_tenants_code(
    alice: HubClient, bob: HubClient, tmp_path: Path
) -> None:
    name = unique("svc")
    await push(alice, project(tmp_path, name, owner="alice's service code"))
    with pytest.raises(EnvironmentNotFoundError, match=f"alice/{name}"):
        await bob.create_service(name)
    assert await bob.list_services() == []

    svc = await bob.create_service(MINI, replicas=1)
    try:
        with pytest.raises(EnvironmentNotFoundError, match=f"alice/{name}"):
            await bob.update_service(svc["id"], env=f"{name}@1.0.0")
        kept = await bob.get_service(svc["id"])
        assert (kept["env_ref"], kept["instances"]) == (MINI, svc["instances"])
        # explicitly: the service keeps the explicit form, so its replicas stay alice's code
        moved = await bob.update_service(svc["id"], env=f"alice/{name}@1.0.0")
        assert moved["env_ref"] == f"alice/{name}@1.0.0"
        (replica_id,) = moved["instances"]
        replica = await bob.get_instance(replica_id)
        assert (replica["publisher"], replica["tenant"]) == ("alice", "bob")
        answer = await call_tool(replica, "whose", {})
        assert answer["structured"] == {"owner": "alice's service code"}
    finally:
        await bob.delete_service(svc["id"])

    # a fork copies the caller's own instance only
    parent = await alice.create_instance(MINI, ttl="5m")
    try:
        with pytest.raises(InstanceNotFoundError, match="bob"):
            await bob.fork_instance(parent["id"], 1)
    finally:
        await cleanup(alice, parent["id"])


# -- 3. quotas ------------------------------------------------------------------------------------


async def test_one_tenant_cannot_starve_the_others_of_instances(
    alice: HubClient, bob: HubClient
) -> None:
    # five creates at once against a quota of three: exactly three start
    results = await asyncio.gather(
        *(alice.create_instance(MINI, ttl="5m") for _ in range(5)), return_exceptions=True
    )
    made = [r for r in results if isinstance(r, dict)]
    over = [r for r in results if isinstance(r, QuotaExceededError)]
    try:
        assert (len(made), len(over)) == (3, 2), results
        assert {(e.limit, e.allowed) for e in over} == {("instances", 3)}
        assert "aenv instance delete" in str(over[0])  # what to do
        assert "tenant `alice`" in str(over[0])
        assert len(await alice.list_instances()) == 3
        with pytest.raises(QuotaExceededError, match="instances"):
            await alice.fork_instance(made[0]["id"], 1)
        # bob is not starved
        theirs = await bob.create_instance(MINI, ttl="5m")
        await cleanup(bob, theirs["id"])
        # alice frees one and may start one again
        await cleanup(alice, made.pop()["id"])
        made.append(await alice.create_instance(MINI, ttl="5m"))
    finally:
        await cleanup(alice, *(d["id"] for d in made))


async def test_service_and_replica_quotas(alice: HubClient, bob: HubClient) -> None:
    first = await alice.create_service(MINI, replicas=2)
    services = [first]
    try:
        services.append(await alice.create_service(MINI, replicas=1))
        with pytest.raises(QuotaExceededError) as too_many:
            await alice.create_service(MINI, replicas=0)
        assert (too_many.value.limit, too_many.value.requested) == ("services", 3)
        with pytest.raises(QuotaExceededError) as too_big:
            await alice.update_service(first["id"], replicas=3)
        assert (too_big.value.limit, too_big.value.requested, too_big.value.allowed) == (
            "replicas",
            4,
            3,
        )
        assert (await alice.get_service(first["id"]))["replicas"] == 2
        # replicas are not instances: alice's instance quota is untouched
        doc = await alice.create_instance(MINI, ttl="5m")
        await cleanup(alice, doc["id"])
        # bob has his own quotas
        theirs = await bob.create_service(MINI, replicas=2)
        await bob.delete_service(theirs["id"])
    finally:
        for svc in services:
            await alice.delete_service(svc["id"])
    again = await alice.create_service(MINI, replicas=0)  # freed
    await alice.delete_service(again["id"])


async def test_the_bundle_bytes_quota(hub: Hub, tmp_path: Path) -> None:
    name = unique("heavy")
    async with hub.client("erin") as erin:
        await push(erin, project(tmp_path, name, "1.0.0", padding=24_000))
        second = await push(erin, project(tmp_path, name, "1.1.0", padding=24_000))
        # the bundles refused below are pushed again once there is room: a bundle the hub
        # load-checked before (and refused for the quota) is not loaded again
        third = build_bundle(project(tmp_path, name, "1.2.0", padding=24_000)).data
        with pytest.raises(QuotaExceededError, match="bundle_bytes") as full:
            await erin.push(third)
        assert full.value.allowed == 48 * 1024
        assert "aenv delete" in str(full.value)
        with pytest.raises(EnvironmentNotFoundError):
            await erin.get_version(name, "1.2.0")
        # deleting a version frees its bytes
        await erin.delete_version(name, second["version"])
        assert (await erin.push(third))["version"] == "1.2.0"
        # a bundle over the quota claims no name either
        other = unique("unclaimed")
        big = build_bundle(project(tmp_path, other, padding=60_000)).data
        with pytest.raises(QuotaExceededError):
            await erin.push(big)
    async with hub.client("alice") as alice:
        assert (await alice.push(big))["publisher"] == "alice"  # free for anyone


# -- 4. caps --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deploy", "limit"),
    [({"memory": "64G"}, "memory"), ({"cpu": "32"}, "cpu"), ({"pids": 100000}, "pids")],
)
async def test_a_definition_over_a_cap_is_refused_at_every_create(
    carol: HubClient, alice: HubClient, tmp_path: Path, deploy: dict[str, Any], limit: str
) -> None:
    name = unique("hog")
    published = await push(carol, project(tmp_path, name, deploy=deploy))  # the push is fine
    ((field, value),) = deploy.items()
    assert published["config"]["deployConfig"][field] == value
    before = await carol.list_instances()
    with pytest.raises(QuotaExceededError, match=f"deployConfig.{limit}") as refused_create:
        await carol.create_instance(name)
    assert refused_create.value.limit == limit
    with pytest.raises(QuotaExceededError, match=limit):
        await alice.create_instance(f"carol/{name}@1.0.0")
    with pytest.raises(QuotaExceededError, match=limit):
        await carol.create_service(name, replicas=1)
    assert await carol.list_instances() == before
    assert await carol.list_services() == []


async def test_ttl_renew_fork_and_replicas_are_capped(carol: HubClient, tmp_path: Path) -> None:
    with pytest.raises(QuotaExceededError, match="ttl") as long:
        await carol.create_instance(MINI, ttl="2h")
    assert (long.value.requested, long.value.allowed) == (7200, 3600)
    # a definition that asks a week for itself gets the cap, and is told so
    name = unique("forever")
    await push(carol, project(tmp_path, name, deploy={"ttl": "7d"}))
    doc = await carol.create_instance(name)
    try:
        assert doc["expires_at"] - doc["created_at"] == pytest.approx(3600, abs=30)
        assert any("168h" in w and "1h" in w for w in doc["warnings"]), doc["warnings"]
        with pytest.raises(QuotaExceededError, match="ttl"):
            await carol.renew_instance(doc["id"], "2h")
        renewed = await carol.renew_instance(doc["id"], "50m")
        assert renewed["expires_at"] - renewed["created_at"] < 3600 + 60
        with pytest.raises(QuotaExceededError, match="per_request") as fork:
            await carol.fork_instance(doc["id"], 3)
        assert (fork.value.requested, fork.value.allowed) == (3, 2)
        with pytest.raises(ConfigurationError, match="`n`"):
            await carol.fork_instance(doc["id"], 1000)
        assert {d["id"] for d in await carol.list_instances()} == {doc["id"]}
    finally:
        await cleanup(carol, doc["id"])
    with pytest.raises(QuotaExceededError, match="per_request"):
        await carol.create_service(MINI, replicas=3)
    svc = await carol.create_service(MINI, replicas=0)
    try:
        with pytest.raises(QuotaExceededError, match="per_request"):
            await carol.update_service(svc["id"], replicas=3)
        assert (await carol.update_service(svc["id"], replicas=2))["ready"] == 2
        with pytest.raises(QuotaExceededError) as more:
            await carol.update_service(svc["id"], replicas=4)  # adds 2: within per_request
        assert (more.value.limit, more.value.requested, more.value.allowed) == ("replicas", 4, 3)
    finally:
        await carol.delete_service(svc["id"])


# -- 5. the network -------------------------------------------------------------------------------


async def test_the_network_only_where_the_operator_enabled_it(
    hub: Hub, alice: HubClient, bob: HubClient, carol: HubClient, tmp_path: Path
) -> None:
    name = unique("netprobe")
    await push(carol, project(tmp_path, name, deploy={"network": True}))
    for client in (alice, bob):
        with pytest.raises(PermissionDeniedError, match="allow-network") as denied:
            await client.create_instance(f"carol/{name}@1.0.0")
        assert not isinstance(denied.value, QuotaExceededError)
    probe = await carol.create_instance(name, ttl="5m")
    target = await alice.create_instance(MINI, ttl="5m")
    try:

        async def fetch(url: str, token: str = "") -> dict[str, Any]:
            result = await call_tool(probe, "fetch", {"url": url, "token": token})
            answer: dict[str, Any] = result["structured"]
            return answer

        # it has the network: it reaches the hub
        assert (await fetch(f"{hub.url}/v1/health"))["status"] == 200
        # but not alice's runtime, which wants alice's instance's token
        health = target["url"] + "/health"
        assert (await fetch(health))["status"] == 401
        assert (await fetch(health, token=probe["token"]))["status"] == 401
        assert (await fetch(health, token=hub.keys["carol"]))["status"] == 401
        # nor through the hub's proxy: 401 without a key, 404 with carol's
        proxied = f"{hub.url}/v1/instances/{target['id']}/proxy/health"
        assert (await fetch(proxied))["status"] == 401
        assert (await fetch(proxied, token=hub.keys["carol"]))["status"] == 404
        # alice's own token works (the check above is the token, not the network)
        assert (await fetch(health, token=target["token"]))["status"] == 200
        # an instance without the network reaches nothing at all (where the engine isolates:
        # as root; without root its instances are plain processes on the host's network)
        port = urlsplit(hub.url).port
        result = await call_tool(
            target, "execute_command", {"command": f"bash -c 'echo > /dev/tcp/127.0.0.1/{port}'"}
        )
        if os.geteuid() == 0:
            assert result["structured"]["returncode"] != 0, result
    finally:
        await cleanup(carol, probe["id"])
        await cleanup(alice, target["id"])


def test_no_auth_with_the_network_is_refused(tmp_path: Path) -> None:
    # refused before it serves anything: the command in this process (tests/_cli.py)
    done = aenv(
        "serve",
        "--no-auth",
        "--allow-network",
        "--data-dir",
        str(tmp_path),
        "--store",
        f"sqlite:///{tmp_path}/hub.db",
    )
    assert done.returncode == 2, done.stderr
    assert "--no-auth with instances on the network" in done.stderr


# -- 6. another tenant's instance ----------------------------------------------------------------


async def test_another_tenants_instance_is_out_of_reach(
    hub: Hub, alice: HubClient, bob: HubClient
) -> None:
    doc = await alice.create_instance(MINI, ttl="5m")
    svc = await alice.create_service(MINI, replicas=1)
    replica = await alice.get_instance(svc["instances"][0])
    tokens = [doc["token"], replica["token"]]
    assert all(tokens)
    try:
        # directly: the runtime wants the instance's own token
        for key in (None, hub.keys["bob"], "forged-token", replica["token"]):
            status, _, _ = await raw("GET", doc["url"] + "/health", key=key)
            assert status == 401, key
        status, _, body = await raw(
            "POST",
            doc["url"] + "/aenv/v1/call",
            key=hub.keys["bob"],
            body={"name": "execute_command", "arguments": {"command": "id"}},
        )
        assert status == 401, body
        # through the instance proxy and the service proxy: unknown to bob
        for url in (
            f"{hub.url}/v1/instances/{doc['id']}/proxy/health",
            f"{hub.url}/v1/instances/{replica['id']}/proxy/health",
            f"{hub.url}/v1/services/{svc['id']}/proxy/health",
        ):
            status, _, body = await raw("GET", url, key=hub.keys["bob"])
            assert status == 404, (url, body)
            assert body["type"] in ("InstanceNotFoundError", "ServiceNotFoundError")
        with pytest.raises(ServiceNotFoundError):
            await bob.get_service(svc["id"])
        # bob's view holds none of alice's ids or tokens
        seen = json.dumps(
            [await bob.list_instances(include_terminated=True), await bob.list_services()]
        )
        for secret in [*tokens, doc["id"], replica["id"], svc["id"]]:
            assert secret not in seen
        # alice sees her tokens (she needs them for direct calls)
        assert (await alice.get_instance(doc["id"]))["token"] == doc["token"]
        assert await run(doc, "echo mine") == "mine"
    finally:
        await cleanup(alice, doc["id"])
        await alice.delete_service(svc["id"])
    log = hub.proc.log.read_text(errors="replace")
    assert "instance created" in log  # the hub logs instances ...
    for token in tokens:
        assert token not in log  # ... never their tokens


# -- 7. cross-site requests ---------------------------------------------------------------------


def send(
    url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, Any]:
    """One raw request with exactly these headers (``Host`` too): status and JSON answer."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers)
        reply = connection.getresponse()
        text = reply.read().decode()
    finally:
        connection.close()
    try:
        return reply.status, json.loads(text)
    except ValueError:
        return reply.status, text


def test_a_no_auth_hub_refuses_what_a_web_page_can_send(open_hub: HubProcess) -> None:
    port = urlsplit(open_hub.url).port
    own = f"127.0.0.1:{port}"

    # DNS rebinding: a name that is not localhost or an IP literal
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}", ""):
        status, body = send(open_hub.url, "GET", "/v1/envs", {"Host": host})
        assert status == 403, (host, body)
        assert body["type"] == "PermissionDeniedError"
        assert "DNS rebinding" in body["error"]
    for host in (own, f"localhost:{port}", "localhost", f"[::1]:{port}"):
        status, body = send(open_hub.url, "GET", "/v1/envs", {"Host": host})
        assert status == 200, (host, body)

    # a page of another site
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{port + 1}"):
        for method, path in (("GET", "/v1/instances"), ("DELETE", "/v1/instances/x")):
            status, body = send(open_hub.url, method, path, {"Host": own, "Origin": origin})
            assert status == 403, (origin, method, body)
            assert "other sites" in body["error"]
    status, _ = send(open_hub.url, "GET", "/v1/envs", {"Host": own, "Origin": f"http://{own}"})
    assert status == 200
    status, body = send(
        open_hub.url, "GET", "/v1/envs", {"Host": own, "Sec-Fetch-Site": "cross-site"}
    )
    assert status == 403, body

    # bodies a page may send without asking first: text, forms
    create = json.dumps({"env": "no-such-env@1.0.0"}).encode()
    for kind in (
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ):
        headers = {"Host": own} | ({"Content-Type": kind} if kind else {})
        status, body = send(open_hub.url, "POST", "/v1/instances", headers, create)
        assert status == 415, (kind, body)
        assert "application/json" in body["error"]
    headers = {"Host": own, "Content-Type": "application/json"}
    status, body = send(open_hub.url, "POST", "/v1/instances", headers, create)
    assert (status, body["type"]) == (404, "EnvironmentNotFoundError")  # got through
    # the upload takes gzip only
    status, body = send(open_hub.url, "POST", "/v1/envs", headers, b'{"not": "a bundle"}')
    assert status == 415, body
    headers = {"Host": own, "Content-Type": "application/gzip"}
    status, body = send(open_hub.url, "POST", "/v1/envs", headers, b"not gzip either")
    assert (status, body["type"]) == (400, "ArtifactError")  # got through
    # and health answers a local caller
    status, body = send(open_hub.url, "GET", "/v1/health", {"Host": own})
    assert (status, body["status"], body["store"]["ok"]) == (200, "ok", True)


def test_a_hub_with_auth_takes_json_bodies_only_too(hub: Hub) -> None:
    port = urlsplit(hub.url).port
    key = {"Authorization": f"Bearer {hub.keys['alice']}"}
    create = json.dumps({"env": "no-such-env@1.0.0"}).encode()
    headers = {"Host": f"127.0.0.1:{port}", "Content-Type": "text/plain", **key}
    status, body = send(hub.url, "POST", "/v1/instances", headers, create)
    assert status == 415, body
    # with a key, the key is the protection: any Host may carry it (a proxy in front, a name)
    status, body = send(hub.url, "GET", "/v1/whoami", {"Host": "hub.example", **key})
    assert (status, body["tenant"]) == (200, "alice")


# -- 8. a key revoked mid-session ---------------------------------------------------------------


async def test_a_key_revoked_mid_session(hub: Hub, bob: HubClient) -> None:
    store = await open_store(hub.proc.store)
    try:
        key, secret = await create_key(store, tenant="bob", name="bob's laptop")
        settings = Settings(hub_route="proxy")  # type: ignore[arg-type]
        async with HubClient(hub.url, api_key=secret) as laptop:
            direct = await laptop.create_instance(MINI, ttl="10m")
            env = Environment(MINI, aenv_url=hub.url, api_key=secret, settings=settings)
            async with env:
                out = await env.call_tool("execute_command", {"command": "echo before"})
                assert out.structured["output"].strip() == "before"
                await revoke_key(store, key.id)
                with pytest.raises(AuthenticationError, match="revoked"):
                    await env.call_tool("execute_command", {"command": "echo after"})
                with pytest.raises(AuthenticationError, match="revoked"):
                    await laptop.get_instance(direct["id"])
                assert env.instance_id is not None
                ids = [direct["id"], env.instance_id]

                # the hub ends what the revoked key started: its holder knows their tokens
                async def ended() -> bool:
                    docs = [await bob.get_instance(i) for i in ids]
                    return all(d["state"] == "terminated" for d in docs)

                await eventually(ended, "the hub ends the instances of a revoked key")
        for iid in ids:
            record = await bob.get_instance(iid)
            assert "revoked" in record["detail"], record
        await eventually(lambda: refused(direct["url"]), "the runtime stops serving")
        # bob's other key is untouched
        mine = await bob.create_instance(MINI, ttl="5m")
        await cleanup(bob, mine["id"])
    finally:
        await store.aclose()
