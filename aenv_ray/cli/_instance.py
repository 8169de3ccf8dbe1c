"""``aenv instance create|list|get|delete|renew``: instances on a hub or this machine.

With a hub configured (``AENV_SYSTEM_URL`` or ``aenv config set url``) the commands talk to it:
its instances belong to your key's tenant. Otherwise they talk to a local engine daemon
(``sandbox_runtime.local.daemon``) over a Unix socket in the state directory
(``AENV_STATE_DIR``, else the user's state directory), starting it on first use, so instances
live on between commands; they die with the daemon, which exits after ten minutes without a
running instance.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from aenv_ray.cli._common import EXIT_FAILURE, EXIT_USAGE, die

__all__ = ["app", "pairs"]

app = typer.Typer(
    help="Create, list, inspect and delete instances (on the hub when one is configured, "
    "else on this machine's local engine).",
    no_args_is_help=True,
)

_SOCKET = "engine.sock"


def _state_dir() -> Path:
    from aenv_ray.settings import get_settings

    configured = get_settings().state_dir
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_state_dir("aenv-ray")) / "engine"


def _start_daemon(state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = (state / "daemon.log").open("ab")
    subprocess.Popen(
        [sys.executable, "-m", "sandbox_runtime.local.daemon", "--state-dir", str(state)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # outlives this command; its instances die with it
    )
    log.close()


async def _hub_request(url: str, method: str, path: str, body: Any) -> Any:
    from aenv_ray.errors import ConfigurationError
    from aenv_ray.hub import HubClient
    from aenv_ray.settings import get_settings

    async with HubClient(url, api_key=get_settings().api_key) as client:
        try:
            return await client.request(method, path, json=body)
        except (ConfigurationError, LookupError) as exc:
            die(str(exc), EXIT_USAGE)


async def _request(method: str, path: str, body: Any = None) -> Any:
    import aiohttp

    from aenv_ray.settings import get_settings

    hub = get_settings().system_url
    if hub:
        if method == "GET" and path.split("?")[0] == "/v1/instances":  # --all filters here
            path += ("&" if "?" in path else "?") + "all=true"
        return await _hub_request(hub, method, path, body)

    state = _state_dir()
    started = False
    deadline = time.monotonic() + 60
    while True:
        try:
            connector = aiohttp.UnixConnector(path=str(state / _SOCKET))
            url = f"http://engine{path}"
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.request(method, url, json=body) as reply,
            ):
                data = await reply.json()
                if reply.status >= 400:
                    code = EXIT_USAGE if reply.status in (400, 404) else EXIT_FAILURE
                    die(str(data.get("error")), code)
                return data
        except (aiohttp.ClientConnectorError, FileNotFoundError):
            if not started:
                _start_daemon(state)
                started = True
            if time.monotonic() > deadline:
                die(
                    f"the local engine daemon did not start; see {state / 'daemon.log'}",
                    EXIT_FAILURE,
                )
            await asyncio.sleep(0.05)


def _datasource(given: str | None) -> str | None:
    """A local path for the local engine; as given (under the hub's datasource root) for a hub."""
    from aenv_ray.settings import get_settings

    if not given or get_settings().system_url:
        return given
    return str(Path(given).resolve())


def _call(method: str, path: str, body: Any = None) -> Any:
    return asyncio.run(_request(method, path, body))


def _when(seconds: float | None) -> str:
    if not seconds:
        return "-"
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _show(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print(f"id       {info['id']}")
    print(f"env      {info['env_ref']}")
    print(f"state    {info['state']}")
    print(f"url      {info.get('url') or '-'}")
    print(f"created  {_when(info.get('created_at'))}")
    print(f"expires  {_when(info.get('expires_at'))}")
    if info.get("reason"):
        detail = f" ({info['detail']})" if info.get("detail") else ""
        print(f"ended    {info['reason']}{detail}")


def pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"`{item}` is not KEY=VALUE", param_hint=option)
        out[key] = value
    return out


JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


@app.command()
def create(
    env: Annotated[str, typer.Argument(help="NAME or NAME@VERSION", metavar="NAME[@VERSION]")],
    ttl: Annotated[
        str | None, typer.Option(help='lifetime, e.g. "30m", "1h" (default: config, 30m)')
    ] = None,
    env_var: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable")
    ] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", help="argument, repeatable")] = None,
    datasource: Annotated[
        str | None,
        typer.Option(help="directory mounted at /data (on a hub: under its --datasource-root)"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create an instance; print its id and URL."""
    body = {
        "env": env,
        "ttl": ttl,
        "environment_variables": pairs(env_var or [], "--env"),
        "arguments": arg or [],
        "datasource": _datasource(datasource),
    }
    _show(_call("POST", "/v1/instances", body), as_json)


@app.command("list")
def list_instances(
    env: Annotated[str | None, typer.Option(help="only this NAME or NAME@VERSION")] = None,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include terminated ones")] = False,
    as_json: JsonOption = False,
) -> None:
    """List instances, newest first."""
    from rich.console import Console
    from rich.table import Table

    query = f"?env={env}" if env else ""
    infos = _call("GET", f"/v1/instances{query}")["instances"]
    if not all_:
        infos = [i for i in infos if i["state"] != "terminated"]
    if as_json:
        print(json.dumps(infos, indent=2))
        return
    table = Table(box=None)
    for column in ("ID", "ENV", "STATE", "URL", "EXPIRES"):
        table.add_column(column)
    for info in infos:
        state = info["state"] + (f" ({info['reason']})" if info.get("reason") else "")
        table.add_row(
            info["id"], info["env_ref"], state, info.get("url") or "-", _when(info["expires_at"])
        )
    Console().print(table)


@app.command()
def get(
    instance_id: Annotated[str, typer.Argument(metavar="ID")], as_json: JsonOption = False
) -> None:
    """Show one instance."""
    _show(_call("GET", f"/v1/instances/{instance_id}"), as_json)


@app.command()
def delete(
    instance_id: Annotated[str, typer.Argument(metavar="ID")], as_json: JsonOption = False
) -> None:
    """Delete an instance (its processes are killed)."""
    _show(_call("DELETE", f"/v1/instances/{instance_id}"), as_json)


@app.command()
def renew(
    instance_id: Annotated[str, typer.Argument(metavar="ID")],
    ttl: Annotated[str, typer.Option(help='new lifetime from now, e.g. "1h"')],
    as_json: JsonOption = False,
) -> None:
    """Set an instance to expire TTL from now."""
    _show(_call("POST", f"/v1/instances/{instance_id}/renew", {"ttl": ttl}), as_json)
