"""``aenv serve`` (the hub) and ``aenv keys create|list|revoke`` (its API keys).

Keys are managed on the hub's machine, straight in its store (``--store``, the same URL the
hub uses): whoever can write the store is the hub's administrator. The hub's code (FastAPI,
uvicorn, the stores) is imported inside the commands only.

May import: typer, ``aenv_ray``; inside commands: ``envhub``, ``aenv_ui`` (the UI's page at
``/ui/``), rich (the keys' table), platformdirs (the default data directory). Engines are
made by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from aenv_cli._common import console

__all__ = ["keys_app", "register"]

keys_app = typer.Typer(
    help="Create, list and revoke the hub's API keys (run on the hub's machine).",
    no_args_is_help=True,
)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="sqlite:///path/hub.db or redis://host:6379/0 (default: the user data dir's hub.db)",
        envvar="AENV_HUB_STORE",
    ),
]


_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([kKmMgG]?)[bB]?", text.strip())
    if not match:
        raise typer.BadParameter(
            f"`{text}` is not a size; write e.g. 64M", param_hint="--max-bundle"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def _data_dir(given: Path | None) -> Path:
    if given is not None:
        return given.resolve()
    import platformdirs

    return Path(platformdirs.user_data_dir("aenv-ray")) / "hub"


def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: a free one)")] = 8000,
    store: StoreOption = None,
    auth: Annotated[
        bool, typer.Option("--auth/--no-auth", help="require API keys (--no-auth: loopback only)")
    ] = True,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="unpacked bundles, service storage, the engine's state"),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="daemon: the local engine in an engine daemon of its own (instances outlive a "
            "hub restart); local: the local engine in this process (instances end with it); "
            "kubernetes: pods in the cluster of KUBECONFIG or of the hub's service account "
            "(AENV_K8S_NAMESPACE, AENV_K8S_IMAGE_PREFIX; pods outlive a hub restart); or "
            "another installed engine"
        ),
    ] = "daemon",
    max_bundle: Annotated[str, typer.Option(help="largest bundle accepted, e.g. 64M")] = "64M",
    datasource_root: Annotated[
        Path | None, typer.Option(help="instances may mount directories under this as /data")
    ] = None,
    limits: Annotated[
        Path | None,
        typer.Option(
            help="a JSON file of per-tenant quotas and caps (docs/envhub.md); default: the "
            "built-in defaults",
            envvar="AENV_HUB_LIMITS",
        ),
    ] = None,
    allow_network: Annotated[
        bool,
        typer.Option(
            "--allow-network",
            help="let instances have the network when their deployConfig asks (default: "
            "refused; per tenant: `network` in --limits)",
        ),
    ] = False,
    pod_template_allow: Annotated[
        list[str] | None,
        typer.Option(
            "--pod-template-allow",
            metavar="PATH",
            help="let every tenant's deployConfig.customPodTemplate set this field beyond the "
            "allow-list, e.g. spec.tolerations or spec.containers[].securityContext."
            "seLinuxOptions (repeat for more; per tenant: `pod_template_allow` in --limits; "
            "docs/kubernetes.md)",
        ),
    ] = None,
    warm: Annotated[
        list[str] | None,
        typer.Option(
            help="REF=N: keep N free instances of REF started, claimed by creates that ask "
            "nothing else (repeat for more; needs --engine kubernetes)",
        ),
    ] = None,
    secret_file: Annotated[
        Path | None,
        typer.Option(
            help="a file holding the hub secret that seals the instance tokens the store keeps "
            "(the same for every hub sharing a store; default: $AENV_HUB_SECRET, else "
            "DATA_DIR/hub-secret, made on first start)",
            envvar="AENV_HUB_SECRET_FILE",
        ),
    ] = None,
    metrics_token_file: Annotated[
        Path | None,
        typer.Option(
            help="a file holding the bearer token a Prometheus scraper sends to GET /metrics "
            "(then only it may scrape; default: any API key of the hub; docs/observability.md)",
            envvar="AENV_HUB_METRICS_TOKEN_FILE",
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(help="seconds a request's line and headers may take to arrive (slowloris)"),
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="seconds a request's body may pause between two reads")
    ] = 30.0,
    client_connections: Annotated[
        int,
        typer.Option(
            help="connections one client address (an IPv6 /64) may hold at once; more get 429 "
            "(0: no limit; behind a reverse proxy every client is the proxy)"
        ),
    ] = 256,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="connections the hub holds at once (default: from the open files limit, at "
            "most 8192); a new one replaces the oldest still sending its headers"
        ),
    ] = None,
    auth_failures: Annotated[
        int,
        typer.Option(
            help="failed authentications one client address may have per --auth-window; then "
            "429 with Retry-After (0: no limit)"
        ),
    ] = 30,
    auth_window: Annotated[
        float,
        typer.Option(
            help="seconds over which a client's --auth-failures refill; it is forgotten this "
            "long after its last failure"
        ),
    ] = 60.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
) -> None:
    """Serve EnvHub: the registry and the control plane, with its OpenAPI document at /docs."""
    # glibc's allocator (memory back to its level after an attack) was chosen before the app
    # was imported: aenv_cli.main re-runs the program with it once
    from aenv_ray.logs import configure_logging
    from envhub.app import HubOptions
    from envhub.defences import Defences
    from envhub.limits import load_limits
    from envhub.server import check_exposure
    from envhub.server import serve as run_hub
    from envhub.store import default_store_url

    tenant_limits = load_limits(
        limits,
        allow_network=allow_network,
        pod_template_allow=frozenset(pod_template_allow or ()),
    )
    defences = Defences(
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        client_connections=client_connections,
        max_connections=max_connections,
        auth_failures=auth_failures,
        auth_window=auth_window,
    )
    check_exposure(host, auth, tenant_limits)
    configure_logging(log_level.upper())
    root = _data_dir(data_dir)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = _engine_name(engine)
    warm_pools = _warm_pools(warm or [], engine)
    from envhub.seal import SECRET_ENV, hub_secret

    # read, then gone from this process's variables: the engine daemon it starts needs none
    secret = hub_secret(root, given=os.environ.pop(SECRET_ENV, None) or None, file=secret_file)
    sandbox = _engine(engine, root, tenant_limits)
    options = HubOptions(
        secret=secret,
        auth=auth,
        data_dir=root,
        max_bundle=_size(max_bundle),
        datasource_root=datasource_root.resolve() if datasource_root else None,
        limits=tenant_limits,
        warm=warm_pools,
        defences=defences,
        metrics_token=_metrics_token(metrics_token_file),
    )
    store_url = store or default_store_url()

    def ready(url: str) -> None:  # the line tests and scripts wait for
        mode = "on" if auth else "off (loopback only)"
        print(
            f"EnvHub on {url} (store {_safe(store_url)}, engine {engine}, auth {mode}); "
            f"API documented at {url}/docs; the UI at {url}/ui/",
            file=sys.stderr,
            flush=True,
        )

    async def main() -> None:
        if auth:
            await _warn_without_keys(store_url)
        try:
            await run_hub(
                host=host,
                port=port,
                store_url=store_url,
                engine=sandbox,
                options=options,
                on_ready=ready,
                log_level="warning" if log_level.lower() == "info" else log_level.lower(),
                extend=_ui_page,
            )
        finally:
            await sandbox.aclose()  # the daemon engine's instances live on; in-process ones end

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def _metrics_token(path: Path | None) -> str | None:
    """The scrape token in ``path`` (``--metrics-token-file``), at least 16 characters."""
    from aenv_ray.errors import ConfigurationError

    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"--metrics-token-file {path}: {exc.strerror}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise ConfigurationError(
            f"--metrics-token-file {path}: the token must be at least 16 characters without "
            "spaces (e.g. `openssl rand -hex 24 > FILE`)"
        )
    return token


def _ui_page(app: Any) -> None:
    """Add the Environment Center's page to the hub (``/ui/``: :mod:`aenv_ui.hub`), with the
    API of the runs drivers pushed (``/ui/api/runs...``): the caller's tenant's, by its key."""
    from aenv_ui.hub import mount
    from envhub.routes.context import caller, serving

    async def tenant_runs(request: Any) -> tuple[Path, str]:
        who = await caller(request)  # the hub's own authentication: 401/403/429 as anywhere
        return serving(request).runs.tenant_dir(who.tenant), who.tenant

    data_dir: Path = app.state.hub.options.data_dir
    mount(app, tenant_runs, data_dir / "runs-index")


def _warm_pools(given: list[str], engine: str) -> dict[str, int]:
    """``--warm REF=N`` options as ``{ref: n}``; a malformed one exits 2."""
    pools: dict[str, int] = {}
    for item in given:
        ref, _, count = item.rpartition("=")
        if not ref or not count.isdigit() or int(count) < 1:
            raise typer.BadParameter(f"`{item}`: write REF=N, N >= 1", param_hint="--warm")
        pools[ref] = int(count)
    if pools and engine != "kubernetes":
        raise typer.BadParameter(
            "warm pools need an engine that keeps them: --engine kubernetes", param_hint="--warm"
        )
    return pools


_RENAMED = {"inprocess": "local"}
"""Engine names ``aenv serve`` took before every command used one set (a note says the new one)."""


def _engine_name(given: str) -> str:
    """``--engine``'s value as an engine name; an old spelling is taken with a note, an unknown
    name exits 2 listing the engines there are."""
    from aenv_ray.engine import check_engine_name
    from aenv_ray.errors import ConfigurationError

    name = _RENAMED.get(given, given)
    if name != given:
        print(f"aenv serve: --engine {given} is now --engine {name}", file=sys.stderr)
    try:
        return check_engine_name(name)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--engine") from None


def _engine(name: str, root: Path, limits: Any) -> Any:
    """The hub's sandbox engine, by name (:func:`aenv_ray.engine.new_engine`): ``daemon``, the
    local engine in its daemon under ``root/engine`` (instances outlive a hub restart);
    ``local``, the local engine in this process; ``kubernetes``, pods (outliving the hub; the
    reaper ends expired ones), their templates checked against what any tenant of ``limits``
    may set (the hub checks each tenant's own); another installed engine with no options."""
    from aenv_ray.engine import new_engine

    if name == "daemon":
        return new_engine("daemon", state_dir=root / "engine", env_path=None)
    if name == "kubernetes":  # pods outlive the hub, found by id
        return new_engine(
            "kubernetes", session=False, pod_template_policy=limits.engine_pod_policy()
        )
    return new_engine(name)


def _safe(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", url)


async def _warn_without_keys(store_url: str) -> None:
    from envhub.keys import list_keys
    from envhub.store import open_store

    store = await open_store(store_url)
    try:
        if not any(k.active for k in await list_keys(store)):
            print(
                "envhub: no API key exists yet, so every request will get 401; create one with "
                f"`aenv keys create --tenant NAME --store {_safe(store_url)}`",
                file=sys.stderr,
            )
    finally:
        await store.aclose()


async def _with_store(store_url: str | None, work: Any) -> Any:
    from envhub.store import open_store

    store = await open_store(store_url)
    try:
        return await work(store)
    finally:
        await store.aclose()


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="who owns what the key creates")],
    name: Annotated[str, typer.Option(help="a note: whose key, what for")] = "",
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Create an API key; the key is printed once, only its hash is stored."""
    from envhub.keys import create_key

    async def work(s: Any) -> Any:
        return await create_key(s, tenant=tenant, name=name)

    record, secret = asyncio.run(_with_store(store, work))
    if as_json:
        print(json.dumps({**record.public(), "key": secret}, indent=2))
        return
    print(secret)
    print(
        f"key {record.id} for tenant {record.tenant}: shown once; use it as AENV_API_KEY or "
        "`aenv config set api-key KEY`",
        file=sys.stderr,
    )


@keys_app.command("list")
def keys_list(
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List the keys (never their secrets)."""
    from envhub.keys import list_keys

    keys = asyncio.run(_with_store(store, list_keys))
    if as_json:
        print(json.dumps([k.public() for k in keys], indent=2))
        return
    from rich.table import Table

    table = Table(box=None)
    for column in ("ID", "TENANT", "NAME", "CREATED", "STATE"):
        table.add_column(column)
    for key in keys:
        created = datetime.fromtimestamp(key.created_at).strftime("%Y-%m-%d %H:%M")
        table.add_row(key.id, key.tenant, key.name, created, "active" if key.active else "revoked")
    console().print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(metavar="ID", help="the key's id (`aenv keys list`)")],
    store: StoreOption = None,
) -> None:
    """Revoke a key: requests with it get 401 from now on, on every hub sharing the store."""
    from envhub.keys import revoke_key

    async def work(s: Any) -> Any:
        return await revoke_key(s, key_id)

    key = asyncio.run(_with_store(store, work))
    print(f"revoked key {key.id} (tenant {key.tenant})")


def register(app: typer.Typer) -> None:
    """Add ``serve`` and the ``keys`` group to ``app``."""
    app.command("serve")(serve)
    app.add_typer(keys_app, name="keys")
