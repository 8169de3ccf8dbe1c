"""The engine conformance kit: does an engine keep the :class:`~aenv_ray.engine.SandboxEngine`
contract?

:func:`check_sandbox_engine` runs every check in :data:`ENGINE_CHECKS` (or the ones named) against
engines made by a factory, with real instances, and raises :class:`ConformanceError` naming the
check and what the engine did instead. Each check cleans up the instances it made. Run it in a
test, one check per test for readable failures::

    @pytest.mark.parametrize("check", ENGINE_CHECKS)
    async def test_my_engine(check):
        await check_sandbox_engine(MyEngine, only=[check])

The default instance is the built-in ``mini-terminal@1.0.0`` (every engine can start it);
another environment works too, with a :class:`StateProbe` for the fork check (or none: the
fork check then checks the children's lives only).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    Route,
    SandboxEngine,
    TerminationReason,
)
from aenv_ray.environment import Environment
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    EnvironmentNotFoundError,
    InstanceError,
    InstanceNotFoundError,
    NotSupportedError,
)

__all__ = [
    "ENGINE_CHECKS",
    "ConformanceError",
    "EngineFactory",
    "StateProbe",
    "check_sandbox_engine",
]

EngineFactory = Callable[[], "SandboxEngine | Awaitable[SandboxEngine]"]
"""Makes a fresh engine (sync or async): the kit makes one for its checks and one more for
``aclose``'s."""

_NO_SUCH_ID = "no-such-instance-0"
_NO_SUCH_ENV = "no-such-environment@0.0.1"


class ConformanceError(AssertionError):
    """An engine broke the contract; the message names the check and what the engine did."""


@dataclass(frozen=True)
class StateProbe:
    """Two tool calls: ``write`` leaves state in an instance, ``read`` returns text containing
    ``expect`` where that state is. The fork check writes in the parent, then reads in each
    child; a child's write must not reach its parent."""

    write: tuple[str, dict[str, Any]]
    read: tuple[str, dict[str, Any]]
    expect: str
    overwrite: tuple[str, dict[str, Any]] | None = None  # a child's write of other state


MINI_TERMINAL_PROBE = StateProbe(
    write=("execute_command", {"command": "echo parent-state > conformance.txt"}),
    read=("execute_command", {"command": "cat conformance.txt"}),
    expect="parent-state",
    overwrite=("execute_command", {"command": "echo child-state > conformance.txt"}),
)


@dataclass
class _Run:
    factory: EngineFactory
    spec: InstanceSpec
    probe: StateProbe | None
    timeout: float
    engine: SandboxEngine | None = None
    made: list[str] = field(default_factory=list)

    async def new_engine(self) -> SandboxEngine:
        made = self.factory()
        engine = await made if inspect.isawaitable(made) else made
        if not isinstance(engine, SandboxEngine):
            raise ConformanceError(f"the factory made {engine!r}, not a SandboxEngine")
        return engine

    async def create(self, spec: InstanceSpec | None = None) -> InstanceInfo:
        assert self.engine is not None
        info = await self.engine.create(spec or self.spec, timeout=self.timeout)
        self.made.append(info.id)
        return info

    async def cleanup(self) -> None:
        if self.engine is None:
            return
        for iid in self.made:
            with contextlib.suppress(Exception):  # the check's own failure says what went wrong
                await self.engine.delete(iid)
        self.made.clear()


def _expect(condition: object, check: str, what: str) -> None:
    if not condition:
        raise ConformanceError(f"{check}: {what}")


async def _call(info: InstanceInfo, tool: str, arguments: dict[str, Any]) -> str:
    async with Environment.attach(info.url or "", token=info.token) as env:
        result = await env.call_tool(tool, arguments)
    if result.is_error:
        raise ConformanceError(f"instance {info.id}: {tool} failed: {result.text}")
    return result.text


async def _answers(info: InstanceInfo) -> bool:
    """True when the instance's runtime answers a health check at ``info.url``."""
    try:
        async with Environment.attach(info.url or "", token=info.token) as env:
            return (await env.check_health()).get("status") == "healthy"
    except InstanceError:
        return False


async def _gone(info: InstanceInfo) -> bool:
    """True when nothing accepts a connection at the instance's address any more."""
    from aenv_ray.hub import reachable

    return not await reachable(info.url or "", timeout=1.0)


