"""The preview route: the files of the directory an environment registered
(:func:`aenv_ray.preview.set_preview_directory`), read-only, for a browser.

==============================================  ===============================================
``GET  /aenv/v1/preview``                       (token) ``{"path": "/aenv/v1/preview/CAP/",
                                                "directory": "/workspace/site" | null}``
``GET|HEAD /aenv/v1/preview/CAP/FILE``          (no token) the file; ``.../DIR/`` its
                                                ``index.html``; ``.../DIR`` redirects to ``DIR/``
==============================================  ===============================================

**Authority.** A browser cannot send the instance's token, so the second route needs none: the
capability ``CAP`` in its path is the authority. It is 256 random bits, drawn in each instance
process (a template's instances and an instance's forks each draw their own), compared in
constant time, and only the first route (behind the token) tells it. Nothing else is reachable
through the second route: it reads files, never runs a call, a function or environment code.

**What is served.** A request's path is split on ``/`` *before* percent-decoding, so ``%2F``
cannot smuggle a separator; a part that decodes to ``.``, ``..``, a name starting with ``.``
(hidden files), or one holding ``\\``, NUL or a control character is refused before any file is
touched. The file is opened one component at a time from the registered directory
(``openat`` with ``O_NOFOLLOW``): a symbolic link anywhere below the directory is refused, and
no race can swap one in. Only regular files up to
:data:`~aenv_ray.protocol.MAX_PREVIEW_FILE_BYTES` are served (a FIFO, a device: 404; a larger
file: 413).

**How.** Every answer, errors included, carries a Content-Security-Policy whose ``sandbox``
directive gives the page an opaque origin (its requests to the runtime's own routes carry
``Origin: null``, which a runtime without a token refuses, and a runtime with one wants the
token), loads only from the page's own address (``'self'``, ``data:``, ``blob:``; nothing from
the network), the content type of the file's extension (``application/octet-stream`` when
unknown) with ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` (the
capability never leaves in a ``Referer``), ``Cache-Control: no-store`` (the files change while
the agent works) and ``Access-Control-Allow-Origin: *`` (the sandboxed page's own ``fetch()``
and module scripts come from an opaque origin; the URL is the secret, not the origin).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from aenv_ray import protocol as p
from aenv_ray.preview import preview_directory

__all__ = ["SECURITY_HEADERS", "PreviewRoute", "content_type"]

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

CSP = (
    "sandbox allow-scripts allow-forms allow-modals allow-popups allow-downloads; "
    "default-src 'self' data: blob: 'unsafe-inline' 'unsafe-eval'; "
    "base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"access-control-allow-origin", b"*"),
]
_UTF8 = "; charset=utf-8"
_TYPES = {
    "html": "text/html" + _UTF8,
    "htm": "text/html" + _UTF8,
    "js": "text/javascript" + _UTF8,
    "mjs": "text/javascript" + _UTF8,
    "css": "text/css" + _UTF8,
    "json": "application/json",
    "map": "application/json",
    "txt": "text/plain" + _UTF8,
    "md": "text/plain" + _UTF8,
    "csv": "text/csv" + _UTF8,
    "xml": "application/xml",
    "svg": "image/svg+xml",
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "avif": "image/avif",
    "ico": "image/x-icon",
    "wasm": "application/wasm",
    "woff": "font/woff",
    "woff2": "font/woff2",
    "ttf": "font/ttf",
    "otf": "font/otf",
    "mp3": "audio/mpeg",
    "wav": "audio/wav",
    "ogg": "audio/ogg",
    "mp4": "video/mp4",
    "webm": "video/webm",
    "pdf": "application/pdf",
}
_BINARY = "application/octet-stream"
_INDEX = "index.html"
_MAX_DEPTH = 32
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading must not wait for a writer
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def content_type(name: str) -> str:
    """The ``Content-Type`` a preview file is served with, from its extension.

    >>> content_type("app.JS"), content_type("index.html"), content_type("notes")
    ('text/javascript; charset=utf-8', 'text/html; charset=utf-8', 'application/octet-stream')
    """
    _, dot, extension = name.rpartition(".")
    return _TYPES.get(extension.lower(), _BINARY) if dot else _BINARY


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    kind: str = "text/plain" + _UTF8
    location: str | None = None


def _miss(status: int, text: str) -> _Answer:
    return _Answer(status, (text + "\n").encode())


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.answer = _miss(status, text)


class PreviewRoute:
    """The two preview routes of one runtime (see the module)."""

    def __init__(self) -> None:
        self._capability = ""
        self._pid = 0

    @property
    def capability(self) -> str:
        """This process's capability: drawn anew in each process (after a fork)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._capability = secrets.token_urlsafe(32)
        return self._capability

    def describe(self) -> dict[str, Any]:
        """The token-protected answer: the preview's path, and the directory it serves."""
        directory = preview_directory()
        return {
            "path": f"{p.PREVIEW_PREFIX}{self.capability}/",
            "directory": None if directory is None else str(directory),
        }

    async def serve(self, scope: Scope, send: Send) -> None:
        """Answer a ``/aenv/v1/preview/...`` request (the token is not checked: see the module)."""
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            answer = _miss(405, f"the preview is read-only: {method} is not allowed (GET, HEAD)")
        else:
            try:
                answer = await self._answer(scope)
            except _Refused as refused:
                answer = refused.answer
        headers = [
            (b"content-type", answer.kind.encode()),
            (b"content-length", str(len(answer.body)).encode()),
            *SECURITY_HEADERS,
        ]
        if answer.status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        if answer.location is not None:
            headers.append((b"location", answer.location.encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        body = b"" if method == "HEAD" else answer.body
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope) -> _Answer:
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        prefix = p.PREVIEW_PREFIX.encode()
        after = raw[len(prefix) :] if raw.startswith(prefix) else b""
        capability, slash, rest = after.partition(b"/")
        if not hmac.compare_digest(capability, self.capability.encode()):
            raise _Refused(404, "no such preview: the address is wrong or its instance has ended")
        if not slash:  # .../CAP without its slash: relative links need it
            return _Answer(301, b"", location=f"{capability.decode()}/")
        parts = _parts(rest)
        directory = preview_directory()
        if directory is None:
            raise _Refused(404, "this environment serves no preview (yet)")
        return await asyncio.to_thread(_read, directory, parts)


def _parts(rest: bytes) -> list[str]:
    """The decoded path components under the preview's root ('' last: a directory's index)."""
    pieces = rest.split(b"/")
    if len(pieces) > _MAX_DEPTH:
        raise _Refused(404, "the path is too deep")
    parts = []
    for index, piece in enumerate(pieces):
        try:
            part = unquote_to_bytes(piece).decode("utf-8")
        except UnicodeDecodeError:
            raise _Refused(400, "the path is not UTF-8") from None
        last = index == len(pieces) - 1
        if part == "" and last:
            parts.append("")
            continue
        if part in ("", ".", ".."):
            raise _Refused(404, "`.`, `..` and empty path components are not served")
        if any(c in part for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in part):
            raise _Refused(404, "a path component holds a separator or a control character")
        if part.startswith("."):
            raise _Refused(404, f"`{part}`: hidden files are not served")
        parts.append(part)
    return parts


def _read(directory: Path, parts: list[str]) -> _Answer:
    """Open ``parts`` under ``directory`` one component at a time, never following a link."""
    opened: list[int] = []
    try:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise _Refused(404, "nothing to preview yet (its directory does not exist)") from None
        opened.append(fd)
        *folders, name = parts
        for folder in folders:
            fd = _open(folder, _DIR_FLAGS, fd)
            opened.append(fd)
        if name == "":
            name = _INDEX
            target = _open(_INDEX, _FILE_FLAGS, fd)
        else:
            target = _open(name, _FILE_FLAGS, fd)
        opened.append(target)
        info = os.fstat(target)
        if stat.S_ISDIR(info.st_mode):
            if parts[-1] != "":  # a directory named without its slash: relative links need it
                return _Answer(301, b"", location=f"{_quote(name)}/")
            raise _Refused(404, "no such file")
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(404, f"`{name}` is not a regular file")
        if info.st_size > p.MAX_PREVIEW_FILE_BYTES:
            raise _Refused(
                413, f"`{name}` is over {p.MAX_PREVIEW_FILE_BYTES >> 20} MiB: not served"
            )
        with os.fdopen(os.dup(target), "rb") as stream:
            body = stream.read(p.MAX_PREVIEW_FILE_BYTES + 1)
        if len(body) > p.MAX_PREVIEW_FILE_BYTES:  # it grew while read
            raise _Refused(
                413, f"`{name}` is over {p.MAX_PREVIEW_FILE_BYTES >> 20} MiB: not served"
            )
        return _Answer(200, body, content_type(name))
    finally:
        for fd in opened:
            os.close(fd)


def _open(name: str, flags: int, parent: int) -> int:
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, parent):
            raise _Refused(404, f"`{name}` is a symbolic link: links are not served") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise _Refused(404, f"`{name}` cannot be read") from None
        raise _Refused(404, "no such file") from None


def _is_link(name: str, parent: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _quote(name: str) -> str:
    return quote(name, safe="")
