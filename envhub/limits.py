"""What a hub lets each tenant use: quotas (totals a tenant holds) and caps (what one instance
or one request may ask), set by the operator (``aenv serve --limits FILE``, ``--allow-network``).

======================  ========  =================================================================
limit                   default   what
======================  ========  =================================================================
``instances``           32        live instances (not service replicas) a tenant holds at once
``services``            8         services a tenant holds
``replicas``            16        replicas over all of a tenant's services
``bundle_bytes``        1G        bytes of the bundles a tenant's live versions store
``run_bytes``           8G        bytes of the records of a tenant's rollout runs on the hub
                                  (``/v1/runs``: :mod:`envhub.runs`)
``memory``              4G        ``deployConfig.memory`` of one instance
``cpu``                 4         ``deployConfig.cpu`` of one instance (cores)
``pids``                1024      ``deployConfig.pids`` of one instance
``ttl``                 24h       a create's or renew's ``ttl``; a longer ``deployConfig.ttl`` is
                                  clamped to it
``per_request``         16        instances one request starts: a fork's ``n``, a service's
                                  replicas on create, the replicas an update adds
``network``             false     may an instance have the network (``deployConfig.network``)
``pod_template_allow``  []        fields of ``deployConfig.customPodTemplate`` allowed beyond the
                                  allow-list of :mod:`aenv_ray.pod_template` (paths such as
                                  ``"spec.tolerations"``); ``aenv serve --pod-template-allow`` adds
                                  to every tenant's
======================  ========  =================================================================

A pod template's own containers are also held to ``cpu`` and ``memory``: each amount, and their
sum (the runtime container's are ``deployConfig``'s, checked above).

The file is JSON: ``{"default": {...}, "tenants": {"NAME": {...}}}``; both parts optional, every
field optional; a tenant's entry overrides the defaults field by field. Sizes are ``"512M"``,
``"4G"`` or bytes; durations ``"30m"``, ``"24h"`` or seconds.

    >>> limits = Limits.parse({"default": {"instances": 4}, "tenants": {"ci": {"network": True}}})
    >>> limits.for_tenant("ci").instances, limits.for_tenant("ci").network
    (4, True)
    >>> limits.for_tenant("alice").network
    False

May import: the standard library, ``aenv_ray`` (config parsers, errors), pydantic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from aenv_ray.config import DeployConfig, parse_cpu, parse_duration, parse_memory
from aenv_ray.engine import instance_ttl as engine_ttl
from aenv_ray.errors import ConfigurationError, PermissionDeniedError, QuotaExceededError
from aenv_ray.pod_template import PodTemplatePolicy, check_deploy_template

__all__ = [
    "Limits",
    "TenantLimits",
    "check_deploy",
    "check_per_request",
    "check_ttl",
    "instance_ttl",
    "load_limits",
    "over",
    "show",
]

GIB = 1024**3


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's quotas and caps (see the module's table)."""

    instances: int = 32
    services: int = 8
    replicas: int = 16
    bundle_bytes: int = 1 * GIB
    run_bytes: int = 8 * GIB
    memory: int = 4 * GIB
    cpu: float = 4.0
    pids: int = 1024
    ttl: float = 24 * 3600.0
    per_request: int = 16
    network: bool = False
    pod_template_allow: frozenset[str] = frozenset()

    def pod_policy(self) -> PodTemplatePolicy:
        """What this tenant's pod templates may set: the allow-list, widened by
        ``pod_template_allow``, its containers' amounts within ``cpu`` and ``memory``."""
        return PodTemplatePolicy(allow=self.pod_template_allow, cpu=self.cpu, memory=self.memory)


