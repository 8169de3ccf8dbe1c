"""The request and response bodies of the hub's API: the OpenAPI document's schemas.

Requests forbid unknown fields (a typo is an error, not a silent default); responses allow them
(a newer hub may say more than an older client knows).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CreateInstance",
    "CreateService",
    "Deprecation",
    "Fork",
    "Instance",
    "Renew",
    "Run",
    "RunEnd",
    "RunOpen",
    "Service",
    "UpdateService",
    "Version",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class CreateInstance(_Model):
    """What to start."""

    env: str = Field(description="name@version, or name for its current version")
    ttl: str | float | None = Field(None, description='lifetime: seconds or "30m", "2h"')
    environment_variables: dict[str, str] = Field(default_factory=dict)
    arguments: list[str] = Field(default_factory=list)
    datasource: str | None = Field(
        None, description="a directory under the hub's --datasource-root, mounted at /data"
    )
    owner: str | None = Field(None, description="who holds it (free text, e.g. a job id)")
    labels: dict[str, str] = Field(default_factory=dict)


class Renew(_Model):
    """A new lifetime, counted from now."""

    ttl: str | float


class Fork(_Model):
    """How many copies."""

    n: int = Field(ge=1, le=64)


class CreateService(_Model):
    """A long-running deployment."""

    env: str
    name: str | None = None
    replicas: int = Field(1, ge=0, le=64)
    storage: bool = Field(False, description="persistent storage mounted at /storage")
    environment_variables: dict[str, str] = Field(default_factory=dict)
    arguments: list[str] = Field(default_factory=list)


class UpdateService(_Model):
    """What to change; absent fields stay."""

    replicas: int | None = Field(None, ge=0, le=64)
    env: str | None = None
    environment_variables: dict[str, str] | None = None


class Deprecation(_Model):
    """Deprecate (or undeprecate) a version."""

    deprecated: bool = True
    message: str = ""


class Instance(_Out):
    """An instance's record."""

    id: str
    env_ref: str
    state: str = Field(description="pending, running or terminated")
    url: str | None = Field(description="the runtime's own address (direct calls)")
    proxy_url: str = Field("", description="the same runtime through the hub")
    created_at: float
    expires_at: float | None
    reason: str | None = None
    detail: str = ""
    owner: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    tenant: str
    service: str | None = None
    warnings: list[str] = Field(default_factory=list)
    token: str | None = Field(
        None,
        description="the runtime's secret (send `Authorization: Bearer TOKEN` to `url`); "
        "shown to the instance's own tenant only",
    )
    publisher: str | None = Field(
        None, description="the tenant whose code it runs; null: built into the hub"
    )
    source: str | None = Field(
        None, description="what `env` resolved to (`tenant/name@version`: another tenant's)"
    )


class Version(_Out):
    """A published version."""

    name: str
    version: str
    ref: str
    digest: str
    size: int
    description: str
    tags: list[str]
    config: dict[str, Any]
    publisher: str
    published_at: float
    deprecated: bool
    deprecation: str = ""
    calls: dict[str, Any] | None = Field(
        None,
        description='what its reward, functions and tools take (`{"reward": {name, '
        'description, inputSchema} or null, "functions": [...], "tools": [...]}`; `tools` is '
        "missing from versions published before the hub stored them), as the sandbox that "
        "loaded it reported; null when the hub's engine could not load it",
    )


class Service(_Out):
    """A service and its replicas."""

    id: str
    name: str
    env_ref: str
    replicas: int
    ready: int
    storage: str | None = Field(
        description="its storage: a directory on the hub, or a PersistentVolumeClaim's name"
    )
    instances: list[str]
    endpoints: list[str]
    address: str = Field("", description="the service through the hub (round-robin)")
    url: str | None = Field(
        None,
        description="its own stable address inside its cluster (Kubernetes: the Service's "
        "DNS name); null when the engine has none",
    )
    detail: str = Field("", description="why replicas are missing, in the engine's words")
    token: str | None = Field(
        None,
        description="the replicas' runtime secret, for calls to `url` or `endpoints` (Kubernetes; "
        "shown to the service's own tenant only)",
    )


class RunOpen(_Model):
    """A rollout run to register (or, with ``id``, to take up again)."""

    name: str = Field(min_length=1, max_length=200, description="its name (the run directory's)")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="its run.json (environment, tasks, policy)"
    )
    driver: dict[str, Any] = Field(
        default_factory=dict, description="who drives it: pid, host, started, command"
    )
    id: str | None = Field(None, description="a run this tenant registered before (resumed)")


class RunEnd(_Model):
    """The end of a run."""

    state: str = Field(pattern="^finished$", description='"finished": its driver ended')


class Run(_Out):
    """A rollout run pushed to the hub (:mod:`aenv_ray.hubruns`)."""

    id: str
    name: str
    state: str = Field(description='"live" until its driver ends it, then "finished"')
    live: bool = Field(description="not ended, and its driver posted within the last minute")
    created_at: float
    beat_at: float = Field(description="its driver's last post")
    ended_at: float | None
    driver: dict[str, Any]
    received: int = Field(description="bytes of its trajectories.jsonl the hub holds")
    settings: dict[str, Any] = Field(description="its run.json")
