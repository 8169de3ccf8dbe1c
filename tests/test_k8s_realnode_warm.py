"""Reserved warm pods on the real node (k8s_backend.engine's "Reservations"): an engine that
claimed from a pool keeps a few of its own Ready free pods reserved, each with a connection
opened ahead; its next claim takes one from memory and records the claim after answering.
Checked against the API server: the reservation is atomic and belongs to the engine's session,
another engine never gets a reserved pod, refills count it, the claim lands as a PATCHed claim
would, the SDK's first call goes on the connection opened ahead, a claim that cannot be recorded
(another writer changed the pod) ends the instance instead of leaving two owners, and an engine
that closes leaves no reserved pod behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aenv_ray import Environment, InstanceBrokenError, _wire
from aenv_ray.engine import InstanceSpec, InstanceState, TerminationReason
from k8s_backend import KubernetesEngine
from k8s_backend.manifests import (
    LABEL_CLAIM,
    LABEL_INSTANCE,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_SESSION,
)
from k8s_backend.warm import ANNOTATION_CLAIM, CLAIMED, RESERVED
from tests._hub import eventually
from tests._realnode import RealNode

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(900)]

SPEC = InstanceSpec("mini-terminal@1.0.0", ttl=600.0, owner="tester", labels={"team": "t1"})


@pytest.fixture
def namespace(real_node: RealNode) -> Iterator[str]:
    with real_node.scratch_namespace("realnode-w") as (_, name):
        yield name


def _pods(node: RealNode, namespace: str) -> list[Any]:
    from kubernetes import client

    with node.api_client() as api:
        return list(
            client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=LABEL_POOL).items
        )


def _live(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.metadata.deletion_timestamp is None]


async def test_a_reserved_pod_is_claimed_from_memory_recorded_after_and_called_on_a_connection_opened_ahead(  # noqa: E501
    real_node: RealNode, namespace: str
) -> None:
    maker: KubernetesEngine = real_node.engine(namespace, reserve=2)
    rival: KubernetesEngine = real_node.engine(namespace)
    try:
        assert await maker.prewarm(SPEC, pool="r", count=3) == 3

        async def three_ready() -> bool:
            return (await maker.warm_count(SPEC, pool="r")).ready == 3

        await eventually(three_ready, "three of the maker's warm pods Ready", deadline=180)
        first = await maker.claim(SPEC, pool="r")  # a PATCH; it starts the reservations
        assert first is not None

        def reserved() -> list[Any]:
            return [
                p
                for p in _live(_pods(real_node, namespace))
                if p.metadata.labels[LABEL_CLAIM] == RESERVED
            ]

        async def two_reserved() -> bool:
            return len(reserved()) == 2

        await eventually(two_reserved, "two of the maker's pods reserved", deadline=120)
        assert all(p.metadata.labels[LABEL_SESSION] == maker.session for p in reserved())
        # reserved pods are the maker's warm pods (its refills count them), nobody's instances,
        # and no other engine can claim them
        assert (await maker.warm_count(SPEC, pool="r")).ready == 2
        assert await maker.fill(SPEC, pool="r", count=2) == 0  # reserved pods stand
        assert {i.id for i in await maker.list()} == {first.id}
        assert await rival.claim(SPEC, pool="r") is None

        ids = {p.metadata.labels[LABEL_INSTANCE] for p in reserved()}
        loop = asyncio.get_running_loop()

        async def opened() -> bool:  # a connection to each reserved pod, readiness seen
            return len(_wire._shelves.get(loop, {})) == 2

        await eventually(opened, "a connection opened ahead to each reserved pod")
        ahead = _wire._shelves[loop]

        before = time.time()
        second = await maker.claim(SPEC, pool="r")  # from memory
        assert second is not None
        assert second.id in ids
        assert second.is_running
        assert (second.owner, second.labels) == ("tester", {"team": "t1"})
        assert second.expires_at is not None
        # the claim's TTL from the moment it was made, recorded to the millisecond (the
        # expires-at annotation is written with 3 decimals: it may round up by 0.5 ms)
        assert before + 600 - 0.0005 <= second.expires_at <= time.time() + 600 + 0.0005
        origin = (False, (second.url or "").split("//")[1].split(":")[0], 8080)
        kept = list(ahead[origin])
        assert len(kept) == 1

        async def recorded() -> bool:
            (pod,) = [
                p
                for p in _pods(real_node, namespace)
                if p.metadata.labels[LABEL_INSTANCE] == second.id
            ]
            return pod.metadata.labels[LABEL_CLAIM] == CLAIMED

        await eventually(recorded, "the claim recorded on its pod")
        (pod,) = [
            p for p in _pods(real_node, namespace) if p.metadata.labels[LABEL_INSTANCE] == second.id
        ]
        assert pod.metadata.labels[LABEL_SESSION] == maker.session
        assert pod.metadata.labels[LABEL_OWNER] == "tester"
        assert pod.metadata.labels["team"] == "t1"
        assert pod.metadata.annotations[ANNOTATION_CLAIM]
        recorded_expiry = float(pod.metadata.annotations["aenv-ray.io/expires-at"])
        assert recorded_expiry == pytest.approx(second.expires_at, abs=0.01)
        assert (await maker.get(second.id)).expires_at == pytest.approx(recorded_expiry, abs=0.01)

        env = Environment.adopt(maker, second)
        await env.initialize()
        assert env._client is not None
        assert env._client._wire is not None
        assert kept[0] in env._client._wire._idle  # readiness, info and calls on that one
        result = await env.call_tool("execute_command", {"command": "echo reserved"})
        assert "reserved" in str(result.structured)
        await env.release()
        assert (await maker.get(second.id)).state is InstanceState.TERMINATED
        assert await maker.prewarm(SPEC, pool="r", count=1) == 1

        # a claim the engine cannot record ends its instance, and leaves the pod to whoever
        # changed it: the engine's watch is stopped (a lagging watch), another writer takes the
        # reserved pod meanwhile, then the engine hands it out from its stale memory
        async def refilled() -> bool:
            return len(maker._reserved.get(next(iter(maker._reserved)), {})) == 2

        await eventually(refilled, "the reservations refilled to two", deadline=120)
        maker._cache.stop()
        await asyncio.sleep(0.5)
        from kubernetes import client

        held = {p.metadata.labels[LABEL_INSTANCE]: p for p in reserved()}
        with real_node.api_client() as api:
            for pod in held.values():
                client.CoreV1Api(api).patch_namespaced_pod(
                    pod.metadata.name,
                    namespace,
                    {
                        "metadata": {
                            "labels": {LABEL_SESSION: "someone-else"},
                            "annotations": {ANNOTATION_CLAIM: "someone-else"},
                        }
                    },
                )
        lost = await maker.claim(SPEC, pool="r")
        assert lost is not None
        assert lost.id in held

        async def ended() -> bool:
            return (await maker.get(lost.id)).state is InstanceState.TERMINATED

        await eventually(ended, "the unrecordable claim's instance ended")
        end = await maker.get(lost.id)
        assert end.reason is TerminationReason.CRASHED
        assert "another client changed its claim" in end.detail
        env = Environment.adopt(maker, lost)
        with pytest.raises(InstanceBrokenError, match="another client changed its claim"):
            await env.initialize()  # the engine told it the instance ended
        await env.release()
        (pod,) = [
            p for p in _pods(real_node, namespace) if p.metadata.labels[LABEL_INSTANCE] == lost.id
        ]
        assert pod.metadata.deletion_timestamp is None  # not ours: left to its new holder
        assert pod.metadata.annotations[ANNOTATION_CLAIM] == "someone-else"

        await maker.aclose()  # its session's pods end with it, reserved ones included

        def maker_left() -> bool:
            return not [
                p
                for p in _live(_pods(real_node, namespace))
                if p.metadata.labels.get(LABEL_SESSION) == maker.session
            ]

        assert maker_left()
        assert len(_live(_pods(real_node, namespace))) == 2  # the two someone else took
    finally:
        await maker.aclose()
        await rival.aclose()