async def _until(predicate: Callable[[], Awaitable[bool]], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if await predicate():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)


async def _raises(
    check: str, expected: type[BaseException], call: Awaitable[object], what: str
) -> None:
    try:
        got = await call
    except expected:
        return
    except Exception as exc:
        raise ConformanceError(
            f"{check}: {what} raised {type(exc).__name__} ({exc}), not {expected.__name__}"
        ) from exc
    raise ConformanceError(f"{check}: {what} returned {got!r}, not {expected.__name__}")


# -- the checks ---------------------------------------------------------------------------------


async def _check_create(run: _Run) -> None:
    c = "create"
    before = time.time()
    info = await run.create()
    _expect(info.state is InstanceState.RUNNING, c, f"returned state {info.state}, not RUNNING")
    _expect(info.id and isinstance(info.id, str), c, f"returned no instance id ({info.id!r})")
    _expect(info.url, c, "returned no url for a running instance")
    name = EnvRef.parse(run.spec.env_ref).name
    _expect(EnvRef.parse(info.env_ref).name == name, c, f"env_ref {info.env_ref!r} for {name!r}")
    _expect(info.created_at >= before - 60, c, f"created_at {info.created_at} is before the call")
    ttl = run.spec.ttl
    if ttl is not None:
        _expect(
            info.expires_at is not None and abs(info.expires_at - (info.created_at + ttl)) < 60,
            c,
            f"expires_at {info.expires_at} is not created_at + ttl ({info.created_at} + {ttl})",
        )
    _expect(await _answers(info), c, f"instance {info.id} does not answer at {info.url}")
    route = await run.engine.route(info) if run.engine is not None else None
    _expect(
        isinstance(route, Route) and route.url, c, f"route() gave {route!r}, not a Route with a url"
    )


async def _check_get(run: _Run) -> None:
    assert run.engine is not None
    info = await run.create()
    got = await run.engine.get(info.id)
    _expect(got.id == info.id, "get", f"asked for {info.id}, got {got.id}")
    _expect(got.state is InstanceState.RUNNING, "get", f"a running instance is {got.state}")
    _expect(got.url == info.url, "get", f"url {got.url!r} differs from create's {info.url!r}")


async def _check_list(run: _Run) -> None:
    assert run.engine is not None
    first = await run.create()
    second = await run.create()
    ids = [i.id for i in await run.engine.list()]
    _expect({first.id, second.id} <= set(ids), "list", f"{ids} lacks {first.id} or {second.id}")
    _expect(ids.index(second.id) < ids.index(first.id), "list", f"{ids} is not newest first")
    mine = {i.id for i in await run.engine.list(env_ref=first.env_ref)}
    _expect({first.id, second.id} <= mine, "list", f"env_ref={first.env_ref!r} gave {mine}")
    other = {i.id for i in await run.engine.list(env_ref=_NO_SUCH_ENV)}
    _expect(not other & {first.id, second.id}, "list", f"env_ref={_NO_SUCH_ENV!r} gave {other}")


async def _check_delete(run: _Run) -> None:
    c = "delete"
    assert run.engine is not None
    info = await run.create()
    gone = await run.engine.delete(info.id)
    _expect(gone.state is InstanceState.TERMINATED, c, f"returned state {gone.state}")
    _expect(gone.reason is not None, c, "a deleted instance has no reason")
    again = await run.engine.delete(info.id)  # idempotent: no error, the same end
    _expect(again.state is InstanceState.TERMINATED, c, f"a second delete returned {again.state}")
    _expect(again.reason == gone.reason, c, f"the reason changed: {gone.reason} -> {again.reason}")
    try:
        later = await run.engine.get(info.id)
    except InstanceNotFoundError:
        pass  # forgotten: allowed
    else:
        _expect(later.state is InstanceState.TERMINATED, c, f"came back as {later.state}")
    _expect(
        await _until(lambda: _gone(info), run.timeout),
        c,
        f"instance {info.id} still answers at {info.url} after delete",
    )


async def _check_unknown_ids(run: _Run) -> None:
    assert run.engine is not None
    engine = run.engine
    for what, call in (
        ("get", engine.get(_NO_SUCH_ID)),
        ("delete", engine.delete(_NO_SUCH_ID)),
        ("renew", engine.renew(_NO_SUCH_ID, 60.0)),
        ("fork", engine.fork(_NO_SUCH_ID, 1, timeout=run.timeout)),
    ):
        await _raises("unknown_ids", InstanceNotFoundError, call, f"{what} of an unknown id")


