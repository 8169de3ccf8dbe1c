"""A tool set that follows the episode's domain, on a runtime whose tool set is fixed at load.

The runtime looks a tool up by name on every call (``registry.tools.get(name)``) but serializes
its listing once, when it builds its server (``RuntimeApp._tools_payload``, in the template
process: every instance forked from it inherits those bytes). tau2's tools change with the
domain (and with solo mode), and names collide across domains with different schemas
(``get_user_details`` in airline and retail). So this module, until the runtime serves a
dynamic listing itself:

- registers one entry per tool *name* of every domain (and ``done``), whose function asks the
  active episode: a name the active domain lacks gets tau2's own answer
  (``Error: Tool 'x' not found.``), as does a name no domain has (the table's ``get``);
- takes every call's arguments as they come (no validation first: tau2 validates nothing
  before the call, and its errors are the outputs);
- serves ``GET /aenv/v1/tools`` from the active episode: a data descriptor on the runtime's
  ``RuntimeApp._tools_payload`` returns the active domain's listing for apps serving this
  registry (others are untouched). ``/aenv/v1/info`` keeps listing every name, so a client's
  cached names stay valid across resets. MCP's ``tools/list`` stays the union (one schema per
  name): use the fast path or ``tau2_get_available_tools`` there.

Private API it relies on: ``aenv_ray.registry._target`` (the registry being filled) and
``sandbox_runtime._http.RuntimeApp._tools_payload``. ``install`` says False when either is
missing, and the environment still serves (with the static listing).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from aenv_ray.registry import DefinitionRegistry, Kind, Registered, _target
from aenv_ray.signature import CallSignature

__all__ = ["ToolTable", "install"]

log = logging.getLogger("tau2.tools")

_ARGUMENTS = pydantic.create_model("tau2_arguments")


class _AsGiven(CallSignature):
    """A call signature that hands the arguments over as given (tau2 checks nothing first)."""

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        return dict(arguments)


def _entry(
    name: str, description: str, schema: dict[str, Any], fn: Callable[..., Any]
) -> Registered:
    signature = _AsGiven(
        model=_ARGUMENTS, parameters=(), input_schema=schema, description=description
    )
    return Registered(
        kind=Kind.TOOL,
        name=name,
        fn=functools.partial(fn, name),
        signature=signature,
        description=description,
        timeout=None,
        location=__file__,
    )


class ToolTable(dict[str, Registered]):
    """The registry's tools: every known name, and an entry for any other name on demand."""

    def __init__(self, call: Callable[..., Any]) -> None:
        super().__init__()
        self._call = call

    def add(self, name: str, description: str, schema: dict[str, Any]) -> None:
        """Serve tool ``name`` (listed with ``description`` and ``schema`` until a domain is on)."""
        if name not in self:
            self[name] = _entry(name, description, schema, self._call)

    def get(self, name: str, default: Any = None) -> Any:
        entry = super().get(name)
        if entry is not None:
            return entry
        if not isinstance(name, str):
            return default
        # an unknown name reaches the episode, which answers as tau2 does
        return _entry(name, name, {"type": "object", "properties": {}}, self._call)


class _Listing:
    """``RuntimeApp._tools_payload`` for the apps serving ``registry``: the active listing."""

    def __init__(self, registry: DefinitionRegistry, listing: Callable[[], bytes | None]) -> None:
        self.registry = registry
        self.listing = listing

    def __get__(self, app: Any, owner: Any = None) -> Any:
        if app is None:
            return self
        if getattr(getattr(app, "dispatcher", None), "registry", None) is self.registry:
            current = self.listing()
            if current is not None:
                return current
        return app.__dict__["_tau2_static_tools_payload"]

    def __set__(self, app: Any, value: bytes) -> None:
        app.__dict__["_tau2_static_tools_payload"] = value


def install(call: Callable[..., Any], listing: Callable[[], bytes | None]) -> ToolTable:
    """Make the registry being loaded serve a :class:`ToolTable` (calls go to ``call(name,
    **arguments)``) and list ``listing()`` (None: the static listing). Returns the table, to
    fill with :meth:`ToolTable.add`."""
    registry = _target()
    table = ToolTable(call)
    table.update(registry.tools)
    registry.tools = table
    try:
        from sandbox_runtime import _http
    except ImportError:  # a runtime without it: the listing stays the static one
        log.warning("tau2: the runtime's tool listing cannot follow the domain")
        return table
    previous = _http.RuntimeApp.__dict__.get("_tools_payload")
    if isinstance(previous, _Listing):
        previous.registry, previous.listing = registry, listing  # a reload in this process
    else:
        _http.RuntimeApp._tools_payload = _Listing(registry, listing)  # type: ignore[assignment]
    return table