class _Entry(BaseModel):
    """One entry of the limits file (every field optional)."""

    model_config = ConfigDict(extra="forbid")

    instances: int | None = None
    services: int | None = None
    replicas: int | None = None
    bundle_bytes: int | None = None
    run_bytes: int | None = None
    memory: int | None = None
    cpu: float | None = None
    pids: int | None = None
    ttl: float | None = None
    per_request: int | None = None
    network: bool | None = None
    pod_template_allow: frozenset[str] | None = None

    @field_validator("pod_template_allow", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError('must be a list of field paths such as ["spec.tolerations"]')
        try:
            PodTemplatePolicy(allow=frozenset(value))
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
        return frozenset(value)

    @field_validator("bundle_bytes", "run_bytes", "memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_memory(value)

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        return None if value is None else parse_cpu(value)

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @field_validator("instances", "services", "replicas", "pids", "per_request", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError("must be a whole number")
        if value is not None and value < 0:
            raise ValueError("must be 0 or more")
        return value

    @field_validator("network", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: _Entry = _Entry()
    tenants: dict[str, _Entry] = {}


@dataclass(frozen=True)
class Limits:
    """The defaults and each named tenant's own limits."""

    default: TenantLimits = field(default_factory=TenantLimits)
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantLimits:
        """``tenant``'s limits: its own entry, else the defaults."""
        return self.tenants.get(tenant, self.default)

    def engine_pod_policy(self) -> PodTemplatePolicy:
        """The hub's engine's own pod-template policy: what any tenant may set (the union of
        every tenant's, the largest caps). The hub checks each tenant's exactly before the
        engine sees a definition; the engine's check is the backstop."""
        every = [self.default, *self.tenants.values()]
        return PodTemplatePolicy(
            allow=frozenset().union(*(t.pod_template_allow for t in every)),
            cpu=max(t.cpu for t in every),
            memory=max(t.memory for t in every),
        )

    @classmethod
    def parse(
        cls,
        data: Any,
        *,
        allow_network: bool = False,
        pod_template_allow: frozenset[str] = frozenset(),
        source: str = "limits",
    ) -> Limits:
        """Limits from the file's JSON ``data``; ``allow_network`` makes ``network`` true by
        default (a tenant's entry may still say false); ``pod_template_allow`` is added to
        every tenant's. :class:`ConfigurationError` names the field and what is wrong with
        it."""
        try:
            parsed = _File.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"`{'.'.join(str(p) for p in e['loc'])}`: {e['msg']}" for e in exc.errors()
            )
            raise ConfigurationError(f"{source} is invalid: {problems}") from None
        try:
            PodTemplatePolicy(allow=pod_template_allow)
        except ConfigurationError as exc:
            raise ConfigurationError(f"--pod-template-allow: {exc}") from None
        base = TenantLimits(network=allow_network)
        default = replace(base, **_given(parsed.default))
        tenants = {
            name: replace(default, **_given(entry)) for name, entry in parsed.tenants.items()
        }
        if pod_template_allow:
            default = _widen(default, pod_template_allow)
            tenants = {name: _widen(t, pod_template_allow) for name, t in tenants.items()}
        return cls(default=default, tenants=tenants)


def _widen(limits: TenantLimits, allow: frozenset[str]) -> TenantLimits:
    return replace(limits, pod_template_allow=limits.pod_template_allow | allow)


def _given(entry: _Entry) -> dict[str, Any]:
    return {k: v for k, v in entry.model_dump().items() if v is not None}


def load_limits(
    path: Path | None,
    *,
    allow_network: bool = False,
    pod_template_allow: frozenset[str] = frozenset(),
) -> Limits:
    """The limits in the JSON file at ``path`` (``None``: the defaults)."""
    if path is None:
        return Limits.parse({}, allow_network=allow_network, pod_template_allow=pod_template_allow)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the limits file {path}: {exc.strerror or exc} (--limits)"
        ) from exc
    except ValueError as exc:
        raise ConfigurationError(f"the limits file {path} is not JSON: {exc} (--limits)") from exc
    return Limits.parse(
        data,
        allow_network=allow_network,
        pod_template_allow=pod_template_allow,
        source=f"the limits file {path}",
    )


def show(value: float, limit: str) -> str:
    """A limit's value as a person writes it (``4.0 GiB``, ``2h``, ``3``)."""
    if limit in ("memory", "bundle_bytes", "run_bytes"):
        for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
            if value >= size:
                return f"{value / size:.3g} {unit}"
        return f"{int(value)} bytes"
    if limit == "ttl":
        if value >= 3600:
            return f"{value / 3600:.3g}h"
        return f"{value / 60:.3g}m" if value >= 60 else f"{value:.3g}s"
    return f"{value:g}"


def over(
    tenant: str, limit: str, requested: float, allowed: float, what: str, todo: str
) -> QuotaExceededError:
    """The error for ``what`` (a phrase ending in a verb: "... asks for") reaching ``requested``,
    over ``limit``'s ``allowed``; ``todo`` says what to do."""
    return QuotaExceededError(
        f"{what} {show(requested, limit)}, over the {show(allowed, limit)} this hub allows tenant "
        f"`{tenant}` (limit `{limit}`): {todo}",
        limit=limit,
        requested=requested,
        allowed=allowed,
    )


def check_deploy(limits: TenantLimits, tenant: str, ref: str, deploy: DeployConfig) -> None:
    """Refuse ``ref`` when its ``deployConfig`` asks more than ``limits`` allow one instance,
    or its ``customPodTemplate`` sets what the tenant's pod-template policy does not allow
    (:class:`~aenv_ray.errors.PodTemplateRefusedError`)."""
    todo = "ask for less in deployConfig and push a new version, or ask the hub's operator"
    asked = {
        "memory": parse_memory(deploy.memory),
        "cpu": parse_cpu(deploy.cpu),
        "pids": deploy.pids,
    }
    for limit, value in asked.items():
        allowed = getattr(limits, limit)
        if value > allowed:
            what = f"`{ref}`'s deployConfig.{limit} asks for"
            raise over(tenant, limit, value, allowed, what, todo)
    if deploy.network and not limits.network:
        raise PermissionDeniedError(
            f"`{ref}` asks for the network (deployConfig.network: true), which this hub does not "
            f"give tenant `{tenant}`'s instances; drop it from deployConfig, or ask the hub's "
            "operator (aenv serve --allow-network, or `network` in --limits)",
            env_name=ref,
        )
    check_deploy_template(deploy, limits.pod_policy(), ref=ref)


def instance_ttl(
    limits: TenantLimits, tenant: str, ref: str, requested: float | None, deploy: DeployConfig
) -> tuple[float, list[str]]:
    """The TTL an instance gets, and warnings: a requested one over the cap is refused; the
    definition's own (``deployConfig.ttl``) over the cap is clamped to it."""
    if requested is not None:
        check_ttl(limits, tenant, requested)
        return requested, []
    own = engine_ttl(None, deploy)
    if own > limits.ttl:
        return limits.ttl, [
            f"`{ref}` asks for a TTL of {show(own, 'ttl')} (deployConfig.ttl); this hub gives "
            f"at most {show(limits.ttl, 'ttl')}, so the instance has that (renew it to go on)"
        ]
    return own, []


def check_ttl(limits: TenantLimits, tenant: str, ttl: float) -> None:
    """Refuse a create's or renew's ``ttl`` over the cap."""
    if not (isinstance(ttl, int | float) and 0 < ttl < math.inf):
        raise ConfigurationError(f"ttl must be a positive number of seconds, got {ttl!r}")
    if ttl > limits.ttl:
        raise over(
            tenant,
            "ttl",
            ttl,
            limits.ttl,
            "the requested ttl is",
            "ask for less, and renew the instance when it needs more time",
        )


def check_per_request(limits: TenantLimits, tenant: str, count: int) -> None:
    """Refuse a request that starts more than ``per_request`` instances at once."""
    if count > limits.per_request:
        raise over(
            tenant,
            "per_request",
            count,
            limits.per_request,
            "this request would start instances numbering",
            "start them in several requests, or ask the hub's operator",
        )
