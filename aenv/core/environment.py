"""AEnvironment's ``Environment`` (``aenv.core.environment``), over :class:`aenv_ray.Environment`.

The constructor, the methods and what they return or raise are AEnvironment's (0.1.7); each
call goes to an :class:`aenv_ray.Environment` (:attr:`Environment.native`), so the instance is
aenv-ray's: created by the embedded local engine when nothing is configured, by an EnvHub
(``aenv_url`` / ``AENV_SYSTEM_URL``), or served by ``aenv run`` (``DUMMY_INSTANCE_IP``).
What differs, and why, is in docs/migrating.md. In short:

- ``call_tool`` returns a :class:`ToolResult` (``content``, ``is_error``) for what the agent can
  act on (an unknown tool, bad arguments, a tool that raised), and raises :class:`ToolError`
  where AEnvironment does: a name of another environment (``other@1.0.0/tool``), a call past its
  timeout (:class:`ToolTimeoutError`), an instance that broke; after five such failures in a row
  :class:`UnrecoverableEnvironmentError`. Everything else raises :class:`EnvironmentError`.
- ``call_function`` and ``call_reward`` return the function's value; ``check_health`` returns
  the runtime's envelope, ``{"success": True, "data": report}``.
- ``release()`` deletes the instance; the next call (or ``initialize()``) creates a new one.
- The instance gets ``envNAME`` and ``envversion`` (from ``env_name``) among its variables.
- :data:`ALIASES` names aenv-ray's built-ins by AEnvironment's names (``tau2-env``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aenv_ray
from aenv.core.exceptions import (
    EnvironmentError,
    ToolError,
    ToolTimeoutError,
    UnrecoverableEnvironmentError,
)
from aenv.core.function_registry import python_parameters
from aenv_ray.errors import AEnvError, ConfigurationError
from aenv_ray.settings import get_settings

__all__ = [
    "ALIASES",
    "CONTROL_PORT",
    "Environment",
    "ToolResult",
    "resolve_alias",
    "split_env_name_version",
]

log = logging.getLogger("aenv.environment")

ALIASES: dict[str, str] = {
    "tau2-env": "tau2@1.0.0",  # AEnvironment's tau2 (1.0.0 to 1.0.2): tau2-bench, as tau2@1.0.0
    "mini-terminal": "mini-terminal@1.0.0",  # AEnvironment's is 1.0.1: the same shell tool
}
"""AEnvironment's built-in environments by name (any version) -> aenv-ray's built-in that does
the same. Used when no environment of the exact ``name@version`` is found here (built-ins,
``AENV_ENV_PATH``); not in the aenv run mode, which talks to whatever ``aenv run`` serves."""

CONTROL_PORT = 8080
"""The port AEnvironment's SDK gives a control-plane URL that names none
(``AENV_SYSTEM_URL=http://api-service`` means ``:8080``); the compatibility layer does too."""

_CIRCUIT_BREAKER = 5
_HEALTHY = ("healthy", "success", "ok")


def split_env_name_version(env_name: str) -> tuple[str, str]:
    """``"name@version"`` -> ``("name", "version")``; no ``@``: ``("name", "")``.

    >>> split_env_name_version("tau2-env@1.0.0"), split_env_name_version("notes")
    (('tau2-env', '1.0.0'), ('notes', ''))
    """
    name, _, version = (env_name or "").partition("@")
    return name, version


def resolve_alias(env_name: str, available: dict[str, Any] | None = None) -> str:
    """The aenv-ray environment ``env_name`` names: itself when an environment of that name
    and version is found here (``available``: ``{"name@version": ...}``, default
    :func:`aenv_ray.available_environments`), else its :data:`ALIASES` entry, else itself.

    >>> resolve_alias("tau2-env@1.0.0", {}), resolve_alias("mini-terminal@1.0.1", {})
    ('tau2@1.0.0', 'mini-terminal@1.0.0')
    >>> resolve_alias("tau2-env@1.0.0", {"tau2-env@1.0.0": "/srv/envs/tau2-env"})
    'tau2-env@1.0.0'
    """
    name, version = split_env_name_version(env_name)
    if name not in ALIASES:
        return env_name
    found = aenv_ray.available_environments() if available is None else available
    if version and env_name in found:
        return env_name
    if not version and any(ref.partition("@")[0] == name for ref in found):
        return env_name
    return ALIASES[name]


def _control_url(url: str | None) -> str | None:
    """AEnvironment's reading of a control-plane URL: ``http://`` when no scheme is given,
    port :data:`CONTROL_PORT` when none is.

    >>> _control_url("api-service"), _control_url("https://hub.example:8443/")
    ('http://api-service:8080', 'https://hub.example:8443')
    """
    if not url:
        return None
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
    netloc = parts.netloc if parts.port is not None else f"{parts.netloc}:{CONTROL_PORT}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


class ToolResult:
    """A tool's result as AEnvironment returns it: MCP ``content`` items and ``is_error``.

    Text items are ``{"type": "text", "text": ...}``, others (images) ``{"type", "data"}``.
    """

    def __init__(self, content: list[dict[str, Any]], is_error: bool = False) -> None:
        self.content = content
        self.is_error = is_error

    @classmethod
    def from_result(cls, result: aenv_ray.ToolResult) -> ToolResult:
        """The AEnvironment form of aenv-ray's :class:`aenv_ray.ToolResult`."""
        content: list[dict[str, Any]] = []
        for item in result.content:
            if item.get("text"):
                content.append({"type": "text", "text": item["text"]})
            elif "type" in item and "data" in item:
                content.append({"type": item["type"], "data": item["data"]})
            else:
                content.append({"type": "text", "text": str(item)})
        return cls(content=content, is_error=result.is_error)

    def __repr__(self) -> str:
        return f"ToolResult(content={self.content}, is_error={self.is_error})"


class Environment:
    """AEnvironment's environment: one instance, its tools, functions, reward and health.

    Args:
        env_name: ``"name@version"`` (or ``"name"``); :data:`ALIASES` apply.
        datasource: data to mount into the instance (as :class:`aenv_ray.Environment`).
        ttl: the instance's lifetime (``"30m"``); default: ``deployConfig.ttl``, else 30 minutes.
        environment_variables: the instance's variables; ``None`` values are left out.
            ``envNAME`` and ``envversion`` are set from ``env_name``.
        arguments: the instance's entrypoint arguments.
        aenv_url: an EnvHub; default ``AENV_SYSTEM_URL``. Without a port it means port 8080,
            as in AEnvironment (:data:`CONTROL_PORT`).
        timeout: the default per-call timeout, seconds (default ``AENV_TIMEOUT``, 60).
        startup_timeout: how long ``initialize()`` waits for the instance (default:
            aenv-ray's, 120 s for an engine, 10 s for ``aenv run``).
        max_retries: how often a read whose connection dropped is sent again.
        api_key: the hub's key; default ``AENV_API_KEY``.
        skip_for_healthy: ready once the runtime answers, whatever the health check says.
        enable_data_plane: ``False``: no tool, function, reward or health call (they raise
            :class:`EnvironmentError`), and no wait for health.
        owner: the instance's owner label.
        labels: AEnvironment's resource labels: accepted, not used.
        mount_points: AEnvironment's arca-engine mounts: accepted, not used.
    """

    def __init__(
        self,
        env_name: str,
        datasource: str = "",
        ttl: str | None = None,
        environment_variables: dict[str, Any] | None = None,
        arguments: list[str] | None = None,
        aenv_url: str | None = None,
        timeout: float | None = None,
        startup_timeout: float | None = None,
        max_retries: int = 10,
        api_key: str | None = None,
        skip_for_healthy: bool = False,
        enable_data_plane: bool = True,
        owner: str | None = None,
        labels: dict[str, str] | None = None,
        mount_points: list[dict[str, Any]] | None = None,
    ) -> None:
        if not env_name or not isinstance(env_name, str):
            raise EnvironmentError("env_name must be a non-empty string such as `name@1.0.0`")
        self.env_name = env_name
        self.datasource = datasource
        self.ttl = ttl
        self.environment_variables = dict(environment_variables or {})
        self.arguments = list(arguments or [])
        self.aenv_url = aenv_url
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.max_retries = max_retries
        self.api_key = api_key
        self.skip_for_healthy = skip_for_healthy
        self.enable_data_plane = enable_data_plane
        self.owner = owner
        self.labels = labels
        self.mount_points = mount_points
        self._native: aenv_ray.Environment | None = None
        self._lock = asyncio.Lock()
        self._created_at: str | None = None
        self._failures = 0
        for given, what in ((labels, "labels"), (mount_points, "mount_points")):
            if given:
                log.warning(
                    "%s is accepted and not used by aenv-ray",
                    what,
                    extra={"env": env_name, "argument": what},
                )

    # -- the instance --------------------------------------------------------------------------
    @property
    def native(self) -> aenv_ray.Environment | None:
        """The :class:`aenv_ray.Environment` in use (None before ``initialize()`` and after
        ``release()``): aenv-ray's API on the same instance (``fork``, ``list_openai_tools``
        as Chat Completions dicts, ...)."""
        return self._native

    def _variables(self) -> dict[str, str]:
        out = {str(k): str(v) for k, v in self.environment_variables.items() if v is not None}
        name, version = split_env_name_version(self.env_name)
        out["envNAME"], out["envversion"] = name, version
        return out

    def _make_native(self) -> aenv_ray.Environment:
        settings = get_settings()
        target = self.env_name if settings.dummy_instance_ip else resolve_alias(self.env_name)
        hub = _control_url(self.aenv_url or settings.system_url)
        return aenv_ray.Environment(
            target,
            self.datasource,
            self.ttl,
            self._variables(),
            self.arguments,
            hub,
            self.timeout,
            self.max_retries,
            self.api_key,
            startup_timeout=self.startup_timeout,
            owner=self.owner,
            settings=settings,
            wait_healthy=self.enable_data_plane and not self.skip_for_healthy,
        )

    async def initialize(self) -> bool:
        """Create the instance (or connect to ``aenv run``) and wait until it is ready; returns
        True. Idempotent; after ``release()`` it creates a new instance."""
        async with self._lock:
            if self._native is not None and self._native.is_open:
                return True
            if self._native is not None:  # broken: let it go, start over
                await self._native.release()
                self._native = None
            try:
                native = self._make_native()
            except ConfigurationError as exc:
                raise EnvironmentError(
                    f"Failed to initialize environment '{self.env_name}': {exc}",
                    env_name=self.env_name,
                ) from exc
            try:
                await native.initialize()
            except (AEnvError, OSError) as exc:
                await native.release()
                raise EnvironmentError(
                    f"Failed to initialize environment '{self.env_name}': {exc}",
                    env_name=self.env_name,
                ) from exc
            self._native = native
            self._created_at = datetime.now(UTC).isoformat(timespec="milliseconds")
            self._failures = 0
            log.info(
                "environment initialized",
                extra={"env": self.env_name, "runs": native.env_name, "url": native.url},
            )
            return True

    async def _open(self) -> aenv_ray.Environment:
        if self._native is None or not self._native.is_open:
            await self.initialize()
        assert self._native is not None
        return self._native

    async def release(self) -> None:
        """Delete the instance (``aenv run``: disconnect). Idempotent; a later call creates a
        new instance."""
        native, self._native = self._native, None
        if native is not None:
            await native.release()

    destroy = release

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

    async def wait_for_ready(self, timeout: float = 300.0) -> None:
        """Initialize if needed, then wait up to ``timeout`` seconds until the health check
        says healthy (not with ``skip_for_healthy``); :class:`EnvironmentError` after that."""
        await self.initialize()
        if self.skip_for_healthy or not self.enable_data_plane:
            return
        native = await self._open()
        deadline = time.monotonic() + timeout
        delay, last = 0.02, "no answer"
        while True:
            try:
                report = await native.check_health()
                if str(report.get("status", "")).lower() in _HEALTHY:
                    return
                last = json.dumps(report, default=str)
            except AEnvError as exc:
                last = str(exc)
            if time.monotonic() + delay > deadline:
                raise EnvironmentError(
                    f"Failed to wait for environment '{self.env_name}' to be ready: not healthy "
                    f"within {timeout:g} s (last: {last})",
                    env_name=self.env_name,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def get_env_info(self) -> dict[str, Any]:
        """``{"name", "instance_id", "status", "ip", "created_at", "updated_at"}``: ``ip`` is
        the runtime's URL."""
        native = await self._open()
        return {
            "name": self.env_name,
            "instance_id": native.instance_id,
            "status": "Running" if native.is_open else "Failed",
            "ip": native.url,
            "created_at": self._created_at,
            "updated_at": self._created_at,
        }

    async def presign_url(self, port: int, expiration_time_in_minutes: float = 5) -> str:
        """Not available: aenv-ray has no presigned URLs (AEnvironment's arca engine)."""
        raise EnvironmentError(
            f"presign_url is not supported by aenv-ray; the instance's runtime is at "
            f"{self._native.url if self._native else '(not initialized)'} (on a hub: its "
            "proxy, /v1/instances/ID/proxy/PATH)",
            env_name=self.env_name,
        )

    def _require_data_plane(self, op: str) -> None:
        if not self.enable_data_plane:
            raise EnvironmentError(
                f"{op} is unavailable: this Environment was created with enable_data_plane=False",
                env_name=self.env_name,
            )

    # -- tools ---------------------------------------------------------------------------------
    async def list_tools(self) -> list[dict[str, Any]]:
        """``[{"name": "env_name/tool", "description", "inputSchema"}]`` (``env_name`` as
        given to the constructor; ``description`` None when the tool has none)."""
        self._require_data_plane("list_tools")
        native = await self._open()
        try:
            tools = await native.list_tools()
        except AEnvError as exc:
            raise EnvironmentError(
                f"Failed to list tools for environment '{self.env_name}': {exc}",
                env_name=self.env_name,
            ) from exc
        return [
            {
                "name": f"{self.env_name}/{tool['name'].rsplit('/', 1)[-1]}",
                "description": tool.get("description") or None,
                "inputSchema": tool.get("inputSchema"),
            }
            for tool in tools
        ]

    async def list_openai_tools(self) -> list[Any]:
        """The tools as OpenAI Agents SDK ``FunctionTool``s named as :meth:`list_tools` names
        them, with ``strict_json_schema=True`` (``False`` for a schema strict mode refuses,
        such as an object of free keys, which AEnvironment fails on); a tool's error result
        reaches the model as its content's JSON. Needs ``pip install openai-agents``."""
        try:
            from agents.exceptions import UserError
            from agents.tool import FunctionTool
        except ImportError as exc:
            raise ImportError(
                "list_openai_tools() needs the OpenAI Agents SDK: pip install openai-agents"
            ) from exc

        def make(name: str, description: str, schema: dict[str, Any]) -> Any:
            async def invoke(ctx: Any, input: str) -> str:
                try:
                    arguments = json.loads(input) if input else {}
                except ValueError as exc:
                    return f"Invalid JSON input for tool '{name}': {exc}"
                result = await self.call_tool(name, arguments)
                if result.is_error:
                    return json.dumps(result.content, ensure_ascii=False)
                return "\n".join(
                    str(item["text"])
                    if item.get("type") == "text" and "text" in item
                    else json.dumps(item, ensure_ascii=False)
                    for item in result.content
                )

            try:
                return FunctionTool(
                    name=name,
                    description=description,
                    params_json_schema=schema,
                    on_invoke_tool=invoke,
                    strict_json_schema=True,
                )
            except UserError as exc:  # a schema strict mode cannot take: send it as it is
                log.warning(
                    "tool %s: its schema cannot be strict (%s); sent with strict_json_schema=False",
                    name,
                    exc,
                    extra={"env": self.env_name, "tool": name},
                )
                return FunctionTool(
                    name=name,
                    description=description,
                    params_json_schema=schema,
                    on_invoke_tool=invoke,
                    strict_json_schema=False,
                )

        tools = await self.list_tools()
        return [
            make(
                str(tool["name"]),
                str(tool.get("description") or ""),
                tool["inputSchema"]
                if isinstance(tool.get("inputSchema"), dict)
                else {"type": "object", "properties": {}},
            )
            for tool in tools
        ]

    def _tool_name(self, tool_name: str) -> str:
        if "/" not in tool_name:
            return tool_name
        env, tool = tool_name.split("/", 1)
        if env != self.env_name:
            raise ToolError(
                f"Tool '{tool_name}' not found in environment '{self.env_name}'",
                tool_name=tool_name,
            )
        return tool

    async def call_tool(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
    ) -> ToolResult:
        """Call a tool (``"tool"`` or ``"env_name/tool"``); see the module docstring for what
        comes back and what raises."""
        self._require_data_plane("call_tool")
        native = await self._open()
        if self._failures >= _CIRCUIT_BREAKER:
            raise UnrecoverableEnvironmentError(
                f"Circuit breaker open: {self._failures} consecutive failures",
                env_name=self.env_name,
            )
        plain = self._tool_name(tool_name)
        try:
            result = await native.call_tool(plain, arguments, timeout=timeout)
        except AEnvError as exc:
            self._failures += 1
            raise ToolError(f"Tool '{plain}' execution failed: {exc}", tool_name=plain) from exc
        if result.error_kind is aenv_ray.ToolErrorKind.TIMEOUT:
            self._failures += 1
            raise ToolTimeoutError(
                f"Tool '{plain}' execution failed: {result.text}",
                tool_name=plain,
                timeout=timeout,
            )
        self._failures = 0
        return ToolResult.from_result(result)

    # -- functions, reward, health ---------------------------------------------------------------
    async def list_functions(self) -> dict[str, Any]:
        """``{"total", "functions", "reward", "health"}``, each entry ``{"name", "endpoint",
        "method", "description", "parameters", "is_async"}`` (``parameters`` as AEnvironment
        shows them: ``{name: {"type": "<class 'str'>", "default": ...}}``)."""
        self._require_data_plane("list_functions")
        native = await self._open()
        try:
            listing = await native.list_functions()
        except AEnvError as exc:
            raise EnvironmentError(
                f"Failed to list functions for environment '{self.env_name}': {exc}",
                env_name=self.env_name,
            ) from exc
        for group in ("functions", "reward", "health"):
            for entry in listing.get(group) or []:
                schema = entry.get("parameters")
                entry["parameters"] = python_parameters(schema if isinstance(schema, dict) else {})
        return listing

    async def call_function(
        self,
        function_name: str,
        arguments: dict[str, Any],
        timeout: float | None = None,
    ) -> Any:
        """Call a ``@register_function``; return its value. :class:`EnvironmentError` when it
        is unknown, refuses the arguments, raises or times out."""
        self._require_data_plane("call_function")
        native = await self._open()
        try:
            return await native.call_function(function_name, arguments, timeout=timeout)
        except AEnvError as exc:
            raise EnvironmentError(
                f"Function '{function_name}' execution failed: {exc}", env_name=self.env_name
            ) from exc

    async def call_reward(self, arguments: dict[str, Any], timeout: float | None = None) -> Any:
        """Call the ``@register_reward``; return its value (:class:`EnvironmentError` as
        :meth:`call_function`)."""
        self._require_data_plane("call_reward")
        native = await self._open()
        try:
            return await native.call_reward(arguments, timeout=timeout)
        except AEnvError as exc:
            raise EnvironmentError(
                f"Reward execution failed: {exc}", env_name=self.env_name
            ) from exc

    async def check_health(
        self, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """The health check's answer as AEnvironment returns it: ``{"success": True, "data":
        report}`` (``report["status"]`` says healthy or not); ``arguments`` go to a health
        check that takes parameters. :class:`EnvironmentError` when it raised."""
        self._require_data_plane("check_health")
        native = await self._open()
        try:
            report = await native.check_health(timeout, arguments=arguments or None)
        except AEnvError as exc:
            raise EnvironmentError(
                f"Health function execution failed: {exc}", env_name=self.env_name
            ) from exc
        return {"success": True, "data": report}

    def __repr__(self) -> str:
        return f"aenv.Environment({self.env_name!r}, native={self._native!r})"