async def _check_unknown_environment(run: _Run) -> None:
    assert run.engine is not None
    await _raises(
        "unknown_environment",
        EnvironmentNotFoundError,
        run.engine.create(InstanceSpec(_NO_SUCH_ENV), timeout=run.timeout),
        f"create of {_NO_SUCH_ENV}",
    )


async def _check_renew(run: _Run) -> None:
    c = "renew"
    assert run.engine is not None
    info = await run.create()
    now = time.time()
    renewed = await run.engine.renew(info.id, 3600.0)
    _expect(renewed.id == info.id and renewed.is_running, c, f"returned {renewed}")
    _expect(
        renewed.expires_at is not None and abs(renewed.expires_at - (now + 3600.0)) < 60,
        c,
        f"expires_at {renewed.expires_at} is not about now + 3600 ({now + 3600.0:.0f})",
    )
    got = await run.engine.get(info.id)
    _expect(got.expires_at == renewed.expires_at, c, "get does not show the renewed expiry")
    await run.engine.delete(info.id)
    try:
        await run.engine.renew(info.id, 60.0)
    except InstanceError:
        pass  # InstanceNotFoundError, or another InstanceError naming the end
    except AEnvError as exc:
        raise ConformanceError(f"{c}: renewing a deleted instance raised {exc!r}") from exc
    else:
        raise ConformanceError(f"{c}: renewing a deleted instance succeeded")


async def _check_ttl_expiry(run: _Run) -> None:
    c = "ttl_expiry"
    assert run.engine is not None
    engine = run.engine
    # the TTL runs from the create: it must outlast a start on this machine, as loaded as it is
    # now (one timed create), or the instance expires before it serves, which a create rightly
    # reports as a failed start
    started = time.monotonic()
    first = await run.create()
    ttl = max(2.0, 3 * (time.monotonic() - started))
    await engine.delete(first.id)
    info = await run.create(InstanceSpec(**{**_spec_fields(run.spec), "ttl": ttl}))
    ended: list[InstanceInfo] = []

    async def expired() -> bool:
        try:
            now = await engine.get(info.id)
        except InstanceNotFoundError:
            return True  # forgotten once expired: allowed
        if now.state is InstanceState.TERMINATED:
            ended.append(now)
            return True
        return False

    outlived = f"{info.id} outlived its {ttl:.1f} s TTL"
    _expect(await _until(expired, 30.0 + ttl + run.timeout), c, outlived)
    if ended:
        reason = ended[0].reason
        _expect(reason is TerminationReason.EXPIRED, c, f"its reason is {reason}, not expired")


