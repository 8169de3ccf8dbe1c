"""The agent's inner environment: one instance, created at a hub, kept alive while the agent lives.

An agent instance creates its inner instance through the SDK's hub client (``AENV_SYSTEM_URL``,
``AENV_API_KEY``), with a short TTL (``AGENT_INNER_TTL``) that a task of this instance renews
every quarter of it. Whatever ends the agent instance (a release, a delete, its own TTL, a crash,
its owner's death: the engine kills it without warning) ends the renewals, and the hub expires
the inner instance at most ``AGENT_INNER_TTL`` seconds later. A reset or a failure releases it
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from aenv_ray import Environment, InstanceSpec, ToolResult
from aenv_ray.errors import AEnvError, InstanceExpiredError, InstanceNotFoundError
from aenv_ray.hub import HubClient, RemoteEngine
from builtin_envs.agent.settings import AgentSettings, redact_url

__all__ = ["InnerEnvironment", "InnerEnvironmentError"]

log = logging.getLogger("builtin_envs.agent")

_ABANDONED: list[Any] = []  # a fork's copies of its parent's handles: kept, never used or closed


class InnerEnvironmentError(Exception):
    """The inner environment could not be created, or its instance failed under a call."""


class InnerEnvironment:
    """The open inner instance: its OpenAI tool specs, its calls, its keep-alive."""

    def __init__(
        self, settings: AgentSettings, engine: RemoteEngine, env: Environment, tools: list[Any]
    ) -> None:
        self.ref = str(settings.environment)
        self.settings = settings
        self.engine = engine
        self.env = env
        self.tools: list[dict[str, Any]] = tools
        self.instance_id = str(env.instance_id)
        self._pid = os.getpid()
        self._keep_alive = asyncio.get_running_loop().create_task(self._renew_forever())

    @classmethod
    async def open(cls, settings: AgentSettings) -> InnerEnvironment:
        """Create the inner instance at the hub and list its tools."""
        ref = str(settings.environment)
        if not settings.hub_url:
            raise InnerEnvironmentError(
                f"no EnvHub to create the inner environment `{ref}` in: pass AENV_SYSTEM_URL and "
                "AENV_API_KEY in environment_variables when you create this instance (see "
                "docs/builtins.md#agent100)"
            )
        engine = RemoteEngine(
            HubClient(settings.hub_url, api_key=settings.hub_key or None),
            route=settings.hub_route,
        )
        labels = {"agent.parent": settings.instance_id} if settings.instance_id else {}
        spec = InstanceSpec(
            env_ref=ref,
            ttl=settings.inner_ttl,
            environment_variables=dict(settings.inner_variables),
            owner=f"agent {settings.instance_id}".strip(),
            labels=labels,
        )
        env: Environment | None = None
        try:
            info = await engine.create(spec, timeout=settings.tool_timeout)
            env = Environment.adopt(engine, info, timeout=settings.tool_timeout)
            await env.initialize()
            tools = await env.list_openai_tools()
        except AEnvError as exc:
            if env is not None:
                await env.release()
            await engine.aclose()
            hub = redact_url(settings.hub_url)
            raise InnerEnvironmentError(
                settings.scrub(
                    f"the inner environment `{ref}` could not be started at the hub {hub}: "
                    f"{type(exc).__name__}: {exc}"
                )
            ) from None
        log.info("inner environment ready", extra={"env": ref, "instance": env.instance_id})
        return cls(settings, engine, env, tools)

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call one of its tools (its OpenAI name, as the model saw it). A result the model can
        read, or :class:`InnerEnvironmentError` when the instance itself failed."""
        try:
            return await self.env.call_tool(name, arguments, timeout=self.settings.tool_timeout)
        except AEnvError as exc:
            raise InnerEnvironmentError(
                self.settings.scrub(
                    f"the inner environment `{self.ref}` (instance {self.instance_id}) failed "
                    f"calling `{name}`: {type(exc).__name__}: {exc}"
                )
            ) from None

    async def reward(self, arguments: dict[str, Any]) -> Any:
        """Its reward on its instance's state."""
        return await self.env.call_reward(arguments, timeout=self.settings.tool_timeout)

    async def aclose(self) -> None:
        """Stop the renewals and release the instance at the hub. Idempotent."""
        task = self._keep_alive
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.env.release()
        await self.engine.aclose()
        log.info(
            "inner environment released", extra={"env": self.ref, "instance": self.instance_id}
        )

    def abandon(self) -> None:
        """In a fork of the agent instance: this handle is its parent's (the parent renews and
        releases that instance); keep it unused, never closed from here."""
        _ABANDONED.append(self)

    async def _renew_forever(self) -> None:
        ttl = self.settings.inner_ttl
        while True:
            await asyncio.sleep(ttl / 4)
            if os.getpid() != self._pid:  # a copy in a fork: the parent renews
                return
            try:
                await self.engine.renew(self.instance_id, ttl)
            except (InstanceNotFoundError, InstanceExpiredError) as exc:
                log.warning(
                    "inner environment ended",
                    extra={"instance": self.instance_id, "reason": type(exc).__name__},
                )
                return
            except AEnvError as exc:  # the hub is down for a moment: try again next time
                log.warning(
                    "renewing the inner environment failed",
                    extra={"instance": self.instance_id, "error": type(exc).__name__},
                )
