"""A ``DualContainer`` environment end to end: on the real API server, a pod whose init container
places the exec helper and whose second container serves it, and a tool of the environment that
runs a command and writes and reads a file in that second container; on the local engine, the
same tool's typed refusal (it runs one container only).

The test cluster's kubelet runs each container's command as a process of this host and mounts no
volumes, so the pod's shared directory is a directory of this host (``HostProcess(shared_root=)``;
``k8s_backend.manifests`` puts it in the commands in place of the ``emptyDir``'s mount path), and
the "second container" is a process beside the runtime's. Against another cluster
(``AENV_TEST_KUBECONFIG``) the environment's and aenv-ray's images would have to be in a registry:
the end-to-end test runs only where the kubelet runs host processes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import Environment
from k8s_backend import HostProcess
from k8s_backend.exec_helper import helper_binary
from tests._k8s import KubeCluster

TOOLS = '''
"""Tools that reach into the second container."""

from aenv_ray import datasource, register_tool


@register_tool
async def in_datasource(command: str) -> dict:
    """Run a shell line in the datasource container."""
    result = await datasource.run(["sh", "-c", command], timeout=30)
    return {"stdout": result.stdout_text, "stderr": result.stderr_text, "code": result.returncode}


@register_tool
async def round_trip(path: str, text: str) -> dict:
    """Write a file in the datasource container, read it back, list its directory."""
    written = await datasource.write_file(path, text, parents=True, mode=0o640)
    entries = await datasource.list_dir(path.rsplit("/", 1)[0])
    return {
        "written": written,
        "read": await datasource.read_text(path),
        "entries": [[e.name, e.kind.value, e.mode] for e in entries],
    }
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "dual-probe"
    (root / "src").mkdir(parents=True)
    config = {
        "name": "dual-probe",
        "version": "1.0.0",
        "deployConfig": {"podTemplate": "DualContainer", "imagePrefix": "registry.local/aenv/"},
    }
    (root / "config.json").write_text(json.dumps(config))
    (root / "src" / "dual_tools.py").write_text(TOOLS)
    return root


@pytest.fixture
def shared_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="aenv-dual-"))  # short: the socket's path is < 108 B
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    with kube_cluster.scratch_namespace("aenv-dual") as (_, name):
        yield name


@pytest.mark.k8s
@pytest.mark.timeout(2400)  # the first k8s test may pay for the cluster's one-time build
async def test_a_tool_runs_commands_and_files_in_the_second_container(
    kube_cluster: KubeCluster, namespace: str, project: Path, shared_root: Path
) -> None:
    if not kube_cluster.runs_host_processes:
        pytest.skip("needs a kubelet that runs pod commands on this host (k8s-real)")
    engine = kube_cluster.engine(namespace, delivery=HostProcess(shared_root=shared_root))
    try:
        env = Environment.from_project(project, engine=engine, datasource="busybox:1.36", ttl=600)
        async with env:
            [info] = await engine.list()
            shared = shared_root / info.id
            # the init container installed the helper in the pod's shared directory
            assert (shared / "aenv-exec").read_bytes() == helper_binary().read_bytes()
            assert (shared / "exec.sock").is_socket()

            ran = await env.call_tool("in_datasource", {"command": "echo hi; cat /etc/hostname"})
            assert not ran.is_error, ran.text
            hostname = await asyncio.to_thread(Path("/etc/hostname").read_text)
            assert ran.structured == {"stdout": "hi\n" + hostname, "stderr": "", "code": 0}

            target = shared_root / "files" / "notes.txt"
            done = await env.call_tool("round_trip", {"path": str(target), "text": "héllo"})
            assert not done.is_error, done.text
            assert done.structured == {
                "written": len("héllo".encode()),
                "read": "héllo",
                "entries": [["notes.txt", "file", 0o640]],
            }
            assert target.read_text() == "héllo"  # written by the second container's helper
    finally:
        await engine.aclose()


async def test_on_the_local_engine_the_tool_gets_the_typed_refusal(project: Path) -> None:
    async with Environment.from_project(project, ttl=120) as env:
        refused = await env.call_tool("in_datasource", {"command": "true"})
    assert refused.is_error
    assert "raised DatasourceNotConfiguredError" in refused.text
    assert 'engine="kubernetes"' in refused.text
