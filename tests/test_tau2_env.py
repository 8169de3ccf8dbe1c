"""tau2@1.0.0, the environment: one real runtime serving the project, driven through the SDK.

The runtime starts once for the module with ``TAU2_*`` variables (retail task 5, an LLM user on a
deterministic chat server started here, an API key that must never show). Tool outputs, error
flags and database hashes are checked against the original's recordings
(``tests/tau2_golden``) call by call through the instance; schemas against the library's (which
``test_tau2_golden.py`` checks against the original's); prompts against the original itself (in
its own virtual environment, ``tests/_oracles.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from aenv_ray import Environment
from aenv_ray.errors import FunctionError
from aenv_ray.testing import RuntimeProcess
from builtin_envs import builtin_path
from builtin_envs.tau2 import get_domain
from tests._chat_server import ChatServer
from tests._oracles import Tau2Oracle
from tests._tau2 import require_tau2_data

require_tau2_data()  # before the demo module, which reads the data at import

from builtin_envs.demos import tau2 as demo  # noqa: E402

PROJECT = builtin_path("tau2@1.0.0") or Path("builtin_envs/tau2")
GOLDEN = Path(__file__).parent / "tau2_golden" / "tau2_golden.json.gz"
SECRET = "sk-tau2-test-7f3a9c1e5b"
_PYDANTIC_URL = re.compile(r"errors\.pydantic\.dev/[0-9.]+/")


_SEEN_AUTH: list[str] = []


def _user_reply(body: dict[str, Any]) -> Any:
    """The simulated user: opens, answers once, then stops; model ``fail`` answers 401 with
    the request's Authorization header in its body (the instance must not repeat it)."""
    if body["model"] == "fail":
        return 401, {"error": {"message": "bad key", "got": _SEEN_AUTH[-1:]}}
    said = sum(1 for m in body["messages"] if m["role"] == "assistant")
    text = ["I want to know my order status.", "Thanks.", "###STOP###"][min(said, 2)]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@pytest.fixture(scope="module")
def chat() -> Iterator[ChatServer]:
    with ChatServer(_user_reply) as server:
        _SEEN_AUTH.append(f"Bearer {SECRET}")  # what the failing model echoes back
        yield server


@pytest.fixture(scope="module")
def runtime(chat: ChatServer) -> Iterator[RuntimeProcess]:
    env = {
        "TAU2_DOMAIN": "retail",
        "TAU2_TASK_ID": "5",
        "TAU2_USER_LLM": "user-model",
        "TAU2_USER_LLM_API_BASE": chat.url,
        "TAU2_USER_LLM_API_KEY": SECRET,
    }
    with RuntimeProcess(PROJECT, env=env) as process:
        yield process


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(runtime: RuntimeProcess) -> AsyncIterator[Environment]:
    async with runtime.environment() as environment:
        yield environment


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


@pytest.fixture(scope="module")
def outputs() -> list[str]:
    """Everything the instance answered, searched for the API key at the end."""
    return []


def _schemas(domain: str, solo: bool = False) -> list[dict[str, Any]]:
    environment = get_domain(domain).new_environment(solo)
    return type(environment.tools).openai_schemas()


async def _fn(env: Environment, outputs: list[str], name: str, **arguments: Any) -> Any:
    value = await env.call_function(name, arguments)
    outputs.append(json.dumps(value))
    return value


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_variables_at_creation_choose_domain_task_and_user(
    env: Environment, chat: ChatServer, outputs: list[str]
) -> None:
    """TAU2_* at creation: retail task 5, the LLM user opened the conversation."""
    status = await _fn(env, outputs, "tau2_get_status")
    assert (status["domain"], status["task_id"], status["user_mode"]) == ("retail", "5", "llm")
    assert status["last_observation"] == "I want to know my order status."
    assert status["done"] is False
    assert status["termination_reason"] is None
    assert status["db_hash"] == get_domain("retail").base_db.get_hash()
    assert status["user_llm_api_key_set"] is True
    # the user's request: tau2's system prompt for this task, the agent's greeting as "user"
    request = chat.requests[-1]
    assert request["model"] == "user-model"
    assert request["temperature"] == 0.0
    assert request["messages"][1] == {"role": "user", "content": "Hi! How can I help you today?"}
    assert request["messages"][0]["content"].endswith("\n</scenario>")
    assert chat.headers[-1]["Authorization"] == f"Bearer {SECRET}"
    tools = await env.list_tools()
    assert [t["name"].rsplit("/", 1)[1] for t in tools] == [
        s["function"]["name"] for s in _schemas("retail")
    ]


