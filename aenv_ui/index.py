"""The index of one run directory: what the UI's pages ask of a run, answered by SQLite.

A run's ``trajectories.jsonl`` holds one record per line, each with the whole conversation
(tens of kilobytes). :class:`RunIndex` reads each line once and keeps, per episode, the few
fields the pages filter, sort and chart by (task, outcome, failure kind, reward, tools used,
timings, tokens) and where its line starts in the file; a page of episodes is then one indexed
query, and one episode is one ``seek``. :meth:`RunIndex.refresh` reads only what was appended
since the last call (complete lines: a line being written is left for the next call), so the
index follows a live run; a file rewritten in place (``--retry-failed`` renames a compacted copy
over it) or cut shorter is indexed again from its start. A later record of an episode replaces
the earlier one, as ``aenv rollout`` reads them.

    >>> import json, tempfile
    >>> from pathlib import Path
    >>> run = Path(tempfile.mkdtemp())
    >>> record = {"episode_id": "000000-t1", "task_id": "t1", "outcome": "ok", "reward": 1.0}
    >>> _ = (run / "trajectories.jsonl").write_text(json.dumps(record) + "\\n")
    >>> with RunIndex.open(run, Path(tempfile.mkdtemp())) as index:
    ...     index.refresh()
    ...     [e["episode_id"] for e in index.episodes()["episodes"]]
    1
    ['000000-t1']

The index file lives outside the run directory (``index_dir``, by default the user's cache
directory), named by the run directory's real path: a run directory is its driver's, and may
be read-only.

A run a driver pushed to a hub (:mod:`aenv_ray.hubruns`) is a run directory too, kept by the
hub; :class:`PushedRunIndex` (which :func:`open_index` picks for it) says it is live by its
driver's heartbeat rather than by a lock.

May import: the standard library, ``aenv_ray.errors``, ``aenv_ray.hubruns``; lazily, inside
functions: platformdirs.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aenv_ray.errors import ConfigurationError, RunNotFoundError
from aenv_ray.hubruns import STATE, is_live

__all__ = [
    "JSONL",
    "RUN_JSON",
    "EpisodeQuery",
    "PushedRunIndex",
    "RunIndex",
    "default_index_dir",
    "failure_kind",
    "is_run_directory",
    "open_index",
]

JSONL = "trajectories.jsonl"
RUN_JSON = "run.json"
LOCK = "rollout.lock"
SCHEMA = 5  # the index's own layout; another one is rebuilt
_CHUNK = 4 << 20  # bytes read per step while indexing
_KIND = re.compile(r"^([A-Z][A-Za-z0-9_]*(?:Error|Exception|Exceeded|Timeout|Exit))\b")

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    seq INTEGER PRIMARY KEY,          -- order of arrival (a replaced record arrives again)
    episode_id TEXT NOT NULL UNIQUE,
    offset INTEGER NOT NULL,          -- where its line starts in trajectories.jsonl
    length INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    kind TEXT NOT NULL,               -- 'ok', or the failure's kind (error type, else outcome)
    reason TEXT NOT NULL,
    reward REAL,
    truncated INTEGER NOT NULL,
    steps INTEGER NOT NULL,
    errors INTEGER NOT NULL,          -- tool calls that returned an error
    turns INTEGER NOT NULL,
    retried INTEGER NOT NULL,
    seconds REAL,
    tokens INTEGER,
    tools TEXT NOT NULL               -- ' tool1 tool2 ': the tools it called
);
CREATE INDEX IF NOT EXISTS episodes_task
    ON episodes (task_id, reward, kind, seconds, retried, tokens);
CREATE INDEX IF NOT EXISTS episodes_kind ON episodes (kind);
CREATE INDEX IF NOT EXISTS episodes_reward ON episodes (reward);
-- steps and turns carry their episode's task: a task's latencies are read from one index
CREATE TABLE IF NOT EXISTS steps (
    episode_id TEXT NOT NULL, task_id TEXT NOT NULL, tool TEXT NOT NULL, seconds REAL,
    is_error INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_episode ON steps (episode_id);
CREATE INDEX IF NOT EXISTS steps_tool ON steps (tool, seconds, is_error);
CREATE INDEX IF NOT EXISTS steps_task ON steps (task_id, tool, seconds, is_error);
CREATE TABLE IF NOT EXISTS turns (
    episode_id TEXT NOT NULL, task_id TEXT NOT NULL, turn INTEGER NOT NULL, seconds REAL,
    tokens INTEGER
);
CREATE INDEX IF NOT EXISTS turns_episode ON turns (episode_id);
CREATE INDEX IF NOT EXISTS turns_turn ON turns (turn, seconds, tokens);
CREATE INDEX IF NOT EXISTS turns_task ON turns (task_id, turn, seconds, tokens);
CREATE TABLE IF NOT EXISTS retries (kind TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""

SORTS = {
    "arrival": "seq",
    "-arrival": "seq DESC",
    "reward": "reward, seq",
    "-reward": "reward DESC, seq",
    "seconds": "seconds, seq",
    "-seconds": "seconds DESC, seq",
    "task": "task_id, seq",
}
"""How a page of episodes may be sorted (``-``: descending)."""

MAX_PAGE = 500


def default_index_dir() -> Path:
    """Where indexes live unless told: ``$AENV_UI_INDEX_DIR``, else the user's cache directory
    (``~/.cache/aenv-ray/ui-index`` on Linux)."""
    given = os.environ.get("AENV_UI_INDEX_DIR")
    if given:
        return Path(given)
    import platformdirs

    return Path(platformdirs.user_cache_dir("aenv-ray")) / "ui-index"


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` is a rollout run directory (it has ``run.json`` or records)."""
    return (path / RUN_JSON).is_file() or (path / JSONL).is_file()


