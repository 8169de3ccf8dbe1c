"""Harbor on aenv-ray's Kubernetes engine, on the real node: ``harbor run -a oracle --env
aenv_harbor:AenvRayEnvironment --ek engine=kubernetes`` through Harbor's own CLI
(``harbor==0.25.0`` in its own Python 3.12 environment, tests/_oracles.py ``HARBOR``) on the
session's real node (the ``real_node`` fixture, tests/_realnode.py: the running node, else the
kit's, started once per session), as the other real-node tests run: by default, in CI. Each
trial's pod runs the task's own image, derived and built by the operator's builder
(aenv_harbor.kube), here the kit's ``build-image`` (``AENV_HARBOR_BUILDER`` names another).

The images, kept cheap and keyed by content:

- ``harbor-pod``'s runtime image is this checkout's runtime image, which the session builds for
  every real-node test (``real_node.runtime_image``), plus harbor-pod's definition at ``/env``
  (``OwnImage``'s project), copied from the aenv_harbor that image installed and checked
  against the checkout's by its digest (tests/_k8s_images.py ``layered_image``:
  ``PREFIX/harbor-pod-KEY/harbor-pod:1.0.0``). KEY digests that Dockerfile, which names the
  runtime image by the digest of everything in it, so a change of harbor-pod, of aenv-ray's
  datasource client or of anything else the image holds is a new tag, never an old image: one
  layer on the runtime image, no PyPI install (18 s, most of it the kit saving and importing
  the whole 600 MB image; nothing when the kit has it).
- the tasks' images are ``FROM debian:bookworm-slim``, which the kit builds offline: three
  contents for the six tasks (four share one Dockerfile), built by aenv_harbor through the
  builder in every session (its build markers in a directory of the module's, so the build
  path is tested too), from buildah's layer cache after the first time: 4-5 s each, about as
  much for new layers (a small ``RUN`` and the save of a 127 MB image).

The file takes 38-40 s with harbor-pod's image there, 52 s when it is built too (session 36,
2 cores at load 3, the node running).

One job of six tasks, two trials at a time: one whose solution passes, one whose solution fails,
one that checks the image's ``WORKDIR``, ``ENV``, ``COPY`` and ``RUN``, the commands' user, and
Harbor's uploads and downloads, one with a prebuilt ``docker_image`` and no Dockerfile, one
whose agent runs past its time (5 s), and one whose agent puts a socket of its own in place of
the exec helper's (to answer the verifier's commands itself). Each case is one more pod of a
few seconds in the same job, so none is left for a run of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from aenv_ray.bundle import definition_digest
from aenv_ray.config import EnvConfig
from tests._k8s_images import ImageUnavailable, builder_command, image_prefix, layered_image
from tests._oracles import HARBOR, oracle_python
from tests._realnode import RealNode
from tests.test_harbor import CHECK_HELLO, REWARD, _exception, _reward

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(2400)]

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


POD_DIR = Path(__file__).resolve().parent.parent / "aenv_harbor" / "pod"


def _pod_lines() -> tuple[str, ...]:
    """harbor-pod's layer on the runtime image: its definition, as the runtime image's aenv-ray
    installed it, at ``/env`` (where ``OwnImage``'s pods serve their project from); the build
    fails when it is not the checkout's (an ``AENV_TEST_RUNTIME_IMAGE`` of another tree)."""
    digest = definition_digest(POD_DIR)
    script = (
        "import pathlib, shutil, sys, aenv_harbor; from aenv_ray.bundle import definition_digest; "
        "pod = pathlib.Path(aenv_harbor.__file__).parent / 'pod'; "
        "sys.exit('the runtime image holds another harbor-pod than this checkout, "
        f"{digest}: use the runtime image of this checkout') "
        f"if definition_digest(pod) != '{digest}' "
        "else shutil.copytree(pod, '/env', ignore=shutil.ignore_patterns('__pycache__'))"
    )
    return (f'RUN python -c "{script}"', "WORKDIR /env")  # as `aenv build`'s image


def _unavailable(exc: ImageUnavailable) -> NoReturn:
    """Skip saying why; under ``AENV_REQUIRE_K8S=1`` (CI) a failure."""
    if os.environ.get("AENV_REQUIRE_K8S") == "1":
        raise exc
    pytest.skip(str(exc))


@pytest.fixture(scope="module")
def harbor_pod_prefix(real_node: RealNode) -> str:
    """The image prefix under which ``harbor-pod:1.0.0`` is this checkout's, on the node."""
    config = EnvConfig.load(POD_DIR)
    try:
        tag = layered_image(
            real_node.runtime_image, config.name, _pod_lines(), version=config.version
        )
    except ImageUnavailable as exc:
        _unavailable(exc)
    return tag.removesuffix(f"/{config.image_tag}")


@pytest.fixture(scope="module")
def harbor_k8s_job(
    real_node: RealNode, harbor_pod_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, object]]:
    """Every trial's result.json, by task name, from one `harbor run` on the real node."""
    try:
        builder = os.environ.get("AENV_HARBOR_BUILDER") or builder_command()
    except ImageUnavailable as exc:
        _unavailable(exc)
    python = oracle_python(HARBOR)
    root = tmp_path_factory.mktemp("harbor-k8s")
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
    unset = ("AENV_SYSTEM_URL", "AENV_API_KEY", "AENV_ENGINE")
    with real_node.scratch_namespace("aenv-harbor") as (_, namespace):
        environment = {
            **{k: v for k, v in os.environ.items() if k not in unset},
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # Harbor's litellm: no fetch of its price map
            "KUBECONFIG": str(real_node.kubeconfig),
            "AENV_K8S_NAMESPACE": namespace,
            "AENV_K8S_DELIVERY": "image",
            "AENV_K8S_IMAGE_PREFIX": harbor_pod_prefix,  # harbor-pod's image
            # the exec helper the pods' init container copies: this checkout's
            "AENV_K8S_RUNTIME_IMAGE": real_node.runtime_image,
            "AENV_HARBOR_BUILDER": builder,
            "AENV_HARBOR_REGISTRY": image_prefix(),
            # the build markers: the module's own, so that each content is built by aenv_harbor
            # in every session (from buildah's layer cache once the kit built it)
            "AENV_HARBOR_IMAGES_DIR": str(root / "built"),
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
