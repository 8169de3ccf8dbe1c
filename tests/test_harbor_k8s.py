"""Harbor on aenv-ray's Kubernetes engine: ``harbor run -a oracle --env
aenv_harbor:AenvRayEnvironment --ek engine=kubernetes`` through Harbor's own CLI
(``harbor==0.25.0`` in its own Python 3.12 environment, tests/_oracles.py ``HARBOR``), on a
cluster that runs images (the real node of ../shared/tools/k8s-realnode): each trial's pod runs
the task's own image, derived and built by the operator's builder (aenv_harbor.kube).

Runs when ``AENV_TEST_KUBECONFIG`` names such a cluster and ``AENV_TEST_IMAGE_PREFIX`` the
registry its images are tagged in (docs/ecosystem.md, *Kubernetes*); the builder is
``AENV_HARBOR_BUILDER``, else the real-node kit's ``build-image`` beside the checkout
(``AENV_K8S_REALNODE_TOOLS``). The runtime image of ``harbor-pod`` is content-keyed here (its
definition and aenv-ray's datasource client): built once, with ``aenv build`` and the builder,
when the cluster's node does not have it (some minutes), so a changed project never runs an
old image. One job of four tasks: one whose solution passes, one whose
solution fails, one that checks the image's ``WORKDIR``, ``ENV``, ``COPY`` and ``RUN``, the
commands' user, and Harbor's uploads and downloads, one with a prebuilt ``docker_image`` and
no Dockerfile, one whose agent runs past its time, and one
whose agent puts a socket of its own in place of the exec helper's (to answer the verifier's
commands itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from aenv_ray.bundle import definition_digest
from tests._cli import aenv
from tests._k8s import REPO, KubeCluster
from tests._oracles import HARBOR, oracle_python
from tests.test_harbor import CHECK_HELLO, REWARD, _exception, _reward

HOW_TO = (
    "Harbor on Kubernetes needs a cluster that runs images: AENV_TEST_KUBECONFIG="
    "~/.cache/k8s-real/realnode/kubeconfig AENV_TEST_IMAGE_PREFIX=realnode.local/aenv "
    "(docs/ecosystem.md#kubernetes)"
)
pytestmark = [
    pytest.mark.skipif(not os.environ.get("AENV_TEST_KUBECONFIG"), reason=HOW_TO),
    # the first run on a node builds harbor-pod's image (minutes), then the task images
    pytest.mark.timeout(2400),
]

BASE = "debian:bookworm-slim"  # an image the real node has (its kit builds it offline)
TASK_TOML = """schema_version = "1.4"

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = {agent_timeout}
{environment}"""
HELLO_DOCKERFILE = f"FROM {BASE}\nWORKDIR /app\n"
IO_DOCKERFILE = f"""FROM {BASE}
ENV GREETING="hello there"
WORKDIR /srv
WORKDIR app
COPY data.txt ./data.txt
RUN echo "built in $(pwd) as $(id -u)" > built.txt
"""
# an agent that binds its own socket where the exec helper's was (perl is in Debian's base), in a
# session of its own so that it outlives the command, to answer the verifier's commands itself
FORGE_SOLVE = """#!/bin/bash
echo hello > /app/hello.txt
mv /aenv-shared/exec.sock /aenv-shared/helper.sock
setsid perl -MIO::Socket::UNIX -e '
    my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => "/aenv-shared/exec.sock",
                                  Listen => 5) or die "bind: $!";
    while (my $c = $s->accept) { close $c }' </dev/null >/dev/null 2>&1 &
for _ in $(seq 50); do [ -S /aenv-shared/exec.sock ] && break; sleep 0.1; done
"""
# a prebuilt image and no Dockerfile: environment/ is uploaded into the task's workdir at start
PREBUILT_TOML = f"""
[environment]
docker_image = "{BASE}"
workdir = "/work"
"""
PREBUILT_SOLVE = """#!/bin/bash
pwd > where.txt
cp data.txt copy.txt
"""
PREBUILT_TEST = f"""#!/bin/bash
[ "$(cat /work/where.txt)" = /work ] && [ "$(cat /work/copy.txt)" = "the data" ] \\
    && echo 1 > {REWARD} || echo 0 > {REWARD}
