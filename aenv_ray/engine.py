"""The sandbox engine contract: what creates, tracks and destroys environment instances.

Every engine (the local engine in ``local_backend``, the Kubernetes engine in
``k8s_backend``, a third party's) implements :class:`SandboxEngine`; nothing above it (the SDK,
pools, EnvHub) knows which one runs: an engine is made by name (:func:`new_engine`), through the
``aenv_ray.engines`` entry points. Values crossing the boundary are small frozen dataclasses,
so engines can live in another process (the local engine daemon, EnvHub) behind the same
contract.

An instance moves ``PENDING -> RUNNING -> TERMINATED``; a terminated instance keeps its
:class:`TerminationReason` and a human-readable ``detail`` for as long as the engine remembers it.

    >>> spec = InstanceSpec(env_ref="mini-terminal@1.0.0", ttl=600.0)
    >>> spec.ttl
    600.0
"""

from __future__ import annotations

import atexit
import builtins
import enum
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from aenv_ray.config import DeployConfig, parse_duration
from aenv_ray.errors import ConfigurationError, InstanceUnreachableError
from aenv_ray.extras import EXTRAS, install_hint

__all__ = [
    "DEFAULT_TTL",
    "ENGINE_GROUP",
    "EndWatchingEngine",
    "InstanceInfo",
    "InstanceSpec",
    "InstanceState",
    "Route",
    "SandboxEngine",
    "ServiceEngine",
    "ServiceInfo",
    "ServiceSpec",
    "TerminationReason",
    "WarmCount",
    "WarmPoolEngine",
    "check_engine_name",
    "default_engine",
    "discard_preconnected",
    "end_watcher",
    "engine_names",
    "info_from_json",
    "info_to_json",
    "instance_ttl",
    "named_engine",
    "new_engine",
    "preconnect",
    "service_engine",
    "set_default_engine",
]


async def preconnect(
    base_url: str, path: str, *, headers: dict[str, str] | None = None, timeout: float = 2.0
) -> bool:
    """For engines: open a connection to an instance that is about to be used (``base_url``),
    see it answer ``GET path`` with 200, and keep it for the first SDK client of that origin on
    the running loop, whose first call then pays no connect (the Kubernetes engine's reserved
    warm pods). True when a connection was kept. See :func:`aenv_ray._wire.preconnect`."""
    from aenv_ray._wire import preconnect as open_ahead

    return await open_ahead(base_url, path, headers=headers, timeout=timeout)


def discard_preconnected(base_url: str) -> int:
    """For engines: close the connections :func:`preconnect` kept for ``base_url``'s origin on
    the running loop (the instance is gone, or will not be used); how many were closed."""
    from aenv_ray._wire import discard_preconnected as discard

    return discard(base_url)


DEFAULT_TTL = 30 * 60.0
"""Seconds an instance lives when neither the caller nor ``deployConfig.ttl`` says otherwise."""


def instance_ttl(requested: float | None, deploy: DeployConfig) -> float:
    """The seconds an instance lives: ``requested`` (positive and finite), else
    ``deployConfig.ttl``, else :data:`DEFAULT_TTL`; what every engine gives a new instance.

        >>> instance_ttl(None, DeployConfig(ttl="1h")), instance_ttl(None, DeployConfig())
        (3600.0, 1800.0)
        >>> instance_ttl(0, DeployConfig())
        Traceback (most recent call last):
        ...
        aenv_ray.errors.ConfigurationError: ttl must be positive seconds, got 0
    """
    if requested is not None:
        if not 0 < requested < math.inf:
            raise ConfigurationError(f"ttl must be positive seconds, got {requested!r}")
        return float(requested)
    if deploy.ttl is not None:
        return parse_duration(deploy.ttl)
    return DEFAULT_TTL


