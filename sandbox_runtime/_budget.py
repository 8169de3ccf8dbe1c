"""How many bytes of arguments a runtime reads at once: a budget from the instance's memory.

Each request's body is read whole, then parsed (a copy as large again, or larger), and what
it holds lives while its call runs. Twelve calls each sending 60 MB to a 1 GiB instance would
need more memory than it has. :class:`ArgumentBudget` admits a request whose body is larger
than :data:`SMALL` only while the bodies admitted and not finished fit in the budget (a sixteenth
of the instance's memory, :func:`budget_for`); the others wait for their turn (their bodies are
not read meanwhile), so they are served one after another instead of killing the instance. One
body larger than the whole budget is admitted alone; one larger than a sixteenth of the memory
(:func:`largest_for`) is refused (:class:`TooLargeForMemory`). Small bodies never wait.

Without a known memory limit there is no budget (every request is admitted at once).

May import: the standard library, ``sandbox_runtime._limits``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sandbox_runtime import _limits

__all__ = ["SMALL", "ArgumentBudget", "TooLargeForMemory", "budget_for", "largest_for"]

SMALL = 1 << 20
"""Bodies up to this many bytes are admitted at once and not counted."""


def budget_for(memory: int | None) -> int | None:
    """The bytes of large bodies an instance with ``memory`` bytes reads at once (None: no
    budget): a sixteenth of its memory, at least 4 MiB (a body is held about three times
    while it is read, parsed and validated)."""
    return None if memory is None else max(memory // 16, 4 << 20)


def largest_for(memory: int | None) -> int | None:
    """The largest body an instance with ``memory`` bytes takes at all (None: no limit but
    ``MAX_REQUEST_BYTES``): a sixteenth of its memory, at least 4 MiB (what the runtime holds
    of it while it reads, parses and validates it, next to its own memory, must fit)."""
    return None if memory is None else max(memory // 16, 4 << 20)


class TooLargeForMemory(ValueError):
    """A body larger than :func:`largest_for` the instance's memory."""


class ArgumentBudget:
    """Admit request bodies while they fit in the instance's budget (one event loop)."""

    def __init__(self) -> None:
        self._used = 0
        self._admitted = 0
        self._changed: asyncio.Condition | None = None

    @property
    def used(self) -> int:
        """Bytes of the large bodies admitted and not finished."""
        return self._used

    @contextlib.asynccontextmanager
    async def admit(self, size: int) -> AsyncIterator[None]:
        """Hold ``size`` bytes of the budget while the body is read and its call runs."""
        limits = _limits.installed()
        memory = limits.memory if limits is not None else None
        budget, largest = budget_for(memory), largest_for(memory)
        if size <= SMALL or budget is None or largest is None:
            yield
            return
        if size > largest:
            raise TooLargeForMemory(
                f"the request's body is {size / (1 << 20):.1f} MiB; an instance with "
                f"{(memory or 0) >> 20} MiB of memory takes at most {largest / (1 << 20):.1f} "
                "MiB (a sixteenth of its memory): pass large data as a file in the workspace, or "
                "give the environment more memory (deployConfig.memory)"
            )
        if self._changed is None:
            self._changed = asyncio.Condition()
        changed = self._changed
        async with changed:
            await changed.wait_for(lambda: self._admitted == 0 or self._used + size <= budget)
            self._used += size
            self._admitted += 1
        try:
            yield
        finally:
            async with changed:
                self._used -= size
                self._admitted -= 1
                changed.notify_all()
