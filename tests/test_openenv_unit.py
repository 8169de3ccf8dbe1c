"""The OpenEnv server's answers that need no instance (in this process: starlette's test
client), and ``aenv openenv serve``'s refusals before it serves (tests/_cli.py). The episodes
themselves, with OpenEnv's own clients: tests/test_openenv.py."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from aenv_openenv import create_app
from aenv_openenv.session import reward_number
from tests._cli import aenv

BEARER = {"Authorization": "Bearer s3cret"}


def _rpc(method: str, params: dict[str, object]) -> dict[str, object]:
    return {"jsonrpc": "2.0", "method": method, "params": params, "id": 7}


def test_a_token_guards_every_route_and_websocket() -> None:
    client = TestClient(create_app("mini-terminal@1.0.0", token="s3cret"))
    assert client.get("/health").status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    answer = client.get("/health", headers=BEARER)
    assert answer.json() == {
        "status": "healthy",
        "sessions": {"active_sessions": 0, "max_sessions": 1},
    }
    with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/ws"):
        pass
    assert refused.value.code == 1008


def test_schema_metadata_and_mcp_errors_need_no_instance() -> None:
    client = TestClient(create_app("mini-terminal@1.0.0", max_concurrent_envs=3))
    schema = client.get("/schema").json()
    assert set(schema) == {"action", "observation", "state"}
    assert {"tool", "arguments"} <= set(schema["action"]["properties"])
    assert client.get("/metadata").json()["version"] == "1.0.0"
    unknown = client.post("/mcp", json=_rpc("tools/call", {"name": "x", "session_id": "nope"}))
    assert unknown.json()["error"] == {"code": -32602, "message": "Unknown session_id: nope"}
    close = client.post("/mcp", json=_rpc("openenv/session/close", {})).json()
    assert close["error"]["code"] == -32602
    assert client.post("/mcp", json=_rpc("resources/list", {})).json()["error"]["code"] == -32601
    assert client.post("/mcp", content=b"{").json()["error"]["code"] == -32700
    assert client.post("/step", json={"nope": 1}).status_code == 422


def test_rewards_are_numbers_or_none() -> None:
    assert reward_number(True) == 1.0
    assert reward_number({"score": 2}) == 2.0
    assert reward_number(float("nan")) is None
    assert reward_number([1.0]) is None


def test_an_unknown_environment_exits_2_naming_it() -> None:
    done = aenv("openenv", "serve", "no-such-env@9.9.9", "--port", "1")
    assert done.returncode == 2
    assert "no-such-env" in done.stderr


def test_an_unknown_engine_exits_2_naming_the_engines() -> None:
    done = aenv("openenv", "serve", "mini-terminal@1.0.0", "--engine", "nope", "--port", "1")
    assert done.returncode == 2
    assert "local" in done.stderr


def test_the_limit_is_at_least_one() -> None:
    done = aenv("openenv", "serve", "mini-terminal@1.0.0", "--max-concurrent-envs", "0")
    assert done.returncode == 2
    assert "--max-concurrent-envs" in done.stderr


def test_help_names_the_endpoints_clients() -> None:
    done = aenv("openenv", "serve", "--help")
    assert done.returncode == 0
    assert "OpenEnv" in done.stdout
