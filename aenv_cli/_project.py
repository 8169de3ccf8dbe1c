"""Commands on one environment project directory: ``aenv init``, ``aenv run``, ``aenv test``.

The runtime (uvicorn, FastMCP) is imported inside ``run`` only, so ``aenv --help`` stays quick.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from aenv_cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, WorkDir, die, one_directory
from aenv_ray.config import EnvConfig
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, DEFAULT_MCP_PORT

if TYPE_CHECKING:
    from sandbox_runtime import LoadedProject

__all__ = ["register"]

ProjectDir = Annotated[
    Path,
    typer.Argument(
        help="the project directory (holds config.json)",
        metavar="DIR",
        exists=True,
        file_okay=False,
        dir_okay=True,
        show_default=True,
    ),
]


def _check_name(name: str) -> str:
    try:
        EnvConfig.model_validate({"name": name})
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise typer.BadParameter(f"`{name}` {reason}") from exc
    return name


def _shown(path: Path) -> str:
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def _check_version(version: str) -> str:
    try:
        EnvConfig.model_validate({"name": "x", "version": version})
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise typer.BadParameter(f"`{version}` {reason}") from exc
    return version


def _config_only(parent: Path, name: str, version: str, force: bool) -> None:
    """``aenv init --config-only``: ``config.json`` alone, in ``parent`` itself (as
    AEnvironment's ``aenv init --config-only`` writes it)."""
    from aenv_cli._scaffold import config_text

    path = parent / "config.json"
    if path.exists() and not force:
        die(f"{_shown(path)} already exists; pass --force to overwrite it", EXIT_USAGE)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_text(name, version), encoding="utf-8")
    except OSError as exc:
        die(f"cannot write {_shown(path)}: {exc.strerror or exc}", EXIT_FAILURE)
    print(f"created {name}@{version}'s config.json in {_shown(parent)}/")


def init(
    name: Annotated[
        str,
        typer.Argument(
            help="the environment's name: letters, digits, `-`, `_`",
            metavar="NAME",
            callback=_check_name,
        ),
    ],
    parent: Annotated[
        Path,
        typer.Option(
            "--dir",
            "--work-dir",
            "-w",
            help="create the project inside this directory (--work-dir: AEnvironment's name)",
        ),
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", help="write the files into an existing directory")
    ] = False,
    version: Annotated[
        str,
        typer.Option("--version", "-v", help="the version in config.json", callback=_check_version),
    ] = "1.0.0",
    config_only: Annotated[
        bool,
        typer.Option("--config-only", help="write config.json alone, into --dir itself"),
    ] = False,
    template: Annotated[
        str,
        typer.Option("--template", "-t", help="the project template (one: default)"),
    ] = "default",
) -> None:
    """Create a working example project NAME/ offline: config.json, src/, tests/, Dockerfile."""
    from aenv_cli._scaffold import write_project

    if template != "default":
        raise typer.BadParameter(f"`{template}`: the one template is `default`", param_hint="-t")
    if config_only:
        _config_only(parent, name, version, force)
        return
    root = parent / name
    if root.exists() and not root.is_dir():
        die(f"{_shown(root)} exists and is not a directory", EXIT_USAGE)
    if root.exists() and not force:
        die(
            f"{_shown(root)} already exists; pick another NAME or --dir, or pass --force to "
            "write the example files into it",
            EXIT_USAGE,
        )
    try:
        written = write_project(root, name, version)
    except OSError as exc:
        die(f"cannot write {_shown(root)}: {exc.strerror or exc}", EXIT_FAILURE)
    shown = _shown(root)
    print(f"created {name}@{version} in {shown}/")
    for path in written:
        print(f"  {path.relative_to(root).as_posix()}")
    print("next:")
    print(f"  aenv test {shown}    run its tests")
    print(f"  aenv run {shown}     serve it on http://127.0.0.1:{DEFAULT_FUNCTIONS_PORT}")
    print(f"  aenv build {shown}   bundle it and build its image (Dockerfile)")


