"""``aenv instance create|list|get|delete|renew``: instances on a hub or this machine.

With a hub configured (``AENV_SYSTEM_URL`` or ``aenv config set url``) the commands talk to it:
its instances belong to your key's tenant. With ``AENV_ENGINE=kubernetes`` they talk to the
cluster directly (pods in ``AENV_K8S_NAMESPACE``, outliving the command until deleted or
expired). Otherwise they talk to a local engine daemon
(``local_backend.daemon``, through its client ``DaemonEngine``) over a Unix socket in
the state directory (``AENV_STATE_DIR``, else the user's state directory), started on first
use, so instances live on between commands; they die with the daemon, which exits after ten
minutes without a running instance.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from aenv_cli._common import EXIT_USAGE, console, die, json_format, pairs

__all__ = ["app", "instances", "pairs"]

app = typer.Typer(
    help="Create, list, inspect and delete instances (on the hub when one is configured, "
    "else on this machine's local engine).",
    no_args_is_help=True,
)


async def _on_hub(client: Any, op: str, arg: Any, **kw: Any) -> Any:
    if op == "create":
        return await client.create_instance(arg[0], **kw)
    if op == "list":  # terminated ones too: --all filters here
        return await client.list_instances(env=arg, include_terminated=True)
    if op == "renew":
        return await client.renew_instance(arg, kw["ttl"])
    return await getattr(client, f"{op}_instance")(arg)


async def _on_engine(engine: Any, op: str, arg: Any, **kw: Any) -> Any:
    from aenv_ray.config import parse_duration
    from aenv_ray.engine import InstanceSpec, info_to_json

    raw_ttl = kw.pop("ttl", None)
    ttl = parse_duration(raw_ttl) if raw_ttl is not None else None
    if op == "create":
        kw["arguments"] = tuple(kw["arguments"])
        ref, project = arg
        info = await engine.create(InstanceSpec(env_ref=ref, project=project, ttl=ttl, **kw))
    elif op == "list":
        return [info_to_json(i) for i in await engine.list(env_ref=arg)]
    elif op == "renew":
        assert ttl is not None
        info = await engine.renew(arg, ttl)
    else:
        info = await getattr(engine, op)(arg)
    return info_to_json(info)


def _call(op: str, arg: Any, **kw: Any) -> Any:
    """``op`` (create, list, get, delete, renew) on the hub when one is configured, else on the
    local engine daemon (started on first use); what the command line must change exits 2."""
    from aenv_ray.errors import ConfigurationError
    from aenv_ray.settings import get_settings

    settings = get_settings()

    async def main() -> Any:
        if settings.system_url:
            from aenv_ray.hub import HubClient

            async with HubClient(settings.system_url, api_key=settings.api_key) as client:
                return await _on_hub(client, op, arg, **kw)
        from aenv_ray.engine import new_engine

        if settings.engine == "kubernetes":
            engine = new_engine(
                "kubernetes", session=False, reaper=False, env_path=settings.env_path
            )
        elif settings.engine in ("local", "daemon"):
            # instances outlive this command: the local engine's daemon (AENV_STATE_DIR)
            engine = new_engine("daemon")
        else:
            engine = new_engine(settings.engine)
        try:
            return await _on_engine(engine, op, arg, **kw)
        finally:
            await engine.aclose()

    try:
        return asyncio.run(main())
    except (ConfigurationError, LookupError) as exc:
        die(str(exc), EXIT_USAGE)


def _is_project_path(env: str) -> bool:
    """Whether ``env`` names a project directory rather than an environment: it holds a path
    separator (``./notes``, ``/srv/envs/notes``), as ``aenv rollout ENV`` decides."""
    return "/" in env or "\\" in env


def _target(env: str) -> tuple[str, str | None]:
    """``(env_ref, project directory or None)`` of ``aenv instance create ENV``: a name is
    looked up by the engine (or the hub); a path is the project there, named by its
    ``config.json``. With a hub, instances come from its registry: a path is refused (exit 2)."""
    from aenv_ray.settings import get_settings

    if not _is_project_path(env):
        return env, None
    if get_settings().system_url:
        if Path(env).expanduser().is_dir():
            die(
                f"{env} is a project directory, but with a hub configured instances come from "
                f"its registry: publish it (`aenv push {env}`) and create NAME@VERSION, or unset "
                "AENV_SYSTEM_URL to run it on this machine",
                EXIT_USAGE,
            )
        return env, None  # TENANT/NAME[@VERSION]: the hub's business
    from aenv_ray.config import EnvConfig

    root = Path(env).expanduser().resolve()
    if not root.is_dir():
        die(
            f"no project directory {env} (resolved: {root}); give a directory holding a "
            "config.json, or an environment's NAME[@VERSION]",
            EXIT_USAGE,
        )
    return str(EnvConfig.load(root).ref), str(root)


def _datasource(given: str | None) -> str | None:
    """A local path for the local engine; as given (under the hub's datasource root) for a hub."""
    from aenv_ray.settings import get_settings

    if not given or get_settings().system_url:
        return given
    return str(Path(given).resolve())


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
    if info.get("token"):
        print(f"token    {info['token']}  (send: Authorization: Bearer TOKEN)")
    print(f"created  {_when(info.get('created_at'))}")
    print(f"expires  {_when(info.get('expires_at'))}")
    if info.get("reason"):
        detail = f" ({info['detail']})" if info.get("detail") else ""
        print(f"ended    {info['reason']}{detail}")


JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


@app.command()
def create(
    env: Annotated[
        str,
        typer.Argument(
            help="NAME or NAME@VERSION, or a project directory (a path: ./notes)",
            metavar="NAME[@VERSION]|PATH",
        ),
    ],
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
    """Create an instance of an environment (or of a project directory); print its id and URL."""
    created = _call(
        "create",
        _target(env),
        ttl=ttl,
        environment_variables=pairs(env_var or [], "--env"),
        arguments=arg or [],
        datasource=_datasource(datasource),
    )
    _show(created, as_json)


@app.command("list")
def list_instances(
    env: Annotated[str | None, typer.Option(help="only this NAME or NAME@VERSION")] = None,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include terminated ones")] = False,
    as_json: JsonOption = False,
) -> None:
    """List instances, newest first."""
    from rich.table import Table

    infos = _call("list", env)
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
    console().print(table)


@app.command()
def get(
    instance_id: Annotated[str, typer.Argument(metavar="ID")], as_json: JsonOption = False
) -> None:
    """Show one instance."""
    _show(_call("get", instance_id), as_json)


@app.command()
def delete(
    instance_id: Annotated[str, typer.Argument(metavar="ID")], as_json: JsonOption = False
) -> None:
    """Delete an instance (its processes are killed)."""
    _show(_call("delete", instance_id), as_json)


@app.command()
def renew(
    instance_id: Annotated[str, typer.Argument(metavar="ID")],
    ttl: Annotated[str, typer.Option(help='new lifetime from now, e.g. "1h"')],
    as_json: JsonOption = False,
) -> None:
    """Set an instance to expire TTL from now."""
    _show(_call("renew", instance_id, ttl=ttl), as_json)


def instances(
    name: Annotated[str | None, typer.Option("--name", "-n", help="only this environment")] = None,
    version: Annotated[
        str | None, typer.Option("--version", "-v", help="only this version (with --name)")
    ] = None,
    output: Annotated[str, typer.Option("--format", "-f", help="table or json")] = "table",
    system_url: Annotated[
        str | None, typer.Option("--system-url", help="the hub (default: AENV_SYSTEM_URL)")
    ] = None,
) -> None:
    """AEnvironment's `aenv instances`: the running instances, as `aenv instance list` shows
    them (hidden from `aenv --help`: kept for scripts written for AEnvironment)."""
    json_format(output)
    if version is not None and name is None:
        raise typer.BadParameter("--version needs --name", param_hint="--version")
    if system_url is not None:
        os.environ["AENV_SYSTEM_URL"] = system_url  # this command's process only
    env = f"{name}@{version}" if version else name
    list_instances(env=env, all_=False, as_json=output == "json")
