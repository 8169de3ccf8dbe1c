"""One error envelope on the wire, one retry rule for reads.

Every class of :mod:`aenv_ray.errors` survives :func:`encode_error` -> JSON ->
:func:`decode_error` with its typed fields; each real server (the runtime, the engine daemon,
EnvHub) answers errors of each family in that envelope, and its client raises the exact class
with its fields. A read whose connection drops is sent again (``max_retries``); a tool call
never is.
"""

from __future__ import annotations

import asyncio
import doctest
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import httpx
import orjson
import pytest

from aenv_cli._scaffold import write_project
from aenv_ray import Environment, errors
from aenv_ray.bundle import build_bundle
from aenv_ray.engine import InstanceSpec
from aenv_ray.errors import (
    AuthenticationError,
    ConfigurationError,
    EnvironmentNotFoundError,
    FunctionError,
    FunctionErrorKind,
    FunctionNotFoundError,
    InstanceBrokenError,
    InstanceNotFoundError,
    ProtocolError,
    VersionConflictError,
    decode_error,
    encode_error,
)
from aenv_ray.hub import HubClient
from aenv_ray.testing import RuntimeProcess
from envhub.keys import create_key
from envhub.store import open_store
from local_backend.client import DaemonEngine
from tests._hub import HubProcess, raw
from tests.test_errors import CLASSES, _keywords, _kwargs

PROBE = Path(__file__).parent / "envs" / "probe"
# the seeds' ``error_type`` is no shadow: on a function error it is that typed field itself
ENVELOPE_KEYS = {"error", "type", "retryable", "success"}


# -- the envelope -----------------------------------------------------------------------------


def test_the_doctests_of_the_errors_module_pass() -> None:
    result = doctest.testmod(errors)
    assert result.attempted >= 6
    assert result.failed == 0


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_round_trips_through_json_with_its_typed_fields(
    cls: type[errors.AEnvError],
) -> None:
    original = cls("instance abc123 ended: crashed", **_kwargs(cls))
    wire = orjson.loads(orjson.dumps(encode_error(original)))
    assert wire["type"] == cls.__name__
    assert wire["error"] == "instance abc123 ended: crashed"
    assert wire["retryable"] is cls.retryable
    assert set(wire) - {"error", "type", "retryable"} == _keywords(cls)
    clone = decode_error(wire, 500)
    assert type(clone) is cls
    assert vars(clone) == vars(original)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_no_typed_field_shadows_a_key_of_the_envelope(cls: type[errors.AEnvError]) -> None:
    assert not _keywords(cls) & ENVELOPE_KEYS


def test_unset_fields_stay_off_the_wire() -> None:
    assert encode_error(FunctionError("x")) == {
        "error": "x",
        "type": "FunctionError",
        "retryable": False,
    }


def test_a_subclass_defined_elsewhere_goes_as_its_nearest_known_class() -> None:
    class ProjectMissing(ConfigurationError):
        """Someone else's subclass."""

    wire = encode_error(ProjectMissing("no such project", env_name="x@1"))
    assert (wire["type"], wire["env_name"]) == ("ConfigurationError", "x@1")
    assert type(decode_error(wire, 400)) is ConfigurationError


@pytest.mark.parametrize(
    ("name", "status", "expected"),
    [
        ("SystemExit", 400, ConfigurationError),  # a builtin, not one of ours
        ("FunctionErrorKind", 401, AuthenticationError),  # in the module, not an error
        ("__class__", 403, errors.PermissionDeniedError),
        ("os.system", 500, errors.AEnvError),
        (None, 404, errors.AEnvError),
        (["InstanceBrokenError"], 503, errors.AEnvError),
    ],
)
def test_a_wire_names_only_classes_of_the_tree(
    name: Any, status: int, expected: type[errors.AEnvError]
) -> None:
    error = decode_error({"error": "boom", "type": name}, status)
    assert type(error) is expected
    assert error.message == "boom"


def test_a_fallback_replaces_an_unknown_name_and_context_wins_over_the_wire() -> None:
    wire = {"error": "no", "type": "NewerError", "function": "f", "instance_id": "theirs"}
    error = decode_error(wire, 500, fallback=FunctionError, instance_id="mine", function="reward")
    assert type(error) is FunctionError
    assert (error.instance_id, error.function) == ("mine", "reward")


def test_fields_of_the_wrong_type_are_dropped_not_trusted() -> None:
    wire = {
        "error": "over",
        "type": "QuotaExceededError",
        "limit": ["memory"],
        "requested": "8",
        "allowed": True,
        "retryable": True,  # the class decides
        "__dict__": {"retryable": True},
    }
    error = decode_error(wire, 403)
    assert type(error) is errors.QuotaExceededError
    assert (error.limit, error.requested, error.allowed) == (None, None, None)
    assert error.retryable is False
    assert "retryable" not in vars(error)
    kind = decode_error({"error": "x", "type": "FunctionError", "kind": "exploded"}, 500)
    assert isinstance(kind, FunctionError)
    assert kind.kind is None
    nan = decode_error({"error": "x", "type": "CallTimeoutError", "timeout": float("inf")}, 504)
    assert isinstance(nan, errors.CallTimeoutError)
    assert nan.timeout is None


