"""Ends that nobody needs to wait for where they happen.

A session fixture of the Kubernetes group (a cluster, the real node) or a worker's Ray ends
after the last test that uses it (``tests/conftest.py``'s ``EARLY_ENDS``), in the middle of the
session: its stop (the real node's ~13 s with no pod left, more with pods) would hold up the
worker's next test for nothing. :func:`end_later` runs it on a thread instead; the session's
end and the next start of a cluster (which reuses the same loopback addresses) wait for it with
:func:`wait_for_ends`, which raises what a stop raised: nothing is left running unnoticed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_PENDING: list[tuple[str, threading.Thread, list[BaseException]]] = []
_LOCK = threading.Lock()


def end_later(what: str, stop: Callable[[], object]) -> None:
    """Run ``stop`` (the end of ``what``) on a thread of its own."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            stop()
        except BaseException as exc:  # kept for wait_for_ends, which raises it
            failures.append(exc)

    thread = threading.Thread(target=run, name=f"end {what}")
    thread.start()
    with _LOCK:
        _PENDING.append((what, thread, failures))


def wait_for_ends(timeout: float = 600.0) -> None:
    """Wait for every stop :func:`end_later` started; ``RuntimeError`` naming those that
    failed or did not finish within ``timeout`` seconds (in all)."""
    deadline = time.monotonic() + timeout
    with _LOCK:
        pending = list(_PENDING)
        _PENDING.clear()
    problems: list[str] = []
    for what, thread, failures in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            problems.append(f"{what}: still stopping after {timeout:.0f} s")
        problems += [f"{what}: {type(exc).__name__}: {exc}" for exc in failures]
    if problems:
        raise RuntimeError("stops that failed: " + "; ".join(problems))
