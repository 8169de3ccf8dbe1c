"""What JSON cannot carry, and what is too large, on both sides of a real runtime: NaN,
infinity and lone surrogates in results, values and arguments; answers over
``MAX_RESPONSE_BYTES``; limits over ``MAX_TIMEOUT``. Each is an error naming the problem, never a
silent ``null``, a non-JSON 500 or an OverflowError blamed on the tool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from aenv_ray import (
    ConfigurationError,
    FunctionError,
    ToolArgumentError,
    ToolErrorKind,
)
from aenv_ray.protocol import MAX_RESPONSE_BYTES
from aenv_ray.testing import RuntimeProcess

UNRULY = Path(__file__).resolve().parent / "envs" / "unruly"
JSON = {"content-type": "application/json"}
MCP = {**JSON, "accept": "application/json, text/event-stream"}
MCP_TIMEOUT = 60.0  # seconds: what an MCP SDK client allows (the official ones: 30 to 60 s)


@pytest.fixture(scope="module")
def unruly() -> Iterator[RuntimeProcess]:
    with RuntimeProcess(UNRULY) as runtime:
        yield runtime


# -- results and values the runtime sends -------------------------------------------------------
@pytest.mark.parametrize(("kind", "word"), [("nan", "NaN"), ("inf", "infinity")])
async def test_a_result_holding_nan_or_infinity_is_an_error_not_a_silent_null(
    unruly: RuntimeProcess, kind: str, word: str
) -> None:
    async with unruly.environment() as env:
        result = await env.call_tool("not_a_number", {"kind": kind})
    assert result.is_error
    assert result.error_kind is ToolErrorKind.EXECUTION
    assert result.text.startswith(
        f"tool `not_a_number` returned a value with no JSON form: {word} at `score`"
    )
    assert "return None or a string instead" in result.text
    assert result.structured is None


async def test_a_result_with_a_lone_surrogate_is_an_error_result_not_a_500(
    unruly: RuntimeProcess,
) -> None:
    async with unruly.environment() as env:
        result = await env.call_tool("lone_surrogate")
        after = await env.call_tool("ping")
    assert result.error_kind is ToolErrorKind.EXECUTION
    assert "no JSON form: a lone surrogate '\\udcff' in the string at" in result.text
    assert "errors='replace'" in result.text
    assert after.text == "pong"


async def test_a_result_over_the_response_limit_is_an_error_naming_size_and_limit(
    unruly: RuntimeProcess,
) -> None:
    megabytes = MAX_RESPONSE_BYTES // (1 << 20) + 1
    async with unruly.environment(timeout=60) as env:
        big = await env.call_tool("big_text", {"megabytes": megabytes})
        fits = await env.call_tool("big_text", {"megabytes": 1})
    assert big.error_kind is ToolErrorKind.EXECUTION
    assert f"returned a result of {megabytes}.0 MiB of JSON" in big.text
    assert f"over the limit of {MAX_RESPONSE_BYTES >> 20}.0 MiB" in big.text
    assert "write large data to a file" in big.text
    assert not fits.is_error
    assert len(fits.text) == 1 << 20


@pytest.mark.parametrize(
    ("function", "arguments", "fragment"),
    [
        ("function_nan", {}, "no JSON form: NaN at `(the value)`"),
        ("function_surrogate", {}, "a lone surrogate '\\udcff' in the string at `name`"),
        ("function_big", {"megabytes": 65}, "returned a value of 65.0 MiB of JSON, over the limit"),
    ],
)
async def test_function_values_json_cannot_carry_are_function_errors(
    unruly: RuntimeProcess, function: str, arguments: dict[str, Any], fragment: str
) -> None:
    async with unruly.environment(timeout=60) as env:
        with pytest.raises(FunctionError) as info:
            await env.call_function(function, arguments)
    assert info.value.error_type == "execution"
    assert f"function `{function}`" in str(info.value)
    assert fragment in str(info.value)


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"number": float("nan")}, "NaN at `number`"),
        ({"value": [1, float("-inf")]}, "infinity at `value[1]`"),
        ({"value": {"name": "a\udc80"}}, "lone surrogate '\\udc80' in the string at `value.name`"),
        ({"value": {1, 2}}, "Type is not JSON serializable: set"),
    ],
)
async def test_the_sdk_refuses_arguments_json_cannot_carry_before_sending(
    unruly: RuntimeProcess, arguments: dict[str, Any], fragment: str
) -> None:
    async with unruly.environment() as env:
        with pytest.raises(ToolArgumentError) as info:
            await env.call_tool("takes_anything", arguments)
        with pytest.raises(FunctionError) as function:
            await env.call_function("function_nan", arguments)
        fine = await env.call_tool("takes_anything", {"value": None, "number": 1.5})
    assert "arguments for tool `takes_anything` cannot be sent" in str(info.value)
    assert fragment in str(info.value)
    assert info.value.tool == "takes_anything"
    assert function.value.error_type == "invalid_arguments"
    assert fragment in str(function.value)
    assert fine.text == "None 1.5"


@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "takes_anything", "arguments": {"number": NaN}}',
        b'{"name": "takes_anything", "arguments": {"number": -Infinity}}',
        b'{"name": "takes_anything", "arguments": {"number": 1e999}}',
        b'{"name": "takes_anything", "arguments": {"value": "\\ud800"}}',
    ],
)
def test_raw_http_arguments_json_cannot_carry_are_a_clear_400(
    unruly: RuntimeProcess, body: bytes
) -> None:
    answer = httpx.post(f"{unruly.url}/aenv/v1/call", content=body, headers=JSON)
    assert answer.status_code == 400
    data = answer.json()
    assert data["error_type"] == "invalid_arguments"
    assert "have no JSON form" in data["error"]
    assert "send finite numbers and Unicode text" in data["error"]


def _mcp_call(url: str, arguments: bytes) -> dict[str, Any]:
    body = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
        b'{"name": "takes_anything", "arguments": ' + arguments + b"}}"
    )
    # the runtime's first MCP request builds its MCP side (~2 s of CPU): a client waits for it
    answer = httpx.post(url, content=body, headers=MCP, timeout=MCP_TIMEOUT)
    assert answer.status_code == 200
    data = next(line for line in answer.text.splitlines() if line.startswith("data:"))
    return orjson.loads(data[5:])["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (b'{"number": NaN}', "NaN at `number`"),
        (b'{"value": {"x": [Infinity]}}', "infinity at `value.x[0]`"),
    ],
)
def test_mcp_arguments_with_nan_or_infinity_are_invalid_arguments(
    unruly: RuntimeProcess, arguments: bytes, fragment: str
) -> None:
    # MCP's JSON parser lets NaN and Infinity through; the tool must not see them
    result = _mcp_call(unruly.mcp_url, arguments)
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert text.startswith("invalid arguments for tool `takes_anything`: ")
    assert fragment in text


def test_mcp_results_are_checked_like_the_fast_paths(unruly: RuntimeProcess) -> None:
    body = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
        b'{"name": "not_a_number", "arguments": {"kind": "nan"}}}'
    )
    answer = httpx.post(unruly.mcp_url, content=body, headers=MCP, timeout=MCP_TIMEOUT)
    data = next(line for line in answer.text.splitlines() if line.startswith("data:"))
    result = orjson.loads(data[5:])["result"]
    assert result["isError"] is True
    assert "no JSON form: NaN at `score`" in result["content"][0]["text"]


# -- timeouts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [1e300, 86401, True, "10"])
def test_a_request_timeout_that_is_not_a_sane_number_is_a_400(
    unruly: RuntimeProcess, timeout: object
) -> None:
    body = orjson.dumps({"name": "ping", "timeout": timeout})
    answer = httpx.post(f"{unruly.url}/aenv/v1/call", content=body, headers=JSON)
    assert answer.status_code == 400
    assert answer.json()["error_type"] == "bad_request"
    assert "timeout must be a number of seconds up to 86400" in answer.json()["error"]


@pytest.mark.parametrize("value", ["1e300", "inf", "nan", "0", "-3", "soon"])
def test_a_timeout_header_that_is_not_a_sane_number_is_a_400(
    unruly: RuntimeProcess, value: str
) -> None:
    headers = {**JSON, "x-aenv-timeout": value}
    answer = httpx.post(f"{unruly.url}/functions/function_nan", content=b"{}", headers=headers)
    assert answer.status_code == 400
    assert "x-aenv-timeout must be" in answer.json()["error"]


def test_a_request_timeout_at_most_zero_still_counts_as_not_given(unruly: RuntimeProcess) -> None:
    for timeout in (0, -1):
        body = orjson.dumps({"name": "ping", "timeout": timeout})
        answer = httpx.post(f"{unruly.url}/aenv/v1/call", content=body, headers=JSON)
        assert answer.status_code == 200
        assert answer.json()["content"][0]["text"] == "pong"


@pytest.mark.parametrize("timeout", [1e300, float("nan"), 0, -1])
async def test_the_sdk_refuses_a_timeout_it_cannot_send(
    unruly: RuntimeProcess, timeout: float
) -> None:
    async with unruly.environment() as env:
        with pytest.raises(ConfigurationError, match="timeout= must be positive seconds up to"):
            await env.call_tool("ping", timeout=timeout)
        with pytest.raises(ConfigurationError, match="timeout= must be positive seconds up to"):
            await env.call_function("function_nan", timeout=timeout)