class InstanceState(enum.Enum):
    """Where an instance is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    TERMINATED = "terminated"


class TerminationReason(enum.Enum):
    """Why an instance stopped."""

    DELETED = "deleted"  # someone asked: release(), delete, or its owner went away
    EXPIRED = "expired"  # its TTL ran out
    OUT_OF_MEMORY = "out_of_memory"  # it allocated past its memory limit
    CRASHED = "crashed"  # its runtime exited or was killed by something else
    FAILED_TO_START = "failed_to_start"  # it never became healthy
    OWNER_GONE = "owner_gone"  # the process that created it died


@dataclass(frozen=True)
class InstanceSpec:
    """What to create: an environment definition and how to run it.

    ``env_ref`` names the definition (``name@version``); ``project`` is its directory when the
    caller has already resolved it. ``ttl`` is seconds (``None``: ``deployConfig.ttl``, else
    :data:`DEFAULT_TTL`). ``storage`` is persistent storage the engine mounts read-write at
    ``/storage``: a host directory for the local engine, a PersistentVolumeClaim name for
    Kubernetes. ``env_path`` is where an engine that looks names up on this host (the local
    engine, its daemon's client) finds projects besides the built-ins (``None``: the
    ``AENV_ENV_PATH`` setting); an engine with a registry of its own (a hub) ignores it.
    ``environment_variables`` may hold keys (an agent's model key): they are not in the repr.
    """

    env_ref: str
    project: str | None = None
    ttl: float | None = None
    environment_variables: Mapping[str, str] = field(default_factory=dict, repr=False)
    arguments: Sequence[str] = ()
    datasource: str | None = None
    owner: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    storage: str | None = None
    env_path: str | None = None


@dataclass(frozen=True)
class InstanceInfo:
    """What an engine knows about one instance (a snapshot; ask again for news)."""

    id: str
    env_ref: str
    state: InstanceState
    url: str | None = None
    created_at: float = 0.0  # seconds since the epoch
    expires_at: float | None = None
    reason: TerminationReason | None = None
    detail: str = ""
    owner: str | None = None
    parent: str | None = None  # the instance this one was forked from
    labels: Mapping[str, str] = field(default_factory=dict)
    # the secret every request to the instance's runtime must carry (``Authorization: Bearer``);
    # None: the runtime asks for none. Never shown in ``repr``: logs must not leak it.
    token: str | None = field(default=None, repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP headers a request to the instance's runtime needs (its token, if any).

        >>> InstanceInfo("i1", "demo@1.0.0", InstanceState.RUNNING, token="s3cret").headers
        {'Authorization': 'Bearer s3cret'}
        >>> InstanceInfo("i1", "demo@1.0.0", InstanceState.RUNNING).headers
        {}
        """
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def is_running(self) -> bool:
        """True while the instance serves calls."""
        return self.state is InstanceState.RUNNING

    def describe_end(self) -> str:
        """One sentence on why a terminated instance ended, for error messages."""
        if self.reason is None:
            return f"instance {self.id} is {self.state.value}"
        text = f"instance {self.id} ended: {self.reason.value.replace('_', ' ')}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True)
class Route:
    """How this process reaches an instance's runtime: its base URL and the headers every
    request carries (its token; a hub's key when calls go through the hub)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def direct(cls, info: InstanceInfo) -> Route:
        """The instance's own address and token: the route of every engine whose instances this
        process can reach.

        >>> Route.direct(InstanceInfo("i1", "demo@1.0.0", InstanceState.RUNNING,
        ...                           url="http://127.0.0.1:9", token="t"))
        Route(url='http://127.0.0.1:9', headers={'Authorization': 'Bearer t'})
        """
        if not info.url:
            raise InstanceUnreachableError(
                f"instance {info.id} has no address ({info.describe_end()})",
                instance_id=info.id,
            )
        return cls(info.url, info.headers)


@runtime_checkable
class SandboxEngine(Protocol):
    """Creates and tracks isolated instances of environment definitions.

    Every method is async and raises only :class:`~aenv_ray.errors.AEnvError` subclasses:
    :class:`~aenv_ray.errors.InstanceNotFoundError` for an id the engine never had or forgot,
    :class:`~aenv_ray.errors.EnvironmentNotFoundError` for an unknown definition,
    :class:`~aenv_ray.errors.CapacityError` when it cannot start more.
    """

    name: str
    closes_instances: bool
    """What :meth:`aclose` does with the instances this engine created: ``True``, it terminates
    them (the local engine: they are its processes); ``False``, they outlive this client until
    deleted or expired (the engine daemon's, a hub's: another client finds them by id)."""

    async def create(self, spec: InstanceSpec, *, timeout: float = 60.0) -> InstanceInfo:
        """Start an instance and return once it answers calls (state ``RUNNING``)."""
        ...

    async def get(self, instance_id: str) -> InstanceInfo:
        """The instance's current state; terminated ones keep their reason."""
        ...

    async def route(self, info: InstanceInfo) -> Route:
        """How this process reaches the instance (usually :meth:`Route.direct`; a hub's engine
        may route through the hub). The SDK asks this, never which engine it has."""
        ...

    async def list(self, *, env_ref: str | None = None) -> builtins.list[InstanceInfo]:
        """Instances this engine knows, newest first, optionally of one definition."""
        ...

    async def delete(self, instance_id: str) -> InstanceInfo:
        """Terminate the instance (idempotent) and return its final state."""
        ...

    async def renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        """Set the instance to expire ``ttl`` seconds from now."""
        ...

    async def fork(
        self, instance_id: str, n: int, *, timeout: float = 60.0
    ) -> builtins.list[InstanceInfo]:
        """``n`` new running instances whose state equals the instance's at this moment."""
        ...

    async def aclose(self) -> None:
        """Free this engine's resources, and terminate its instances if
        :attr:`closes_instances`. Idempotent; other calls after it raise an
        :class:`~aenv_ray.errors.AEnvError`."""
        ...


@dataclass(frozen=True)
class WarmCount:
    """A warm pool's free instances this engine started: ``ready`` to claim, ``starting``."""

    ready: int = 0
    starting: int = 0

    @property
    def total(self) -> int:
        """Ready and starting."""
        return self.ready + self.starting


@runtime_checkable
class WarmPoolEngine(Protocol):
    """An engine whose warm instances live where every client of the engine's cluster can
    claim them (the Kubernetes engine: pool-labelled pods), so that pool actors on many nodes
    share one warm pool and a claim is atomic: an instance is never handed out twice.

    ``pool`` names the pool; the engine keeps pools of different ``spec`` apart even under one
    name. Rollout pool actors use it when their engine has it (:mod:`rollout`).
    """

    async def prewarm(self, spec: InstanceSpec, *, pool: str, count: int) -> int:
        """Start ``count`` more free instances of ``spec`` in pool ``pool`` without waiting
        for them; returns how many were started."""
        ...

    async def warm_count(self, spec: InstanceSpec, *, pool: str) -> WarmCount:
        """The pool's free instances that this engine started and that still stand."""
        ...

    async def fill(self, spec: InstanceSpec, *, pool: str, count: int) -> int:
        """Start what the pool lacks to have ``count`` free instances, counting every
        client's, one client at a time (clients that each want ``count`` keep ``count`` in
        all); returns how many were started (0 too when another client is filling it)."""
        ...

    async def claim(
        self, spec: InstanceSpec, *, pool: str, timeout: float = 0.0
    ) -> InstanceInfo | None:
        """Take one ready free instance of the pool (any client's), waiting up to ``timeout``
        seconds for one; it becomes this engine's, with ``spec``'s TTL and owner from now.
        None: none was free in time."""
        ...


@dataclass(frozen=True)
class ServiceSpec:
    """What a service runs: ``replicas`` copies of a definition (the fields as in
    :class:`InstanceSpec`), kept running with no TTL; with ``storage``, one persistent volume
    every replica mounts read-write at ``/storage``."""

    service_id: str
    env_ref: str
    project: str | None = None
    replicas: int = 1
    environment_variables: Mapping[str, str] = field(default_factory=dict, repr=False)
    arguments: Sequence[str] = ()
    owner: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    storage: bool = False
    env_path: str | None = None


@dataclass(frozen=True)
class ServiceInfo:
    """What an engine knows about one service (a snapshot). ``replicas`` is what was asked,
    ``ready`` how many serve; ``endpoints`` are the ready replicas' URLs (each takes
    ``token``), ``url`` the service's own stable address where the engine has one; ``storage``
    names its volume; ``detail`` says why replicas are missing, in the engine's words."""

    id: str
    env_ref: str
    replicas: int
    ready: int
    url: str | None = None
    endpoints: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()  # the replicas, by the engine's names
    storage: str | None = None
    detail: str = ""
    token: str | None = field(default=None, repr=False)


@runtime_checkable
class ServiceEngine(Protocol):
    """An engine's long-running services, kept by the engine itself (the Kubernetes engine's
    Deployments), where a hub would otherwise keep ``replicas`` instances alive on its own.
    An engine offers it as its ``services`` attribute (:func:`service_engine`). Methods raise
    :class:`~aenv_ray.errors.AEnvError` subclasses; an unknown id is
    :class:`~aenv_ray.errors.ServiceNotFoundError`."""

    async def create(self, spec: ServiceSpec, *, timeout: float = 120.0) -> ServiceInfo:
        """Create the service; return once ``spec.replicas`` serve (the service stays when
        they do not: the error says why, and :meth:`get` goes on saying it)."""
        ...

    async def get(self, service_id: str) -> ServiceInfo:
        """The service's current state."""
        ...

    async def update(self, spec: ServiceSpec, *, timeout: float = 120.0) -> ServiceInfo:
        """Move the service to ``spec`` (replicas; version, variables, arguments: replaced
        new-first); return once it serves as asked."""
        ...

    async def delete(self, service_id: str, *, delete_storage: bool = False) -> ServiceInfo:
        """Stop the service's replicas (idempotent); its storage stays unless
        ``delete_storage``. Returns its last state."""
        ...

    async def targets(self, service_id: str) -> builtins.list[Route]:
        """How to reach each ready replica (for a proxy: called per request, kept cheap)."""
        ...


@runtime_checkable
class EndWatchingEngine(Protocol):
    """An engine that learns of an instance's end by itself (the Kubernetes engine's watch):
    an :class:`~aenv_ray.Environment` on it hears at once that its instance is gone, instead
    of waiting for a silent address to time out (on a real network a deleted pod's IP does
    not refuse connections: it stays silent)."""

    def on_end(
        self, instance_id: str, callback: Callable[[InstanceInfo], None]
    ) -> Callable[[], None]:
        """Call ``callback(info)`` once, from any thread, when instance ``instance_id`` ends
        (at once if it has); returns the function that cancels that."""
        ...


def end_watcher(engine: object) -> EndWatchingEngine | None:
    """``engine`` as an :class:`EndWatchingEngine`, or None when it cannot tell."""
    return engine if isinstance(engine, EndWatchingEngine) else None


def service_engine(engine: object) -> ServiceEngine | None:
    """``engine``'s service capability (its ``services`` attribute), or None when it has none."""
    services = getattr(engine, "services", None)
    return services if isinstance(services, ServiceEngine) else None


_default_engine: SandboxEngine | None = None
_named: dict[str, SandboxEngine] = {}
_default_lock = threading.Lock()

ENGINE_GROUP = "aenv_ray.engines"
"""The entry-point group engines are registered in: a name, and the factory that makes the engine
(called with :func:`new_engine`'s ``options``). aenv-ray registers ``local`` (the local engine in
this process), ``daemon`` (the local engine in its daemon: instances outlive the process) and
``kubernetes``; a third-party engine registers itself the same way, in its own ``pyproject.toml``::

    [project.entry-points."aenv_ray.engines"]
    docker = "my_engine:DockerEngine"
"""


def _engine_entry_points() -> dict[str, Any]:
    """``{name: entry point}`` of :data:`ENGINE_GROUP` (read once per process)."""
    from aenv_ray._entry_points import entry_points_of

    return entry_points_of(ENGINE_GROUP)


def engine_names() -> tuple[str, ...]:
    """The names :func:`new_engine` knows (every installed engine), sorted.

    >>> {"local", "daemon", "kubernetes"} <= set(engine_names())
    True
    """
    return tuple(sorted(_engine_entry_points()))


def check_engine_name(name: str) -> str:
    """``name`` when an installed engine has it; else a
    :class:`~aenv_ray.errors.ConfigurationError` listing the names there are.

        >>> check_engine_name("docker")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aenv_ray.errors.ConfigurationError: unknown engine `docker`: use one of daemon, ...
    """
    if name not in _engine_entry_points():
        raise ConfigurationError(_unknown_engine(name))
    return name


def _unknown_engine(name: str) -> str:
    known = ", ".join(engine_names()) or "none (no engine is installed: `pip install aenv-ray`)"
    return (
        f"unknown engine `{name}`: use one of {known} (an engine of another package is found "
        "once that package is installed)"
    )


def new_engine(name: str, **options: Any) -> SandboxEngine:
    """A new engine named ``name`` (one of :func:`engine_names`), made by the factory registered
    under that name in the :data:`ENGINE_GROUP` entry points with ``options`` (the engine's
    keyword arguments). Each factory reads its own settings for what ``options`` leave out
    (the Kubernetes engine: ``AENV_K8S_NAMESPACE``, ``AENV_K8S_DELIVERY``, ``KUBECONFIG``, ...;
    the daemon: ``AENV_STATE_DIR``). The SDK, pools, the hub and the CLI choose engines through
    this function: ``aenv_ray`` imports no engine itself.

        >>> new_engine("docker")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aenv_ray.errors.ConfigurationError: unknown engine `docker`: use one of daemon, ...
    """
    entry = _engine_entry_points().get(name)
    if entry is None:
        raise ConfigurationError(_unknown_engine(name))
    try:
        factory = entry.load()
    except ImportError as exc:
        missing = f"`{exc.name}`" if exc.name else "a module"
        how = f"the extra that brings it: {install_hint(name)}" if name in EXTRAS else ""
        raise ConfigurationError(
            f"engine `{name}` ({entry.value}) needs {missing}, which is not installed: install "
            f"{how or 'the package that provides it'}"
        ) from exc
    engine = factory(**options)
    return engine  # type: ignore[no-any-return]


def named_engine(name: str) -> SandboxEngine:
    """The process-wide engine of kind ``name`` (made by :func:`new_engine` on first use,
    closed at interpreter exit, its instances with it when it ``closes_instances``)."""
    with _default_lock:
        engine = _named.get(name)
        if engine is None:
            engine = new_engine(name)
            close = getattr(engine, "close", None)
            if callable(close):
                atexit.register(close)
            _named[name] = engine
        return engine


def default_engine() -> SandboxEngine:
    """The process-wide engine of every ``Environment`` not given one: the one
    :func:`set_default_engine` set, else the engine the ``AENV_ENGINE`` setting names (default
    ``local``, the embedded local engine), created on first use and closed at interpreter
    exit (its instances with it)."""
    with _default_lock:
        chosen = _default_engine
    if chosen is not None:
        return chosen
    from aenv_ray.settings import get_settings

    return named_engine(get_settings().engine)


def set_default_engine(engine: SandboxEngine | None) -> None:
    """Use ``engine`` for every ``Environment`` not given one (``None``: back to the local one)."""
    global _default_engine
    with _default_lock:
        _default_engine = engine


def info_to_json(info: InstanceInfo) -> dict[str, object]:
    """An :class:`InstanceInfo` as JSON-able data (for the engine daemon and EnvHub)."""
    return {
        "id": info.id,
        "env_ref": info.env_ref,
        "state": info.state.value,
        "url": info.url,
        "created_at": info.created_at,
        "expires_at": info.expires_at,
        "reason": info.reason.value if info.reason else None,
        "detail": info.detail,
        "owner": info.owner,
        "parent": info.parent,
        "labels": dict(info.labels),
        "token": info.token,
    }


def info_from_json(data: Mapping[str, Any]) -> InstanceInfo:
    """The inverse of :func:`info_to_json`."""
    return InstanceInfo(
        id=str(data["id"]),
        env_ref=str(data["env_ref"]),
        state=InstanceState(data["state"]),
        url=data.get("url"),
        created_at=float(data.get("created_at") or 0.0),
        expires_at=data.get("expires_at"),
        reason=TerminationReason(data["reason"]) if data.get("reason") else None,
        detail=str(data.get("detail") or ""),
        owner=data.get("owner"),
        parent=data.get("parent"),
        labels=dict(data.get("labels") or {}),
        token=data.get("token") or None,
    )
