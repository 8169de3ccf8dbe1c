"""Batched, straggler-tolerant stepping (EnvPool style): many tool calls, first K back first.

:meth:`RolloutPool.step_many` groups the calls by pool actor and sends each group as **one** Ray
call (a streaming generator); the actor runs its group concurrently and streams results back as
they finish, several per message when many finish together. The driver-side :class:`StepBatch`
hands them out in the order they finish:

    batch = pool.step_many([(lease, "execute_command", {"command": a}) for lease, a in ...])
    first = batch.wait(num_returns=48, timeout=5)      # the 48 fastest of 64
    for step in first:
        observe(step.index, step.unwrap())            # ToolResult, or raises the typed error
    rest = batch.results(timeout=30)                  # the stragglers, when you want them

A failed call is data, a :class:`StepResult` with ``error`` set; :meth:`StepResult.unwrap`
raises it. A pool actor that dies fails its group's unfinished steps with
:class:`~aenv_ray.errors.LeaseLostError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from aenv_ray.errors import AEnvTimeoutError
from aenv_ray.protocol import ToolResult
from rollout._ray import translate

__all__ = ["StepBatch", "StepResult"]


@dataclass(frozen=True)
class StepResult:
    """One tool call of a batch: its position in the batch, and its result or error."""

    index: int
    lease_id: str
    tool: str
    result: ToolResult | None
    error: BaseException | None
    seconds: float  # time the call took inside the pool actor

    @property
    def ok(self) -> bool:
        """True when the call returned a result (which may still have ``is_error`` set)."""
        return self.error is None

    def unwrap(self) -> ToolResult:
        """The :class:`~aenv_ray.ToolResult`, or raise the call's error."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@dataclass
class _Group:
    generator: Any  # ray.ObjectRefGenerator
    waiting: dict[int, tuple[str, str]]  # index -> (lease id, tool) not yet back


class StepBatch:
    """Results of :meth:`RolloutPool.step_many`, in the order the calls finish."""

    def __init__(self, groups: Sequence[tuple[Any, dict[int, tuple[str, str]]]]) -> None:
        self._groups = [_Group(gen, dict(waiting)) for gen, waiting in groups if waiting]
        self._ready: list[StepResult] = []
        self.total = sum(len(w) for _, w in groups)
        self._handed = 0

    @property
    def pending(self) -> int:
        """Calls not handed out yet (running, or back and not yet taken)."""
        return self.total - self._handed

    def wait(self, num_returns: int = 1, *, timeout: float) -> list[StepResult]:
        """The next ``num_returns`` calls to finish; fewer if ``timeout`` seconds pass first.

        Like :func:`ray.wait`, a timeout is not an error: look at the length of the list.
        """
        wanted = min(num_returns, self.pending)
        deadline = time.monotonic() + timeout
        while len(self._ready) < wanted:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pull(left):
                break
        taken, self._ready = self._ready[:wanted], self._ready[wanted:]
        self._handed += len(taken)
        return taken

    def as_completed(self, *, timeout: float) -> Iterator[StepResult]:
        """Every remaining call, as each finishes; :class:`AEnvTimeoutError` past ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.pending:
            got = self.wait(1, timeout=max(0.0, deadline - time.monotonic()))
            if not got:
                raise AEnvTimeoutError(
                    f"{self.pending} of {self.total} batched calls did not finish within "
                    f"{timeout:g} s",
                    timeout=timeout,
                )
            yield got[0]

    def results(self, *, timeout: float) -> list[StepResult]:
        """Every remaining call, in batch order; :class:`AEnvTimeoutError` past ``timeout``."""
        return sorted(self.as_completed(timeout=timeout), key=lambda s: s.index)

    def _pull(self, timeout: float) -> bool:
        """Receive what arrived within ``timeout``; False if nothing is running any more."""
        live = [g for g in self._groups if g.waiting]
        if not live:
            return False
        ready, _ = ray.wait(
            [g.generator for g in live], num_returns=1, timeout=timeout, fetch_local=True
        )
        for group in live:
            if group.generator not in ready:
                continue
            try:
                chunk = ray.get(next(group.generator), timeout=timeout + 5)
            except Exception as exc:  # the actor died or Ray lost the stream: fail the rest
                self._fail(group, translate(exc, what="a batched call"))
                continue
            for step in chunk:
                group.waiting.pop(step.index, None)
                self._ready.append(step)
        return True

    def _fail(self, group: _Group, error: BaseException) -> None:
        for index, (lease_id, tool) in group.waiting.items():
            self._ready.append(StepResult(index, lease_id, tool, None, error, 0.0))
        group.waiting.clear()
