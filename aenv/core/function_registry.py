"""``@register_function``, ``@register_reward`` and ``@register_health`` as AEnvironment writes
them (``aenv.core.function_registry``), over aenv-ray's decorators.

``register_function(func=None, *, endpoint=None, method="POST")``: ``endpoint`` may be left out
or be ``/functions/NAME`` (served as ``NAME``), ``/task/reward`` or ``/health``; aenv-ray serves
nothing else, so another path is a :class:`~aenv_ray.errors.DefinitionError` naming the function.
``method`` is accepted and not used: the SDK calls functions with ``POST`` in both projects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import aenv_ray
from aenv.core._defaults import with_types
from aenv_ray.errors import DefinitionError
from aenv_ray.protocol import FUNCTIONS_PREFIX, HEALTH_PATH, REWARD_PATH
from aenv_ray.registry import Kind, Registered, current_registry

__all__ = [
    "FunctionRegistry",
    "get_function_registry",
    "python_parameters",
    "register_function",
    "register_health",
    "register_reward",
]

F = TypeVar("F", bound=Callable[..., Any])

# a JSON schema type, as AEnvironment's function listing names the Python annotation
_PYTHON_TYPES = {
    "string": "<class 'str'>",
    "integer": "<class 'int'>",
    "number": "<class 'float'>",
    "boolean": "<class 'bool'>",
    "array": "<class 'list'>",
    "object": "<class 'dict'>",
}


def python_parameters(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A JSON input schema's properties as AEnvironment's function listing shows parameters:
    ``{name: {"type": "<class 'int'>", "default": "3" or None}}``.

    >>> python_parameters({"properties": {"n": {"type": "integer", "default": 3}, "x": {}}})
    {'n': {'type': "<class 'int'>", 'default': '3'}, 'x': {'type': 'Any', 'default': None}}
    """
    out: dict[str, dict[str, Any]] = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        shown = _PYTHON_TYPES.get(kind, "Any") if isinstance(kind, str) else "Any"
        default = str(prop["default"]) if isinstance(prop, dict) and "default" in prop else None
        out[name] = {"type": shown, "default": default}
    return out


def _endpoint(endpoint: str | None, fn: Callable[..., Any]) -> tuple[Kind, str | None]:
    """What ``endpoint`` makes of ``fn``: a function (and its name), the reward or health."""
    if endpoint is None:
        return Kind.FUNCTION, None
    path = "/" + endpoint.strip().strip("/")
    if path == REWARD_PATH:
        return Kind.REWARD, None
    if path == HEALTH_PATH:
        return Kind.HEALTH, None
    name = path.removeprefix(FUNCTIONS_PREFIX)
    if path.startswith(FUNCTIONS_PREFIX) and name and "/" not in name:
        return Kind.FUNCTION, name
    where = getattr(getattr(fn, "__code__", None), "co_filename", "?")
    raise DefinitionError(
        f"@register_function(endpoint={endpoint!r}) on `{getattr(fn, '__name__', fn)}` in "
        f"{where}: aenv-ray serves functions at {FUNCTIONS_PREFIX}NAME (call_function('NAME')), "
        f"the reward at {REWARD_PATH} and health at {HEALTH_PATH}; leave endpoint= out or use "
        f"one of those",
    )


def _register(kind: Kind, fn: F, name: str | None = None) -> F:
    typed = with_types(fn)
    if kind is Kind.REWARD:
        aenv_ray.register_reward(typed)
    elif kind is Kind.HEALTH:
        aenv_ray.register_health(typed)
    else:
        aenv_ray.register_function(name=name)(typed)
    return fn


def _listing(entry: Registered, endpoint: str, method: str) -> dict[str, Any]:
    return {
        "name": entry.name,
        "endpoint": endpoint,
        "method": method,
        "description": entry.description,
        "parameters": python_parameters(entry.signature.input_schema),
        "is_async": entry.is_async,
    }


class FunctionRegistry:
    """AEnvironment's ``get_function_registry()``, over the registry being filled."""

    def register_function(self, func: F, endpoint: str | None = None, method: str = "POST") -> F:
        """Register ``func`` at ``endpoint`` (see the module docstring)."""
        kind, name = _endpoint(endpoint, func)
        return _register(kind, func, name)

    def list_functions(self) -> dict[str, dict[str, Any]]:
        """Every function, the reward and the health check, by Python name, as AEnvironment
        lists them (``endpoint``, ``method``, ``description``, ``parameters``, ``is_async``)."""
        registry = current_registry()
        found = [(e, FUNCTIONS_PREFIX + e.name, "POST") for e in registry.functions.values()]
        if registry.reward is not None:
            found.append((registry.reward, REWARD_PATH, "POST"))
        if registry.health is not None:
            found.append((registry.health, HEALTH_PATH, "GET"))
        return {entry.name: _listing(entry, path, method) for entry, path, method in found}

    def list_functions_simple(self) -> dict[str, str]:
        """``{name: endpoint}``."""
        return {name: item["endpoint"] for name, item in self.list_functions().items()}


_FUNCTIONS = FunctionRegistry()


def get_function_registry() -> FunctionRegistry:
    """The function registry (one per process, over the registry being filled)."""
    return _FUNCTIONS


def register_function(
    func: Callable[..., Any] | None = None,
    *,
    endpoint: str | None = None,
    method: str = "POST",
) -> Any:
    """Serve a function at ``POST /functions/NAME`` (``env.call_function("NAME", ...)``)."""

    def decorator(f: F) -> F:
        return _FUNCTIONS.register_function(f, endpoint=endpoint, method=method)

    return decorator(func) if func is not None else decorator


def register_reward(func: Callable[..., Any] | None = None) -> Any:
    """Serve the environment's reward (``env.call_reward(...)``)."""

    def decorator(f: F) -> F:
        return _register(Kind.REWARD, f)

    return decorator(func) if func is not None else decorator


def register_health(func: Callable[..., Any] | None = None) -> Any:
    """Serve the environment's health check (``env.check_health()``)."""

    def decorator(f: F) -> F:
        return _register(Kind.HEALTH, f)

    return decorator(func) if func is not None else decorator
