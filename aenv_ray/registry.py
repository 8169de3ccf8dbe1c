"""The decorators that turn plain functions into an environment, and the registry they fill.

An environment project's modules call :func:`register_tool`, :func:`register_function`,
:func:`register_reward` and :func:`register_health` at import time. The runtime loads a project
inside :meth:`DefinitionRegistry.collecting`, so each project fills its own
:class:`DefinitionRegistry` (what one environment definition registers; not the hub's
:class:`envhub.registry.VersionRegistry` of published versions); outside of it the decorators
fill :data:`default_registry`. Decorated functions are returned unchanged, so they stay directly
callable in the project's own unit tests.

    >>> from aenv_ray import register_tool
    >>> reg = DefinitionRegistry()
    >>> with reg.collecting():
    ...     @register_tool
    ...     def echo(text: str) -> str:
    ...         '''Say it back.'''
    ...         return text
    >>> reg.tools["echo"].description
    'Say it back.'
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from aenv_ray.errors import DefinitionError
from aenv_ray.protocol import MAX_TIMEOUT
from aenv_ray.signature import CallSignature, _location

__all__ = [
    "DefinitionRegistry",
    "Kind",
    "Registered",
    "ToolListing",
    "current_registry",
    "default_registry",
    "register_function",
    "register_health",
    "register_reward",
    "register_tool",
]

F = TypeVar("F", bound=Callable[..., Any])
ToolListing = Callable[[], "list[dict[str, Any]] | None"]
"""A tool listing of :meth:`DefinitionRegistry.set_tool_listing`: the tools on now, or None."""
WarmUp = TypeVar("WarmUp", bound=Callable[[], object])

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
RESERVED_NAMES = frozenset({"list", "reward", "health", "info", "tools"})


class Kind(enum.Enum):
    """What a registered function is for."""

    TOOL = "tool"
    FUNCTION = "function"
    REWARD = "reward"
    HEALTH = "health"


@dataclass(frozen=True)
class Registered:
    """One registered function with everything needed to call it safely."""

    kind: Kind
    name: str
    fn: Callable[..., Any]
    signature: CallSignature
    description: str
    timeout: float | None
    location: str
    judge: bool = False
    """A reward run by the judge (:func:`register_reward` ``judge=True``, or ``config.json``'s
    ``"reward": {"judge": true}``): in a fresh process, never in the runtime's."""

    @functools.cached_property
    def is_async(self) -> bool:
        """True when the function is a coroutine function (runs on the event loop); asked on
        every call, so worked out once (0.7 us)."""
        return inspect.iscoroutinefunction(inspect.unwrap(self.fn))

    def describe(self) -> dict[str, Any]:
        """The JSON description served by the runtime (and by MCP for tools)."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.signature.input_schema,
        }
        if self.timeout is not None:
            out["timeout"] = self.timeout
        if self.judge:
            out["judge"] = True
        return out


class DefinitionRegistry:
    """The tools, functions, reward and health check of one environment definition (what its
    decorators registered). It was named ``Registry``, like the hub's registry of versions;
    ``aenv_ray.Registry`` still names it, with a ``DeprecationWarning``."""

    def __init__(self) -> None:
        self.tools: dict[str, Registered] = {}
        self.functions: dict[str, Registered] = {}
        self.reward: Registered | None = None
        self.health: Registered | None = None
        self.tool_listing: ToolListing | None = None
        """What the runtime lists as the tools now (:meth:`set_tool_listing`); None: the
        registered tools."""
        self.warm_ups: list[Callable[[], object]] = []
        """What the runtime runs once it starts serving, before its first request
        (:meth:`add_warm_up`), in order."""

    def set_tool_listing(self, listing: ToolListing | None) -> None:
        """List the tools that are on *now*, for a tool set that changes while the environment
        runs (as FastMCP's ``add_tool``/``remove_tool`` change a server's): the runtime answers
        ``GET /aenv/v1/tools`` (what ``Environment.list_tools`` asks) with ``listing()`` at each
        request, each tool as :meth:`Registered.describe` describes one (``name``,
        ``description``, ``inputSchema``); ``listing()`` returning None, or raising, lists the
        registered tools. Calls still go to :attr:`tools` by name, so every name the listing
        may show must be registered (tau2 registers every domain's tools and lists the active
        domain's). Call it while the project loads, on :func:`current_registry`; ``None``
        goes back to the registered tools.

            >>> reg = DefinitionRegistry()
            >>> reg.set_tool_listing(lambda: [{"name": "a", "description": "", "inputSchema": {}}])
            >>> reg.tool_listing()[0]["name"]
            'a'
        """
        self.tool_listing = listing

    def add_warm_up(self, fn: WarmUp) -> WarmUp:
        """Have the runtime call ``fn()`` once in each instance as it starts serving, before
        it answers any request (its readiness included): start there what the first call
        would otherwise wait for, such as a shell or a browser, so that a warm instance is
        ready to serve. Never at import: the local engine imports a project once in a template
        process and forks every instance from it, and a process started before a fork would
        not be the instance's. A fork of a running instance runs it again in the fork.

        Processes ``fn`` starts are outside any call: no call's end kills them; the episode's
        end does. An exception is logged and the runtime serves anyway (the first call then
        does the work itself); the time ``fn`` takes delays the instance's readiness, so keep
        it short. Returns ``fn``: call it while the project loads, on
        :func:`current_registry`, or use it as a decorator.

            >>> reg = DefinitionRegistry()
            >>> @reg.add_warm_up
            ... def start_shell() -> None: ...
            >>> [fn.__name__ for fn in reg.warm_ups]
            ['start_shell']
        """
        if not callable(fn):
            raise DefinitionError(
                f"add_warm_up needs a function of no arguments, got {fn!r}: pass the function "
                "itself, not what calling it returns"
            )
        if inspect.iscoroutinefunction(inspect.unwrap(fn)):
            raise DefinitionError(
                f"warm-up {_python_name(fn)} at {_location(fn)} is async: a warm-up runs "
                "before the runtime's event loop does; make it a plain function",
                location=_location(fn),
            )
        self.warm_ups.append(fn)
        return fn

    def __len__(self) -> int:
        return (
            len(self.tools)
            + len(self.functions)
            + (self.reward is not None)
            + (self.health is not None)
        )

    @contextlib.contextmanager
    def collecting(self) -> Iterator[DefinitionRegistry]:
        """Route every decorator used inside the block into this registry."""
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)

    def add(
        self,
        kind: Kind,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        judge: bool = False,
    ) -> Registered:
        """Register ``fn``; raise :class:`DefinitionError` on any misuse, naming file and line."""
        where = _location(fn)
        if not callable(fn):
            raise DefinitionError(f"@register_{kind.value} needs a function, got {fn!r}")
        # an explicit name=... is checked as given: name="" is an invalid name, not "no name"
        resolved = name if name is not None else getattr(fn, "__name__", "")
        # errors name the Python function too when name=... renamed it: that is what to look for
        who = f"`{resolved}`" + (f" (function `{_python_name(fn)}`)" if name is not None else "")
        _check_name(kind, resolved, who, where)
        _check_timeout(kind, timeout, who, where)
        if judge is not False and (kind is not Kind.REWARD or judge is not True):
            raise DefinitionError(
                f"{kind.value} {who} at {where}: judge= is a reward's option and takes True "
                f"or False, got {judge!r}",
                location=where,
            )
        signature = CallSignature.from_function(fn, kind=kind.value)
        entry = Registered(
            kind=kind,
            name=resolved,
            fn=fn,
            signature=signature,
            description=(description if description is not None else signature.description),
            timeout=timeout,
            location=where,
            judge=judge,
        )
        if kind is Kind.REWARD or kind is Kind.HEALTH:
            self._set_the_one(entry, who)
        else:
            self._add_to_table(entry)
        return entry

    def _set_the_one(self, entry: Registered, who: str) -> None:
        """Make ``entry`` the environment's reward or health check: it has at most one."""
        kind = entry.kind
        existing = self.reward if kind is Kind.REWARD else self.health
        if existing is not None:
            raise DefinitionError(
                f"a second {kind.value} {who} at {entry.location}; the environment already has "
                f"`{existing.name}` (function `{_python_name(existing.fn)}`) at "
                f"{existing.location}. An environment has one {kind.value}: remove one of them",
                location=entry.location,
            )
        if kind is Kind.REWARD:
            self.reward = entry
        else:
            self.health = entry

    def _add_to_table(self, entry: Registered) -> None:
        """Add ``entry`` to the tools or the functions, whose names are unique."""
        kind, where = entry.kind, entry.location
        table = self.tools if kind is Kind.TOOL else self.functions
        if entry.name in table:
            first = table[entry.name]
            raise DefinitionError(
                f"{kind.value} `{entry.name}` is registered twice: at {first.location} "
                f"(function `{_python_name(first.fn)}`) and at {where} "
                f"(function `{_python_name(entry.fn)}`); "
                f"rename one with @register_{kind.value}(name=...)",
                location=where,
            )
        table[entry.name] = entry


def _check_name(kind: Kind, name: str, who: str, where: str) -> None:
    """Refuse a name the protocol cannot carry, and a tool or function name the runtime uses."""
    if not _NAME.fullmatch(name):
        raise DefinitionError(
            f"{kind.value} name {who} at {where} is invalid: use a letter followed by "
            "up to 63 letters, digits, `_` or `-` (no `/`, `@` or spaces)",
            location=where,
        )
    if kind in (Kind.TOOL, Kind.FUNCTION) and name in RESERVED_NAMES:
        raise DefinitionError(
            f"{kind.value} name {who} at {where} is reserved by the runtime "
            f"({', '.join(sorted(RESERVED_NAMES))}); pass name=... to rename it",
            location=where,
        )


def _check_timeout(kind: Kind, timeout: float | None, who: str, where: str) -> None:
    """Refuse a timeout that is not a positive number of seconds up to a day."""
    if timeout is not None and not (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and 0 < timeout <= MAX_TIMEOUT  # NaN and inf fail here too
    ):
        raise DefinitionError(
            f"{kind.value} {who} at {where}: timeout must be a positive number of "
            f"seconds up to {MAX_TIMEOUT:g} (a day), got {timeout!r}; write e.g. timeout=30",
            location=where,
        )


def _python_name(fn: Any) -> str:
    """The qualified name of the Python function behind a registration (what to search for)."""
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


default_registry = DefinitionRegistry()
_ACTIVE: list[DefinitionRegistry] = []


def _target() -> DefinitionRegistry:
    return _ACTIVE[-1] if _ACTIVE else default_registry


def current_registry() -> DefinitionRegistry:
    """The registry the decorators fill now: the one :meth:`DefinitionRegistry.collecting` made
    active (the project being loaded), else :data:`default_registry`.

    >>> reg = DefinitionRegistry()
    >>> with reg.collecting():
    ...     current_registry() is reg
    True
    >>> current_registry() is default_registry
    True
    """
    return _target()


def _decorator(
    kind: Kind,
    fn: Callable[..., Any] | None,
    name: str | None,
    description: str | None,
    timeout: float | None,
    judge: bool = False,
) -> Any:
    def apply(f: F) -> F:
        _target().add(kind, f, name=name, description=description, timeout=timeout, judge=judge)
        return f

    if fn is not None:
        return apply(fn)
    return apply


@overload
def register_tool(fn: F, /) -> F: ...
@overload
def register_tool(
    *, name: str | None = None, description: str | None = None, timeout: float | None = None
) -> Callable[[F], F]: ...
def register_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Serve a function as an MCP tool. Bare or with ``name=``, ``description=``, ``timeout=``.

    The input schema comes from the signature, the description from the docstring and each
    argument's description from its ``Args:`` section. ``timeout`` (seconds) interrupts the tool,
    sync busy loops included; the instance stays usable.

        @register_tool(timeout=30)
        def execute_command(command: str, timeout: int = 60) -> dict:
            '''Run a shell command.

            Args:
                command: the command line, run by bash.
            '''
    """
    return _decorator(Kind.TOOL, fn, name, description, timeout)


@overload
def register_function(fn: F, /) -> F: ...
@overload
def register_function(
    *, name: str | None = None, description: str | None = None, timeout: float | None = None
) -> Callable[[F], F]: ...
def register_function(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Serve a helper over HTTP (``POST /functions/NAME``), callable with ``call_function``."""
    return _decorator(Kind.FUNCTION, fn, name, description, timeout)


@overload
def register_reward(fn: F, /) -> F: ...
@overload
def register_reward(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    judge: bool = False,
) -> Callable[[F], F]: ...
def register_reward(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    judge: bool = False,
) -> Any:
    """Serve the environment's one reward (``POST /task/reward``), called by ``call_reward``.

    ``judge=True`` runs it in the **judge** (``sandbox_runtime._judge``): every process of
    the instance but the runtime is ended first, and the function runs in a fresh process forked
    from the runtime's state before any call, with a copy of the workspace as its working
    directory, a fresh home and temporary directory, and the environment the instance started
    with. It grades from files and its arguments: what the tools left in the runtime's memory
    (module globals, patched builtins) is not there. Use it for any reward that reads what the
    agent wrote (docs/environments.md, "Rewards the agent cannot forge").

        @register_reward(judge=True)
        def graded(expected: str) -> dict:
            answer = open("answer.txt").read().strip()  # the copy of the workspace
            return {"reward": float(answer == expected)}
    """
    return _decorator(Kind.REWARD, fn, name, description, timeout, judge)


@overload
def register_health(fn: F, /) -> F: ...
@overload
def register_health(
    *, name: str | None = None, description: str | None = None, timeout: float | None = None
) -> Callable[[F], F]: ...
def register_health(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Serve the environment's one health check (``GET /health``). Without one, a default
    reports healthy while the runtime answers. Return a bool or a dict with ``"status"``."""
    return _decorator(Kind.HEALTH, fn, name, description, timeout)
