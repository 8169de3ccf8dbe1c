"""What only a real kubelet shows, on the real node (tests/_realnode.py; the suite's default
real-node set, docs/testing.md): a runtime that outgrows its memory limit is OOMKilled by the
kernel and the engine reports it, naming the cause and the limit, to the call in flight and to
every later one, while the node and another pod go on; readiness is the kubelet's probe; an
image the node cannot pull fails the create with the registry's own answer, after the kubelet
retried it (a first failed pull is a wait)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import ConfigurationError, Environment, InstanceBrokenError
from aenv_ray.engine import InstanceSpec, InstanceState, TerminationReason
from aenv_ray.protocol import READY_PATH
from builtin_envs import builtin_refs
from k8s_backend import OwnImage
from k8s_backend.manifests import LABEL_INSTANCE
from tests._realnode import RealNode

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(2400)]

# mini-terminal's deployConfig.memory, 2G: the pod's limit as the API server keeps it
LIMIT = "2Gi"
# The kernel's OOM killer takes the process of the cgroup with the most memory: one hog process
# would be the one killed (its command exits 137, the instance lives: ONE_HOG below), and the
# runtime cannot be made the victim from inside
# (its /proc/1/oom_score_adj is root's: it is not dumpable). The instance as a whole outgrowing
# its limit, in processes each smaller than the runtime, makes the runtime the largest: it is
# killed, and so the container, OOMKilled.
HOG = """python3 - <<'EOF'
import os, time
for _ in range(120):  # 120 x 24 MiB, past the 2 GiB limit; each child smaller than the runtime
    if os.fork() == 0:
        chunk = bytearray(24 * 1024 * 1024)
        time.sleep(300)
        os._exit(0)
time.sleep(300)
EOF"""
ONE_HOG = "python3 -c 'b = bytearray(3 * 1024 ** 3)'"


@pytest.fixture
def namespace(real_node: RealNode) -> Iterator[str]:
    with real_node.scratch_namespace("realnode-t") as (_, name):
        yield name


def _pod(node: RealNode, namespace: str, instance_id: str) -> Any:
    from kubernetes import client

    with node.api_client() as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"{LABEL_INSTANCE}={instance_id}"
        )
    assert len(pods.items) == 1
    return pods.items[0]


def _node_ready(node: RealNode) -> bool:
    from kubernetes import client

    with node.api_client() as api:
        nodes = client.CoreV1Api(api).list_node().items
    return all(
        any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        for n in nodes
    )


async def test_a_memory_hog_is_oomkilled_and_reported_with_its_limit_others_unaffected(
    real_node: RealNode, namespace: str
) -> None:
    engine = real_node.engine(namespace)
    try:
        async with (
            Environment("mini-terminal@1.0.0", engine=engine, ttl=600) as hog,
            Environment("mini-terminal@1.0.0", engine=engine, ttl=600) as bystander,
        ):
            assert hog.instance_id is not None
            assert bystander.instance_id is not None
            # readiness is the kubelet's: the runtime's probe, and the pod Ready by it
            pod = _pod(real_node, namespace, hog.instance_id)
            runtime = next(c for c in pod.spec.containers if c.name == "runtime")
            assert runtime.readiness_probe.http_get.path == READY_PATH
            assert runtime.resources.limits["memory"] == LIMIT
            assert all(s.ready for s in pod.status.container_statuses)

            # one process past the limit is killed alone: the command's failure, not the instance's
            alone = await hog.call_tool("execute_command", {"command": ONE_HOG, "timeout": 120})
            assert alone.structured["returncode"] == 137
            assert "Killed" in alone.structured["output"]

            with pytest.raises(InstanceBrokenError) as broken:
                await hog.call_tool("execute_command", {"command": HOG, "timeout": 120})
            said = str(broken.value)
            assert "out of memory" in said
            assert "OOMKilled" in said
            assert f"its limit, {LIMIT}" in said
            # every later call says the same at once, from the engine's account
            with pytest.raises(InstanceBrokenError, match="OOMKilled"):
                await hog.call_tool("execute_command", {"command": "echo hi"})
            info = await engine.get(hog.instance_id)
            assert info.state is InstanceState.TERMINATED
            assert info.reason is TerminationReason.OUT_OF_MEMORY
            ended = _pod(real_node, namespace, hog.instance_id).status.container_statuses[0]
            assert ended.state.terminated.reason == "OOMKilled"

            # the node and the other pod are unaffected
            assert _node_ready(real_node)
            result = await bystander.call_tool("execute_command", {"command": "echo still here"})
            assert result.structured == {"output": "still here\n", "returncode": 0}
    finally:
        await engine.aclose()


async def test_an_image_the_node_cannot_pull_fails_the_create_with_the_registrys_answer(
    real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    """A project of its own (a copy of mini-terminal elsewhere is not the built-in) whose image
    no registry serves: the node's containerd resolves every registry to a closed port. The
    kubelet's first pull fails (ErrImagePull, a wait), it backs off (ImagePullBackOff), and the
    create fails with ConfigurationError naming the image and quoting the failed pull."""
    project = tmp_path / "mini-terminal"
    shutil.copytree(builtin_refs()["mini-terminal@1.0.0"], project)
    prefix = f"realnode.local/never-built-{uuid.uuid4().hex[:6]}"
    engine = real_node.engine(namespace, delivery=OwnImage(prefix))
    spec = InstanceSpec("mini-terminal@1.0.0", project=str(project))
    try:
        with pytest.raises(ConfigurationError) as refused:
            await engine.create(spec, timeout=120)
        said = str(refused.value)
        assert f"{prefix}/mini-terminal:1.0.0" in said
        assert "ImagePullBackOff" in said
        assert "the pull failed with:" in said
        assert "127.0.0.1:1" in said  # the registry's answer: the kit's closed port
        # its pod is deleted: the engine knows of it only as ended
        assert [i.state for i in await engine.list()] in ([], [InstanceState.TERMINATED])
    finally:
        await engine.aclose()
