"""``rollout.areal.AEnvWorkflow`` through AReaL 1.0.4's own rollout path, in its own venv.

The driver (tests/areal_oracle/driver.py, run with the AReaL venv's interpreter: tests/_oracles.py
``AREAL``) wires what AReaL's ``RolloutController`` wires for an agent workflow: its proxy worker
(``proxy_rollout_server`` with a ``RemoteSGLangEngine`` made by ``/create_engine``), and the
rollout worker's ``RemoteSGLangEngine``, whose ``WorkflowExecutor`` runs the episodes submitted
with ``submit(data, workflow=AEnvWorkflow(...), group_size=, proxy_addr=)`` and returns them by
``wait``: AReaL's engine, proxy, tokenizer path, tool-call parser, ``OpenAIProxyWorkflow``,
``GroupedRolloutWorkflow`` and executor, in both agent modes (inline, subproc). Only the
inference server is a stand-in (tests/areal_oracle/sglang_server.py: SGLang's ``/generate``,
a byte-level tokenizer built in the driver, no hub).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._oracles import AREAL, oracle_python

DRIVER = Path(__file__).parent / "areal_oracle" / "driver.py"
MODES = ("subproc", "inline")  # subproc first: see the driver


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both modes in one driver process (AReaL's imports are paid once)."""
    python = oracle_python(AREAL)
    done = subprocess.run(
        [str(python), str(DRIVER), *MODES],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path_factory.mktemp("areal"),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(480)
@pytest.mark.parametrize("mode", MODES)
def test_areals_executor_returns_the_environments_rewards_and_the_servers_tokens(
    mode: str, played: dict[str, Any]
) -> None:
    result = played[mode]
    trajectories = result["trajectories"]
    assert None not in trajectories, "AReaL's executor rejected an episode (see its log)"
    by_prompt = {t[0]["prompt"]: t for t in trajectories}
    assert sorted(by_prompt) == ["write 42", "write 7"]
    assert all(len({row["prompt"] for row in t}) == 1 for t in trajectories)
    # the group of two (group_size=2): the server met both first turns at once (a barrier) and
    # told one to write 42, the other 41; each episode's two rows carry its own environment's
    # reward (1.0 for 42, 0.0 for 41), so nothing of one run leaked into the other
    group = sorted((row["number"], row["reward"]) for row in by_prompt["write 42"])
    assert group == [(41, 0.0), (41, 0.0), (42, 1.0), (42, 1.0)]
    # the dataset row of chat messages: its "write 7" reached the model
    assert [(row["number"], row["reward"]) for row in by_prompt["write 7"]] == [(7, 1.0)] * 2
    # a tool call and an answer per episode, nothing more; every row's prompt + completion is
    # what the server was sent and said, its logprobs the server's
    assert result["generated"] == 6
    for row in [*by_prompt["write 42"], *by_prompt["write 7"]]:
        assert row["tokens_match"], row
        assert row["logprobs_match"], row
