"""``Lease``: one pooled instance, yours until you release it; its calls return ``ObjectRef``\\ s.

A lease is a small picklable value (the pool actor's handle and ids): pass it to any
``ray.remote`` task or actor and call it there. Each call is one actor call and returns a
``ray.ObjectRef`` that resolves to the :class:`~aenv_ray.ToolResult` (or value), or raises the
typed :mod:`aenv_ray.errors` exception (``ray.get`` raises a subclass of both Ray's
``RayTaskError`` and that exception; :func:`rollout.get` raises the exception itself).

    lease = pool.acquire(timeout=10)
    ref = lease.call_tool("execute_command", {"command": "ls"})
    result = rollout.get(ref, timeout=30)
    lease.release()
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from aenv_ray import ToolResult

__all__ = ["Lease", "LeaseInfo", "Owner", "current_owner"]


@dataclass(frozen=True)
class Owner:
    """Who holds a lease: the Ray job, and the actor or process (on which node), that
    acquired it."""

    job_id: str
    actor_id: str | None = None
    pid: int = 0
    node_id: str = ""


_owner: tuple[int, Owner] | None = None


def current_owner() -> Owner:
    """The :class:`Owner` of leases acquired from here (cached per process)."""
    global _owner
    pid = os.getpid()
    if _owner is None or _owner[0] != pid:
        context = ray.get_runtime_context()
        actor = context.get_actor_id()
        owner = Owner(context.get_job_id(), actor, pid, context.get_node_id())
        _owner = (pid, owner)
    return _owner[1]


@dataclass(frozen=True)
class LeaseInfo:
    """What a pool actor grants: the lease id and the instance behind it."""

    lease_id: str
    instance_id: str
    env_name: str
    url: str | None
    pool: str


@dataclass(frozen=True)
class Lease:
    """A leased instance; see the module docstring. Use as ``with`` to release at the end."""

    info: LeaseInfo
    actor: Any  # the pool actor's handle (ray.actor.ActorHandle)

    @property
    def lease_id(self) -> str:
        """The pool's id for this lease."""
        return self.info.lease_id

    @property
    def instance_id(self) -> str:
        """The engine's id of the leased instance."""
        return self.info.instance_id

    @property
    def env_name(self) -> str:
        """``name@version`` of the leased instance."""
        return self.info.env_name

    def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ray.ObjectRef[ToolResult]:
        """``ObjectRef`` of :meth:`aenv_ray.Environment.call_tool`: a :class:`ToolResult`."""
        ref: ray.ObjectRef[ToolResult]
        ref = self.actor.call_tool.remote(self.info.lease_id, name, arguments, timeout)
        return ref

    def call_function(
        self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ray.ObjectRef[Any]:
        """``ObjectRef`` of :meth:`aenv_ray.Environment.call_function`: its JSON value."""
        ref: ray.ObjectRef[Any]
        ref = self.actor.call_function.remote(self.info.lease_id, name, arguments, timeout)
        return ref

    def call_reward(
        self, arguments: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ray.ObjectRef[Any]:
        """``ObjectRef`` of :meth:`aenv_ray.Environment.call_reward`: the reward's value."""
        ref: ray.ObjectRef[Any] = self.actor.call_reward.remote(
            self.info.lease_id, arguments, timeout
        )
        return ref

    def list_tools(self) -> ray.ObjectRef[list[dict[str, Any]]]:
        """``ObjectRef`` of :meth:`aenv_ray.Environment.list_tools`."""
        ref: ray.ObjectRef[list[dict[str, Any]]] = self.actor.list_tools.remote(self.info.lease_id)
        return ref

    def renew(self) -> ray.ObjectRef[None]:
        """Keep the lease from being reclaimed as idle (each call renews it as well)."""
        ref: ray.ObjectRef[None] = self.actor.renew.remote(self.info.lease_id)
        return ref

    def release(self) -> ray.ObjectRef[bool]:
        """Give the instance back (it is deleted; the pool makes a fresh one). Idempotent.

        Returns at once; the ``ObjectRef`` resolves to True once the pool took it back (False if
        the lease had already ended).
        """
        ref: ray.ObjectRef[bool] = self.actor.release.remote(self.info.lease_id)
        return ref

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Lease({self.info.env_name!r}, lease={self.info.lease_id}, "
            f"instance={self.info.instance_id}, pool={self.info.pool!r})"
        )
