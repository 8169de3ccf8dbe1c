"""What an environment's code says about the processes its calls start.

Inside an instance, every process a tool call (or a function, the reward, the health check)
starts ends when the call returns: the runtime kills what the call left running, processes
that detached themselves (``setsid``, a double fork) included. A long-lived helper, such as a
persistent shell that serves many calls, is kept by saying so explicitly::

    from aenv_ray import keep_processes

    proc = subprocess.Popen(["bash"], ...)
    keep_processes(proc.pid)  # this process and what it starts live until the episode ends

``keep_processes()`` without a pid keeps everything the current call has started or will
start (outside a call: nothing). Kept processes still end at the end of the episode (the
instance's release or deletion), always. Outside a runtime (a unit test calling the tool
directly) this does nothing. See ``docs/security.md`` ("Agent code and the runtime's process").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["keep_processes", "unconfined"]

_KEEPER: Callable[[int | None], None] | None = None
_UNCONFINED: Callable[[], contextlib.AbstractContextManager[None]] | None = None


def keep_processes(pid: int | None = None) -> None:
    """Let process ``pid`` (and the processes it starts) outlive the current call, or, with no
    ``pid``, everything the current call starts. They still end when the episode ends."""
    keeper = _KEEPER
    if keeper is not None:
        keeper(pid)


def _set_keeper(keeper: Callable[[int | None], None] | None) -> None:
    """The runtime's hook (``sandbox_runtime.contain``); not for environments."""
    global _KEEPER
    _KEEPER = keeper


@contextlib.contextmanager
def unconfined() -> Iterator[None]:
    """Processes this thread starts inside are the environment's own trusted helpers: they do
    not enter the Landlock domain that keeps every other process the runtime starts from
    signalling or tracing what it did not start itself. A helper that must reach into processes
    of other spawns (join an agent's box's namespaces, as terminal-bench's warm pytest does)
    needs it. Never run agent code in such a process. Outside a runtime: nothing."""
    factory = _UNCONFINED
    if factory is None:
        yield
        return
    with factory():
        yield


def _set_unconfined(factory: Callable[[], contextlib.AbstractContextManager[None]] | None) -> None:
    """The runtime's hook (``sandbox_runtime.contain``); not for environments."""
    global _UNCONFINED
    _UNCONFINED = factory
