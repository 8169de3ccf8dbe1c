"""The output directory of a synthesis run: one writer at a time, records that survive ``kill -9``.

:meth:`RunDirectory.open` first takes the directory's lock: an exclusive ``fcntl`` record lock on
``rollout.lock``, which names its holder (pid, host, start time, command). A second driver on
the same directory gets :class:`RunDirectoryLockedError` at once. The kernel drops the lock
when its process dies, however it dies, so a stale lock never blocks; a record lock is not
inherited by forked children either, so a process the driver left behind cannot keep it.

Then it reads ``trajectories.jsonl``, one JSON object per line:

- a **torn last line** (cut off before its newline, or not JSON) is what a writer killed
  mid-write leaves. It is dropped: the file is truncated back to the end of the last complete
  line and synced, and its episode, not recorded, runs again. :attr:`RunDirectory.torn` says
  which line and (when the prefix names it) which episode; a warning is logged.
- an unreadable line **before** the last, or a last line written whole that is JSON but not a
  record, is not a crash's doing (a crash tears only the last write, and leaves it cut):
  :class:`CorruptRecordError` names the line and stops the run; nothing is changed.

:meth:`RunDirectory.append` writes a record as one ``write()`` of the whole line on an
``O_APPEND`` descriptor, then ``fdatasync``, one record at a time (in a worker thread, so the
event loop never waits on the disk). At any moment at most one record is unsynced, so a crash of
the process *or the machine* leaves at most the last line torn. The cost is one ``fdatasync``
per episode (~0.1 ms here, a few ms on a slow disk): nothing next to an episode's seconds.

    with RunDirectory.open("runs/a") as run:
        done = run.records  # episode id -> record
        await run.append({"episode_id": "000000-t", "outcome": "ok"})

May import: the standard library and :mod:`aenv_ray.errors` only (``aenv rollout`` takes the
lock before it imports Ray).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aenv_ray.errors import ClosedError, ConfigurationError

__all__ = [
    "JSONL",
    "LOCK",
    "CorruptRecordError",
    "LockHolder",
    "RunDirectory",
    "RunDirectoryLockedError",
    "RunMismatchError",
    "TornRecord",
    "read_records",
]

log = logging.getLogger("rollout.run_directory")

JSONL = "trajectories.jsonl"
LOCK = "rollout.lock"
IDENTITY = "run.json"

_HELD: dict[tuple[int, int], LockHolder] = {}  # lock files this process holds: (dev, inode)
_EPISODE_ID = re.compile(rb'^\{"episode_id": ("(?:[^"\\]|\\.)*")')


class RunDirectoryLockedError(ConfigurationError):
    """Another driver holds the run directory's lock: wait for it to finish, or pass another
    ``--out``. ``directory`` and ``holder`` (a :class:`LockHolder`, or None if it has not
    written its name yet) say which."""

    def __init__(
        self,
        message: str = "",
        *,
        directory: str | None = None,
        holder: LockHolder | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.directory = directory
        self.holder = holder


class RunMismatchError(ConfigurationError):
    """The run directory holds records of another run (another environment, task file or
    policy): ``differences`` maps each field to ``(recorded, asked)``. Pass another ``--out``,
    or ``--force`` to write into it anyway."""

    def __init__(self, directory: Path, differences: dict[str, tuple[str, str]]) -> None:
        said = "; ".join(
            f"{k}: {old!r} there, {new!r} now" for k, (old, new) in differences.items()
        )
        super().__init__(
            f"{directory} holds records of another run ({said}); pass another --out, or "
            "--force to add this run's records to it"
        )
        self.directory = directory
        self.differences = differences


class CorruptRecordError(ConfigurationError):
    """A line of ``trajectories.jsonl`` before the last is not a record: not a crash's doing
    (a crash tears only the last line). ``path`` and ``line`` (1-based) say where; fix or
    remove that line, or start a new run directory."""

    def __init__(
        self, message: str = "", *, path: str | None = None, line: int = 0, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.path = path
        self.line = line


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run directory's lock."""

    pid: int
    host: str
    started: float  # seconds since the epoch
    command: str

    def describe(self) -> str:
        """``pid 123 on host h since 2026-01-01 12:00:00 (aenv rollout ...)``"""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on host {self.host} since {since} ({self.command})"

    @classmethod
    def parse(cls, data: bytes) -> LockHolder | None:
        """The holder a lock file names (None if it names none: its holder is just starting)."""
        try:
            fields = json.loads(data)
            return cls(
                int(fields["pid"]), str(fields["host"]), float(fields["started"]), fields["command"]
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class TornRecord:
    """The torn last line :meth:`RunDirectory.open` dropped."""

    line: int  # 1-based
    size: int  # bytes dropped
    episode_id: str | None  # None: the line was cut before its episode id

    def describe(self) -> str:
        """One line for a person."""
        which = f"episode {self.episode_id}" if self.episode_id else "an episode whose id was cut"
        return (
            f"dropped the torn last line {self.line} of {JSONL} ({self.size} bytes, {which}; "
            "a driver was killed while writing it): that episode runs again"
        )


def read_records(path: Path) -> tuple[dict[str, dict[str, Any]], int, TornRecord | None]:
    """``(episode id -> record, bytes of complete lines, the torn last line or None)``.

    Raises :class:`CorruptRecordError` for an unreadable line before the last. A later
    record of an episode replaces an earlier one. Reads nothing into memory but the records.
    """
    records: dict[str, dict[str, Any]] = {}
    good = 0  # end of the last complete, readable line
    bad: tuple[int, int, bytes] | None = None  # (line number, offset, content)
    if not path.exists():
        return records, good, None
    with path.open("rb") as lines:
        offset = 0
        for number, raw in enumerate(lines, start=1):
            if bad is not None:  # an unreadable line, and more after it
                raise _corrupt(path, bad[0], bad[2], "is not the last line")
            row = _parse(raw)
            if row is None or not raw.endswith(b"\n"):
                bad = (number, offset, raw)
            else:
                records[str(row["episode_id"])] = row
                good = offset + len(raw)
            offset += len(raw)
    torn = None
    if bad is not None:
        line, _, content = bad
        if content.endswith(b"\n") and _is_json(content):  # written whole: no crash did this
            raise _corrupt(path, line, content, "is JSON written whole")
        torn = TornRecord(line, len(content), _episode_id(content))
    return records, good, torn


def _corrupt(path: Path, line: int, content: bytes, why: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{path}: line {line} is not a trajectory record ({_excerpt(content)}) and {why}, so it "
        "is not what a killed driver leaves; fix or delete that line, or write this run to a new "
        "--out directory",
        path=str(path),
        line=line,
    )


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(raw)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "episode_id" in row else None


def _episode_id(prefix: bytes) -> str | None:
    match = _EPISODE_ID.match(prefix)
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1)))
    except ValueError:
        return None


