"""Fault suite: ``aenv rollout`` on the built-in mini-terminal as a real process (a real Ray, a
real pool, real instances), one layer SIGKILLed mid-run (the driver; a pool actor; the
engine's zygote), then the same command again (in this process when nothing is left to do:
what it says is the subject then, and that it starts no Ray).

Where the driver is killed, Ray's own end is the subject: the driver starts a local Ray of its
own (its reaper, its agents). Where a pool actor or a zygote is killed, it is not: the driver
joins the session's one Ray (tests/_session_ray.py), as ``aenv rollout`` joins a cluster
(``RAY_ADDRESS``), and one Ray start is not paid per test.

After each: every episode recorded exactly once, none lost, no glued lines, infrastructure
failures retried and never recorded as the agent's; and within a few seconds nothing of the
run is left: no process (the driver, Ray's processes it started or its job's workers on the
session's Ray, the reaper, zygotes, instances), no ``aenv-*`` cgroup of the run's engines
under this process's cgroups, no new ``aenv-*`` directory in /tmp.

"The run's" processes are found, while they live, by a marker in their environment (which the
driver's Ray workers and zygotes inherit from it; on the session's Ray, the workers of the
driver's job get it from the job's ``runtime_env``, which Ray's job manager's
``RAY_JOB_CONFIG_JSON_ENV_VAR`` gives the driver) and by the ``--owner PID-`` that every engine
process (zygote, instance init and runtime) carries on its command line, PID being a marked
process (the pool actor that runs the engine).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests._cli import CHILD, aenv
from tests._paced_policy import write_tasks
from tests._session_ray import SessionRay

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = "mini-terminal@1.0.0"
EPISODES = 8  # two waves: a kill after the first 2 records lands mid-run, with 6 still to go
CONCURRENCY = 4
PAUSE = 1.5  # seconds each episode sleeps in its instance: time to kill things mid-episode
MARK = "AENV_FAULT_SUITE_RUN"
GONE_WITHIN = 10.0  # "a few seconds": Ray's agents alone used to linger for a minute
T = 180.0  # generous bound on a whole run: a loaded 2-core box is slow, never wrong

pytestmark = pytest.mark.timeout(600)


# -- what a run leaves behind ------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    started: int  # clock ticks after boot: with the pid, names one process
    state: str
    command: bytes

    def describe(self) -> str:
        return self.command.replace(b"\0", b" ")[:120].decode(errors="replace").strip()


def _read(path: str) -> bytes | None:
    """A /proc file's bytes (None: the process is gone). ``os.open`` and ``os.read``, not
    pathlib: the tracker reads two files of every process on the machine five times a
    second, and this costs a third as much."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _proc(pid: int) -> Proc | None:
    stat = _read(f"/proc/{pid}/stat")
    command = _read(f"/proc/{pid}/cmdline")
    if stat is None or command is None:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return Proc(pid, int(fields[1]), int(fields[19]), fields[0].decode(), command)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _procs() -> list[Proc]:
    """Every live process on the machine now (zombies included: their state says so)."""
    return [p for p in map(_proc, _pids()) if p is not None]


def _has_marker(pid: int, marker: bytes) -> bool:
    environ = _read(f"/proc/{pid}/environ")
    return environ is not None and marker in environ.split(b"\0")


def _engine_owner(command: bytes) -> bytes | None:
    """``PID-xxxxxx`` of ``--owner PID-xxxxxx`` on an engine process's command line: the
    engine's id, the pid of the process it runs in and a random part."""
    if b"--owner\0" not in command:  # most processes: no need to split
        return None
    parts = command.split(b"\0")
    return parts[parts.index(b"--owner") + 1] if b"--owner" in parts[:-1] else None


