"""Ray and no-Ray agree (issue 13, point 5): with a hub configured, ``aenv rollout`` creates its
instances through the hub on both paths, a Ray pool's actors as the ``--no-ray`` path does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from aenv_ray.hub import HubClient
from tests._hub import HubProcess, new_key

ROOT = Path(__file__).resolve().parent.parent
AENV = [sys.executable, "-m", "aenv_cli"]


def test_both_paths_create_their_instances_through_the_configured_hub(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "hub")
    key = new_key("alice", hub.store)
    env = {**os.environ, "AENV_SYSTEM_URL": hub.url, "AENV_API_KEY": key}
    with hub:
        ids: dict[str, set[str]] = {}
        for path in ("--ray", "--no-ray"):
            out = tmp_path / path.strip("-")
            done = subprocess.run(
                [
                    *AENV,
                    "rollout",
                    "mini-terminal@1.0.0",
                    "-n",
                    "2",
                    "-c",
                    "2",
                    path,
                    "-o",
                    str(out),
                ],
                cwd=ROOT,
                env={**env, "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            lines = (out / "trajectories.jsonl").read_text().splitlines()
            ids[path] = {json.loads(line)["instance_id"] for line in lines}
            assert len(ids[path]) == 2

        async def records() -> dict[str, str]:
            async with HubClient(hub.url, api_key=key) as client:
                found = {}
                for iid in ids["--ray"] | ids["--no-ray"]:
                    found[iid] = (await client.get_instance(iid))["state"]
                return found

        states = asyncio.run(records())
        assert set(states) == ids["--ray"] | ids["--no-ray"]  # every one the hub's, alice's
        assert set(states.values()) == {"terminated"}  # and released at the end
