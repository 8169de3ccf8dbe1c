"""Every built-in on the real node (``real_node``: ``../shared/tools/k8s-realnode``, the running
one or one the session starts): one episode each, graded, through ``aenv rollout --engine
kubernetes`` as a user runs it, the pods running this checkout's runtime image
(tests/_realnode.py: built once, keyed by content, with the kit's ``build-image``) and
mini-program's Chromium, terminal-bench's tmux and swe's git layered on it
(tests/_k8s_images.py).

The fake kubelet (k8s-real) runs pod commands as host processes, so it proves nothing about
images: these tests never run there.
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aenv_ray.engine
from tests._chat_server import AgentModel, ChatServer
from tests._cli import aenv
from tests._hub import HubProcess, new_key
from tests._k8s import KubeCluster
from tests._k8s_images import CHROMIUM, SWE_DATA, layered_or_skip, runtime_variant_or_skip
from tests._realnode import RealNode

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def realnode(real_node: RealNode) -> KubeCluster:
    return real_node


@pytest.fixture(scope="module")
def builtin_image(real_node: RealNode) -> str:
    """This checkout's runtime image on the node, which serves every built-in."""
    return real_node.runtime_image


@pytest.fixture(scope="module")
def browser_image(builtin_image: str) -> str:
    """mini-program's image: the runtime image built with Chromium (deploy/Dockerfile's
    ``EXTRA_PACKAGES``)."""
    return runtime_variant_or_skip(CHROMIUM)


@pytest.fixture(scope="module")
def swe_image(builtin_image: str) -> str:
    """The runtime image plus swe's demo rows at ``/data/swe``, where only its judge reads
    them (tests/test_k8s_swe_judge's image)."""
    return layered_or_skip(builtin_image, "swe", SWE_DATA)


@pytest.fixture(scope="module")
def namespace(realnode: KubeCluster) -> Iterator[str]:
    with realnode.scratch_namespace("builtins") as (_, name):
        yield name


def _close_named_engine() -> None:
    """The in-process command's process-wide engine (``named_engine``), closed as at its
    process's exit: it is bound to the test's namespace, and its session deletes what is left
    of its pods."""
    made = aenv_ray.engine._named.pop("kubernetes", None)
    if made is not None:
        atexit.unregister(made.close)  # type: ignore[attr-defined]
        made.close()  # type: ignore[attr-defined]


def _rollout(
    cluster: KubeCluster, namespace: str, image: str, out: Path, *args: str
) -> list[dict[str, Any]]:
    """``aenv rollout ARGS --engine kubernetes --no-ray`` with a user's settings (the
    cluster, the namespace, the runtime image); the run's records."""
    settings = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_RUNTIME_IMAGE": image,
        "AENV_K8S_DELIVERY": "image",
    }
    unset = ("AENV_SYSTEM_URL", "AENV_API_KEY", "AENV_ENGINE", "AENV_K8S_IMAGE_PREFIX")
    try:
        done = aenv(
            "rollout", *args, "--engine", "kubernetes", "--no-ray", "--out", str(out),
            env=settings, unset=unset,
        )  # fmt: skip
    finally:
        _close_named_engine()
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.timeout(600)
def test_a_definition_that_nests_namespaces_without_a_judge_is_refused_before_any_pod(
    realnode: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    """A definition whose code builds boxes with namespaces of its own, which a pod may not
    (deployConfig.nestedNamespaces), and that has no judge container (every built-in that
    nests them has one: terminal-bench and swe, below): the run stops at once with one line
    saying so and what to do, instead of recording every episode's failed setup as the
    agent's; no pod, no record. The project is mini-terminal's, its definition saying so."""
    import shutil

    from builtin_envs import builtin_path

    source = builtin_path("mini-terminal@1.0.0")
    assert source is not None
    project = tmp_path / "nested"
    shutil.copytree(source, project, ignore=shutil.ignore_patterns("__pycache__"))
    config = json.loads((project / "config.json").read_text())
    config["name"] = "nested-demo"
    config["deployConfig"]["nestedNamespaces"] = True
    config["deployConfig"]["imagePrefix"] = "registry.local/aenv/"  # never pulled: refused first
    (project / "config.json").write_text(json.dumps(config))
    tasks = _one_task("mini_terminal", "count-lines", tmp_path)
    settings = {
        "KUBECONFIG": str(realnode.kubeconfig),
        "AENV_K8S_NAMESPACE": namespace,
        "AENV_K8S_DELIVERY": "image",
    }
    unset = ("AENV_SYSTEM_URL", "AENV_API_KEY", "AENV_ENGINE", "AENV_K8S_IMAGE_PREFIX")
    out = tmp_path / "out"
    try:
        done = aenv(
            "rollout", str(project), "--tasks", str(tasks), "-n", "1",
            "--policy", "builtin_envs.demos.mini_terminal:policy", "--engine", "kubernetes",
            "--no-ray", "--out", str(out), env=settings, unset=unset,
        )  # fmt: skip
    finally:
        _close_named_engine()
    assert done.returncode == 2, done.stderr[-2000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("aenv: error: nested-demo@"), said
    assert "makes namespaces of its own" in said
    assert "--engine local" in said
    records = out / "trajectories.jsonl"
    assert not records.exists() or records.read_text() == ""
    assert _pods(realnode, namespace) == []


def _pods(cluster: KubeCluster, namespace: str) -> list[str]:
    from kubernetes import client

    with cluster.api_client() as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/managed-by=aenv-ray"
        )
    names = (pod.metadata for pod in pods.items if pod.metadata is not None)
    return [str(meta.name) for meta in names if meta.deletion_timestamp is None]


def _one_task(module: str, task: str, where: Path) -> Path:
    """A tasks file holding the built-in demo ``module``'s task ``task``."""
    import importlib

    tasks: list[dict[str, Any]] = importlib.import_module(f"builtin_envs.demos.{module}").TASKS
    chosen = [t for t in tasks if t["id"] == task]
    assert chosen, f"no demo task {task!r} in builtin_envs.demos.{module}"
    path = where / "tasks.jsonl"
    path.write_text(json.dumps(chosen[0]) + "\n")
    return path


def _graded(record: dict[str, Any], task: str) -> None:
    assert (record["task_id"], record["outcome"]) == (task, "ok"), record
    assert record["reward"] == 1.0, record.get("reason")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("env", "task"),
    [("mini-terminal@1.0.0", "count-lines"), ("tau2@1.0.0", "airline-1")],
)
def test_a_builtin_plays_a_graded_episode_on_the_real_node(
    realnode: KubeCluster,
    builtin_image: str,
    namespace: str,
    tmp_path: Path,
    env: str,
    task: str,
) -> None:
    """One episode of the built-in's demo task with its scripted policy, in a pod of the runtime
    image: graded 1.0 (the reward ran in the pod, on the pod's state); no pod left."""
    tasks = _one_task(env.split("@")[0].replace("-", "_"), task, tmp_path)
    (record,) = _rollout(
        realnode, namespace, builtin_image, tmp_path / "out", env, "--tasks", str(tasks), "-n", "1"
    )
    _graded(record, task)
    assert _pods(realnode, namespace) == []


