"""The Environment Center's index of a run directory and its JSON API (``aenv_ui``), in this
process: paging, filters, sorts, aggregates, two runs compared, a live run followed line by
line, a rewritten file indexed again, and who may look (the token). The browser's side, against
real runs and a real hub, is tests/test_ui_browser.py."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from aenv_ray.errors import ConfigurationError, RunNotFoundError
from aenv_ray.hubruns import STALE_AFTER, STATE
from aenv_ui.index import (
    EpisodeQuery,
    PushedRunIndex,
    RunIndex,
    compare,
    failure_kind,
    open_index,
)
from aenv_ui.server import COOKIE, UiServer, create_app
from rollout.run_directory import RunDirectory

TOKEN = "the-tests-token"


def record(n: int, task: str, reward: float | None, **extra: Any) -> dict[str, Any]:
    """A record as ``aenv rollout`` writes it (the fields the index reads, and a conversation)."""
    outcome = extra.pop("outcome", "ok")
    return {
        "episode_id": f"{n:06d}-{task}",
        "task_id": task,
        "outcome": outcome,
        "reason": extra.pop("reason", None),
        "reward": reward,
        "truncated": False,
        "seconds": 1.0 + n,
        "retried": extra.pop("retried", []),
        "messages": [{"role": "user", "content": f"solve {task}"}],
        "steps": extra.pop(
            "steps",
            [
                {
                    "tool": "env@1/run",
                    "seconds": 0.1 * (n + 1),
                    "is_error": False,
                    "started": 1.7e9 + n,
                    "tool_call_id": "c1",
                }
            ],
        ),
        "turns": [
            {
                "message_index": 1,
                "seconds": 0.5,
                "started": 1.7e9 + n,
                "usage": {"total_tokens": 10},
            }
        ],
        "usage": {"total_tokens": 10},
        **extra,
    }


def write(path: Path, *records: dict[str, Any], mode: str = "a") -> None:
    with path.open(mode) as file:
        for item in records:
            file.write(json.dumps(item) + "\n")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    directory = tmp_path / "runs" / "a"
    directory.mkdir(parents=True)
    (directory / "run.json").write_text(json.dumps({"env": "env@1", "tasks": "sha256:ab"}))
    write(
        directory / "trajectories.jsonl",
        record(0, "t1", 1.0),
        record(1, "t1", 0.0),
        record(2, "t2", 1.0, steps=[{"tool": "env@1/grep", "seconds": 2.0, "is_error": True}]),
        record(
            3,
            "t2",
            None,
            outcome="infrastructure_error",
            reason="InstanceBrokenError: the instance died",
            retried=["InstanceBrokenError: x"],
        ),
        record(4, "t3", 0.5, outcome="agent_error", reason="the policy raised"),
    )
    return directory


def test_failure_kinds_are_the_error_type_else_the_outcome() -> None:
    assert failure_kind("ok", "anything") == "ok"
    assert (
        failure_kind("infrastructure_error", "InstanceBrokenError: died") == "InstanceBrokenError"
    )
    assert failure_kind("agent_error", "the policy raised") == "agent_error"


def test_a_page_filters_sorts_and_counts_on_the_server(run: Path, tmp_path: Path) -> None:
    with RunIndex.open(run, tmp_path / "index") as index:
        assert index.refresh() == 5
        page = index.episodes(offset=1, limit=2)
        assert page["total"] == 5
        assert [e["episode_id"] for e in page["episodes"]] == ["000001-t1", "000002-t2"]
        failed = index.episodes(EpisodeQuery(kind="failed"))
        assert {e["kind"] for e in failed["episodes"]} == {"InstanceBrokenError", "agent_error"}
        assert index.episodes(EpisodeQuery(kind="InstanceBrokenError"))["total"] == 1
        assert index.episodes(EpisodeQuery(task="t1", min_reward=0.5))["total"] == 1
        assert index.episodes(EpisodeQuery(tool="env@1/grep"))["episodes"][0]["errors"] == 1
        assert index.episodes(EpisodeQuery(tool="env@1/gre"))["total"] == 0  # whole names
        assert index.episodes(EpisodeQuery(errors=True))["total"] == 1
        assert index.episodes(EpisodeQuery(text="died"))["total"] == 1
        best = index.episodes(sort="-reward", limit=2)["episodes"]
        assert [e["reward"] for e in best] == [1.0, 1.0]
        with pytest.raises(ConfigurationError, match="no sort `sideways`"):
            index.episodes(sort="sideways")
        assert index.episodes(limit=10_000)["limit"] == 500  # a page is capped
        whole = index.episode("000003-t2")
        assert whole["reason"] == "InstanceBrokenError: the instance died"
        assert whole["messages"] == [{"role": "user", "content": "solve t2"}]
        with pytest.raises(RunNotFoundError, match="no episode `nope`"):
            index.episode("nope")


def test_the_summary_and_the_rewards_are_aggregated_per_task_and_tool(
    run: Path, tmp_path: Path
) -> None:
    with RunIndex.open(run, tmp_path / "index") as index:
        index.refresh()
        summary = index.summary()
        assert (summary["episodes"], summary["ok"], summary["failed"]) == (5, 3, 2)
        assert summary["retries"] == [{"kind": "InstanceBrokenError", "n": 1}]
        assert summary["live"] is False  # no driver ever ran here: no rollout.lock
        assert summary["episodes_per_second"] is None
        rewards = index.rewards()
        assert rewards["pass_rate"] == pytest.approx(2 / 5)
        assert {(b["reward"], b["n"]) for b in rewards["histogram"]} == {
            (None, 1),
            (0.0, 1),
            (0.5, 1),
            (1.0, 2),
        }
        tools = {t["tool"]: t for t in rewards["tools"]}
        assert tools["env@1/grep"]["errors"] == 1
        assert tools["env@1/run"]["calls"] == 4
        assert tools["env@1/run"]["p50_seconds"] == pytest.approx(0.2)
        assert tools["env@1/run"]["p95_seconds"] == pytest.approx(0.5)
        t1 = next(t for t in rewards["tasks"] if t["task_id"] == "t1")
        assert (t1["episodes"], t1["pass_rate"], t1["mean_reward"]) == (2, 0.5, 0.5)
        assert index.rewards(passing=0.5, task="t3")["pass_rate"] == 1.0
        assert [t["turn"] for t in rewards["turns"]] == [0]


def test_a_run_is_live_while_its_driver_holds_the_lock(run: Path, tmp_path: Path) -> None:
    with RunIndex.open(run, tmp_path / "index") as index:
        index.refresh()
        with RunDirectory.open(run) as driver:  # what `aenv rollout` takes first
            summary = index.summary()
            assert summary["live"] is True
            assert summary["driver"]["pid"] == os.getpid()
            assert summary["episodes_per_second"] is None  # one look: no rate yet
            asyncio.run(driver.append(record(9, "t9", 1.0)))
        assert index.holder() is None  # released: the lock file stays, unheld
        summary = index.summary()
        assert summary["live"] is False
        assert summary["episodes_per_second"] > 0  # 6 records since the driver started
        # the lock file was never opened by the index: a driver in this very process keeps
        # its lock (POSIX locks drop when any descriptor of the file is closed)
        with RunDirectory.open(run):
            assert index.summary()["live"] is True
            assert index.summary()["live"] is True


def test_a_live_run_is_followed_line_by_line_and_a_rewrite_is_indexed_anew(
    run: Path, tmp_path: Path
) -> None:
    jsonl = run / "trajectories.jsonl"
    with RunIndex.open(run, tmp_path / "index") as index:
        assert index.refresh() == 5
        assert index.refresh() == 0  # nothing appended: nothing read
        assert index.summary()["episodes"] == 5  # aggregated once, kept while nothing is read
        line = json.dumps(record(5, "t3", 1.0))
        with jsonl.open("a") as file:
            file.write(line[:20])  # a line being written: left for the next refresh
        assert index.refresh() == 0
        with jsonl.open("a") as file:
            file.write(line[20:] + "\n")
        assert index.refresh() == 1
        assert index.summary()["episodes"] == 6  # read more: aggregated again
        assert {t["task_id"]: t["episodes"] for t in index.tasks()}["t3"] == 2
        write(jsonl, record(1, "t1", 1.0))  # --retry-failed: the later record counts
        assert index.refresh() == 1
        assert index.episodes()["total"] == 6
        assert index.episode("000001-t1")["reward"] == 1.0
        # a compacted copy renamed over the file (the end of --retry-failed): read anew
        copy = run / "copy.jsonl"
        write(copy, record(0, "t1", 1.0), record(1, "t1", 1.0), mode="w")
        os.replace(copy, jsonl)
        assert index.refresh() == 2
        assert index.episodes()["total"] == 2
        assert index.summary()["retries"] == []
    # a second open finds the index built: nothing is read again
    with RunIndex.open(run, tmp_path / "index") as again:
        assert again.refresh() == 0
        assert again.episodes()["total"] == 2


def test_two_runs_compared_per_task(run: Path, tmp_path: Path) -> None:
    other = run.parent / "b"
    other.mkdir()
    write(
        other / "trajectories.jsonl",
        record(0, "t1", 1.0),
        record(1, "t1", 1.0),  # t1: 0.5 -> 1.0
        record(2, "t2", 0.0),  # t2: 1.0 -> 0.0 (the failed one has no reward)
        record(3, "t4", 1.0),
    )
    with RunIndex.open(run, tmp_path / "i") as a, RunIndex.open(other, tmp_path / "i") as b:
        a.refresh()
        b.refresh()
        result = compare(a, b)
    verdicts = {t["task_id"]: t["verdict"] for t in result["tasks"]}
    assert verdicts == {"t1": "better", "t2": "worse", "t3": "only in A", "t4": "only in B"}
    assert [t["task_id"] for t in result["tasks"]] == ["t1", "t2", "t3", "t4"]
    assert result["counts"]["better"] == result["counts"]["worse"] == 1


@pytest.fixture
async def client(run: Path, tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    ui = UiServer(run.parent, token=TOKEN, index_dir=tmp_path / "index")
    async with TestClient(TestServer(create_app(ui))) as client:
        yield client


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_api_needs_the_token_and_says_so(client: TestClient[Any, Any]) -> None:
    missing = await client.get("/api/runs")
    assert missing.status == 401
    body = await missing.json()
    assert body["type"] == "AuthenticationError"
    assert "open the URL `aenv ui` printed" in body["error"]
    wrong = await client.get("/api/runs", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 403
    assert (await wrong.json())["type"] == "PermissionDeniedError"
    assert (await client.get("/?token=nope")).status == 403
    # the printed URL: a cookie, and the token gone from the address
    opened = await client.get(f"/?token={TOKEN}", allow_redirects=False)
    assert opened.status == 302
    assert opened.headers["Location"] == "/"
    cookie = opened.cookies[COOKIE]
    assert cookie.value == TOKEN
    assert cookie["httponly"]
    assert cookie["samesite"] == "Strict"
    runs = await client.get("/api/runs")  # the cookie now goes with every request
    assert runs.status == 200
    assert [r["name"] for r in (await runs.json())["runs"]] == ["a"]
    # the page and its assets hold no data: served to anyone who reaches the port
    page = await client.get("/")
    assert page.status == 200
    assert '"mode": "runs"' in await page.text()
    assert (await client.get("/assets/app.js")).status == 200


async def test_the_api_pages_filters_and_finds(client: TestClient[Any, Any]) -> None:
    page = await client.get(
        "/api/runs/a/episodes", params={"kind": "failed", "limit": "1"}, headers=BEARER
    )
    body = await page.json()
    assert (body["total"], len(body["episodes"])) == (2, 1)
    second = await client.get(
        "/api/runs/a/episodes",
        params={"kind": "failed", "limit": "1", "offset": "1"},
        headers=BEARER,
    )
    assert (await second.json())["episodes"][0]["episode_id"] != body["episodes"][0]["episode_id"]
    one = await client.get("/api/runs/a/episodes/000002-t2", headers=BEARER)
    assert (await one.json())["steps"][0]["tool"] == "env@1/grep"
    missing = await client.get("/api/runs/a/episodes/nope", headers=BEARER)
    assert missing.status == 404
    assert (await missing.json())["type"] == "RunNotFoundError"
    no_run = await client.get("/api/runs/zzz", headers=BEARER)
    assert no_run.status == 404
    assert "the runs: a" in (await no_run.json())["error"]
    bad = await client.get("/api/runs/a/episodes", params={"min_reward": "x"}, headers=BEARER)
    assert bad.status == 400
    assert "`min_reward` must be a number" in (await bad.json())["error"]
    rewards = await (await client.get("/api/runs/a/rewards", headers=BEARER)).json()
    assert rewards["episodes"] == 5
    run = await (await client.get("/api/runs/a", headers=BEARER)).json()
    assert run["settings"] == {"env": "env@1", "tasks": "sha256:ab"}
    assert run["tools"] == ["env@1/grep", "env@1/run"]
    compared = await client.get("/api/compare", params={"a": "a", "b": "a"}, headers=BEARER)
    assert (await compared.json())["counts"]["same"] == 3


def test_a_missing_directory_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is not a directory"):
        UiServer(tmp_path / "nowhere")


def test_a_run_pushed_to_a_hub_is_live_by_its_heartbeat(tmp_path: Path) -> None:
    """The hub's copy of a pushed run (``hub-run.json`` beside its records): live while its
    driver posts, stalled once silent for a minute without ending, finished once ended."""
    run = tmp_path / "runs" / "pushed-1a2b"
    run.mkdir(parents=True)
    (run / "trajectories.jsonl").write_text(json.dumps(record(0, "t1", 1.0)) + "\n")
    driver = {"pid": 9, "host": "trainer", "started": time.time() - 10, "command": "aenv rollout"}
    state = {"id": run.name, "name": "pushed", "state": "live", "created_at": time.time() - 10}

    def summary(**changes: Any) -> dict[str, Any]:
        (run / STATE).write_text(json.dumps({**state, "driver": driver, **changes}))
        with open_index(run, tmp_path / "index") as index:
            assert isinstance(index, PushedRunIndex)
            index.refresh()
            return index.summary()

    live = summary(beat_at=time.time())
    assert (live["live"], live["stalled"], live["driver"]) == (True, False, driver)
    assert live["hub"]["name"] == "pushed"
    stalled = summary(beat_at=time.time() - STALE_AFTER - 1)
    assert (stalled["live"], stalled["stalled"], stalled["driver"]) == (False, True, None)
    done = summary(state="finished", beat_at=time.time(), ended_at=time.time())
    assert (done["live"], done["stalled"]) == (False, False)
    assert done["episodes"] == 1
    assert done["episodes_per_second"] is not None  # from the driver's start to the last record
    # a run directory of a driver's own is no pushed run
    (run / STATE).unlink()
    with open_index(run, tmp_path / "index") as index:
        assert not isinstance(index, PushedRunIndex)