"""
IO_SOLVE = """#!/bin/bash
set -e
pwd > where.txt
echo "$GREETING" > env.txt
id -u > uid.txt
mkdir -p /logs/agent && echo "agent ran" > /logs/agent/tool.txt
"""
IO_TEST = f"""#!/bin/bash
ok=1
[ "$(cat /srv/app/where.txt)" = /srv/app ] || ok=0
[ "$(cat /srv/app/env.txt)" = "hello there" ] || ok=0
[ "$(cat /srv/app/data.txt)" = "the data" ] || ok=0
[ "$(cat /srv/app/built.txt)" = "built in /srv/app as 0" ] || ok=0
[ "$(cat /logs/agent/tool.txt)" = "agent ran" ] || ok=0
[ -f /tests/test.sh ] && [ -f /solution/solve.sh ] || ok=0
echo "checked: $ok uid: $(cat /srv/app/uid.txt)" > /logs/verifier/notes.txt
echo $ok > {REWARD}
"""


def _task(
    root: Path,
    name: str,
    *,
    dockerfile: str = HELLO_DOCKERFILE,
    solve: str,
    test: str = CHECK_HELLO,
    agent_timeout: float = 120.0,
    files: dict[str, str] | None = None,
    environment: str = "",
) -> None:
    task = root / name
    for part in ("environment", "solution", "tests"):
        (task / part).mkdir(parents=True)
    toml = TASK_TOML.format(agent_timeout=agent_timeout, environment=environment)
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text(f"Task {name}: write /app/hello.txt saying hello.\n")
    if dockerfile:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    for relative, text in (files or {}).items():
        (task / "environment" / relative).write_text(text)
    (task / "solution" / "solve.sh").write_text(solve)
    (task / "tests" / "test.sh").write_text(test)


def _builder() -> str:
    given = os.environ.get("AENV_HARBOR_BUILDER")
    if given:
        return given
    tools = os.environ.get("AENV_K8S_REALNODE_TOOLS")
    candidates = [Path(tools)] if tools else []
    candidates += [base / "shared" / "tools" / "k8s-realnode" for base in REPO.parents[:2]]
    for folder in candidates:
        if (folder / "build-image").is_file():
            return f"{folder / 'build-image'} -t {{tag}} -f {{dockerfile}} {{context}}"
    pytest.skip(
        "no image builder: set AENV_HARBOR_BUILDER (e.g. `build-image -t {tag} -f {dockerfile} "
        "{context}` of ../shared/tools/k8s-realnode) or AENV_K8S_REALNODE_TOOLS"
    )


def _node_images(cluster: KubeCluster) -> set[str]:
    from kubernetes import client

    with cluster.api_client() as api:
        nodes = client.CoreV1Api(api).list_node().items
    return {name for node in nodes for image in node.status.images or [] for name in image.names}


POD_DIR = REPO / "aenv_harbor" / "pod"


def _runtime_prefix(prefix: str, builder: str, cluster: KubeCluster, scratch: Path) -> str:
    """An image prefix under which ``harbor-pod:1.0.0`` is this checkout's (its definition and
    the datasource client it relays through), built first when the node lacks it."""
    key = hashlib.sha256(definition_digest(POD_DIR).encode())
    key.update((REPO / "aenv_ray" / "datasource.py").read_bytes())
    runtime_prefix = f"{prefix}/harbor-pod-{key.hexdigest()[:12]}"
    tag = f"{runtime_prefix}/harbor-pod:1.0.0"
    if any(name.endswith(tag) for name in _node_images(cluster)):
        return runtime_prefix
    built = aenv("build", str(POD_DIR), "--out", str(scratch), "--no-image")
    assert built.returncode == 0, built.stderr
    context = scratch / "image"
    line = builder.format(tag=tag, dockerfile=context / "Dockerfile", context=context)
    done = subprocess.run(
        ["/bin/sh", "-c", line], capture_output=True, text=True, timeout=1800, check=False
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return runtime_prefix


@pytest.fixture(scope="module")
def harbor_k8s_job(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, object]]:
    """Every trial's result.json, by task name, from one `harbor run` on the cluster."""
    if kube_cluster.runs_host_processes:
        pytest.skip(f"this cluster's kubelet runs no images (k8s-real). {HOW_TO}")
    prefix = os.environ.get("AENV_TEST_IMAGE_PREFIX", "").rstrip("/")
    if not prefix:
        pytest.skip(f"no AENV_TEST_IMAGE_PREFIX. {HOW_TO}")
    builder = _builder()
    python = oracle_python(HARBOR)
    root = tmp_path_factory.mktemp("harbor-k8s")
    runtime_prefix = _runtime_prefix(prefix, builder, kube_cluster, root / "harbor-pod")
    tasks = root / "tasks"
    _task(tasks, "passing", solve="#!/bin/bash\necho hello > /app/hello.txt\n")
    _task(tasks, "failing", solve="#!/bin/bash\necho goodbye > /app/hello.txt\n")
    _task(
        tasks,
        "io",
        dockerfile=IO_DOCKERFILE,
        solve=IO_SOLVE,
        test=IO_TEST,
        files={"data.txt": "the data\n"},
    )
    _task(
        tasks,
        "slow",
        solve="#!/bin/bash\nsleep 120\necho hello > /app/hello.txt\n",
        agent_timeout=5.0,
    )
    _task(tasks, "forger", solve=FORGE_SOLVE)
    _task(
        tasks,
        "prebuilt",
        dockerfile="",
        environment=PREBUILT_TOML,
        solve=PREBUILT_SOLVE,
        test=PREBUILT_TEST,
        files={"data.txt": "the data\n"},
    )
    jobs = root / "jobs"
    with kube_cluster.scratch_namespace("aenv-harbor") as (_, namespace):
        environment = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # Harbor's litellm: no fetch of its price map
            "KUBECONFIG": str(kube_cluster.kubeconfig),
            "AENV_K8S_NAMESPACE": namespace,
            "AENV_K8S_IMAGE_PREFIX": runtime_prefix,  # harbor-pod's image
            "AENV_HARBOR_BUILDER": builder,
            "AENV_HARBOR_REGISTRY": prefix,
        }
        command = [str(python.parent / "harbor"), "run", "-p", str(tasks), "-a", "oracle"]
        command += ["--env", "aenv_harbor:AenvRayEnvironment", "--ek", "engine=kubernetes"]
        done = subprocess.run(
            [*command, "-o", str(jobs), "-n", "2"],
            capture_output=True,
            text=True,
            env=environment,
            timeout=1800,
            check=False,
        )
    results: dict[str, dict[str, object]] = {}
    for path in jobs.glob("*/*/result.json"):
        result = json.loads(path.read_text())
        results[str(result["task_name"])] = result
    assert len(results) == 6, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return results


