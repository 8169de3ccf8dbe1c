"""Per-instance cgroups: memory, pids and CPU limits, OOM detection, kill-all; v1 and v2.

The zygote opens the cgroup directories it may write under *before* it leaves the host's mount
namespace, and keeps them as directory file descriptors: every later operation is relative to
those (``mkdir``/``open`` with ``dir_fd``), so the sandbox root never needs ``/sys``.

Groups are created under the cgroup the engine already runs in (``/proc/self/cgroup``), named
``aenv-<owner>/<zygote>/<group>`` (``<owner>`` starts with the engine's pid), so two engines never
collide, each zygote has a subtree of its own, and a machine's own hierarchy is never touched.
Without root the same works where those cgroups are the user's (a subtree root delegated to them,
the engine started inside it); elsewhere :func:`limit_warnings` says, once, that nothing is
limited.
Where the kernel or the hierarchy refuses, :meth:`Cgroups.detect` returns what it could set up and
one warning per missing controller; the engine logs them loudly.

Whoever notices first removes a subtree: the zygote when it exits, the engine when its zygote
died (:func:`remove_tree`, which kills what is left, then removes the groups bottom-up), and any
engine starting next to the subtree of an engine whose process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "WORK",
    "Cgroups",
    "InstanceGroup",
    "Limits",
    "limit_warnings",
    "missing_limits",
    "work_limits",
]

_log = logging.getLogger("local_backend.cgroups")

_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD = 100_000


@dataclass(frozen=True)
class Limits:
    """Resource limits of one instance; ``None`` leaves a resource unlimited."""

    memory: int | None = None  # bytes
    pids: int | None = None
    cpu: float | None = None  # cores


WORK = "work"
"""The child group, in an instance's group, of the processes its tool calls start."""
RUNTIME_LEAF = "runtime"
"""cgroup v2: the child group that holds the runtime (a v2 group with children holds none)."""
_WORK_CONTROLLERS = ("memory", "pids", "cpu")
_WORK_CPU_SHARES = 2
"""v1 ``cpu.shares`` of the calls' processes (the runtime has the default, 1024): the runtime
gets the instance's CPU first, so that a fork bomb cannot starve what ends it."""
_WORK_CPU_WEIGHT = 1
"""v2 ``cpu.weight`` likewise (the runtime's leaf has the default, 100)."""


