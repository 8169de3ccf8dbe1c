"""The preview: a directory of the instance that its runtime serves to a browser, read-only, so
that a person can open what an agent built (a web page, a report, a plot).

An environment's code names the directory, when it exists (in a tool, a function or the
health check: not at import time, where an engine's instance has no workspace yet)::

    from aenv_ray.preview import set_preview_directory

    set_preview_directory(Path(os.environ["AENV_WORKSPACE"]) / "site")

and the SDK hands out its address, ``await env.preview_url()``:
``http://127.0.0.1:PORT/aenv/v1/preview/CAPABILITY/``. The runtime serves the directory's
regular files there, on its own port, to whoever holds that URL: a browser cannot send the
instance's token, so an unguessable capability (256 random bits, one per instance process,
never the token) in the path is the authority. The runtime serves the files as untrusted
content: under a Content-Security-Policy ``sandbox`` (the page gets an opaque origin: it can
neither call the runtime's own routes nor read its cookies), with exact content types and
``nosniff``, no symbolic links, no hidden files, no ``..``, nothing above
:data:`~aenv_ray.protocol.MAX_PREVIEW_FILE_BYTES`. See ``docs/protocol.md`` (Preview).

May import: the standard library only (it runs inside instances).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["preview_directory", "set_preview_directory"]

_lock = threading.Lock()
_directory: Path | None = None


def set_preview_directory(path: str | os.PathLike[str] | None) -> None:
    """Serve ``path`` (a directory of this instance) as the preview; ``None`` stops serving.

    A relative path is taken from the working directory now. The directory need not exist
    yet: until it does, the preview answers 404.
    """
    global _directory
    with _lock:
        _directory = None if path is None else Path(os.path.abspath(os.fspath(path)))


def preview_directory() -> Path | None:
    """The directory the preview serves, or None when the environment named none."""
    with _lock:
        return _directory
