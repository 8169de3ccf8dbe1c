"""Registry commands against a hub: ``aenv push|pull|list|get|deprecate|delete``, and
``aenv config`` (the hub's URL and key for every command and for the SDK).

The hub is ``AENV_SYSTEM_URL`` (``aenv config set url URL``) and the key ``AENV_API_KEY``
(``aenv config set api-key KEY``); the variables win over the file. Every hub error comes back
as its :mod:`aenv_ray.errors` class and leaves through ``aenv``'s one-line error rule.

May import: typer, rich, ``aenv_ray`` (its bundle format inside commands); lazily, inside
``list``: ``builtin_envs`` (which built-in lacks its data). Not ``envhub`` nor the runtime: the
load check before a push runs in a sandbox (``_loadcheck``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from aenv_cli._common import EXIT_USAGE, console, die, json_format, one_directory
from aenv_ray.envref import LATEST, EnvRef
from aenv_ray.errors import ConfigurationError, VersionConflictError

__all__ = ["config_app", "hub_call", "register"]

T = TypeVar("T")

config_app = typer.Typer(
    help="Show and set the hub's URL and API key (used by every command and the SDK).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]
_KEYS = {"url": "system_url", "api-key": "api_key"}


def hub_call(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(client)`` against the configured hub; exit 2 when none is configured."""
    from aenv_ray.hub import HubClient
    from aenv_ray.settings import get_settings

    settings = get_settings()
    if not settings.system_url:
        die(
            "no hub configured: set AENV_SYSTEM_URL or run `aenv config set url "
            "http://HOST:PORT` (start one with `aenv serve`)",
            EXIT_USAGE,
        )

    async def main() -> T:
        async with HubClient(settings.system_url or "", api_key=settings.api_key) as client:
            return await work(client)

    return asyncio.run(main())


def _ref(text: str) -> EnvRef:
    """``NAME[@VERSION]`` of the caller's own registry; BadParameter when it is not."""
    try:
        ref = EnvRef.parse(text)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from None
    if ref.tenant is not None:
        raise typer.BadParameter(
            f"`{text}` names tenant `{ref.tenant}`: registry commands take NAME or NAME@VERSION"
        )
    return ref


def _shown(path: Path) -> str:
    """``path`` as the user would type it here: relative to this directory when below it."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def _when(seconds: float | None) -> str:
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M") if seconds else "-"


def push(
    path: Annotated[
        Path,
        typer.Argument(
            help="a project directory (built first) or a bundle written by `aenv build`",
            metavar="PROJECT|BUNDLE",
            exists=True,
        ),
    ] = Path("."),
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            "-w",
            help="the project directory, as AEnvironment names it (the same as PROJECT)",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            "-v",
            help="AEnvironment's: must be config.json's version (the bundle carries it)",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Publish a project (or a built bundle) to the hub as its name@version."""
    path = one_directory(path, work_dir)
    if version is not None and path.is_dir():
        from aenv_ray.config import EnvConfig

        given = EnvConfig.load(path).version
        if version != given:
            die(
                f"--version {version} differs from {_shown(path)}/config.json's version "
                f"{given}: a bundle publishes its config.json as it is; set the version there",
                EXIT_USAGE,
            )
    if path.is_dir():
        from aenv_ray.bundle import build_bundle

        bundle = build_bundle(path)
        data, digest, ref = bundle.data, bundle.digest, bundle.config.ref
        what, shown = ref, _shown(path)
    else:
        from aenv_ray.bundle import digest_of, inspect_bundle

        data = path.read_bytes()
        info = inspect_bundle(data, max_size=max(len(data), 1))
        digest, ref = digest_of(data), info.config.ref
        what, shown = f"{ref} (the bundle {_shown(path)})", ""

    from aenv_cli._loadcheck import check_loads

    check_loads(data, what, shown)  # never publish what cannot load (in a sandbox, as the hub does)

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.push(data, digest=digest)
        return result

    try:
        record = hub_call(work)
    except VersionConflictError as exc:
        # a deleted version's conflict carries no digest: it is never "already published"
        if exc.existing_digest is not None and exc.existing_digest == digest:
            print(f"{ref} is already published with this bundle ({digest}); nothing to do")
            return
        die(str(exc), EXIT_USAGE)  # the project must change: its version is taken
    if as_json:
        print(json.dumps(record, indent=2))
        return
    print(f"published {record['ref']}  {record['digest']}  {record['size']} bytes")


def pull(
    ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION]")],
    dest: Annotated[
        Path | None, typer.Option(help="directory to unpack into (default: ./NAME-VERSION)")
    ] = None,
) -> None:
    """Download a version's bundle (its digest checked) and unpack it as a project."""
    from aenv_ray.bundle import extract_bundle

    wanted = _ref(ref)

    async def work(client: Any) -> tuple[dict[str, Any], bytes]:
        result: tuple[dict[str, Any], bytes] = await client.pull(
            wanted.name, wanted.version or LATEST
        )
        return result

    record, data = hub_call(work)
    target = dest or Path(f"{record['name']}-{record['version']}")
    extract_bundle(data, target)
    print(f"pulled {record['ref']} ({record['digest']}) into {target}")


