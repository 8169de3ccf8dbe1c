"""The rollout runs' routes (``/v1/runs``): a driver registers its run, sends its records and
ends it; a tenant lists its runs.

What they mean is :class:`envhub.runs.RunStore`'s (the contract: :mod:`aenv_ray.hubruns`); a
run's pages, episodes and rewards are read by the Environment Center (``/ui/api/runs/...``,
:mod:`aenv_ui.hub`). A key reaches its own tenant's runs only.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.requests import ClientDisconnect

from aenv_ray.errors import ArtifactTooLargeError, ConfigurationError
from aenv_ray.hubruns import MAX_POST
from envhub.routes.context import HubDep, Who
from envhub.routes.models import Run, RunEnd, RunOpen

__all__ = ["router"]

router = APIRouter(tags=["runs"])

_MAX_BODY = 2 * MAX_POST + 4096  # the records as a JSON string: escaped, at most twice as long


async def _body(request: Request) -> dict[str, Any]:
    """The JSON body ``{"offset", "data", "reset"}``, refused once over :data:`_MAX_BODY`."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > _MAX_BODY:
                raise ArtifactTooLargeError(
                    f"a post of records is at most {MAX_POST} bytes of records: send several"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise ConfigurationError("the post of records was cut off: send it again") from None
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        raise ConfigurationError('the body must be JSON: {"offset": N, "data": "LINES"}') from None
    if not isinstance(body, dict):
        raise ConfigurationError('the body must be a JSON object: {"offset": N, "data": "LINES"}')
    unknown = set(body) - {"offset", "data", "reset"}
    if unknown:
        raise ConfigurationError(f"unknown fields {sorted(unknown)}: send offset, data, reset")
    offset, data, reset = body.get("offset"), body.get("data", ""), body.get("reset", False)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ConfigurationError("`offset` must be a whole number >= 0: where `data` starts")
    if not isinstance(data, str) or not isinstance(reset, bool):
        raise ConfigurationError("`data` must be a string (JSON lines) and `reset` true or false")
    return {"offset": offset, "data": data.encode(), "reset": reset}


@router.post("/v1/runs", status_code=201, response_model=Run)
async def open_run(body: RunOpen, who: Who, hub: HubDep) -> dict[str, Any]:
    """Register a rollout run of the caller's tenant, live from now (``id``: take one up
    again); its ``received`` says from which byte of its records to send."""
    return await hub.runs.open(
        who.tenant, name=body.name, settings=body.settings, driver=body.driver, run_id=body.id
    )


@router.get("/v1/runs")
async def list_runs(who: Who, hub: HubDep) -> dict[str, Any]:
    """The caller's tenant's runs, the newest first."""
    return {"runs": await hub.runs.list(who.tenant)}


@router.get("/v1/runs/{run_id}", response_model=Run)
async def get_run(run_id: str, who: Who, hub: HubDep) -> dict[str, Any]:
    """One run of the caller's tenant."""
    return await hub.runs.get(who.tenant, run_id)


@router.post(
    "/v1/runs/{run_id}/records",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["offset"],
                        "properties": {
                            "offset": {"type": "integer", "minimum": 0},
                            "data": {"type": "string", "description": "whole JSON lines"},
                            "reset": {"type": "boolean"},
                        },
                    }
                }
            },
            "description": "the bytes of trajectories.jsonl from `offset` (a heartbeat when "
            "empty); `reset`: the copy starts again",
        }
    },
)
async def add_records(run_id: str, request: Request, who: Who, hub: HubDep) -> dict[str, Any]:
    """Add records to a run (and beat its heart): ``{"id", "received", "accepted"}``; a post
    from past ``received`` adds nothing: send again from ``received``."""
    body = await _body(request)
    return await hub.runs.append(who.tenant, run_id, **body)


@router.patch("/v1/runs/{run_id}", response_model=Run)
async def end_run(run_id: str, body: RunEnd, who: Who, hub: HubDep) -> dict[str, Any]:
    """End a run (``{"state": "finished"}``)."""
    return await hub.runs.end(who.tenant, run_id)


@router.delete("/v1/runs/{run_id}")
async def delete_run(run_id: str, who: Who, hub: HubDep) -> dict[str, Any]:
    """Delete a run and its records from the hub (its driver's run directory is untouched)."""
    return await hub.runs.delete(who.tenant, run_id)
