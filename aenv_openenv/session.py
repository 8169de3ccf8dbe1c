"""One OpenEnv session over one aenv-ray instance: what an OpenEnv message does to it.

The mapping (docs/ecosystem.md, "OpenEnv"):

==========================================  =====================================================
OpenEnv                                     aenv-ray
==========================================  =====================================================
a session (a ``/ws`` connection, or         one instance (``Environment(ref, engine=...)``),
``openenv/session/create`` on ``/mcp``)     created when the session starts, released when it
                                            closes or its client goes away
``reset``                                   a new episode: the session's fresh instance on the
                                            first reset, else a new instance in place of the old
                                            one (released); observation: the tools
``step {"tool": T, "arguments": A}``        ``call_tool(T, A)``; observation: the result
(or OpenEnv's MCP action ``{"type":         (``content``, ``text``, ``is_error``,
"call_tool", "tool_name": T, ...}``)        ``error_kind``, ``structured``, and ``result``:
                                            the structured result, else the text), ``reward``
                                            null
``step {"tool": "reward", "arguments": A}`` ``call_reward(A)``: ``reward`` its number (a mapping's
                                            ``"reward"``, or ``"score"``), ``done`` true
``step {"type": "list_tools"}``             ``list_tools()``: OpenEnv's ``Tool`` shapes
``state``                                   ``episode_id``, ``step_count``, ``done``, the ref and
                                            the instance's id
MCP ``tools/list``, ``tools/call``          ``list_tools()``, ``call_tool()`` (no reward)
==========================================  =====================================================

``reward`` can never be a tool's name in aenv-ray (the runtime reserves it), so the reward
action cannot be mistaken for a tool call. A step after ``done`` is refused until the next
``reset``. A failure of the instance (it broke, a call timed out) is an error answer, never an
observation: it is not the agent's doing.

May import: ``aenv_ray``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aenv_ray import Environment
from aenv_ray.errors import ToolArgumentError
from aenv_ray.protocol import ToolResult

__all__ = ["REWARD_ACTION", "ActionError", "ToolSession", "reward_number"]

REWARD_ACTION = "reward"
"""The ``tool`` of the step that asks for the episode's reward (a name no tool may have)."""


class ActionError(ValueError):
    """A message or action the session cannot run (the client's mistake, answered as an error
    frame; the session serves on)."""


def reward_number(value: Any) -> float | None:
    """The reward OpenEnv reports for what ``call_reward`` returned: a number as it is, a
    mapping's ``"reward"`` (else ``"score"``), ``None`` for anything else.

    >>> reward_number(1), reward_number({"reward": 0.5, "why": "half"}), reward_number("x")
    (1.0, 0.5, None)
    """
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        for key in ("reward", "score"):
            if key in value:
                return reward_number(value[key])
    return None


