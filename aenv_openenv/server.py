"""OpenEnv's HTTP and WebSocket endpoints over aenv-ray instances (our own server; OpenEnv's
is never imported).

==================================  ===========================================================
``GET /health``                     ``{"status": "healthy", "sessions": {"active_sessions",
                                    "max_sessions"}}``
``GET /metadata``                   the environment's name, description and version
``GET /schema``                     the JSON schemas of actions, observations and state
``WS /ws``                          a session: ``reset``/``step``/``state``/``close``/``mcp``
                                    messages, one answer each (``?session_id=`` attaches to a
                                    session made with ``openenv/session/create``)
``POST /mcp``                       JSON-RPC: ``openenv/session/create``,
                                    ``openenv/session/close``, ``tools/list``, ``tools/call``
                                    (with ``session_id``, else on an instance of its own)
``WS /mcp``                         JSON-RPC on a session of the connection's own
``POST /reset``, ``POST /step``     OpenEnv's stateless pair: each on an instance of its own,
``GET /state``                      released after it
==================================  ===========================================================

Every session holds one instance (:mod:`aenv_openenv.session`); at most
``max_concurrent_envs`` exist at once, counting the stateless requests' and MCP's: one more is
refused (``CAPACITY_REACHED`` on a WebSocket, JSON-RPC error ``-32000`` on ``/mcp``, HTTP 503
on ``/reset`` and ``/step``) and nothing is created. A session ends, and its instance is
released, when its client sends ``close``, disconnects, or (made over ``/mcp``) sends
``openenv/session/close``; :meth:`OpenEnvServer.aclose` releases what is left.

**Idle sessions** (``idle_timeout``, ``aenv openenv serve --idle-timeout``): a session no
message has used for that long (none in progress) is closed by the server's reaper, its
instance released and its slot freed. Its client is told when it comes back, never left
waiting: on ``/ws`` its next message is answered with an error frame ``SESSION_EXPIRED`` (the
connection stays open: ``reset`` there starts a new session), on ``/mcp`` with JSON-RPC error
``-32000`` whose ``data.code`` is ``SESSION_EXPIRED``, and ``/ws?session_id=`` of it is refused
the same way.

May import: ``aenv_ray``, starlette.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from aenv_openenv.session import REWARD_ACTION, ActionError, ToolSession
from aenv_ray import Environment
from aenv_ray.engine import SandboxEngine, new_engine
from aenv_ray.errors import AEnvError, CapacityError

__all__ = ["OpenEnvServer", "create_app", "require_token"]

log = logging.getLogger("aenv_openenv")

# JSON-RPC error codes (the JSON-RPC 2.0 specification's, as OpenEnv answers them)
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
INTERNAL_ERROR, SERVER_ERROR = -32603, -32000

_ACTION_SCHEMA: dict[str, Any] = {
    "title": "AenvRayAction",
    "description": (
        'A tool call {"tool": NAME, "arguments": {...}}; {"tool": "reward", "arguments": '
        '{...}} ends the episode with its reward; {"type": "list_tools"} lists the tools. '
        'OpenEnv\'s {"type": "call_tool", "tool_name": NAME, "arguments": {...}} is accepted.'
    ),
    "type": "object",
    "properties": {
        "tool": {"type": "string"},
        "tool_name": {"type": "string"},
        "type": {"type": "string", "enum": ["call_tool", "list_tools"]},
        "arguments": {"type": "object"},
    },
}
_OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "AenvRayObservation",
    "type": "object",
    "properties": {
        "tool": {"type": "string"},
        "content": {"type": "array", "items": {"type": "object"}},
        "text": {"type": "string"},
        "is_error": {"type": "boolean"},
        "error_kind": {"type": "string"},
        "structured": {},
        "tools": {"type": "array", "items": {"type": "object"}},
        "value": {},
    },
}
_STATE_SCHEMA: dict[str, Any] = {
    "title": "AenvRayState",
    "type": "object",
    "properties": {
        "episode_id": {"type": ["string", "null"]},
        "step_count": {"type": "integer", "minimum": 0},
        "done": {"type": "boolean"},
        "env": {"type": "string"},
        "instance_id": {"type": ["string", "null"]},
    },
}


SESSION_EXPIRED = "SESSION_EXPIRED"
"""The error code of a message to a session the idle reaper closed."""
_EXPIRED_KEPT = 10_000  # reaped sessions remembered, to tell their clients (oldest dropped)


def _error_frame(message: str, code: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def _rpc_error(code: int, message: str, request_id: Any, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _rpc_result(result: Any, request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class OpenEnvServer:
    """The OpenEnv endpoints for the environment ``env_ref`` (any aenv-ray environment, the
    built-ins included), each session on an instance of its own made by ``engine`` (a name:
    ``"local"``, ``"daemon"``, ``"kubernetes"``, whose engine the server makes on first use and
    closes in :meth:`aclose`; an engine; or ``None``, the SDK's default).

    ``make_environment`` replaces how an instance is made (it must return a new, not yet
    initialized :class:`~aenv_ray.Environment`); its default is ``Environment(env_ref,
    engine=engine)``. ``idle_timeout`` (seconds; ``None``: never) closes a session no message
    has used for that long (see the module).

        >>> server = OpenEnvServer("mini-terminal@1.0.0", max_concurrent_envs=2)
        >>> server.capacity()
        {'active_sessions': 0, 'max_sessions': 2}
    """

    def __init__(
        self,
        env_ref: str,
        *,
        engine: SandboxEngine | str | None = None,
        max_concurrent_envs: int = 1,
        make_environment: Callable[[], Environment] | None = None,
        description: str = "",
        idle_timeout: float | None = None,
    ) -> None:
        if max_concurrent_envs < 1:
            raise ValueError(f"max_concurrent_envs must be at least 1, got {max_concurrent_envs}")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(f"idle_timeout is a positive number of seconds, got {idle_timeout}")
        self.idle_timeout = idle_timeout
        self._expired: OrderedDict[str, str] = OrderedDict()  # reaped session -> what to say
        self._reaper: asyncio.Task[None] | None = None
        self.env_ref = env_ref
        self.max_concurrent_envs = max_concurrent_envs
        self.description = description or f"aenv-ray environment {env_ref}"
        self._engine = engine
        self._own_engine: SandboxEngine | None = None  # made from the engine's name, closed here
        self._make = make_environment or self._new_environment
        self._sessions: dict[str, ToolSession] = {}
        self._slots = 0  # sessions open or starting (a slot is taken before the instance)
        self._attached: set[str] = set()  # sessions a /ws connection is attached to
        self._lock = asyncio.Lock()

    def _new_environment(self) -> Environment:
        engine = self._engine
        if isinstance(engine, str):  # an engine of this server's own: closed with it
            if self._own_engine is None:
                self._own_engine = new_engine(engine)
            engine = self._own_engine
        return Environment(self.env_ref, engine=engine)

    def capacity(self) -> dict[str, int]:
        """How many sessions are open (or starting), and the limit."""
        return {"active_sessions": self._slots, "max_sessions": self.max_concurrent_envs}

    # -- sessions -----------------------------------------------------------------------------

    async def open_session(self) -> ToolSession:
        """A new session on a new instance; :class:`~aenv_ray.errors.CapacityError` when
        ``max_concurrent_envs`` are open already (nothing is created then)."""
        async with self._lock:
            if self._slots >= self.max_concurrent_envs:
                raise CapacityError(
                    f"this OpenEnv server already serves {self._slots} sessions, its "
                    f"max_concurrent_envs ({self.max_concurrent_envs}): close one (send `close`, "
                    "or openenv/session/close) or start the server with a higher limit",
                    env_name=self.env_ref,
                )
            self._slots += 1
        session = ToolSession(self._make, self.env_ref)
        try:
            await session.start()
        except BaseException:
            async with self._lock:
                self._slots -= 1
            raise
        session.last_active = time.monotonic()  # idle from now: its start took what it took
        async with self._lock:
            self._sessions[session.id] = session
        if self.idle_timeout is not None and (self._reaper is None or self._reaper.done()):
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return session

    # -- the idle reaper ----------------------------------------------------------------------

    def expired_message(self, session_id: str) -> str | None:
        """What a client of ``session_id`` is told, if the reaper closed it."""
        return self._expired.get(session_id)

    async def _reap(self) -> None:
        """Close each session idle for ``idle_timeout``, sleeping until the next one can be
        (a deadline only moves later: a session's use starts its idle time again)."""
        assert self.idle_timeout is not None
        timeout = self.idle_timeout
        while True:
            now = time.monotonic()
            due: list[ToolSession] = []
            next_at = now + timeout
            for session in list(self._sessions.values()):
                if session.busy:
                    continue
                at = session.last_active + timeout
                if at <= now:
                    session.expired = True  # no await since the check: no message began
                    due.append(session)
                else:
                    next_at = min(next_at, at)
            for session in due:
                self._expired[session.id] = (
                    f"session {session.id} was idle for more than {timeout:g} s and was "
                    "closed: its instance was released, the episode's state is gone. Start a "
                    "new session (on /ws: send reset; on /mcp: openenv/session/create)"
                )
                while len(self._expired) > _EXPIRED_KEPT:
                    self._expired.popitem(last=False)
                log.warning("OpenEnv session %s idle for %g s: closed", session.id, timeout)
                with contextlib.suppress(AEnvError):
                    await asyncio.shield(self.close_session(session))
            if not due:
                await asyncio.sleep(next_at - now)

    async def close_session(self, session: ToolSession) -> None:
        """Release the session's instance and its slot (idempotent)."""
        async with self._lock:
            known = self._sessions.pop(session.id, None) is not None
            self._attached.discard(session.id)
        try:
            await session.close()
        finally:
            if known:
                async with self._lock:
                    self._slots -= 1

    @contextlib.asynccontextmanager
    async def _transient(self) -> AsyncIterator[ToolSession]:
        session = await self.open_session()
        try:
            async with session.using():  # busy for its one request: never reaped meanwhile
                yield session
        finally:
            await asyncio.shield(self.close_session(session))

    async def aclose(self) -> None:
        """Release every session's instance (the server's shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for session in list(self._sessions.values()):
            with contextlib.suppress(AEnvError):
                await self.close_session(session)
        engine, self._own_engine = self._own_engine, None
        if engine is not None:
            await engine.aclose()

    # -- the app ------------------------------------------------------------------------------

    def app(self) -> Starlette:
        """The ASGI application (serve it with uvicorn); its shutdown releases every session."""

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            try:
                yield
            finally:
                await self.aclose()

        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/metadata", self._metadata),
                Route("/schema", self._schema),
                Route("/reset", self._http_reset, methods=["POST"]),
                Route("/step", self._http_step, methods=["POST"]),
                Route("/state", self._http_state),
                Route("/mcp", self._http_mcp, methods=["POST"]),
                WebSocketRoute("/ws", self._ws),
                WebSocketRoute("/mcp", self._ws_mcp),
            ],
            lifespan=lifespan,
        )

    async def _health(self, _request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy", "sessions": self.capacity()})

    async def _metadata(self, _request: Request) -> JSONResponse:
        name, _, version = self.env_ref.partition("@")
        return JSONResponse(
            {
                "name": name,
                "description": self.description,
                "version": version or None,
                "readme_content": None,
                "author": None,
                "documentation_url": None,
            }
        )

    async def _schema(self, _request: Request) -> JSONResponse:
        return JSONResponse(
            {"action": _ACTION_SCHEMA, "observation": _OBSERVATION_SCHEMA, "state": _STATE_SCHEMA}
        )

    async def _http_reset(self, request: Request) -> JSONResponse:
        body = await _json_body(request)
        if not isinstance(body, dict):
            return JSONResponse({"detail": "the body is a JSON object"}, status_code=422)
        try:
            async with self._transient() as session:
                return JSONResponse(await session.reset(body))
        except CapacityError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=503)
        except AEnvError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=500)

    async def _http_step(self, request: Request) -> JSONResponse:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("action"), dict):
            return JSONResponse({"detail": 'the body is {"action": {...}}'}, status_code=422)
        try:
            async with self._transient() as session:
                await session.reset({})
                return JSONResponse(await session.step(body["action"]))
        except ActionError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        except CapacityError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=503)
        except AEnvError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=500)

    async def _http_state(self, _request: Request) -> JSONResponse:
        return JSONResponse(
            {"episode_id": None, "step_count": 0, "done": False, "env": self.env_ref}
        )

    # -- /ws ----------------------------------------------------------------------------------

    async def _ws(self, websocket: WebSocket) -> None:
        await websocket.accept()
        session: ToolSession | None = None
        owned = False
        try:
            wanted = websocket.query_params.get("session_id")
            if wanted:
                async with self._lock:
                    session = self._sessions.get(wanted)
                    if session is None or wanted in self._attached:
                        expired = self.expired_message(wanted)
                        why = "unknown" if session is None else "already attached"
                        await websocket.send_text(
                            _error_frame(expired, SESSION_EXPIRED)
                            if expired and session is None
                            else _error_frame(f"session {wanted} is {why}", "SESSION_ERROR")
                        )
                        session = None
                        return
                    self._attached.add(wanted)
            else:
                try:
                    session = await self.open_session()
                except CapacityError as exc:
                    await websocket.send_text(
                        _error_frame(str(exc), "CAPACITY_REACHED", **self.capacity())
                    )
                    return
                except AEnvError as exc:
                    await websocket.send_text(_error_frame(str(exc), "FACTORY_ERROR"))
                    return
                owned = True
            while True:
                raw = await websocket.receive_text()
                if session.expired:  # the reaper closed it: say so; a reset starts anew
                    kind = _message_type(raw)
                    if kind == "close":
                        break
                    refusal = None
                    if kind != "reset":
                        said = self.expired_message(session.id) or f"session {session.id} expired"
                        refusal = _error_frame(said, SESSION_EXPIRED)
                    else:
                        try:
                            fresh = await self.open_session()
                        except CapacityError as exc:
                            refusal = _error_frame(str(exc), "CAPACITY_REACHED", **self.capacity())
                        except AEnvError as exc:
                            refusal = _error_frame(str(exc), "FACTORY_ERROR")
                    if refusal is not None:
                        await websocket.send_text(refusal)
                        continue
                    if not owned:
                        async with self._lock:
                            self._attached.discard(session.id)
                    session, owned = fresh, True
                answer = await self._ws_message(session, raw)
                if answer is None:
                    break
                await websocket.send_text(answer)
        except WebSocketDisconnect:
            pass
        finally:
            if session is not None:
                if owned:
                    await asyncio.shield(self.close_session(session))
                else:
                    async with self._lock:
                        self._attached.discard(session.id)
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close()

    async def _ws_message(self, session: ToolSession, raw: str) -> str | None:
        """The answer to one message (``None``: the client closed the session)."""
        try:
            message = json.loads(raw)
        except json.JSONDecodeError as exc:
            return _error_frame(f"Invalid JSON: {exc}", "INVALID_JSON")
        kind = message.get("type", "") if isinstance(message, dict) else ""
        data = message.get("data", {}) if isinstance(message, dict) else {}
        async with session.using():
            return await self._ws_answer(session, kind, data)

    async def _ws_answer(self, session: ToolSession, kind: str, data: Any) -> str | None:
        try:
            if kind == "reset":
                payload = await session.reset(data if isinstance(data, dict) else {})
                return json.dumps({"type": "observation", "data": payload})
            if kind == "step":
                if not isinstance(data, dict):
                    raise ActionError("a step's data is the action, a JSON object")
                payload = await session.step(data)
                return json.dumps({"type": "observation", "data": payload})
            if kind == "state":
                return json.dumps({"type": "state", "data": session.state()})
            if kind == "close":
                return None
            if kind == "mcp":
                rpc = await self._rpc(data, session)
                return json.dumps({"type": "mcp", "data": rpc})
            return _error_frame(f"Unknown message type: {kind!r}", "UNKNOWN_TYPE")
        except ActionError as exc:
            return _error_frame(str(exc), "VALIDATION_ERROR")
        except AEnvError as exc:
            log.warning("OpenEnv session %s: %s", session.id, exc)
            return _error_frame(f"{type(exc).__name__}: {exc}", "EXECUTION_ERROR")

    # -- /mcp ---------------------------------------------------------------------------------

    async def _http_mcp(self, request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse(_rpc_error(PARSE_ERROR, "Parse error", None))
        return JSONResponse(await self._rpc(body, None))

    async def _ws_mcp(self, websocket: WebSocket) -> None:
        await websocket.accept()
        session: ToolSession | None = None
        try:
            try:
                session = await self.open_session()
            except CapacityError as exc:
                await websocket.send_text(
                    json.dumps(_rpc_error(SERVER_ERROR, str(exc), None, self.capacity()))
                )
                return
            while True:
                raw = await websocket.receive_text()
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    await websocket.send_text(
                        json.dumps(_rpc_error(PARSE_ERROR, "Parse error", None))
                    )
                    continue
                await websocket.send_text(json.dumps(await self._rpc(body, session)))
        except WebSocketDisconnect:
            pass
        finally:
            if session is not None:
                await asyncio.shield(self.close_session(session))
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close()

    async def _rpc(self, body: Any, bound: ToolSession | None) -> dict[str, Any]:
        """One JSON-RPC request: on ``bound`` (a WebSocket's session), else on the session its
        ``session_id`` names, else on an instance of its own."""
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or "method" not in body:
            return _rpc_error(INVALID_REQUEST, "Invalid Request", None)
        request_id, method = body.get("id"), body["method"]
        params = body.get("params", {})
        if not isinstance(params, dict):
            return _rpc_error(INVALID_PARAMS, "Params must be an object", request_id)
        try:
            if method == "openenv/session/create":
                if bound is not None:
                    return _rpc_result({"session_id": bound.id}, request_id)
                session = await self.open_session()
                return _rpc_result({"session_id": session.id}, request_id)
            if method == "openenv/session/close":
                return await self._rpc_close(params, bound, request_id)
            if method not in ("tools/list", "tools/call"):
                return _rpc_error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)
            wanted = params.get("session_id")
            if bound is not None:
                return await self._rpc_tools(method, params, bound, request_id)
            if wanted:
                target = self._sessions.get(str(wanted))
                if target is None:
                    expired = self.expired_message(str(wanted))
                    if expired:
                        return _rpc_error(
                            SERVER_ERROR, expired, request_id, {"code": SESSION_EXPIRED}
                        )
                    return _rpc_error(INVALID_PARAMS, f"Unknown session_id: {wanted}", request_id)
                return await self._rpc_tools(method, params, target, request_id)
            async with self._transient() as session:
                return await self._rpc_tools(method, params, session, request_id)
        except CapacityError as exc:
            return _rpc_error(SERVER_ERROR, str(exc), request_id, self.capacity())
        except AEnvError as exc:
            return _rpc_error(INTERNAL_ERROR, f"{type(exc).__name__}: {exc}", request_id)

    async def _rpc_close(
        self, params: dict[str, Any], bound: ToolSession | None, request_id: Any
    ) -> dict[str, Any]:
        wanted = params.get("session_id")
        if not wanted:
            return _rpc_error(
                INVALID_PARAMS, "Invalid params - 'session_id' is required", request_id
            )
        if bound is not None and wanted == bound.id:
            return _rpc_error(
                INVALID_REQUEST, "Cannot close active WebSocket-managed session", request_id
            )
        target = self._sessions.get(str(wanted))
        if target is None:
            if self.expired_message(str(wanted)):  # closed already, by the reaper
                return _rpc_result({"session_id": wanted, "closed": True}, request_id)
            return _rpc_error(INVALID_PARAMS, f"Unknown session_id: {wanted}", request_id)
        await asyncio.shield(self.close_session(target))
        return _rpc_result({"session_id": wanted, "closed": True}, request_id)

    async def _rpc_tools(
        self, method: str, params: dict[str, Any], session: ToolSession, request_id: Any
    ) -> dict[str, Any]:
        if session.expired:
            said = self.expired_message(session.id) or f"session {session.id} expired"
            return _rpc_error(SERVER_ERROR, said, request_id, {"code": SESSION_EXPIRED})
        async with session.using():
            return await self._rpc_tools_of(method, params, session, request_id)

    async def _rpc_tools_of(
        self, method: str, params: dict[str, Any], session: ToolSession, request_id: Any
    ) -> dict[str, Any]:
        if method == "tools/list":
            return _rpc_result({"tools": await session.mcp_list_tools()}, request_id)
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not name:
            return _rpc_error(INVALID_PARAMS, "Missing 'name' in params", request_id)
        if name == REWARD_ACTION:
            return _rpc_error(
                INVALID_PARAMS,
                "`reward` is not a tool: step {'tool': 'reward'} on /ws ends the episode",
                request_id,
            )
        if not isinstance(arguments, dict):
            return _rpc_error(INVALID_PARAMS, "'arguments' must be an object", request_id)
        return _rpc_result(await session.mcp_call_tool(name, arguments), request_id)


def _message_type(raw: str) -> str:
    try:
        message = json.loads(raw)
    except json.JSONDecodeError:
        return ""
    return str(message.get("type", "")) if isinstance(message, dict) else ""


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def require_token(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` behind a bearer token: an HTTP request or a WebSocket whose ``Authorization``
    is not ``Bearer TOKEN`` is refused (HTTP 401; a WebSocket's handshake is answered HTTP 403,
    never accepted) and never reaches ``app``. OpenEnv's clients send it with
    ``GenericEnvClient(base_url, headers={"Authorization": "Bearer TOKEN"})``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                if scope["type"] == "http":
                    refusal = JSONResponse(
                        {"detail": "missing or wrong Authorization: Bearer token"},
                        status_code=401,
                    )
                    await refusal(scope, receive, send)
                else:
                    await send({"type": "websocket.close", "code": 1008})
                return
        await app(scope, receive, send)

    return guarded


def create_app(
    env_ref: str,
    *,
    engine: SandboxEngine | str | None = None,
    max_concurrent_envs: int = 1,
    token: str | None = None,
    idle_timeout: float | None = None,
) -> ASGIApp:
    """The OpenEnv endpoints for ``env_ref`` as an ASGI app (``uvicorn.run(create_app(...))``);
    with ``token``, behind it (:func:`require_token`); ``idle_timeout``: see
    :class:`OpenEnvServer`.

    >>> create_app("mini-terminal@1.0.0", max_concurrent_envs=4).routes[0].path
    '/health'
    """
    app = OpenEnvServer(
        env_ref,
        engine=engine,
        max_concurrent_envs=max_concurrent_envs,
        idle_timeout=idle_timeout,
    ).app()
    return require_token(app, token) if token else app
