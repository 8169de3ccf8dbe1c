"""A tool set that follows the episode's domain.

The runtime looks a tool up by name on every call (``registry.tools.get(name)``) and lists the
registered tools unless the registry sets a listing of its own
(:meth:`~aenv_ray.registry.DefinitionRegistry.set_tool_listing`). tau2's tools change with the
domain (and with solo mode), and names collide across domains with different schemas
(``get_user_details`` in airline and retail). So this module:

- registers one entry per tool *name* of every domain (and ``done``), whose function asks the
  active episode: a name the active domain lacks gets tau2's own answer
  (``Error: Tool 'x' not found.``), as does a name no domain has (the table's ``get``);
- takes every call's arguments as they come (no validation first: tau2 validates nothing
  before the call, and its errors are the outputs);
- lists the active episode's tools (``GET /aenv/v1/tools``) through the registry's tool
  listing; before an episode, every name. ``/aenv/v1/info`` keeps listing every name, so a
  client's cached names stay valid across resets. MCP's ``tools/list`` stays the union (one
  schema per name): use the fast path or ``tau2_get_available_tools`` there.

It uses the public API only: :func:`~aenv_ray.registry.current_registry` (the registry being
filled) and its ``set_tool_listing``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from aenv_ray.registry import Kind, Registered, ToolListing, current_registry
from aenv_ray.signature import CallSignature

__all__ = ["ToolTable", "install"]


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


def install(call: Callable[..., Any], listing: ToolListing) -> ToolTable:
    """Make the registry being loaded serve a :class:`ToolTable` (calls go to ``call(name,
    **arguments)``) and list ``listing()`` (None: every registered tool). Returns the table, to
    fill with :meth:`ToolTable.add`."""
    registry = current_registry()
    table = ToolTable(call)
    table.update(registry.tools)
    registry.tools = table
    registry.set_tool_listing(listing)
    return table
