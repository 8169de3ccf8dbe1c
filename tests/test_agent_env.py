"""An agent as an environment: ``agent@1.0.0`` and ``examples/agent_b`` (``agent-b@1.0.0``).

Against real parts: a real hub (``aenv serve --allow-network``, a key of tenant ``alice``) that
creates the agents' inner instances, real instances on the local engine and on the hub, and a
deterministic OpenAI-compatible model on loopback (:class:`tests._chat_server.AgentModel`: no
model is available offline) that every level of agent talks to. Agent A is test code, and an
``agents.Agent`` of the real ``openai-agents`` package whose tools come from
``list_agents_tools()``. What the agents did is checked where it happened: in the innermost
mini-terminal instance, called directly with its token.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import Environment, FunctionError, TerminationReason, ToolResult
from aenv_ray.bundle import build_bundle
from aenv_ray.engine import default_engine
from aenv_ray.hub import HubClient
from aenv_ray.testing import free_port
from tests._chat_server import AgentModel, ChatServer
from tests._cli import aenv as run_cli
from tests._cli import aenv_async
from tests._hub import HubProcess, eventually, new_key, run

ROOT = Path(__file__).resolve().parent.parent
AGENT_B = ROOT / "examples" / "agent_b"
MODEL_KEY = f"sk-model-{secrets.token_hex(16)}"
TTL = "4"  # the inner instances' TTL: they end at most this long after their agent
DONE = 'done: {"output":"","returncode":0}'


@pytest.fixture(scope="module")
def model() -> Iterator[ChatServer]:
    with ChatServer(AgentModel()) as server:
        yield server


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}
    with HubProcess(tmp_path_factory.mktemp("agent-hub"), extra=["--allow-network"], env=env) as h:
        yield h, new_key("alice", h.store)


def settings(model: ChatServer, hub: tuple[HubProcess, str], **more: str) -> dict[str, str]:
    """An agent instance's variables: the stand-in model, its key, the hub and its key."""
    return {
        "AGENT_BASE_URL": model.url,
        "AGENT_MODEL": "stand-in",
        "OPENAI_API_KEY": MODEL_KEY,
        "AENV_SYSTEM_URL": hub[0].url,
        "AENV_API_KEY": hub[1],
        "AGENT_INNER_TTL": TTL,
        **more,
    }


async def ended(client: HubClient, instance_id: str) -> bool:
    return (await client.get_instance(instance_id))["state"] == "terminated"


async def history(env: Environment) -> list[dict[str, Any]]:
    return list((await env.call_function("history"))["messages"])


async def test_agent_b_works_in_its_own_terminal_and_keeps_its_conversation(
    model: ChatServer, hub: tuple[HubProcess, str]
) -> None:
    """agent-b (a project of one import) on the local engine; its mini-terminal at the hub."""
    variables = settings(model, hub)
    b = Environment.from_project(AGENT_B, environment_variables=variables)
    other = Environment.from_project(AGENT_B, environment_variables=variables)
    async with HubClient(hub[0].url, api_key=hub[1]) as client:
        async with b, other:
            inners = await _one_level(model, client, b, other)
        # the agents are gone (released, expired, the fork released): their inner instances end
        for left in inners:
            await eventually(lambda i=left: ended(client, i), f"the inner instance {left} ends")