@dataclass
class Tracker:
    """Every process of one run, seen by polling /proc while it runs (see the module doc)."""

    marker: bytes
    seen: dict[tuple[int, int], Proc] = field(default_factory=dict)
    # whether a process carries the marker, by (pid, start), with the command line it had:
    # a process's environment changes only with its command line (an exec; Ray's renaming
    # may blank it), so each is read once, not at every scan
    _marked: dict[tuple[int, int], tuple[bytes, bool]] = field(default_factory=dict)
    _owner_ids: set[bytes] = field(default_factory=set)  # _engine_owner of every seen process
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def scan(self) -> list[Proc]:
        """The run's live processes now: the drivers and their descendants, what carries the
        marker (Ray renames its workers and agents, and may blank their environment: their
        ancestry finds them), and the engine processes owned by any of those. Zombies are
        dead: only their parent is left to see."""
        procs = {p.pid: p for p in _procs() if p.state != "Z"}
        children: dict[int, list[int]] = collections.defaultdict(list)
        for proc in procs.values():
            children[proc.ppid].append(proc.pid)
        with self._lock:
            known = {
                pid
                for pid, started in self.seen
                if getattr(procs.get(pid), "started", -1) == started
            }
            start = known | {pid for pid, proc in procs.items() if self._is_marked(proc)}
            ours: set[int] = set()
            while start:
                pid = start.pop()
                if pid in procs and pid not in ours:
                    ours.add(pid)
                    start.update(children[pid])
            owners = {_engine_owner(procs[pid].command) for pid in ours} | self._owner_ids
            owners.discard(None)
            ours |= {p.pid for p in procs.values() if _engine_owner(p.command) in owners}
            found = [procs[pid] for pid in sorted(ours) if pid in procs]
            for proc in found:
                self._remember(proc)
        return found

    def _is_marked(self, proc: Proc) -> bool:
        key = (proc.pid, proc.started)
        known = self._marked.get(key)
        if known is None or known[0] != proc.command:
            known = self._marked[key] = (proc.command, _has_marker(proc.pid, self.marker))
        return known[1]

    def _remember(self, proc: Proc) -> None:
        self.seen[proc.pid, proc.started] = proc
        owner = _engine_owner(proc.command)
        if owner is not None:
            self._owner_ids.add(owner)

    def add(self, pid: int) -> None:
        """Count ``pid`` (a driver) and its descendants in."""
        proc = _proc(pid)
        if proc is not None:
            with self._lock:
                self._remember(proc)

    def follow(self) -> threading.Thread:
        def loop() -> None:
            # twice a second: every process of a run lives longer (an instance, a whole
            # episode of PAUSE seconds at least), and one that outlives the run is found by
            # the last scan all the same (a marker, an ancestor, an engine owner seen before)
            while not self._stop.wait(0.5):
                self.scan()

        thread = threading.Thread(target=loop, daemon=True, name="fault-suite-tracker")
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def find(self, what: bytes, *, child_of: int | None = None) -> Proc:
        """The live process of this run whose command line starts with (or holds) ``what``."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for proc in self.scan():
                if child_of is not None and proc.ppid != child_of:
                    continue
                if proc.command.startswith(what) or what in proc.command:
                    return proc
            time.sleep(0.05)
        raise AssertionError(f"no process {what!r} in this run")

    def wait_for_a_sleeping_episode(self, under: int) -> None:
        """Until an instance below process ``under`` runs the paced policy's ``sleep``: an
        episode is surely under way there (between two waves, none may be)."""
        sleep = [b"sleep", str(PAUSE).encode()]
        deadline = time.monotonic() + T
        while time.monotonic() < deadline:
            procs = _procs()
            parents = {p.pid: p.ppid for p in procs}
            for proc in procs:
                if proc.command.split(b"\0")[:2] != sleep:
                    continue
                pid = proc.pid
                while pid > 1 and pid != under:
                    pid = parents.get(pid, 0)
                if pid == under:
                    return
            time.sleep(0.05)  # each episode sleeps PAUSE seconds: 30 looks at it, at least
        raise AssertionError(f"no episode ever slept under process {under}")

    def survivors(self) -> list[Proc]:
        """Processes of the run alive now: any seen before (same pid and start) or found now."""
        alive = {(p.pid, p.started): p for p in self.scan()}
        with self._lock:
            seen = list(self.seen.values())
        for proc in seen:
            now = _proc(proc.pid)
            if now is not None and now.started == proc.started and now.state != "Z":
                alive[proc.pid, proc.started] = now
        return sorted(alive.values(), key=lambda p: p.pid)

    def engine_owners(self) -> set[str]:
        """The ids (``PID-xxxxxx``) of the run's engines."""
        with self._lock:
            return {owner.decode() for owner in self._owner_ids}

    def instance_ids(self) -> set[str]:
        """Ids of the run's instances (``--instance ID`` on their init's command line)."""
        with self._lock:
            commands = [p.command.split(b"\0") for p in self.seen.values()]
        return {
            parts[parts.index(b"--instance") + 1].decode()
            for parts in commands
            if b"--instance" in parts[:-1]
        }


