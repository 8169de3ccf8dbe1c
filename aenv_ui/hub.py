"""The hub's page of the UI: ``aenv serve`` serves it at ``/ui/`` (:func:`mount`).

The page is the same front-end as ``aenv ui``'s, in its hub mode: it shows the hub's
environments (versions, their calls' schemas as forms, README and config) and the caller's
instances and services (state, TTL left, owner; delete and renew), reading the hub's own API
(``/v1/...``) with the key the visitor pastes (kept in the tab's ``sessionStorage``), so the
hub's keys and tenants apply as to any client: the hub lists a tenant's own instances only, and
refuses to delete or renew another tenant's. The page and its assets hold no data and need no key.

May import: the standard library, ``aenv_ray.errors``, :mod:`aenv_ui.assets`; lazily, inside
functions: starlette.
"""

from __future__ import annotations

from typing import Any

from aenv_ray.errors import AEnvError, encode_error
from aenv_ui.assets import asset, page

__all__ = ["PATH", "mount"]

PATH = "/ui"


def mount(app: Any) -> None:
    """Add the UI's page (``/ui/``) and its assets (``/ui/assets/NAME``) to the hub's
    Starlette (FastAPI) ``app``; left out of its OpenAPI document."""
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

    async def index(request: Request) -> Response:
        return HTMLResponse(page(mode="hub", base=PATH))

    async def to_index(request: Request) -> Response:
        return RedirectResponse(f"{PATH}/", status_code=307)

    async def assets(request: Request) -> Response:
        try:
            body, kind = asset(request.path_params["name"])
        except AEnvError as exc:
            return JSONResponse(encode_error(exc), status_code=404)
        return Response(body, media_type=kind, headers={"Cache-Control": "max-age=3600"})

    app.add_route(PATH, to_index, methods=["GET"], include_in_schema=False)
    app.add_route(f"{PATH}/", index, methods=["GET"], include_in_schema=False)
    app.add_route(f"{PATH}/assets/{{name}}", assets, methods=["GET"], include_in_schema=False)
