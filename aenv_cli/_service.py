"""``aenv service create|list|get|update|delete``: long-running services on a hub.

A service keeps REPLICAS instances of a definition running, without TTL, optionally with
persistent storage at ``/storage``; it needs a hub (``AENV_SYSTEM_URL``). On a hub served with
``--engine kubernetes`` a service is a Deployment, a Service and (with storage) a
PersistentVolumeClaim, with a stable in-cluster address (``url``).

May import: typer, rich, ``aenv_ray``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from aenv_cli._common import EXIT_USAGE, console, die, pairs
from aenv_cli._hub import hub_call

if TYPE_CHECKING:
    from aenv_ray.config import ServiceConfig

__all__ = ["app"]

app = typer.Typer(
    help="Create, scale, inspect and delete long-running services on the hub.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]
EnvVars = Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable")]
T = TypeVar("T")


def _call(work: Callable[[Any], Awaitable[T]]) -> T:
    """:func:`hub_call`, an unknown service or env exiting 2 as ``aenv instance`` does (the
    command line must change)."""
    try:
        return hub_call(work)
    except LookupError as exc:
        die(str(exc), EXIT_USAGE)


def _show(service: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(service, indent=2))
        return
    print(f"id        {service['id']}")
    print(f"name      {service['name']}")
    print(f"env       {service['env_ref']}")
    print(f"replicas  {service['ready']}/{service['replicas']} ready")
    print(f"storage   {service.get('storage') or '-'}")
    print(f"address   {service.get('address') or '-'}")
    if service.get("url"):
        print(f"url       {service['url']}")
    for endpoint in service.get("endpoints", []):
        print(f"endpoint  {endpoint}")
    if service.get("detail"):
        print(f"detail    {service['detail']}")


def _from_config(env: str | None) -> tuple[str, ServiceConfig]:
    """The environment to run and its ``deployConfig.service`` defaults: NAME[@VERSION] as
    given (no defaults), or, without one, ``./config.json``'s (as AEnvironment's ``aenv
    service create`` reads the project it runs in)."""
    from aenv_ray.config import EnvConfig, ServiceConfig

    if env:
        return env, ServiceConfig()
    config = EnvConfig.load(Path("."))
    return config.ref, config.deploy_config.service


@app.command()
def create(
    env: Annotated[
        str | None,
        typer.Argument(metavar="NAME[@VERSION]", help="default: ./config.json's name@version"),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            "-r",
            min=0,
            max=64,
            help="instances kept running (default: config.json's service.replicas, else 1)",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", "--service-name", "-s", help="a display name (default: the env's)"),
    ] = None,
    storage: Annotated[
        bool | None,
        typer.Option(
            "--storage/--no-storage",
            "--enable-storage",
            help="persistent storage at /storage (Kubernetes: a PersistentVolumeClaim; "
            "default: config.json's service.enableStorage)",
        ),
    ] = None,
    env_var: EnvVars = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
    as_json: JsonOption = False,
) -> None:
    """Create a service; answers once its replicas serve."""
    if output not in ("table", "json"):
        raise typer.BadParameter(f"`{output}`: use table or json", param_hint="--output")
    as_json = as_json or output == "json"
    variables = pairs(env_var or [], "--env")
    env, defaults = _from_config(env)
    replicas = defaults.replicas if replicas is None else replicas
    storage = defaults.enable_storage if storage is None else storage

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.create_service(
            env, name=name, replicas=replicas, storage=storage, environment_variables=variables
        )
        return result

    _show(_call(work), as_json)


@app.command("list")
def list_services(as_json: JsonOption = False) -> None:
    """List your services."""

    async def work(client: Any) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await client.list_services()
        return result

    services = _call(work)
    if as_json:
        print(json.dumps(services, indent=2))
        return
    from rich.table import Table

    table = Table(box=None)
    for column in ("ID", "NAME", "ENV", "READY", "STORAGE", "CREATED"):
        table.add_column(column)
    for svc in services:
        created = datetime.fromtimestamp(svc["created_at"]).strftime("%Y-%m-%d %H:%M")
        table.add_row(
            svc["id"],
            svc["name"],
            svc["env_ref"],
            f"{svc['ready']}/{svc['replicas']}",
            "yes" if svc.get("storage") else "-",
            created,
        )
    console().print(table)


@app.command()
def get(
    service_id: Annotated[str, typer.Argument(metavar="ID")], as_json: JsonOption = False
) -> None:
    """Show a service and its replicas."""

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.get_service(service_id)
        return result

    _show(_call(work), as_json)


@app.command()
def update(
    service_id: Annotated[str, typer.Argument(metavar="ID")],
    replicas: Annotated[int | None, typer.Option(min=0, max=64, help="scale to")] = None,
    env: Annotated[str | None, typer.Option(help="move to NAME@VERSION")] = None,
    env_var: EnvVars = None,
    as_json: JsonOption = False,
) -> None:
    """Scale a service, or move it to another version or variables (replaced new-first)."""
    variables = pairs(env_var, "--env") if env_var is not None else None

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.update_service(
            service_id, replicas=replicas, env=env, environment_variables=variables
        )
        return result

    _show(_call(work), as_json)


@app.command()
def delete(
    service_id: Annotated[str, typer.Argument(metavar="ID")],
    keep_storage: Annotated[
        bool | None,
        typer.Option(
            "--keep-storage/--delete-storage",
            help="keep or delete its storage (default: a Kubernetes volume is kept, a "
            "directory on the hub deleted)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Delete a service and its replicas; its storage as --keep-storage/--delete-storage say."""

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.delete_service(service_id, keep_storage=keep_storage)
        return result

    _call(work)
    print(f"deleted service {service_id}")
