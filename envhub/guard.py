"""What a web page could make a browser send to the hub, refused before any route runs.

A hub on loopback without auth (``aenv serve --no-auth``) trusts whoever reaches it, and a web
page in a browser on the same machine reaches it too. :func:`refusal` answers every request a
page can make without the hub's consent:

- **DNS rebinding** (no auth): a page of ``evil.example`` whose name then resolves to
  ``127.0.0.1`` sends ``Host: evil.example``; the hub answers only a ``Host`` that is
  ``localhost`` or an IP literal (with any port);
- **another site's page** (no auth): a request carrying ``Origin`` (or ``Sec-Fetch-Site``) of
  another origin than the hub's own (``http://`` + its ``Host``);
- **the preview is exempt**: ``GET``/``HEAD`` of ``/v1/instances/{id}/proxy/aenv/v1/preview/...``
  is what a browser sends when a person opens an instance's preview (its subresources come from
  a sandboxed, opaque origin: ``Sec-Fetch-Site: cross-site``, ``Origin: null``); the capability
  in its path is its authority, and it reads files only (:mod:`envhub.routes.proxy`);
- **"simple" requests** (always, auth or not): a page may POST ``text/plain``, a form or
  ``multipart/form-data`` anywhere without asking the server first; the hub reads a body only as
  ``application/json``, and the bundle upload (``POST /v1/envs``) only as
  ``application/gzip``. A request without a body passes whatever its type.

    >>> refusal("POST", "/v1/instances", {"host": "127.0.0.1:8000",
    ...         "content-type": "text/plain", "content-length": "2"}, auth=True)[0]
    415
    >>> refusal("GET", "/v1/envs", {"host": "evil.example:8000"}, auth=False)[0]
    403
    >>> refusal("GET", "/v1/envs", {"host": "localhost:8000"}, auth=False) is None
    True
    >>> refusal("GET", "/v1/instances/i1/proxy/aenv/v1/preview/CAP/app.js",
    ...         {"host": "127.0.0.1:8000", "sec-fetch-site": "cross-site"}, auth=False) is None
    True

May import: the standard library, ``aenv_ray.errors``, ``aenv_ray.net`` (which hosts are
local), starlette (the middleware).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from aenv_ray.errors import AEnvError, ConfigurationError, PermissionDeniedError, encode_error
from aenv_ray.net import is_local_host, media_type

__all__ = ["RequestGuard", "refusal"]

UPLOAD = ("POST", "/v1/envs")
_PREVIEW = re.compile(r"^/v1/instances/[^/]+/proxy/aenv/v1/preview/")
_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def refusal(
    method: str, path: str, headers: Mapping[str, str], *, auth: bool
) -> tuple[int, AEnvError] | None:
    """``(status, error)`` when the request must be refused (see the module), else None.

    ``headers`` are lower-cased names; a name sent twice is joined by ``,`` (as HTTP does), so a
    second ``Host`` or ``Origin`` cannot hide behind the first.
    """
    if method in ("GET", "HEAD") and _PREVIEW.match(path):
        return None
    if not auth:
        host = headers.get("host", "")
        if not is_local_host(host):
            return 403, PermissionDeniedError(
                f"this hub (without auth) answers only requests addressed to localhost or an IP "
                f"address, not Host `{host}`: a web page may be trying to reach it through DNS "
                "rebinding. Call it as http://127.0.0.1:PORT"
            )
        origin = headers.get("origin")
        own = (f"http://{host}".lower(), f"https://{host}".lower())
        if origin is not None and origin.lower() not in own:
            return 403, PermissionDeniedError(
                f"this hub (without auth) refuses requests from web pages of other sites (Origin "
                f"`{origin}`); call it from a program, not a browser page"
            )
        site = headers.get("sec-fetch-site")
        if site is not None and site.lower() not in ("same-origin", "none"):
            return 403, PermissionDeniedError(
                f"this hub (without auth) refuses requests a browser marks `Sec-Fetch-Site: "
                f"{site}`: a web page of another site sent it; call the hub from a program"
            )
    if method not in _WITH_BODY:
        return None
    given = headers.get("content-type")
    length = headers.get("content-length", "0").strip()
    if length.isdigit() and int(length) == 0 and "transfer-encoding" not in headers:
        return None  # no body: nothing to read as a form
    wanted = "application/gzip" if (method, path.rstrip("/")) == UPLOAD else "application/json"
    if given is None or media_type(given) != wanted:
        return 415, ConfigurationError(
            f"{method} {path} takes a body of Content-Type {wanted}, not "
            f"{given or 'a body without one'}; send {wanted}"
        )
    return None


class RequestGuard:
    """ASGI middleware: answers :func:`refusal`'s requests with the hub's error body."""

    def __init__(self, app: ASGIApp, *, auth: bool) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers: dict[str, str] = {}
            for raw_name, raw_value in scope["headers"]:
                name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
                headers[name] = f"{headers[name]},{value}" if name in headers else value
            refused = refusal(scope["method"], scope["path"], headers, auth=self.auth)
            if refused is not None:
                status, error = refused
                body = encode_error(error)
                await JSONResponse(body, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)