def _plain(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def openenv_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """aenv-ray's tool listing as OpenEnv's ``Tool`` objects (``name``, ``description``,
    ``input_schema``; ``inputSchema`` too, MCP's spelling).

    >>> openenv_tools([{"name": "e@1/echo", "description": "d", "inputSchema": {}}])[0]["name"]
    'echo'
    """
    return [
        {
            "name": _plain(tool["name"]),
            "description": tool.get("description", ""),
            "input_schema": tool.get("inputSchema", {}),
            "inputSchema": tool.get("inputSchema", {}),
        }
        for tool in tools
    ]


def _result(result: ToolResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": result.content,
        "text": result.text,
        "is_error": result.is_error,
        # OpenEnv's CallToolObservation.result: the structured result, else the text
        "result": result.structured if result.structured is not None else result.text,
    }
    if result.error_kind is not None:
        out["error_kind"] = result.error_kind.value
    if result.structured is not None:
        out["structured"] = result.structured
    return out


def _step_payload(observation: dict[str, Any], reward: float | None, done: bool) -> dict[str, Any]:
    return {"observation": observation, "reward": reward, "done": done}


class ToolSession:
    """One OpenEnv session: an aenv-ray instance and its episode's count. ``make`` returns a new,
    not yet initialized :class:`~aenv_ray.Environment`; the session initializes it in
    :meth:`start` and releases it in :meth:`close` (and on each ``reset`` after the first)."""

    def __init__(self, make: Callable[[], Environment], env_ref: str) -> None:
        self.id = str(uuid.uuid4())
        self.env_ref = env_ref
        self._make = make
        self._env: Environment | None = None
        self._lock = asyncio.Lock()  # one message at a time: an instance serves one episode
        self.episode_id: str | None = None
        self.step_count = 0
        self.done = False
        self._used = False  # the current instance has served a call: a reset replaces it
        self.closed = False
        self.last_active = time.monotonic()  # when a message last began or ended
        self.busy = 0  # messages in progress: a busy session is never idle
        self.expired = False  # closed by the server's idle reaper

    @contextlib.asynccontextmanager
    async def using(self) -> AsyncIterator[None]:
        """One message's span: the session is busy during it, active at both ends."""
        self.busy += 1
        self.last_active = time.monotonic()
        try:
            yield
        finally:
            self.busy -= 1
            self.last_active = time.monotonic()

    async def start(self) -> None:
        """Create and initialize the session's instance (raises the engine's typed errors)."""
        env = self._make()
        try:
            await env.initialize()
        except BaseException:
            await env.release()
            raise
        self._env = env

    @property
    def environment(self) -> Environment:
        if self._env is None or self.closed:
            raise ActionError("the session is closed")
        return self._env

    async def close(self) -> None:
        """Release the instance (idempotent)."""
        self.closed = True
        env, self._env = self._env, None
        if env is not None:
            await env.release()

    # -- the simulation API (/ws, /reset, /step) ----------------------------------------------

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        """A new episode on a fresh instance; the observation lists the tools."""
        async with self._lock:
            if self._used:
                old = self.environment
                fresh = self._make()
                try:
                    await fresh.initialize()
                except BaseException:
                    await fresh.release()
                    raise
                self._env = fresh
                await old.release()
            env = self.environment
            episode = data.get("episode_id")
            self.episode_id = str(episode) if episode is not None else str(uuid.uuid4())
            self.step_count = 0
            self.done = False
            self._used = True
            tools = openenv_tools(await env.list_tools())
            observation = {
                "env": self.env_ref,
                "instance_id": env.instance_id,
                "episode_id": self.episode_id,
                "tools": tools,
            }
            return _step_payload(observation, None, False)

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """Run one action (see the module's table) and return OpenEnv's step payload."""
        async with self._lock:
            if not isinstance(action, dict):
                raise ActionError(f"an action is a JSON object, got {type(action).__name__}")
            if action.get("type") == "list_tools":
                tools = openenv_tools(await self.environment.list_tools())
                return _step_payload({"tools": tools}, None, self.done)
            name, arguments = self._call_of(action)
            if self.done:
                raise ActionError("the episode is done (its reward was given): send reset first")
            self._used = True
            self.step_count += 1
            if name == REWARD_ACTION:
                value = await self.environment.call_reward(arguments)
                self.done = True
                reward = reward_number(value)
                return _step_payload({"tool": REWARD_ACTION, "value": value}, reward, True)
            result = await self.environment.call_tool(name, arguments)
            observation = {"tool": name, "tool_name": name, **_result(result)}
            return _step_payload(observation, None, False)

    @staticmethod
    def _call_of(action: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if action.get("type") == "call_tool":
            name, arguments = action.get("tool_name"), action.get("arguments", {})
        else:
            name, arguments = action.get("tool"), action.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise ActionError(
                'an action is {"tool": NAME, "arguments": {...}} (or {"tool": "reward", '
                '"arguments": {...}} for the reward, {"type": "list_tools"} for the tools); '
                f"got keys {sorted(action)}"
            )
        if not isinstance(arguments, dict):
            raise ActionError(f"`arguments` of `{name}` is a JSON object")
        return name, arguments

    def state(self) -> dict[str, Any]:
        """OpenEnv's ``State``: ``episode_id`` and ``step_count``, with aenv-ray's own fields."""
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "done": self.done,
            "env": self.env_ref,
            "instance_id": self._env.instance_id if self._env is not None else None,
        }

    # -- the MCP API (/mcp) ------------------------------------------------------------------

    async def mcp_list_tools(self) -> list[dict[str, Any]]:
        async with self._lock:
            return openenv_tools(await self.environment.list_tools())

    async def mcp_call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """MCP's ``tools/call`` result (``content``, ``isError``, ``structuredContent``) with
        ``data`` (the structured result, else the text), which OpenEnv's MCP client returns."""
        if name == REWARD_ACTION:
            raise ToolArgumentError("`reward` is not a tool: step the reward action on /ws")
        async with self._lock:
            self._used = True
            self.step_count += 1
            result = await self.environment.call_tool(name, arguments)
        out: dict[str, Any] = {
            "content": result.content,
            "isError": result.is_error,
            "data": result.structured if result.structured is not None else result.text,
        }
        if result.structured is not None:
            out["structuredContent"] = result.structured
        return out
