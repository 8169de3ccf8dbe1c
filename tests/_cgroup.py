"""A cgroup of the test's own (v1 memory and pids controllers, under this process's own groups),
and a launcher that starts a runtime inside it: the limits an engine would give an instance,
without the engine. Needs root and cgroup v1; removed (its processes killed) on exit."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType

import pytest

ROOT = Path("/sys/fs/cgroup")


def _own(controller: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            group = ROOT / controller / path.lstrip("/")
            return group if group.is_dir() else None
    return None


def cgroup_v1_or_skip() -> tuple[Path, Path]:
    """This process's memory and pids cgroup directories, or skip the test."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    memory, pids = _own("memory"), _own("pids")
    if memory is None or pids is None:
        pytest.skip("no cgroup v1 memory and pids controllers here")
    return memory, pids


class TestCgroup:
    """``memory`` bytes and ``pids`` processes at most, for whatever :meth:`launcher` starts."""

    __test__ = False  # not a test class, for pytest

    def __init__(self, *, memory: int, pids: int) -> None:
        parent_memory, parent_pids = cgroup_v1_or_skip()
        name = f"aenv-test-{uuid.uuid4().hex[:10]}"
        self.memory_dir = parent_memory / name
        self.pids_dir = parent_pids / name
        self.memory = memory
        self.pids = pids

    def __enter__(self) -> TestCgroup:
        self.memory_dir.mkdir()
        self.pids_dir.mkdir()
        (self.memory_dir / "memory.limit_in_bytes").write_text(str(self.memory))
        (self.pids_dir / "pids.max").write_text(str(self.pids))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        deadline = time.monotonic() + 10
        for group in (self.memory_dir, self.pids_dir):
            while True:
                procs = [int(p) for p in (group / "cgroup.procs").read_text().split()]
                for pid in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    group.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)

    @property
    def processes(self) -> int:
        """How many processes (threads included) the group holds now."""
        return int((self.pids_dir / "pids.current").read_text())

    def drained(self, at_most: int, timeout: float = 10) -> int:
        """Wait until the group holds ``at_most`` processes (killed ones count until their
        parents reap them); how many it holds then."""
        deadline = time.monotonic() + timeout
        while self.processes > at_most and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.processes

    def launcher(self, directory: Path, *, pass_fds: bool) -> Path:
        """An executable that joins this cgroup and execs this Python with its arguments (a
        runtime for :class:`RuntimeProcess`'s ``python=``); with ``pass_fds`` it opens the
        groups' event files as fds 3 (memory) and 4 (pids) first."""
        lines = [
            "#!/bin/sh",
            f"echo $$ > {self.memory_dir}/cgroup.procs || exit 97",
            f"echo $$ > {self.pids_dir}/cgroup.procs || exit 97",
        ]
        if pass_fds:
            lines += [
                f"exec 3< {self.memory_dir}/memory.oom_control",
                f"exec 4< {self.pids_dir}/pids.events",
            ]
        lines.append(f'exec {sys.executable} "$@"')
        path = directory / f"python-in-{self.memory_dir.name}"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)
        return path