async def test_user_replies_and_stops(
    env: Environment, chat: ChatServer, outputs: list[str]
) -> None:
    reply = await _fn(env, outputs, "tau2_send_message", message="Your order is pending.")
    assert reply == {"observation": "Thanks.", "done": False, "termination_reason": None, "step": 3}
    reply = await _fn(env, outputs, "tau2_send_message", message="Anything else?")
    assert reply["done"] is True
    assert reply["termination_reason"] == "user_stop"
    # the flipped history: the user's own lines as assistant, the agent's as user
    roles = [m["role"] for m in chat.requests[-1]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    reward = await env.call_reward({})
    outputs.append(json.dumps(reward))
    assert reward["termination_reason"] == "user_stop"
    assert set(reward["components"]) == {"DB", "COMMUNICATE"}
    assert reward["reward_basis"] == ["DB", "COMMUNICATE"]
    result = await env.call_tool("get_order_details", {"order_id": "#W0000000"})
    assert result.is_error
    assert "is over (user_stop)" in result.text


async def test_tool_list_follows_the_domain_with_the_original_schemas(
    env: Environment, outputs: list[str]
) -> None:
    for domain in ("airline", "retail", "airline"):
        await _fn(env, outputs, "tau2_reset", domain=domain, task_id="1", user_mode="scripted")
        expected = _schemas(domain)
        available = await _fn(env, outputs, "tau2_get_available_tools")
        # json.dumps keeps key order: equal text, equal schemas key order included
        assert [json.dumps(s) for s in available] == [json.dumps(s) for s in expected]
        listed = await env.list_openai_tools()
        assert [json.dumps(t["function"]["parameters"]) for t in listed] == [
            json.dumps(s["function"]["parameters"]) for s in expected
        ]
        assert [t["function"]["description"] for t in listed] == [
            s["function"]["description"] for s in expected
        ]
        # an OpenAI name of this domain's tool reaches it
        named = await env.call_tool(listed[0]["function"]["name"], {})
        assert named.is_error
        assert named.text.startswith("Error: ")
    airline = {s["function"]["name"]: s for s in _schemas("airline")}
    retail = {s["function"]["name"]: s for s in _schemas("retail")}
    assert airline["get_user_details"] != retail["get_user_details"]  # same name, other tool
    other = await env.call_tool("get_order_details", {"order_id": "#W2378156"})
    assert (other.text, other.is_error) == ("Error: Tool 'get_order_details' not found.", True)


def _same(ours: str, expected: dict[str, Any]) -> bool:
    if "sha256" in expected:
        return bool(hashlib.sha256(ours.encode()).hexdigest() == expected["sha256"])
    return _PYDANTIC_URL.sub("X/", ours) == _PYDANTIC_URL.sub("X/", expected["content"])


@pytest.mark.parametrize("domain", ["airline", "retail"])
async def test_outputs_errors_and_hashes_equal_the_originals_through_the_instance(
    env: Environment, golden: dict[str, Any], outputs: list[str], domain: str
) -> None:
    """The original's recorded sequences (every task's gold actions, fuzzed calls of every tool,
    a few relational ones), replayed through the instance's tools on a fresh episode each."""
    sequences = [
        s for s in golden["domains"][domain]["sequences"] if not s["label"].startswith("relational")
    ] + [s for s in golden["domains"][domain]["sequences"] if s["label"].startswith("relational")][
        :4
    ]
    differences = []
    checked = 0
    for sequence in sequences:
        await env.call_function(
            "tau2_reset",
            {"domain": domain, "task_id": "0", "max_steps": 10**6, "max_errors": 10**6},
        )
        for call, expected in zip(sequence["calls"], sequence["results"], strict=True):
            if call.get("requestor", "assistant") != "assistant":
                continue  # the user's tool calls are the user's (telecom), not the agent's
            result = await env.call_tool(call["name"], call["arguments"])
            checked += 1
            if result.is_error != expected["error"] or not _same(result.text, expected):
                differences.append((sequence["label"], call, result.text[:300], expected))
        status = await env.call_function("tau2_get_status", {})
        if status["db_hash"] != sequence["hash"]:
            differences.append((sequence["label"], "hash", status["db_hash"], sequence["hash"]))
    assert checked > 700
    assert not differences, f"{len(differences)} differences; first: {differences[:2]}"


@pytest.mark.parametrize("domain", ["airline", "retail"])
async def test_gold_replay_of_every_task_reaches_one(
    env: Environment, outputs: list[str], domain: str
) -> None:
    """The demo policy's replay (gold actions, then what must be said) on every base task."""
    tasks = [t for t in demo.TASKS if t["id"].startswith(f"{domain}-")]
    assert len(tasks) == len(get_domain(domain).task_ids("base"))
    below = []
    for task in tasks:
        for call in task["setup"]:
            await env.call_function(call["function"], call["arguments"])
        await demo.policy(task, env)
        reward = await env.call_reward({})
        if reward["reward"] != 1.0 or reward["termination_reason"] not in (
            "user_stop",
            "agent_stop",
        ):
            below.append((task["id"], reward["reward"], reward["reward_breakdown"]))
    assert not below, below


async def test_limits_end_the_episode_as_the_orchestrator_does(
    env: Environment, outputs: list[str]
) -> None:
    await _fn(
        env, outputs, "tau2_reset", domain="airline", task_id="1", user_mode="scripted", max_steps=4
    )
    first = await env.call_tool("get_user_details", {"user_id": "raj_sanchez_7340"})
    assert not first.is_error  # steps: the user's opening (1), the call (2), its result (3)
    await env.call_tool("get_reservation_details", {"reservation_id": "Q69X3R"})
    status = await _fn(env, outputs, "tau2_get_status", hashes=False)
    assert (status["done"], status["termination_reason"], status["step"]) == (True, "max_steps", 5)
    reward = await env.call_reward({})
    assert reward["reward"] == 0.0
    assert reward["info"]["note"].endswith("Termination reason: max_steps")
    await _fn(
        env, outputs, "tau2_reset", domain="retail", task_id="0", user_mode="scripted", max_errors=2
    )
    for _ in range(2):
        await env.call_tool("get_user_details", {"user_id": "nobody"})
    status = await _fn(env, outputs, "tau2_get_status", hashes=False)
    assert status["termination_reason"] == "too_many_errors"


async def test_bad_settings_say_what_to_do(env: Environment, outputs: list[str]) -> None:
    with pytest.raises(FunctionError, match="has no solo mode"):
        await env.call_function("tau2_reset", {"domain": "airline", "solo_mode": True})
    with pytest.raises(FunctionError, match="not found in tau2 domain 'retail'"):
        await env.call_function("tau2_reset", {"domain": "retail", "task_id": "nope"})
    with pytest.raises(FunctionError, match="tau2 domain 'shop' not found"):
        await env.call_function("tau2_reset", {"domain": "shop"})


async def test_a_failing_user_endpoint_never_shows_the_key(
    env: Environment, runtime: RuntimeProcess, outputs: list[str]
) -> None:
    await _fn(env, outputs, "tau2_reset", domain="retail", task_id="2")
    outputs.append(json.dumps(await _fn(env, outputs, "tau2_get_task_info")))
    status = await _fn(env, outputs, "tau2_get_status")
    assert status["user_mode"] == "llm"
    assert status["user_llm_api_key_set"] is True
    # a model whose endpoint refuses and echoes the key it got
    with pytest.raises(FunctionError, match="answered HTTP 401") as failed:
        await env.call_function("tau2_reset", {"domain": "retail", "user_llm": "fail"})
    outputs.append(str(failed.value))
    assert "***" in str(failed.value)  # the echoed key, scrubbed
    outputs.append(json.dumps(await env.call_function("tau2_get_trajectory", {})))
    outputs.append(json.dumps(await env.call_function("tau2_get_status", {})))
    health = await env.check_health()
    outputs.append(json.dumps(health))
    log = runtime.stderr_path.read_text(errors="replace") if runtime.stderr_path else ""
    assert "tau2_reset" in log or log, "the runtime's log is empty"
    for text in [*outputs, log]:
        assert SECRET not in text


async def test_prompts_equal_the_originals(
    env: Environment, chat: ChatServer, outputs: list[str], tau2_oracle: Tau2Oracle
) -> None:
    """The agent's system prompt per domain and the user simulator's (what the endpoint got)."""
    cases = [("retail", "5"), ("airline", "1"), ("retail", "0")]
    original = tau2_oracle.ask({"op": "prompts", "cases": cases})
    for domain, task_id in cases:
        await _fn(env, outputs, "tau2_reset", domain=domain, task_id=task_id, user_llm="user-model")
        prompt = await _fn(env, outputs, "tau2_get_system_prompt")
        assert prompt == original[f"agent:{domain}"]
        assert chat.requests[-1]["messages"][0] == {
            "role": "system",
            "content": original[f"user:{domain}:{task_id}"],
        }
