"""The proxy's client: forwards a request to a runtime (an instance's, or a service replica's)
and streams the answer back.

The caller's hub key never reaches the runtime; the runtime's own token does. Hop-by-hop headers
are dropped both ways. One :class:`aiohttp.ClientSession` per hub, made for the first request
forwarded (a hub that forwards none never imports aiohttp: a tenth of a second of every start)
and closed by the app's lifespan.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from aenv_ray.errors import InstanceUnreachableError

if TYPE_CHECKING:
    import aiohttp

__all__ = ["Forwarder"]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "content-length",
    }
)


class Forwarder:
    """Forwards requests to runtimes over one client session (:meth:`open` before use)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._open = False
        self._turns = itertools.count()

    async def open(self) -> None:
        """Let requests be forwarded (the app's lifespan, at start); the client session is
        made for the first of them."""
        self._open = True

    async def aclose(self) -> None:
        """Close the client session, if one was made (the app's lifespan, at stop)."""
        self._open = False
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        """The hub's client session, made on first use (in the event loop, so never twice)."""
        assert self._open, "the hub's lifespan opens the forwarder"
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False
            )
        return self._session

    def next_turn(self) -> int:
        """An ever-increasing number: which replica of a service answers next (round-robin)."""
        return next(self._turns)

    async def forward(self, request: Request, base: str, path: str, token: str | None) -> Response:
        """``request`` sent to ``base``/``path`` with ``token`` as its bearer; the answer
        streamed back. Raises :class:`~aenv_ray.errors.InstanceUnreachableError` when ``base``
        does not answer."""
        import aiohttp

        session = self._client()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_BY_HOP and k.lower() != "authorization"
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{base.rstrip('/')}/{path}"
        if request.url.query:
            url += f"?{request.url.query}"
        try:
            upstream = await session.request(
                request.method, url, data=await request.body(), headers=headers
            )
        except aiohttp.ClientError as exc:
            raise InstanceUnreachableError(
                f"the hub cannot reach the instance at {base} ({exc}); it may have ended"
            ) from exc
        return self._streamed(upstream)

    async def forward_preview(
        self, request: Request, base: str, prefix: str, parts: list[str], token: str | None
    ) -> Response:
        """``request`` (a browser's ``GET`` or ``HEAD`` of a preview file) sent to ``base`` +
        ``prefix`` + ``parts``, each part percent-encoded again (so that none becomes a
        separator or a dot segment), with only ``token`` as its header: nothing of the
        browser's (cookies, its origin) reaches the runtime."""
        import aiohttp

        session = self._client()
        path = "/".join(quote(part, safe="") for part in parts)  # no dot segment: checked
        url = f"{base.rstrip('/')}/{prefix}{path}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            upstream = await session.request(request.method, url, headers=headers)
        except aiohttp.ClientError as exc:
            raise InstanceUnreachableError(
                f"the hub cannot reach the instance at {base} ({exc}); it may have ended"
            ) from exc
        return self._streamed(upstream)

    def _streamed(self, upstream: aiohttp.ClientResponse) -> Response:
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            finally:
                upstream.release()

        return StreamingResponse(body(), status_code=upstream.status, headers=out_headers)
