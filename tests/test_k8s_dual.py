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


HOST_PODS = pytest.mark.fake_kubelet(
    "its second container is a directory of this host (HostProcess(shared_root=...)), not an image"
)


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
@HOST_PODS
async def test_a_tool_runs_commands_and_files_in_the_second_container(
    kube_cluster: KubeCluster, namespace: str, project: Path, shared_root: Path
) -> None:
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


# -- swe@1.0.0 on the datasource path: strict grading in the second container ---------------------

RUNNER_LINE = "result = unittest.TextTestRunner(verbosity=args.verbosity).run(suite)"
ALWAYS_OK = (
    "def _ok(self, result=None):\n"
    "    result.startTest(self)\n"
    "    result.addSuccess(self)\n"
    "    result.stopTest(self)\n"
    "unittest.TestCase.run = _ok\n"
    "unittest.TestCase.__call__ = _ok\n" + RUNNER_LINE
)


@pytest.fixture
def swe_project(tmp_path: Path) -> Path:
    """swe@1.0.0's project as a ``DualContainer`` environment: its repository, its commands
    and its grading in the second container (``SWE_DATASOURCE=1``)."""
    import builtin_envs

    source = Path(builtin_envs.__file__).resolve().parent / "swe"
    root = tmp_path / "swe-dual"
    shutil.copytree(source / "src", root / "src")
    config = json.loads((source / "config.json").read_text())
    config["name"] = "swe-dual"
    config["deployConfig"] = {
        **{k: v for k, v in config["deployConfig"].items() if k != "judgeContainer"},
        "podTemplate": "DualContainer",
        "imagePrefix": "registry.local/aenv/",
    }  # the datasource container runs and grades everything: no judge container
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.k8s
@pytest.mark.timeout(2400)
@HOST_PODS
async def test_swe_strict_grading_in_the_datasource_container_leaves_test_tampering_out(
    kube_cluster: KubeCluster, namespace: str, swe_project: Path, shared_root: Path
) -> None:
    """The dual-container path of swe's grading (``DatasourceSandbox``: the repository, the
    agent's commands, the judge's checkout and the tests all in the second container): the
    test runner patched to pass every test is left out and listed, reward 0 with a reason;
    graded as SWE-bench grades, the same attack scores 1.0; the gold patch still resolves."""
    from builtin_envs.demos import swe as demo

    # the second container is a process of this host here: the repository is a directory of
    # this host, which only it writes (the runtime reaches it through the exec helper)
    work = Path(tempfile.mkdtemp(prefix="aenv-swe-dual-"))
    engine = kube_cluster.engine(namespace, delivery=HostProcess(shared_root=shared_root))
    try:
        env = Environment.from_project(
            swe_project,
            engine=engine,
            datasource="swe-testbed:1",
            ttl=900,
            timeout=300,
            environment_variables={"SWE_DATASOURCE": "1", "SWE_REPO_DIR": str(work / "testbed")},
        )
        async with env:
            await env.call_function("swe_reset", {"instance_id": "demo__textkit-1"})
            # the control: the agent's commands run in the datasource container (their parent
            # is its exec helper), on the repository there
            where = await env.call_tool(
                "run_command", {"command": "cat /proc/$PPID/comm; pwd; git log --oneline | wc -l"}
            )
            assert where.structured is not None, where.text
            comm, cwd, commits = where.structured["output"].split()
            assert comm.startswith("aenv-exec"), where.structured
            assert cwd == str(work / "testbed"), where.structured
            assert int(commits) >= 1
            tampered = await env.call_tool(
                "str_replace",
                {"path": "tests/runtests.py", "old_str": RUNNER_LINE, "new_str": ALWAYS_OK},
            )
            assert not tampered.is_error, tampered.text

            strict = await env.call_reward({})
            assert strict["strict"] is True
            assert strict["reward"] == 0.0, strict["test_log"]
            assert strict["resolution"] == "RESOLVED_NO"
            assert {"path": "tests/runtests.py", "reason": "test"} in [
                {"path": i["path"], "reason": i["reason"]} for i in strict["left_out"]
            ], strict["left_out"]
            assert "left out of the graded change: tests/runtests.py (test)" in strict["reason"]
            # the agent's repository is back as it left it
            kept = await env.call_tool("run_command", {"command": "git diff --stat"})
            assert kept.structured is not None
            assert "tests/runtests.py" in kept.structured["output"]
            # the control: graded as SWE-bench grades, in the agent's repository, it works
            swebench = await env.call_reward({"strict": False})
            assert swebench["reward"] == 1.0, swebench["test_log"]

            # the gold patch still resolves there
            await env.call_function("swe_reset", {"instance_id": "demo__textkit-1"})
            assert await demo.policy({"id": "demo__textkit-1"}, env)
            gold = await env.call_reward({})
            assert (gold["reward"], gold["resolution"]) == (1.0, "RESOLVED_FULL"), gold["test_log"]
            assert gold["left_out"] == []
            # the fix beside a change larger than the helper returns (16 MiB): a diff cut
            # short is not graded as if it were the whole change
            big = "head -c 13000000 /dev/urandom | base64 -w 76 > zz_data.txt"
            made = await env.call_tool("run_command", {"command": big})
            assert made.structured is not None, made.text
            assert made.structured["returncode"] == 0, made.structured
            cut = await env.call_reward({})
            assert cut["reward"] == 0.0
            assert cut["reason"].startswith("the agent's change is larger than the grading"), cut
        # the judge's checkout and home went with the grading; only the repository is left
        left = await asyncio.to_thread(lambda: sorted(p.name for p in work.iterdir()))
        assert left == ["testbed"]
    finally:
        await engine.aclose()
        shutil.rmtree(work, ignore_errors=True)