def test_the_oracle_passes_the_task_whose_solution_passes(harbor_k8s_job: dict) -> None:
    assert _exception(harbor_k8s_job["passing"]) == {}
    assert _reward(harbor_k8s_job["passing"]) == 1.0


def test_the_oracle_fails_the_task_whose_solution_fails(harbor_k8s_job: dict) -> None:
    assert _exception(harbor_k8s_job["failing"]) == {}
    assert _reward(harbor_k8s_job["failing"]) == 0.0


def test_the_image_cwd_env_uploads_and_downloads_behave_as_docker(harbor_k8s_job: dict) -> None:
    result = harbor_k8s_job["io"]
    assert _exception(result) == {}, _exception(result)
    assert _reward(result) == 1.0
    trial = Path(str(result["trial_uri"]).removeprefix("file://"))
    # downloaded by Harbor from the pod; the commands ran as the pod's user, never root
    assert (trial / "verifier" / "notes.txt").read_text() == "checked: 1 uid: 65534\n"
    assert (trial / "agent" / "tool.txt").read_text() == "agent ran\n"


def test_a_prebuilt_image_runs_with_its_environment_files(harbor_k8s_job: dict) -> None:
    result = harbor_k8s_job["prebuilt"]
    assert _exception(result) == {}, _exception(result)
    assert _reward(result) == 1.0


def test_an_agent_past_its_time_is_stopped_and_graded(harbor_k8s_job: dict) -> None:
    result = harbor_k8s_job["slow"]
    assert _exception(result)["exception_type"] == "AgentTimeoutError"
    assert _reward(result) == 0.0  # the killed solution wrote nothing


def test_an_agent_that_replaces_the_helper_s_socket_gets_no_reward(harbor_k8s_job: dict) -> None:
    result = harbor_k8s_job["forger"]
    info = _exception(result)
    assert "socket in the task's container was replaced" in info["exception_message"], info
    assert _reward(result) is None  # nothing it bound was asked for a verdict
