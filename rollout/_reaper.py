"""Kills the Ray processes a driver started as soon as that driver is gone, however it went.

:func:`rollout._ray.init_local` starts this script (``python -I -S _reaper.py FD DRIVER_PID
RAY_DIR``, the standard library only, in a session of its own) before it starts a local Ray, and
keeps the write end of a pipe whose read end is ``FD``. Reading it returns end-of-file when the
driver's process is gone (a clean exit, an exception, ``kill -9``): the kernel closes the
driver's descriptors, and no other process holds that end (it closes on exec).

Why it is needed: Ray ties gcs_server, raylet, the log monitor and the dashboard to the driver
(``PR_SET_PDEATHSIG``), and workers exit when their raylet does; but the raylet's other
children, the dashboard and runtime-env agents, notice its death only to spend 60 s trying to
tell the dead GCS about it before they exit.

The driver's Ray processes are its children that are Ray's, and their children that are Ray's:
a command line that starts ``ray::`` or ``ray-`` (Ray renames its workers and agents, and may
blank their environment, so no marker there would do) or runs something under ``RAY_DIR``
(Ray's package: gcs_server, raylet, its Python services). Once the driver is dead the tree is
gone (orphans belong to pid 1), so the reaper looks every :data:`_LOOK_EVERY` seconds while the
driver lives (its threads' ``/proc/PID/task/TID/children`` files: a few milliseconds with Ray's
many threads) and remembers each process by pid and start time. Once :data:`_SETTLED` looks in a
row found nothing new (Ray has started: its services and agents are known), it looks every
:data:`_LOOK_SETTLED` seconds, and every :data:`_LOOK_EVERY` again as soon as a look finds a new
process: a driver that lives for hours does not pay for two looks a second. Deeper descendants
(an engine's zygote under a pool actor) and the driver's other children are left alone: they
have their own way to notice their owner's death. A worker started in the last moment before
the driver died is not known, but workers exit with their raylet.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable

_LOOK_EVERY = 0.5  # seconds between looks at the driver's tree
_SETTLED = 20  # looks in a row that found nothing new (10 s): Ray has started
_LOOK_SETTLED = 2.0  # seconds between looks after that
_PASSES = 5


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of a live process (None: gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else (int(fields[1]), int(fields[19]))


def _is_ray(pid: int, ray_dir: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read()
    except OSError:
        return False
    return command.startswith((b"ray::", b"ray-")) or ray_dir in command


def children(pid: int) -> list[int]:
    """The children of ``pid``, from each of its threads' ``children`` file."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as listed:
                found.extend(int(child) for child in listed.read().split())
        except OSError:
            continue
    return found


def children_by_scan(pid: int) -> list[int]:
    """The children of ``pid``, from every process's parent (kernels without ``children``)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[0] == pid:
                found.append(int(name))
    return found


def look(
    driver: int,
    ray_dir: bytes,
    known: dict[int, int],
    children_of: Callable[[int], list[int]] = children,
) -> None:
    """Add the driver's Ray children, and their Ray children, to ``known`` (pid -> start);
    forget those that died (their pids may come back as someone else)."""
    me = os.getpid()  # a child of the driver whose command line names RAY_DIR too
    for pid in children_of(driver):
        stat = _stat(pid)
        if pid == me or stat is None or not _is_ray(pid, ray_dir):
            continue
        known[pid] = stat[1]
        for child in children_of(pid):
            child_stat = _stat(child)
            if child_stat is not None and _is_ray(child, ray_dir):
                known[child] = child_stat[1]
    for pid, started in list(known.items()):
        stat = _stat(pid)
        if stat is None or stat[1] != started:
            del known[pid]


def reap(known: dict[int, int]) -> int:
    """SIGKILL every process of ``known`` still alive (same pid, same start); how many."""
    killed = 0
    for _ in range(_PASSES):
        alive = [pid for pid, started in known.items() if (_stat(pid) or (0, -1))[1] == started]
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                continue
        time.sleep(0.1)
    return killed


def main(argv: list[str]) -> int:
    """``_reaper.py FD DRIVER_PID RAY_DIR``: watch the driver's Ray processes until FD ends."""
    fd, driver, ray_dir = int(argv[1]), int(argv[2]), argv[3].encode()
    os.closerange(3, fd)  # whatever else the driver left open (posix_spawn closes nothing)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # a Ctrl-C or hangup meant for the driver
    known: dict[int, int] = {}
    listed = os.path.exists(f"/proc/{driver}/task/{driver}/children")
    children_of = children if listed else children_by_scan
    unchanged = 0  # looks in a row that found no new process
    while True:
        before = set(known.items())
        look(driver, ray_dir, known, children_of)
        unchanged = unchanged + 1 if set(known.items()) <= before else 0
        wait = _LOOK_SETTLED if unchanged >= _SETTLED else _LOOK_EVERY
        ready, _, _ = select.select([fd], [], [], wait)
        if ready and not os.read(fd, 4096):
            break
    look(driver, ray_dir, known, children_of)  # what is still there (a raylet not yet dead)
    reap(known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
