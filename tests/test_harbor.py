"""Harbor on aenv-ray: ``harbor run -a oracle --env aenv_harbor:AenvRayEnvironment`` through
Harbor's own code (``harbor==0.25.0`` in a Python 3.12 virtual environment of its own, with
aenv-ray from this checkout: tests/_oracles.py ``HARBOR``), on the local engine.

One job runs five tiny tasks written here: one whose solution passes, one whose solution
fails, one that exercises the Dockerfile's mapping (``ARG``, ``ENV``, ``WORKDIR``, ``COPY``,
``RUN``), the environment and working directory of Harbor's commands and its uploads and
downloads, one whose agent runs past its time, and one whose Dockerfile cannot be mapped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests._oracles import HARBOR, oracle_python

TASK_TOML = """schema_version = "1.4"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = {agent_timeout}
"""

REWARD = "/logs/verifier/reward.txt"
CHECK_HELLO = f"""#!/bin/bash
if [ "$(cat /app/hello.txt)" = hello ]; then echo 1 > {REWARD}; else echo 0 > {REWARD}; fi
"""


def _task(
    root: Path,
    name: str,
    *,
    dockerfile: str = "FROM ubuntu:24.04\nWORKDIR /app\n",
    solve: str,
    test: str = CHECK_HELLO,
    agent_timeout: float = 60.0,
    files: dict[str, str] | None = None,
) -> None:
    task = root / name
    for part in ("environment", "solution", "tests"):
        (task / part).mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML.format(agent_timeout=agent_timeout))
    (task / "instruction.md").write_text(f"Task {name}: write /app/hello.txt saying hello.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for relative, text in (files or {}).items():
        (task / "environment" / relative).write_text(text)
    (task / "solution" / "solve.sh").write_text(solve)
    (task / "tests" / "test.sh").write_text(test)


IO_DOCKERFILE = """FROM python:3.13-slim
ARG SUFFIX=txt
ENV GREETING="hello there" \\
    MODE=io