def failure_kind(outcome: str, reason: str | None) -> str:
    """The kind of an episode's end: ``ok``, else the error type its reason starts with
    (``InstanceDiedError``), else its outcome (``agent_error``, ``timeout``, ...).

    >>> failure_kind("agent_error", "ToolError: no such file")
    'ToolError'
    >>> failure_kind("timeout", "the episode ran past 60 s")
    'timeout'
    """
    if outcome == "ok":
        return "ok"
    match = _KIND.match((reason or "").strip())
    return match.group(1) if match else (outcome or "unknown")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The indexed fields of ``record`` (any record format: missing fields are empty)."""
    outcome = str(record.get("outcome") or "unknown")
    reason = str(record.get("reason") or "")
    steps = [s for s in _list(record.get("steps")) if isinstance(s, Mapping)]
    turns = [t for t in _list(record.get("turns")) if isinstance(t, Mapping)]
    usage = record.get("usage") if isinstance(record.get("usage"), Mapping) else {}
    tokens = usage.get("total_tokens") if isinstance(usage, Mapping) else None
    tools = sorted({str(s.get("tool")) for s in steps if s.get("tool")})
    return {
        "episode_id": str(record["episode_id"]),
        "task_id": str(record.get("task_id") or ""),
        "outcome": outcome,
        "kind": failure_kind(outcome, reason),
        "reason": reason,
        "reward": _number(record.get("reward")),
        "truncated": int(bool(record.get("truncated"))),
        "steps": len(steps),
        "errors": sum(1 for s in steps if s.get("is_error")),
        "turns": len(turns),
        "retried": len(_list(record.get("retried"))),
        "seconds": _number(record.get("seconds")),
        "tokens": int(tokens) if isinstance(tokens, int) else None,
        "tools": f" {' '.join(tools)} " if tools else "",
        "_steps": [
            (str(s.get("tool") or "?"), _number(s.get("seconds")), int(bool(s.get("is_error"))))
            for s in steps
        ],
        "_turns": [
            (
                n,
                _number(t.get("seconds")),
                (t.get("usage") or {}).get("total_tokens")
                if isinstance(t.get("usage"), Mapping)
                else None,
            )
            for n, t in enumerate(turns)
        ],
        "_retried": [
            failure_kind("retried", str(r).split(":", 1)[0] if ":" in str(r) else str(r))
            for r in _list(record.get("retried"))
        ],
    }


class EpisodeQuery:
    """The filters of a page of episodes (every one optional; they combine with AND).

    ``task``: the task id; ``kind``: ``ok``, ``failed`` (any other) or one failure kind;
    ``tool``: episodes that called it; ``min_reward``/``max_reward``: the reward's range;
    ``text``: a substring of the episode id, task id or reason; ``errors``: only episodes
    with a tool call that returned an error.
    """

    def __init__(
        self,
        *,
        task: str | None = None,
        kind: str | None = None,
        tool: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        text: str | None = None,
        errors: bool = False,
    ) -> None:
        self.task, self.kind, self.tool, self.text = task, kind, tool, text
        self.min_reward, self.max_reward, self.errors = min_reward, max_reward, errors

    def where(self) -> tuple[str, list[Any]]:
        """The SQL ``WHERE`` clause and its parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.task:
            clauses.append("task_id = ?")
            params.append(self.task)
        if self.kind == "failed":
            clauses.append("kind != 'ok'")
        elif self.kind:
            clauses.append("kind = ?")
            params.append(self.kind)
        if self.tool:
            clauses.append("instr(tools, ?) > 0")
            params.append(f" {self.tool} ")
        if self.min_reward is not None:
            clauses.append("reward >= ?")
            params.append(self.min_reward)
        if self.max_reward is not None:
            clauses.append("reward <= ?")
            params.append(self.max_reward)
        if self.text:
            clauses.append(
                "(instr(episode_id, ?) > 0 OR instr(task_id, ?) > 0 OR instr(reason, ?) > 0)"
            )
            params += [self.text] * 3
        if self.errors:
            clauses.append("errors > 0")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class RunIndex:
    """The index of one run directory (see the module). Thread-safe: one lock around its
    connection; :meth:`refresh` is cheap when nothing was appended (one ``stat``)."""

    def __init__(self, run: Path, path: Path, db: sqlite3.Connection) -> None:
        self.run = run
        self.path = path
        self._db = db
        self._lock = threading.Lock()
        self._checked = 0.0
        self._samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=120)

    @classmethod
    def open(cls, run: Path | str, index_dir: Path | str | None = None) -> RunIndex:
        """The index of run directory ``run`` (made if new, rebuilt if of another layout)."""
        run = Path(run).resolve()
        if not run.is_dir():
            raise RunNotFoundError(
                f"no run directory {run}: pass a directory `aenv rollout --out` wrote"
            )
        where = Path(index_dir) if index_dir is not None else default_index_dir()
        where.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(str(run).encode()).hexdigest()[:20]
        path = where / f"{run.name[:40]}-{digest}.sqlite"
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_TABLES)
        index = cls(run, path, db)
        if index._meta("schema") != str(SCHEMA):
            index._reset()
        return index

    def close(self) -> None:
        """Close the index's database."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> RunIndex:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- building ------------------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: object) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    def _reset(self) -> None:
        self._db.executescript(
            "BEGIN; DELETE FROM meta; DELETE FROM episodes; DELETE FROM steps; "
            "DELETE FROM turns; DELETE FROM retries; COMMIT;"
        )
        self._set_meta("schema", SCHEMA)
        self._set_meta("offset", 0)

    def refresh(self, *, at_most_every: float = 0.0) -> int:
        """Index what was appended to ``trajectories.jsonl`` since the last call (complete
        lines only); the number of records read. ``at_most_every``: do nothing if the last
        refresh was less than that many seconds ago (pages ask on every request)."""
        now = time.monotonic()
        if at_most_every and now - self._checked < at_most_every:
            return 0
        with self._lock:
            self._checked = now
            return self._refresh()

    def _refresh(self) -> int:
        jsonl = self.run / JSONL
        try:
            stat = jsonl.stat()
        except FileNotFoundError:
            return 0
        identity = f"{stat.st_dev}:{stat.st_ino}"
        offset = int(self._meta("offset") or 0)
        if self._meta("file") not in (None, identity) or stat.st_size < offset:
            self._reset()  # rewritten (a compacted copy renamed over it) or cut: from the start
            offset = 0
        self._set_meta("file", identity)
        if stat.st_size == offset:
            return 0
        read = 0
        with jsonl.open("rb") as file:
            file.seek(offset)
            while True:
                chunk = file.read(_CHUNK)
                if not chunk:
                    break
                end = chunk.rfind(b"\n")
                if end < 0:
                    if len(chunk) < _CHUNK:
                        break  # a line still being written: the next refresh reads it
                    more = file.readline()  # one line longer than a chunk
                    if not more.endswith(b"\n"):
                        break
                    chunk, end = chunk + more, len(chunk) + len(more) - 1
                complete = chunk[: end + 1]
                read += self._add(complete, offset)
                offset += len(complete)
                file.seek(offset)
        return read

    def _add(self, chunk: bytes, offset: int) -> int:
        rows: list[dict[str, Any]] = []
        start = 0
        while start < len(chunk):
            end = chunk.index(b"\n", start)
            line = chunk[start:end]
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None  # torn by a crash: aenv rollout drops it when it resumes
                if isinstance(record, dict) and record.get("episode_id") is not None:
                    row = _row(record)
                    row["offset"], row["length"] = offset + start, end - start
                    rows.append(row)
            start = end + 1
        db = self._db
        db.execute("BEGIN")
        try:
            ids = [(r["episode_id"],) for r in rows]
            db.executemany("DELETE FROM episodes WHERE episode_id = ?", ids)
            db.executemany("DELETE FROM steps WHERE episode_id = ?", ids)
            db.executemany("DELETE FROM turns WHERE episode_id = ?", ids)
            columns = [c for c in rows[0] if not c.startswith("_")] if rows else []
            db.executemany(
                f"INSERT INTO episodes ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})",
                [tuple(r[c] for c in columns) for r in rows],
            )
            db.executemany(
                "INSERT INTO steps VALUES (?, ?, ?, ?, ?)",
                [(r["episode_id"], r["task_id"], *s) for r in rows for s in r["_steps"]],
            )
            db.executemany(
                "INSERT INTO turns VALUES (?, ?, ?, ?, ?)",
                [(r["episode_id"], r["task_id"], *t) for r in rows for t in r["_turns"]],
            )
            db.executemany(
                "INSERT INTO retries VALUES (?, 1) ON CONFLICT (kind) DO UPDATE SET n = n + 1",
                [(k,) for r in rows for k in r["_retried"]],
            )
            self._set_meta("offset", offset + len(chunk))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return len(rows)

    # -- reading -------------------------------------------------------------------------------
    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._db.execute(sql, params).fetchall()]

    def _one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any]:
        rows = self._all(sql, params)
        return rows[0] if rows else {}

    def _cached(self, name: str, compute: Any) -> Any:
        """``compute()``, kept in the index until more records are read (so a run that is not
        growing opens without aggregating its episodes again)."""
        with self._lock:
            offset = self._meta("offset")
            kept = self._meta(f"cache:{name}")
        if kept is not None:
            stored = json.loads(kept)
            if stored["offset"] == offset:
                return stored["value"]
        value = compute()
        with self._lock:
            if self._meta("offset") == offset:
                self._set_meta(f"cache:{name}", json.dumps({"offset": offset, "value": value}))
        return value

    def settings(self) -> dict[str, Any]:
        """What ``run.json`` says of the run (its environment, tasks, policy), or ``{}``."""
        try:
            data = json.loads((self.run / RUN_JSON).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def holder(self) -> dict[str, Any] | None:
        """The driver writing the run now (pid, host, started, command, as ``rollout.lock``
        names it), or None when no process holds the lock. The kernel's table of locks
        (``/proc/locks``) is read, and the lock file itself only when another process holds
        it: closing any descriptor of it would drop the lock of a driver in this very process
        (POSIX locks are per process). Elsewhere than Linux, None."""
        try:
            stat = (self.run / LOCK).stat()
            held = Path("/proc/locks").read_text()
        except OSError:
            return None
        inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        for line in held.splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[5] == inode and fields[3] == "WRITE":
                pid = int(fields[4]) if fields[4].isdigit() else None
                if pid == os.getpid():  # a driver in this process: not one open() of its file
                    return {"pid": pid, "host": socket.gethostname()}
                try:
                    holder = json.loads((self.run / LOCK).read_text())
                except (OSError, ValueError):
                    holder = None
                return holder if isinstance(holder, dict) else {"pid": pid}
        return None

    def summary(self) -> dict[str, Any]:
        """The run at a glance: counts by kind, retries by kind, rewards, episodes/s, live."""
        counts: dict[str, Any] = self._cached("summary", self._counts)
        holder = self.holder()
        rate = self._rate(counts["episodes"]) if holder else self._overall_rate(counts)
        return {**counts, "episodes_per_second": rate, "live": holder is not None, "driver": holder}

    def _counts(self) -> dict[str, Any]:
        totals = self._one(
            "SELECT count(*) AS episodes, avg(reward) AS mean_reward, "
            "sum(kind = 'ok') AS ok, sum(kind != 'ok') AS failed, sum(retried) AS retried, "
            "sum(tokens) AS tokens, "
            "avg(seconds) AS mean_seconds, count(DISTINCT task_id) AS tasks FROM episodes"
        )
        by_kind = self._all(
            "SELECT kind, outcome, count(*) AS n FROM episodes GROUP BY kind, outcome "
            "ORDER BY n DESC"
        )
        retries = self._all("SELECT kind, n FROM retries ORDER BY n DESC")
        return {**totals, "by_kind": by_kind, "retries": retries}

    def _rate(self, episodes: int) -> float | None:
        """Episodes recorded per second over the last minute, as this index saw them arrive
        (None until two looks at least a second apart)."""
        now = time.monotonic()
        samples = self._samples
        samples.append((now, episodes))
        while len(samples) > 2 and now - samples[1][0] >= 60.0:
            samples.popleft()
        then, before = samples[0]
        return (episodes - before) / (now - then) if now - then >= 1.0 else None

    def _overall_rate(self, totals: Mapping[str, Any]) -> float | None:
        """A finished run's episodes per second: its episodes over the time from its last
        driver's start (``rollout.lock`` names it) to its last record (an underestimate for a
        run resumed after a pause, whose earlier episodes count too)."""
        try:
            started = json.loads((self.run / LOCK).read_text()).get("started")
            last = (self.run / JSONL).stat().st_mtime
        except (OSError, ValueError, AttributeError):
            return None
        if not isinstance(started, int | float) or last <= started or not totals["episodes"]:
            return None
        return float(totals["episodes"]) / (last - float(started))

    def episodes(
        self,
        query: EpisodeQuery | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        sort: str = "arrival",
    ) -> dict[str, Any]:
        """One page of episodes matching ``query``: ``{"total", "offset", "episodes"}``."""
        if sort not in SORTS:
            raise ConfigurationError(f"no sort `{sort}`; there are: {', '.join(SORTS)}")
        limit = max(1, min(int(limit), MAX_PAGE))
        where, params = (query or EpisodeQuery()).where()
        total = self._one(f"SELECT count(*) AS n FROM episodes{where}", params)["n"]
        rows = self._all(
            "SELECT episode_id, task_id, outcome, kind, reason, reward, truncated, steps, "
            f"errors, turns, retried, seconds, tokens, tools FROM episodes{where} "
            f"ORDER BY {SORTS[sort]} LIMIT ? OFFSET ?",
            [*params, limit, max(0, int(offset))],
        )
        for row in rows:
            row["tools"] = row["tools"].split()
        return {"total": total, "offset": offset, "limit": limit, "episodes": rows}

    def episode(self, episode_id: str) -> dict[str, Any]:
        """The whole record of one episode, read from its line."""
        row = self._one("SELECT offset, length FROM episodes WHERE episode_id = ?", (episode_id,))
        if not row:
            raise RunNotFoundError(
                f"no episode `{episode_id}` in run {self.run.name}: it was not recorded (yet)"
            )
        with (self.run / JSONL).open("rb") as file:
            file.seek(row["offset"])
            line = file.read(row["length"])
        record: dict[str, Any] = json.loads(line)
        return record

    def tasks(self, *, passing: float = 1.0) -> list[dict[str, Any]]:
        """Per task: episodes, mean/min/max reward, pass rate (reward >= ``passing``),
        failures."""
        return self._cached(f"tasks:{passing!r}", lambda: self._tasks(passing))  # type: ignore[no-any-return]

    def _tasks(self, passing: float) -> list[dict[str, Any]]:
        return self._all(
            "SELECT task_id, count(*) AS episodes, avg(reward) AS mean_reward, "
            "min(reward) AS min_reward, max(reward) AS max_reward, "
            "avg(CASE WHEN reward >= ? THEN 1.0 ELSE 0.0 END) AS pass_rate, "
            "sum(kind != 'ok') AS failed, avg(seconds) AS mean_seconds "
            "FROM episodes GROUP BY task_id ORDER BY task_id",
            (passing,),
        )

    def rewards(self, *, passing: float = 1.0, task: str | None = None) -> dict[str, Any]:
        """What the Rewards page charts (of one task, or the whole run): the reward histogram,
        pass rate, failures by kind, latency per tool and per turn, and the per-task table."""
        where, params = EpisodeQuery(task=task).where()
        histogram = self._all(
            f"SELECT reward, count(*) AS n FROM episodes{where} GROUP BY reward ORDER BY reward",
            params,
        )
        passed = self._one(
            "SELECT avg(CASE WHEN reward >= ? THEN 1.0 ELSE 0.0 END) AS pass_rate, "
            f"count(*) AS episodes FROM episodes{where}",
            [passing, *params],
        )
        kinds = self._all(
            f"SELECT kind, count(*) AS n FROM episodes{where} GROUP BY kind ORDER BY n DESC",
            params,
        )
        of_task = "" if task is None else " WHERE task_id = ?"
        extra = [] if task is None else [task]
        tools = self._all(
            "SELECT tool, count(*) AS calls, sum(is_error) AS errors, avg(seconds) "
            f"AS mean_seconds FROM steps{of_task} GROUP BY tool ORDER BY calls DESC",
            extra,
        )
        for tool in tools:
            tool.update(self._quantiles("steps", "tool = ?", [tool["tool"]], task))
        turns = self._all(
            "SELECT turn, count(*) AS n, avg(seconds) AS mean_seconds, "
            f"avg(tokens) AS mean_tokens FROM turns{of_task} GROUP BY turn ORDER BY turn",
            extra,
        )
        for turn in turns:
            turn.update(self._quantiles("turns", "turn = ?", [turn["turn"]], task))
        return {
            "task": task,
            "passing": passing,
            "histogram": histogram,
            **passed,
            "kinds": kinds,
            "tools": tools,
            "turns": turns,
            "tasks": self.tasks(passing=passing) if task is None else [],
        }

    def _quantiles(
        self, table: str, where: str, params: list[Any], task: str | None
    ) -> dict[str, float | None]:
        if task is not None:
            where = f"task_id = ? AND {where}"
            params = [task, *params]
        n = self._one(
            f"SELECT count(*) AS n FROM {table} WHERE {where} AND seconds IS NOT NULL", params
        )["n"]
        out: dict[str, float | None] = {}
        for name, q in (("p50_seconds", 0.5), ("p95_seconds", 0.95)):
            row = self._one(
                f"SELECT seconds FROM {table} WHERE {where} AND seconds IS NOT NULL "
                "ORDER BY seconds LIMIT 1 OFFSET ?",
                [*params, max(0, math.ceil(q * n) - 1)],
            )
            out[name] = row.get("seconds") if n else None
        return out

    def tools(self) -> list[str]:
        """Every tool the run's episodes called."""
        return [r["tool"] for r in self._all("SELECT DISTINCT tool FROM steps ORDER BY tool")]

    def kinds(self) -> list[str]:
        """Every kind of end the run's episodes had."""
        return [r["kind"] for r in self._all("SELECT DISTINCT kind FROM episodes ORDER BY kind")]


