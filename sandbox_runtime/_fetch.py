"""Starting from a bundle a hub holds: :func:`fetch_bundle` downloads it, checks its digest,
unpacks it and checks that this interpreter has what it pins.

This is how a generic runtime image (aenv-ray and Python, no environment inside) serves an
environment: ``python -m sandbox_runtime --bundle URL --digest sha256:HEX`` (see
:mod:`sandbox_runtime.__main__`). The order is the point:

1. download ``URL`` (EnvHub's ``/v1/envs/NAME/VERSION/bundle``) with the key from
   ``AENV_BUNDLE_KEY`` as ``Authorization: Bearer``, at most ``max_size`` bytes, no redirects
   (the key goes to the URL's server and nowhere else); a refused connection, a timeout, 429 and
   5xx are retried with backoff, then :class:`~aenv_ray.errors.HubUnreachableError`;
2. check the bytes' sha256 against ``digest`` before anything is written: a mismatch is an
   :class:`~aenv_ray.errors.ArtifactError` naming both digests;
3. unpack with :func:`aenv_ray.bundle.extract_bundle`, the hub's own checks of an upload (no
   absolute paths, no ``..``, no links or devices, no decompression bomb) into a new directory;
4. check ``aenv.lock``: nothing is installed here. A pinned distribution that this interpreter
   lacks is a :class:`~aenv_ray.errors.ConfigurationError` listing them (build the
   environment's own image instead); one installed at another version is logged, not refused.

May import: the standard library, ``aenv_ray`` (the bundle format, errors, the retry loop).
"""

from __future__ import annotations

import http.client
import importlib.metadata
import json
import logging
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv_ray.bundle import LOCK_NAME, digest_of, extract_bundle
from aenv_ray.errors import (
    AEnvError,
    ArtifactError,
    ArtifactTooLargeError,
    ConfigurationError,
    HubUnreachableError,
    decode_error,
)
from aenv_ray.retry import Backoff, retry

__all__ = ["DEFAULT_ATTEMPTS", "DEFAULT_MAX_BUNDLE", "Fetched", "fetch_bundle", "parse_digest"]

log = logging.getLogger("sandbox_runtime.fetch")

DEFAULT_MAX_BUNDLE = 64 * 1024 * 1024
"""Bytes a fetched bundle may have: EnvHub's own default limit (``aenv serve --max-bundle``)."""
DEFAULT_ATTEMPTS = 6
"""Tries of an unreachable hub: waits of about 0.5, 1, 2, 4, 8 s between them (about 15 s)."""
_TIMEOUT = 30.0  # seconds one connect or read may take
_CHUNK = 1 << 16
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Fetched:
    """A bundle fetched, checked and unpacked: the project directory to serve."""

    project: Path
    digest: str
    size: int


def parse_digest(text: str) -> str:
    """``sha256:<64 hex>``, lowercased; a :class:`ConfigurationError` for anything else.

    >>> parse_digest("SHA256:" + "A" * 64) == "sha256:" + "a" * 64
    True
    """
    digest = text.strip().lower()
    if not _DIGEST.fullmatch(digest):
        raise ConfigurationError(
            f"--digest `{text[:80]}` is not `sha256:` and 64 hex digits (a version's digest, "
            "as `aenv push` and `aenv get NAME@VERSION` print it)"
        )
    return digest


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: the key is for the URL's server only."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _hub_error(url: str, status: int, body: bytes) -> AEnvError:
    """The error an answer of ``status`` (not 2xx, not retried) carries, saying what to do."""
    try:
        payload = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        payload = None
    said = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(said, str):
        said = body.decode("utf-8", "replace").strip()[:300] or f"HTTP {status}"
    hint = {
        401: "give the engine a valid hub key (HubBundle(api_key=...), AENV_K8S_HUB_KEY)",
        403: "the key's tenant may not read this version",
        404: "push the version to this hub first (`aenv push`), or check the hub's URL",
    }.get(status, "check the hub's URL")
    message = f"cannot fetch the bundle {url}: HTTP {status}: {said}; {hint}"
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return decode_error({**payload, "error": message}, status)
    return decode_error({"error": message}, status)


