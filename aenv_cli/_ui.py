"""``aenv ui DIR``: the Environment Center over rollout runs, in the browser (:mod:`aenv_ui`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register", "ui"]


def ui(
    directory: Annotated[
        Path,
        typer.Argument(help="a run directory (aenv rollout --out DIR) or a directory of them"),
    ] = Path("runs"),
    host: Annotated[
        str, typer.Option(help="address to listen on (loopback unless you mean otherwise)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: a free one)")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(help="the token the URL carries (default: a new random one each start)"),
    ] = None,
    index_dir: Annotated[
        Path | None,
        typer.Option(help="where the runs' indexes live (default: the user's cache directory)"),
    ] = None,
) -> None:
    """Open the Environment Center over rollout runs: runs (live), rewards, trajectories,
    two runs compared. Prints the URL to open (it carries the token); Ctrl-C stops it."""
    from aenv_ray.extras import require_extra

    require_extra("ui", "aenv ui (its charts: plotly.js)")
    from aenv_ui.server import UiServer, serve

    server = UiServer(directory, token=token, index_dir=index_dir)

    def ready(url: str) -> None:
        found = len(server.runs())
        print(
            f"Environment Center on {url} ({found} run{'s' * (found != 1)} in {server.root}); "
            "open it in a browser, Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        if host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"aenv ui: listening on {host}: anyone who reaches it and has the URL can read "
                "these runs",
                file=sys.stderr,
            )

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(server, host=host, port=port, on_ready=ready))


def register(app: typer.Typer) -> None:
    """Add ``ui`` to ``app``."""
    app.command("ui")(ui)