def _banner(ref: str, root: Path, summary: str, addresses: list[tuple[str, int]]) -> str:
    def url(host: str, port: int) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    (fn_host, fn_port), (mcp_host, mcp_port) = addresses[0], addresses[-1]
    local = fn_host in ("127.0.0.1", "0.0.0.0", "localhost")
    if local and fn_port == DEFAULT_FUNCTIONS_PORT:
        hint = "http://localhost"
    else:
        hint = url(fn_host, fn_port)
    return "\n".join(
        [
            f"aenv: serving {ref} ({summary}) from {_shown(root)}",
            f"  tools, functions, health  {url(fn_host, fn_port)}",
            f"  MCP                       {url(mcp_host, mcp_port)}/mcp",
            f"  SDK                       DUMMY_INSTANCE_IP={hint} python your_agent.py",
            "  stop                      Ctrl-C",
        ]
    )


def _summary(project: LoadedProject) -> str:
    registry = project.registry
    parts = [f"{len(registry.tools)} tool{'s' if len(registry.tools) != 1 else ''}"]
    if registry.functions:
        count = len(registry.functions)
        parts.append(f"{count} function{'s' if count != 1 else ''}")
    if registry.reward is not None:
        parts.append("reward")
    if registry.health is not None:
        parts.append("health")
    return ", ".join(parts)


def run(
    directory: ProjectDir = Path("."),
    work_dir: WorkDir = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="port of tools, functions and health", min=0, max=65535)
    ] = DEFAULT_FUNCTIONS_PORT,
    mcp_port: Annotated[
        int, typer.Option(help="port of MCP (/mcp)", min=0, max=65535)
    ] = DEFAULT_MCP_PORT,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="no banner, no info logs (warnings stay)")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="tracebacks in error results")] = False,
    default_timeout: Annotated[
        float, typer.Option(help="seconds a call may run when its tool sets no timeout")
    ] = 600.0,
    inspector_port: Annotated[
        int | None,
        typer.Option(
            help="AEnvironment's MCP Inspector port: not used (no Inspector is started; point "
            "any MCP client at the MCP URL)",
            hidden=True,
        ),
    ] = None,
) -> None:
    """Serve a project on this machine until Ctrl-C (the SDK finds it via DUMMY_INSTANCE_IP)."""
    directory = one_directory(directory, work_dir)
    if inspector_port is not None:
        print(
            "aenv: note: --inspector-port is not used: aenv-ray starts no MCP Inspector; any "
            "MCP client can use the MCP URL below",
            file=sys.stderr,
        )
    if default_timeout <= 0:
        raise typer.BadParameter(
            "must be a positive number of seconds", param_hint="--default-timeout"
        )
    from aenv_ray.logs import configure_logging
    from sandbox_runtime import RuntimeServer, end_process, load_project

    configure_logging("WARNING" if quiet else "INFO")
    project = load_project(directory)
    ports = [port] if port == mcp_port and port != 0 else [port, mcp_port]
    try:
        server = RuntimeServer(
            project, host=host, ports=ports, default_timeout=default_timeout, debug=debug
        )
    except OSError as exc:
        die(exc.strerror or str(exc), EXIT_FAILURE)
    if not quiet:
        ref, summary = project.config.ref, _summary(project)
        print(_banner(ref, project.root, summary, server.addresses), flush=True)
    server.run()  # on the main thread: SIGALRM interrupts sync tools; SIGTERM/SIGINT stop it
    end_process(EXIT_OK)  # exit handlers run; a thread the project left running cannot hang it


def test_project(
    directory: ProjectDir = Path("."),  # noqa: PT028 (a command, not a test)
    work_dir: WorkDir = None,  # noqa: PT028
) -> None:
    """Run the project's testConfig.script in its directory; exit with the script's code.

    `python` in the script is the interpreter running aenv: its directory comes first on PATH.
    """
    root = one_directory(directory, work_dir).resolve()
    config = EnvConfig.load(root)
    script = config.test_config.script.strip()
    if not script:
        die(
            f"{config.ref} at {_shown(root)} has no test script; set testConfig.script in "
            'config.json, e.g. "python -m pytest -q tests"',
            EXIT_USAGE,
        )
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    print(f"aenv: testing {config.ref}: {script}", file=sys.stderr, flush=True)
    code = subprocess.run(script, shell=True, cwd=root, env=env, check=False).returncode
    raise typer.Exit(code if code >= 0 else 128 - code)


def register(app: typer.Typer) -> None:
    """Add ``init``, ``run`` and ``test`` to ``app``."""
    app.command("init")(init)
    app.command("run")(run)
    app.command("test")(test_project)