def _own_cgroups() -> list[Path]:
    """This process's cgroup directories of the memory, pids and cpu controllers (v1)."""
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in ("memory", "pids", "cpu"):
                directory = Path("/sys/fs/cgroup") / controller / path.lstrip("/")
                if directory.is_dir():
                    found.append(directory)
    return found


def _cgroups_of(owners: set[str]) -> list[Path]:
    """The engines' ``aenv-<engine id>`` groups under this process's cgroups."""
    return [
        directory / f"aenv-{owner}"
        for directory in _own_cgroups()
        for owner in owners
        if (directory / f"aenv-{owner}").is_dir()
    ]


def _tmp_entries() -> set[str]:
    return {entry.name for entry in Path("/tmp").iterdir() if entry.name.startswith("aenv-")}


def leftovers(tracker: Tracker, tmp_before: set[str]) -> list[str]:
    """What the run left: processes, cgroups of its engines, new aenv-* entries in /tmp."""
    found = [f"process {p.pid} ({p.describe()})" for p in tracker.survivors()]
    owners = tracker.engine_owners()
    for group in _cgroups_of(owners):
        inside = sorted(d.name for d in group.iterdir() if d.is_dir())
        found.append(f"cgroup {group} (holding {', '.join(inside) or 'no groups'})")
    instances = tracker.instance_ids()
    for name in sorted(_tmp_entries() - tmp_before):
        # other engines share /tmp (other pytest workers'): only what names one of ours counts
        # (a template root, an instance's or a fork's workspace each name their engine)
        if any(owner in name for owner in owners) or any(
            part in instances for part in name.split("-")
        ):
            found.append(f"/tmp/{name}")
    return found


def assert_nothing_left(tracker: Tracker, tmp_before: set[str]) -> None:
    deadline = time.monotonic() + GONE_WITHIN
    left = leftovers(tracker, tmp_before)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(tracker, tmp_before)
    assert not left, f"left {GONE_WITHIN:g} s after the run:\n" + "\n".join(left)


# -- a run of aenv rollout ---------------------------------------------------------------------