async def _one_level(
    model: ChatServer, client: HubClient, b: Environment, other: Environment
) -> list[str]:
    """What happens while the agents live; the inner instances left when they go."""
    result = await b.call_tool("chat", {"message": "Make a file. run: echo 42 > answer.txt"})
    assert not result.is_error, result.text
    assert result.text == DONE
    done = result.structured
    assert [c["tool"] for c in done["tool_calls"]] == ["mini-terminal_1_0_0__execute_command"]
    assert done["turns"] == 2
    assert done["usage"]["total_tokens"] > 0
    inner_id = done["environment"]["instance_id"]
    record = await client.get_instance(inner_id)
    assert record["env_ref"] == "mini-terminal@1.0.0"
    assert record["labels"]["agent.parent"] == b.instance_id
    assert await run(record, "cat answer.txt") == "42"  # it ran there, in the inner instance

    # the conversation goes on: the model sees the first exchange, the same instance works
    second = await b.call_tool("chat", {"message": "run: cat answer.txt"})
    assert second.text == 'done: {"output":"42\\n","returncode":0}'
    assert second.structured["environment"]["instance_id"] == inner_id
    sent = model.requests[-2]["messages"]  # the second chat's first request
    assert sent[0]["role"] == "system"
    assert "agent B" in sent[0]["content"]
    assert sent[1]["content"].endswith("run: echo 42 > answer.txt")
    assert [m["role"] for m in await history(b)] == [
        "system", *["user", "assistant", "tool", "assistant"] * 2
    ]  # fmt: skip
    reward = {"arguments": {"path": "answer.txt", "expected": "42"}}
    assert await b.call_reward(reward) == 1.0  # the inner mini-terminal's reward
    health = await b.check_health()
    assert health["inner_instance"] == inner_id
    assert health["api_key_set"] is True
    assert health["environment"] == "mini-terminal@1.0.0"
    assert health["messages"] == 9

    # another instance has its own conversation and its own terminal
    assert await history(other) == []
    elsewhere = await other.call_tool("chat", {"message": "run: cat answer.txt"})
    assert '"returncode":1' in elsewhere.text
    assert "No such file" in elsewhere.text
    other_inner = elsewhere.structured["environment"]["instance_id"]
    assert other_inner != inner_id
    # the other agent's own TTL runs out (in a second): its inner instance follows it below
    engine = default_engine()
    assert other.instance_id is not None
    await engine.renew(other.instance_id, 1)

    async def expired() -> bool:
        info = await engine.get(str(other.instance_id))
        return info.reason is TerminationReason.EXPIRED

    await eventually(expired, "the other agent expires")

    # renewed while its agent lives: the TTL moves on
    first_expiry = record["expires_at"]

    async def renewed() -> bool:
        return float((await client.get_instance(inner_id))["expires_at"]) > first_expiry

    await eventually(renewed, "the agent renews its inner instance")

    # a fork copies the conversation, not the inner instance: it gets one of its own
    (child,) = await b.fork(1)
    async with child:
        assert await history(child) == await history(b)
        assert (await child.check_health())["inner_instance"] is None
        forked = await child.call_tool("chat", {"message": "run: echo child > answer.txt"})
        child_inner = forked.structured["environment"]["instance_id"]
        assert child_inner != inner_id
        assert await run(record, "cat answer.txt") == "42"  # the parent's is untouched

    # reset: the conversation goes; with new_environment, the inner instance too (at once)
    cleared = await b.call_function("reset")
    assert cleared == {"cleared_messages": 9, "released_instance": None}
    assert await history(b) == []
    assert (await b.check_health())["usage"] == {}
    again = await b.call_function("reset", {"new_environment": True})
    assert again["released_instance"] == inner_id
    gone = await client.get_instance(inner_id)
    assert gone["state"] == "terminated"
    assert gone["reason"] == "deleted"
    fresh = await b.call_tool("chat", {"message": "run: ls"})
    fresh_inner = fresh.structured["environment"]["instance_id"]
    assert fresh_inner != inner_id

    # the inner instance dies under a call: an error result, the call answered in the
    # conversation (so the endpoint takes it again), and the next chat gets a new instance
    await client.delete_instance(fresh_inner)
    broken = await b.call_tool("chat", {"message": "run: ls"})
    assert broken.is_error
    assert broken.structured["error"] == "environment_error"
    assert f"(instance {fresh_inner}) failed calling" in broken.text
    assert "the next chat starts a new instance of it" in broken.text
    last = (await history(b))[-1]
    assert last["role"] == "tool"
    assert "was not run" in last["content"]
    recovered = await b.call_tool("chat", {"message": "run: echo back > answer.txt"})
    assert recovered.text == DONE
    new_inner = recovered.structured["environment"]["instance_id"]
    assert new_inner not in (fresh_inner, inner_id)
    return [new_inner, other_inner, child_inner]


