"""terminal-bench in a pod of the real node, graded by the pod's judge container (issue 28 point
3): the pod is the agent's box (no namespaces of its own), the tests run in the ``judge``
container of the same image, which the agent cannot see, reach (beyond one refused
connection) or write. One episode of the bundled demo task ``hello-world`` with a process left
running and a knock on the judge's socket, then a wrong answer and a FIFO.

The runtime image is this checkout's (tests/_realnode.py, built once per content: about 5
minutes when its dependency layer is cached, longer when pyproject.toml changed); no task image
is built: the demo tasks ship in the image, and the judge reads them there. The image has tmux
(deploy/Dockerfile), behind the terminal tools (``send_keys``), tried first.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._judged import run_command
from tests._k8s import KubeCluster
from tests._realnode import RealNode

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(1800)]


def _judge_container() -> str | None:
    from aenv_ray.config import EnvConfig
    from builtin_envs import builtin_path

    project = builtin_path("terminal-bench@1.0.0")
    assert project is not None
    return EnvConfig.load(project).deploy_config.judge_container


if _judge_container() is None:  # the engine refuses its pods (nestedNamespaces) without one
    pytest.skip(
        "terminal-bench's definition names no deployConfig.judgeContainer yet",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def namespace(real_node: RealNode) -> Iterator[str]:
    with real_node.scratch_namespace("tbjudge") as (_, name):
        yield name


async def test_terminal_bench_is_graded_by_the_pods_judge_container(
    real_node: RealNode, namespace: str
) -> None:
    from aenv_ray import Environment
    from k8s_backend import OwnImage

    cluster: KubeCluster = real_node
    engine = cluster.engine(namespace, delivery=OwnImage(runtime_image=real_node.runtime_image))
    async with Environment("terminal-bench@1.0.0", engine=engine, ttl=900, timeout=300) as env:
        task = await env.call_function("tb_reset", {"task": "hello-world"})
        assert "hello.txt" in task["instruction"]
        # the terminal: a tmux session of the pod's (the runtime image has tmux)
        screen = await env.call_tool("send_keys", {"keys": ["echo typed-$((6*7))", "Enter"]})
        assert not screen.is_error, screen.text
        assert "typed-42" in screen.text, screen.text
        # the tests and the task directory are not in the agent's container, nor is the judge
        seen = await run_command(
            env,
            "ls /tests 2>&1; "
            "grep -l 'terminal_bench[.]judge' /proc/[0-9]*/cmdline 2>/dev/null | wc -l",
        )
        assert "No such file or directory" in seen["output"], seen
        assert seen["output"].split()[-1] == "0", seen
        # the judge's socket answers the agent with a refusal: the runtime connected first
        knock = await run_command(
            env,
            'python -c "import os, socket; s = socket.socket(socket.AF_UNIX); '
            "s.connect(os.environ.get('AENV_JUDGE_SOCKET') or '/aenv-judge/judge.sock'); "
            'print(s.recv(300))"',
        )
        assert "refused" in knock["output"], knock
        # nor can the agent plant anything beside it
        planted = await run_command(env, "touch /aenv-judge/x 2>&1; echo $?")
        assert planted["output"].split()[-1] != "0", planted
        done = await run_command(
            env, "echo 'Hello, world!' > /app/hello.txt; (setsid sleep 600 &); echo started"
        )
        assert done["output"].strip() == "started"
        graded = await env.call_reward({})
        assert isinstance(graded, dict)
        assert graded["outcome"] == "passed", graded
        assert graded["reward"] == 1.0
        assert graded["judge"]["verdict"] == "agrees", graded["judge"]
        killed = [p["command"] for p in graded["judge"]["killed"]]
        assert any(c.startswith("sleep 600") for c in killed), killed
        # a wrong answer and a FIFO a reader would block on: 0, the FIFO left out of the copy
        await run_command(env, "echo 'Hello' > /app/hello.txt; mkfifo /app/pipe")
        graded = await env.call_reward({})
        assert isinstance(graded, dict)
        assert graded["reward"] == 0.0
        assert graded["judge"]["removed"] == [{"path": "pipe", "type": "fifo"}]
