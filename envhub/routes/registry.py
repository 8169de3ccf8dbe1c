"""The registry's routes: publish a bundle (``POST /v1/envs``), search, versions, one version,
its bundle, deprecate, delete (``/v1/envs/...``), and tags (``/v1/tags``).

What they mean is :class:`envhub.registry.VersionRegistry`'s; a published bundle is first loaded
in a sandbox (:meth:`envhub.control.ControlPlane.check_loads`), never in the hub.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from aenv_ray.errors import ArtifactError, ArtifactTooLargeError
from aenv_ray.loadcheck import described_calls
from envhub.routes.context import HubDep, Who
from envhub.routes.models import Deprecation, Version

__all__ = ["DIGEST_HEADER", "router"]

log = logging.getLogger("envhub.app")

DIGEST_HEADER = "X-Aenv-Digest"

router = APIRouter(tags=["registry"])


async def _read_bundle(request: Request, max_bundle: int) -> bytes | None:
    """The upload's bytes, refused once over ``max_bundle`` (declared or counted); ``None``
    when the client went away mid-upload."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bundle:
        raise ArtifactTooLargeError(
            f"the bundle is {int(declared)} bytes; this hub accepts at most "
            f"{max_bundle} (aenv serve --max-bundle): leave data out of the bundle "
            "and mount it as a datasource"
        )
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bundle:
                raise ArtifactTooLargeError(
                    f"the bundle is over {max_bundle} bytes, this hub's limit "
                    "(aenv serve --max-bundle): leave data out of the bundle"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        return None
    return b"".join(chunks)


@router.post(
    "/v1/envs",
    status_code=201,
    response_model=Version,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
            "description": "a bundle made by `aenv build`; send its digest in X-Aenv-Digest",
        }
    },
)
async def publish(request: Request, who: Who, hub: HubDep) -> dict[str, Any]:
    """Publish a bundle as its config's name@version (immutable from then on)."""
    data = await _read_bundle(request, hub.options.max_bundle)
    if data is None:
        log.warning("push abandoned mid-upload; nothing was published")
        return {}
    if not data:
        raise ArtifactError("the upload is empty: send the bundle `aenv build` wrote")
    from aenv_ray.bundle import inspect_bundle

    checked = inspect_bundle(
        data, max_size=hub.options.max_bundle, expected_digest=request.headers.get(DIGEST_HEADER)
    )
    # before a sandbox is spent, in this order: whose the name is (a built-in's, another
    # tenant's, a lookalike of either), then whether the version is taken
    await hub.registry.check_name(who, checked.config.name)
    await hub.registry.check_new(checked.config.ref, checked.digest)
    hub.registry.check_template(who, checked.config)
    # in a sandbox: never in the hub
    manifest = await hub.control.check_loads(data, checked.digest)
    record = await hub.registry.publish(
        who,
        data,
        expected_digest=request.headers.get(DIGEST_HEADER),
        calls=described_calls(manifest),
    )
    log.info("published", extra={"ref": record["ref"], "tenant": who.tenant, "size": len(data)})
    return record


@router.get("/v1/resolve/{env:path}")
async def resolve(env: str, who: Who, hub: HubDep) -> dict[str, Any]:
    """What ``env`` (``name[@version]`` or ``tenant/name[@version]``) means for the caller, as
    an instance created from it would run: ``ref``, ``publisher`` (null: built into the hub),
    ``warnings`` and ``calls`` (what its reward, functions and tools take)."""
    return await hub.control.describe(who, env)


@router.get("/v1/envs")
async def search(
    who: Who,
    hub: HubDep,
    q: str = "",
    tag: Annotated[list[str] | None, Query()] = None,
    deprecated: bool = False,
) -> dict[str, Any]:
    """One summary per name matching ``q`` (name or description) and every ``tag``."""
    found = await hub.registry.search(q, tags=tag, include_deprecated=deprecated)
    return {"environments": found}


@router.get("/v1/tags")
async def tags(who: Who, hub: HubDep) -> dict[str, Any]:
    """Every tag with the number of names that carry it."""
    return {"tags": await hub.registry.tags()}


@router.get("/v1/envs/{name}")
async def versions(name: str, who: Who, hub: HubDep) -> dict[str, Any]:
    """Every version of ``name``, oldest first."""
    found = await hub.registry.versions(name)
    if not found:
        await hub.registry.get(name)  # raises the helpful not-found error
    return {"name": name, "versions": found}


@router.get("/v1/envs/{name}/{version}", response_model=Version)
async def version(name: str, version: str, who: Who, hub: HubDep) -> dict[str, Any]:
    """One version; ``latest`` is the highest one not deprecated."""
    return await hub.registry.get(name, version)


@router.get(
    "/v1/envs/{name}/{version}/bundle",
    response_class=Response,
    responses={200: {"content": {"application/gzip": {}}}},
)
async def bundle(name: str, version: str, who: Who, hub: HubDep) -> Response:
    """The version's bundle; its digest is in the X-Aenv-Digest header."""
    doc, data = await hub.registry.bundle(name, version)
    return Response(
        data,
        media_type="application/gzip",
        headers={
            DIGEST_HEADER: doc["digest"],
            "Content-Disposition": f'attachment; filename="{doc["name"]}-'
            f'{doc["version"]}.aenv.tgz"',
        },
    )


@router.patch("/v1/envs/{name}/{version}", response_model=Version)
async def deprecate(
    name: str, version: str, body: Deprecation, who: Who, hub: HubDep
) -> dict[str, Any]:
    """Deprecate a version (or undo it): still usable by name@version, skipped otherwise."""
    return await hub.registry.deprecate(
        who, name, version, deprecated=body.deprecated, message=body.message
    )


@router.delete("/v1/envs/{name}/{version}")
async def delete_version(name: str, version: str, who: Who, hub: HubDep) -> dict[str, Any]:
    """Delete a version; its number is never reused."""
    return await hub.registry.delete(who, name, version)
