"""``aenv openenv serve ENV@VERSION``: serve an aenv-ray environment to OpenEnv's clients.

OpenEnv's endpoints (``/ws``, ``/mcp``, ``/health``, ``/schema``, ``/reset``, ``/step``;
:mod:`aenv_openenv.server`), one instance per session on the engine ``--engine`` names, at most
``--max-concurrent-envs`` at once. Stops on Ctrl-C or SIGTERM, releasing every instance.

``aenv openenv provide ENV``: the other way round, an OpenEnv environment server inside one
aenv-ray instance (:class:`aenv_openenv.AenvRayProvider`), reached at the bridge's URL it prints
as a JSON line; what :class:`aenv_openenv.process_provider.AenvRayProcessProvider` runs from
OpenEnv's own virtual environment.

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
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            min=0,
            help="close a session no message has used for this many seconds, releasing its "
            "instance (its client is told SESSION_EXPIRED when it comes back); 0: never",
        ),
    ] = 600.0,
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
        f"at most {max_concurrent_envs} sessions, idle ones closed after "
        f"{f'{idle_timeout:g} s' if idle_timeout else 'never'})",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        create_app(
            env,
            engine=engine,
            max_concurrent_envs=max_concurrent_envs,
            token=token,
            idle_timeout=idle_timeout or None,
        ),
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


def _json_object(text: str, what: str) -> dict[str, str]:
    import json

    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        die(f"{what} is a JSON object of strings: {exc}", EXIT_USAGE)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        die(f"{what} is a JSON object of strings, got {text[:200]}", EXIT_USAGE)
    return {str(k): v for k, v in value.items()}


async def _until_stopped(stop_on_stdin_eof: bool) -> None:
    """Until SIGINT or SIGTERM (whichever thread the kernel gives it to: the loop's wakeup
    descriptor hears it), or standard input's end when told to."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    if stop_on_stdin_eof:

        def watch() -> None:
            with contextlib.suppress(OSError, ValueError):
                sys.stdin.buffer.read()
            loop.call_soon_threadsafe(stopped.set)

        threading.Thread(target=watch, name="aenv-stdin-watch", daemon=True).start()
    await stopped.wait()


class _Stop(Exception):
    """SIGTERM or SIGINT: stop serving."""


def _stop(_signum: int, _frame: object) -> None:
    raise _Stop


@app.command("provide")
def provide(
    env: Annotated[
        str | None,
        typer.Argument(help="the environment, name@version (default: --project's)"),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(help="an OpenEnv project made an aenv-ray environment, run unregistered"),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="the engine that makes the instance: local, daemon, kubernetes"),
    ] = None,
    datasource: Annotated[str, typer.Option(help="the instance's datasource")] = "",
    port: Annotated[int, typer.Option(help="the bridge's port (0: a free one)")] = 0,
    instance_env: Annotated[
        str,
        typer.Option(
            help="the instance's environment variables, a JSON object",
            envvar="AENV_OPENENV_INSTANCE_ENV",
        ),
    ] = "{}",
    server_env: Annotated[
        str,
        typer.Option(
            help="the OpenEnv server's environment variables, a JSON object",
            envvar="AENV_OPENENV_SERVER_ENV",
        ),
    ] = "{}",
    token: Annotated[
        str | None,
        typer.Option(
            help="the bridge requires `Authorization: Bearer TOKEN`",
            envvar="AENV_OPENENV_TOKEN",
        ),
    ] = None,
    stop_on_stdin_eof: Annotated[
        bool,
        typer.Option(
            "--stop-on-stdin-eof",
            help="also stop when standard input closes (the parent that started this died or "
            "is done with it)",
        ),
    ] = False,
) -> None:
    """Run an OpenEnv environment server inside one aenv-ray instance and print, as one JSON
    line, the URL of the bridge OpenEnv's clients use ({"base_url": ..., "instance_id": ...});
    serve until Ctrl-C or SIGTERM (or, with --stop-on-stdin-eof, standard input closing), then
    release the instance."""
    import asyncio
    import json

    from aenv_ray.engine import check_engine_name
    from aenv_ray.errors import AEnvError, ConfigurationError

    try:
        if engine is not None:
            check_engine_name(engine)
    except ConfigurationError as exc:
        die(str(exc), EXIT_USAGE)
    variables = _json_object(instance_env, "--instance-env")
    server_variables = _json_object(server_env, "--server-env")
    from aenv_openenv import AenvRayProvider
    from aenv_ray import Environment

    factory = None
    if project is not None:
        from aenv_ray.config import EnvConfig

        try:
            own = EnvConfig.load(project).ref
        except (OSError, ValueError, AEnvError) as exc:
            die(f"--project {project}: {exc}", EXIT_USAGE)
        if env is not None and env != own:
            die(f"--project {project} is {own}, not {env}", EXIT_USAGE)
        env, root = own, project

        def factory(_ref: str, env_vars: dict[str, str]) -> Environment:
            return Environment.from_project(
                root, engine=engine, datasource=datasource, environment_variables=env_vars
            )

    elif env is None:
        die("name the environment (name@version) or give --project DIR", EXIT_USAGE)
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    provider = AenvRayProvider(
        env,
        engine=engine,
        datasource=datasource,
        server_env=server_variables,
        environment_factory=factory,
        token=token,
    )
    try:
        try:
            url = provider.start_container(port=port or None, env_vars=variables)
        except AEnvError as exc:
            die(f"{type(exc).__name__}: {exc}")
        instance = provider.environment.instance_id if provider.environment else None
        print(json.dumps({"base_url": url, "instance_id": instance}), flush=True)
        asyncio.run(_until_stopped(stop_on_stdin_eof))
        for sig in previous:  # the release below is not cut short by a second signal
            signal.signal(sig, signal.SIG_IGN)
    except _Stop:
        pass
    finally:
        provider.stop_container()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
