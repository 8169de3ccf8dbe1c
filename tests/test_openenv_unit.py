"""The OpenEnv server's answers that need no instance (in this process: starlette's test
client), and ``aenv openenv serve``'s refusals before it serves (tests/_cli.py). The episodes
themselves, with OpenEnv's own clients: tests/test_openenv.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from aenv_openenv import OpenEnvServer, create_app
from aenv_openenv.process_provider import COMMAND_VARIABLE, AenvRayProcessProvider
from aenv_openenv.session import reward_number
from tests._cli import aenv
from tests._openenv import counter_project

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


def test_the_idle_timeout_is_positive_or_off() -> None:
    with pytest.raises(ValueError, match="idle_timeout is a positive number"):
        OpenEnvServer("mini-terminal@1.0.0", idle_timeout=0)
    assert OpenEnvServer("mini-terminal@1.0.0").idle_timeout is None
    done = aenv("openenv", "serve", "mini-terminal@1.0.0", "--idle-timeout", "-1")
    assert done.returncode == 2
    assert "--idle-timeout" in done.stderr


def test_provide_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    assert aenv("openenv", "provide").returncode == 2  # neither ENV nor --project
    bad = aenv("openenv", "provide", "mini-terminal@1.0.0", "--instance-env", "[1]")
    assert bad.returncode == 2
    assert "--instance-env is a JSON object of strings" in bad.stderr
    project = counter_project(tmp_path / "counter")
    other = aenv("openenv", "provide", "other@1.0.0", "--project", str(project))
    assert other.returncode == 2
    assert "is counter-openenv@1.0.0, not other@1.0.0" in other.stderr


def test_the_process_provider_says_how_to_name_aenv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(COMMAND_VARIABLE, raising=False)
    with pytest.raises(RuntimeError, match="AENV_OPENENV_COMMAND"):
        AenvRayProcessProvider("counter-openenv@1.0.0").start_container()
    monkeypatch.setenv(COMMAND_VARIABLE, "/opt/aenv/bin/python -m aenv_cli")
    assert AenvRayProcessProvider().command() == ["/opt/aenv/bin/python", "-m", "aenv_cli"]
    with pytest.raises(RuntimeError, match="no environment"):
        AenvRayProcessProvider().start_container()


@pytest.mark.process
def test_a_child_that_fails_is_openenvs_runtime_error_with_its_last_words() -> None:
    provider = AenvRayProcessProvider(
        "no-such-env@9.9.9", engine="local", command=[sys.executable, "-m", "aenv_cli"]
    )
    with pytest.raises(RuntimeError, match="exited with code 1 before it served") as failed:
        provider.start_container()
    assert "no-such-env" in str(failed.value)  # the child's own words, its typed error's
    assert provider.base_url is None
