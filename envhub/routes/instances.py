"""The instance routes (``/v1/instances``): create, list, get, delete, renew, fork.

What they mean is :class:`envhub.control.ControlPlane`'s; these add the request's view: the
datasource a request names, checked against the hub's ``--datasource-root``, and each record's
``proxy_url`` (the runtime through the hub, :mod:`envhub.routes.proxy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from aenv_ray.config import parse_duration
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import IDEMPOTENCY_HEADER
from envhub.routes.context import HubDep, Who
from envhub.routes.models import CreateInstance, Fork, Instance, Renew

__all__ = ["datasource_path", "instance_out", "router"]

router = APIRouter(tags=["instances"])


def datasource_path(value: str | None, root: Path | None) -> str | None:
    """The directory ``value`` names under ``root`` (the hub's ``--datasource-root``), or
    ``None`` when none is asked for: a path relative to ``root``, or an absolute path under it
    (an absolute path that is not under it is read relative to it, as ``/x`` always was);
    refused when it is not a directory under ``root``."""
    if not value:
        return None
    if root is None:
        raise ConfigurationError(
            "this hub mounts no datasources: start it with --datasource-root DIR and name "
            "a directory under it"
        )
    base = root.resolve()
    given = Path(value)
    path = (base / value.lstrip("/")).resolve()
    if given.is_absolute() and given.resolve().is_relative_to(base):
        path = given.resolve()
    if not path.is_relative_to(base) or not path.is_dir():
        raise ConfigurationError(
            f"datasource `{value}` is not a directory under the hub's datasource root"
        )
    return str(path)


def instance_out(request: Request, doc: dict[str, Any]) -> dict[str, Any]:
    """An instance's record as the API shows it: with its address through the hub."""
    base = str(request.base_url).rstrip("/")
    return {**doc, "proxy_url": f"{base}/v1/instances/{doc['id']}/proxy"}


@router.post("/v1/instances", status_code=201, response_model=Instance)
async def create_instance(
    body: CreateInstance, request: Request, who: Who, hub: HubDep
) -> dict[str, Any]:
    """Start an instance; answers once it serves calls. With an ``Idempotency-Key`` header
    (8 to 128 letters, digits, ``-_.:``; a random one per create), a create of the same
    tenant with the same key answers the instance the first one started (still starting, or
    started) instead of starting another: send it again after a lost reply."""
    doc = await hub.control.create_instance(
        who,
        body.env,
        ttl=parse_duration(body.ttl) if body.ttl is not None else None,
        environment_variables=body.environment_variables,
        arguments=body.arguments,
        datasource=datasource_path(body.datasource, hub.options.datasource_root),
        owner=body.owner,
        labels=body.labels,
        idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
    )
    return instance_out(request, doc)


@router.get("/v1/instances")
async def list_instances(
    request: Request, who: Who, hub: HubDep, env: str | None = None, all: bool = False
) -> dict[str, Any]:
    """The caller's instances, newest first (``all``: terminated ones too)."""
    docs = await hub.control.list_instances(who, env=env, include_terminated=all)
    return {"instances": [instance_out(request, d) for d in docs]}


@router.get("/v1/instances/{iid}", response_model=Instance)
async def get_instance(iid: str, request: Request, who: Who, hub: HubDep) -> dict[str, Any]:
    """One instance, its state fresh from the engine."""
    return instance_out(request, await hub.control.get_instance(who, iid))


@router.delete("/v1/instances/{iid}", response_model=Instance)
async def delete_instance(iid: str, request: Request, who: Who, hub: HubDep) -> dict[str, Any]:
    """Terminate an instance (idempotent)."""
    return instance_out(request, await hub.control.delete_instance(who, iid))


@router.post("/v1/instances/{iid}/renew", response_model=Instance)
async def renew_instance(
    iid: str, body: Renew, request: Request, who: Who, hub: HubDep
) -> dict[str, Any]:
    """Expire ``ttl`` from now."""
    doc = await hub.control.renew_instance(who, iid, parse_duration(body.ttl))
    return instance_out(request, doc)


@router.post("/v1/instances/{iid}/fork", status_code=201)
async def fork_instance(
    iid: str, body: Fork, request: Request, who: Who, hub: HubDep
) -> dict[str, Any]:
    """``n`` copies of a running instance (copy-on-write where the engine can)."""
    docs = await hub.control.fork_instance(who, iid, body.n)
    return {"instances": [instance_out(request, d) for d in docs]}