def _download(url: str, key: str | None, max_size: int) -> bytes:
    """One try: the body, at most ``max_size`` bytes and exactly its Content-Length.
    Raises ``_Transient`` for what another try may fix."""
    headers = {"Accept": "application/gzip, application/octet-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with _OPENER.open(request, timeout=_TIMEOUT) as reply:
            declared = reply.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > max_size:
                raise ArtifactTooLargeError(
                    f"the bundle {url} is {int(declared)} bytes, over this runtime's limit of "
                    f"{max_size} (--max-bundle)"
                )
            chunks: list[bytes] = []
            size = 0
            while chunk := reply.read(_CHUNK):
                size += len(chunk)
                if size > max_size:
                    raise ArtifactTooLargeError(
                        f"the bundle {url} is over {max_size} bytes, this runtime's limit "
                        "(--max-bundle)"
                    )
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        body = exc.read(4096) if exc.fp is not None else b""
        if exc.code == 429 or exc.code >= 500:
            raise _Transient(f"HTTP {exc.code}") from None
        if 300 <= exc.code < 400:
            where = exc.headers.get("Location", "?")
            raise ConfigurationError(
                f"cannot fetch the bundle {url}: the server redirects to {where}; give the "
                "hub's own URL (redirects are not followed: the key is for that server only)"
            ) from None
        raise _hub_error(url, exc.code, body) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # refused, cut
        reason = getattr(exc, "reason", exc)
        raise _Transient(str(reason) or type(exc).__name__) from None
    data = b"".join(chunks)
    if declared is not None and declared.isdigit() and int(declared) != len(data):
        raise _Transient(f"the body ended after {len(data)} of {declared} bytes")
    return data


class _Transient(Exception):
    """A try that another may fix: the hub is down, busy or cut the answer short."""


def _with_retries(url: str, key: str | None, max_size: int, attempts: int) -> bytes:
    def on_retry(exc: Exception, attempt: int, pause: float) -> None:
        log.warning(
            "fetching the bundle failed; retrying",
            extra={"url": url, "attempt": attempt, "problem": str(exc), "pause": pause},
        )

    try:
        return retry(
            lambda: _download(url, key, max_size),
            Backoff(first=0.5, most=8.0, jitter=0.1, tries=attempts),
            retryable=lambda exc: isinstance(exc, _Transient),
            on_retry=on_retry,
        )
    except _Transient as exc:
        raise HubUnreachableError(
            f"cannot fetch the bundle {url}: {exc} (tried {attempts} times); check "
            "that the hub runs and that this pod may reach it (its URL, the "
            "namespace's NetworkPolicy)"
        ) from None


def missing_requirements(lock: str) -> tuple[list[str], list[str]]:
    """``(absent, different)``: the ``name==version`` pins of ``aenv.lock`` text that this
    interpreter does not have, and those it has at another version (``name==want (have X)``)."""
    absent, different = [], []
    for line in lock.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "==" not in line:
            continue
        name, _, version = line.partition("==")
        name, version = name.strip(), version.strip()
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            absent.append(f"{name}=={version}")
            continue
        if have != version:
            different.append(f"{name}=={version} (have {have})")
    return absent, different


def fetch_bundle(
    url: str,
    digest: str,
    into: str | Path | None = None,
    *,
    key: str | None = None,
    max_size: int = DEFAULT_MAX_BUNDLE,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Fetched:
    """Fetch the bundle at ``url``, check it is ``digest``, unpack it in a new directory under
    ``into`` (default: the temporary directory) and check its pins (see the module docstring).

    Raises :class:`ArtifactError` (another digest, a hostile or broken bundle),
    :class:`ArtifactTooLargeError`, :class:`HubUnreachableError` (after ``attempts`` tries),
    :class:`ConfigurationError` (packages the bundle pins are absent here, a redirect), and the
    hub's own errors (401 :class:`~aenv_ray.errors.AuthenticationError`, 404
    :class:`~aenv_ray.errors.EnvironmentNotFoundError`, ...).
    """
    digest = parse_digest(digest)
    data = _with_retries(url, key, max_size, max(1, attempts))
    got = digest_of(data)
    if got != digest:
        raise ArtifactError(
            f"the bundle from {url} has digest {got}, but {digest} was expected; refused "
            "before unpacking (the hub holds other bytes under that version: push again, "
            "or give the version's digest)"
        )
    parent = Path(into) if into is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    # a directory of our own (0700, a fresh name): nothing planted there beforehand is trusted
    home = Path(tempfile.mkdtemp(prefix="aenv-bundle-", dir=parent))
    try:
        project = extract_bundle(data, home / digest.replace(":", "-"))
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    absent, different = missing_requirements((project / LOCK_NAME).read_text(encoding="utf-8"))
    if absent:
        shown = ", ".join(absent[:20]) + (f" and {len(absent) - 20} more" if absent[20:] else "")
        raise ConfigurationError(
            f"the bundle {digest} pins packages this runtime image lacks: {shown}; this "
            "runtime installs nothing: build the environment's own image (`aenv build`, "
            "OwnImage delivery) or a runtime image that has them"
        )
    if different:
        log.warning(
            "the bundle pins other versions than this runtime image has",
            extra={"digest": digest, "packages": different[:50]},
        )
    return Fetched(project, digest, len(data))
