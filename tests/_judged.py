"""What the judge-container tests share (terminal-bench's and swe's, tests/test_tb_judge.py,
tests/test_swe_judge.py and their real-node twins): a built-in's runtime in pod mode as a host
process, and one ``run_command`` call's result."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aenv_ray.config import DeployConfig
from aenv_ray.testing import free_port
from builtin_envs.terminal_bench.judge_wire import SOCKET_ENV, JudgeClient
from k8s_backend.manifests import PodRecipe, instance_pod

__all__ = ["builtin_pod", "judge_client", "pod_runtime", "run_command"]


def builtin_pod(builtin: str, deploy: DeployConfig, **env: str) -> dict[str, Any]:
    """The pod the Kubernetes engine builds for an instance of ``builtin`` with ``deploy``
    and the user's variables ``env`` (the generic runtime image serving it)."""
    return instance_pod(
        PodRecipe(
            instance_id="4f2a9c1e07b3",
            env_ref=builtin,
            image="registry.local/aenv/runtime:1",
            command=["python", "-m", "sandbox_runtime", "--builtin", builtin],
            expires_at=1700000000.0,
            deploy=deploy,
            environment_variables=env,
        )
    )


@contextlib.contextmanager
def judge_client(socket: str) -> Iterator[JudgeClient]:
    """A connection to the judge at ``socket``, as the runtime opens it (the first one)."""
    client = JudgeClient.connect(socket, timeout=60)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def pod_runtime(
    builtin: str, socket: str, workspace: Path, home: Path, tmp: Path | None = None
) -> Iterator[str]:
    """``builtin``'s runtime as a pod's runtime container runs it (``--builtin``, the judge's
    socket in ``AENV_JUDGE_SOCKET``), here a host process serving ``workspace``: its URL.
    ``tmp``: its ``TMPDIR`` (what the container's ``/tmp`` is; default: the host's)."""
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "sandbox_runtime", "--builtin", builtin),
            *("--host", "127.0.0.1", "--port", str(port)),
        ],
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            SOCKET_ENV: socket,
            "AENV_WORKSPACE": str(workspace),
            **({"TMPDIR": str(tmp)} if tmp is not None else {}),
        },
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=60)


async def run_command(env: Any, command: str, timeout: int = 60) -> dict[str, Any]:
    """``run_command``'s structured result (the call must not be an error)."""
    result = await env.call_tool("run_command", {"command": command, "timeout": timeout})
    assert not result.is_error, result.text
    assert isinstance(result.structured, dict)
    return dict(result.structured)
