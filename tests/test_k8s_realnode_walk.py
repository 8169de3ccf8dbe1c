"""docs/kubernetes.md's walk from an empty namespace to a rollout of a built-in, run as written
on a real node (issue 28, point 6).

Every ```sh block of the page's subsection "The walk, command by command" runs, in order, in one
``bash`` session (``set -euo pipefail``): the namespace made, the runtime image found on the node,
the engine's settings exported, a first instance created, listed and deleted with ``aenv
instance``, a tool call through the SDK, ``aenv rollout mini-terminal@1.0.0 --engine kubernetes
--no-ray -n 2`` against a deterministic model, and the namespace deleted. Only what the page says
is swapped in is: the kubeconfig, the image prefix, the namespace (a fresh one) and the model's
URL (``tests/_chat_server.py``'s server on loopback: only the rollout's process talks to it).

Runs on the real node (the ``real_node`` fixture: the running one, else started by the session),
with this checkout's runtime image (built there by the fixture) in place of the published
``ghcr.io/aenv-ray/aenv-ray:VERSION`` the page names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from aenv_ray import __version__
from tests._chat_server import ChatServer
from tests._realnode import RealNode

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "kubernetes.md"
HEADING = "### The walk, command by command"
# what the page's blocks name, and the test swaps for its own
KUBECONFIG = "~/.cache/k8s-real/realnode/kubeconfig"
PREFIX = "realnode.local/aenv"
NAMESPACE = "aenv-walk"
IMAGE = f"ghcr.io/aenv-ray/aenv-ray:{__version__}"
MODEL = "http://127.0.0.1:8000/v1"


def walk_blocks(page: str) -> list[str]:
    """The ```sh blocks of the walk's subsection (from its heading to the next one), in order."""
    lines = page.splitlines()
    start = lines.index(HEADING)
    blocks: list[str] = []
    current: list[str] | None = None
    for line in lines[start + 1 :]:
        if current is None:
            if line.startswith("#"):
                break  # the next heading (a `#` inside a fence is not one)
            if line.startswith("```"):
                if line.strip() != "```sh":
                    raise AssertionError(f"the walk runs shell only, not {line!r}")
                current = []
        elif line.startswith("```"):
            blocks.append("\n".join(current))
            current = None
        else:
            current.append(line)
    return blocks


def test_the_walk_goes_from_a_namespace_to_a_rollout() -> None:
    """What the page must keep for the real-node run to mean what it says (no cluster needed)."""
    script = "\n".join(walk_blocks(PAGE.read_text()))
    for needed in (
        f"export KUBECONFIG={KUBECONFIG}",
        f"kubectl create namespace {NAMESPACE}",
        f"AENV_K8S_NAMESPACE={NAMESPACE}",
        f"AENV_K8S_RUNTIME_IMAGE={IMAGE}",
        f"AENV_K8S_IMAGE_PREFIX={PREFIX}",
        "aenv instance create mini-terminal@1.0.0",
        'env.call_tool("execute_command"',
        "aenv rollout mini-terminal@1.0.0 --engine kubernetes --no-ray -n 2",
        f"--base-url {MODEL}",
        f"kubectl delete namespace {NAMESPACE}",
    ):
        assert needed in script, needed


def _kubectl(kubeconfig: Path) -> Path:
    """kubectl on PATH, else the real-node kit's (``$K8S_REAL/bin``, beside its ``realnode/``)."""
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    kit = kubeconfig.resolve().parent.parent / "bin" / "kubectl"
    if not kit.exists():
        pytest.skip(f"the walk runs kubectl: none on PATH nor at {kit}")
    return kit


def test_the_walk_runs_on_a_real_node(real_node: RealNode, tmp_path: Path) -> None:
    kubeconfig = real_node.kubeconfig
    prefix = os.environ.get("AENV_TEST_IMAGE_PREFIX", "").rstrip("/") or PREFIX
    namespace = f"walk-{uuid.uuid4().hex[:8]}"
    kubectl = _kubectl(kubeconfig)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AENV_") and k not in {"KUBECONFIG", "PYTEST_CURRENT_TEST"}
    }
    env["AENV_CONFIG_FILE"] = str(tmp_path / "no-aenv-config.json")  # no user's hub
    env["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), str(kubectl.parent), env.get("PATH", "")]
    )
    script = "\n".join(walk_blocks(PAGE.read_text()))
    with ChatServer() as model:
        for theirs, ours in (
            (KUBECONFIG, str(kubeconfig)),
            (PREFIX, prefix),
            (NAMESPACE, namespace),
            (MODEL, model.url),
            (IMAGE, real_node.runtime_image),  # this checkout's, not the published one
        ):
            assert theirs in script, theirs
            script = script.replace(theirs, ours)
        try:
            done = subprocess.run(
                ["bash", "-c", "set -euo pipefail\n" + script],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
        finally:
            subprocess.run(
                [str(kubectl), "delete", "namespace", namespace, "--wait=false"],
                env={**env, "KUBECONFIG": str(kubeconfig)},
                capture_output=True,
            )  # already gone when the walk got to its end
        requests = len(model.requests)
    log = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, log
    out = done.stdout
    assert f"namespace/{namespace} created" in out, log
    assert real_node.runtime_image in out.split(), log  # found on the node
    created = json.loads((tmp_path / "instance.json").read_text())
    assert created["env_ref"] == "mini-terminal@1.0.0", created
    assert created["state"] == "running", created
    assert f"aenv-mini-terminal-{created['id']}" in out, log  # kubectl get pods showed it
    # the tool ran in the pod, as the pod's user, in the pod's own UTS namespace
    (call,) = [json.loads(line) for line in out.splitlines() if line.startswith('{"output"')]
    uid, hostname = call["output"].split()
    assert call["returncode"] == 0, call
    assert uid == "65534", call
    assert hostname.startswith("aenv-mini-terminal-"), call
    assert hostname != f"aenv-mini-terminal-{created['id']}", call  # a pod of its own
    # the rollout: its summary (on stderr, as every progress line), and its records
    assert re.search(r"mean reward \(2 of 2 scored\)\s*│\s*1\.000", done.stderr), log
    rows = [
        json.loads(line)
        for line in (tmp_path / "runs" / "first" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert sorted(r["task"]["id"] for r in rows) == ["t17", "t42"], rows
    assert all(r["outcome"] == "ok" and r["reward"] == 1.0 for r in rows), rows
    assert requests == 4  # two model turns per episode: the tool calls, then the answer
    assert "Traceback" not in done.stderr, log