class PushedRunIndex(RunIndex):
    """The index of a run its driver pushed to a hub (the hub's copy, with
    :data:`aenv_ray.hubruns.STATE` beside it): live while its driver posts (within
    :data:`aenv_ray.hubruns.STALE_AFTER` seconds) and has not ended it; ``stalled`` when it
    has not ended it but stopped posting."""

    def state(self) -> dict[str, Any]:
        """The hub's account of the run (:data:`aenv_ray.hubruns.STATE`), or ``{}``."""
        try:
            data = json.loads((self.run / STATE).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def holder(self) -> dict[str, Any] | None:
        """The driver (pid, host, started, command, as it sent them) while the run is live."""
        state = self.state()
        if not is_live(state):
            return None
        driver = state.get("driver")
        return dict(driver) if isinstance(driver, dict) and driver else {"host": "unknown"}

    def summary(self) -> dict[str, Any]:
        state = self.state()
        out = super().summary()
        out["stalled"] = state.get("state") == "live" and not out["live"]
        out["hub"] = {k: state.get(k) for k in ("id", "name", "created_at", "beat_at", "ended_at")}
        return out

    def _overall_rate(self, totals: Mapping[str, Any]) -> float | None:
        """A finished run's episodes per second, from its driver's start to its last record."""
        state = self.state()
        driver = state.get("driver")
        started = (driver if isinstance(driver, dict) else {}).get(
            "started", state.get("created_at")
        )
        try:
            last = (self.run / JSONL).stat().st_mtime
        except OSError:
            return None
        if not isinstance(started, int | float) or last <= started or not totals["episodes"]:
            return None
        return float(totals["episodes"]) / (last - float(started))


def open_index(run: Path | str, index_dir: Path | str | None = None) -> RunIndex:
    """The index of run directory ``run``: a :class:`PushedRunIndex` for a hub's copy of a
    pushed run, else a :class:`RunIndex`."""
    cls = PushedRunIndex if (Path(run) / STATE).is_file() else RunIndex
    return cls.open(run, index_dir)


def compare(a: RunIndex, b: RunIndex, *, passing: float = 1.0) -> dict[str, Any]:
    """Two runs side by side, per task: mean reward and pass rate of each and the change,
    the tasks that got better first, then worse, then the same, then those only one ran."""
    left = {t["task_id"]: t for t in a.tasks(passing=passing)}
    right = {t["task_id"]: t for t in b.tasks(passing=passing)}
    rows: list[dict[str, Any]] = []
    for task in sorted(left.keys() | right.keys()):
        x, y = left.get(task), right.get(task)
        delta = None
        if x and y and x["mean_reward"] is not None and y["mean_reward"] is not None:
            delta = y["mean_reward"] - x["mean_reward"]
        verdict = (
            "only in A"
            if y is None
            else "only in B"
            if x is None
            else "same"
            if delta is None or abs(delta) < 1e-9
            else "better"
            if delta > 0
            else "worse"
        )
        rows.append({"task_id": task, "a": x, "b": y, "delta": delta, "verdict": verdict})
    order = {"better": 0, "worse": 1, "same": 2, "only in A": 3, "only in B": 4}
    rows.sort(key=lambda r: (order[r["verdict"]], -abs(r["delta"] or 0.0), r["task_id"]))
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in order}
    return {"a": a.summary(), "b": b.summary(), "tasks": rows, "counts": counts}


def iter_runs(root: Path) -> Iterator[Path]:
    """The run directories at ``root``: itself if it is one, else its subdirectories that are
    (sorted by name; hidden ones left out)."""
    if is_run_directory(root):
        yield root
        return
    if root.is_dir():
        for child in sorted(root.iterdir()):
            if child.is_dir() and not child.name.startswith(".") and is_run_directory(child):
                yield child
