"""OpenEnv's own clients driving a server, run by OpenEnv's interpreter (tests/_oracles.py
``OPENENV``), never by the suite's: ``python openenv_driver.py SCENARIO BASE_URL`` prints one
JSON object, what the scenario saw (tests/test_openenv.py asserts on it).

Scenarios:

- ``terminal``: aenv-ray's mini-terminal behind ``aenv openenv serve`` (limit 2): an episode
  with ``GenericEnvClient`` (reset, steps, the reward), two sessions at once (each its own
  instance), a third refused, a session after they close, and the MCP path (``MCPToolClient``
  over ``/mcp``, its session attached to ``/ws``).
- ``counter``: the OpenEnv counter environment of tests/test_openenv.py, served by OpenEnv's
  own server inside an aenv-ray instance, reached through :class:`AenvRayProvider`'s bridge.
- ``episode``: one GenericEnvClient episode to its reward (tests/test_k8s_openenv.py: on
  Kubernetes).
- ``idle``: sessions left idle past ``aenv openenv serve --idle-timeout``: the reaper closes
  them, and OpenEnv's client is told so when it comes back.
- ``provider``: the same counter started by OpenEnv's own client code through
  ``AenvRayProcessProvider`` (``GenericEnvClient(provider=...)`` and ``from_docker_image``),
  imported here, in OpenEnv's virtual environment, with no aenv-ray dependency installed
  (the URL argument is then a JSON object: the provider's arguments).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from typing import Any

from openenv.core import GenericEnvClient
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient
from websockets.sync.client import connect


def _run(env: Any, command: str) -> dict[str, Any]:
    result = env.step({"tool": "execute_command", "arguments": {"command": command}})
    return {"observation": result.observation, "reward": result.reward, "done": result.done}


def _refusal(base_url: str, headers: dict[str, str] | None = None) -> str:
    try:
        with GenericEnvClient(base_url=base_url, headers=headers).sync() as extra:
            extra.reset()
    except Exception as exc:  # OpenEnv raises RuntimeError (or ConnectionError) for a refusal
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def terminal(base_url: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with GenericEnvClient(base_url=base_url).sync() as env:
        reset = env.reset()
        seen["reset_tools"] = [tool["name"] for tool in reset.observation["tools"]]
        seen["step"] = _run(env, "echo hello > out.txt && cat out.txt")
        reward = env.step({"tool": "reward", "arguments": {"path": "out.txt", "expected": "hello"}})
        seen["reward"] = {"reward": reward.reward, "done": reward.done}
        seen["state"] = env.state()
        try:
            env.step({"tool": "execute_command", "arguments": {"command": "true"}})
            seen["after_done"] = "accepted"
        except RuntimeError as exc:
            seen["after_done"] = str(exc)
        again = env.reset()  # a new episode: a new instance, the old file gone
        seen["new_instance"] = again.observation["instance_id"] != reset.observation["instance_id"]
        seen["after_reset"] = _run(env, "cat out.txt 2>&1 || echo missing")["observation"]["result"]
    with (
        GenericEnvClient(base_url=base_url).sync() as a,
        GenericEnvClient(base_url=base_url).sync() as b,
    ):
        a.reset()
        b.reset()
        _run(a, "echo from-a > out.txt")
        _run(b, "echo from-b > out.txt")
        seen["a_reads"] = _run(a, "cat out.txt")["observation"]["result"]["output"]
        seen["b_reads"] = _run(b, "cat out.txt")["observation"]["result"]["output"]
        seen["third"] = _refusal(base_url)
        seen["a_reward"] = a.step(
            {"tool": "reward", "arguments": {"path": "out.txt", "expected": "from-a"}}
        ).reward
        seen["b_reward_of_a"] = b.step(
            {"tool": "reward", "arguments": {"path": "out.txt", "expected": "from-a"}}
        ).reward
    seen["idle"] = _idle(base_url)  # the server releases a closed session's instance, then its slot
    seen["after_close"] = _refusal(base_url)
    seen["mcp"] = asyncio.run(_mcp(base_url))
    seen["vanished"] = _vanish(base_url)
    return seen


def _idle(base_url: str) -> dict[str, int]:
    """The server's sessions once none is open (or as they are after 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(base_url + "/health", timeout=5) as answer:
            sessions = dict(json.loads(answer.read())["sessions"])
        if sessions["active_sessions"] == 0 or time.monotonic() > deadline:
            return sessions
        time.sleep(0.1)  # a release in progress on the server: nothing here to wait on


