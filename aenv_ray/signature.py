"""From a Python function to a validated call: JSON schema, docstring, argument checking.

A registered function's signature becomes a pydantic model (``extra="forbid"``): its JSON schema
is the tool's ``inputSchema`` and its validator checks every call before the function runs, on
every path (our fast path and MCP alike). Errors name the argument and the expected type.
"""

from __future__ import annotations

import enum
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from aenv_ray.errors import DefinitionError

__all__ = ["CallSignature", "format_validation_error", "parse_docstring"]

_ARGS_HEADERS = ("args:", "arguments:", "parameters:", "params:")
_SECTION_HEADERS = (
    "returns:",
    "return:",
    "raises:",
    "yields:",
    "examples:",
    "example:",
    "note:",
    "notes:",
    "see also:",
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument: description}).

    >>> parse_docstring('''Run it.
    ...
    ... Args:
    ...     command: the shell command.
    ...     timeout (int): seconds before
    ...         it is interrupted.
    ... ''')
    ('Run it.', {'command': 'the shell command.', 'timeout': 'seconds before it is interrupted.'})
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section = "description"
    current: str | None = None
    arg_indent: int | None = None
    for raw in lines:
        stripped = raw.strip()
        lowered = stripped.lower()
        indent = len(raw) - len(raw.lstrip())
        if lowered in _ARGS_HEADERS and indent == 0:
            section, current, arg_indent = "args", None, None
            continue
        if lowered in _SECTION_HEADERS and indent == 0:
            section, current = "other", None
            continue
        if section == "description":
            description.append(raw)
        elif section == "args" and stripped:
            if arg_indent is None:
                arg_indent = indent
            match = _ARG_LINE.match(stripped)
            if indent <= arg_indent and match:
                current = match.group(1).lstrip("*")
                args[current] = match.group(3).strip()
            elif current is not None:
                args[current] = f"{args[current]} {stripped}".strip()
    text = "\n".join(description).strip()
    return text, args


def _location(fn: Callable[..., Any]) -> str:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return "<unknown>"
    return f"{code.co_filename}:{code.co_firstlineno}"


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` keys: noise for LLMs, not part of the contract."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _annotation_hint(param: inspect.Parameter) -> str:
    """What to write for an unannotated parameter: the type of its default, when it has one.

    >>> def f(limit=10, name=None): ...
    >>> limit, name = inspect.signature(f).parameters.values()
    >>> _annotation_hint(limit)
    'argument `limit` has no type annotation; annotate `limit: int = 10` (its default is an int)'
    >>> _annotation_hint(name).split("; ")[1]
    'annotate `name: str | None = None` (its default is None'
    """
    name, default = param.name, param.default
    if default is param.empty:
        return f"argument `{name}` has no type annotation; write e.g. `{name}: str`"
    if default is None:
        return (
            f"argument `{name}` has no type annotation; annotate `{name}: str | None = None` "
            "(its default is None; put the type it takes otherwise)"
        )
    kind = type(default)
    typed = kind.__name__
    if kind in (list, tuple, set) and default:
        typed += f"[{' | '.join(sorted({type(item).__name__ for item in default}))}]"
    elif kind is dict and default:
        keys = " | ".join(sorted({type(key).__name__ for key in default}))
        values = " | ".join(sorted({type(value).__name__ for value in default.values()}))
        typed += f"[{keys}, {values}]"
    shown = f"{typed}.{default.name}" if isinstance(default, enum.Enum) else repr(default)
    if len(shown) > 30 or shown.startswith("<"):  # a long or unreadable value
        shown = "..."
    article = "an" if typed[0].lower() in "aeiou" else "a"
    return (
        f"argument `{name}` has no type annotation; annotate `{name}: {typed} = {shown}` "
        f"(its default is {article} {typed})"
    )


@dataclass(frozen=True)
class CallSignature:
    """The validated calling convention of one registered function."""

    model: type[BaseModel]
    parameters: tuple[str, ...]
    input_schema: dict[str, Any]
    description: str

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, kind: str) -> CallSignature:
        """Derive the argument model and schema from ``fn``'s signature and docstring.

        Raises :class:`DefinitionError` (naming function, file and line) for ``*args``,
        ``**kwargs``, positional-only or unannotated parameters and unsupported types.
        """
        where = _location(fn)
        name = getattr(fn, "__qualname__", repr(fn))
        description, arg_docs = parse_docstring(inspect.getdoc(fn))
        try:
            signature = inspect.signature(fn)
            hints = typing.get_type_hints(fn, include_extras=True)
        except (NameError, TypeError) as exc:
            raise DefinitionError(
                f"{kind} `{name}` at {where}: cannot read its type annotations ({exc}); "
                "make every annotation importable at module level",
                location=where,
            ) from exc
        fields: dict[str, Any] = {}
        for param in signature.parameters.values():
            problem = None
            if param.kind is param.VAR_POSITIONAL:
                problem = f"`*{param.name}` is not supported; name each argument"
            elif param.kind is param.VAR_KEYWORD:
                problem = f"`**{param.name}` is not supported; name each argument"
            elif param.kind is param.POSITIONAL_ONLY:
                problem = f"positional-only `{param.name}` is not supported; drop the `/`"
            elif param.name not in hints:
                problem = _annotation_hint(param)
            elif param.name.startswith("_"):
                problem = f"argument `{param.name}` starts with `_`, which is reserved"
            if problem:
                raise DefinitionError(f"{kind} `{name}` at {where}: {problem}", location=where)
            default = ... if param.default is param.empty else param.default
            doc = arg_docs.get(param.name)
            # without an `Args:` entry, a description in Annotated[..., Field(...)] stands
            info = Field(default=default, description=doc) if doc else Field(default=default)
            fields[param.name] = (hints[param.name], info)
        try:
            model = pydantic.create_model(
                f"{getattr(fn, '__name__', 'call')}_arguments",
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                **fields,
            )
            schema = _strip_titles(model.model_json_schema())
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as e:
            raise DefinitionError(
                f"{kind} `{name}` at {where}: an argument type cannot be described as JSON "
                f"({type(e).__name__}: {e}); use str, int, float, bool, list, dict, Optional, "
                "Literal, Enum or a pydantic model",
                location=where,
            ) from e
        schema.setdefault("properties", {})
        schema["additionalProperties"] = False
        return cls(
            model=model,
            parameters=tuple(fields),
            input_schema=schema,
            description=description,
        )

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Return keyword arguments for the function, or raise ``pydantic.ValidationError``."""
        validated = self.model.model_validate(dict(arguments))
        # Keep nested pydantic models as models: the function asked for them by type.
        return {name: getattr(validated, name) for name in self.parameters}


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def format_validation_error(
    exc: pydantic.ValidationError, *, what: str, parameters: tuple[str, ...]
) -> str:
    """One readable sentence per problem, naming the argument and the expected type."""
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        kind = err["type"]
        if kind == "extra_forbidden":
            takes = ", ".join(parameters) if parameters else "no arguments"
            problems.append(f"unexpected argument `{loc}` (it takes: {takes})")
        elif kind == "missing":
            problems.append(f"missing required argument `{loc}`")
        elif kind in _TYPE_WORDS:
            problems.append(
                f"argument `{loc}` must be {_TYPE_WORDS[kind]}, got {_describe(err.get('input'))}"
            )
        else:
            problems.append(f"argument `{loc}`: {err['msg']} (got {_describe(err.get('input'))})")
    return f"invalid arguments for {what}: " + "; ".join(problems)
