"""Rollout runs pushed to a hub (``/v1/runs``, :mod:`envhub.runs`; read by the hub's UI at
``/ui/api/runs...``): a driver registers its run, sends its records from an offset, ends it;
each tenant sees its own runs only. And ``aenv rollout --no-ray`` against the hub mirrors its
run there, byte for byte (:mod:`rollout.hub_report`).

The session's real hub (``shared_hub``: ``aenv serve``, auth on, the local engine), real keys
of two tenants, a real rollout of mini-terminal with the deterministic chat server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.errors import (
    AuthenticationError,
    ConfigurationError,
    QuotaExceededError,
    RunNotFoundError,
)
from aenv_ray.hub import HubClient
from envhub.limits import Limits
from envhub.runs import RunStore
from tests._chat_server import ChatServer
from tests._cli import aenv
from tests._hub import HubProcess, new_key


def record(episode: str, task: str, reward: float, outcome: str = "ok") -> bytes:
    line = {"episode_id": episode, "task_id": task, "outcome": outcome, "reward": reward}
    return (json.dumps(line) + "\n").encode()


@pytest.fixture(scope="module")
def keys(shared_hub: HubProcess) -> dict[str, str]:
    return {
        "alice": new_key("runs-alice", shared_hub.store),
        "bob": new_key("runs-bob", shared_hub.store),
    }


async def test_a_driver_registers_sends_and_ends_its_run(
    shared_hub: HubProcess, keys: dict[str, str]
) -> None:
    first, second = record("000000-t1", "t1", 1.0), record("000001-t2", "t2", 0.0)
    async with HubClient(shared_hub.url, api_key=keys["alice"]) as alice:
        run = await alice.open_run(
            "runs/baseline",
            settings={"env": "mini-terminal@1.0.0", "policy": "m"},
            driver={"pid": 7, "host": "trainer-3"},
        )
        assert run["id"].startswith("baseline-")
        assert (run["live"], run["state"], run["received"]) == (True, "live", 0)
        # records from an offset; the same post again adds nothing (a retry)
        sent = await alice.send_run_records(run["id"], 0, first)
        assert (sent["received"], sent["accepted"]) == (len(first), len(first))
        again = await alice.send_run_records(run["id"], 0, first)
        assert (again["received"], again["accepted"]) == (len(first), 0)
        # overlapping: only what the hub lacks is added; past the end: nothing, and where
        # to send from
        both = await alice.send_run_records(run["id"], 0, first + second)
        assert both["received"] == len(first + second)
        ahead = await alice.send_run_records(run["id"], 10_000, second)
        assert (ahead["received"], ahead["accepted"]) == (len(first + second), 0)
        # a line that is not a record, a torn line: refused, nothing kept
        with pytest.raises(ConfigurationError, match="line 1 of this post"):
            await alice.send_run_records(run["id"], both["received"], b"not json\n")
        with pytest.raises(ConfigurationError, match="whole lines"):
            await alice.send_run_records(run["id"], both["received"], second[:-1])
        listed = {r["id"]: r for r in await alice.list_runs()}
        assert listed[run["id"]]["settings"] == {"env": "mini-terminal@1.0.0", "policy": "m"}
        assert listed[run["id"]]["received"] == len(first + second)

        # what the hub's UI reads: the run as a run directory, indexed
        page = await alice.request("GET", "/ui/api/runs")
        shown = {r["name"]: r for r in page["runs"]}
        summary = shown[run["id"]]["summary"]
        assert (summary["episodes"], summary["live"], summary["mean_reward"]) == (2, True, 0.5)
        assert summary["driver"] == {"pid": 7, "host": "trainer-3"}
        one = await alice.request("GET", f"/ui/api/runs/{run['id']}")
        assert one["path"] is None  # the hub's own paths are not shown
        assert one["tasks"] == ["t1", "t2"]
        episodes = await alice.request(
            "GET", f"/ui/api/runs/{run['id']}/episodes", params={"sort": "-reward"}
        )
        assert [e["episode_id"] for e in episodes["episodes"]] == ["000000-t1", "000001-t2"]
        whole = await alice.request("GET", f"/ui/api/runs/{run['id']}/episodes/000001-t2")
        assert whole == json.loads(second)

        ended = await alice.end_run(run["id"])
        assert (ended["state"], ended["live"]) == ("finished", False)
        page = await alice.request("GET", f"/ui/api/runs/{run['id']}")
        assert page["summary"]["live"] is False
        assert page["summary"]["stalled"] is False

        # taken up again (a resumed run): the same run, its records kept, live again
        resumed = await alice.open_run("runs/baseline", run_id=run["id"])
        assert (resumed["id"], resumed["received"]) == (run["id"], len(first + second))
        assert resumed["live"] is True
        # a rewritten file: the copy starts again
        reset = await alice.send_run_records(run["id"], 0, second, reset=True)
        assert reset["received"] == len(second)
        await alice.end_run(run["id"])


async def test_a_tenant_sees_and_reaches_its_own_runs_only(
    shared_hub: HubProcess, keys: dict[str, str]
) -> None:
    async with HubClient(shared_hub.url, api_key=keys["alice"]) as alice:
        run = await alice.open_run("secret-run", settings={"env": "x"})
        await alice.send_run_records(run["id"], 0, record("000000-a", "a", 1.0))
    async with HubClient(shared_hub.url, api_key=keys["bob"]) as bob:
        assert run["id"] not in {r["id"] for r in await bob.list_runs()}
        ui = await bob.request("GET", "/ui/api/runs")
        assert run["id"] not in {r["name"] for r in ui["runs"]}
        with pytest.raises(RunNotFoundError):
            await bob.request("GET", f"/v1/runs/{run['id']}")
        with pytest.raises(RunNotFoundError):
            await bob.send_run_records(run["id"], 0, record("000001-b", "b", 0.0))
        with pytest.raises(RunNotFoundError):
            await bob.end_run(run["id"])
        with pytest.raises(RunNotFoundError):
            await bob.request("GET", f"/ui/api/runs/{run['id']}/episodes")
        with pytest.raises(RunNotFoundError):  # not a way out of the tenant's directory
            await bob.request("GET", "/ui/api/runs/%2E%2E")
    async with HubClient(shared_hub.url) as nobody:
        with pytest.raises(AuthenticationError):
            await nobody.request("GET", "/ui/api/runs")
        with pytest.raises(AuthenticationError):
            await nobody.list_runs()
    async with HubClient(shared_hub.url, api_key=keys["bob"]) as bob:
        with pytest.raises(RunNotFoundError):
            await bob.delete_run(run["id"])
    async with HubClient(shared_hub.url, api_key=keys["alice"]) as alice:
        assert (await alice.request("GET", f"/ui/api/runs/{run['id']}"))["summary"]["episodes"] == 1
        await alice.end_run(run["id"])
        assert (await alice.delete_run(run["id"]))["deleted"] is True
        assert run["id"] not in {r["id"] for r in await alice.list_runs()}
        ui = await alice.request("GET", "/ui/api/runs")
        assert run["id"] not in {r["name"] for r in ui["runs"]}
        with pytest.raises(RunNotFoundError):
            await alice.request("GET", f"/ui/api/runs/{run['id']}")


async def test_a_tenants_runs_hold_at_most_its_run_bytes(tmp_path: Path) -> None:
    """The quota over a tenant's runs together; a deleted run frees its bytes; a reset copy
    counts once. (The store itself, over real files: the shared hub's quota is the default.)"""
    line = record("000000-t1", "t1", 1.0)
    limits = Limits.parse({"tenants": {"small": {"run_bytes": 3 * len(line)}}})
    store = RunStore(tmp_path / "runs", limits)
    first = await store.open("small", name="one")
    second = await store.open("small", name="two")
    await store.append("small", first["id"], offset=0, data=line + line)
    await store.append("small", first["id"], offset=0, data=line, reset=True)  # counts once
    await store.append("small", second["id"], offset=0, data=line + line)
    with pytest.raises(QuotaExceededError, match="run_bytes") as refused:
        await store.append("small", second["id"], offset=2 * len(line), data=line)
    assert refused.value.limit == "run_bytes"
    assert (await store.get("small", second["id"]))["received"] == 2 * len(line)  # nothing kept
    await store.delete("small", first["id"])
    done = await store.append("small", second["id"], offset=2 * len(line), data=line)
    assert done["received"] == 3 * len(line)
    # counted again from disk by a new store (a restarted hub)
    again = RunStore(tmp_path / "runs", limits)
    assert await again.used("small") == 3 * len(line)
    assert await again.used("nobody") == 0


def test_aenv_rollout_against_the_hub_mirrors_its_run(
    shared_hub: HubProcess, keys: dict[str, str], tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"t{n}",
                    "prompt": f"write {n}",
                    "reward_arguments": {"path": "answer.txt", "expected": str(n)},
                }
            )
            + "\n"
            for n in (1, 2)
        )
    )
    out = tmp_path / "runs" / "to-hub"
    hub_env = {"AENV_SYSTEM_URL": shared_hub.url, "AENV_API_KEY": keys["alice"]}
    with ChatServer() as server:
        # subprocess: the driver the hub is told of is this process (its command line)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "aenv_cli",
                "rollout",
                "mini-terminal@1.0.0",
                *("--base-url", server.url, "--model", "test-model", "--api-key", "sk-not-shown"),
                *("-n", "2", "-c", "2", "--no-ray", "--tasks", str(tasks), "--out", str(out)),
            ],
            env={**os.environ, **hub_env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        local = json.loads((out / "hub.json").read_text())
        assert local["url"] == shared_hub.url
        assert f"{shared_hub.url}/ui/#/run/{local['id']}" in done.stderr

        async def on_hub() -> tuple[dict[str, Any], dict[str, Any]]:
            async with HubClient(shared_hub.url, api_key=keys["alice"]) as alice:
                run = await alice.request("GET", f"/v1/runs/{local['id']}")
                page = await alice.request("GET", f"/ui/api/runs/{local['id']}/episodes")
                return run, page

        run, page = asyncio.run(on_hub())
        assert run["state"] == "finished"
        assert run["name"] == "to-hub"
        assert run["received"] == (out / "trajectories.jsonl").stat().st_size
        assert run["settings"] == json.loads((out / "run.json").read_text())
        assert "sk-not-shown" not in run["driver"]["command"]
        assert "--api-key ***" in run["driver"]["command"]
        assert page["total"] == 2
        assert {e["task_id"] for e in page["episodes"]} == {"t1", "t2"}
        assert all(e["outcome"] == "ok" for e in page["episodes"])

        # resumed with more episodes: the same hub run, the new records sent after the old
        again = aenv(
            "rollout",
            "mini-terminal@1.0.0",
            *("-n", "4", "-c", "2", "--no-ray", "--tasks", str(tasks), "--out", str(out)),
            *("--base-url", server.url, "--model", "test-model", "--api-key", "sk-not-shown"),
            env=hub_env,
            cwd=tmp_path,
        )
        # --not-to-hub: the same hub runs the instances, and is told nothing of the run
        kept = tmp_path / "runs" / "kept-here"
        private = aenv(
            "rollout",
            "mini-terminal@1.0.0",
            *("-n", "1", "--no-ray", "--tasks", str(tasks), "--out", str(kept)),
            *("--base-url", server.url, "--model", "test-model", "--not-to-hub"),
            env=hub_env,
            cwd=tmp_path,
        )
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "hub.json").read_text())["id"] == local["id"]
    rerun, page = asyncio.run(on_hub())
    assert rerun["received"] == (out / "trajectories.jsonl").stat().st_size > run["received"]
    assert rerun["state"] == "finished"
    assert page["total"] == 4
    assert private.returncode == 0, private.stderr
    assert not (kept / "hub.json").exists()
    assert "this run on the hub" not in private.stderr

    async def names() -> set[str]:
        async with HubClient(shared_hub.url, api_key=keys["alice"]) as alice:
            return {r["name"] for r in await alice.list_runs()}

    assert "kept-here" not in asyncio.run(names())
