"""The proxy routes: ``/v1/instances/{iid}/proxy/{path}`` (the instance's runtime) and
``/v1/services/{sid}/proxy/{path}`` (a running replica, round-robin), each through the hub's
:class:`~envhub.routes.forward.Forwarder`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from aenv_ray.errors import CapacityError, InstanceExpiredError, InstanceNotFoundError
from envhub.routes.context import Who, serving

__all__ = ["router"]

router = APIRouter()

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@router.api_route("/v1/instances/{iid}/proxy/{path:path}", methods=_METHODS, tags=["instances"])
async def instance_proxy(iid: str, path: str, request: Request, who: Who) -> Response:
    """The instance's runtime API (tools, MCP at ``mcp``, functions, reward, health)."""
    hub = serving(request)
    doc = await hub.control.get_instance(who, iid)
    if doc["state"] != "running" or not doc.get("url"):
        if doc.get("reason") == "expired":
            raise InstanceExpiredError(f"instance {iid} expired; create a new one", instance_id=iid)
        raise InstanceNotFoundError(
            f"instance {iid} is {doc['state']} ({doc.get('reason') or 'not ready'})",
            instance_id=iid,
        )
    return await hub.forwarder.forward(request, doc["url"], path, doc.get("token"))


@router.api_route("/v1/services/{sid}/proxy/{path:path}", methods=_METHODS, tags=["services"])
async def service_proxy(sid: str, path: str, request: Request, who: Who) -> Response:
    """One running replica of the service, in turn."""
    hub = serving(request)
    targets = await hub.control.service_targets(who, sid)
    if not targets:
        raise CapacityError(f"service {sid} has no running replica now; try again shortly")
    endpoint, token = targets[hub.forwarder.next_turn() % len(targets)]
    return await hub.forwarder.forward(request, endpoint, path, token)
