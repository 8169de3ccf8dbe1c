"""Toolkits: a domain's tools as methods of a class, with tau2's kinds and JSON schemas.

A tool is a method marked with :func:`tool` and the kind tau2 gives it (:class:`ToolKind`). Its
name is the method's name; its description and parameter schema come from the signature and the
Google-style docstring, rendered as tau2 renders them (``openai_schema``: a pydantic model named
``parameters`` built from the parameters, each described by its ``Args:`` entry). Methods that are
not marked (``_get_user``, ``assert_line_status``, ``set_data_usage``) are not tools: the
evaluator still reaches them by name for a task's initialization actions and assertions.

A tool is called as tau2 calls it: the method with the arguments as keywords, nothing validated
first, so a missing or unexpected argument is Python's own ``TypeError`` with the method's
qualified name (``AirlineTools.get_user_details() missing 1 required positional argument: ...``):
keep the class and method names of the original.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Self, TypeVar

from pydantic import Field, create_model

from builtin_envs.tau2._docstring import parse_docstring
from builtin_envs.tau2.db import Tau2DB

__all__ = ["ToolKind", "ToolSpec", "Toolkit", "tool"]

_F = TypeVar("_F", bound=Callable[..., Any])
_KIND_ATTR = "__tau2_tool_kind__"


class ToolKind(StrEnum):
    """What a tool does (tau2's ``ToolType``)."""

    READ = "read"
    WRITE = "write"
    THINK = "think"
    GENERIC = "generic"


def tool(kind: ToolKind = ToolKind.READ) -> Callable[[_F], _F]:
    """Mark a :class:`Toolkit` method as a tool of ``kind``; the method itself is unchanged."""

    def mark(func: _F) -> _F:
        setattr(func, _KIND_ATTR, kind)
        return func

    return mark


@dataclass(frozen=True)
class ToolSpec:
    """One tool as an agent sees it."""

    name: str
    kind: ToolKind
    short_description: str
    long_description: str
    parameters: dict[str, Any]

    @property
    def description(self) -> str:
        """tau2's description: the summary, a blank line and the long description, if any."""
        if not self.short_description:
            return self.name
        if not self.long_description:
            return self.short_description
        return f"{self.short_description}\n\n{self.long_description}"

    @property
    def openai_schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters}}``, a fresh copy."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def _spec(name: str, kind: ToolKind, func: Callable[..., Any]) -> ToolSpec:
    import inspect

    doc = parse_docstring(func.__doc__)
    hints = typing.get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(func).parameters.items():
        if pname == "self":
            continue
        default: Any = ... if param.default is param.empty else param.default
        if pname in doc.params:
            default = Field(default, description=doc.params[pname])
        fields[pname] = (hints.get(pname, Any), default)
    model = create_model("parameters", **fields)
    return ToolSpec(
        name=name,
        kind=kind,
        short_description=doc.short,
        long_description=doc.long,
        parameters=model.model_json_schema(),
    )


class Toolkit:
    """Base of a domain's tool sets (the agent's tools, the user's tools on their device).

    Subclasses define tools with :func:`tool`; ``db`` is the state they act on. Tools are listed
    in definition order (a subclass's own first, then inherited ones), as tau2 lists them.
    """

    _tool_kinds: ClassVar[dict[str, ToolKind]] = {}
    _specs: ClassVar[dict[str, ToolSpec] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = {
            name: getattr(member, _KIND_ATTR)
            for name, member in vars(cls).items()
            if callable(member) and hasattr(member, _KIND_ATTR)
        }
        inherited = {n: k for n, k in getattr(cls, "_tool_kinds", {}).items() if n not in own}
        cls._tool_kinds = {**own, **inherited}
        cls._specs = None

    def __init__(self, db: Tau2DB | None = None) -> None:
        self.db = db

    def fork(self) -> Self:
        """The same toolkit over a fork of its database (:meth:`Tau2DB.fork`); a toolkit with
        state of its own besides the database copies it too."""
        return type(self)(None if self.db is None else self.db.fork())

    def freeze(self) -> None:
        """Promise that this toolkit's state no longer changes (:meth:`Tau2DB.freeze`): it is
        then only forked."""
        if self.db is not None:
            self.db.freeze()

    @classmethod
    def tool_names(cls) -> list[str]:
        """The tools' names, in tau2's order."""
        return list(cls._tool_kinds)

    @classmethod
    def has_tool(cls, name: str) -> bool:
        """Whether ``name`` is one of this toolkit's tools."""
        return name in cls._tool_kinds

    @classmethod
    def tool_kind(cls, name: str) -> ToolKind:
        """The kind of tool ``name`` (``KeyError`` if it is not a tool)."""
        return cls._tool_kinds[name]

    @classmethod
    def tool_specs(cls) -> dict[str, ToolSpec]:
        """Every tool's :class:`ToolSpec` by name, built once per class."""
        if cls._specs is None:
            cls._specs = {
                name: _spec(name, kind, getattr(cls, name))
                for name, kind in cls._tool_kinds.items()
            }
        return cls._specs

    @classmethod
    def openai_schemas(cls) -> list[dict[str, Any]]:
        """tau2's ``openai_schema`` of every tool, in order (fresh copies)."""
        return [spec.openai_schema for spec in cls.tool_specs().values()]

    @classmethod
    def tools_description(cls) -> str:
        """tau2's ``get_tools_description``: ``"N. name\nsummary"`` per tool, sorted by name."""
        specs = sorted(cls.tool_specs().values(), key=lambda spec: spec.name)
        return "\n\n".join(
            f"{i + 1}. {spec.name}\n{spec.short_description}" for i, spec in enumerate(specs)
        )

    def use_tool(self, tool_name: str, **kwargs: Any) -> Any:
        """Call tool ``tool_name`` with ``kwargs`` as tau2 does (no validation before the call)."""
        if tool_name not in self._tool_kinds:
            raise ValueError(f"Tool '{tool_name}' not found.")
        return getattr(self, tool_name)(**kwargs)

    def get_db_hash(self) -> str | None:
        """The hash of ``db`` as tau2 computes it (None without a database)."""
        return None if self.db is None else self.db.get_hash()