@pytest.mark.timeout(1800)
def test_mini_program_renders_and_grades_its_page_in_a_pod(
    realnode: KubeCluster, browser_image: str, namespace: str, tmp_path: Path
) -> None:
    """mini-program's reward runs in the runtime's judge inside the pod (its processes ended,
    the page read from a copy, rendered by the image's Chromium); graded 1.0."""
    tasks = _one_task("mini_program", "hello", tmp_path)
    (record,) = _rollout(
        realnode, namespace, browser_image, tmp_path / "out",
        "mini-program@1.0.0", "--tasks", str(tasks), "-n", "1",
    )  # fmt: skip
    _graded(record, "hello")
    judge = (record.get("reward_components") or {}).get("judge") or {}
    assert judge.get("scope") == "pid namespace", record["reward_components"]
    assert _pods(realnode, namespace) == []


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("env", "task", "image"),
    [
        ("terminal-bench@1.0.0", "hello-world", "builtin_image"),
        ("swe@1.0.0", "demo__calc-1", "swe_image"),
    ],
)
def test_a_builtin_plays_a_graded_episode_with_its_judge_container(
    realnode: KubeCluster,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    env: str,
    task: str,
    image: str,
) -> None:
    """terminal-bench's and swe's demo task in a pod of the runtime image (which has their tmux
    and git; swe's demo rows added at ``/data/swe``), as a user runs it: the pod is the agent's
    box, the tests (swe: also the rows and the source repositories) are the pod's judge
    container's; graded 1.0, no pod left (wrong and forged answers: tests/test_k8s_tb_judge.py,
    tests/test_k8s_swe_judge.py)."""
    tasks = _one_task(env.split("@")[0].replace("-", "_"), task, tmp_path)
    (record,) = _rollout(
        realnode, namespace, request.getfixturevalue(image), tmp_path / "out",
        env, "--tasks", str(tasks), "-n", "1",
    )  # fmt: skip
    _graded(record, task)
    assert _pods(realnode, namespace) == []


def _node_address(cluster: KubeCluster) -> str:
    """The node's InternalIP: the address of this machine its pods reach (the real node's
    bridge address)."""
    from kubernetes import client

    with cluster.api_client() as api:
        (node,) = client.CoreV1Api(api).list_node().items
    addresses = (node.status.addresses if node.status else None) or []
    return next(str(a.address) for a in addresses if a.type == "InternalIP")


