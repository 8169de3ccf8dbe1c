"""``rollout.areal.AEnvWorkflow`` under AReaL 1.0.4's own code, in its own virtual environment.

AReaL's OpenAI proxy server (``proxy_rollout_server``: sessions, its ``ArealOpenAI`` client that
tokenizes with the chat template and parses tool calls, the interaction cache) and its
``OpenAIProxyWorkflow`` (``arun_episode``: a session per episode, the agent run inline or in its
process pool, the reward set on the session, the interactions exported) play mini-terminal
episodes; only the inference engine is a deterministic stand-in implementing ``agenerate``
(tests/areal_oracle/engine.py), with a byte-level tokenizer built in the driver (no hub). The
driver (tests/areal_oracle/driver.py) runs with the AReaL venv's interpreter (tests/_oracles.py
``AREAL``: areal, sglang's parser and litellm without their dependency lists, torch's CPU
build, aenv-ray from this checkout).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests._oracles import AREAL, oracle_python

DRIVER = Path(__file__).parent / "areal_oracle" / "driver.py"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["inline", "subproc"])
def test_areal_records_the_environments_rewards_and_the_engines_tokens(
    mode: str, tmp_path: Path
) -> None:
    python = oracle_python(AREAL)
    done = subprocess.run(
        [str(python), str(DRIVER), mode],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    episodes = result["episodes"]
    # the group of two, the row of messages (its "write 7" reached the model), the one the
    # environment scores 0.0: each turn AReaL recorded carries the environment's reward
    assert [[turn["reward"] for turn in turns] for turns in episodes] == [
        [1.0, 1.0],
        [1.0, 1.0],
        [1.0, 1.0],
        [0.0, 0.0],
    ]
    assert result["generated"] == 8  # a tool call and an answer per episode, nothing more
    for turns in episodes:
        for turn in turns:
            assert turn["tokens_match"], turn  # prompt + completion as the engine saw and said
            assert turn["logprobs_match"], turn
