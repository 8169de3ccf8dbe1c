"""Where an :class:`~aenv_ray.Environment`'s instance comes from, decided once.

An origin opens once (the route to the instance's runtime), closes once, and knows what it can:
whether the instance ended and why, and how to fork it. :class:`Environment` holds one and never
asks which engine, or which mode, it has:

- :class:`Attached`: a runtime at a URL someone names (not owned: closing it leaves it running);
- :class:`RunServer`: the aenv run mode (``DUMMY_INSTANCE_IP``): functions and MCP on the
  server's two ports;
- :class:`Engined`: an instance an engine creates (or created: a fork's child) and deletes;
  the engine says how to reach it (:meth:`~aenv_ray.engine.SandboxEngine.route`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlparse, urlunparse

from aenv_ray import protocol as p
from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    Route,
    SandboxEngine,
    end_watcher,
)
from aenv_ray.errors import AEnvError, ConfigurationError

__all__ = [
    "RUN_SERVER_INSTANCE_ID",
    "Attached",
    "Engined",
    "Origin",
    "RunServer",
    "base_url",
    "with_port",
]

RUN_SERVER_INSTANCE_ID = "local"
"""``instance_id`` in the aenv run mode (``DUMMY_INSTANCE_IP``): the seeds' value, kept because
user code and logs compare against it; it does not mean the local engine."""


def with_port(url: str, port: int | None) -> str:
    """``url`` reduced to scheme, host and port; ``port`` when the URL names none.

    >>> with_port("localhost", 8080), with_port("http://h:9/x?y", 8080)
    ('http://localhost:8080', 'http://h:9')
    """
    if "://" not in url:
        url = f"http://{url}"
    parsed = urlparse(url)
    if parsed.port is not None or port is None:
        return urlunparse(parsed._replace(path="", params="", query="", fragment=""))
    netloc = f"{parsed.hostname}:{port}"
    return urlunparse(parsed._replace(netloc=netloc, path="", params="", query="", fragment=""))


class Origin(Protocol):
    """What an Environment needs of where its instance comes from."""

    instance_id: str | None
    startup_wait: float | None  # default seconds to wait for health (None: the setting's)

    async def open(self, timeout: float) -> Route:
        """Get the instance (create it, if that is this origin's job); how to reach it."""
        ...

    async def close(self) -> None:
        """Give the instance back (delete it, if this origin made it). Idempotent."""
        ...

    async def ended(self) -> InstanceInfo | None:
        """The engine's account of the instance if it has terminated, else None."""
        ...

    async def fork(self, n: int, timeout: float) -> list[Origin]:
        """Origins of ``n`` copies of the instance, each already running."""
        ...

    def mcp_url(self, route: Route) -> str:
        """Where the instance's standard MCP endpoint is."""
        ...

    def watch_end(self, callback: Callable[[InstanceInfo], None]) -> None:
        """Call ``callback(info)`` once, from any thread, if the engine sees the instance end
        (an engine that cannot tell never calls it); until :meth:`close`."""
        ...


class _Unforkable:
    why = ""

    def watch_end(self, callback: Callable[[InstanceInfo], None]) -> None:
        return None  # nobody here can tell: a dead server is found by calling it

    async def ended(self) -> InstanceInfo | None:
        return None

    async def fork(self, n: int, timeout: float) -> list[Origin]:
        raise ConfigurationError(
            f"this instance was not created by an engine ({self.why}): it cannot be forked; "
            "create it with Environment(name) or from_project(path)"
        )

    async def close(self) -> None:
        return None


END_GRACE = 10.0
"""How long a call whose connection dropped waits for an end-watching engine to report the
instance's end (:meth:`Engined.ended`) before it fails with the connection's own account: a
kubelet reports a dead container a relist later (a second), a loaded one took over 3 s."""


def base_url(url: str) -> str:
    """``url`` as a runtime's base URL: ``http://`` when it names no scheme; its path kept (a
    hub's proxy of an instance or a service serves the runtime below one), its query, fragment
    and trailing slash dropped.

    >>> base_url("localhost:8080"), base_url("https://hub/v1/services/svc-1/proxy/?x#y")
    ('http://localhost:8080', 'https://hub/v1/services/svc-1/proxy')
    """
    if "://" not in url:
        url = f"http://{url}"
    parsed = urlparse(url)
    return urlunparse(
        parsed._replace(path=parsed.path.rstrip("/"), params="", query="", fragment="")
    )


class Attached(_Unforkable):
    """A runtime already serving at ``url`` (its path kept: a hub's instance or service
    address, ``.../proxy``); closing leaves it running."""

    instance_id: str | None = None
    startup_wait: float | None = 10.0  # a server is there or not
    why = "attach"

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url = base_url(url)
        self.headers = headers

    async def open(self, timeout: float) -> Route:
        return Route(self.url, self.headers)

    def mcp_url(self, route: Route) -> str:
        return route.url + p.MCP_PATH


class RunServer(_Unforkable):
    """The aenv run mode: a server started with ``aenv run`` at ``DUMMY_INSTANCE_IP``, functions
    on ``functions_port`` and MCP on ``mcp_port`` (a URL with an explicit port uses that)."""

    instance_id: str | None = RUN_SERVER_INSTANCE_ID
    startup_wait: float | None = 10.0
    why = "the aenv run mode of DUMMY_INSTANCE_IP"

    def __init__(self, address: str, functions_port: int, mcp_port: int) -> None:
        self.address = address
        self.functions_port = functions_port
        self.mcp_port = mcp_port

    async def open(self, timeout: float) -> Route:
        return Route(with_port(self.address, self.functions_port))

    def mcp_url(self, route: Route) -> str:
        return with_port(self.address, self.mcp_port) + p.MCP_PATH


class Engined:
    """An instance ``engine`` creates from ``spec`` (or ``adopted``: one it already made) and
    deletes on close; ``owns_engine``: the engine was made for this instance and closes too."""

    startup_wait: float | None = None

    def __init__(
        self,
        engine: SandboxEngine,
        *,
        spec: InstanceSpec | None = None,
        adopted: InstanceInfo | None = None,
        owns_engine: bool = False,
    ) -> None:
        if (spec is None) == (adopted is None):
            raise ValueError("give spec (to create an instance) or adopted (one made), not both")
        self.engine = engine
        self.spec = spec
        self.info = adopted
        self.owns_engine = owns_engine
        self.instance_id: str | None = adopted.id if adopted else None
        self._unwatch: Callable[[], None] | None = None

    async def open(self, timeout: float) -> Route:
        if self.info is None:
            assert self.spec is not None
            self.info = await self.engine.create(self.spec, timeout=timeout)
            self.instance_id = self.info.id
        return await self.engine.route(self.info)

    def watch_end(self, callback: Callable[[InstanceInfo], None]) -> None:
        watcher = end_watcher(self.engine)
        if watcher is not None and self.info is not None:
            self._unwatch = watcher.on_end(self.info.id, callback)

    async def close(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()  # its end is ours from here: nobody need be told
        info, self.info = self.info, None
        if info is not None:
            with contextlib.suppress(AEnvError):
                await self.engine.delete(info.id)
        if self.owns_engine:
            self.owns_engine = False
            await self.engine.aclose()

    async def ended(self) -> InstanceInfo | None:
        """The engine's account of the instance's end. Asked when a call's connection dropped:
        an engine that watches ends (Kubernetes) may not know yet (a real kubelet notices a
        dead container at its next relist, about a second), so its report is waited for, up
        to :data:`END_GRACE` seconds."""
        if self.info is None:
            return None
        try:
            now = await self.engine.get(self.info.id)
        except AEnvError:
            return None
        if now.state is InstanceState.TERMINATED:
            return now
        watcher = end_watcher(self.engine)
        if watcher is None:
            return None
        loop = asyncio.get_running_loop()
        told: asyncio.Future[InstanceInfo] = loop.create_future()

        def tell(info: InstanceInfo) -> None:  # from the watch's thread
            def settle() -> None:
                if not told.done():
                    told.set_result(info)

            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(settle)

        cancel = watcher.on_end(self.info.id, tell)
        try:
            return await asyncio.wait_for(told, END_GRACE)
        except TimeoutError:
            return None  # it lives on: the dropped connection was not its end
        finally:
            cancel()

    async def fork(self, n: int, timeout: float) -> list[Origin]:
        if self.info is None:
            raise ConfigurationError("open the environment before forking it")
        infos = await self.engine.fork(self.info.id, n, timeout=timeout)
        return [Engined(self.engine, adopted=info) for info in infos]

    def mcp_url(self, route: Route) -> str:
        return route.url + p.MCP_PATH
