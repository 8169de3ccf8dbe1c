"""The service routes (``/v1/services``): create, list, get, update, delete.

What they mean is :class:`envhub.control.ControlPlane`'s; these add each record's ``address``
(the service through the hub, round-robin over its replicas: :mod:`envhub.routes.proxy`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from envhub.routes.context import HubDep, Who
from envhub.routes.models import CreateService, Service, UpdateService

__all__ = ["router", "service_out"]

router = APIRouter(tags=["services"])


def service_out(request: Request, doc: dict[str, Any]) -> dict[str, Any]:
    """A service's record as the API shows it: with its address through the hub."""
    base = str(request.base_url).rstrip("/")
    return {**doc, "address": f"{base}/v1/services/{doc['id']}/proxy"}


@router.post("/v1/services", status_code=201, response_model=Service)
async def create_service(
    body: CreateService, request: Request, who: Who, hub: HubDep
) -> dict[str, Any]:
    """Start a service; answers once its replicas serve."""
    doc = await hub.control.create_service(
        who,
        body.env,
        name=body.name,
        replicas=body.replicas,
        storage=body.storage,
        environment_variables=body.environment_variables,
        arguments=body.arguments,
    )
    return service_out(request, doc)


@router.get("/v1/services")
async def list_services(request: Request, who: Who, hub: HubDep) -> dict[str, Any]:
    """The caller's services, newest first."""
    docs = await hub.control.list_services(who)
    return {"services": [service_out(request, d) for d in docs]}


@router.get("/v1/services/{sid}", response_model=Service)
async def get_service(sid: str, request: Request, who: Who, hub: HubDep) -> dict[str, Any]:
    """One service with its replicas."""
    return service_out(request, await hub.control.get_service(who, sid))


@router.patch("/v1/services/{sid}", response_model=Service)
async def update_service(
    sid: str, body: UpdateService, request: Request, who: Who, hub: HubDep
) -> dict[str, Any]:
    """Scale, change version or variables (replicas are replaced new-first)."""
    doc = await hub.control.update_service(
        who,
        sid,
        replicas=body.replicas,
        env=body.env,
        environment_variables=body.environment_variables,
    )
    return service_out(request, doc)


@router.delete("/v1/services/{sid}")
async def delete_service(
    sid: str, request: Request, who: Who, hub: HubDep, keep_storage: bool | None = None
) -> dict[str, Any]:
    """Stop a service and its replicas. ``keep_storage=true`` keeps its storage, ``false``
    removes it; unsaid, a Kubernetes volume is kept and a directory on the hub removed."""
    doc = await hub.control.delete_service(who, sid, keep_storage=keep_storage)
    return service_out(request, doc)
