"""No secret of the host, the engine, the hub or the operator is readable in an instance.

The attack is the one a hostile agent runs from mini-terminal's shell: read every
``/proc/*/environ`` and ``/proc/*/cmdline`` it can see (the runtime's included; it is the
shell's parent). Canaries are planted where secrets live: the driver's environment (the local
engine's own), the hub's (and so its engine daemon's, which the hub starts) with its Redis
store's URL and password, and the variables that hand a standalone runtime (what Kubernetes
pods run) its token and bundle key. Each scan has a control: a variable deliberately given to
the instance (``environment_variables``) must show, or the scan proves nothing.

The local engine's own scan runs in ``tests/test_sandbox_attacks.py`` (so also as ``nobody``), the
standalone runtime's in ``tests/test_runtime_server.py``; this file holds the hub and Kubernetes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
import redis

from aenv_ray import Environment, InstanceSpec
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import FAST_CALL_PATH
from envhub.seal import TokenSeal, check_secret
from envhub.store import open_store
from tests._hub import HUB_SECRET, HubProcess, new_key, raw, run
from tests._k8s import KubeCluster
from tests._redis import RedisServer
from tests._scan import CONTROL, assert_clean, scan_command

# -- a hub (and the engine daemon it starts) on a Redis store with a password -------------------


@pytest.fixture
def redis_user(redis_server: RedisServer) -> tuple[str, str]:
    """A user of the session's Redis with a password of its own: ``(url, password)``."""
    name, password = f"hub-{uuid.uuid4().hex[:8]}", f"redis-password-{uuid.uuid4().hex}"
    admin = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        admin.acl_setuser(
            name, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"]
        )
    finally:
        admin.close()
    prefix = f"test-{uuid.uuid4().hex}:"
    return f"redis://{name}:{password}@127.0.0.1:{redis_server.port}/0?prefix={prefix}", password


async def test_nothing_of_the_hub_or_its_store_is_readable_in_an_instance(
    tmp_path: Path, redis_user: tuple[str, str], redis_server: RedisServer
) -> None:
    url, password = redis_user
    canary = f"sk-hub-canary-{uuid.uuid4().hex}"
    key = new_key("alice", url)
    env = {"AENV_HUB_STORE": url, "OPENAI_API_KEY": canary, "AWS_SECRET_ACCESS_KEY": canary}
    control = uuid.uuid4().hex
    # engine "local": the hub's engine daemon, started by the hub with its environment
    with HubProcess(tmp_path / "hub", store=url, engine="daemon", env=env) as hub:
        status, _, doc = await raw(
            "POST",
            f"{hub.url}/v1/instances",
            key=key,
            body={"env": "mini-terminal@1.0.0", "environment_variables": {CONTROL: control}},
        )
        assert status == 201, doc
        secret = str(hub.env["AENV_HUB_SECRET"])
        output = await run(doc, scan_command())
        assert_clean(output, [canary, password, secret, key], control)
        # the store, read raw: the token is sealed, and what it keeps opens nothing
        stored = redis.Redis.from_url(url.split("?")[0])
        try:
            prefix = url.split("prefix=")[1]
            records = [
                value
                for name in stored.keys(prefix + "doc:*")
                for value in stored.hgetall(name).values()
            ]
        finally:
            stored.close()
        instance = next(json.loads(v) for v in records if doc["id"].encode() in v)
        assert "token" not in instance
        assert all(doc["token"].encode() not in v for v in records)
        sealed = str(instance["token_sealed"])
        status, _, _ = await raw(
            "POST", doc["url"] + FAST_CALL_PATH, key=sealed, body={"name": "x"}
        )
        assert status == 401
        # the proxy still reaches the instance with the token it opens
        proxied = await run(f"{hub.url}/v1/instances/{doc['id']}/proxy", "echo via-proxy", key=key)
        assert proxied == "via-proxy"
    # a hub on the store with another secret would be refused at start (checked as the hub's
    # start checks it: its own process would cost this test seconds)
    store = await open_store(url)
    try:
        with pytest.raises(ConfigurationError, match="not the one the hubs sharing its store use"):
            await check_secret(store, TokenSeal(b"x" * 40))
        await check_secret(store, TokenSeal(HUB_SECRET.encode()))  # the hub's own passes
    finally:
        await store.aclose()


# -- Kubernetes: the pod's runtime --------------------------------------------------------------


@pytest.mark.k8s
@pytest.mark.timeout(1200)
async def test_a_pods_token_is_neither_in_its_spec_nor_in_its_environment(
    kube_cluster: KubeCluster,
) -> None:
    """Whoever may read the pod (``kubectl get pod -o json``) learns nothing that is the token:
    the spec holds its SHA-256 and a nonce; the engine derives the token (k8s_backend.tokens).
    Controls: the token answers, the digest presented as a token is refused, and a second
    engine of the namespace (a restarted hub) derives the same token from the pod alone."""
    from kubernetes import client as k8s_client

    from k8s_backend.tokens import SECRET, digest

    namespace = kube_cluster.namespace(f"t-secrets-{uuid.uuid4().hex[:6]}")
    engine = kube_cluster.engine(namespace)
    control = uuid.uuid4().hex
    try:
        spec = InstanceSpec(
            "mini-terminal@1.0.0", ttl=600, environment_variables={CONTROL: control}
        )
        info = await engine.create(spec, timeout=300)
        assert info.token
        assert info.url
        with kube_cluster.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            (pod,) = core.list_namespaced_pod(
                namespace, label_selector=f"aenv-ray.io/instance={info.id}"
            ).items
            dumped = json.dumps(api.sanitize_for_serialization(pod))
            key = core.read_namespaced_secret(SECRET, namespace).data["key"]
        assert control in dumped  # controls: the dump is the whole pod
        assert digest(info.token) in dumped
        assert info.token not in dumped
        assert key not in dumped
        async with Environment.attach(str(info.url), token=info.token) as env:
            result = await env.call_tool("execute_command", {"command": scan_command(every=False)})
        output = str(result.structured["output"])
        assert_clean(output, [info.token], control)
        status, _, said = await raw("GET", info.url + "/aenv/v1/info", key=digest(info.token))
        assert status == 401, said
        status, _, _ = await raw("GET", info.url + "/aenv/v1/info", key=info.token)
        assert status == 200
        other = kube_cluster.engine(namespace, session=False, reaper=False)
        try:
            assert (await other.get(info.id)).token == info.token
        finally:
            await other.aclose()
    finally:
        await asyncio.wait_for(engine.aclose(), 300)


def test_the_secret_file_is_the_hubs_own(tmp_path: Path) -> None:
    from envhub.seal import SECRET_FILE, hub_secret

    first = hub_secret(tmp_path)
    assert hub_secret(tmp_path) == first  # kept
    assert (tmp_path / SECRET_FILE).stat().st_mode & 0o777 == 0o600
