"""Harbor's trial time on aenv-ray against a provider with nothing but a local process, in one
run (issue 27, point 1).

    .venv/bin/python benchmarks/bench_harbor.py                 # 2 rounds of 4 trials each
    .venv/bin/python benchmarks/bench_harbor.py --rounds 3 --trials 6

Each round runs ``harbor run -a oracle`` (Harbor 0.25.0 in its own Python 3.12 environment,
tests/_oracles.py ``HARBOR``; ``--python`` for another) over ``--trials`` copies of a small
task (a Dockerfile with ``WORKDIR``, ``ENV`` and a ``RUN``; a solution; a test writing the
reward), one trial at a time, once with ``aenv_harbor:AenvRayEnvironment`` on the local
engine and once with ``_harbor_local:LocalProcessEnvironment`` (benchmarks/_harbor_local.py:
a chroot and a process per command, nothing else), the two alternating so that the machine's
load falls on both. The times are Harbor's own, from each trial's ``result.json``: the whole
trial, its ``environment_setup`` (``start``: on aenv-ray an instance forked from the local
engine's warm template, plus the Dockerfile's steps) and the agent's and the verifier's phases.
Prints the medians per provider and the ratio; the first aenv-ray trial of the first round
(the engine's cold start: its zygote and template) is shown apart. Needs root (the baseline's
``unshare`` and ``chroot``). A measurement, not a test: exit 0 either way.

``--engine kubernetes --base debian:bookworm-slim`` measures the trials on Kubernetes instead
(each a pod whose image is the task's, derived and built once: docs/ecosystem.md, *Kubernetes:
the pod is the box*), with the cluster, registry and builder of the environment
(``KUBECONFIG``, ``AENV_K8S_NAMESPACE``, ``AENV_K8S_IMAGE_PREFIX``, ``AENV_HARBOR_BUILDER``);
the first trial (its image's build) is shown apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROVIDERS = {
    "aenv-ray": "aenv_harbor:AenvRayEnvironment",
    "local process": "_harbor_local:LocalProcessEnvironment",
}
PHASES = ("environment_setup", "agent_execution", "verifier")


def _write_task(folder: Path, base: str) -> None:
    for part in ("environment", "solution", "tests"):
        (folder / part).mkdir(parents=True)
    (folder / "task.toml").write_text(
        'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n'
    )
    (folder / "instruction.md").write_text("Write /app/hello.txt saying hello.\n")
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {base}\nENV GREETING=hello\nWORKDIR /app\nRUN mkdir -p /app/data\n"
    )
    (folder / "solution" / "solve.sh").write_text('#!/bin/bash\necho "$GREETING" > hello.txt\n')
    (folder / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/hello.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )


def _seconds(span: dict[str, str]) -> float:
    start = datetime.fromisoformat(span["started_at"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(span["finished_at"].replace("Z", "+00:00"))
    return (end - start).total_seconds()


def _run(
    harbor: Path, provider: str, tasks: Path, jobs: Path, engine: str
) -> list[dict[str, float]]:
    environment = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "AENV_ENGINE": engine,
        "PYTHONPATH": str(ROOT / "benchmarks"),
    }
    command = [str(harbor), "run", "-p", str(tasks), "-a", "oracle", "--env", provider]
    command += ["-o", str(jobs), "-n", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    rows = []
    for path in sorted(jobs.glob("*/*/result.json")):
        result = json.loads(path.read_text())
        reward = ((result.get("verifier_result") or {}).get("rewards") or {}).get("reward")
        if reward != 1.0:
            print(f"  {provider}: {result['trial_name']} reward {reward}: {done.stderr[-500:]}")
            continue
        row = {"trial": _seconds(result)}
        row.update({phase: _seconds(result[phase]) for phase in PHASES if result.get(phase)})
        row["started"] = datetime.fromisoformat(result["started_at"]).timestamp()
        rows.append(row)
    return sorted(rows, key=lambda row: row["started"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--python", help="a Python 3.12 with harbor==0.25.0 and aenv-ray")
    parser.add_argument("--engine", default="local", choices=("local", "kubernetes"))
    parser.add_argument("--base", default="ubuntu:24.04", help="the task's FROM image")
    options = parser.parse_args()
    providers = dict(PROVIDERS)
    if options.engine != "local":  # the local process is the same on any engine
        providers = {"aenv-ray": PROVIDERS["aenv-ray"]}
    if options.python:
        python = Path(options.python)
    else:
        from tests._oracles import HARBOR, ensure_oracle

        python = ensure_oracle(HARBOR)
    harbor = python.parent / "harbor"
    times: dict[str, list[dict[str, float]]] = {name: [] for name in providers}
    cold: dict[str, float] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-harbor-") as scratch:
        tasks = Path(scratch) / "tasks"
        for index in range(options.trials):
            _write_task(tasks / f"hello-{index}", options.base)
        for round_ in range(options.rounds):
            order = list(providers) if round_ % 2 == 0 else list(reversed(providers))
            for name in order:
                jobs = Path(scratch) / f"jobs-{round_}-{name.replace(' ', '-')}"
                rows = _run(harbor, providers[name], tasks, jobs, options.engine)
                if name == "aenv-ray" and rows:
                    # this harbor process's engine starts cold (on Kubernetes: the image builds)
                    first = rows.pop(0)
                    cold = first if cold is None else cold
                times[name].extend(rows)
                print(f"round {round_ + 1}: {name}: {len(rows)} warm trials")
    print(f"\n{'median seconds':<16}" + "".join(f"{p:>20}" for p in ("trial", *PHASES)))
    medians: dict[str, dict[str, float]] = {}
    for name, rows in times.items():
        if not rows:
            print(f"{name:<16} no trial passed")
            continue
        medians[name] = {
            key: statistics.median(row[key] for row in rows) for key in ("trial", *PHASES)
        }
        print(f"{name:<16}" + "".join(f"{medians[name][k]:>20.2f}" for k in ("trial", *PHASES)))
    if cold:
        print(
            f"{'aenv-ray cold':<16}"
            + "".join(f"{cold.get(k, 0):>20.2f}" for k in ("trial", *PHASES))
        )
    if len(medians) == 2:
        ours, base = medians["aenv-ray"], medians["local process"]
        print(
            f"\naenv-ray / local process: trial {ours['trial'] / base['trial']:.2f}x, "
            f"start {ours['environment_setup'] / base['environment_setup']:.2f}x "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