def _spec_fields(spec: InstanceSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


async def _check_fork(run: _Run) -> None:
    c = "fork"
    assert run.engine is not None
    parent = await run.create()
    if run.probe is not None:
        await _call(parent, *run.probe.write)
    try:
        children = await run.engine.fork(parent.id, 2, timeout=run.timeout)
    except NotSupportedError:
        return  # the typed refusal: this engine cannot fork
    run.made.extend(child.id for child in children)
    _expect(len(children) == 2, c, f"asked for 2 children, got {len(children)}")
    ids = {child.id for child in children}
    _expect(len(ids) == 2 and parent.id not in ids, c, f"children ids {ids} are not new")
    for child in children:
        _expect(child.is_running, c, f"child {child.id} is {child.state}")
        _expect(child.parent == parent.id, c, f"child {child.id} names parent {child.parent}")
        _expect(child.url and child.url != parent.url, c, f"child {child.id} has url {child.url}")
        if run.probe is not None:
            text = await _call(child, *run.probe.read)
            _expect(run.probe.expect in text, c, f"child {child.id} lost its state: {text!r}")
    if run.probe is not None and run.probe.overwrite is not None:
        await _call(children[0], *run.probe.overwrite)
        text = await _call(parent, *run.probe.read)
        _expect(run.probe.expect in text, c, f"a child's write reached its parent: {text!r}")


async def _check_concurrent_creates(run: _Run) -> None:
    c = "concurrent_creates"
    assert run.engine is not None
    infos = await asyncio.gather(*(run.create() for _ in range(3)))
    ids = {info.id for info in infos}
    _expect(len(ids) == 3, c, f"3 creates at once gave ids {sorted(ids)}")
    _expect(all(i.is_running for i in infos), c, f"states {[i.state for i in infos]}")
    _expect(len({i.url for i in infos}) == 3, c, f"urls {[i.url for i in infos]}")
    listed = {i.id for i in await run.engine.list()}
    _expect(ids <= listed, c, f"list lacks some of {sorted(ids)}")
    ends = await asyncio.gather(*(run.engine.delete(i) for i in ids))
    _expect(all(e.state is InstanceState.TERMINATED for e in ends), c, "concurrent deletes")


async def _check_aclose(run: _Run) -> None:
    c = "aclose"
    engine = await run.new_engine()
    info = await engine.create(run.spec, timeout=run.timeout)
    closes = getattr(engine, "closes_instances", None)
    _expect(isinstance(closes, bool), c, "the engine does not say closes_instances (a bool)")
    await engine.aclose()
    await engine.aclose()  # idempotent
    try:
        await engine.get(info.id)
    except AEnvError:
        pass
    except Exception as exc:
        raise ConformanceError(f"{c}: a call after aclose raised {exc!r}") from exc
    if closes:
        _expect(
            await _until(lambda: _gone(info), run.timeout),
            c,
            f"closes_instances is True, yet {info.id} still answers after aclose",
        )
        return
    other = await run.new_engine()  # the instance outlives the closed client: another finds it
    try:
        try:
            found = await other.get(info.id)
        except InstanceNotFoundError as exc:
            raise ConformanceError(
                f"{c}: closes_instances is False, yet another engine does not find {info.id} "
                f"after aclose ({exc})"
            ) from exc
        _expect(found.is_running, c, f"closes_instances is False, yet {info.id} is {found.state}")
        _expect(await _answers(found), c, f"{info.id} stopped answering after aclose")
        await other.delete(info.id)
    finally:
        await other.aclose()


_CHECKS: dict[str, Callable[[_Run], Awaitable[None]]] = {
    "create": _check_create,
    "get": _check_get,
    "list": _check_list,
    "delete": _check_delete,
    "unknown_ids": _check_unknown_ids,
    "unknown_environment": _check_unknown_environment,
    "renew": _check_renew,
    "ttl_expiry": _check_ttl_expiry,
    "fork": _check_fork,
    "concurrent_creates": _check_concurrent_creates,
    "aclose": _check_aclose,
}

ENGINE_CHECKS: tuple[str, ...] = tuple(_CHECKS)
"""The names of the checks, in the order :func:`check_sandbox_engine` runs them."""


async def check_sandbox_engine(
    engine_factory: EngineFactory,
    *,
    spec: InstanceSpec | None = None,
    probe: StateProbe | None = MINI_TERMINAL_PROBE,
    only: Iterable[str] | None = None,
    timeout: float = 60.0,
) -> Sequence[str]:
    """Check that engines made by ``engine_factory`` keep the engine contract.

    Runs the checks named in ``only`` (default: all of :data:`ENGINE_CHECKS`) with instances of
    ``spec`` (default: ``mini-terminal@1.0.0`` with a 10-minute TTL) and returns their names.
    Raises :class:`ConformanceError` at the first broken rule. ``probe`` is how the fork check
    sees state in an instance (``None`` for an environment without such tools).
    """
    names = list(only) if only is not None else list(ENGINE_CHECKS)
    unknown = [n for n in names if n not in _CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; the checks are {list(ENGINE_CHECKS)}")
    spec = spec or InstanceSpec("mini-terminal@1.0.0", ttl=600.0)
    if probe is MINI_TERMINAL_PROBE and not spec.env_ref.startswith("mini-terminal"):
        probe = None  # the default probe speaks to mini-terminal only
    run = _Run(engine_factory, spec, probe, timeout)
    if any(n != "aclose" for n in names):
        run.engine = await run.new_engine()
    try:
        for name in names:
            try:
                await _CHECKS[name](run)
            except ConformanceError:
                raise
            except Exception as exc:  # the contract allows AEnvErrors where it says so only
                raise ConformanceError(f"{name}: raised {type(exc).__name__}: {exc}") from exc
            finally:
                await run.cleanup()
    finally:
        if run.engine is not None:
            await run.engine.aclose()
    return names