WORKDIR /srv
WORKDIR app
COPY data.${SUFFIX} ./data.txt
ENV PATH=/opt/tools:$PATH
COPY --chmod=755 tool.sh /opt/tools/
RUN echo "built in $(pwd) as $(id -u)" > built.txt && test -x /opt/tools/tool.sh
CMD ["sleep", "infinity"]
"""

IO_SOLVE = """#!/bin/bash
set -e
pwd > where.txt
echo "$GREETING/$MODE" > env.txt
mkdir -p /logs/agent && tool.sh > /logs/agent/tool.txt
"""

IO_TEST = f"""#!/bin/bash
ok=1
[ "$(cat /srv/app/where.txt)" = /srv/app ] || ok=0
[ "$(cat /srv/app/env.txt)" = "hello there/io" ] || ok=0
[ "$(cat /srv/app/data.txt)" = "the data" ] || ok=0
[ "$(cat /srv/app/built.txt)" = "built in /srv/app as 0" ] || ok=0
[ "$(cat /logs/agent/tool.txt)" = "tool ran" ] || ok=0
[ -f /tests/test.sh ] && [ -f /solution/solve.sh ] || ok=0
echo "checked: $ok" > /logs/verifier/notes.txt
echo $ok > {REWARD}
"""


@pytest.fixture(scope="module")
def harbor_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Every trial's result.json, by task name, from one `harbor run` over the five tasks."""
    python = oracle_python(HARBOR)
    root = tmp_path_factory.mktemp("harbor")
    tasks = root / "tasks"
    _task(tasks, "passing", solve="#!/bin/bash\necho hello > /app/hello.txt\n")
    _task(tasks, "failing", solve="#!/bin/bash\necho goodbye > /app/hello.txt\n")
    _task(
        tasks,
        "io",
        dockerfile=IO_DOCKERFILE,
        solve=IO_SOLVE,
        test=IO_TEST,
        files={"data.txt": "the data\n", "tool.sh": "#!/bin/sh\necho tool ran\n"},
    )
    _task(
        tasks,
        "slow",
        solve="#!/bin/bash\nsleep 120\necho hello > /app/hello.txt\n",
        agent_timeout=3.0,
    )
    _task(
        tasks,
        "unmappable",
        dockerfile="FROM ubuntu:24.04\nRUN useradd agent\nUSER agent\n",
        solve="#!/bin/bash\necho hello > /app/hello.txt\n",
    )
    jobs = root / "jobs"
    environment = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # Harbor's litellm: no fetch of its price map
        "AENV_ENGINE": "local",
    }
    done = subprocess.run(
        [
            str(python.parent / "harbor"),
            "run",
            "-p",
            str(tasks),
            "-a",
            "oracle",
            "--env",
            "aenv_harbor:AenvRayEnvironment",
            "-o",
            str(jobs),
            "-n",
            "2",
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
        check=False,
    )
    results: dict[str, dict[str, object]] = {}
    for path in jobs.glob("*/*/result.json"):
        result = json.loads(path.read_text())
        results[str(result["task_name"])] = result
    assert len(results) == 5, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return results


def _reward(result: dict[str, object]) -> object:
    verifier = result.get("verifier_result") or {}
    assert isinstance(verifier, dict)
    rewards = verifier.get("rewards") or {}
    assert isinstance(rewards, dict)
    return rewards.get("reward")


def _exception(result: dict[str, object]) -> dict[str, str]:
    info = result.get("exception_info") or {}
    assert isinstance(info, dict)
    return info


def test_the_oracle_passes_the_task_whose_solution_passes(harbor_job: dict) -> None:
    assert _exception(harbor_job["passing"]) == {}
    assert _reward(harbor_job["passing"]) == 1.0


def test_the_oracle_fails_the_task_whose_solution_fails(harbor_job: dict) -> None:
    assert _exception(harbor_job["failing"]) == {}
    assert _reward(harbor_job["failing"]) == 0.0


def test_dockerfile_env_cwd_uploads_and_downloads_behave_as_docker(harbor_job: dict) -> None:
    result = harbor_job["io"]
    assert _exception(result) == {}, _exception(result)
    assert _reward(result) == 1.0
    trial = Path(str(result["trial_uri"]).removeprefix("file://"))
    # downloaded by Harbor from the instance: the verifier's and the agent's directories
    assert (trial / "verifier" / "notes.txt").read_text() == "checked: 1\n"
    assert (trial / "agent" / "tool.txt").read_text() == "tool ran\n"


def test_an_agent_past_its_time_is_stopped_and_graded(harbor_job: dict) -> None:
    result = harbor_job["slow"]
    assert _exception(result)["exception_type"] == "AgentTimeoutError"
    assert _reward(result) == 0.0  # the killed solution wrote nothing


def test_what_cannot_be_mapped_is_refused_naming_it(harbor_job: dict) -> None:
    info = _exception(harbor_job["unmappable"])
    assert info["exception_type"] == "UnmappableTaskError"
    assert "Dockerfile:3: USER agent" in info["exception_message"]
    assert "maps only root" in info["exception_message"]


def test_what_the_venv_starts_runs_this_checkout(tmp_path: Path) -> None:
    """The Harbor venv is made once per machine, by whichever clone came first: its processes
    (Harbor's trials) and the zygotes they start with the local engine's variables alone import
    aenv-ray from this checkout, never from the clone that made the venv (stop 36's CI ran a
    deleted worktree's instead, and failed)."""
    python = oracle_python(HARBOR)
    child = (
        "import json, subprocess, sys\n"
        "from local_backend.engine import zygote_environment\n"
        "import local_backend\n"
        "code = 'import aenv_ray, local_backend; print(local_backend.__file__)'\n"
        "zygote = subprocess.run([sys.executable, '-c', code], env=zygote_environment(),\n"
        "                        capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(json.dumps([local_backend.__file__, zygote]))\n"
    )
    done = subprocess.run(
        [str(python), "-c", child],
        cwd=tmp_path,  # not the checkout, which `-c` would put on sys.path
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    here = str(Path(__file__).resolve().parents[1] / "local_backend" / "__init__.py")
    assert json.loads(done.stdout) == [here, here]
