"""Where episodes get their instances: the :class:`InstanceSource` contract and its SDK form.

An episode (a gymnasium step loop, a synthesis job) needs a fresh instance, calls it, and gives it
back. :class:`SDKSource` creates one :class:`aenv_ray.Environment` per acquire (the local engine
when no server is configured); :class:`PoolSource` leases warm instances of a Ray
:class:`~rollout.pool.RolloutPool` and awaits each call's ``ObjectRef``.

    source = SDKSource("mini-terminal@1.0.0")
    env = await source.acquire()
    await env.call_tool("execute_command", {"command": "ls"})
    await source.release(env)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aenv_ray import Environment, ToolResult

if TYPE_CHECKING:
    import ray

    from aenv_ray.engine import SandboxEngine
    from rollout.lease import Lease

__all__ = ["InstanceHandle", "InstanceSource", "PoolSource", "SDKSource"]

T = TypeVar("T")


class InstanceHandle(Protocol):
    """What an episode needs of one instance (:class:`aenv_ray.Environment` has it)."""

    instance_id: str | None

    async def list_tools(self) -> list[dict[str, Any]]: ...

    async def list_openai_tools(self) -> list[dict[str, Any]]: ...

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> ToolResult: ...

    async def call_function(
        self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any: ...

    async def call_reward(
        self, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any: ...


class InstanceSource(Protocol):
    """Where an episode's instances come from, and where they go back."""

    @property
    def label(self) -> str:
        """Names the environment in messages and thread names."""
        ...

    async def acquire(self) -> InstanceHandle: ...

    async def release(self, instance: InstanceHandle, *, broken: bool = False) -> None:
        """Give ``instance`` back (``broken``: it failed, do not reuse it)."""
        ...


@dataclass(frozen=True)
class SDKSource:
    """Instances from :class:`aenv_ray.Environment`: by name (``"name@version"``) or, when
    ``env_name`` names a directory (it contains a path separator), from that project."""

    env_name: str
    timeout: float | None = None
    startup_timeout: float | None = None
    ttl: str | float | None = None
    environment_variables: Mapping[str, str] | None = None
    engine: SandboxEngine | str | None = None  # an engine, or its name (None: the default)
    owner: str = "rollout"
    datasource: str = ""  # mounted at /data (a directory; a hub's: under its datasource root)

    @property
    def label(self) -> str:
        return self.env_name

    @property
    def is_project(self) -> bool:
        return "/" in self.env_name or "\\" in self.env_name

    async def acquire(self) -> Environment:
        kwargs: dict[str, Any] = {
            "ttl": self.ttl,
            "environment_variables": dict(self.environment_variables or {}),
            "timeout": self.timeout,
            "startup_timeout": self.startup_timeout,
            "owner": self.owner,
            "engine": self.engine,
            "datasource": self.datasource,
        }
        if self.is_project:
            env = Environment.from_project(Path(self.env_name), **kwargs)
        else:
            env = Environment(self.env_name, **kwargs)
        try:
            await env.initialize()
        except BaseException:
            await env.release()
            raise
        return env

    async def release(self, instance: InstanceHandle, *, broken: bool = False) -> None:
        assert isinstance(instance, Environment)
        await instance.release()


class _LeaseHandle:
    """A :class:`~rollout.lease.Lease` as an :class:`InstanceHandle`: each call awaits its
    ``ObjectRef``. Ray's errors are translated here, once (:func:`rollout._ray.translate`): an
    error the instance raised comes out as itself, a pool actor that died under the call as
    :class:`~aenv_ray.errors.LeaseLostError`, never as Ray's wrapper."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.instance_id: str | None = lease.instance_id

    async def _result(self, ref: ray.ObjectRef[T], what: str) -> T:
        try:
            return await ref
        except Exception as exc:
            from ray.exceptions import RayError  # loaded already: the lease came from Ray

            from rollout._ray import translate

            if not isinstance(exc, RayError):
                raise
            translated = translate(exc, what=f"{what} on {self.lease!r}")
            if translated is exc:
                raise
            raise translated from exc

    async def list_tools(self) -> list[dict[str, Any]]:
        return await self._result(self.lease.list_tools(), "listing the tools")

    async def list_openai_tools(self) -> list[dict[str, Any]]:
        from aenv_ray.openai_tools import to_openai_tools

        return to_openai_tools(self.lease.env_name, await self.list_tools())

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> ToolResult:
        ref = self.lease.call_tool(tool_name, arguments, timeout=timeout)
        return await self._result(ref, f"calling `{tool_name}`")

    async def call_function(
        self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        ref = self.lease.call_function(name, arguments, timeout=timeout)
        return await self._result(ref, f"calling function `{name}`")

    async def call_reward(
        self, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        return await self._result(self.lease.call_reward(arguments, timeout=timeout), "the reward")

    async def release(self) -> None:
        await self._result(self.lease.release(), "releasing")


@dataclass
class PoolSource:
    """Leases of a :class:`~rollout.pool.RolloutPool`: warm instances on Ray, every call a
    future. A released instance is deleted and the pool warms a fresh one, so every episode
    gets a fresh instance."""

    pool: Any  # rollout.pool.RolloutPool
    acquire_timeout: float = 120.0
    release_timeout: float = 30.0

    @property
    def label(self) -> str:
        return str(self.pool.spec.env_name)

    async def acquire(self) -> InstanceHandle:
        import asyncio

        lease = await asyncio.to_thread(self.pool.acquire, timeout=self.acquire_timeout)
        return _LeaseHandle(lease)

    async def release(self, instance: InstanceHandle, *, broken: bool = False) -> None:
        import asyncio

        assert isinstance(instance, _LeaseHandle)
        await asyncio.wait_for(instance.release(), self.release_timeout)