def _excerpt(content: bytes) -> str:
    text = content[:60].decode("utf-8", "replace").rstrip("\n")
    return repr(text + ("..." if len(content) > 60 else ""))


class RunDirectory:
    """A run directory, locked and with its records read; see the module docstring.

    Use :meth:`open`; :meth:`close` (or leaving ``with``) releases the lock.
    """

    def __init__(
        self,
        path: Path,
        lock_fd: int,
        key: tuple[int, int],
        records: dict[str, dict[str, Any]],
        torn: TornRecord | None,
    ) -> None:
        self.path = path
        self.records = records  # episode id -> its latest record
        self.torn = torn
        self._lock_fd: int | None = lock_fd
        self._key = key
        self._journal: int | None = None
        self._writing = asyncio.Lock()

    @property
    def jsonl(self) -> Path:
        """``trajectories.jsonl``."""
        return self.path / JSONL

    @property
    def holder(self) -> LockHolder | None:
        """This process as ``rollout.lock`` names it (None once closed). Read it here, never
        from the file: closing any descriptor of the file drops this process's lock."""
        return _HELD.get(self._key) if self._lock_fd is not None else None

    @classmethod
    def open(cls, path: str | Path) -> RunDirectory:
        """Create ``path`` if needed, take its lock, read its records (dropping a torn last
        line). Raises :class:`RunDirectoryLockedError` or :class:`CorruptRecordError`."""
        directory = Path(path).resolve()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot create the run directory {directory}: {exc.strerror}; pass another --out"
            ) from exc
        lock_fd, key = _lock(directory)
        try:
            records, good, torn = read_records(directory / JSONL)
            run = cls(directory, lock_fd, key, records, torn)
            run._open_journal(good)
        except BaseException:
            _HELD.pop(key, None)
            os.close(lock_fd)
            raise
        return run

    def _open_journal(self, good: int) -> None:
        created = not self.jsonl.exists()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._journal = os.open(self.jsonl, flags, 0o644)
        if self.torn is not None:
            os.ftruncate(self._journal, good)  # back to the end of the last complete line
            os.fsync(self._journal)
            log.warning(
                "torn last record dropped; its episode runs again",
                extra={
                    "directory": str(self.path),
                    "line": self.torn.line,
                    "bytes": self.torn.size,
                    "episode": self.torn.episode_id,
                },
            )
        if created:
            _sync_directory(self.path)

    def check_identity(self, identity: dict[str, str], *, force: bool = False) -> None:
        """Refuse to add to records of another run: ``identity`` names this one (environment,
        task file, policy); it is kept in ``run.json``. A directory with records and another
        identity raises :class:`RunMismatchError` unless ``force`` (which records the new
        identity); a directory without records takes it."""
        path = self.path / IDENTITY
        recorded: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict):
                recorded = {str(k): str(v) for k, v in loaded.items()}
        differences = {
            key: (recorded[key], value)
            for key, value in identity.items()
            if key in recorded and recorded[key] != value
        }
        if differences and self.records and not force:
            raise RunMismatchError(self.path, differences)
        if differences or not recorded or force:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(identity, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)

    def compact(self) -> int:
        """Rewrite ``trajectories.jsonl`` with one line per episode, its latest record (an
        episode run again, ``--retry-failed``, left its superseded line behind): atomically,
        by a synced copy renamed over it. Returns how many lines were dropped."""
        if self._journal is None:
            raise ClosedError(f"run directory {self.path} is closed; open it again")
        with self.jsonl.open("rb") as handle:
            lines = sum(1 for _ in handle)
        dropped = lines - len(self.records)
        if dropped <= 0:
            return 0
        tmp = self.path / (JSONL + ".compact")
        with tmp.open("wb") as handle:
            for record in self.records.values():
                handle.write((json.dumps(record) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.jsonl)
        _sync_directory(self.path)
        os.close(self._journal)
        self._journal = os.open(self.jsonl, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return dropped

    async def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one line and sync it; records are written one at a time."""
        data = (json.dumps(record) + "\n").encode()
        async with self._writing:
            await asyncio.to_thread(self._write, data)
        self.records[str(record["episode_id"])] = record

    def _write(self, data: bytes) -> None:
        if self._journal is None:
            raise ClosedError(f"run directory {self.path} is closed; open it again")
        view = memoryview(data)
        while view:  # one write; a short one (a signal, a full disk) goes on where it stopped
            view = view[os.write(self._journal, view) :]
        os.fdatasync(self._journal)

    def close(self) -> None:
        """Close the records and release the lock. Idempotent."""
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        if self._lock_fd is not None:
            _HELD.pop(self._key, None)
            os.close(self._lock_fd)  # releases the record lock
            self._lock_fd = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._lock_fd is not None else "closed"
        return f"RunDirectory({str(self.path)!r}, {len(self.records)} records, {state})"


def _lock(directory: Path) -> tuple[int, tuple[int, int]]:
    """Lock ``directory/rollout.lock`` and write this process's name into it."""
    path = directory / LOCK
    with contextlib.suppress(FileNotFoundError):
        # a record lock is per process: this process's second open would get it too, and its
        # close would drop the first one's, so a lock held here is found without opening it
        st = path.stat()
        held = _HELD.get((st.st_dev, st.st_ino))
        if held is not None:
            raise _locked(directory, held)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = LockHolder.parse(os.pread(fd, 4096, 0))
        os.close(fd)
        raise _locked(directory, holder) from None
    me = LockHolder(os.getpid(), socket.gethostname(), time.time(), " ".join(sys.argv)[:300])
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(asdict(me)) + "\n").encode(), 0)
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    _HELD[key] = me
    return fd, key


def _locked(directory: Path, holder: LockHolder | None) -> RunDirectoryLockedError:
    who = holder.describe() if holder is not None else "a process that is just starting"
    return RunDirectoryLockedError(
        f"run directory {directory} is in use by another driver: {who}; wait for it to finish "
        "or pass another --out",
        directory=str(directory),
        holder=holder,
    )


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
