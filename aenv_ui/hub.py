"""The hub's page of the UI: ``aenv serve`` serves it at ``/ui/`` (:func:`mount`).

The page is the same front-end as ``aenv ui``'s, in its hub mode: it shows the hub's
environments (versions, their tools' and calls' schemas as forms, README and config), the
caller's instances and services (state, TTL left, owner; delete and renew) and the caller's
tenant's rollout runs (pushed by ``aenv rollout`` against the hub, live while they run:
:mod:`aenv_ray.hubruns`), reading the hub's own API (``/v1/...``) and the runs' API this module
adds (``/ui/api/runs...``, :class:`aenv_ui.runs.RunSet`'s over the tenant's runs) with the key
the visitor pastes (kept in the tab's ``sessionStorage``), so the hub's keys and tenants apply as
to any client: the hub lists a tenant's own instances and runs only, and refuses to delete or
renew another tenant's. The page and its assets hold no data and need no key.

May import: the standard library, ``aenv_ray.errors``, :mod:`aenv_ui.assets`,
:mod:`aenv_ui.runs`; lazily, inside functions: starlette.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aenv_ray.errors import AEnvError, encode_error
from aenv_ui.assets import asset, page
from aenv_ui.runs import RunSet

__all__ = ["PATH", "TenantRuns", "mount"]

PATH = "/ui"

TenantRuns = Callable[[Any], Awaitable[tuple[Path, str]]]
"""What the hub says of a request (a Starlette ``Request``): the directory of its key's
tenant's runs and the tenant's name; it raises the hub's own authentication errors."""


def mount(app: Any, runs: TenantRuns | None = None, index_dir: Path | None = None) -> None:
    """Add the UI's page (``/ui/``), its assets (``/ui/assets/NAME``) and, with ``runs``, the
    API of the caller's tenant's runs (``/ui/api/runs...``; their indexes in ``index_dir``) to
    the hub's Starlette (FastAPI) ``app``; left out of its OpenAPI document. Errors are raised
    (:mod:`aenv_ray.errors`) for the app's own handler to answer."""
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
    if runs is not None:
        _mount_runs(app, runs, index_dir)


def _mount_runs(app: Any, runs: TenantRuns, index_dir: Path | None) -> None:
    """The runs' API of the hub's page: :class:`RunSet`'s answers over the tenant's runs."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    sets: dict[Path, RunSet] = {}

    async def tenant_set(request: Request) -> RunSet:
        directory, tenant = await runs(request)
        found = sets.get(directory)
        if found is None:
            await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
            found = sets[directory] = RunSet(
                directory, index_dir=index_dir, title=f"the hub, tenant {tenant}", paths=False
            )
        return found

    def route(answer: Callable[[RunSet, Request], Awaitable[dict[str, Any]]]) -> Any:
        async def handler(request: Request) -> Response:
            return JSONResponse(await answer(await tenant_set(request), request))

        return handler

    api = f"{PATH}/api"
    table: list[tuple[str, Callable[[RunSet, Request], Awaitable[dict[str, Any]]]]] = [
        ("/runs", lambda s, r: s.list_runs()),
        ("/runs/{run}", lambda s, r: s.run(r.path_params["run"])),
        ("/runs/{run}/episodes", lambda s, r: s.episodes(r.path_params["run"], r.query_params)),
        (
            "/runs/{run}/episodes/{episode}",
            lambda s, r: s.episode(r.path_params["run"], r.path_params["episode"]),
        ),
        ("/runs/{run}/rewards", lambda s, r: s.rewards(r.path_params["run"], r.query_params)),
        ("/compare", lambda s, r: s.compare(r.query_params)),
    ]
    for path, answer in table:
        app.add_route(api + path, route(answer), methods=["GET"], include_in_schema=False)
