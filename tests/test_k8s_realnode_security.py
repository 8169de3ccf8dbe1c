"""The Kubernetes engine's security promises, checked from inside pods it made on a real node
(issue 28, point 4): a real kubelet running the image through containerd and runc, so the
securityContext, the limits and the missing service-account token are the kernel's, not the
manifest's word.

Each promise is read twice from inside the pod: by the environment's own tool (what the agent
sees: ``execute_command`` of a mini-terminal whose ``deployConfig`` asks 256 MiB and half a CPU),
and by a process the container runtime starts in the container (``exec``), which carries only
what the pod spec gave it, not the hardening the runtime adds to itself (its own seccomp filter
and ``no_new_privs``): so a ``NoNewPrivs: 1`` or a seccomp filter there is the pod's.

Runs on the real node (the ``real_node`` fixture: the running one, else started by the session),
from mini-terminal's own image, built there once per machine (``aenv build`` and the kit's
``build-image``; tests/_k8s_images.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import Environment
from aenv_ray.engine import InstanceSpec
from aenv_ray.protocol import BUNDLE_KEY_ENV, TOKEN_ENV, TOKEN_SHA256_ENV
from k8s_backend import KubernetesEngine, OwnImage
from k8s_backend.manifests import pod_name
from tests._k8s import KubeCluster
from tests._k8s_images import ImageUnavailable, built_environment
from tests._kits import mini_terminal_image
from tests._realnode import RealNode

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parent.parent
NAME = "sec-terminal"  # a copy of mini-terminal with small limits, run from mini-terminal's image
MEMORY = 256 << 20
CPU_QUOTA = 50_000  # 500m: half of the default CFS period (100000 us)


@pytest.fixture(scope="module")
def image(real_node: RealNode) -> str:
    """mini-terminal's own image (``aenv build`` + the kit's ``build-image``, once per
    machine): the pod spec, not the image, is what these tests check."""
    try:
        return built_environment(REPO / "builtin_envs" / "mini_terminal", mini_terminal_image())
    except ImageUnavailable as exc:
        if os.environ.get("AENV_REQUIRE_K8S") == "1":
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def env_path(tmp_path_factory: pytest.TempPathFactory, image: str) -> Path:
    """A directory holding ``sec-terminal@1.0.0``: mini-terminal's definition with 256 MiB and
    500m, naming the image mini-terminal's own (``PREFIX/mini-terminal:1.0.0``: nothing built
    for the test). The limits in the pod come from this copy's ``deployConfig``."""
    root = tmp_path_factory.mktemp("envs")
    project = root / NAME
    shutil.copytree(
        REPO / "builtin_envs" / "mini_terminal",
        project,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    config = json.loads((project / "config.json").read_text())
    config["name"] = NAME
    config["artifacts"] = [{"type": "image", "content": image}]
    config["deployConfig"].update(memory="256M", cpu="500m")
    (project / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def namespace(real_node: RealNode) -> Iterator[str]:
    """A namespace of this module's own, deleted with everything in it afterwards."""
    with real_node.scratch_namespace("k8ssec") as (_, name):
        yield name


@pytest.fixture
async def engine(
    real_node: RealNode, namespace: str, env_path: Path, image: str
) -> AsyncIterator[KubernetesEngine]:
    engine = KubernetesEngine(
        namespace,
        kubeconfig=real_node.kubeconfig,
        delivery=OwnImage(image.rsplit("/", 1)[0]),
        env_path=str(env_path),
    )
    try:
        yield engine
    finally:
        await engine.aclose()  # deletes the session's pods


def _exec(cluster: KubeCluster, namespace: str, pod: str, script: str) -> str:
    """``sh -c script`` started in the pod's runtime container by the container runtime (as
    ``kubectl exec``): its stdout and stderr."""
    from kubernetes import client
    from kubernetes.stream import stream

    with cluster.api_client() as api:
        session = stream(
            client.CoreV1Api(api).connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container="runtime",
            command=["sh", "-c", script],
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            _preload_content=False,
        )
        try:
            session.run_forever(timeout=60)
            status = session.read_channel(3)  # the exec's status, once it has ended
            output = str(session.read_all())  # stdout and stderr as they came
        finally:
            session.close()
            session.sock.shutdown()  # its socket too, when the server closed first
    assert json.loads(status or "{}").get("status") == "Success", (status, output)
    return output


def _status(text: str) -> dict[str, str]:
    """The ``Key:\\tvalue`` lines of a ``/proc/PID/status``."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


async def _shell(env: Environment, command: str) -> dict[str, Any]:
    result = await env.call_tool("execute_command", {"command": command})
    assert not result.is_error, result
    assert isinstance(result.structured, dict)
    return result.structured


CGROUP = "/sys/fs/cgroup"
LIMITS = (
    f"cat {CGROUP}/memory/memory.limit_in_bytes {CGROUP}/cpu/cpu.cfs_quota_us "
    f"{CGROUP}/cpu/cpu.cfs_period_us"
)


async def test_the_pods_security_context_holds_inside_the_pod(
    real_node: KubeCluster, namespace: str, engine: KubernetesEngine
) -> None:
    info = await engine.create(InstanceSpec(f"{NAME}@1.0.0", ttl=600), timeout=180)
    pod = pod_name(NAME, info.id)
    assert info.token
    async with Environment.adopt(engine, info) as env:
        # what the agent's processes are: the tool's own shell
        seen = await _shell(
            env,
            "id -u; id -g; cat /proc/self/status; echo ===; touch /probe 2>&1; "
            "touch /etc/probe 2>&1; echo ===; ls /var/run/secrets/kubernetes.io/serviceaccount "
            f"/run/secrets 2>&1; echo ===; {LIMITS}; echo ===; env; echo ===; "
            "cat /proc/1/environ 2>&1 | tr '\\0' '\\n'",
        )
        head, writes, secrets, limits, environ, runtime_environ = _split(seen["output"], 5)
        uid, gid, status = head.split("\n", 2)
        assert (uid, gid) == ("65534", "65534")  # non-root: the pod's runAsUser, not the image's
        fields = _status(status)
        assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0" * 16
        assert fields["NoNewPrivs"] == "1"
        assert fields["Seccomp"] == "2"  # filtering
        assert writes.count("Read-only file system") == 2, writes
        assert secrets.count("No such file or directory") == 2, secrets  # no service-account token
        memory, quota, period = limits.split()
        assert (int(memory), int(quota), int(period)) == (MEMORY, CPU_QUOTA, 100_000)
        # the token opens the instance: it is in no variable the agent sees, and the runtime's own
        # environment cannot be read from a tool (not dumpable)
        assert info.token not in seen["output"]
        assert TOKEN_SHA256_ENV not in environ
        assert TOKEN_ENV not in environ
        assert BUNDLE_KEY_ENV not in environ
        assert "Permission denied" in runtime_environ, runtime_environ

        # what the container is without the runtime's own hardening: a process runc starts in it
        # gets only the pod spec's settings (the runtime adds a second seccomp filter to itself)
        raw = _exec(
            real_node,
            namespace,
            pod,
            "id -u; cat /proc/self/status; echo ===; touch /probe 2>&1; echo ===; "
            f"ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1; echo ===; {LIMITS}",
        )
        head, exec_writes, exec_secrets, exec_limits = _split(raw, 3)
        exec_uid, _, exec_status = head.strip().partition("\n")
        assert exec_uid == "65534"
        fields = _status(exec_status)
        assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0" * 16  # drop: [ALL]
        assert fields["NoNewPrivs"] == "1"  # allowPrivilegeEscalation: false
        assert (fields["Seccomp"], fields["Seccomp_filters"]) == ("2", "1")  # RuntimeDefault alone
        assert "Read-only file system" in exec_writes  # readOnlyRootFilesystem
        assert "No such file or directory" in exec_secrets  # automountServiceAccountToken: false
        assert exec_limits.split() == limits.split()

        # the pod's spec, as anyone who may `get pods` reads it, holds the token's digest only
        spec = _pod_json(real_node, namespace, pod)
        assert info.token not in spec
        assert hashlib.sha256(info.token.encode()).hexdigest() in spec
        assert BUNDLE_KEY_ENV not in spec  # an image-delivered pod holds no hub key


def _split(text: str, parts: int) -> list[str]:
    """``text`` cut at its ``===`` lines, which must be ``parts``."""
    pieces = text.split("===\n")
    assert len(pieces) == parts + 1, text
    return pieces


def _pod_json(cluster: KubeCluster, namespace: str, pod: str) -> str:
    from kubernetes import client

    with cluster.api_client() as api:
        obj = client.CoreV1Api(api).read_namespaced_pod(pod, namespace)
        return json.dumps(api.sanitize_for_serialization(obj))


async def test_a_memory_hog_is_killed_at_the_pods_limit_and_its_neighbour_serves_on(
    real_node: KubeCluster, namespace: str, engine: KubernetesEngine
) -> None:
    spec = InstanceSpec(f"{NAME}@1.0.0", ttl=600)
    hog_info, neighbour_info = [await engine.create(spec, timeout=180) for _ in range(2)]
    async with (
        Environment.adopt(engine, hog_info) as hog,
        Environment.adopt(engine, neighbour_info) as neighbour,
    ):
        # 1 GiB touched page by page in a process of the agent's, in a pod of 256 MiB
        ran = await _shell(
            hog,
            "python3 -c 'b = bytearray(1 << 30); print(\"allocated\", len(b))'; echo rc=$?; "
            f"cat {CGROUP}/memory/memory.max_usage_in_bytes {CGROUP}/memory/memory.oom_control",
        )
        output = ran["output"]
        assert "allocated 1073741824" not in output, output
        assert "rc=137" in output, output  # SIGKILL: the kernel's OOM killer, at the limit
        peak, *counters = output.split("rc=137", 1)[1].strip().splitlines()
        assert int(peak) <= MEMORY, (peak, MEMORY)  # the cgroup's high-water mark
        assert int(dict(line.split() for line in counters)["oom_kill"]) >= 1, output
        # the hog's pod still serves (the kernel killed the largest process: the hog), and so
        # does its neighbour, whose limit was never touched
        assert (await _shell(hog, "echo alive"))["output"].strip() == "alive"
        other = await _shell(
            neighbour, f"echo alive; grep -w oom_kill {CGROUP}/memory/memory.oom_control"
        )
        assert other["output"].split() == ["alive", "oom_kill", "0"]
    # the node itself never felt it
    from kubernetes import client

    with real_node.api_client() as api:
        nodes = client.CoreV1Api(api).list_node().items
    for node in nodes:
        conditions = {c.type: c.status for c in node.status.conditions or ()}
        assert conditions.get("Ready") == "True", conditions
        assert conditions.get("MemoryPressure") == "False", conditions


def _pod_pids_limit(cluster: KubeCluster) -> int | None:
    """The kubelet's ``podPidsLimit`` (its configz, through the API server's node proxy), the
    only bound on a pod's processes: a pod spec cannot set one. None where unreadable."""
    from kubernetes import client

    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        node = core.list_node().items[0].metadata.name
        try:
            response = core.connect_get_node_proxy_with_path(
                node, "configz", _preload_content=False
            )
        except client.ApiException:
            return None
        try:
            raw = response.data
        finally:
            response.release_conn()
    try:
        limit = json.loads(raw)["kubeletconfig"].get("podPidsLimit")
    except (ValueError, KeyError, TypeError):
        return None
    return int(limit) if limit is not None else None


async def test_a_fork_bomb_stops_at_the_pods_process_limit(
    real_node: KubeCluster, engine: KubernetesEngine
) -> None:
    limit = _pod_pids_limit(real_node)
    if limit is None or limit <= 0:
        # never run a fork bomb where nothing bounds it: it would take the machine's pids
        pytest.skip(
            f"the node's kubelet sets no podPidsLimit ({limit}): nothing bounds a pod's "
            "processes there (a pod spec cannot); start its kubelet with --pod-max-pids=N "
            "(the realnode kit: KUBELET_ARGS=--pod-max-pids=1024 start)"
        )
    info = await engine.create(InstanceSpec(f"{NAME}@1.0.0", ttl=600), timeout=180)
    async with Environment.adopt(engine, info) as env:
        # processes that each sleep, started until fork fails; then all of them are ended
        ran = await _shell(
            env,
            "python3 - <<'EOF'\n"
            "import os\n"
            "kids = []\n"
            "try:\n"
            f"    for _ in range({limit} * 2):\n"
            "        pid = os.fork()\n"
            "        if pid == 0:\n"
            "            os.execv('/bin/sleep', ['sleep', '600'])  # small: no Python each\n"
            "        kids.append(pid)\n"
            "except OSError as exc:\n"
            "    print('refused after', len(kids), exc.errno)\n"
            "for pid in kids:\n"
            "    os.kill(pid, 9)\n"
            "    os.waitpid(pid, 0)\n"
            "EOF",
        )
        words = ran["output"].split()
        assert words[:2] == ["refused", "after"], ran
        assert int(words[2]) < limit, ran
        assert (await _shell(env, "echo alive"))["output"].strip() == "alive"
