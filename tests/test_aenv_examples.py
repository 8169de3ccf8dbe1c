"""AEnvironment's documented examples, run as its users run them, against aenv-ray.

Each script in tests/aenvironment/ is written from AEnvironment's docs, with the same calls in
the same order, and runs in a process of its own with aenv-ray installed (its ``aenv`` package
is the compatibility layer), on the embedded local engine:

- the SDK guide's interactive mini-terminal session (``mini-terminal@1.0.1``: an alias of the
  built-in ``mini-terminal@1.0.0``), its input typed on stdin;
- the SDK and environment guides' tool, reward, function and health examples (guide/, whose
  health check imports psutil) and their usage examples;
- the quickstart: ``aenv init`` and its ``echo_tool`` and ``simple_reward``, used in the
  local mode (``aenv run`` and ``DUMMY_INSTANCE_IP``);
- the tau2 RL example's agent loop (``tau2-env@1.0.0``: an alias of the built-in
  ``tau2@1.0.0``), an OpenAI Agents SDK agent, against a deterministic chat server that plays
  both the agent's model (it replays the task's gold actions) and tau2's user.

- agent as environment (its README): agent A calls agent B's ``chat`` tool; agent B is
  examples/agent_b (the built-in agent as a project) configured the AEnvironment way, its model's
  settings in ``deployConfig.environmentVariables``, and a deterministic model on loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from aenv_ray.testing import RuntimeProcess
from tests._chat_server import AgentModel, ChatServer
from tests._cli import aenv as run_cli
from tests._tau2 import require_tau2_data

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "aenvironment"


def _python(
    script: Path | str, *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(script), *args],
        input=stdin,
        env={**os.environ, "AENV_ENV_PATH": str(HERE), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_sdk_guides_mini_terminal_session() -> None:
    done = _python(HERE / "terminal_session.py", stdin="echo hello from aenv-ray\npwd\nexit\n")
    out = done.stdout
    assert "'name': 'mini-terminal@1.0.1/execute_command'" in out  # the name it was asked by
    results = re.findall(r"Result:\n (ToolResult\(.*\))", out)
    assert len(results) == 2
    assert results[0].startswith("ToolResult(content=[{'type': 'text', 'text': '{\"output\":")
    assert "hello from aenv-ray" in results[0]
    assert results[0].endswith("is_error=False)")
    assert out.rstrip().endswith("Leaving the interactive mode")


def test_the_guides_environment_code_and_usage() -> None:
    done = _python(HERE / "guide_agent.py")
    assert "Available tools: 3" in done.stdout
    report = json.loads(done.stdout.strip().splitlines()[-1])
    names = ["guide-env/my_custom_echo_env", "guide-env/search_users", "guide-env/simple_types"]
    assert sorted(report["basic"]) == sorted(report["tools"]) == names
    assert report["echo"] == [{"type": "text", "text": '{"result":"Hello from AEnvironment!"}'}]
    assert report["typed"] == [{"type": "text", "text": "OK"}]
    assert report["model"] == [{"type": "text", "text": "Searching: alice"}]
    assert report["reward"] == {
        "score": 0.8,  # 0.5 + 0.3: the code has no import, so no structure bonus
        "feedback": "Tests passed; Code concise",
        "details": {"passed": 5, "failed": 0},
    }
    assert report["function"] == {"status": "success", "data": {"k": "v"}}
    health = report["health"]
    assert health["success"] is True
    assert health["data"]["status"] == "healthy"
    assert 0 <= health["data"]["memory_percent"] <= 100  # psutil, inside the instance


QUICKSTART_ENV = '''from typing import Any, Dict

from aenv import register_reward, register_tool


@register_tool
def echo_tool(content: str) -> Dict[str, Any]:
    """Echo the content, with a note that it was processed.

    Parameters:
        content: Text content to echo
    """
    return {"original_content": content, "processed_content": f"processed: {content}"}


@register_reward
def simple_reward(task: str) -> Dict[str, Any]:
    """A fixed reward for any task."""
    return {"task_name": task, "status": "success", "score": 1.0}
'''

QUICKSTART_AGENT = """import asyncio
from aenv import Environment

async def local_usage():
    async with Environment("helloworld") as env:
        tools = await env.list_tools()
        print(f"Available tools: {[t['name'] for t in tools]}")
        result = await env.call_tool("echo_tool", {"content": "Hello from AEnvironment!"})
        print(f"Tool response: {result.content}")
        print(f"Reward: {await env.call_reward({'task': 'greet'})}")

if __name__ == "__main__":
    asyncio.run(local_usage())