@pytest.mark.timeout(1800)
def test_the_agent_builtin_plays_a_graded_episode_on_the_real_node(
    realnode: KubeCluster, builtin_image: str, namespace: str, tmp_path: Path
) -> None:
    """agent@1.0.0 in a pod: its model (the tests' stand-in) and its hub (whose local engine
    runs the inner mini-terminal) on this machine at the node's address; graded 1.0 by the
    inner mini-terminal's reward."""
    node = _node_address(realnode)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}
    hub = HubProcess(tmp_path / "hub", extra=["--allow-network", "--host", node], env=clean)
    hub.url = f"http://{node}:{hub.port}"  # where it listens: the pods reach it there
    model_key = "sk-model-on-the-node"
    with ChatServer(AgentModel(), host=node) as model, hub:
        key = new_key("alice", hub.store)
        tasks = _one_task("agent", "sum-10", tmp_path)
        variables = {
            "AGENT_BASE_URL": model.url,
            "AGENT_MODEL": "stand-in",
            "AGENT_ENV": "mini-terminal@1.0.0",
            "OPENAI_API_KEY": model_key,
            "AENV_SYSTEM_URL": hub.url,
            "AENV_API_KEY": key,
        }
        given = [item for name, value in variables.items() for item in ("-e", f"{name}={value}")]
        (record,) = _rollout(
            realnode, namespace, builtin_image, tmp_path / "out",
            "agent@1.0.0", "--tasks", str(tasks), "-n", "1", *given,
        )  # fmt: skip
    _graded(record, "sum-10")
    assert _pods(realnode, namespace) == []


# -- a hostile agent in a pod ---------------------------------------------------------------------
EXPECTED = "Hello from the mini program!"
PAGE = (
    '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>x</title></head>\n'
    '<body><p id="out">nothing yet</p></body></html>\n'
)
# the agent's attack, run as a tool call still running while the reward is called: it prints the
# expected text, plants the page in /tmp and the home directory, and rewrites the page the moment
# a Chromium starts (the judge's); a child whose command line holds MARKER shows it is in place
ATTACK = f"""
import os, subprocess, sys, time
print({EXPECTED!r}, flush=True)
good = '<!DOCTYPE html>\\n<html><body><p>{EXPECTED}</p></body></html>\\n'
for where in ("/tmp/index.html", os.path.expanduser("~/index.html")):
    try:
        open(where, "w").write(good)
    except OSError:
        pass
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", "MARKER"])
while True:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"remote-debugging-pipe" in open(f"/proc/{{pid}}/cmdline", "rb").read():
                open("index.html.new", "w").write(good)
                os.rename("index.html.new", "index.html")
        except OSError:
            pass
    time.sleep(0.005)
"""


def _local(address: str) -> bool:
    """Whether ``address`` is one of this machine's (the real node's pods then run here)."""
    import socket

    try:
        with socket.socket() as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


@pytest.mark.timeout(1200)
async def test_a_hostile_agents_leftovers_do_not_change_mini_programs_grade_in_a_pod(
    realnode: KubeCluster, browser_image: str, namespace: str
) -> None:
    """The reward-integrity promise in a pod of the real node: a process the agent left running
    (which rewrites the page when the judge's Chromium starts), pages planted in /tmp and the
    home directory, and the expected text printed do not turn a page that does not show the text
    into 1.0: the judge ends the pod's other processes first (scope ``pid namespace``) and names
    them. The control: the honest page scores 1.0 in the same pod."""
    import asyncio
    import uuid

    from aenv_ray import Environment, JudgeReport
    from k8s_backend import OwnImage
    from tests._processes import processes_of

    if not _local(_node_address(realnode)):
        pytest.skip("watches the pod's processes in /proc: the node must be this machine")
    marker = f"agent-in-place-{uuid.uuid4().hex}"
    engine = realnode.engine(namespace, delivery=OwnImage(runtime_image=browser_image))
    arguments = {"expected_text": [EXPECTED]}
    try:
        async with Environment("mini-program@1.0.0", engine=engine, ttl=600) as env:
            await env.call_function("reset_project", {"files": {"index.html": PAGE}})
            code = ATTACK.replace("MARKER", marker)
            call = asyncio.ensure_future(
                env.call_tool("execute_python_code", {"code": code, "timeout": 120})
            )
            for _ in range(2400):  # in place before the reward is called
                if processes_of(marker) or call.done():
                    break
                await asyncio.sleep(0.05)
            assert processes_of(marker), (await call).text if call.done() else "not started"
            value = await env.call_reward(arguments)
            assert isinstance(value, dict)
            assert value["reward"] == 0.0, value
            assert value["reason"].startswith(f"the page does not show {EXPECTED!r}"), value
            report = JudgeReport.model_validate(value["judge"])
            assert report.scope == "pid namespace", report
            assert any(marker in p["command"] for p in report.processes), report
            # a pod may not make namespaces: no fresh /tmp for the judge, and it says so
            assert report.fresh_places == [], report
            assert report.fresh_refused, report
            await asyncio.wait_for(call, 120)
            assert not processes_of(marker)
            # the control: the page that shows the text, in the same pod
            honest = PAGE.replace("nothing yet", EXPECTED)
            await env.call_function("reset_project", {"files": {"index.html": honest}})
            graded = await env.call_reward(arguments)
            assert isinstance(graded, dict)
            assert graded["reward"] == 1.0, graded
    finally:
        await engine.aclose()
