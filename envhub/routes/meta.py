"""``/v1/health`` (liveness and the store's state, without auth), ``/v1/whoami`` and
``/v1/defences`` (what the hub's defences against abuse hold now)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from aenv_ray import __version__
from aenv_ray.errors import StoreError
from aenv_ray.loadcheck import scrub_paths
from envhub.routes.context import HubDep, Who
from envhub.store import Store

__all__ = ["router"]

log = logging.getLogger("envhub.app")

router = APIRouter(tags=["meta"])


async def _probe(store: Store, timeout: float = 5.0) -> dict[str, Any]:
    """``{"ok": bool, "detail": str}``: whether ``store`` answers a read now."""
    kind = store.url.partition(":")[0]
    try:
        await asyncio.wait_for(store.get("health", "probe"), timeout)
    except StoreError as exc:
        log.warning("health: the store fails", extra={"error": str(exc)})
        return {"ok": False, "detail": str(exc)}
    except TimeoutError:
        log.warning("health: the store does not answer", extra={"timeout": timeout})
        return {"ok": False, "detail": f"the {kind} store did not answer within {timeout:g} s"}
    return {"ok": True, "detail": f"{kind} answers"}


@router.get(
    "/v1/health",
    responses={503: {"description": "the store fails: the same body, status `degraded`"}},
)
async def health(request: Request, hub: HubDep) -> JSONResponse:
    """Liveness and the store's state, without auth: 200 ``ok``, or 503 ``degraded`` when
    the store does not answer (every route that needs it would fail)."""
    store_state = await _probe(hub.store)
    store_state["detail"] = scrub_paths(store_state["detail"], request.app.state.hidden_paths)
    body = {
        "status": "ok" if store_state["ok"] else "degraded",
        "version": __version__,
        "auth": hub.options.auth,
        "store": store_state,
    }
    return JSONResponse(body, status_code=200 if store_state["ok"] else 503)


@router.get("/v1/whoami")
async def whoami(who: Who) -> dict[str, Any]:
    """The tenant and key id of the caller."""
    return {"tenant": who.tenant, "key_id": who.key_id}


@router.get("/v1/defences")
async def defences(request: Request, hub: HubDep, who: Who) -> dict[str, Any]:
    """What the hub's defences against abuse (:mod:`envhub.defences`) hold now, as counts:
    ``connections`` (:meth:`envhub.connections.ConnectionGate.stats`: open, the clients
    holding them, waiting for headers, refused and evicted so far; ``null`` when the app is
    not served by :func:`envhub.server.serve`) and ``auth_failures`` (the clients whose
    failed authentications are counted). Any key may read it: it names no client. After an
    attack everything but the totals goes back to what honest clients hold."""
    gate = getattr(request.app.state, "gate", None)
    return {
        "connections": gate.stats() if gate is not None else None,
        "auth_failures": hub.throttle.stats(),
    }
