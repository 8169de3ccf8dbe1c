"""The Environment Center in a real browser: Debian's chromium driven by the npm
``playwright-core`` (tests/node/ui_browser.mjs), against two real runs (``aenv rollout
--no-ray`` of mini-terminal with the deterministic chat server, tests/_chat_server.py) served by a
real ``aenv ui``, and the session's real hub (``shared_hub``: its ``/ui/`` page, two tenants).

One browser for the whole file: the script walks every page once (runs -> run -> rewards ->
episodes, filtered -> an episode -> its tool calls -> the permalink -> two runs compared -> the
hub's key, environments, an environment, instances: renew, delete), by mouse and by keyboard, and
reports what it saw; each test below asserts on one part of that. ``AENV_UI_SHOTS=DIR`` keeps
the screenshots (docs/ui.md's are made so); otherwise they go to a temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_cli._scaffold import write_project
from aenv_ray.bundle import build_bundle
from aenv_ray.errors import InstanceNotFoundError
from aenv_ray.hub import HubClient
from tests._chat_server import ChatServer, reply
from tests._cli import aenv as run_cli
from tests._hub import HubProcess, new_key

NODE_DIR = Path(__file__).resolve().parent / "node"
SCRIPT = NODE_DIR / "ui_browser.mjs"
CHROMIUM = "/usr/bin/chromium"
TERMINAL = "mini-terminal@1.0.0"
LONG = "L" * 2500  # a tool output longer than the page shows before folding
TASKS = [("t42", "42"), ("t7", "7"), ("long", LONG)]


def _browser_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("`node` is not on PATH; install Node.js >= 20 to run the browser test")
    if not (NODE_DIR / "node_modules" / "playwright-core").is_dir():
        pytest.skip(
            f"playwright-core is not installed in {NODE_DIR / 'node_modules'}; run scripts/setup"
        )
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium); scripts/setup does it")
    return node


def wrong_on(value: str) -> Any:
    """The chat server's model, writing a wrong answer on the task that expects ``value``."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        said = reply(body)
        for call in said["choices"][0]["message"].get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            call["function"]["arguments"] = arguments.replace(f"echo {value} >", "echo wrong >")
        return said

    return answer