async def test_two_levels_deep_through_the_hub_with_the_agents_sdk(
    model: ChatServer, hub: tuple[HubProcess, str]
) -> None:
    """Agent A (test code, then an ``agents.Agent``) -> agent@1.0.0 (created by the hub) ->
    agent-b@1.0.0 (pushed to the hub) -> mini-terminal@1.0.0."""
    agents = pytest.importorskip("agents")
    openai = pytest.importorskip("openai")
    bundle = build_bundle(AGENT_B)
    async with HubClient(hub[0].url, api_key=hub[1]) as client:
        await client.push(bundle.data, digest=bundle.digest)
        forward = "AENV_SYSTEM_URL,AENV_API_KEY,OPENAI_API_KEY,AGENT_BASE_URL,AGENT_MODEL"
        variables = settings(
            model,
            hub,
            AGENT_ENV="agent-b@1.0.0",
            AGENT_FORWARD=forward,  # agent-b needs the model and the hub; its terminal does not
            AGENT_INNER_AGENT_INNER_TTL=TTL,  # agent-b's own AGENT_INNER_TTL
        )
        outer = Environment(
            "agent@1.0.0",
            environment_variables=variables,
            aenv_url=hub[0].url,
            api_key=hub[1],
            timeout=120,
        )
        async with outer:
            result = await outer.call_tool("chat", {"message": "run: echo deep > answer.txt"})
            assert result.text == f"done: {DONE}", result.text
            b_id = result.structured["environment"]["instance_id"]
            b_record = await client.get_instance(b_id)
            assert b_record["env_ref"] == "agent-b@1.0.0"
            assert b_record["labels"]["agent.parent"] == outer.instance_id
            (terminal,) = [
                r
                for r in await client.list_instances(env="mini-terminal@1.0.0")
                if r["labels"].get("agent.parent") == b_id
            ]
            assert await run(terminal, "cat answer.txt") == "deep"  # two levels down

            # agent A from the OpenAI Agents SDK, its tools from list_agents_tools()
            tools = await outer.list_agents_tools()
            assert [t.name for t in tools] == ["agent_1_0_0__chat"]
            chat_model = agents.OpenAIChatCompletionsModel(
                model="stand-in",
                openai_client=openai.AsyncOpenAI(base_url=model.url, api_key="agent-a-key"),
            )
            agent_a = agents.Agent(
                name="A", instructions="Ask the agent to do it.", tools=tools, model=chat_model
            )
            done = await agents.Runner.run(
                agent_a,
                "run: echo via-sdk > sdk.txt",
                run_config=agents.RunConfig(tracing_disabled=True),
            )
            assert done.final_output == f"done: done: {DONE}"
            assert await run(terminal, "cat sdk.txt") == "via-sdk"
            # the outer agent's conversation went on: both of agent A's messages are in it
            users = [m["content"] for m in await history(outer) if m["role"] == "user"]
            assert users == ["run: echo deep > answer.txt", "run: echo via-sdk > sdk.txt"]
        # released at the hub: agent-b ends within its TTL, then its terminal within its own
        for instance_id in (b_id, terminal["id"]):
            await eventually(lambda i=instance_id: ended(client, i), f"{instance_id} ends")
        assert (await client.get_instance(b_id))["reason"] == "expired"


