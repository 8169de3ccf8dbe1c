"""``python -m sandbox_runtime PROJECT [--host H] [--port P ...]``: serve one project.

This is what an engine starts inside each instance; ``aenv run`` is the friendly front end.
Exit codes, as ``aenv run``: 0 stopped by a signal, 1 cannot serve (a port in use), 2 usage or
project error.
"""

from __future__ import annotations

import argparse
import sys

from aenv_ray.errors import AEnvError
from aenv_ray.logs import configure_logging
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, DEFAULT_MCP_PORT
from sandbox_runtime._loader import load_project
from sandbox_runtime.server import RuntimeServer


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the project, serve until stopped."""
    parser = argparse.ArgumentParser(prog="python -m sandbox_runtime")
    parser.add_argument("project", help="environment project directory (holds config.json)")
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
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        project = load_project(args.project)
        server = RuntimeServer(
            project,
            host=args.host,
            ports=args.port or [DEFAULT_FUNCTIONS_PORT, DEFAULT_MCP_PORT],
            default_timeout=args.default_timeout,
            debug=args.debug,
        )
    except AEnvError as exc:
        print(f"sandbox_runtime: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sandbox_runtime: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
