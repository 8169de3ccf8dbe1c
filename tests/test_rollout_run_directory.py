"""The run directory of ``aenv rollout``: its lock (against this and other real processes) and
its records (torn last lines dropped, corrupt ones refused, appends that stay whole lines)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.run_directory import (
    JSONL,
    CorruptRecordError,
    LockHolder,
    RunDirectory,
    RunDirectoryLockedError,
    read_records,
)

T = 60.0


def record(episode_id: str, **extra: Any) -> dict[str, Any]:
    return {"episode_id": episode_id, "outcome": "ok", **extra}


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join((json.dumps(r) + "\n").encode() for r in records)


def test_a_torn_last_line_is_dropped_durably_and_its_episode_named(tmp_path: Path) -> None:
    whole = lines(record("000000-a"), record("000001-b"))
    torn = lines(record("000002-c", steps=["x" * 100]))[:40]  # a driver killed mid-write
    (tmp_path / JSONL).write_bytes(whole + torn)
    with RunDirectory.open(tmp_path) as run:
        assert set(run.records) == {"000000-a", "000001-b"}
        assert run.torn is not None
        assert (run.torn.line, run.torn.size, run.torn.episode_id) == (3, 40, "000002-c")
        assert "episode 000002-c" in run.torn.describe()
        assert (tmp_path / JSONL).read_bytes() == whole  # truncated back, before any append
        asyncio.run(run.append(record("000002-c")))
    assert (tmp_path / JSONL).read_bytes() == whole + lines(record("000002-c"))  # not glued


@pytest.mark.parametrize(
    ("tail", "episode"),
    [
        (b'{"epis', None),  # cut before the id could be read
        (b'{"episode_id": "000001-\\"q\\"", "outc', '000001-"q"'),  # an escaped id
        (b"\x00\x00\x00\x00\n", None),  # zeros where a machine crash lost the data
        (b'{"episode_id": "000001-b", "outcome": "ok"}', "000001-b"),  # whole, but no newline
    ],
)
def test_every_kind_of_torn_last_line_is_dropped(
    tmp_path: Path, tail: bytes, episode: str | None
) -> None:
    (tmp_path / JSONL).write_bytes(lines(record("000000-a")) + tail)
    with RunDirectory.open(tmp_path) as run:
        assert list(run.records) == ["000000-a"]
        assert run.torn is not None
        assert run.torn.episode_id == episode
    assert (tmp_path / JSONL).read_bytes() == lines(record("000000-a"))


def test_a_corrupt_line_before_the_last_stops_the_run_and_changes_nothing(tmp_path: Path) -> None:
    content = lines(record("000000-a")) + b"{not json\n" + lines(record("000002-c"))
    (tmp_path / JSONL).write_bytes(content)
    with pytest.raises(CorruptRecordError, match=r"line 2 is not a trajectory record") as caught:
        RunDirectory.open(tmp_path)
    assert caught.value.line == 2
    assert caught.value.path == str(tmp_path / JSONL)
    assert "new --out directory" in str(caught.value)
    assert (tmp_path / JSONL).read_bytes() == content
    (tmp_path / JSONL).write_bytes(lines(record("000000-a")) + b'{"no": "id"}\n')
    with pytest.raises(CorruptRecordError, match=r"line 2 .* is JSON written whole"):
        RunDirectory.open(tmp_path)  # the last line, but whole JSON and no record: no crash
    (tmp_path / JSONL).write_bytes(lines(record("000000-a")))
    with RunDirectory.open(tmp_path) as run:  # the failed opens gave the lock back
        assert list(run.records) == ["000000-a"]


def test_a_later_record_of_an_episode_replaces_the_earlier(tmp_path: Path) -> None:
    failed, retried = record("000000-a", outcome="agent_error"), record("000000-a")
    (tmp_path / JSONL).write_bytes(lines(failed, retried))
    records, size, torn = read_records(tmp_path / JSONL)
    assert records == {"000000-a": retried}
    assert (size, torn) == (len(lines(failed, retried)), None)
    assert read_records(tmp_path / "missing.jsonl") == ({}, 0, None)


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6, unique=True),
    cut=st.integers(min_value=0, max_value=10_000),
)
def test_reading_a_file_cut_anywhere_keeps_exactly_the_whole_records(
    tmp_path_factory: pytest.TempPathFactory, ids: list[str], cut: int
) -> None:
    path = tmp_path_factory.mktemp("cut") / JSONL
    written = [record(i, payload="é\n" * len(i)) for i in ids]
    content = lines(*written)
    cut %= len(content) + 1
    path.write_bytes(content[:cut])
    records, size, torn = read_records(path)
    complete = content[:cut].count(b"\n")  # the newline is each record's last byte
    assert list(records) == ids[:complete]
    assert size == len(lines(*written[:complete]))
    assert (torn is None) == (size == cut)
    if torn is not None:
        assert torn.line == complete + 1


def test_concurrent_appends_stay_whole_lines(tmp_path: Path) -> None:
    async def append_many(run: RunDirectory) -> None:
        big = "y" * 70_000  # larger than a pipe buffer or a page: still one line
        await asyncio.gather(*(run.append(record(f"{i:06d}", data=big)) for i in range(40)))

    with RunDirectory.open(tmp_path) as run:
        asyncio.run(append_many(run))
        assert len(run.records) == 40
    rows = [json.loads(line) for line in (tmp_path / JSONL).read_text().splitlines()]
    assert sorted(r["episode_id"] for r in rows) == [f"{i:06d}" for i in range(40)]


def test_a_second_open_in_this_process_is_refused_and_close_gives_the_lock_back(
    tmp_path: Path,
) -> None:
    first = RunDirectory.open(tmp_path)
    with pytest.raises(RunDirectoryLockedError) as caught:
        RunDirectory.open(tmp_path)
    holder = caught.value.holder
    assert holder is not None
    assert holder.pid == os.getpid()
    assert f"pid {os.getpid()} on host" in str(caught.value)
    assert str(tmp_path) in str(caught.value)
    first.close()
    first.close()  # idempotent
    with RunDirectory.open(tmp_path) as again:
        assert again.records == {}


HOLD = """
import sys, time
from rollout.run_directory import RunDirectory
run = RunDirectory.open(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_another_process_holding_the_lock_is_named_and_its_death_frees_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunDirectoryLockedError) as caught:
            RunDirectory.open(tmp_path)
        assert caught.value.holder is not None
        assert caught.value.holder.pid == holder.pid
        assert caught.value.directory == str(tmp_path)
        message = str(caught.value)
        assert f"pid {holder.pid}" in message
        assert "wait for it to finish or pass another --out" in message
        os.kill(holder.pid, signal.SIGKILL)  # a stale lock of a dead process never blocks
        holder.wait(timeout=T)
        with RunDirectory.open(tmp_path) as run:
            assert run.torn is None
    finally:
        holder.kill()
        holder.wait(timeout=T)
        assert holder.stdout is not None
        holder.stdout.close()


def test_errors_survive_pickle_with_their_attributes() -> None:
    holder = LockHolder(12, "h", time.time(), "aenv rollout x")
    locked = pickle.loads(pickle.dumps(RunDirectoryLockedError("m", directory="d", holder=holder)))
    assert (str(locked), locked.directory, locked.holder) == ("m", "d", holder)
    corrupt = pickle.loads(pickle.dumps(CorruptRecordError("m", path="p", line=3)))
    assert (str(corrupt), corrupt.path, corrupt.line) == ("m", "p", 3)
    assert LockHolder.parse(b"") is None
    assert LockHolder.parse(json.dumps(holder.__dict__).encode()) == holder
