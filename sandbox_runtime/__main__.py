"""``python -m sandbox_runtime PROJECT [--host H] [--port P ...]``: serve one project.

This is what an engine starts inside each instance; ``aenv run`` is the friendly front end.
Exit codes, as ``aenv run``: 0 stopped by a signal, 1 cannot serve (a port in use, the hub
unreachable), 2 usage or project error (a bundle refused), 70 broken (an async call blocked the
server; see ``RuntimeServer.on_broken``).

From a hub instead of a directory (a generic runtime image, :mod:`sandbox_runtime._fetch`):
``python -m sandbox_runtime --bundle URL --digest sha256:HEX [--bundle-dir DIR] [--max-bundle
BYTES] [--fetch-attempts N] [options]``, where ``URL`` is EnvHub's
``HUB/v1/envs/NAME/VERSION/bundle`` and the hub key comes from the ``AENV_BUNDLE_KEY`` variable.
The bundle is fetched, its digest checked before anything is unpacked, unpacked with the hub's
checks under ``DIR`` (default: the temporary directory), then this program runs again in place
(``exec``) as ``python -m sandbox_runtime UNPACKED [options]`` with the key gone from its
environment and its memory: the environment's code never sees it.

A built-in environment of the packages installed beside the runtime (a generic runtime image
carries aenv-ray's, :mod:`builtin_envs`): ``python -m sandbox_runtime --builtin NAME@VERSION
[--definition sha256:HEX] [options]`` serves that built-in's project from the installed package,
with no project directory named and nothing fetched. A name the installed packages do not ship,
or a copy whose :func:`~aenv_ray.bundle.definition_digest` is not the one given (the engine's
copy's: an image of another aenv-ray), is an error (exit 2) saying which and what to do.

Limits (:mod:`sandbox_runtime._limits`): ``--cgroup`` finds this process's own cgroup and its
limits (a container's); or name them: ``--memory-limit 512M --pids-limit 128`` with the cgroup's
event files opened by the caller and passed as ``--memory-events-fd``/``--pids-events-fd``;
``--rlimits-only`` when no cgroup enforces them (rlimits stand in).

The instance token (every request must carry ``Authorization: Bearer TOKEN``) comes from the
``AENV_RUNTIME_TOKEN`` environment variable or ``--token-file``; or the runtime is given only the
token's SHA-256, in ``AENV_RUNTIME_TOKEN_SHA256`` (64 hex digits; what the Kubernetes engine
gives a pod, whose spec anyone who may read pods reads) or ``--token-sha256 HEX``, and accepts a
request whose token has that digest. Neither given: no token (anyone who reaches the port may
call; ``aenv run`` on a developer's machine).

**Secrets leave no copy behind** (:data:`SECRET_VARIABLES`: the token and the bundle key). A
process's initial environment block stays readable in ``/proc/<pid>/environ`` for its whole life,
whatever ``os.environ`` says later, so removing a variable from ``os.environ`` is not enough. When
either variable is set, the program's first act (before any import of the project, before the
arguments are even parsed) is to run itself again in place (``exec``, same pid) with an
environment without them, handing their values over through an inherited pipe
(``--secrets-fd N``: only the descriptor's number is in the command line; the new process reads
the pipe to its end and closes it). The bundle's second ``exec`` hands the token on the same way
and the key not at all. The environment's code, and the commands its tools run, find neither in
``/proc/*/environ`` nor in ``/proc/*/cmdline``. (The token stays in the runtime's memory, where it
checks requests.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from aenv_ray.config import parse_memory
from aenv_ray.errors import AEnvError, ConfigurationError, HubUnreachableError
from aenv_ray.logs import configure_logging
from aenv_ray.protocol import (
    BUNDLE_KEY_ENV,
    DEFAULT_FUNCTIONS_PORT,
    DEFAULT_MCP_PORT,
    MAX_TIMEOUT,
    TOKEN_ENV,
    TOKEN_SHA256_ENV,
)
from sandbox_runtime import _limits, contain
from sandbox_runtime._loader import load_project
from sandbox_runtime.server import RuntimeServer, end_process


def _limits_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.cgroup:
        _limits.install(_limits.discover())
        return
    given = (args.memory_limit, args.pids_limit, args.memory_events_fd, args.pids_events_fd)
    if all(value is None for value in given):
        return
    try:
        memory = parse_memory(args.memory_limit) if args.memory_limit is not None else None
    except AEnvError as exc:
        parser.error(f"--memory-limit: {exc}")
    for fd in (args.memory_events_fd, args.pids_events_fd):
        if fd is not None:
            try:
                os.fstat(fd)
            except OSError:
                parser.error(f"fd {fd} is not open: pass the cgroup's event file as that fd")
    _limits.install(
        _limits.InstanceLimits(
            memory=memory,
            pids=args.pids_limit,
            memory_events=args.memory_events_fd,
            pids_events=args.pids_events_fd,
            enforced=not args.rlimits_only,
        )
    )


SECRET_VARIABLES = (TOKEN_ENV, BUNDLE_KEY_ENV)
"""The variables the runtime takes its secrets from; none survives into its own environment
block (see the module's docstring)."""
SECRETS_FD_OPTION = "--secrets-fd"
_MAX_SECRETS = 1 << 16  # bytes: a pipe's buffer; a token and a key are a few dozen


def _interpreter_options() -> list[str]:
    """The options this interpreter was started with before ``-m sandbox_runtime`` (``-u``,
    ``-I``, ...): the exec keeps them."""
    started = list(getattr(sys, "orig_argv", []))
    for i in range(1, len(started) - 1):
        if started[i] == "-m" and started[i + 1] == "sandbox_runtime":
            return started[1:i]
    return []


def _exec_with_secrets(argv: list[str], secrets: dict[str, str], env: dict[str, str]) -> None:
    """Run this program again in place with ``env`` and ``secrets`` in a pipe it inherits."""
    data = json.dumps(secrets).encode()
    if len(data) > _MAX_SECRETS:
        raise SystemExit(f"sandbox_runtime: error: secrets over {_MAX_SECRETS} bytes")
    read, write = os.pipe()
    os.write(write, data)  # fits the pipe's buffer: written whole before the exec
    os.close(write)
    os.set_inheritable(read, True)
    command = [sys.executable, *_interpreter_options(), "-m", "sandbox_runtime"]
    command += [SECRETS_FD_OPTION, str(read), *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, env)


def _hide_secrets(argv: list[str]) -> None:
    """Re-exec without :data:`SECRET_VARIABLES` in the environment block (no return) when one
    is set; nothing when none is."""
    secrets = {name: os.environ[name] for name in SECRET_VARIABLES if name in os.environ}
    if not secrets:
        return
    clean = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    _exec_with_secrets(argv, secrets, clean)


def _read_secrets(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The secrets a previous exec handed over (``--secrets-fd N`` first in ``argv``), and the
    remaining arguments; ``({}, argv)`` when there is none."""
    if len(argv) < 2 or argv[0] != SECRETS_FD_OPTION:
        return {}, argv
    try:
        fd = int(argv[1])
        chunks = []
        while chunk := os.read(fd, _MAX_SECRETS):
            chunks.append(chunk)
        os.close(fd)
        secrets = json.loads(b"".join(chunks) or b"{}")
    except (ValueError, OSError) as exc:
        raise SystemExit(f"sandbox_runtime: error: {SECRETS_FD_OPTION}: {exc}") from exc
    if not isinstance(secrets, dict):
        raise SystemExit(f"sandbox_runtime: error: {SECRETS_FD_OPTION}: not a JSON object")
    return {str(k): str(v) for k, v in secrets.items() if k in SECRET_VARIABLES}, argv[2:]


def _token(
    args: argparse.Namespace, parser: argparse.ArgumentParser, secrets: dict[str, str]
) -> str | None:
    """The instance token: handed over by the previous exec, else from a file."""
    from_env = secrets.get(TOKEN_ENV) or os.environ.pop(TOKEN_ENV, None)
    if args.token_file is None:
        return from_env or None
    try:
        with open(args.token_file, encoding="utf-8") as file:
            token = file.read().strip()
    except OSError as exc:
        parser.error(f"--token-file {args.token_file}: {exc.strerror or exc}")
    if not token:
        parser.error(f"--token-file {args.token_file} is empty: write the instance token in it")
    return token


def _bundle_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "from a hub (instead of PROJECT; the key comes from $" + BUNDLE_KEY_ENV + ")"
    )
    group.add_argument("--bundle", metavar="URL", help="HUB/v1/envs/NAME/VERSION/bundle")
    group.add_argument("--digest", metavar="sha256:HEX", help="the bundle's digest (required)")
    group.add_argument(
        "--bundle-dir", metavar="DIR", help="where to unpack it (default: the temporary directory)"
    )
    group.add_argument(
        "--max-bundle", type=int, metavar="BYTES", help="the most bytes to download (64 MiB)"
    )
    group.add_argument(
        "--fetch-attempts", type=int, metavar="N", help="tries of an unreachable hub (6)"
    )


def builtin_project(ref: str, definition: str | None = None) -> Path:
    """The project directory of built-in ``ref`` (exactly ``name@version``) among the packages
    installed beside this runtime (:func:`aenv_ray.resolve.builtin_environments`), whose
    definition is ``definition`` when one is given (:func:`aenv_ray.bundle.definition_digest`).

    Raises :class:`~aenv_ray.errors.ConfigurationError` naming the built-ins there are when it
    is not one of them, or both digests when its definition is another (an image of another
    aenv-ray than the engine's, say).

        >>> builtin_project("mini-terminal@1.0.0").name
        'mini_terminal'
    """
    import aenv_ray
    from aenv_ray.resolve import builtin_environments

    found = builtin_environments()
    project = found.get(ref)
    if project is None:
        raise ConfigurationError(
            f"no built-in environment {ref} here (aenv-ray {aenv_ray.__version__}, built-ins: "
            f"{', '.join(sorted(found)) or 'none'}): run a runtime image of the aenv-ray that "
            "ships it (deploy/Dockerfile, from the checkout your engine runs), or deliver the "
            "environment as a bundle (`aenv push`) or in its own image (`aenv build`)"
        )
    if definition is not None:
        from aenv_ray.bundle import definition_digest

        here = definition_digest(project)
        if here != definition:
            raise ConfigurationError(
                f"the built-in {ref} here (aenv-ray {aenv_ray.__version__}, {project}) is not "
                f"the definition asked for: its config.json and src/ have digest {here}, "
                f"{definition} was asked; this image was built from another aenv-ray than the "
                "engine's: build the runtime image from the checkout or wheel the engine runs "
                "(deploy/Dockerfile)"
            )
    return project


def _serve_bundle(
    args: argparse.Namespace, argv: list[str], own: list[str], secrets: dict[str, str]
) -> int:
    """Fetch, check and unpack the bundle, then run again as ``sandbox_runtime UNPACKED``:
    ``exec`` leaves the hub key behind (the environment's code never sees it); the token goes
    on through a pipe, as it came."""
    key = secrets.get(BUNDLE_KEY_ENV) or None
    from sandbox_runtime import _fetch

    only = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _bundle_options(only)
    rest = only.parse_known_args(argv)[1]  # every other option, in its order
    try:
        fetched = _fetch.fetch_bundle(
            args.bundle,
            args.digest,
            args.bundle_dir,
            key=key,
            max_size=args.max_bundle or _fetch.DEFAULT_MAX_BUNDLE,
            attempts=args.fetch_attempts or _fetch.DEFAULT_ATTEMPTS,
        )
    except HubUnreachableError as exc:
        print(f"sandbox_runtime: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except AEnvError as exc:
        print(f"sandbox_runtime: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:
        print(f"sandbox_runtime: error: cannot unpack the bundle: {exc}", file=sys.stderr)
        return 2
    command = [str(fetched.project), *rest]
    if own:
        command += ["--", *own]
    token = {TOKEN_ENV: secrets[TOKEN_ENV]} if secrets.get(TOKEN_ENV) else {}
    _exec_with_secrets(command, token, dict(os.environ))
    return 70  # not reached: execve replaces this process or raises


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the project, serve until stopped. What follows ``--`` is the
    environment's own arguments: the project sees them as ``sys.argv[1:]``, as an engine's
    instance does (``InstanceSpec.arguments``)."""
    if argv is None:  # the program itself: its first act (see the module's docstring)
        _hide_secrets(sys.argv[1:])
    secrets, argv = _read_secrets(list(sys.argv[1:] if argv is None else argv))
    for name in SECRET_VARIABLES:  # called in-process: what is in os.environ goes at least
        value = os.environ.pop(name, None)
        if value and name not in secrets:
            secrets[name] = value
    own: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, own = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_runtime",
        epilog="ARGS after `--` are the environment's own arguments (its sys.argv[1:]).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "project", nargs="?", help="environment project directory (holds config.json)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port",
        type=int,
        action="append",
        help=f"port to listen on; repeat for several (default {DEFAULT_FUNCTIONS_PORT} and "
        f"{DEFAULT_MCP_PORT})",
    )
    parser.add_argument("--default-timeout", type=float, default=600.0)
    parser.add_argument("--debug", action="store_true", help="tracebacks in error results")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--token-file",
        help=f"a file holding the instance token (default: ${TOKEN_ENV}; none: no token)",
    )
    parser.add_argument(
        "--token-sha256",
        metavar="HEX",
        help=f"accept the token whose SHA-256 this is (default: ${TOKEN_SHA256_ENV})",
    )
    limits = parser.add_argument_group("limits (see sandbox_runtime._limits)")
    limits.add_argument("--cgroup", action="store_true", help="use this process's own cgroup")
    limits.add_argument("--memory-limit", help="the instance's memory limit, e.g. 512M")
    limits.add_argument("--pids-limit", type=int, help="the instance's process limit")
    limits.add_argument("--memory-events-fd", type=int, help="fd of memory.events/oom_control")
    limits.add_argument("--pids-events-fd", type=int, help="fd of pids.events")
    limits.add_argument(
        "--rlimits-only", action="store_true", help="no cgroup enforces the limits: use rlimits"
    )
    parser.add_argument(
        "--builtin",
        metavar="NAME@VERSION",
        help="serve this built-in environment of the installed packages (instead of PROJECT)",
    )
    parser.add_argument(
        "--definition",
        metavar="sha256:HEX",
        help="with --builtin: the digest its definition must have (else exit 2)",
    )
    _bundle_options(parser)
    args = parser.parse_args(argv)
    if [args.project, args.bundle, args.builtin].count(None) != 2:
        parser.error(
            "give one of a PROJECT directory, --bundle URL (with --digest) or --builtin "
            "NAME@VERSION"
        )
    if args.definition is not None and args.builtin is None:
        parser.error("--definition goes with --builtin")
    if args.bundle is not None and not args.digest:
        parser.error("--bundle needs --digest sha256:HEX: a bundle is served only once checked")
    if args.bundle is None and any(
        v is not None for v in (args.digest, args.bundle_dir, args.max_bundle, args.fetch_attempts)
    ):
        parser.error("--digest, --bundle-dir, --max-bundle and --fetch-attempts go with --bundle")
    for name in ("max_bundle", "fetch_attempts"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if not (0 < args.default_timeout <= MAX_TIMEOUT and math.isfinite(args.default_timeout)):
        parser.error(f"--default-timeout must be positive seconds up to {MAX_TIMEOUT:g}")
    if args.pids_limit is not None and args.pids_limit < 1:
        parser.error("--pids-limit must be positive")
    configure_logging(args.log_level)
    if args.bundle is not None:
        return _serve_bundle(args, argv, own, secrets)
    token = _token(args, parser, secrets)
    secrets.clear()
    digest = args.token_sha256 or os.environ.pop(TOKEN_SHA256_ENV, None) or None
    if digest is not None and token is not None:
        parser.error(
            f"give the token (${TOKEN_ENV} or --token-file) or its digest "
            f"(${TOKEN_SHA256_ENV} or --token-sha256), not both"
        )
    if args.builtin is not None:
        try:
            args.project = builtin_project(args.builtin, args.definition)
        except AEnvError as exc:
            print(f"sandbox_runtime: error: {exc}", file=sys.stderr, flush=True)
            return 2
    sys.argv = ["sandbox_runtime", *own]  # before the project's import, which may read them
    try:
        project = load_project(args.project)
        server = RuntimeServer(
            project,
            host=args.host,
            ports=args.port or [DEFAULT_FUNCTIONS_PORT, DEFAULT_MCP_PORT],
            default_timeout=args.default_timeout,
            debug=args.debug,
            token=token,
            token_sha256=digest,
        )
    except AEnvError as exc:
        print(f"sandbox_runtime: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sandbox_runtime: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    token = None  # the server keeps its digest only
    _limits_from(args, parser)  # as an engine does: the project loaded, before serving
    contain.protect()  # tool code cannot trace or signal this process; calls end what they start
    server.run()
    end_process(0)  # exit handlers run; a thread the environment left running cannot hang it


if __name__ == "__main__":
    sys.exit(main())
