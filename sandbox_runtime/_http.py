"""The instance's HTTP surface as one raw ASGI app: the lean fast path, the seeds' routes, MCP.

No framework sits on the hot path: a request to ``/aenv/v1/call`` is read, parsed with orjson,
dispatched and answered in a handful of function calls (~0.1 ms of server CPU). Everything under
``/mcp`` is handed to FastMCP's streamable-HTTP app, so standard MCP clients keep working. That
app is built, and its lifespan (its session manager) started, by the first MCP request
(:mod:`sandbox_runtime._lazy_mcp`), not with the server: an instance that is only called on the
fast path never imports FastMCP.

Routes (on every port the runtime listens on):

==========================  ====================================================================
``POST /aenv/v1/call``      ``{"name", "arguments", "timeout"?}`` -> ToolResult JSON (fast path)
``GET  /aenv/v1/tools``     ``{"tools": [{name, description, inputSchema}]}``
``GET  /aenv/v1/info``      name, version, tools, functions, reward, pid
``GET  /aenv/v1/ready``     ``{"ready": true}``: the runtime serves (no token, no env code)
``GET  /aenv/v1/preview``   where the preview is: ``{"path", "directory"}``
``GET  /aenv/v1/preview/*`` the preview's files (no token: a capability; :mod:`._preview`)
``GET  /health``            ``{"success", "data": {"status": "healthy"|...}}`` (503 if not)
``POST /task/reward``       ``{"success", "data"}`` or ``{"success": false, "error", ...}``
``POST /functions/NAME``    same envelope
``GET  /functions/list``    the seeds' listing of functions, reward and health
``/mcp``                    MCP streamable HTTP (FastMCP)
==========================  ====================================================================

Every error is :func:`aenv_ray.errors.encode_error`'s envelope (``{"error", "type",
"retryable", ...}``) with the seeds' keys added: ``"success": false`` and ``"error_type"`` (the
function's kind or exception class name; ``unauthorized``, ``forbidden``, ``bad_request``, ...).

An instance an engine creates has a token (:attr:`~aenv_ray.engine.InstanceInfo.token`): every
request on every route must then carry ``Authorization: Bearer TOKEN``, else it is answered 401. The
runtime keeps only the token's SHA-256 (:meth:`RuntimeApp.set_token_sha256`: a Kubernetes pod is
given nothing else) and compares the digest of what a request presents with it in constant time; the
digest itself is not a token. Two routes need no token: ``/aenv/v1/ready``, a readiness probe's (a
kubelet sends no secret), which runs no environment code and says nothing but that the runtime
serves; and the preview's files under ``/aenv/v1/preview/CAPABILITY/``, which a browser opens (it
cannot send the token), read-only, behind a capability only the token's holder learns
(:mod:`sandbox_runtime._preview`). The port is reachable by whatever shares the network with it
(other instances allowed the network, other users of the host); the token is what keeps them out.

A runtime without a token (``aenv run``, :class:`~aenv_ray.testing.RuntimeProcess`) is reachable
by any web page open in a browser on the same machine; it refuses what a browser sends across
sites: a ``Host`` that is not an IP literal or ``localhost`` (DNS rebinding) and an ``Origin``
other than its own (403), a POST whose ``Content-Type`` is not JSON (415: a form or a
``no-cors`` fetch cannot send one). Known-good header values are remembered, so the check is a
few set lookups per request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
from typing import Any
from urllib.parse import parse_qsl

import orjson

from aenv_ray import protocol as p
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    AuthenticationError,
    ConfigurationError,
    FunctionError,
    FunctionErrorKind,
    InstanceBrokenError,
    PermissionDeniedError,
    ProtocolError,
    RequestTooLargeError,
    ToolArgumentError,
    encode_error,
)
from aenv_ray.net import is_local_host, media_type
from aenv_ray.registry import Kind
from sandbox_runtime import _limits
from sandbox_runtime._budget import ArgumentBudget, TooLargeForMemory
from sandbox_runtime._dispatch import CallFailed, Dispatcher
from sandbox_runtime._last_word import Waiting
from sandbox_runtime._lazy_mcp import LazyMCP, Receive, Scope, Send
from sandbox_runtime._preview import PreviewRoute
from sandbox_runtime._runner import WorkerStuckError

__all__ = ["RuntimeApp"]

log = logging.getLogger("sandbox_runtime.http")


MAX_BODY = p.MAX_REQUEST_BYTES
_JSON_HEADERS = [(b"content-type", b"application/json")]
_KNOWN_MAX = 64  # good Host / Content-Type values remembered


class BadArguments(ValueError):
    """A body that is not JSON because of what it holds (NaN, infinity, a lone surrogate):
    answered 400 ``invalid_arguments``, not ``bad_request``."""


class BodyTooLarge(ValueError):
    """A body over ``MAX_BODY``, or one the instance has not the memory to parse: answered
    413 with :class:`~aenv_ray.errors.RequestTooLargeError`."""


def _declared_length(scope: Scope) -> int:
    """The body's ``Content-Length`` (``MAX_BODY`` when it declares none: chunked)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return MAX_BODY
    return 0 if scope.get("method") in ("GET", "HEAD") else MAX_BODY


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyTooLarge(
                f"the request's body is over {MAX_BODY >> 20} MiB, the most a request may "
                "carry: pass large data as a file in the workspace (write it there with a "
                "tool, or give the instance a datasource) instead of as an argument"
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _no_memory_for(size: int) -> str:
    limits = _limits.installed()
    limit = f" (its memory limit is {limits.memory >> 20} MiB)" if limits and limits.memory else ""
    return (
        f"the instance has not the memory to read arguments of {size / (1 << 20):.1f} MiB now"
        f"{limit}: pass large data as a file in the workspace, or give the environment more "
        "memory (deployConfig.memory)"
    )


async def _send_json(send: Send, status: int, payload: Any) -> None:
    body = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


def _parse_json(body: bytes) -> Any:
    if not body.strip():
        return {}
    try:
        return orjson.loads(body)
    except MemoryError:
        raise BodyTooLarge(_no_memory_for(len(body))) from None
    except orjson.JSONDecodeError as exc:
        text = str(exc)
        if "Not enough memory" in text:
            raise BodyTooLarge(_no_memory_for(len(body))) from None
        at = body[exc.pos : exc.pos + 9].lstrip(b"-")
        if "surrogate" in text or "infinity" in text or at.startswith((b"NaN", b"Infinity")):
            raise BadArguments(
                f"the body is not JSON: {text}. NaN, infinity and numbers beyond 1.8e308 have "
                "no JSON form, nor lone surrogates (\\ud800-\\udfff without their pair): "
                "send finite numbers and Unicode text"
            ) from None
        raise


def _error_body(exc: AEnvError, seeds_kind: str | None = None) -> dict[str, Any]:
    """The answer to a failed request: the one envelope, plus the seeds' ``success`` and
    ``error_type`` (a :class:`FunctionError` carries its own ``error_type``)."""
    body = {"success": False, **encode_error(exc)}
    if seeds_kind is not None and "error_type" not in body:
        body["error_type"] = seeds_kind
    return body


def _forbidden(error: str) -> dict[str, Any]:
    return _error_body(PermissionDeniedError(error), "forbidden")


class RuntimeApp:
    """Route requests to the dispatcher, or to the MCP app for ``/mcp``."""

    def __init__(
        self, dispatcher: Dispatcher, *, mcp: LazyMCP | None = None, token: str | None = None
    ) -> None:
        self.dispatcher = dispatcher
        self.budget = ArgumentBudget()
        """The bytes of arguments read at once (a share of the instance's memory)."""
        self.waiting = Waiting()
        """Requests not answered yet: a runtime that must end answers them (why)."""
        self._token_sha256: bytes | None = None  # the digest of the token (None: no token)
        self._good_hosts: set[bytes] = set()
        self._good_types: set[bytes] = {b"application/json"}
        self.set_token(token)
        self.mcp = mcp
        """The MCP app, built by the first MCP request (None: MCP is off)."""
        registry = dispatcher.registry
        self._tools_payload = orjson.dumps(
            {"tools": [entry.describe() for entry in registry.tools.values()]}
        )
        ref = EnvRef.parse(dispatcher.env_ref)
        self._info = {
            "name": ref.name,
            "version": ref.version or "",
            "ref": dispatcher.env_ref,
            "tools": sorted(registry.tools),
            "functions": sorted(registry.functions),
            "reward": registry.reward.name if registry.reward else None,
            "health": registry.health.name if registry.health else None,
            "timeouts": _declared_timeouts(registry),
        }
        self._info_payload = b""
        self._info_pid = 0
        self.preview = PreviewRoute()

    def _tools_bytes(self) -> bytes:
        """``GET /aenv/v1/tools``: the registry's tool listing when it set one
        (:meth:`~aenv_ray.registry.DefinitionRegistry.set_tool_listing`: a tool set that follows
        the environment's state), else the tools registered at load (serialized once)."""
        listing = self.dispatcher.registry.tool_listing
        if listing is None:
            return self._tools_payload
        try:
            tools = listing()
            return self._tools_payload if tools is None else orjson.dumps({"tools": tools})
        except Exception:  # the environment's code: its listing failing lists what is registered
            log.exception("the environment's tool listing failed; listing the registered tools")
            return self._tools_payload

    def set_token(self, token: str | None) -> None:
        """Require ``Authorization: Bearer token`` on every request (None: require nothing).
        Only the token's SHA-256 is kept."""
        self._token_sha256 = hashlib.sha256(token.encode()).digest() if token else None

    def set_token_sha256(self, digest: str | None) -> None:
        """Require ``Authorization: Bearer T`` where ``sha256(T)`` is ``digest`` (64 hex digits;
        None: require nothing): the runtime is given the digest, never the token.

            >>> app = RuntimeApp.__new__(RuntimeApp)
            >>> app.set_token_sha256(hashlib.sha256(b"s3cret").hexdigest())
            >>> [app._is_authorized({"headers": [(b"authorization", b"Bearer " + t)]})
            ...  for t in (b"s3cret", hashlib.sha256(b"s3cret").hexdigest().encode())]
            [True, False]
        """
        if digest is None:
            self._token_sha256 = None
            return
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raw = b""
        if len(raw) != hashlib.sha256().digest_size:
            raise ConfigurationError(
                f"a token digest is the SHA-256 of the token in 64 hex digits, got {digest!r}"
            )
        self._token_sha256 = raw

    def _is_authorized(self, scope: Scope) -> bool:
        expected = self._token_sha256
        if expected is None:
            return True
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                scheme, _, presented = value.partition(b" ")
                given = hashlib.sha256(presented).digest()
                return hmac.compare_digest(given, expected) and scheme == b"Bearer"
        return False

    def _cross_site(self, scope: Scope) -> tuple[int, dict[str, Any]] | None:
        """Why a request to a runtime without a token looks sent by a web page of another site
        (status and answer), or None."""
        host = origin = kind = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value
            elif key == b"origin":
                origin = value
            elif key == b"content-type":
                kind = value
        if host is not None and host not in self._good_hosts:
            if not is_local_host(host.decode("latin-1")):
                return 403, _forbidden(
                    f"this runtime answers requests to an IP address or localhost only, not to "
                    f"Host `{host.decode('latin-1')}` (a page's DNS name pointing here, DNS "
                    "rebinding); use http://127.0.0.1:PORT, or run it with a token"
                )
            if len(self._good_hosts) < _KNOWN_MAX:
                self._good_hosts.add(host)
        if origin is not None and (
            host is None or origin.partition(b"://")[2].lower() != host.lower()
        ):
            return 403, _forbidden(
                f"cross-site request refused: Origin `{origin.decode('latin-1')}` is not this "
                "runtime; a web page may not call an environment's tools"
            )
        if scope["method"] == "POST" and (kind is None or kind not in self._good_types):
            if kind is None or media_type(kind.decode("latin-1")) != "application/json":
                got = "none" if kind is None else f"`{kind.decode('latin-1')}`"
                return 415, _error_body(
                    ConfigurationError(
                        f"a POST body must be JSON with `Content-Type: application/json` "
                        f"(got {got})"
                    ),
                    "unsupported_media_type",
                )
            if len(self._good_types) < _KNOWN_MAX:
                self._good_types.add(kind)
        return None

    def _info_bytes(self) -> bytes:
        # per process: a template builds this app once and the instances it forks serve it
        if self._info_pid != os.getpid():
            self._info_pid = os.getpid()
            limits = _limits.installed()
            self._info_payload = orjson.dumps(
                {
                    **self._info,
                    "pid": self._info_pid,
                    "limits": limits.describe() if limits is not None else None,
                }
            )
        return self._info_payload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send, self.mcp)
            return
        if kind != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path == p.READY_PATH:
            await _send_raw(send, b'{"ready":true}')
            return
        if path.startswith(p.PREVIEW_PREFIX):  # a browser's: the capability is the authority
            await self.preview.serve(scope, send)
            return
        if not self._is_authorized(scope):
            no_token = AuthenticationError(
                "this instance's runtime needs its token: send the header "
                "`Authorization: Bearer TOKEN` (InstanceInfo.token, or InstanceInfo.headers)"
            )
            await _send_json(send, 401, _error_body(no_token, "unauthorized"))
            return
        if self._token_sha256 is None and (refused := self._cross_site(scope)) is not None:
            await _send_json(send, *refused)
            return
        send, answered = self.waiting.track(scope, send)
        try:
            mcp = path == p.MCP_PATH or path.startswith(p.MCP_PATH + "/")
            async with self.budget.admit(0 if mcp else _declared_length(scope)):
                await self._route(scope, receive, send, path, method)
        except ConnectionAbortedError:
            return
        except WorkerStuckError as exc:
            await _send_json(
                send, 503, _error_body(InstanceBrokenError(str(exc)), "instance_broken")
            )
        except (BodyTooLarge, TooLargeForMemory) as exc:
            await _send_json(send, 413, _error_body(RequestTooLargeError(str(exc)), "too_large"))
        except BadArguments as exc:
            message = f"bad request: {exc}"
            bad: AEnvError = (
                ToolArgumentError(message)
                if path == p.FAST_CALL_PATH
                else FunctionError(
                    message,
                    kind=FunctionErrorKind.INVALID_ARGUMENTS,
                    error_type=FunctionErrorKind.INVALID_ARGUMENTS.value,
                )
            )
            await _send_json(send, 400, _error_body(bad, "invalid_arguments"))
        except (ValueError, orjson.JSONDecodeError) as exc:
            unreadable = ProtocolError(f"bad request: {exc}")
            await _send_json(send, 400, _error_body(unreadable, "bad_request"))
        finally:
            answered()

    async def _route(
        self, scope: Scope, receive: Receive, send: Send, path: str, method: str
    ) -> None:
        if path == p.FAST_CALL_PATH and method == "POST":
            await self._fast_call(receive, send)
        elif path == p.MCP_PATH or path.startswith(p.MCP_PATH + "/"):
            if self.mcp is None:
                off = ConfigurationError("MCP is not enabled on this runtime")
                await _send_json(send, 404, _error_body(off))
            else:
                try:
                    mcp_app = await self.mcp.app()
                except Exception as exc:  # the next MCP request tries again
                    log.exception("the MCP app did not start")
                    failed = ConfigurationError(
                        f"this runtime's MCP endpoint did not start ({type(exc).__name__}: "
                        f"{exc}); the fast path ({p.FAST_CALL_PATH}) still serves the tools"
                    )
                    await _send_json(send, 500, _error_body(failed))
                    return
                await mcp_app(scope, receive, send)
        elif path == p.FAST_TOOLS_PATH and method == "GET":
            await _send_raw(send, self._tools_bytes())
        elif path == p.FAST_INFO_PATH and method == "GET":
            await _send_raw(send, self._info_bytes())
        elif path == p.PREVIEW_PATH and method == "GET":
            await _send_json(send, 200, self.preview.describe())
        elif path == p.HEALTH_PATH and method in ("GET", "POST"):
            await self._health(scope, receive, send)
        elif path == p.REWARD_PATH and method == "POST":
            await self._function(Kind.REWARD, None, scope, receive, send)
        elif path == p.FUNCTIONS_LIST_PATH and method == "GET":
            await _send_json(send, 200, {"success": True, "data": self._list_functions()})
        elif path.startswith(p.FUNCTIONS_PREFIX) and method == "POST":
            name = path[len(p.FUNCTIONS_PREFIX) :]
            await self._function(Kind.FUNCTION, name, scope, receive, send)
        else:
            unknown = ProtocolError(f"no route {method} {path}")
            await _send_json(send, 404, _error_body(unknown))

    async def _fast_call(self, receive: Receive, send: Send) -> None:
        request = _parse_json(await _read_body(receive))
        if not isinstance(request, dict) or not isinstance(request.get("name"), str):
            raise ValueError('expected {"name": str, "arguments": {...}}')
        timeout = request.get("timeout")
        if timeout is not None and (
            not isinstance(timeout, int | float)
            or isinstance(timeout, bool)
            or timeout > p.MAX_TIMEOUT
        ):
            raise ValueError(
                f"timeout must be a number of seconds up to {p.MAX_TIMEOUT:g}, got {timeout!r}"
            )
        name = request["name"]
        result = await self.dispatcher.call_tool(name, request.get("arguments"), timeout=timeout)
        try:
            body = orjson.dumps(result.to_wire())
        except TypeError:  # a lone surrogate: the checked encoding says so
            body = b""
        if not body or len(body) > p.MAX_RESPONSE_BYTES or b"null" in body:
            _, body = self.dispatcher.encode_tool_result(name, result)  # the rare, checked way
        await _send_raw(send, body)

    async def _function(
        self, kind: Kind, name: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        arguments = _parse_json(await _read_body(receive))
        try:
            data = await self.dispatcher.call_function(
                kind, name, arguments, timeout=_timeout_header(scope)
            )
            entry = self.dispatcher.find_function(kind, name)
            label = f"{kind.value} `{entry.name if entry else name}`"
            envelope = {"success": True, "data": data}
            body = self.dispatcher.encode_value(
                label, envelope, function=entry.name if entry else None
            )
        except CallFailed as failed:
            await _send_json(send, failed.status, _error_body(failed.error, "instance_broken"))
            return
        await _send_raw(send, body)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        stuck = self.dispatcher.runner.stuck_in
        if stuck is not None:
            await _send_json(
                send,
                503,
                {
                    "success": True,
                    "data": {"status": "unhealthy", "reason": f"stuck in `{stuck}`"},
                },
            )
            return
        if self.dispatcher.registry.health is None:
            await _send_json(send, 200, {"success": True, "data": {"status": "healthy"}})
            return
        health = self.dispatcher.registry.health
        if scope["method"] == "POST":
            arguments = _parse_json(await _read_body(receive))
        else:  # query parameters the health check takes; others (cache busters) are ignored
            accepted = set(health.signature.input_schema.get("properties", {}))
            query = parse_qsl(scope.get("query_string", b"").decode())
            arguments = {key: value for key, value in query if key in accepted}
        try:
            value = await self.dispatcher.call_function(
                Kind.HEALTH, None, arguments, timeout=_timeout_header(scope)
            )
            if isinstance(value, bool):
                data: dict[str, Any] = {"status": "healthy" if value else "unhealthy"}
            elif isinstance(value, dict):
                data = {"status": "healthy", **value}
            else:
                data = {"status": "healthy", "detail": value}
            healthy = str(data.get("status")).lower() in ("healthy", "success", "ok")
            label = f"health `{health.name}`"
            envelope = {"success": True, "data": data}
            body = self.dispatcher.encode_value(label, envelope, function=health.name)
        except CallFailed as failed:
            await _send_json(send, 503, _error_body(failed.error, "instance_broken"))
            return
        await _send_raw(send, body, 200 if healthy else 503)

    def _list_functions(self) -> dict[str, Any]:
        registry = self.dispatcher.registry

        def entry(item: Any, endpoint: str, method: str = "POST") -> dict[str, Any]:
            return {
                "name": item.name,
                "endpoint": endpoint,
                "method": method,
                "description": item.description,
                "parameters": item.signature.input_schema,
                "is_async": item.is_async,
            }

        functions = [entry(f, p.FUNCTIONS_PREFIX + f.name) for f in registry.functions.values()]
        reward = [entry(registry.reward, p.REWARD_PATH)] if registry.reward else []
        health = [entry(registry.health, p.HEALTH_PATH, "GET")] if registry.health else []
        return {
            "total": len(functions) + len(reward) + len(health),
            "functions": functions,
            "reward": reward,
            "health": health,
        }


def _declared_timeouts(registry: Any) -> dict[str, Any]:
    """What each tool and function declares (``timeout=``), for clients to size their waits."""
    return {
        "tools": {n: e.timeout for n, e in registry.tools.items() if e.timeout is not None},
        "functions": {n: e.timeout for n, e in registry.functions.items() if e.timeout is not None},
        "reward": registry.reward.timeout if registry.reward else None,
        "health": registry.health.timeout if registry.health else None,
    }


def _timeout_header(scope: Scope) -> float | None:
    """Seconds from ``X-AEnv-Timeout`` (the routes whose body is the arguments themselves)."""
    for key, value in scope.get("headers", ()):
        if key == p.TIMEOUT_HEADER:
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"{p.TIMEOUT_HEADER.decode()} must be seconds") from None
            if not (seconds > 0 and math.isfinite(seconds) and seconds <= p.MAX_TIMEOUT):
                raise ValueError(
                    f"{p.TIMEOUT_HEADER.decode()} must be positive seconds up to "
                    f"{p.MAX_TIMEOUT:g}, got {value.decode('latin-1')!r}"
                )
            return seconds
    return None


async def _send_raw(send: Send, body: bytes, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send, mcp: LazyMCP | None) -> None:
    """The server's lifespan: nothing to start; at shutdown, stop the MCP app if it started."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if mcp is not None:
                await mcp.shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
