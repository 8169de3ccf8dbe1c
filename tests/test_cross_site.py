"""A runtime without a token refuses what a web page in a browser on the same machine can send
it (another site's Origin, a DNS name pointing at loopback, a body that is not JSON), on every
route, MCP included; its own clients (the SDK, MCP clients) are not affected. A runtime with a
token leaves that to the token."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from aenv_ray.testing import RuntimeProcess
from sandbox_runtime import RuntimeServer, bind_socket, load_project

PROBE = Path(__file__).resolve().parent / "envs" / "probe"
CALL = b'{"name": "echo", "arguments": {"text": "hi"}}'
JSON = "application/json"


def _post(
    url: str, path: str = "/aenv/v1/call", body: bytes = CALL, **headers: str
) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=body, headers=headers)


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io:80", "[::1"],
)
def test_a_host_that_is_not_an_ip_or_localhost_is_refused(
    probe_runtime: RuntimeProcess, host: str
) -> None:
    answer = _post(probe_runtime.url, host=host, **{"content-type": JSON})
    assert answer.status_code == 403
    data = answer.json()
    assert data["error_type"] == "forbidden"
    assert "DNS rebinding" in data["error"]
    assert httpx.get(f"{probe_runtime.url}/health", headers={"host": host}).status_code == 403


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:{port}", "127.0.0.1:{port}", "[::1]:1", "10.1.2.3"]
)
def test_ip_literals_and_localhost_are_served(probe_runtime: RuntimeProcess, host: str) -> None:
    host = host.format(port=probe_runtime.port)
    answer = _post(probe_runtime.url, host=host, **{"content-type": JSON})
    assert answer.status_code == 200
    assert answer.json()["content"] == [{"type": "text", "text": "hi"}]


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:1"])
def test_another_sites_origin_is_refused(probe_runtime: RuntimeProcess, origin: str) -> None:
    answer = _post(probe_runtime.url, origin=origin, **{"content-type": JSON})
    assert answer.status_code == 403
    assert "cross-site request refused" in answer.json()["error"]
    mcp = _post(
        probe_runtime.url,
        "/mcp",
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}',
        origin=origin,
        accept="application/json, text/event-stream",
        **{"content-type": JSON},
    )
    assert mcp.status_code == 403


def test_its_own_origin_is_served(probe_runtime: RuntimeProcess) -> None:
    own = f"http://127.0.0.1:{probe_runtime.port}"
    assert _post(probe_runtime.url, origin=own, **{"content-type": JSON}).status_code == 200


@pytest.mark.parametrize(
    "kind",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_post_body_that_is_not_json_is_refused(
    probe_runtime: RuntimeProcess, kind: str | None
) -> None:
    headers = {} if kind is None else {"content-type": kind}
    for path, body in (("/aenv/v1/call", CALL), ("/functions/add", b'{"a": 1}')):
        answer = _post(probe_runtime.url, path, body, **headers)
        assert answer.status_code == 415
        data = answer.json()
        assert data["error_type"] == "unsupported_media_type"
        assert "Content-Type: application/json" in data["error"]


@pytest.mark.parametrize("kind", [JSON, "application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_with_parameters_are_served(
    probe_runtime: RuntimeProcess, kind: str
) -> None:
    answer = _post(probe_runtime.url, "/functions/add", b'{"a": 1}', **{"content-type": kind})
    assert answer.status_code == 200
    assert answer.json() == {"success": True, "data": 2}


def test_get_needs_no_content_type(probe_runtime: RuntimeProcess) -> None:
    assert httpx.get(f"{probe_runtime.url}/aenv/v1/tools").status_code == 200


@contextmanager
def serving_with_token(token: str) -> Iterator[str]:
    server = RuntimeServer(load_project(PROBE), sockets=[bind_socket("127.0.0.1", 0)])
    server.set_token(token)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.ready.wait(30)
    host, port = server.addresses[0]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        thread.join(10)


def test_a_runtime_with_a_token_relies_on_the_token() -> None:
    with serving_with_token("s3cret") as url:
        # a proxy may forward a DNS name, an Origin or no content type: the token decides
        authorized = {"authorization": "Bearer s3cret", "host": "instance.svc", "origin": "null"}
        served = _post(url, **authorized)
        refused = _post(url, host="instance.svc", **{"content-type": JSON})
    assert served.status_code == 200
    assert served.json()["content"][0]["text"] == "hi"
    assert refused.status_code == 401
