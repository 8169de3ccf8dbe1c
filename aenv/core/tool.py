"""``@register_tool`` as AEnvironment writes it, and its tool registry (``aenv.core.tool``).

``register_tool(func=None, *, name=None, description=None)`` registers into aenv-ray's
registry (:func:`aenv_ray.registry.current_registry`: the project being loaded), with a type for
each unannotated parameter (:mod:`aenv.core._defaults`), and returns the function unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

import aenv_ray
from aenv.core._defaults import with_types
from aenv_ray.registry import DefinitionRegistry, Kind, Registered, current_registry

__all__ = ["Tool", "ToolRegistry", "get_registry", "register_tool"]

F = TypeVar("F", bound=Callable[..., Any])


class Tool(BaseModel):
    """A tool as AEnvironment describes one (MCP's fields)."""

    name: str = Field(description="unique within the environment")
    description: str | None = Field(default=None, description="what the tool does")
    inputSchema: dict[str, Any] = Field(description="JSON schema of the arguments")
    outputSchema: dict[str, Any] | None = Field(default=None, description="unused")
    hidden: bool = Field(default=False, description="registered but not served")

    model_config = ConfigDict(extra="allow")

    def get_openai_tool(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description or "",
                "parameters": self.inputSchema,
            },
        }


def _describe(entry: Registered) -> Tool:
    return Tool(
        name=entry.name,
        description=entry.description or None,
        inputSchema=entry.signature.input_schema,
    )


class ToolRegistry:
    """AEnvironment's ``get_registry()``: registers tools and reads back those of the
    environment being defined (aenv-ray's :func:`~aenv_ray.registry.current_registry`)."""

    def __init__(self) -> None:
        self._hidden: dict[str, tuple[Callable[..., Any], Tool]] = {}

    def register(
        self,
        func: F,
        name: str | None = None,
        description: str | None = None,
        hidden: bool = False,
    ) -> F:
        """Register ``func`` as a tool (``hidden``: kept here, not served, as in AEnvironment)."""
        if hidden:
            entry = DefinitionRegistry().add(
                Kind.TOOL,
                with_types(func),
                name=name,
                description=description,
            )
            self._hidden[entry.name] = (func, _describe(entry).model_copy(update={"hidden": True}))
            return func
        aenv_ray.register_tool(name=name, description=description)(with_types(func))
        return func

    def get_tool(self, name: str) -> Callable[..., Any] | None:
        """The function of tool ``name``, or None."""
        entry = current_registry().tools.get(name)
        if entry is not None:
            fn: Callable[..., Any] = inspect.unwrap(entry.fn)
            return fn
        hidden = self._hidden.get(name)
        return hidden[0] if hidden else None

    def get_tool_descriptor(self, name: str) -> Tool | None:
        """The description of tool ``name``, or None."""
        entry = current_registry().tools.get(name)
        if entry is not None:
            return _describe(entry)
        hidden = self._hidden.get(name)
        return hidden[1] if hidden else None

    def list_tools(self) -> list[Tool]:
        """Every registered tool, hidden ones included."""
        tools = [_describe(e) for e in current_registry().tools.values()]
        return tools + [tool for _, tool in self._hidden.values()]


_REGISTRY = ToolRegistry()


def get_registry() -> ToolRegistry:
    """The tool registry (one per process, over the registry being filled)."""
    return _REGISTRY


def register_tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Serve a function as a tool; bare or with ``name=``/``description=``. A parameter with
    no annotation takes the type of its default (:func:`aenv.core._defaults.default_type`)."""

    def decorator(f: F) -> F:
        return _REGISTRY.register(f, name=name, description=description)

    return decorator(func) if func is not None else decorator
