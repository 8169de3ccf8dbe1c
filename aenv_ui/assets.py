"""The front-end's files: the page, its script and style (``aenv_ui/static``), and plotly.js.

plotly.js is read from the installed ``plotly`` package (the ``ui`` extra ships it as
``plotly/package_data/plotly.min.js``), found without importing plotly; nothing is fetched
from a CDN and no copy of it is kept here.

    >>> body, kind = asset("app.css")
    >>> kind
    'text/css'
    >>> "aenv-ui" in page(mode="runs", base="")
    True

May import: the standard library, ``aenv_ray.errors``, ``aenv_ray.extras``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

from aenv_ray.errors import MissingExtraError, RunNotFoundError
from aenv_ray.extras import install_hint

__all__ = ["STATIC", "asset", "page", "plotly_js"]

STATIC = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
_FILES = ("app.js", "app.css")
PLOTLY = "plotly.min.js"


@functools.cache
def plotly_js() -> Path:
    """The path of plotly.min.js in the installed ``plotly`` package;
    :class:`~aenv_ray.errors.MissingExtraError` naming the ``ui`` extra when it is not there."""
    spec = importlib.util.find_spec("plotly")
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    for directory in where:
        path = Path(directory) / "package_data" / PLOTLY
        if path.is_file():
            return path
    raise MissingExtraError(
        f"aenv-ray: the UI's charts need the 'ui' extra: {install_hint('ui')}; "
        "plotly (which ships plotly.min.js) not installed",
        extra="ui",
    )


def asset(name: str) -> tuple[bytes, str]:
    """The bytes and content type of asset ``name`` (``app.js``, ``app.css``, ``plotly.min.js``)."""
    if name == PLOTLY:
        return plotly_js().read_bytes(), "text/javascript"
    if name not in _FILES:
        raise RunNotFoundError(f"no asset `{name}`; there are: {', '.join((*_FILES, PLOTLY))}")
    path = STATIC / name
    return path.read_bytes(), _TYPES[path.suffix]


def page(*, mode: str, base: str) -> str:
    """The one HTML page of the UI. ``mode``: ``runs`` (``aenv ui``: the runs' API at
    ``base/api``) or ``hub`` (the hub's ``/ui/``: its ``/v1`` API, the visitor's key);
    ``base``: the path the UI's assets are under."""
    config = json.dumps({"mode": mode, "base": base})
    html = (STATIC / "index.html").read_text()
    return html.replace("{{BASE}}", base).replace("{{CONFIG}}", config)
