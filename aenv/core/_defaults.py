"""Types for parameters AEnvironment's tools leave unannotated.

AEnvironment serves tools through FastMCP, which accepts a parameter without an annotation:
``def execute_command(command: str, timeout=60)``. aenv-ray's decorators need a type for every
parameter (it is the input schema, and each call is validated against it), so the ``aenv``
decorators give one: the type of the default (``timeout=60`` is an ``int``, so the schema says
``integer`` and a model sees it), and :data:`typing.Any` when there is no default or it is
``None`` or of another type. The function itself is not changed: a wrapper with the added
annotations is what aenv-ray registers.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["default_type", "with_types"]

_PLAIN = (bool, int, float, str, list, dict, tuple)


def default_type(default: Any) -> Any:
    """The annotation of an unannotated parameter whose default is ``default``.

    >>> default_type(60), default_type(False), default_type("x"), default_type([1])
    (<class 'int'>, <class 'bool'>, <class 'str'>, <class 'list'>)
    >>> default_type(None), default_type(inspect.Parameter.empty)
    (typing.Any, typing.Any)
    """
    kind = type(default)
    if kind in _PLAIN or isinstance(default, enum.Enum):
        return kind
    return Any


def with_types(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself when every parameter is annotated, else a wrapper of it whose annotations
    add :func:`default_type` for the others (``*args``/``**kwargs`` are left for aenv-ray to
    refuse, naming them).

    >>> def run(command: str, timeout=60): return command, timeout
    >>> typed = with_types(run)
    >>> typed.__annotations__, typed("ls"), run.__annotations__
    ({'command': 'str', 'timeout': <class 'int'>}, ('ls', 60), {'command': 'str'})
    """
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    own = dict(getattr(fn, "__annotations__", None) or {})
    added = {
        p.name: default_type(p.default)
        for p in parameters
        if p.name not in own and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    if not added or not inspect.isfunction(inspect.unwrap(fn)):
        return fn
    if inspect.iscoroutinefunction(fn):

        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        wrapper: Callable[..., Any] = call_async
    else:

        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        wrapper = call
    functools.update_wrapper(wrapper, fn)
    wrapper.__annotations__ = {**own, **added}
    return wrapper
