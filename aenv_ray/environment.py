"""The SDK: one :class:`Environment` is one environment instance, used as ``async with``.

    async with Environment("mini-terminal@1.0.0") as env:
        tools = await env.list_tools()
        result = await env.call_tool("execute_command", {"command": "ls"})
        reward = await env.call_reward({"path": "out.txt", "expected": "42"})

Where the instance comes from:

- ``DUMMY_INSTANCE_IP=http://localhost``, the *aenv run mode* (the seeds called it "local
  mode"; "local" here means only the local engine): talk to a server started with ``aenv run``
  (functions on 8080, MCP on 8081; a URL with an explicit port uses that port);
- :meth:`Environment.attach`: talk to a runtime at any URL you name;
- ``AENV_SYSTEM_URL=http://hub:8000`` (or ``aenv_url=``; the key in ``AENV_API_KEY`` or
  ``api_key=``): remote mode, an EnvHub (``aenv serve``) creates the instance from its registry;
  calls go straight to the instance's runtime when this process can reach it, else through the
  hub (``AENV_HUB_ROUTE=auto|direct|proxy``);
- otherwise an engine (default: the embedded local engine) creates an isolated instance of the
  definition found by name (built-ins, then ``AENV_ENV_PATH``) or given by
  :meth:`Environment.from_project`; :meth:`Environment.release` deletes it and
  :meth:`Environment.fork` copies it.

Tool calls go over the runtime's lean fast path; functions, reward and health over the seeds'
HTTP routes. The constructor keeps the seeds' parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import orjson

from aenv_ray import protocol as p
from aenv_ray._origin import Attached, Engined, Origin, RunServer
from aenv_ray._transport import InstanceClient
from aenv_ray.config import parse_duration
from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    Route,
    SandboxEngine,
    TerminationReason,
    check_engine_name,
    default_engine,
    named_engine,
)
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    AuthenticationError,
    ConfigurationError,
    FunctionError,
    FunctionErrorKind,
    InstanceBrokenError,
    InstanceClosedError,
    InstanceExpiredError,
    InstanceUnreachableError,
    NotSupportedError,
    ProtocolError,
    StartupTimeoutError,
    ToolArgumentError,
    decode_error,
)
from aenv_ray.openai_tools import OpenAINames, to_agents_tools, to_openai_tools
from aenv_ray.protocol import MAX_TIMEOUT, ToolErrorKind, ToolResult, json_problem
from aenv_ray.settings import Settings, get_settings

__all__ = ["Environment", "EnvironmentState"]

log = logging.getLogger("aenv_ray.environment")


def _encode(payload: Any, arguments: Any) -> bytes | str:
    """``payload`` as JSON, or what in ``arguments`` has no JSON form (NaN and infinity, which
    orjson would silently send as null; a lone surrogate; a type JSON does not have)."""
    try:
        body = orjson.dumps(payload)
    except TypeError as exc:
        return json_problem(arguments) or str(exc)
    if b"null" in body and (problem := json_problem(arguments)) is not None:
        return problem
    return body


class EnvironmentState(enum.Enum):
    """Where an :class:`Environment` is in its life: ``NEW`` until :meth:`~Environment.initialize`
    (or the first call), then ``OPEN``; ``BROKEN`` once its engine says the instance ended under
    it (every call then raises that end again); ``CLOSED`` after
    :meth:`~Environment.release`, from any state."""

    NEW = "new"
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


class Environment:
    """An environment instance: list and call its tools, functions, reward and health check.

    Args:
        env_name: ``"name@version"`` (or ``"name"``).
        datasource: data to mount into the instance (engines that support it).
        ttl: lifetime, ``"30m"``, ``"1h"`` or seconds; the engine terminates it after
            (default: ``deployConfig.ttl``, else 30 minutes).
        environment_variables: passed into the instance.
        arguments: passed to the instance's entrypoint.
        aenv_url: control plane URL (remote mode); defaults to ``AENV_SYSTEM_URL``.
        timeout: default per-call timeout in seconds.
        max_retries: how often a read (``list_tools``, ``check_health``, the runtime's info)
            that failed retryably (a dropped connection, nothing answering) is sent again,
            within its timeout; a call that may have run (``call_tool``, ``call_function``,
            ``call_reward``) is never repeated.
        api_key: Bearer key for the control plane; defaults to ``AENV_API_KEY``.
        engine: the :class:`~aenv_ray.engine.SandboxEngine` that creates the instance, or its
            name (``"local"``, ``"kubernetes"``: the process-wide engine of that kind); default:
            a hub when one is configured, else the engine ``AENV_ENGINE`` names (``local``).
        wait_healthy: ``initialize()`` waits until the health check answers healthy (the
            default); ``False``: until the runtime answers at all, whatever the environment's
            health check says (AEnvironment's ``skip_for_healthy``).

    Where the instance comes from, first match wins: :meth:`attach` (a running runtime);
    ``DUMMY_INSTANCE_IP`` (a server started with ``aenv run``); ``aenv_url`` /
    ``AENV_SYSTEM_URL`` (an EnvHub creates it); otherwise an engine creates one
    from the definition found by name (built-in environments, then ``AENV_ENV_PATH``) or given
    by :meth:`from_project`, and :meth:`release` deletes it.
    """

    def __init__(
        self,
        env_name: str,
        datasource: str = "",
        ttl: str | float | None = None,
        environment_variables: dict[str, str] | None = None,
        arguments: list[str] | None = None,
        aenv_url: str | None = None,
        timeout: float | None = None,
        max_retries: int = 10,
        api_key: str | None = None,
        *,
        startup_timeout: float | None = None,
        owner: str | None = None,
        settings: Settings | None = None,
        engine: SandboxEngine | str | None = None,
        wait_healthy: bool = True,
    ) -> None:
        if not env_name or not isinstance(env_name, str):
            raise ConfigurationError("env_name must be a non-empty string such as `name@1.0.0`")
        self.settings = settings or get_settings()
        self.env_name = env_name
        self.datasource = datasource
        self.ttl = parse_duration(ttl) if ttl is not None else None
        self.environment_variables = dict(environment_variables or {})
        self.arguments = list(arguments or [])
        self.aenv_url = aenv_url or self.settings.system_url
        self.timeout = float(timeout if timeout is not None else self.settings.timeout)
        self.max_retries = max_retries
        self.api_key = api_key or self.settings.api_key
        self.startup_timeout = startup_timeout
        self.wait_healthy = wait_healthy
        self.owner = owner
        self.instance_id: str | None = None
        self._client: InstanceClient | None = None
        self._state = EnvironmentState.NEW
        self._broken: AEnvError | None = None  # the end that made it BROKEN
        self._init_lock = asyncio.Lock()
        self._tools: list[dict[str, Any]] | None = None
        self._served_ref: str | None = None
        self._declared: dict[str, Any] = {}  # timeouts the runtime's tools and functions declare
        self._tool_names: set[str] = set()  # from /aenv/v1/info: maps OpenAI names back
        self._openai_names: OpenAINames | None = None
        if isinstance(engine, str):
            check_engine_name(engine)  # ConfigurationError naming the engines there are
        self._engine = engine
        self._project: Path | None = None
        self._origin: Origin | None = None  # where the instance comes from: chosen once
        self._route: Route | None = None

    @classmethod
    def attach(
        cls, url: str, env_name: str | None = None, *, token: str | None = None, **kwargs: Any
    ) -> Environment:
        """An Environment for the runtime already serving at ``url`` (not owned: release()
        disconnects without stopping it). ``env_name`` defaults to what the runtime serves;
        ``token`` is the instance's (:attr:`~aenv_ray.engine.InstanceInfo.token`) when an
        engine created it, or your hub key when ``url`` is a hub's address of an instance or a
        service (its path is kept: ``https://hub/v1/services/ID/proxy``, the service's stable
        ``address``, reaches one running replica per call).

        >>> Environment.attach("http://hub:8080/v1/services/svc-1/proxy", token="KEY")
        Environment('unknown', state=new, url=None)
        """
        env = cls(env_name or "unknown", **kwargs)
        env._origin = Attached(url, {"Authorization": f"Bearer {token}"} if token else {})
        env._served_ref = None if env_name else ""
        return env

    @classmethod
    def adopt(cls, engine: SandboxEngine, info: InstanceInfo, **kwargs: Any) -> Environment:
        """An Environment for the running instance ``info`` that ``engine`` already made (a
        warm pool's claim, :meth:`~aenv_ray.engine.WarmPoolEngine.claim`): opening it starts
        nothing; :meth:`release` deletes the instance."""
        env = cls(info.env_ref or "unknown", engine=engine, **kwargs)
        env._origin = Engined(engine, adopted=info)
        return env

    @classmethod
    def from_project(cls, project: str | Path, **kwargs: Any) -> Environment:
        """An Environment whose instance an engine creates from the project directory
        ``project`` (a ``config.json`` and ``src/``), without looking the name up."""
        from aenv_ray.config import EnvConfig

        root = Path(project).resolve()
        env = cls(EnvConfig.load(root).ref, **kwargs)
        env._project = root
        return env

    async def fork(self, n: int, *, timeout: float | None = None) -> list[Environment]:
        """``n`` new environments whose instances equal this one's at this moment: Python
        state and workspace are copied (copy-on-write). Each is open; release each.

        Only for instances an engine created (not :meth:`attach` or the aenv run mode).
        """
        if self._state is EnvironmentState.NEW:
            await self.initialize()
        self._require_client()
        assert self._origin is not None
        limit = timeout if timeout is not None else self.settings.startup_timeout
        try:
            origins = await self._origin.fork(n, limit)
        except ConfigurationError as exc:
            raise ConfigurationError(f"`{self.env_name}`: {exc}") from exc
        children = []
        for origin in origins:
            child = Environment(
                self.env_name,
                timeout=self.timeout,
                max_retries=self.max_retries,
                startup_timeout=self.startup_timeout,
                settings=self.settings,
            )
            child._origin = origin
            children.append(child)
        try:
            for child in children:
                await child.initialize()
        except BaseException:
            for child in children:
                await child.release()
            raise
        return children

    # -- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> Environment:
        await self.initialize()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    @property
    def state(self) -> EnvironmentState:
        """Where this environment is in its life (:class:`EnvironmentState`)."""
        return self._state

    @property
    def is_open(self) -> bool:
        """True between a successful :meth:`initialize` and :meth:`release` (or a break)."""
        return self._state is EnvironmentState.OPEN

    @property
    def url(self) -> str | None:
        """Base URL of the instance's runtime, once initialized."""
        return self._client.base_url if self._client else None

    @property
    def mcp_url(self) -> str | None:
        """The instance's standard MCP endpoint, for any MCP client (once initialized).

        In the aenv run mode (``DUMMY_INSTANCE_IP``) that is the MCP port (``AENV_MCP_PORT``,
        8081); elsewhere every port of the runtime serves MCP at ``/mcp``.
        """
        if self._origin is None or self._route is None:
            return None
        return self._origin.mcp_url(self._route)

    async def initialize(self) -> bool:
        """Get an instance and wait until it is healthy. Idempotent; returns True."""
        async with self._init_lock:
            if self._state is not EnvironmentState.NEW:
                self._require_client()  # CLOSED and BROKEN raise; OPEN returns
                return True
            origin = self._origin = self._origin or self._choose_origin()
            try:
                route = await origin.open(self.startup_timeout or self.settings.startup_timeout)
            except BaseException:
                await origin.close()
                raise
            self.instance_id = origin.instance_id
            self._route = route
            base_url = route.url
            self._client = InstanceClient(
                base_url,
                connect_timeout=self.settings.connect_timeout,
                reconnect_window=self.settings.reconnect_window,
                headers=dict(route.headers),
                env_name=self.env_name,
                instance_id=self.instance_id,
            )
            loop = asyncio.get_running_loop()

            def ended(info: InstanceInfo) -> None:  # from the engine's thread
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
                    loop.call_soon_threadsafe(self._instance_ended, info)

            origin.watch_end(ended)
            try:
                await self._wait_until_healthy()
                await self._read_info()
            except BaseException:
                await self._client.aclose()
                self._client = None
                await origin.close()
                raise
            # the engine may have seen it end meanwhile (_instance_ended): then it is BROKEN
            self._state = EnvironmentState.OPEN if self._broken is None else self._state
            log.info("environment ready", extra={"env": self.env_name, "url": base_url})
            return True

    def _choose_origin(self) -> Origin:
        """Where the instance comes from (see the class docstring): decided once."""
        settings = self.settings
        if settings.dummy_instance_ip:
            return RunServer(settings.dummy_instance_ip, settings.functions_port, settings.mcp_port)
        spec = InstanceSpec(
            env_ref=self.env_name,
            project=str(self._project) if self._project is not None else None,
            ttl=self.ttl,
            environment_variables=self.environment_variables,
            arguments=tuple(self.arguments),
            datasource=self.datasource or None,
            owner=self.owner,
            env_path=self.settings.env_path,
        )
        if self.aenv_url and self._engine is None and self._project is None:
            from aenv_ray.hub import HubClient, RemoteEngine

            hub = RemoteEngine(
                HubClient(self.aenv_url, api_key=self.api_key),
                route=self.settings.hub_route,
                connect_timeout=self.settings.connect_timeout,
            )
            return Engined(hub, spec=spec, owns_engine=True)
        if isinstance(self._engine, str):
            return Engined(named_engine(self._engine), spec=spec)
        return Engined(self._engine or default_engine(), spec=spec)

    def _instance_ended(self, info: InstanceInfo) -> None:
        """The engine saw the instance end (a pod deleted behind our back, evicted, OOMKilled):
        calls in flight and later ones fail at once with its account, never by timing out
        against an address that no longer answers."""
        if self._state is EnvironmentState.CLOSED or self._client is None:
            return  # released: its end is ours
        self._break(info)
        self._client.end(info.describe_end())

    def _break(self, info: InstanceInfo) -> AEnvError:
        """Make the environment ``BROKEN`` by the engine's account ``info`` of its end."""
        cls = (
            InstanceExpiredError
            if info.reason is TerminationReason.EXPIRED
            else InstanceBrokenError
        )
        self._state = EnvironmentState.BROKEN
        self._broken = cls(
            f"`{self.env_name}`: {info.describe_end()}; create a new environment",
            env_name=self.env_name,
            instance_id=info.id,
        )
        return self._broken

    async def _why_broken(self, exc: InstanceBrokenError) -> AEnvError:
        """The engine's account of a dead instance, when it has one (the environment is then
        ``BROKEN``: its instance is gone for good)."""
        if self._broken is not None:  # the engine told us first (:meth:`_instance_ended`)
            return self._broken
        info = await self._origin.ended() if self._origin is not None else None
        if info is None:
            return exc
        return self._break(info)

    async def _wait_until_healthy(self) -> None:
        assert self._client is not None
        # a local server is there or not: 10 s unless AENV_STARTUP_TIMEOUT or the argument says
        explicit = "startup_timeout" in self.settings.model_fields_set
        quick = self._origin.startup_wait if self._origin is not None and not explicit else None
        limit = self.startup_timeout or quick or self.settings.startup_timeout
        deadline = time.monotonic() + limit
        delay, last = 0.02, "no answer yet"
        probe = p.HEALTH_PATH if self.wait_healthy else p.READY_PATH
        while True:
            try:
                status, data = await self._client.request(
                    "GET", probe, timeout=max(0.5, min(5.0, deadline - time.monotonic()))
                )
                if status == 200:
                    return
                if status == 401:
                    raise decode_error(
                        data,
                        status,
                        fallback=AuthenticationError,
                        env_name=self.env_name,
                        instance_id=self.instance_id,
                    )
                last = f"HTTP {status}: {data}"
                if status == 404 and isinstance(self._origin, Attached):
                    last += (
                        f"; is {self._client.base_url} a runtime's base URL? (a hub's instance "
                        "or service is attached at its `address`, .../proxy)"
                    )
            except InstanceUnreachableError as exc:
                last = str(exc)
            if time.monotonic() + delay > deadline:
                # attach() without a name has none yet: the runtime is its URL
                what = "the runtime" if self._served_ref == "" else f"`{self.env_name}`"
                raise StartupTimeoutError(
                    f"{what} at {self._client.base_url} did not become healthy within "
                    f"{limit:g} s (last: {last})",
                    timeout=limit,
                    env_name=self.env_name,
                    instance_id=self.instance_id,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _read_info(self) -> None:
        assert self._client is not None
        status, info = await self._send("GET", p.FAST_INFO_PATH, None, self.timeout, None, None)
        if status != 200 or not isinstance(info, dict) or "ref" not in info:
            raise ProtocolError(f"{self.url}{p.FAST_INFO_PATH} answered HTTP {status}: {info!r}")
        served = str(info["ref"])
        if self._served_ref == "":  # attach() without a name: take the runtime's
            self.env_name = served
            assert self._client is not None
            self._client.env_name = served
        elif not _serves(served, self.env_name):
            log.warning(
                "runtime serves another environment",
                extra={"requested": self.env_name, "served": served},
            )
        self._served_ref = served
        names = info.get("tools")
        self._tool_names = {str(n) for n in names} if isinstance(names, list) else set()
        declared = info.get("timeouts")
        self._declared = declared if isinstance(declared, dict) else {}

    async def release(self) -> None:
        """Give the instance back. Idempotent; later calls raise :class:`InstanceClosedError`."""
        if self._state is EnvironmentState.CLOSED:
            return
        self._state = EnvironmentState.CLOSED
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        if self._origin is not None:
            await self._origin.close()
        log.info("environment released", extra={"env": self.env_name})

    destroy = release

    # -- calls -------------------------------------------------------------------------------
    def _require_client(self) -> InstanceClient:
        if self._state is EnvironmentState.CLOSED:
            raise InstanceClosedError(
                f"`{self.env_name}` was released; create a new Environment",
                env_name=self.env_name,
                instance_id=self.instance_id,
            )
        if self._broken is not None:  # BROKEN: the engine said its instance ended
            raise type(self._broken)(
                str(self._broken), env_name=self.env_name, instance_id=self.instance_id
            )
        assert self._client is not None
        return self._client

    async def _request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        function: str | None = None,
    ) -> tuple[int, Any]:
        """Send one request; return (status, JSON) of a success, raise the error an error
        answer carries (:func:`~aenv_ray.errors.decode_error`; ``function`` names what failed).

        A read (``GET``) whose connection dropped before it was answered is sent again, at most
        ``max_retries`` times and within its ``timeout``
        (:meth:`~aenv_ray._transport.InstanceClient.request`); a request that may have changed
        something (``POST``: a tool call, a function, the reward) is never repeated."""
        if self._state is EnvironmentState.NEW:
            await self.initialize()
        status, data = await self._send(method, path, payload, timeout, headers, body)
        if status >= 400 and isinstance(data, dict) and data.get("success") is not True:
            raise decode_error(
                data,
                status,
                fallback=FunctionError if function else None,
                env_name=self.env_name,
                instance_id=self.instance_id,
                function=function,
            )
        return status, data

    async def _send(
        self,
        method: str,
        path: str,
        payload: Any,
        timeout: float,
        headers: dict[str, str] | None,
        body: bytes | None,
    ) -> tuple[int, Any]:
        """One request (a read retried as :meth:`_request` says); a broken instance's error
        is the engine's account of its end when the engine has one."""
        try:
            return await self._require_client().request(
                method,
                path,
                payload,
                timeout=timeout,
                headers=headers,
                body=body,
                max_retries=self.max_retries,
            )
        except InstanceBrokenError as exc:
            explained = await self._why_broken(exc)
            if explained is exc:
                raise
            raise explained from exc

    def _limit(self, declared: Any, explicit: float | None) -> float:
        """Seconds a call may run: ``timeout=`` of the call, else what the tool or function
        declares, else the environment's ``timeout``; never past a declared limit."""
        own = float(declared) if isinstance(declared, int | float) and declared > 0 else None
        if explicit is not None and not (
            isinstance(explicit, int | float) and 0 < explicit <= MAX_TIMEOUT
        ):
            raise ConfigurationError(
                f"timeout= must be positive seconds up to {MAX_TIMEOUT:g}, got {explicit!r}",
                env_name=self.env_name,
                instance_id=self.instance_id,
            )
        if explicit is not None:
            return min(float(explicit), own) if own is not None else float(explicit)
        return own if own is not None else float(self.timeout)

    @property
    def _ref(self) -> str:
        """``name@version`` as the runtime serves it (the name given, before it answered)."""
        return self._served_ref or self.env_name

    async def list_tools(self) -> list[dict[str, Any]]:
        """Tools as ``{"name": "env@version/tool", "description", "inputSchema"}`` dicts."""
        status, data = await self._request("GET", p.FAST_TOOLS_PATH, timeout=self.timeout)
        if status != 200 or not isinstance(data, dict):
            raise ProtocolError(f"listing tools answered HTTP {status}: {data!r}")
        self._tools = data["tools"]
        return [
            {
                "name": f"{self._ref}/{tool['name']}",
                "description": tool.get("description", ""),
                "inputSchema": tool.get("inputSchema", {"type": "object", "properties": {}}),
            }
            for tool in data["tools"]
        ]

    async def list_openai_tools(self) -> list[dict[str, Any]]:
        """Tools as Chat Completions ``{"type": "function", "function": {...}}`` dicts.

        Names match ``^[a-zA-Z0-9_-]{1,64}$`` (``mini-terminal_1_0_0__execute_command``);
        :meth:`call_tool` accepts them as they are.
        """
        return to_openai_tools(self._ref, await self.list_tools())

    async def list_agents_tools(self) -> list[Any]:
        """Tools as OpenAI Agents SDK ``FunctionTool``s (needs ``pip install openai-agents``)."""
        return to_agents_tools(self, await self.list_openai_tools())

    def _names(self) -> OpenAINames:
        if self._openai_names is None or self._openai_names.env_name != self._ref:
            self._openai_names = OpenAINames(self._ref)
        return self._openai_names

    def _plain_tool_name(self, name: str) -> str | ToolResult:
        if "/" in name:
            env, tool = name.rsplit("/", 1)
            accepted = {self.env_name, self._served_ref or self.env_name}
            if env not in accepted and _unversioned(env) not in accepted:
                return ToolResult(
                    content=[
                        {
                            "type": "text",
                            "text": (
                                f"tool `{name}` belongs to `{env}`, not to `{self.env_name}`; "
                                f"call it as `{self.env_name}/{tool}` or `{tool}`"
                            ),
                        }
                    ],
                    is_error=True,
                    error_kind=ToolErrorKind.NOT_FOUND,
                )
            return tool
        known = self._tool_names or ({t["name"] for t in self._tools} if self._tools else set())
        if name in known:
            return name
        return self._names().from_openai(name, known) or name

    async def call_tool(
        self,
        tool_name: str,
        arguments: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> ToolResult:
        """Call a tool by plain name, ``env@version/tool`` or its OpenAI name.

        Problems the agent can act on (unknown tool, bad arguments, the tool raised or timed out)
        come back as ``ToolResult(is_error=True)``; problems with the instance raise
        (:class:`InstanceBrokenError`, :class:`CallTimeoutError`, ...).
        """
        if arguments is not None and not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"arguments for `{tool_name}` must be a dict, got {type(arguments).__name__}",
                tool=tool_name,
                env_name=self.env_name,
            )
        if self._state is EnvironmentState.NEW:
            await self.initialize()
        if not self._tool_names and self._tools is None and "/" not in tool_name:
            await self.list_tools()  # a runtime that did not list its tools in /aenv/v1/info
        plain = self._plain_tool_name(tool_name)
        if isinstance(plain, ToolResult):
            return plain
        limit = self._limit(self._declared.get("tools", {}).get(plain), timeout)
        body = _encode({"name": plain, "arguments": arguments or {}, "timeout": limit}, arguments)
        if isinstance(body, str):
            raise ToolArgumentError(
                f"arguments for tool `{plain}` cannot be sent: {body} has no JSON form; send "
                "finite numbers and Unicode text",
                tool=plain,
                env_name=self.env_name,
                instance_id=self.instance_id,
            )
        status, data = await self._request(
            "POST", p.FAST_CALL_PATH, body=body, timeout=limit + self.settings.call_grace
        )
        if status != 200 or not isinstance(data, dict):
            raise ProtocolError(f"calling `{plain}` answered HTTP {status}: {data!r}")
        try:
            return ToolResult.from_wire(data)
        except (KeyError, ValueError) as exc:
            raise ProtocolError(f"calling `{plain}` answered a malformed result: {data!r}") from exc

    async def _call_envelope(
        self,
        method: str,
        path: str,
        label: str,
        arguments: Any,
        timeout: float | None,
        declared: Any = None,
    ) -> Any:
        limit = self._limit(declared, timeout)
        body = _encode(arguments, arguments)
        if isinstance(body, str):
            raise FunctionError(
                f"arguments for {label} cannot be sent: {body} has no JSON form; send finite "
                "numbers and Unicode text",
                function=label,
                error_type=FunctionErrorKind.INVALID_ARGUMENTS.value,
                kind=FunctionErrorKind.INVALID_ARGUMENTS,
                env_name=self.env_name,
                instance_id=self.instance_id,
            )
        status, data = await self._request(
            method,
            path,
            body=body,
            timeout=limit + self.settings.call_grace,
            headers={p.TIMEOUT_HEADER.decode(): repr(limit)},
            function=label,
        )
        if not isinstance(data, dict) or data.get("success") is not True:
            raise ProtocolError(f"{label} answered HTTP {status}: {data!r}")
        return data.get("data")

    async def call_function(
        self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Call a ``@register_function`` helper; return its JSON value or raise
        :class:`FunctionError` (:class:`FunctionNotFoundError` for an unknown name)."""
        if self._state is EnvironmentState.NEW:
            await self.initialize()
        return await self._call_envelope(
            "POST",
            p.FUNCTIONS_PREFIX + name,
            f"function `{name}`",
            arguments or {},
            timeout,
            self._declared.get("functions", {}).get(name),
        )

    async def call_reward(
        self, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Call the environment's reward; return its value (often a float)."""
        if self._state is EnvironmentState.NEW:
            await self.initialize()
        return await self._call_envelope(
            "POST", p.REWARD_PATH, "reward", arguments or {}, timeout, self._declared.get("reward")
        )

    async def check_health(
        self, timeout: float | None = None, *, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The health check's report, e.g. ``{"status": "healthy"}``; unhealthy is not an error
        here (look at ``status``), a health check that raised is :class:`FunctionError`.
        ``arguments`` go to a health check that takes parameters."""
        limit = float(timeout if timeout is not None else self.timeout)
        if arguments:
            body = _encode(arguments, arguments)
            if isinstance(body, str):
                raise ToolArgumentError(
                    f"arguments for the health check cannot be sent: {body} has no JSON form",
                    env_name=self.env_name,
                    instance_id=self.instance_id,
                )
            status, data = await self._request(
                "POST", p.HEALTH_PATH, body=body, timeout=limit, function="health"
            )
        else:
            status, data = await self._request(
                "GET", p.HEALTH_PATH, timeout=limit, function="health"
            )
        if not isinstance(data, dict) or data.get("success") is not True:
            raise ProtocolError(f"health answered HTTP {status}: {data!r}")
        report = data.get("data")
        return report if isinstance(report, dict) else {"status": str(report)}

    async def preview_url(self, path: str = "", *, timeout: float | None = None) -> str:
        """The address where a browser opens the instance's preview (``path``: a file in it),
        e.g. ``http://127.0.0.1:PORT/aenv/v1/preview/CAPABILITY/index.html``.

        The preview is the directory the environment's code serves
        (:func:`aenv_ray.preview.set_preview_directory`); the address holds a capability, not
        the instance's token: whoever has it can read those files (and nothing else) while the
        instance lives. Through a hub's proxy it is the hub's address, which needs no key.
        Raises :class:`~aenv_ray.errors.NotSupportedError` when the environment serves none.
        """
        limit = float(timeout if timeout is not None else self.timeout)
        status, data = await self._request("GET", p.PREVIEW_PATH, timeout=limit)
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("path"), str):
            raise ProtocolError(f"{self.url}{p.PREVIEW_PATH} answered HTTP {status}: {data!r}")
        if data.get("directory") is None:
            raise NotSupportedError(
                f"`{self._ref}` serves no preview: its code has not called "
                "aenv_ray.preview.set_preview_directory(...) (yet)",
                env_name=self.env_name,
                instance_id=self.instance_id,
            )
        return f"{self.url}{data['path']}{quote(path.lstrip('/'))}"

    async def list_functions(self) -> dict[str, Any]:
        """What the instance serves besides its tools: ``{"total", "functions", "reward",
        "health"}``, each entry ``{"name", "endpoint", "method", "description", "parameters"
        (its JSON schema), "is_async"}``."""
        if self._state is EnvironmentState.NEW:
            await self.initialize()
        status, data = await self._request("GET", p.FUNCTIONS_LIST_PATH, timeout=self.timeout)
        listing = data.get("data") if isinstance(data, dict) else None
        if status != 200 or not isinstance(listing, dict):
            raise ProtocolError(f"listing functions answered HTTP {status}: {data!r}")
        return listing

    def __repr__(self) -> str:
        return f"Environment({self.env_name!r}, state={self._state.value}, url={self.url!r})"


def _serves(served: str, asked: str) -> bool:
    """True when a runtime serving ``served`` (``name@version``) is what ``asked`` names: the
    same ``name@version``, or its name alone (a hub's ``tenant/`` prefix aside)."""
    try:
        got, wanted = EnvRef.parse(served), EnvRef.parse(asked)
    except ConfigurationError:  # a name attach() was given: compare the text
        return served == asked
    return wanted.bare == got.bare or (wanted.version is None and wanted.name == got.name)


def _unversioned(text: str) -> str:
    """``text`` without its ``@version`` (``text`` itself when it is no environment reference)."""
    try:
        return str(EnvRef.parse(text).without_version())
    except ConfigurationError:
        return text
