"""sandbox_runtime: the server inside each environment instance.

Owns loading an environment project (``config.json`` + modules under ``src/``), validating and
running its tools, functions, reward and health check, and serving them: tools over MCP
(streamable HTTP, FastMCP) and over a lean JSON fast path; functions, reward and health over HTTP
JSON. The MCP side is built by the first MCP request (:mod:`sandbox_runtime._lazy_mcp`): a
runtime only ever called on the fast path (most are) never imports FastMCP or the MCP SDK, ~1.8 s
of CPU saved at every start; the first MCP client waits for that build once. Tool schemas are
the runtime's own (:class:`aenv_ray.signature.CallSignature`, from pydantic, which validates
the arguments: the fast path needs it); FastMCP only relays them.

Run it with ``python -m sandbox_runtime PROJECT`` or ``aenv run``. An engine calls
:func:`install_limits` inside each instance before it serves, so that calls name the limits
they hit (:mod:`sandbox_runtime._limits`). A reward registered with ``judge=True`` runs in the
judge (:mod:`sandbox_runtime._judge`): a fresh process forked from the runtime's state before
its first call, after every process of the instance was ended, on a copy of the workspace.

May import: ``aenv_ray`` (models, registry, errors), fastmcp (server side) and mcp (the MCP SDK
it is built on: content types), starlette/uvicorn, orjson, pydantic and pydantic-core (the
arguments' validation, the results' JSON); lazily, inside functions: uvloop (uvicorn's event
loop) (fastmcp and mcp are imported by ``sandbox_runtime._mcp`` alone, which the first MCP
request imports). Must not import: ray, kubernetes, envhub, rollout, ``local_backend`` (engines
run the runtime, never the reverse: engine -> runtime -> SDK).
"""

from sandbox_runtime._dispatch import Dispatcher
from sandbox_runtime._limits import InstanceLimits
from sandbox_runtime._limits import install as install_limits
from sandbox_runtime._loader import LoadedProject, load_project
from sandbox_runtime.server import (
    BROKEN_EXIT_CODE,
    RuntimeServer,
    bind_socket,
    end_process,
    warm_imports,
)

__all__ = [
    "BROKEN_EXIT_CODE",
    "Dispatcher",
    "InstanceLimits",
    "LoadedProject",
    "RuntimeServer",
    "bind_socket",
    "end_process",
    "install_limits",
    "load_project",
    "warm_imports",
]