async def test_model_failures_are_clear_results_and_the_key_never_shows(
    model: ChatServer, hub: tuple[HubProcess, str]
) -> None:
    """Every failure of the model endpoint and of the inner environment is an error result
    naming it; the model's key (and the hub's) is in no result, function, health, list output
    or log line, while the model did receive it."""

    def agent(**more: str | None) -> Environment:
        variables = {k: v for k, v in {**settings(model, hub), **more}.items() if v is not None}
        return Environment(
            "agent@1.0.0",
            environment_variables=variables,
            aenv_url=hub[0].url,
            api_key=hub[1],
            timeout=120,
        )

    failing = agent(AGENT_ENV="mini-terminal@1.0.0", AGENT_MODEL_TIMEOUT="1", AGENT_MAX_TURNS="2")
    unreachable = agent(AGENT_BASE_URL=f"http://127.0.0.1:{free_port()}/v1")
    misconfigured = agent(AGENT_MAX_TURNS="lots")
    missing = agent(AGENT_ENV="no-such-env@1.0.0")
    hubless = agent(AGENT_ENV="mini-terminal@1.0.0", AENV_SYSTEM_URL=None, AENV_API_KEY=None)
    everything = [failing, unreachable, misconfigured, missing, hubless]
    seen: list[str] = []

    async def chat(env: Environment, message: str) -> ToolResult:
        result = await env.call_tool("chat", {"message": message})
        seen.append(json.dumps(result.to_wire()))
        return result

    def error(result: ToolResult, kind: str, *phrases: str) -> None:
        assert result.is_error, result.text
        assert result.structured["error"] == kind, result.text
        for phrase in phrases:
            assert phrase in result.text, (phrase, result.text)

    await asyncio.gather(*(env.initialize() for env in everything))
    try:
        error(await chat(failing, "fail:http500"), "model_http_error", "HTTP 500", "crashed")
        quoted = await chat(failing, "fail:401")  # the endpoint quotes the key back
        error(quoted, "model_http_error", "HTTP 401", "Incorrect API key provided: [redacted]")
        error(await chat(failing, "fail:json"), "model_bad_reply", "is not JSON")
        error(await chat(failing, "fail:shape"), "model_bad_reply", "not a chat completion")
        error(await chat(failing, "fail:slow"), "model_timeout", "no answer within 1 s")
        looped = await chat(failing, "loop: forever")
        error(looped, "max_turns", "no answer after 2 model turns (AGENT_MAX_TURNS)")
        assert len(looped.structured["tool_calls"]) == 2
        bad = await chat(failing, "badargs: x")
        assert not bad.is_error
        assert bad.text.startswith("done: invalid JSON arguments for `mini-terminal_1_0_0__")
        assert bad.structured["tool_calls"][0]["is_error"] is True
        error(await chat(unreachable, "hello"), "model_unreachable", "is unreachable")
        error(await chat(misconfigured, "hello"), "not_configured", "AGENT_MAX_TURNS='lots'")
        error(
            await chat(missing, "hello"),
            "environment_error",
            "`no-such-env@1.0.0` could not be started",
            "EnvironmentNotFoundError",
        )
        error(await chat(hubless, "hello"), "environment_error", "no EnvHub", "AENV_SYSTEM_URL")
        with pytest.raises(FunctionError) as caught:
            await misconfigured.call_reward({"arguments": {}})
        seen.append(str(caught.value))
        for env in everything:
            seen.append(json.dumps(await env.check_health()))
            seen.append(json.dumps(await env.call_function("history")))
        seen.append(json.dumps(await failing.call_function("reset", {"new_environment": True})))
        async with HubClient(hub[0].url, api_key=hub[1]) as client:
            seen.append(json.dumps(await client.list_instances(include_terminated=True)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}
        env.update(AENV_SYSTEM_URL=hub[0].url, AENV_API_KEY=hub[1])
        listed = await aenv_async("instance", "list", "--json", environ=env)
        assert listed.returncode == 0, listed.stderr
        assert "agent@1.0.0" in listed.stdout
        seen.append(listed.stdout + listed.stderr)
    finally:
        await asyncio.gather(*(env.release() for env in everything))
    log = hub[0].log.read_text(errors="replace")
    assert 'msg="the model failed" error=model_timeout' in log  # the instances' logs are here
    seen.append(log)
    assert any(h.get("Authorization") == f"Bearer {MODEL_KEY}" for h in model.headers)
    for text in seen:
        assert MODEL_KEY not in text
        assert hub[1] not in text


def test_aenv_rollout_of_the_agent_demo(
    model: ChatServer, hub: tuple[HubProcess, str], tmp_path: Path
) -> None:
    """``aenv rollout agent@1.0.0``: without settings it stops before anything starts, naming
    them; with them (``-e``, the keys copied from the environment) the demo's episodes pass."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}
    env.update(
        AENV_CONFIG_FILE=str(tmp_path / "no-config.json"),
        AENV_API_KEY=hub[1],
        OPENAI_API_KEY=MODEL_KEY,
    )

    def rollout(*args: str) -> subprocess.CompletedProcess[str]:
        """``aenv rollout agent@1.0.0 --no-ray ARGS`` in this process (tests/_cli.py)."""
        return run_cli("rollout", "agent@1.0.0", "--no-ray", *args, environ=env)

    bare = rollout("--out", str(tmp_path / "bare"))
    assert bare.returncode == 2, bare.stderr
    assert "missing AGENT_BASE_URL, AGENT_MODEL, AGENT_ENV, AENV_SYSTEM_URL" in bare.stderr
    out = tmp_path / "run"
    done = rollout(
        *("--out", str(out), "--episodes", "3", "--concurrency", "3"),
        *("-e", f"AGENT_BASE_URL={model.url}", "-e", "AGENT_MODEL=stand-in"),
        *("-e", "AGENT_ENV=mini-terminal@1.0.0", "-e", f"AENV_SYSTEM_URL={hub[0].url}"),
        *("-e", "AENV_API_KEY", "-e", "OPENAI_API_KEY", "-e", f"AGENT_INNER_TTL={TTL}"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [(r["outcome"], r["reward"]) for r in records] == [("ok", 1.0)] * 3
    assert all(r["answer"] == DONE for r in records)
    for path in out.iterdir():
        if path.is_file():
            assert MODEL_KEY.encode() not in path.read_bytes(), path
            assert hub[1].encode() not in path.read_bytes(), path


def test_settings_are_read_with_clear_problems_and_scrubbed() -> None:
    from builtin_envs.agent.settings import AgentSettings

    base = {"AGENT_BASE_URL": "http://127.0.0.1:9/v1", "AGENT_MODEL": "m"}
    assert "no model configured: set AGENT_BASE_URL and AGENT_MODEL" in str(
        AgentSettings.read({}).problem
    )
    assert "not an http(s) URL" in str(
        AgentSettings.read({**base, "AGENT_BASE_URL": "ftp://x"}).problem
    )
    assert "AGENT_INNER_TTL='1' must be at least 3" in str(
        AgentSettings.read({**base, "AGENT_INNER_TTL": "1"}).problem
    )
    forwarded = AgentSettings.read({**base, "AGENT_FORWARD": "NOPE"}).problem
    assert "AGENT_FORWARD names NOPE, which this instance does not have" in str(forwarded)
    inner = AgentSettings.read(
        {
            **base,
            "MY_TOKEN": "tok-123456",
            "AGENT_FORWARD": "MY_TOKEN",
            "AGENT_INNER_AGENT_ENV": "mini-terminal@1.0.0",
        }
    )
    assert inner.problem is None
    assert dict(inner.inner_variables) == {
        "MY_TOKEN": "tok-123456",
        "AGENT_ENV": "mini-terminal@1.0.0",
    }
    assert inner.scrub("it is tok-123456") == "it is [redacted]"
    keyed = AgentSettings.read(
        {**base, "AGENT_API_KEY_VAR": "MODEL_SECRET_X", "MODEL_SECRET_X": "abcdefgh"}
    )
    assert keyed.api_key == "abcdefgh"
    assert keyed.scrub("MODEL_SECRET_X holds abcdefgh") == "MODEL_SECRET_X holds [redacted]"
    assert "abcdefgh" not in json.dumps(keyed.describe()) + repr(keyed)