def work_limits(limits: Limits) -> Limits:
    """What the processes an instance's calls start may use together: its limits less a
    reserve for the runtime, so that they hit their own limit first and the runtime lives.

    Memory: a quarter of the instance's, at least 64 MiB and at most 256 MiB (half of it
    below 128 MiB). Processes: an eighth, at least 8 and at most 32 (the runtime's threads
    count)."""
    memory = pids = None
    if limits.memory is not None:
        reserve = limits.memory // 2 if limits.memory < 128 << 20 else limits.memory // 4
        memory = limits.memory - min(max(reserve, min(64 << 20, limits.memory // 2)), 256 << 20)
    if limits.pids is not None:
        pids = max(1, limits.pids - min(max(limits.pids // 8, 8), 32, limits.pids // 2))
    return Limits(memory=memory, pids=pids)


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` (``""`` key: the v2 unified one)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return None


def _write(dir_fd: int, path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(dir_fd: int, path: str) -> str:
    fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)


@dataclass
class Cgroups:
    """The writable cgroup directories of one engine (opened once, used through fds)."""

    version: int  # 1 or 2
    dir_fds: dict[str, int]  # controller ("unified" for v2) -> fd of aenv-<owner>
    warnings: list[str] = field(default_factory=list)
    parents: list[tuple[int, str]] = field(default_factory=list)  # (fd of parent, aenv-<owner>)
    controllers: frozenset[str] = frozenset()  # v2: those enabled for the instances' groups

    @classmethod
    def detect(cls, owner: str, zygote: str = "z") -> Cgroups:
        """Open (creating) ``aenv-<owner>/<zygote>`` under this process's cgroups; never raises."""
        warnings: list[str] = []
        unified = _ROOT / "cgroup.controllers"
        if unified.exists():  # a pure v2 machine
            return cls._detect_v2(_ROOT, owner, zygote, warnings)
        fds: dict[str, int] = {}
        parents: list[tuple[int, str]] = []
        for controller in _CONTROLLERS:
            own = _own_cgroup(controller)
            base = _ROOT / controller
            if own is None or not base.is_dir():
                warnings.append(f"cgroup v1 controller `{controller}` is not mounted")
                continue
            group = base / own.lstrip("/") / f"aenv-{owner}"
            _remove_stale(group.parent)
            try:
                group.mkdir(exist_ok=True)
                (group / zygote).mkdir(exist_ok=True)
                parents.append((os.open(group, os.O_RDONLY | os.O_DIRECTORY), zygote))
                parents.append((os.open(group.parent, os.O_RDONLY | os.O_DIRECTORY), group.name))
                fds[controller] = os.open(group / zygote, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                warnings.append(f"cannot create cgroup {group}: {exc.strerror}")
        if not fds and (_ROOT / "unified" / "cgroup.controllers").exists():
            return cls._detect_v2(_ROOT / "unified", owner, zygote, warnings)
        return cls(version=1, dir_fds=fds, warnings=warnings, parents=parents)

    @classmethod
    def _detect_v2(cls, root: Path, owner: str, zygote: str, warnings: list[str]) -> Cgroups:
        own = _own_cgroup("") or "/"
        parent = root / own.lstrip("/")
        group = parent / f"aenv-{owner}"
        _remove_stale(parent)
        try:
            available = (parent / "cgroup.controllers").read_text().split()
            missing = [c for c in _CONTROLLERS if c not in available]
            if missing:
                warnings.append(f"cgroup v2 controllers not delegated here: {', '.join(missing)}")
            wanted = [c for c in _CONTROLLERS if c in available]
            enabled = frozenset(_enabled_below(parent, wanted, warnings) if wanted else ())
            for level in (group, group / zygote):
                level.mkdir(exist_ok=True)
                if enabled:
                    (level / "cgroup.subtree_control").write_text(
                        " ".join(f"+{c}" for c in enabled)
                    )
            fd = os.open(group / zygote, os.O_RDONLY | os.O_DIRECTORY)
            parents = [
                (os.open(group, os.O_RDONLY | os.O_DIRECTORY), zygote),
                (os.open(parent, os.O_RDONLY | os.O_DIRECTORY), group.name),
            ]
        except OSError as exc:
            warnings.append(f"cannot use cgroup v2 at {group}: {exc.strerror}")
            return cls(version=2, dir_fds={}, warnings=warnings)
        return cls(
            version=2,
            dir_fds={"unified": fd},
            warnings=warnings,
            parents=parents,
            controllers=enabled,
        )

    @property
    def limited(self) -> frozenset[str]:
        """The controllers whose limits the instances' groups get (memory, pids, cpu)."""
        if self.version == 2:
            return self.controllers if self.dir_fds else frozenset()
        return frozenset(self.dir_fds)

    def create(self, name: str, limits: Limits) -> InstanceGroup:
        """A new group ``name`` with ``limits`` applied (missing controllers are skipped)."""
        group = InstanceGroup(self, name)
        for key, fd in self.dir_fds.items():
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=fd)
            group.dirs[key] = fd
        if self.version == 1:
            self._limit_v1(name, limits)
        elif self.dir_fds:
            self._limit_v2(name, limits)
        return group

    def create_work(self, group: InstanceGroup, limits: Limits) -> None:
        """Give an instance's ``group`` its :data:`WORK` child, limited by :func:`work_limits`
        (memory and pids only); on v2 the runtime's own leaf too (:data:`RUNTIME_LEAF`). Call it
        before any process is placed in ``group``. Where the hierarchy refuses, the group stays
        without one (the instance's own limits still hold) and a warning is logged."""
        work = work_limits(limits)
        try:
            if self.version == 1:
                for controller in _WORK_CONTROLLERS:
                    fd = self.dir_fds.get(controller)
                    if fd is not None:
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(f"{group.name}/{WORK}", dir_fd=fd)
                self._limit_v1(f"{group.name}/{WORK}", work)
                if "cpu" in self.dir_fds:
                    with contextlib.suppress(OSError):
                        _write(
                            self.dir_fds["cpu"],
                            f"{group.name}/{WORK}/cpu.shares",
                            str(_WORK_CPU_SHARES),
                        )
            else:
                fd = self.dir_fds.get("unified")
                enabled = [c for c in _WORK_CONTROLLERS if c in self.controllers]
                if fd is None or not enabled:
                    return
                for leaf in (RUNTIME_LEAF, WORK):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(f"{group.name}/{leaf}", dir_fd=fd)
                _write(
                    fd,
                    f"{group.name}/cgroup.subtree_control",
                    " ".join(f"+{c}" for c in enabled),
                )
                group.leaf = RUNTIME_LEAF
                self._limit_v2(f"{group.name}/{WORK}", work)
                if "cpu" in enabled:
                    with contextlib.suppress(OSError):
                        _write(fd, f"{group.name}/{WORK}/cpu.weight", str(_WORK_CPU_WEIGHT))
        except OSError as exc:
            _log.warning(
                "no cgroup of its own for the processes an instance's calls start",
                extra={"group": group.name, "error": exc.strerror or str(exc)},
            )
            return
        group.work = work

    def _limit_v1(self, name: str, limits: Limits) -> None:
        fds = self.dir_fds
        if limits.memory is not None and "memory" in fds:
            _write(fds["memory"], f"{name}/memory.limit_in_bytes", str(limits.memory))
            with contextlib.suppress(OSError):  # no swap accounting on this kernel
                _write(fds["memory"], f"{name}/memory.memsw.limit_in_bytes", str(limits.memory))
        if limits.pids is not None and "pids" in fds:
            _write(fds["pids"], f"{name}/pids.max", str(limits.pids))
        if limits.cpu is not None and "cpu" in fds:
            _write(fds["cpu"], f"{name}/cpu.cfs_period_us", str(_CPU_PERIOD))
            _write(fds["cpu"], f"{name}/cpu.cfs_quota_us", str(int(limits.cpu * _CPU_PERIOD)))

    def _limit_v2(self, name: str, limits: Limits) -> None:
        fd, enabled = self.dir_fds["unified"], self.controllers
        if limits.memory is not None and "memory" in enabled:
            _write(fd, f"{name}/memory.max", str(limits.memory))
            with contextlib.suppress(OSError):
                _write(fd, f"{name}/memory.swap.max", "0")
            with contextlib.suppress(OSError):
                _write(fd, f"{name}/memory.oom.group", "1")
        if limits.pids is not None and "pids" in enabled:
            _write(fd, f"{name}/pids.max", str(limits.pids))
        if limits.cpu is not None and "cpu" in enabled:
            _write(fd, f"{name}/cpu.max", f"{int(limits.cpu * _CPU_PERIOD)} {_CPU_PERIOD}")

    def kill_all(self, *, seconds: float = 120.0) -> None:
        """SIGKILL every process in every group of this zygote, then remove the groups.

        Gives up after ``seconds``: a thousand instances' groups on a loaded machine take the
        kernel well over ten seconds to empty, and nobody waits for a zygote that ends its
        instances because its engine is gone."""
        deadline = time.monotonic() + seconds
        while self.dir_fds:
            alive = False
            names: set[str] = set()
            for fd in self.dir_fds.values():
                with contextlib.suppress(OSError), os.scandir(fd) as entries:
                    names.update(e.name for e in entries if e.is_dir(follow_symlinks=False))
            for fd in self.dir_fds.values():
                for name in names:
                    with contextlib.suppress(OSError):
                        _write(fd, f"{name}/cgroup.kill", "1")
                    for member in _members(name):
                        try:
                            pids = [int(p) for p in _read(fd, f"{member}/cgroup.procs").split()]
                        except OSError:
                            continue
                        for pid in pids:
                            alive = True
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
            removed = True
            for fd in self.dir_fds.values():
                for name in names:
                    for sub in _members(name)[:-1]:
                        with contextlib.suppress(OSError):
                            os.rmdir(sub, dir_fd=fd)
                    try:
                        os.rmdir(name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        removed = False
            if removed or time.monotonic() > deadline:
                return
            time.sleep(0.005 if alive else 0.02)

    def close(self) -> None:
        """Close the directory fds; remove the zygote's group, then ``aenv-<owner>`` if unused."""
        for fd in self.dir_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.dir_fds = {}
        for parent_fd, name in self.parents:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent_fd)
            with contextlib.suppress(OSError):
                os.close(parent_fd)
        self.parents = []


def _enabled_below(parent: Path, wanted: list[str], warnings: list[str]) -> list[str]:
    """The controllers of ``wanted`` that cgroup v2 group ``parent`` (the engine's own) passes
    to its child groups, its ``cgroup.subtree_control``; those it does not pass yet are
    enabled there, one by one, where the kernel lets us. It refuses a domain controller
    (``memory``) below a group that holds a process (``EBUSY``; the root cgroup is exempt, and
    ``pids`` and ``cpu`` may be enabled anyway), and the engine runs in ``parent``: a warning
    then names what is refused, why and what to do, and the instances' groups are still made
    (kill-all works) without that limit."""
    control = parent / "cgroup.subtree_control"
    passed = control.read_text().split()
    refused: list[str] = []
    busy = False
    for controller in (c for c in wanted if c not in passed):
        try:
            control.write_text(f"+{controller}")
        except OSError as exc:
            refused.append(controller)
            busy = busy or exc.errno == errno.EBUSY
    if refused:
        why = (
            "the kernel enables memory only below a group that holds no process, and this "
            "engine's process is in it"
            if busy
            else "the kernel does not offer it there"
        )
        warnings.append(
            f"cgroup v2: {parent} (the cgroup this engine runs in) does not enable "
            f"{', '.join(refused)} for its child groups and cannot ({why}), so instances get "
            "no such limit. On cgroup v2 the local engine's memory limits need it to run in "
            "the root cgroup; elsewhere use a cgroup v1 (or hybrid) host, or the Kubernetes "
            'engine (docs/local-engine.md, "Not yet")'
        )
    passed = control.read_text().split()
    return [c for c in wanted if c in passed]


def _members(name: str) -> list[str]:
    """A group's child groups an engine makes (:data:`WORK`, :data:`RUNTIME_LEAF`), then the
    group itself: the order to remove them in."""
    return [f"{name}/{WORK}", f"{name}/{RUNTIME_LEAF}", name]


def limit_warnings(cgroups: Cgroups, *, privileged: bool) -> list[str]:
    """The warnings an engine logs about what its instances are not limited by (none: memory,
    pids and cpu all are). As root, :meth:`Cgroups.detect`'s own; otherwise one loud warning,
    the same text for every engine of the user (so a process can say it once)."""
    if privileged:
        return list(cgroups.warnings)
    missing = [c for c in _CONTROLLERS if c not in cgroups.limited]
    if not missing:
        return []
    if len(missing) == len(_CONTROLLERS):
        why = "not root and no cgroup delegated to this user, so instances get no cgroup limits"
    else:
        why = f"the cgroups delegated to this user lack {', '.join(missing)}"
    return [
        f"NO RESOURCE LIMITS: {why}; deployConfig {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not enforced for an instance as a whole (rlimits "
        "stand in: memory per process, pids per instance; cpu not at all), so an instance can "
        "exhaust this machine. Run as root, or run the engine inside a cgroup subtree delegated "
        'to this user (docs/local-engine.md, "Without root")'
    ]


def missing_limits() -> list[str]:
    """What this process's engines could not limit, as :func:`limit_warnings` says it, found by
    creating (and removing) a cgroup where an engine would."""
    probe = Cgroups.detect(f"{os.getpid()}-probe{time.monotonic_ns() % 10**6}", "probe")
    try:
        return limit_warnings(probe, privileged=os.geteuid() == 0)
    finally:
        probe.close()


def _remove_stale(parent: Path) -> None:
    """Remove ``aenv-<pid>-*`` subtrees left by engines whose process is gone (only this
    user's: another user's engine may share the parent, and its groups are not ours to touch)."""
    uid = os.geteuid()
    with contextlib.suppress(OSError):
        for group in parent.glob("aenv-*"):
            pid = group.name.removeprefix("aenv-").split("-", 1)[0]
            if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                continue
            if group.stat().st_uid == uid:
                kill_and_remove([group])


def hierarchy_roots() -> list[Path]:
    """Where this process's groups are, one directory per mounted hierarchy we use."""
    if (_ROOT / "cgroup.controllers").exists():
        return [_ROOT / (_own_cgroup("") or "/").lstrip("/")]
    roots = []
    for controller in _CONTROLLERS:
        own = _own_cgroup(controller)
        if own is not None and (_ROOT / controller).is_dir():
            roots.append(_ROOT / controller / own.lstrip("/"))
    unified = _ROOT / "unified"
    if not roots and (unified / "cgroup.controllers").exists():
        roots.append(unified / (_own_cgroup("") or "/").lstrip("/"))
    return roots


def remove_tree(owner: str, zygote: str | None = None) -> list[str]:
    """Kill every process left in ``aenv-<owner>[/<zygote>]`` and remove its groups.

    For the engine, when a zygote died without cleaning up (or never could: SIGKILL).
    Returns the groups that could not be removed (empty when all went).
    """
    trees = []
    for root in hierarchy_roots():
        tree = root / f"aenv-{owner}"
        trees.append(tree / zygote if zygote else tree)
    left = kill_and_remove(trees)
    if zygote:  # the engine's own group goes once its last zygote's did
        for root in hierarchy_roots():
            with contextlib.suppress(OSError):
                (root / f"aenv-{owner}").rmdir()
    return left


def kill_and_remove(trees: list[Path], *, seconds: float = 10.0) -> list[str]:
    """SIGKILL every process in ``trees`` (each a group and its subgroups) until none is left,
    then remove the groups bottom-up. Returns what could not be removed."""
    deadline = time.monotonic() + seconds
    while True:
        groups = [g for tree in trees for g in _walk(tree)]
        alive = False
        for group in groups:
            with contextlib.suppress(OSError):
                (group / "cgroup.kill").write_text("1")  # v2: one write kills the subtree
            try:
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                alive = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        left = []
        for group in sorted(groups, key=lambda g: len(g.parts), reverse=True):
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(str(group))
        if not left or time.monotonic() > deadline:
            return left
        if alive:
            time.sleep(0.005)  # the kernel finishes killing them; their groups then empty
        else:
            time.sleep(0.02)


def _walk(tree: Path) -> list[Path]:
    """``tree`` and every group below it (none if it does not exist)."""
    if not tree.is_dir():
        return []
    found = [tree]
    with contextlib.suppress(OSError):
        for child in tree.iterdir():
            if child.is_dir():
                found.extend(_walk(child))
    return found


@dataclass
class InstanceGroup:
    """One instance's cgroup in every working controller."""

    cgroups: Cgroups
    name: str
    dirs: dict[str, int] = field(default_factory=dict)
    leaf: str = ""
    """cgroup v2 with a :data:`WORK` child: the child group its processes are placed in."""
    work: Limits | None = None
    """The limits of its :data:`WORK` child (:meth:`Cgroups.create_work`), if it has one."""

    @property
    def member(self) -> str:
        """The group (relative to the zygote's) that :meth:`add` places processes in."""
        return f"{self.name}/{self.leaf}" if self.leaf else self.name

    def add(self, pid: int) -> None:
        """Move process ``pid`` (and its future children) into the group."""
        for fd in self.dirs.values():
            _write(fd, f"{self.member}/cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        """Processes in the group and its child groups (host pids)."""
        found: set[int] = set()
        for fd in self.dirs.values():
            for member in _members(self.name):
                with contextlib.suppress(OSError):
                    found.update(int(p) for p in _read(fd, f"{member}/cgroup.procs").split())
        return found

    def usage_fd(self) -> int | None:
        """A read-only descriptor of the group's memory in use (v1 ``memory.usage_in_bytes``,
        v2 ``memory.current``; its child groups included), or None."""
        v1 = self.cgroups.version == 1
        fd = self.dirs.get("memory" if v1 else "unified")
        if fd is None or (not v1 and "memory" not in self.cgroups.controllers):
            return None
        name = "memory.usage_in_bytes" if v1 else "memory.current"
        try:
            return os.open(f"{self.name}/{name}", os.O_RDONLY, dir_fd=fd)
        except OSError:
            return None

    def work_fds(self) -> tuple[list[int], int | None, int | None]:
        """For the runtime inside: write-only descriptors of its :data:`WORK` child's
        ``cgroup.procs`` (one per hierarchy; writing a pid moves that process in), and read-only
        ones of its memory and pids event files. Empty and None without a work group."""
        if self.work is None:
            return [], None, None
        work = f"{self.name}/{WORK}"
        v1 = self.cgroups.version == 1
        keys = ("memory", "pids", "cpu") if v1 else ("unified",)
        procs = []
        for key in keys:
            fd = self.dirs.get(key)
            if fd is not None:
                with contextlib.suppress(OSError):
                    procs.append(os.open(f"{work}/cgroup.procs", os.O_WRONLY, dir_fd=fd))
        events: list[int | None] = []
        for key, name in (
            ("memory" if v1 else "unified", "memory.oom_control" if v1 else "memory.events"),
            ("pids" if v1 else "unified", "pids.events"),
        ):
            fd = self.dirs.get(key)
            try:
                events.append(
                    None if fd is None else os.open(f"{work}/{name}", os.O_RDONLY, dir_fd=fd)
                )
            except OSError:
                events.append(None)
        return procs, events[0], events[1]

    def set_memory(self, limit: int) -> None:
        """Change the group's memory limit (bytes)."""
        if self.cgroups.version == 1 and "memory" in self.dirs:
            fd = self.dirs["memory"]
            with contextlib.suppress(OSError):  # raise the combined limit first when growing
                _write(fd, f"{self.name}/memory.memsw.limit_in_bytes", str(limit))
            _write(fd, f"{self.name}/memory.limit_in_bytes", str(limit))
            with contextlib.suppress(OSError):
                _write(fd, f"{self.name}/memory.memsw.limit_in_bytes", str(limit))
        elif "unified" in self.dirs and "memory" in self.cgroups.controllers:
            _write(self.dirs["unified"], f"{self.name}/memory.max", str(limit))

    def procs_fds(self) -> list[int]:
        """Write-only descriptors of the group's ``cgroup.procs``, one per hierarchy: writing
        ``0`` to each moves the writer in (a template forks an instance from inside its group,
        so that the instance is born there and its memory is charged there from the start)."""
        fds = []
        for fd in self.dirs.values():
            with contextlib.suppress(OSError):
                fds.append(os.open(f"{self.member}/cgroup.procs", os.O_WRONLY, dir_fd=fd))
        return fds

    def holds(self, pid: int) -> bool:
        """True when process ``pid`` (as this process sees pids) is in the group everywhere."""
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                lines = handle.read().splitlines()
        except OSError:
            return False
        mine = [line for line in lines if line.endswith(f"/{self.member}")]
        return len(mine) >= len(self.dirs) > 0

    def event_fds(self) -> tuple[int | None, int | None]:
        """Read-only descriptors of the group's memory and pids event files (for the runtime
        inside, which sees no ``/sys``): ``(memory.events or memory.oom_control, pids.events)``."""
        memory_key = "memory" if self.cgroups.version == 1 else "unified"
        memory_file = "memory.oom_control" if self.cgroups.version == 1 else "memory.events"
        pids_key = "pids" if self.cgroups.version == 1 else "unified"
        opened: list[int | None] = []
        for key, name in ((memory_key, memory_file), (pids_key, "pids.events")):
            fd = self.dirs.get(key)
            try:
                opened.append(
                    None if fd is None else os.open(f"{self.name}/{name}", os.O_RDONLY, dir_fd=fd)
                )
            except OSError:
                opened.append(None)
        return opened[0], opened[1]

    def oom_killed(self) -> bool:
        """True when the kernel killed a process of the group for exceeding its memory."""
        key = "memory" if self.cgroups.version == 1 else "unified"
        fd = self.dirs.get(key)
        if fd is None:
            return False
        name = "memory.oom_control" if self.cgroups.version == 1 else "memory.events"
        try:
            text = _read(fd, f"{self.name}/{name}")
        except OSError:
            return False
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "oom_kill" and int(parts[1]) > 0:
                return True
        return False

    def kill(self, attempts: int = 50) -> None:
        """SIGKILL every process in the group until it is empty (forks racing included)."""
        fd = self.dirs.get("unified")
        if fd is not None:
            with contextlib.suppress(OSError):
                _write(fd, f"{self.name}/cgroup.kill", "1")
        for _ in range(attempts):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self) -> None:
        """Delete the group's directories (its processes must be gone)."""
        for fd in self.dirs.values():
            for member in _members(self.name):
                with contextlib.suppress(OSError):
                    os.rmdir(member, dir_fd=fd)
        self.dirs = {}