def _post_rpc(base_url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": 1}).encode()
    request = urllib.request.Request(
        base_url + "/mcp", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return dict(json.loads(answer.read()))


def episode(base_url: str) -> dict[str, Any]:
    """One episode with GenericEnvClient: reset, a command, the reward, the state."""
    with GenericEnvClient(base_url=base_url).sync() as env:
        reset = env.reset()
        step = _run(env, "echo on-k8s > out.txt && cat out.txt")
        check = {"path": "out.txt", "expected": "on-k8s"}
        reward = env.step({"tool": "reward", "arguments": check})
        return {
            "instance_id": reset.observation["instance_id"],
            "output": step["observation"]["result"]["output"],
            "reward": reward.reward,
            "done": reward.done,
            "state": env.state(),
        }


def idle(base_url: str) -> dict[str, Any]:
    """A /ws session and an /mcp session left idle past the server's --idle-timeout: the
    reaper closes both; each client, coming back, is told so; a reset starts anew."""
    seen: dict[str, Any] = {}
    with GenericEnvClient(base_url=base_url).sync() as env:
        env.reset()
        seen["before"] = _run(env, "echo kept > kept.txt && cat kept.txt")["observation"]
        made = _post_rpc(base_url, "openenv/session/create", {})["result"]["session_id"]
        with urllib.request.urlopen(base_url + "/health", timeout=5) as answer:
            seen["open"] = json.loads(answer.read())["sessions"]["active_sessions"]
        seen["reaped"] = _idle(base_url)  # until the reaper has closed both (or 30 s)
        try:
            env.step({"tool": "execute_command", "arguments": {"command": "cat kept.txt"}})
            seen["step_after"] = "accepted"
        except RuntimeError as exc:
            seen["step_after"] = str(exc)
        again = env.reset()  # a new session on the same connection, a new instance
        seen["reset_after"] = [tool["name"] for tool in again.observation["tools"]]
        seen["fresh"] = _run(env, "cat kept.txt 2>&1 || echo gone")["observation"]["result"]
        call = {"session_id": made, "name": "execute_command", "arguments": {"command": "true"}}
        seen["mcp_after"] = _post_rpc(base_url, "tools/call", call)
        ws_url = base_url.replace("http://", "ws://") + f"/ws?session_id={made}"
        with connect(ws_url) as ws:  # refused at once: the frame, then the close
            seen["attach_after"] = json.loads(ws.recv(timeout=60))
    seen["closed"] = _idle(base_url)
    return seen


def _vanish(base_url: str) -> str:
    """A client that goes away mid-episode without OpenEnv's ``close``: its WebSocket closes."""
    ws_url = base_url.replace("http://", "ws://") + "/ws"
    with connect(ws_url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        answer = json.loads(ws.recv(timeout=60))
    return str(answer["type"])


async def _mcp(base_url: str) -> dict[str, Any]:
    async with MCPToolClient(base_url=base_url) as env:
        tools = await env.list_tools()
        out = await env.call_tool("execute_command", command="echo via-mcp")
        step = await env.step(
            CallToolAction(tool_name="execute_command", arguments={"command": "echo stepped"})
        )
        return {
            "tools": [tool.name for tool in tools],
            "call": out,
            "step": step.observation.model_dump(),
        }


def counter(base_url: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else None
    seen["without_token"] = _refusal(base_url) if TOKEN else None
    with GenericEnvClient(base_url=base_url, headers=headers).sync() as env:
        first = env.reset()
        seen["reset"] = {"observation": first.observation, "done": first.done}
        steps = [env.step({"amount": amount}) for amount in (2, 3)]
        seen["steps"] = [{"total": s.observation["total"], "reward": s.reward} for s in steps]
        final = env.step({"amount": 5})
        seen["final"] = {"total": final.observation["total"], "reward": final.reward}
        seen["done"] = final.done
        seen["state"] = env.state()
        with GenericEnvClient(base_url=base_url, headers=headers).sync() as other:
            other.reset()
            seen["other"] = other.step({"amount": 1}).observation["total"]
            seen["third"] = _refusal(base_url, headers)
    return seen


def provider(spec: str) -> dict[str, Any]:
    from aenv_openenv.process_provider import AenvRayProcessProvider

    kwargs = json.loads(spec)
    seen: dict[str, Any] = {}
    made = AenvRayProcessProvider(**kwargs)
    client = GenericEnvClient(provider=made, headers=made.headers)
    with client.sync() as env:  # OpenEnv's client starts the provider on connect
        seen["started"] = made.base_url is not None
        seen["reset"] = env.reset().observation["total"]
        seen["steps"] = [env.step({"amount": n}).observation["total"] for n in (4, 6)]
        seen["pid_alive"] = made._proc is not None and made._proc.poll() is None
        proc = made._proc
    seen["stopped"] = made.base_url is None  # ... and stops it when it closes
    seen["exit_code"] = proc.returncode if proc is not None else None
    # from_docker_image: the "image" is the aenv-ray environment, started by the provider
    plain = AenvRayProcessProvider(**{**kwargs, "token": None})
    image = kwargs.get("env") or "counter-openenv@1.0.0"
    with GenericEnvClient.from_docker_image(image, provider=plain).sync() as env:
        env.reset()
        seen["from_image"] = env.step({"amount": 10}).done
    seen["image_stopped"] = plain.base_url is None
    seen["aenv_ray_imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "aenv_ray")
    return seen


TOKEN = ""  # the bridge's token (a third argument), if it has one

if __name__ == "__main__":
    scenario, url = sys.argv[1], sys.argv[2]
    TOKEN = sys.argv[3] if len(sys.argv) > 3 else ""
    scenarios = {
        "terminal": terminal,
        "counter": counter,
        "provider": provider,
        "idle": idle,
        "episode": episode,
    }
    print(json.dumps(scenarios[scenario](url)))
