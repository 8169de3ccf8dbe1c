"""``aenv openenv serve ENV@VERSION``: serve an aenv-ray environment to OpenEnv's clients.

OpenEnv's endpoints (``/ws``, ``/mcp``, ``/health``, ``/schema``, ``/reset``, ``/step``;
:mod:`aenv_openenv.server`), one instance per session on the engine ``--engine`` names, at most
``--max-concurrent-envs`` at once. Stops on Ctrl-C or SIGTERM, releasing every instance.

May import: typer, ``aenv_ray``; inside commands: ``aenv_openenv``, uvicorn.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from aenv_cli._common import EXIT_USAGE, die

__all__ = ["app"]

app = typer.Typer(help="OpenEnv: serve an environment to OpenEnv's clients.", no_args_is_help=True)


@app.command("serve")
def serve(
    env: Annotated[str, typer.Argument(help="the environment, name@version (built-ins too)")],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    engine: Annotated[
        str | None,
        typer.Option(
            help="the engine that makes each session's instance: local, daemon, kubernetes "
            "(default: the SDK's: a hub when AENV_SYSTEM_URL is set, else AENV_ENGINE, else local)"
        ),
    ] = None,
    max_concurrent_envs: Annotated[
        int,
        typer.Option(
            "--max-concurrent-envs",
            min=1,
            help="sessions (instances) at once; one more is refused with CAPACITY_REACHED",
        ),
    ] = 1,
    token: Annotated[
        str | None,
        typer.Option(
            help="require `Authorization: Bearer TOKEN` on every request and WebSocket "
            "(OpenEnv clients: headers=...); without it anyone who reaches the port can play",
            envvar="AENV_OPENENV_TOKEN",
        ),
    ] = None,
) -> None:
    """Serve ENV to OpenEnv clients (GenericEnvClient, MCPToolClient, TRL's OpenEnv support)."""
    import uvicorn

    from aenv_ray.engine import check_engine_name
    from aenv_ray.errors import ConfigurationError
    from aenv_ray.resolve import resolve_environment

    try:
        if engine is not None:
            check_engine_name(engine)
    except ConfigurationError as exc:
        die(str(exc), EXIT_USAGE)
    from aenv_ray.settings import get_settings

    if engine is not None or not get_settings().system_url:  # a hub resolves its own names
        resolve_environment(env)  # an unknown one exits 2 naming what there is, before serving
    from aenv_openenv import create_app

    if token is None and host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"aenv openenv: warning: serving on {host} without --token: anyone who reaches "
            "the port can open sessions (instances)",
            file=sys.stderr,
        )

    print(
        f"aenv openenv: serving {env} on http://{host}:{port} (engine {engine or 'default'}, "
        f"at most {max_concurrent_envs} sessions)",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        create_app(env, engine=engine, max_concurrent_envs=max_concurrent_envs, token=token),
        host=host,
        port=port,
        log_level="warning",
        ws="websockets",
    )
    _Server(config).run()


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, stopped by SIGINT or SIGTERM as a finished command (exit 0), where
        uvicorn raises the signal again once it has shut down."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _Server(config: Any) -> Any:
    return _server_class()(config)