"""


def test_the_quickstart_in_the_local_mode(tmp_path: Path) -> None:
    made = run_cli("init", "helloworld", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "helloworld"
    (project / "src" / "custom_env.py").write_text(QUICKSTART_ENV)
    (project / "src" / "helloworld.py").unlink()  # the quickstart's project is its own code
    (tmp_path / "agent.py").write_text(QUICKSTART_AGENT)
    with RuntimeProcess(project) as runtime:  # `aenv run`
        done = _python(tmp_path / "agent.py", env={"DUMMY_INSTANCE_IP": runtime.url})
    assert "Available tools: ['helloworld/echo_tool']" in done.stdout
    assert "processed: Hello from AEnvironment!" in done.stdout
    assert "Reward: {'task_name': 'greet', 'status': 'success', 'score': 1.0}" in done.stdout


# -- tau2 ----------------------------------------------------------------------------------------

TASK = ("airline", "5")
MARKER = "[task airline/5]"


def _tau2_reply(content: str | None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-aenv",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def _tau2_respond(body: dict[str, Any]) -> dict[str, Any]:
    from builtin_envs.tau2 import get_domain

    messages = body["messages"]
    criteria = get_domain(TASK[0]).task(TASK[1]).evaluation_criteria
    assert criteria is not None
    if body["model"] == "user-model":  # tau2's user simulator (its own turns are "assistant")
        if not any(m["role"] == "assistant" for m in messages):
            return _tau2_reply(f"{MARKER} Hi, I need some help.")
        return _tau2_reply(
            "###STOP###" if "ALL DONE" in str(messages[-1].get("content")) else "Go on."
        )
    # the agent's model (the Agents SDK's default): each turn is a new run from the user's last
    # message; the first replays the task's gold actions by the names the tools were given
    names = {t["function"]["name"].rsplit("/", 1)[-1]: t["function"]["name"] for t in body["tools"]}
    actions = [a for a in criteria.actions or [] if a.requestor == "assistant"]
    made = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
    if MARKER in str(messages[1]["content"]) and made < len(actions):
        action = actions[made]
        call = {
            "id": f"call-{made}",
            "type": "function",
            "function": {"name": names[action.name], "arguments": json.dumps(action.arguments)},
        }
        return _tau2_reply(None, [call])
    return _tau2_reply(" ".join(criteria.communicate_info or []) + " ALL DONE")


def test_the_tau2_rl_agent_loop() -> None:
    require_tau2_data()
    with ChatServer(_tau2_respond) as chat:
        done = _python(
            HERE / "tau2_agent.py",
            "--domain",
            TASK[0],
            "--task_id",
            TASK[1],
            env={
                "OPENAI_BASE_URL": chat.url,
                "OPENAI_API_KEY": "sk-agent",
                "TAU2_USER_LLM": "user-model",
                "TAU2_USER_LLM_API_BASE": chat.url,
                "TAU2_USER_LLM_API_KEY": "sk-user",
            },
        )
        agent_requests = [b for b in chat.requests if b["model"] != "user-model"]
    assert done.stdout.strip().splitlines()[-1] == "reward: 1.0", done.stdout[-2000:]
    tools = {t["function"]["name"] for t in agent_requests[0]["tools"]}
    assert "tau2-env@1.0.0/get_reservation_details" in tools  # AEnvironment's names
    called = [
        c["function"]["name"]
        for body in agent_requests
        for m in body["messages"]
        for c in m.get("tool_calls") or []
    ]
    assert called  # the gold actions, called by the agent through the environment
    assert all(name.startswith("tau2-env@1.0.0/") for name in called)


def test_agent_as_environment(tmp_path: Path) -> None:
    config = json.loads((ROOT / "examples" / "agent_b" / "config.json").read_text())
    deploy = config["deployConfig"]
    deploy["env"].pop("AGENT_ENV")  # a chat agent, no inner environment (and so no hub)
    agent_b = tmp_path / "agent_b"
    (agent_b / "src").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "agent_b" / "src" / "agent_b.py", agent_b / "src")
    with ChatServer(AgentModel()) as model:
        deploy["environmentVariables"] = {  # AEnvironment's key for an instance's variables
            "AGENT_BASE_URL": model.url,
            "AGENT_MODEL": "stand-in",
            "OPENAI_API_KEY": "sk-model-key",
        }
        (agent_b / "config.json").write_text(json.dumps(config))
        done = _python(HERE / "agent_a.py", env={"AENV_ENV_PATH": str(tmp_path)})
        asked = [m for body in model.requests for m in body["messages"] if m["role"] == "user"]
    lines = done.stdout.strip().splitlines()
    assert "agent-b@1.0.0/chat" in lines[0]
    assert lines[-1] == "[{'type': 'text', 'text': 'echo: Hello!'}]"
    assert [m["content"] for m in asked] == ["Hello!"]  # agent B's model got agent A's message
