"""The proxy routes: ``/v1/instances/{iid}/proxy/{path}`` (the instance's runtime) and
``/v1/services/{sid}/proxy/{path}`` (a running replica, round-robin), each through the hub's
:class:`~envhub.routes.forward.Forwarder`.

One path below the first needs no key: ``GET``/``HEAD``
``/v1/instances/{iid}/proxy/aenv/v1/preview/{capability}/{file}``, the instance's preview, which
a person opens in a browser (it cannot send the key). The capability in the path is the
authority, checked by the instance's runtime; the hub forwards only to that runtime's preview
route: a path part that decodes to ``.`` or ``..`` (or holds a separator) is refused here, and
every part is re-encoded, so no path can reach another route of the runtime with its token.
An unknown or ended instance gets the words of the runtime's refusal of a wrong capability.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from aenv_ray.errors import CapacityError, InstanceExpiredError, InstanceNotFoundError
from envhub.routes.context import Who, serving

__all__ = ["router"]

router = APIRouter()

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


_PREVIEW = "aenv/v1/preview/"
_NO_PREVIEW = "no such preview: the address is wrong or its instance has ended\n"  # the runtime's


# before the general proxy route: the first route that matches a path serves it
@router.api_route(
    "/v1/instances/{iid}/proxy/" + _PREVIEW + "{path:path}",
    methods=["GET", "HEAD"],
    tags=["instances"],
)
async def instance_preview(iid: str, path: str, request: Request) -> Response:
    """The instance's preview (no key: the capability in the path is the authority)."""
    hub = serving(request)
    parts = path.split("/")  # decoded: a `%2F` in a part is a separator by now
    plain = not any(part in (".", "..") or "\\" in part for part in parts)
    target = await hub.control.preview_target(iid) if plain else None
    if target is None:
        return PlainTextResponse(_NO_PREVIEW, status_code=404)
    url, token = target
    return await hub.forwarder.forward_preview(request, url, _PREVIEW, parts, token)


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
    started = time.perf_counter()
    try:
        return await hub.forwarder.forward(request, doc["url"], path, doc.get("token"))
    finally:
        hub.metrics.proxied_request("instance", path, time.perf_counter() - started)


@router.api_route("/v1/services/{sid}/proxy/{path:path}", methods=_METHODS, tags=["services"])
async def service_proxy(sid: str, path: str, request: Request, who: Who) -> Response:
    """One running replica of the service, in turn."""
    hub = serving(request)
    targets = await hub.control.service_targets(who, sid)
    if not targets:
        raise CapacityError(f"service {sid} has no running replica now; try again shortly")
    endpoint, token = targets[hub.forwarder.next_turn() % len(targets)]
    started = time.perf_counter()
    try:
        return await hub.forwarder.forward(request, endpoint, path, token)
    finally:
        hub.metrics.proxied_request("service", path, time.perf_counter() - started)