@pytest.mark.parametrize("payload", [None, "text", [1], {"error": {"type": "X"}}, {"message": "m"}])
def test_what_is_no_envelope_is_a_protocol_error(payload: Any) -> None:
    error = decode_error(payload, 502, env_name="x@1")
    assert type(error) is ProtocolError
    assert "HTTP 502" in error.message
    assert error.env_name == "x@1"


# -- the runtime ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime() -> Iterator[RuntimeProcess]:
    with RuntimeProcess(PROBE) as process:
        yield process


async def test_the_runtime_answers_function_errors_in_the_envelope_with_the_seeds_keys(
    runtime: RuntimeProcess,
) -> None:
    async with httpx.AsyncClient(base_url=runtime.url) as http:
        missing = await http.post("/functions/ad", json={})
        bad = await http.post("/functions/add", json={"a": "x"})
        raised = await http.post("/functions/explode", json={})
        slow = await http.post(
            "/functions/nap", json={"seconds": 5}, headers={"X-AEnv-Timeout": "0.2"}
        )
    assert missing.status_code == 404
    assert missing.json() == {
        "success": False,
        "error": missing.json()["error"],
        "type": "FunctionNotFoundError",
        "retryable": False,
        "function": "ad",
        "kind": "not_found",
        "error_type": "not_found",
    }
    assert "did you mean `add`" in missing.json()["error"]
    assert (bad.status_code, bad.json()["kind"], bad.json()["error_type"]) == (
        400,
        "invalid_arguments",
        "invalid_arguments",
    )
    assert (raised.status_code, raised.json()["kind"], raised.json()["error_type"]) == (
        500,
        "execution",
        "RuntimeError",
    )
    assert (slow.status_code, slow.json()["type"], slow.json()["kind"]) == (
        504,
        "FunctionError",
        "timeout",
    )


