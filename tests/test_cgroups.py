"""Per-instance cgroups against the real kernel: v1 where mounted, and the v2 code path on a
unified hierarchy (``/sys/fs/cgroup`` on a pure v2 machine, ``/sys/fs/cgroup/unified`` on a hybrid
one, where v2 groups work but hold no controllers)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_backend._cgroups import Cgroups, Limits, _enabled_below


def _unified_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.controllers").exists():
            return root
    return None


UNIFIED = _unified_root()
needs_v2 = pytest.mark.skipif(
    UNIFIED is None or os.geteuid() != 0, reason="needs root and a cgroup v2 hierarchy"
)


@pytest.fixture
def v2() -> Iterator[Cgroups]:
    assert UNIFIED is not None
    owner = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cgroups = Cgroups._detect_v2(UNIFIED, owner, "z", [])
    assert cgroups.version == 2
    assert cgroups.dir_fds, cgroups.warnings
    yield cgroups
    cgroups.close()
    assert not (UNIFIED / f"aenv-{owner}").exists()  # close removes the engine's group


@needs_v2
def test_v2_groups_hold_kill_and_remove_real_processes(v2: Cgroups) -> None:
    group = v2.create("i-test", Limits(memory=256 << 20, pids=64, cpu=0.5))
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        group.add(sleeper.pid)
        assert group.pids() == {sleeper.pid}
        assert not group.oom_killed()
        group.kill()
        assert sleeper.wait(timeout=10) == -9
        assert group.pids() == set()
    finally:
        sleeper.kill()
        sleeper.wait()
    group.remove()
    assert group.dirs == {}


@needs_v2
def test_v2_limits_are_written_where_controllers_exist_and_skipped_with_a_warning_elsewhere(
    v2: Cgroups,
) -> None:
    missing = {"memory", "pids", "cpu"} - v2.controllers
    if missing:
        assert any("not delegated" in w for w in v2.warnings), v2.warnings
    # creating a limited group must not fail where the kernel lacks a controller (it did)
    group = v2.create("i-limits", Limits(memory=128 << 20, pids=32, cpu=1.5))
    try:
        base = Path(f"/proc/self/fd/{v2.dir_fds['unified']}") / "i-limits"
        if "memory" in v2.controllers:
            assert (base / "memory.max").read_text().strip() == str(128 << 20)
        if "pids" in v2.controllers:
            assert (base / "pids.max").read_text().strip() == "32"
        if "cpu" in v2.controllers:
            assert (base / "cpu.max").read_text().split() == ["150000", "100000"]
        assert (base / "cgroup.procs").exists()
    finally:
        group.remove()


@needs_v2
def test_v2_memory_refused_below_a_group_with_a_process_is_a_clear_warning(v2: Cgroups) -> None:
    """The engine makes its groups below the cgroup it runs in; on cgroup v2 the kernel enables
    memory for a group's children only when the group holds no process (the root excepted).
    A real group holding a real process: enabling memory below it is refused with a warning
    saying which controller, why and what to do, never an error (on this hybrid host's
    unified hierarchy, which offers no controller, it is refused for that reason instead)."""
    group = v2.create("i-holder", Limits())
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        group.add(sleeper.pid)
        holder = Path(f"/proc/self/fd/{v2.dir_fds['unified']}") / "i-holder"
        offered = (holder / "cgroup.controllers").read_text().split()
        warnings: list[str] = []
        assert "memory" not in _enabled_below(holder, ["memory"], warnings)
        (said,) = warnings
        assert f"cgroup v2: {holder} (the cgroup this engine runs in)" in said
        assert "does not enable memory for its child groups" in said
        why = "holds no process" if "memory" in offered else "does not offer it"
        assert why in said
        assert "Kubernetes engine" in said
    finally:
        sleeper.kill()
        sleeper.wait()
        group.remove()
