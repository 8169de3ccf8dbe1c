"""``PoolSpec``: what a pool's instances are and how they are kept, a small picklable value.

Every pool actor receives the same spec; it builds its engine (``engine="local"``: one
:class:`~local_backend.LocalEngine` per actor process; ``engine="kubernetes"``: one
:class:`~k8s_backend.KubernetesEngine` per actor, whose pods end with the actor) and opens each
instance as an :class:`~aenv_ray.Environment` on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aenv_ray import Environment
from aenv_ray.config import parse_duration
from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    SandboxEngine,
    engine_names,
    new_engine,
)
from aenv_ray.errors import ConfigurationError

__all__ = ["EngineFactory", "HubEngine", "PoolSpec"]

EngineFactory = Callable[[], SandboxEngine]
"""A picklable zero-argument callable that builds an engine in the pool actor's process."""


@dataclass(frozen=True)
class HubEngine:
    """An :data:`EngineFactory` for pools whose instances an EnvHub creates (the hub's engine,
    its warm pools, its tenants' quotas): a client of the hub at ``url``, built in each pool
    actor. Calls go straight to an instance when the actor reaches it and through the hub's
    proxy otherwise (``route``: ``auto``, ``direct`` or ``proxy``, as ``AENV_HUB_ROUTE``)."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    route: str = "auto"
    connect_timeout: float = 5.0

    def __call__(self) -> SandboxEngine:
        from aenv_ray.hub import HubClient, RemoteEngine

        client = HubClient(self.url, api_key=self.api_key)
        return RemoteEngine(client, route=self.route, connect_timeout=self.connect_timeout)


@dataclass(frozen=True)
class PoolSpec:
    """The instances of one pool: an environment and how to run and keep them.

    ``env_name`` is ``name@version`` (found by name in each actor: built-ins, then
    ``AENV_ENV_PATH``) unless ``project`` gives the project directory. ``lease_timeout`` is how
    long a lease may sit without a call before the pool takes it back.
    """

    env_name: str
    name: str
    project: str | None = None
    engine: str | EngineFactory = "local"
    ttl: float | None = None
    environment_variables: Mapping[str, str] = field(default_factory=dict, repr=False)
    arguments: Sequence[str] = ()
    datasource: str = ""
    call_timeout: float | None = None
    startup_timeout: float = 60.0
    lease_timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.lease_timeout <= 0 or self.startup_timeout <= 0:
            raise ConfigurationError(
                f"pool `{self.name}`: lease_timeout and startup_timeout must be positive seconds"
            )
        known = engine_names()
        names = " or ".join(repr(n) for n in known)
        if not isinstance(self.engine, str) and not callable(self.engine):
            raise ConfigurationError(
                f"pool `{self.name}`: engine must be {names} or a zero-argument engine factory"
            )
        if isinstance(self.engine, str) and self.engine not in known:
            raise ConfigurationError(
                f"pool `{self.name}`: unknown engine {self.engine!r}; use {names} or pass a "
                "zero-argument callable that returns a SandboxEngine"
            )

    @staticmethod
    def parse_ttl(ttl: str | float | None) -> float | None:
        """``"30m"``, ``"1h"`` or seconds, as seconds."""
        return parse_duration(ttl) if ttl is not None else None

    def make_engine(self) -> SandboxEngine:
        """The engine of one pool actor."""
        if callable(self.engine):
            return self.engine()
        return new_engine(self.engine)  # the engine's package is imported only here, in the actor

    @property
    def owner(self) -> str:
        """The owner every instance of the pool carries."""
        return f"rollout:{self.name}"

    def instance_spec(self) -> InstanceSpec:
        """What one instance is made of, for engines that keep warm pools themselves
        (:class:`~aenv_ray.engine.WarmPoolEngine`)."""
        return InstanceSpec(
            env_ref=self.env_name,
            project=self.project,
            ttl=self.ttl,
            environment_variables=dict(self.environment_variables),
            arguments=tuple(self.arguments),
            datasource=self.datasource or None,
            owner=self.owner,
        )

    def adopt(self, engine: SandboxEngine, info: InstanceInfo) -> Environment:
        """A new (not yet initialized) :class:`~aenv_ray.Environment` for an instance that
        ``engine`` handed over (a warm pool's claim)."""
        return Environment.adopt(
            engine, info, timeout=self.call_timeout, startup_timeout=self.startup_timeout
        )

    def environment(self, engine: SandboxEngine | None) -> Environment:
        """A new (not yet initialized) :class:`~aenv_ray.Environment` for one instance."""
        # one set of keywords for both constructors (from_project takes **kwargs: Any); the
        # values' types differ per key, which a dict's type cannot say
        kwargs: dict[str, Any] = {
            "ttl": self.ttl,
            "environment_variables": dict(self.environment_variables),
            "arguments": list(self.arguments),
            "datasource": self.datasource,
            "timeout": self.call_timeout,
            "startup_timeout": self.startup_timeout,
            "owner": self.owner,
            "engine": engine,
        }
        if self.project is not None:
            return Environment.from_project(self.project, **kwargs)
        return Environment(self.env_name, **kwargs)