async def test_the_sdk_raises_the_runtimes_errors_as_their_classes(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        with pytest.raises(FunctionNotFoundError) as missing:
            await env.call_function("ad")
        with pytest.raises(FunctionError) as raised:
            await env.call_function("explode")
        with pytest.raises(FunctionError) as slow:
            await env.call_function("nap", {"seconds": 5}, timeout=0.2)
        with pytest.raises(FunctionError) as bad:
            await env.call_function("add", {"a": "x"})
    assert type(missing.value) is FunctionNotFoundError
    assert missing.value.kind is FunctionErrorKind.NOT_FOUND
    assert missing.value.function == "function `ad`"
    assert missing.value.env_name == env.env_name
    assert (type(raised.value), raised.value.kind, raised.value.error_type) == (
        FunctionError,
        FunctionErrorKind.EXECUTION,
        "RuntimeError",
    )
    assert "kaboom" in raised.value.message
    assert (slow.value.kind, slow.value.error_type) == (FunctionErrorKind.TIMEOUT, "timeout")
    assert bad.value.kind is FunctionErrorKind.INVALID_ARGUMENTS


async def test_the_runtime_answers_a_request_it_cannot_read_as_a_protocol_error(
    runtime: RuntimeProcess,
) -> None:
    async with httpx.AsyncClient(base_url=runtime.url) as http:
        answer = await http.post(
            "/aenv/v1/call", content=b"{not json", headers={"content-type": "application/json"}
        )
        cross = await http.get("/aenv/v1/info", headers={"Origin": "http://evil.example"})
    assert answer.status_code == 400
    error = decode_error(answer.json(), answer.status_code)
    assert type(error) is ProtocolError
    assert answer.json()["error_type"] == "bad_request"  # the seeds' key stays
    assert cross.status_code == 403
    assert type(decode_error(cross.json(), 403)) is errors.PermissionDeniedError


# -- the engine daemon ------------------------------------------------------------------------


@pytest.fixture
async def daemon() -> AsyncIterator[DaemonEngine]:
    state = Path(tempfile.mkdtemp(prefix="aenv-we-"))
    engine = DaemonEngine(state)
    try:
        yield engine
    finally:
        await engine.shutdown()
        shutil.rmtree(state, ignore_errors=True)


async def _daemon_raw(engine: DaemonEngine, method: str, path: str, body: Any) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=str(engine.socket_path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(method, f"http://engine{path}", json=body) as reply,
    ):
        return reply.status, json.loads(await reply.read())


async def test_the_daemon_answers_each_family_in_the_envelope(daemon: DaemonEngine) -> None:
    with pytest.raises(InstanceNotFoundError) as missing:
        await daemon.get("nope")
    assert type(missing.value) is InstanceNotFoundError
    assert missing.value.instance_id == "nope"
    assert missing.value.retryable
    with pytest.raises(EnvironmentNotFoundError) as unknown:
        await daemon.create(InstanceSpec(env_ref="no-such-env@1.0.0"), timeout=30)
    assert type(unknown.value) is EnvironmentNotFoundError
    status, body = await _daemon_raw(daemon, "POST", "/v1/instances/nope/renew", {})
    assert status == 400
    assert (body["type"], body["retryable"]) == ("ConfigurationError", False)
    assert "renew needs `ttl`" in body["error"]
    assert type(decode_error(body, status)) is ConfigurationError
    status, body = await _daemon_raw(daemon, "GET", "/v1/instances/nope", None)
    assert (status, body["type"], body["retryable"]) == (404, "InstanceNotFoundError", True)


# -- the hub ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    data = tmp_path_factory.mktemp("hub")

    async def key() -> str:
        store = await open_store(f"sqlite:///{data}/hub.db")
        try:
            return (await create_key(store, tenant="alice"))[1]
        finally:
            await store.aclose()

    secret = asyncio.run(key())
    process = HubProcess(data)
    with process:
        yield process, secret


async def test_the_hub_answers_each_family_in_the_envelope(
    hub: tuple[HubProcess, str], tmp_path: Path
) -> None:
    process, key = hub
    status, headers, body = await raw("GET", f"{process.url}/v1/envs")
    assert (status, body["type"], headers.get("WWW-Authenticate")) == (
        401,
        "AuthenticationError",
        "Bearer",
    )
    assert type(decode_error(body, status)) is AuthenticationError
    status, _, body = await raw("GET", f"{process.url}/v1/envs/nope/1.0.0", key=key)
    assert (status, body["type"]) == (404, "EnvironmentNotFoundError")
    status, _, body = await raw("POST", f"{process.url}/v1/instances", key=key, body={"env": 5})
    assert (status, body["type"]) == (400, "ConfigurationError")

    project = tmp_path / "wire-errors"
    write_project(project, "wire-errors")
    first = build_bundle(project)
    source = next((project / "src").glob("*.py"))
    source.write_text(source.read_text() + "\n# second\n")
    second = build_bundle(project)
    async with HubClient(process.url, api_key=key) as client:
        await client.push(first.data)
        with pytest.raises(VersionConflictError) as conflict:
            await client.push(second.data)
    assert type(conflict.value) is VersionConflictError
    assert conflict.value.existing_digest == first.digest
    assert "wire-errors@" in (conflict.value.env_name or "")


# -- the SDK's retries ------------------------------------------------------------------------


class DroppingServer:
    """A raw HTTP/1.1 server on loopback that answers like a runtime, one request per
    connection (``Connection: close``: every request is on a fresh connection, so the wire
    client's own reuse retry never applies), and drops the next ``drops[path]`` requests to a
    path after reading them, without a byte of answer."""

    ANSWERS: ClassVar[dict[str, Any]] = {
        "/health": {"success": True, "data": {"status": "healthy"}},
        "/aenv/v1/info": {"ref": "fake@1.0.0", "tools": ["echo"], "timeouts": {}},
        "/aenv/v1/tools": {"tools": [{"name": "echo", "description": "", "inputSchema": {}}]},
        "/aenv/v1/call": {"content": [{"type": "text", "text": "hi"}], "is_error": False},
    }

    def __init__(self) -> None:
        self.drops: dict[str, int] = {}
        self.seen: list[str] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> DroppingServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, path = head.split(b" ", 2)[:2]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            self.seen.append(f"{method.decode()} {path.decode()}")
            route = path.decode().split("?")[0]
            if self.drops.get(route, 0) > 0:
                self.drops[route] -= 1
                return  # close without answering
            body = orjson.dumps(self.ANSWERS[route])
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        finally:
            writer.close()


async def test_a_read_whose_connection_drops_is_retried_and_a_call_never_is() -> None:
    async with DroppingServer() as server, Environment.attach(server.url, max_retries=2) as env:
        server.drops["/aenv/v1/tools"] = 2
        tools = await env.list_tools()
        assert [t["name"] for t in tools] == ["fake@1.0.0/echo"]
        assert server.seen.count("GET /aenv/v1/tools") == 3  # two dropped, the third read

        server.drops["/health"] = 1
        assert await env.check_health() == {"status": "healthy"}

        server.drops["/aenv/v1/tools"] = 3  # one more drop than retries
        with pytest.raises(InstanceBrokenError, match="dropped the connection"):
            await env.list_tools()

        server.drops["/aenv/v1/call"] = 1
        before = server.seen.count("POST /aenv/v1/call")
        with pytest.raises(InstanceBrokenError, match="dropped the connection"):
            await env.call_tool("echo", {"text": "hi"})
        assert server.seen.count("POST /aenv/v1/call") == before + 1  # it may have run
        assert (await env.call_tool("echo", {"text": "hi"})).text == "hi"


async def test_max_retries_zero_sends_a_read_once() -> None:
    async with DroppingServer() as server, Environment.attach(server.url, max_retries=0) as env:
        server.drops["/aenv/v1/tools"] = 1
        with pytest.raises(InstanceBrokenError):
            await env.list_tools()
        assert server.seen.count("GET /aenv/v1/tools") == 1
        assert len(await env.list_tools()) == 1
