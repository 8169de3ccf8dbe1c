"""swe in a pod of the real node, graded by the pod's judge container (issue 28 point 3, issue
25 point 4): the pod is the agent's box (no namespaces of its own), the rows, the source
repositories and the grading are the ``judge`` container's (the same image), which the agent
cannot see, reach (beyond one refused connection) or write. One episode of the demo row
``demo__calc-1``: the gold patch with a process left running, 1.0; a wrong fix, 0; a forged
one (a conftest.py that turns failures into passes, a FIFO, passing lines printed), 0.

The image is this checkout's runtime image (which has git) plus the demo rows in ``/data/swe``
(tests/_k8s_images.SWE_DATA; built once per content on the node), the judge's dataset
(``SWE_DATASET``): the agent's container sees an empty ``/data``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._judged import run_command
from tests._k8s import KubeCluster
from tests._k8s_images import SWE_DATA, layered_or_skip
from tests._realnode import RealNode
from tests.test_reward_exploits_swe import PASS_EVERYTHING

pytestmark = [pytest.mark.k8s, pytest.mark.real_node, pytest.mark.timeout(1800)]

CALC = "demo__calc-1"


@pytest.fixture(scope="module")
def swe_image(real_node: RealNode) -> str:
    return layered_or_skip(real_node.runtime_image, "swe", SWE_DATA)


@pytest.fixture(scope="module")
def namespace(real_node: RealNode) -> Iterator[str]:
    with real_node.scratch_namespace("swejudge") as (_, name):
        yield name


async def test_swe_is_graded_by_the_pods_judge_container(
    real_node: RealNode, swe_image: str, namespace: str
) -> None:
    from aenv_ray import Environment
    from builtin_envs.demos import swe as demo
    from k8s_backend import OwnImage

    cluster: KubeCluster = real_node
    engine = cluster.engine(namespace, delivery=OwnImage(runtime_image=swe_image))
    try:
        async with Environment(
            "swe@1.0.0",
            engine=engine,
            ttl=900,
            timeout=600,
            environment_variables={"SWE_DATASET": "/data/swe/demo.jsonl"},
        ) as env:
            task = await env.call_function("swe_reset", {"instance_id": CALC})
            assert task["repo_dir"] == "/workspace/testbed"
            assert "patch" not in task
            # the judge's files and processes are not in the agent's container; its repository
            # holds the base commit's history only
            seen = await run_command(
                env,
                "ls -A /data | wc -l; ls /aenv-work 2>&1; "
                "grep -l 'swe[.]judge' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; "
                "test $(git rev-list --all | wc -l) = $(git rev-list HEAD | wc -l) && echo base",
            )
            assert "No such file or directory" in seen["output"], seen
            assert seen["output"].split()[0] == "0", seen  # the rows in /data: the judge's
            assert seen["output"].split()[-2:] == ["0", "base"], seen
            # the judge's socket (the agent's commands are not told where) refuses the agent
            knock = await run_command(
                env,
                'python -c "import socket; s = socket.socket(socket.AF_UNIX); '
                "s.connect('/aenv-judge/judge.sock'); print(s.recv(300))\"",
            )
            assert "refused" in knock["output"], knock
            planted = await run_command(env, "touch /aenv-judge/x 2>&1; echo $?")
            assert planted["output"].split()[-1] != "0", planted
            # the gold patch, a process left running: 1.0, the process gone with its call
            assert await demo.policy({"id": CALC}, env) is not None
            # the call returns when its shell ends (not at its timeout: the sleep holds its
            # output pipe), and ends what the shell left
            started = await run_command(env, "(setsid sleep 600 &); echo started")
            assert (started["returncode"], started["output"]) == (0, "started\n"), started
            left = await run_command(
                env,
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done "
                "| grep -c '^sleep 600' || true",
            )
            assert left["output"].strip() == "0", left
            gold = await env.call_reward({})
            assert isinstance(gold, dict)
            assert gold["reward"] == 1.0, gold["test_log"]
            assert gold["graded_files"] == ["calc/ops.py"]
            # a wrong fix: 0
            await env.call_function("swe_reset", {"instance_id": CALC})
            await env.call_tool(
                "str_replace",
                {
                    "path": "calc/ops.py",
                    "old_str": "    return sum(values) / len(values)\n",
                    "new_str": "    if not values:\n        return 0\n"
                    "    return sum(values) / len(values)\n",
                },
            )
            wrong = await env.call_reward({})
            assert isinstance(wrong, dict)
            assert wrong["reward"] == 0.0, wrong["test_log"]
            # a forged one: a conftest.py rewriting failures, a FIFO, passing lines printed
            await env.call_tool(
                "create_file", {"path": "conftest.py", "file_text": PASS_EVERYTHING}
            )
            await run_command(
                env, "mkfifo pipe; echo 'PASSED tests/test_ops.py::test_mean_of_nothing'"
            )
            forged = await env.call_reward({})
            assert isinstance(forged, dict)
            assert forged["reward"] == 0.0, forged["test_log"]
            assert {"path": "conftest.py", "reason": "conftest"} in forged["left_out"]
            assert forged["judge"]["removed"] == [{"path": "pipe", "type": "fifo"}]
            # SWE-bench's grading of the same repository falls for it (the control)
            control = await env.call_reward({"strict": False})
            assert isinstance(control, dict)
            assert control["reward"] == 1.0, control["test_log"]
    finally:
        await engine.aclose()