FormatOption = Annotated[
    str, typer.Option("--format", "-f", help="table or json (json: the same as --json)")
]


def list_envs(
    search: Annotated[
        str, typer.Option("--search", "-s", "--name", help="in names and descriptions")
    ] = "",
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="repeatable")] = None,
    tags: Annotated[
        str | None, typer.Option("--tags", help="comma-separated, AEnvironment's spelling")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include deprecated")] = False,
    limit: Annotated[int | None, typer.Option("--limit", "-l", min=0, help="at most")] = None,
    offset: Annotated[int, typer.Option("--offset", "-o", min=0, help="skip these")] = 0,
    output: FormatOption = "table",
    as_json: JsonOption = False,
) -> None:
    """List the hub's environments (one line per name, its latest version); without a hub,
    those on this machine (built-in and on AENV_ENV_PATH), broken projects included."""
    from aenv_ray.settings import get_settings

    as_json = json_format(output, as_json)
    tag = [*(tag or []), *[t.strip() for t in (tags or "").split(",") if t.strip()]]
    window = slice(offset, None if limit is None else offset + limit)
    if not get_settings().system_url:
        _list_local(search, tag, as_json, window)
        return

    async def work(client: Any) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await client.search(search, tags=tag, deprecated=all_)
        return result

    found = hub_call(work)[window]
    if as_json:
        print(json.dumps(found, indent=2))
        return
    from rich.table import Table

    table = Table(box=None)
    for column in ("NAME", "LATEST", "VERSIONS", "TAGS", "DESCRIPTION"):
        table.add_column(column)
    for env in found:
        table.add_row(
            env["name"],
            env["latest"],
            str(len(env["versions"])),
            ",".join(env["tags"]),
            env["description"],
        )
    console().print(table)


def _list_local(search: str, tags: list[str], as_json: bool, window: slice = slice(None)) -> None:
    """``aenv list`` without a hub: what ``aenv instance create NAME`` and ``Environment(NAME)``
    find here, one line per version, and each broken project with what is wrong in it; a
    built-in that lacks its data (tau2 without its package) says so, and how to install it."""
    from aenv_ray.resolve import available_environments, broken_environments
    from builtin_envs import missing

    lacking = missing()
    rows: list[dict[str, Any]] = []
    for ref, project in sorted(available_environments().items()):
        parsed = EnvRef.parse(ref)
        try:
            config = json.loads((project / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
        rows.append(
            {
                "ref": ref,
                "name": parsed.name,
                "version": parsed.version,
                "project": str(project),
                "tags": [str(t) for t in config.get("tags") or []],
                "description": str(config.get("description") or ""),
                "error": None,
                "missing": lacking.get(ref),
            }
        )
    rows = [
        row
        for row in rows
        if search.lower() in f"{row['name']} {row['description']}".lower()
        and all(t in row["tags"] for t in tags)
    ]
    if not search and not tags:  # a broken project has no name nor tags to filter by
        for config_path, problem in sorted(broken_environments().items()):
            rows.append(
                {
                    "ref": None,
                    "name": None,
                    "version": None,
                    "project": str(config_path.parent),
                    "tags": [],
                    "description": "",
                    "error": problem,
                    "missing": None,
                }
            )
    rows = rows[window]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, title="no hub configured: the environments on this machine")
    for column in ("NAME", "VERSION", "PROJECT", "DESCRIPTION"):
        table.add_column(column, overflow="fold")
    for row in rows:
        if row["error"]:
            table.add_row("[red]broken[/red]", "-", row["project"], row["error"], style="red")
        elif row["missing"]:
            what = escape(f"not ready: {row['missing']}")
            table.add_row(row["name"], row["version"], row["project"], what, style="yellow")
        else:
            table.add_row(row["name"], row["version"], row["project"], row["description"])
    console().print(table)


def get(
    ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION]")],
    version_option: Annotated[
        str | None,
        typer.Option("--version", "-v", help="the version (NAME --version V is NAME@V)"),
    ] = None,
    output: FormatOption = "table",
    as_json: JsonOption = False,
) -> None:
    """Show a version (NAME@VERSION) or every version of a name (NAME)."""
    as_json = json_format(output, as_json)
    wanted = _ref(ref)
    if version_option is not None:
        if wanted.version is not None and wanted.version != version_option:
            raise typer.BadParameter(
                f"`{ref}` names version {wanted.version}, --version says {version_option}"
            )
        wanted = _ref(f"{wanted.name}@{version_option}")
    name, version = wanted.name, wanted.version

    async def work(client: Any) -> Any:
        if version:
            return await client.get_version(name, version)
        return await client.versions(name)

    result = hub_call(work)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    for record in [result] if version else result:
        state = " (deprecated: " + (record["deprecation"] or "no reason given") + ")"
        print(
            f"{record['ref']}{state if record['deprecated'] else ''}\n"
            f"  digest     {record['digest']}  ({record['size']} bytes)\n"
            f"  published  {_when(record['published_at'])} by {record['publisher']}\n"
            f"  tags       {', '.join(record['tags']) or '-'}\n"
            f"  about      {record['description'] or '-'}"
        )