@dataclass
class Rollout:
    """``aenv rollout`` on the mini-terminal into ``out``, with the paced policy."""

    out: Path
    tasks: Path
    tracker: Tracker
    env: dict[str, str]
    tmp_before: set[str]  # aenv-* entries /tmp had before
    logs: list[Path] = field(default_factory=list)

    def arguments(self) -> list[str]:
        """What follows ``aenv``: the same in a child and in this process."""
        return [
            "rollout",
            TERMINAL,
            "-n",
            str(EPISODES),
            "-c",
            str(CONCURRENCY),
            "--tasks",
            str(self.tasks),
            "--policy",
            "tests._paced_policy:policy",
            "--out",
            str(self.out),
        ]

    def start(self) -> subprocess.Popen[bytes]:
        log = self.out.parent / f"driver-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as sink:
            driver = subprocess.Popen(
                [*CHILD, *self.arguments()],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.tracker.add(driver.pid)
        return driver

    def finish(self, driver: subprocess.Popen[bytes]) -> str:
        """Wait for ``driver``; its output (it must have succeeded)."""
        code = driver.wait(timeout=T)
        output = self.logs[-1].read_text(errors="replace")
        assert code == 0, output
        return output

    def again_with_nothing_to_do(self) -> str:
        """The same command once more, when every episode is recorded: in this process (what
        it prints is the subject, tests/_cli.py), with the run's marker, so that whatever it
        started would be found. Its output; it must have succeeded and started no Ray."""
        marker = self.env[MARK]
        ray_before = _ray_is_up()
        done = aenv(*self.arguments(), env={MARK: marker}, unset=["RAY_ADDRESS"], cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        assert ray_before or not _ray_is_up(), "nothing to do, and it started Ray"
        return done.stdout + done.stderr

    def records(self) -> list[dict[str, Any]]:
        path = self.out / "trajectories.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for_records(self, driver: subprocess.Popen[bytes], count: int) -> None:
        path = self.out / "trajectories.jsonl"
        deadline = time.monotonic() + T
        while not path.exists() or path.read_bytes().count(b"\n") < count:
            assert driver.poll() is None, self.logs[-1].read_text(errors="replace")
            assert time.monotonic() < deadline, "the run recorded too little in time"
            time.sleep(0.05)


def _ray_is_up() -> bool:
    """Whether this process is a Ray driver now."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


@pytest.fixture
def rollout(tmp_path: Path) -> Iterator[Rollout]:
    """A run whose driver starts a Ray of its own (Ray's end is the subject)."""
    yield from _rollout(tmp_path, None)


@pytest.fixture
def joined_rollout(tmp_path: Path, session_ray: SessionRay) -> Iterator[Rollout]:
    """A run whose driver joins the session's Ray (a layer below Ray is the subject)."""
    yield from _rollout(tmp_path, session_ray)


def _rollout(tmp_path: Path, session_ray: SessionRay | None) -> Iterator[Rollout]:
    tmp_before = _tmp_entries()
    marker = f"{MARK}={uuid.uuid4().hex}"
    tracker = Tracker(marker.encode())
    env = {**os.environ, MARK: marker.split("=", 1)[1]}
    env.pop("RAY_ADDRESS", None)  # a Ray of its own
    if session_ray is not None:  # the session's, with the marker for the job's workers
        env.update(session_ray.env)
        job = {"runtime_env": {"env_vars": {MARK: env[MARK]}}}
        env["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps(job)
    tasks = write_tasks(tmp_path / "tasks.jsonl", PAUSE)
    run = Rollout(tmp_path / "run", tasks, tracker, env, tmp_before)
    tracker.follow()
    try:
        yield run
    finally:
        tracker.stop()
        for proc in tracker.survivors():  # whatever the run left, even when the test failed
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                continue
        for group in _cgroups_of(tracker.engine_owners()):
            for directory in sorted(group.glob("**/"), key=lambda d: -len(d.parts)):
                try:
                    directory.rmdir()  # cgroups hold no files; empty ones go
                except OSError:
                    continue


def assert_every_episode_once(run: Rollout) -> list[dict[str, Any]]:
    """Every episode recorded exactly once, none lost, none glued, none the agent's fault."""
    text = (run.out / "trajectories.jsonl").read_bytes()
    assert text.endswith(b"\n")
    records = run.records()  # every line parses: no two records glued together
    ids = collections.Counter(r["episode_id"] for r in records)
    assert sorted(ids) == sorted(f"{i:06d}-{t}" for i, t in enumerate(_task_ids()))
    assert set(ids.values()) == {1}, ids
    assert {r["outcome"] for r in records} == {"ok"}, [r["reason"] for r in records]
    return records


def _task_ids() -> list[str]:
    from builtin_envs.demos.mini_terminal import TASKS

    return [TASKS[i % len(TASKS)]["id"] for i in range(EPISODES)]


# -- the faults --------------------------------------------------------------------------------

DRIVER = """
import subprocess, sys
import rollout
rollout.init_local(num_cpus=1)
other = subprocess.Popen(["sleep", "300"])  # a child that is not Ray's
print(other.pid, flush=True)
sys.stdin.read()  # until it is killed
"""


def test_the_ray_processes_of_a_driver_killed_with_sigkill_are_gone_within_seconds() -> None:
    tracker = Tracker(f"{MARK}={uuid.uuid4().hex}".encode())
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    tracker.add(driver.pid)
    other = 0
    try:
        assert driver.stdout is not None
        other = int(driver.stdout.readline())
        for name in (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent"):  # these used to linger
            tracker.find(name)
        tracker.find(b"rollout/_reaper.py")
        driver.kill()  # kill -9
        driver.wait(timeout=T)
        deadline = time.monotonic() + GONE_WITHIN
        while (left := [p for p in tracker.survivors() if p.pid != other]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert not left, [p.describe() for p in left]
        assert _proc(other) is not None  # not Ray's: left to notice its parent's death itself
    finally:
        driver.kill()
        driver.wait(timeout=T)
        for stream in (driver.stdin, driver.stdout):
            if stream is not None:
                stream.close()
        for proc in tracker.survivors():
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                continue


def test_a_driver_killed_mid_run_leaves_no_ray_behind_and_the_rerun_finishes_the_job(
    rollout: Rollout,
) -> None:
    driver = rollout.start()
    rollout.wait_for_records(driver, 2)
    rollout.tracker.find(b"ray::PoolActor")  # Ray, its agents and the pool are up
    driver.kill()  # kill -9
    driver.wait(timeout=T)
    # Ray (its agents too), the reaper, the zygote, the instances: gone within a few seconds
    assert_nothing_left(rollout.tracker, rollout.tmp_before)
    done_before = {r["episode_id"] for r in rollout.records()}
    assert 2 <= len(done_before) < EPISODES  # killed mid-run

    output = rollout.finish(rollout.start())  # the same command again
    ran_skipped = rf"\b{EPISODES - len(done_before)} / {len(done_before)}\b"
    assert re.search(ran_skipped, output), output
    records = assert_every_episode_once(rollout)
    assert all(r["attempts"] == 1 for r in records)
    assert_nothing_left(rollout.tracker, rollout.tmp_before)


def test_a_pool_actor_killed_mid_run_costs_retries_not_episodes(joined_rollout: Rollout) -> None:
    rollout = joined_rollout
    driver = rollout.start()
    rollout.wait_for_records(driver, 2)
    actor = rollout.tracker.find(b"ray::PoolActor")
    rollout.tracker.wait_for_a_sleeping_episode(under=actor.pid)
    os.kill(actor.pid, signal.SIGKILL)
    rollout.finish(driver)
    records = assert_every_episode_once(rollout)
    retried = [r for r in records if r["attempts"] > 1]
    assert retried, (actor, [(r["episode_id"], r["instance_id"]) for r in records])
    for row in retried:  # a lost lease: the infrastructure's, retried on a fresh instance
        assert row["retried"], row
        assert all(reason.startswith("LeaseLostError: ") for reason in row["retried"]), row

    again = rollout.again_with_nothing_to_do()  # no pool, no Ray
    assert re.search(rf"\b0 / {EPISODES}\b", again), again
    assert len(rollout.records()) == EPISODES
    assert_nothing_left(rollout.tracker, rollout.tmp_before)


def test_a_zygote_killed_mid_run_costs_retries_not_episodes(joined_rollout: Rollout) -> None:
    rollout = joined_rollout
    driver = rollout.start()
    rollout.wait_for_records(driver, 2)
    actor = rollout.tracker.find(b"ray::PoolActor")
    zygote = rollout.tracker.find(b"local_backend.zygote", child_of=actor.pid)
    rollout.tracker.wait_for_a_sleeping_episode(under=zygote.pid)
    os.kill(zygote.pid, signal.SIGKILL)
    rollout.finish(driver)
    records = assert_every_episode_once(rollout)
    retried = [r for r in records if r["attempts"] > 1]
    assert retried, (zygote, [(r["episode_id"], r["instance_id"]) for r in records])
    for row in retried:  # the engine reports the instance crashed; the SDK says broken
        assert all(reason.startswith("InstanceBrokenError: ") for reason in row["retried"]), row

    again = rollout.again_with_nothing_to_do()
    assert re.search(rf"\b0 / {EPISODES}\b", again), again
    assert len(rollout.records()) == EPISODES
    assert_nothing_left(rollout.tracker, rollout.tmp_before)