def rollout(root: Path, name: str, responder: Any) -> None:
    tasks = root / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "id": task,
                    "prompt": f"write {value}",
                    "reward_arguments": {"path": "answer.txt", "expected": value},
                }
            )
            + "\n"
            for task, value in TASKS
        )
    )
    with ChatServer(responder) as server:
        done = run_cli(
            "rollout",
            TERMINAL,
            "-n",
            "3",
            "-c",
            "3",
            "--no-ray",
            *("--base-url", server.url, "--model", "test-model", "--max-turns", "4"),
            *("--tasks", str(tasks), "--out", str(root / "runs" / name)),
            cwd=root,
        )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def seen(
    shared_hub: HubProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """What the browser saw (tests/node/ui_browser.mjs's report), with the names it was given."""
    node = _browser_or_skip()
    root = tmp_path_factory.mktemp("ui")
    rollout(root, "before", wrong_on("42"))  # t42 fails here, passes after
    rollout(root, "after", wrong_on("7"))  # t7 passes here, fails after
    shots = Path(os.environ.get("AENV_UI_SHOTS") or root / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    alice, bob = new_key("ui-alice", shared_hub.store), new_key("ui-bob", shared_hub.store)
    name = f"ui-demo-{os.urandom(3).hex()}"
    project = root / name
    write_project(project, name)
    (project / "README.md").write_text(f"# {name}\n\nA demo environment for the UI's test.\n")

    async def hub_setup() -> tuple[str, str]:
        async with HubClient(shared_hub.url, api_key=alice) as client:
            await client.push(build_bundle(project).data)
            own = await client.create_instance(f"{name}@1.0.0", ttl=600)
        async with HubClient(shared_hub.url, api_key=bob) as client:
            other = await client.create_instance(TERMINAL, ttl=600)
        return own["id"], other["id"]

    import asyncio

    own, other = asyncio.run(hub_setup())
    # subprocess: `aenv ui` is a server that runs until stopped, as a user starts it
    ui = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aenv_cli",
            "ui",
            str(root / "runs"),
            "--port",
            "0",
            "--index-dir",
            str(root / "index"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert ui.stderr is not None
        line = ui.stderr.readline()
        found = re.search(
            r"Environment Center on (http://127\.0\.0\.1:\d+/\?token=\S+) \(2 runs", line
        )
        assert found, line
        env = {
            **os.environ,
            "UI_URL": found.group(1),
            "RUN_A": "before",
            "RUN_B": "after",
            "LONG_TASK": "long",
            "HUB_URL": shared_hub.url,
            "HUB_KEY": alice,
            "OWN_INSTANCE": own,
            "OTHER_INSTANCE": other,
            "ENV_NAME": name,
            "SHOTS": str(shots),
            "CHROMIUM": CHROMIUM,
        }
        done = subprocess.run(
            [node, str(SCRIPT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=NODE_DIR,
        )
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        assert "error" not in report, report["error"]
        yield {
            **report,
            "own": own,
            "other": other,
            "env": name,
            "alice": alice,
            "bob": bob,
            "hub": shared_hub.url,
            "shots": shots,
            "token": found.group(1),
        }
    finally:
        ui.terminate()
        ui.wait(timeout=30)
        if ui.stderr is not None:
            ui.stderr.close()

        async def hub_teardown() -> None:
            async with HubClient(shared_hub.url, api_key=bob) as client:
                await client.delete_instance(other)

        asyncio.run(hub_teardown())


def test_the_runs_page_lists_both_runs_and_opens_one_by_keyboard(seen: dict[str, Any]) -> None:
    steps = seen["steps"]
    assert steps["runs"]["url"].endswith("/")  # the token went into a cookie, out of the address
    assert "token=" not in steps["runs"]["url"]
    assert steps["runs"]["rows"] == 2
    # from the page's heading, Shift+Tab: the pages, then the skip link; Tab: the runs' links
    # in their order; Enter on one opened it
    assert steps["tab_back"][:3] == ["a:Compare", "a:Runs", "a:Skip to content"]
    assert steps["tab_order"] == ["a:after", "a:before"]
    assert steps["run"]["heading"] == "Run before"
    assert steps["run"]["focused"] == "h1:Run before"  # the focus moved to the new page
    cards = " ".join(steps["run"]["cards"])
    assert "3episodes" in cards
    assert "finishedstate" in cards
    assert "3ok" in cards  # a wrong answer is an episode that ended well with reward 0
    assert "0failed" in cards
    assert "0.667mean reward" in cards


def test_the_rewards_page_draws_its_charts_offline(seen: dict[str, Any]) -> None:
    rewards = seen["steps"]["rewards"]
    assert rewards["heading"] == "Rewards of before"
    assert rewards["charts"] >= 4  # distribution, ends, tool latency, turn latency, pass rate
    assert any(row.startswith(f"{TERMINAL}/execute_command6") for row in rewards["tools"])


def test_episodes_filter_open_one_and_its_tool_calls(seen: dict[str, Any]) -> None:
    steps = seen["steps"]
    assert steps["episodes_all"] == 3
    assert steps["episodes_filtered"]["tasks"] == ["long"]
    episode = steps["episode"]
    assert episode["roles"][-4:] == ["assistant", "tool", "tool", "assistant"]
    assert episode["call_open"] is True
    assert episode["second_open_by_keyboard"] is True
    assert episode["call_summary"].startswith(f"tool call {TERMINAL}/execute_command")
    assert "arguments" in episode["call_text"]
    assert f"echo {LONG[:40]}" in episode["call_text"]
    # the long output is folded, and all of it is one click away
    assert any(re.match(r"show all 2,5\d\d characters", text) for text in episode["folded"])
    assert episode["unfolded_chars"] > 400
    assert steps["permalink"]["heading"] == episode["heading"]
    assert episode["heading"].startswith("Episode ")
    assert episode["heading"].endswith("-long")


def test_two_runs_compared_say_what_got_better_and_worse(seen: dict[str, Any]) -> None:
    compare = seen["steps"]["compare"]
    assert compare["heading"] == "before → after"
    assert compare["rows"][:2] == [["t42", "better"], ["t7", "worse"]]
    assert ["long", "same"] in compare["rows"]


def test_the_hubs_page_shows_environments_and_the_tenants_own_instances(
    seen: dict[str, Any],
) -> None:
    steps = seen["steps"]
    assert steps["hub_login"]["heading"] == "Hub key"
    assert seen["env"] in steps["hub_envs"]
    env = steps["hub_env"]
    assert env["heading"] == f"{seen['env']}@1.0.0"
    assert env["forms"]  # the calls' schemas, as forms
    # the tools the hub stored at the push (its sandbox loaded the bundle), each a form
    assert env["tools"] == ["add_note"]
    assert [f.split()[:2] for f in env["tool_fields"]] == [["text", "*"]]
    assert "string" in env["tool_fields"][0]
    assert "A demo environment for the UI's test." in env["readme_text"]
    instances = steps["hub_instances"]
    assert seen["own"] in instances["before"]
    assert seen["other"] not in instances["before"]  # another tenant's: never listed
    assert seen["own"] not in instances["after"]  # deleted from the page


async def test_another_tenants_instance_cannot_be_deleted_or_renewed(seen: dict[str, Any]) -> None:
    """What the page's buttons send, with alice's key, for bob's instance: refused."""
    async with HubClient(seen["hub"], api_key=seen["alice"]) as alice:
        with pytest.raises(InstanceNotFoundError):
            await alice.delete_instance(seen["other"])
        with pytest.raises(InstanceNotFoundError):
            await alice.renew_instance(seen["other"], ttl=60)
    async with HubClient(seen["hub"], api_key=seen["bob"]) as bob:
        assert (await bob.get_instance(seen["other"]))["state"] != "terminated"


def test_no_console_errors_and_a_screenshot_of_every_page(seen: dict[str, Any]) -> None:
    assert seen["console"] == []
    names = {p.stem for p in Path(seen["shots"]).glob("*.png")}
    assert {
        "runs",
        "run",
        "rewards",
        "episodes",
        "episode",
        "compare",
        "hub-environments",
        "hub-environment",
        "hub-instances",
    } <= names


# -- a live run: aenv rollout is running while the browser watches ---------------------------------

LIVE_SCRIPT = NODE_DIR / "ui_live.mjs"
HELD = 2  # episodes recorded before the model holds the next one's first answer
EPISODES = 5


def _held_after(episodes: int, gate: threading.Event) -> Any:
    """The chat server's model, holding the first answer of episode ``episodes + 1`` (one at a
    time: ``-c 1``) until ``gate`` is set."""
    started = [0]

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] == "user":  # an episode's first turn
            started[0] += 1
            if started[0] == episodes + 1:
                gate.wait(600)
        return reply(body)

    return answer


def _wait_for(path: Path, driver: subprocess.Popen[str]) -> None:
    """Until ``path`` exists (the driver registered its run with the hub), unless the driver
    ends first."""
    while not path.exists():
        if driver.poll() is not None:
            raise AssertionError(f"aenv rollout ended ({driver.returncode}) before {path}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def live_seen(
    shared_hub: HubProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """What the browser saw of a run while it ran (tests/node/ui_live.mjs's report): ``aenv
    rollout`` against the hub, held after :data:`HELD` episodes until the browser saw it live
    on ``aenv ui`` and on the hub's page, then let go to its end."""
    node = _browser_or_skip()
    root = tmp_path_factory.mktemp("ui-live")
    shots = Path(os.environ.get("AENV_UI_SHOTS") or root / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    key = new_key("ui-live", shared_hub.store)
    tasks = root / "tasks.jsonl"
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
            for n in range(1, EPISODES + 1)
        )
    )
    out = root / "runs" / "live"
    out.parent.mkdir()
    gate = threading.Event()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(ChatServer(_held_after(HELD, gate)))
        stack.callback(gate.set)  # whatever happens, the held episode goes on (server first)
        # subprocesses: `aenv ui` serves until stopped; the driver runs while the test watches
        ui = subprocess.Popen(
            [
                sys.executable,
                *("-m", "aenv_cli", "ui", str(root / "runs")),
                *("--port", "0", "--index-dir", str(root / "index")),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        stack.callback(_stop, ui)
        assert ui.stderr is not None
        line = ui.stderr.readline()
        found = re.search(r"Environment Center on (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
        assert found, line
        driver = subprocess.Popen(
            [
                sys.executable,
                *("-m", "aenv_cli", "rollout", TERMINAL, "--no-ray", "-n", str(EPISODES)),
                *("-c", "1", "--tasks", str(tasks), "--out", str(out)),
                *("--base-url", server.url, "--model", "test-model", "--max-turns", "4"),
            ],
            env={**os.environ, "AENV_SYSTEM_URL": shared_hub.url, "AENV_API_KEY": key},
            stdout=subprocess.DEVNULL,
            stderr=stack.enter_context((root / "rollout.err").open("w")),
            text=True,
        )
        stack.callback(_stop, driver)
        _wait_for(out / "hub.json", driver)
        run_id = json.loads((out / "hub.json").read_text())["id"]
        env = {
            **os.environ,
            "UI_URL": found.group(1),
            "LOCAL_RUN": "live",
            "HUB_URL": shared_hub.url,
            "HUB_KEY": key,
            "HUB_RUN": run_id,
            "HELD": str(HELD),
            "EPISODES": str(EPISODES),
            "SHOTS": str(shots),
            "CHROMIUM": CHROMIUM,
        }
        browser = subprocess.Popen(
            [node, str(LIVE_SCRIPT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stack.enter_context((root / "node.err").open("w")),
            text=True,
            cwd=NODE_DIR,
        )
        stack.callback(_stop, browser)
        assert browser.stdout is not None
        lines = []
        for said in browser.stdout:
            lines.append(said)
            if said.strip() == "LIVE":
                gate.set()  # seen live on both pages: the run goes on
        gate.set()  # (a browser that failed before: the run ends all the same)
        assert browser.wait(timeout=600) == 0, (root / "node.err").read_text()
        assert driver.wait(timeout=600) == 0, (root / "rollout.err").read_text()
        report: dict[str, Any] = json.loads(lines[-1])
        assert "error" not in report, report["error"]
        yield {**report, "run_id": run_id, "saw_live_line": any(x.strip() == "LIVE" for x in lines)}


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=60)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


@pytest.mark.timeout(600)  # the fixture: a rollout, watched to its end (~1 min when quiet)
def test_a_live_run_is_seen_live_and_moving_on_aenv_ui(live_seen: dict[str, Any]) -> None:
    steps = live_seen["steps"]
    live = steps["local_live"]
    assert live["heading"] == "Run live"
    assert "livestate" in live["cards"]
    assert f"{HELD}episodes" in live["cards"]
    assert "pid" in live["driver"]  # the driver holding rollout.lock
    done = steps["local_done"]
    assert "finishedstate" in done["cards"]
    assert f"{EPISODES}ok" in done["cards"]
    # the page followed the run by itself (no reload): its episodes went up from HELD
    seen = [int(x) for x in done["seen"]]
    assert seen[0] == HELD
    assert seen[-1] == EPISODES
    assert seen == sorted(seen)


def test_the_hubs_runs_page_lists_the_pushed_run_live_then_finished(
    live_seen: dict[str, Any],
) -> None:
    steps = live_seen["steps"]
    assert live_seen["saw_live_line"]
    listed = steps["hub_runs_live"]
    assert listed["heading"].startswith("Runs in the hub, tenant ui-live")
    row = listed["row"]
    assert row[0] == live_seen["run_id"]
    assert row[0].startswith("live-")  # named after the run directory
    assert row[1] == "live"
    assert row[2] == TERMINAL  # its settings: run.json's environment
    assert row[5] == str(HELD)
    run = steps["hub_live"]
    assert run["heading"] == f"Run {live_seen['run_id']}"
    assert "livestate" in run["cards"]
    assert "env" in run["settings"]
    assert "test-model" in run["settings"]
    done = steps["hub_done"]
    assert "finishedstate" in done["cards"]
    assert f"{EPISODES}episodes" in done["cards"]
    assert f"{EPISODES}ok" in done["cards"]
    seen = [int(x) for x in done["seen"]]
    assert (seen[0], seen[-1]) == (HELD, EPISODES)
    assert seen == sorted(seen)
    final = steps["hub_runs_done"]["row"]
    assert (final[1], final[5]) == ("finished", str(EPISODES))


def test_no_console_errors_while_watching_a_live_run(live_seen: dict[str, Any]) -> None:
    assert live_seen["console"] == []