def deprecate(
    ref: Annotated[str, typer.Argument(metavar="NAME@VERSION")],
    message: Annotated[str, typer.Option(help="why, and what to use instead")] = "",
    undo: Annotated[bool, typer.Option("--undo", help="undeprecate")] = False,
) -> None:
    """Deprecate a version: still usable by NAME@VERSION, skipped by NAME alone and listings."""
    wanted = _ref(ref)
    name, version = wanted.name, wanted.version or LATEST

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.deprecate(
            name, version, message=message, deprecated=not undo
        )
        return result

    record = hub_call(work)
    print(f"{record['ref']} is {'deprecated' if record['deprecated'] else 'current again'}")


def delete(
    ref: Annotated[str, typer.Argument(metavar="NAME@VERSION")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
) -> None:
    """Delete a version from the registry; its number can never be published again."""
    wanted = _ref(ref)
    if wanted.is_latest:
        raise typer.BadParameter("name the version to delete: NAME@VERSION")
    name, version = wanted.name, str(wanted.version)
    if not yes:
        typer.confirm(f"delete {wanted} for good?", abort=True)

    async def work(client: Any) -> dict[str, Any]:
        result: dict[str, Any] = await client.delete_version(name, version)
        return result

    record = hub_call(work)
    print(f"deleted {record['ref']}")


# -- aenv config ---------------------------------------------------------------------------------


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        die(f"{path} is not valid JSON ({exc}); fix or delete it", EXIT_USAGE)
    return data if isinstance(data, dict) else {}


def _write_config(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds a key
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2)
    tmp.replace(path)


def _key_name(key: str) -> str:
    if key not in _KEYS:
        raise typer.BadParameter(f"`{key}`: use one of {', '.join(_KEYS)}", param_hint="KEY")
    return _KEYS[key]


@config_app.command("show")
def config_show(as_json: JsonOption = False) -> None:
    """Show the hub URL and key in use, and where each comes from (the key masked)."""
    from aenv_ray.settings import config_file, get_settings

    path = config_file()
    stored = _read_config(path)
    settings = get_settings()
    rows = {}
    for key, field in _KEYS.items():
        value = getattr(settings, field)
        variable = f"AENV_{field.upper()}"
        source = variable if os.environ.get(variable) else ("file" if field in stored else "unset")
        shown = value
        if field == "api_key" and value:
            shown = value[:17] + "…" if len(value) > 17 else "***"
        rows[key] = {"value": shown, "source": source}
    if as_json:
        print(json.dumps({"file": str(path), **rows}, indent=2))
        return
    for key, row in rows.items():
        print(f"{key:8} {row['value'] or '-'}  ({row['source']})")
    print(f"file     {path}")


@config_app.command("set")
def config_set(
    key: Annotated[str, typer.Argument(metavar="KEY", help="url or api-key")],
    value: Annotated[str, typer.Argument(metavar="VALUE")],
) -> None:
    """Set the hub URL (`url`) or API key (`api-key`) in the settings file."""
    from aenv_ray.settings import config_file

    field = _key_name(key)
    if field == "system_url" and "://" not in value:
        raise typer.BadParameter(f"`{value}` is not a URL; write e.g. http://127.0.0.1:8000")
    path = config_file()
    data = _read_config(path)
    data[field] = value.rstrip("/") if field == "system_url" else value
    _write_config(path, data)
    print(f"{key} set in {path}")
    variable = f"AENV_{field.upper()}"
    if os.environ.get(variable):
        print(f"note: {variable} is set in this shell and wins over the file", file=sys.stderr)


@config_app.command("unset")
def config_unset(key: Annotated[str, typer.Argument(metavar="KEY", help="url or api-key")]) -> None:
    """Remove the hub URL or API key from the settings file."""
    from aenv_ray.settings import config_file

    field = _key_name(key)
    path = config_file()
    data = _read_config(path)
    data.pop(field, None)
    _write_config(path, data)
    print(f"{key} unset in {path}")


def register(app: typer.Typer) -> None:
    """Add the registry commands and the ``config`` group to ``app``."""
    app.command("push")(push)
    app.command("pull")(pull)
    app.command("list")(list_envs)
    app.command("get")(get)
    app.command("deprecate")(deprecate)
    app.command("delete")(delete)
    app.add_typer(config_app, name="config")
