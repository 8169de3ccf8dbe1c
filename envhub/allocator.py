"""The allocator ``aenv serve`` runs with: glibc's ``malloc`` for Python's small objects, so the
memory an attack took goes back to the system once the attack ends.

May import: the standard library.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["ALLOCATOR_ENV", "use_system_allocator"]

log = logging.getLogger("envhub.allocator")

ALLOCATOR_ENV = "PYTHONMALLOC"
"""Python's allocator for small objects; ``aenv serve`` runs with ``malloc`` (see
:func:`use_system_allocator`) unless the operator set it."""
_REEXECED = "AENV_HUB_ALLOCATOR"  # set across the exec: the allocator was chosen here


def use_system_allocator() -> None:
    """Run this program again in place (no return) with :data:`ALLOCATOR_ENV` ``=malloc``,
    unless it is set already, when this process is ``aenv serve`` started from the command
    line (``sys.orig_argv`` ends with ``sys.argv[1:]``, starting ``serve``); in the process
    exec'd, drop the variable again (the programs the hub starts get their default).

    Why: Python's own allocator (pymalloc) serves small objects from 1 MiB arenas and returns
    an arena to the system only when every object in it is free. After 8,000 slow connections
    the hub's live objects were back to their level (30.2 MB against 30.2 MB before), but a
    few hundred survivors (a free list of ``asyncio`` iterators, records of the store's
    threads) kept 24 arenas, 24.5 MB of empty pools, resident for good. Small objects from
    glibc's ``malloc`` go back with ``malloc_trim``, which the gate
    (:mod:`envhub.connections`) calls after a peak: measured by
    ``benchmarks/bench_hub_abuse.py`` (``docs/security.md``). ``PYTHONMALLOC=pymalloc`` (or
    any value) keeps the operator's choice.
    """
    if os.environ.pop(_REEXECED, None) is not None:
        os.environ.pop(ALLOCATOR_ENV, None)
        return
    started = list(getattr(sys, "orig_argv", []))
    argv = sys.argv[1:]
    if (
        ALLOCATOR_ENV in os.environ
        or argv[:1] != ["serve"]
        or len(started) <= len(argv)
        or started[len(started) - len(argv) :] != argv
    ):
        return
    env = {**os.environ, ALLOCATOR_ENV: "malloc", _REEXECED: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, started, env)
    except OSError as exc:  # the allocator is a matter of memory, not of serving: go on
        log.warning("could not run again with PYTHONMALLOC=malloc (%s); pymalloc it is", exc)
