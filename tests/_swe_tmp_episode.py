"""A swe episode graded by a runtime whose Python lies under ``/tmp``
(tests/test_reward_exploits_swe.py).

Not imported by the tests: run as ``VENV/bin/python _swe_tmp_episode.py REQUEST`` with the Python
of a virtual environment under ``/tmp`` (aenv-ray installed in it, editable), so that the local
engine, its instances and the swe runtime all run with ``sys.prefix`` under ``/tmp``: the
judge's fresh ``/tmp`` must bind that Python in again, and nothing else of the agent's.
``REQUEST`` is a JSON object: ``datasource`` (a directory holding ``rows.jsonl``), ``instance``
(its row's id), ``plant`` (the agent's command that plants files under ``/tmp``), ``look`` (the
agent's command that lists them), ``gold`` (the row's fix). Prints one JSON object: the
runtime's ``sys.prefix`` as the agent's commands see it, what ``look`` printed, the strict and
the SWE-bench gradings of the planted episode, and the strict grading of the gold patch.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from aenv_ray import Environment


async def _run(env: Environment, command: str) -> str:
    result = await env.call_tool("run_command", {"command": command})
    assert result.structured is not None, result.text
    assert result.structured["returncode"] == 0, result.structured["output"]
    return str(result.structured["output"])


async def episode(request: dict[str, Any]) -> dict[str, Any]:
    """The planted episode, both gradings, then the gold patch graded."""
    reset = {"dataset": "/data/rows.jsonl", "instance_id": request["instance"]}
    async with Environment(
        "swe@1.0.0", datasource=request["datasource"], ttl="10m", timeout=300
    ) as env:
        await env.call_function("swe_reset", reset)
        prefix = await _run(env, "python -c 'import sys; print(sys.prefix)'")
        await _run(env, request["plant"])
        seen = await _run(env, request["look"])
        strict = await env.call_reward({})
        swebench = await env.call_reward({"strict": False})
        await env.call_function("swe_reset", reset)
        await _run(env, f"git apply - <<'EOF_GOLD'\n{request['gold']}\nEOF_GOLD")
        gold = await env.call_reward({})
    keys = ("reward", "reason", "test_log", "strict")
    return {
        "prefix": prefix.strip(),
        "seen": seen,
        "strict": {k: strict[k] for k in keys},
        "swebench": {k: swebench[k] for k in keys},
        "gold": {k: gold[k] for k in keys},
    }


def main() -> None:
    report = asyncio.run(episode(json.loads(sys.argv[1])))
    print(json.dumps({"python": sys.prefix, **report}))


if __name__ == "__main__":
    main()
