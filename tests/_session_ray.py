"""One local Ray for a test session, which ``aenv rollout`` runs, doc examples and
tests/test_rollout_pool.py's pools join (:attr:`SessionRay.env`: ``RAY_ADDRESS`` and
``RAY_AUTH_MODE=token``) where Ray's own start, end or faults are not their subject (those
start their own: tests/test_rollout_faults.py's killed drivers, tests/test_nonroot.py, the pool
module's two-node cluster).

It runs in a helper process that started it with :func:`rollout.init_local` (loopback, no
dashboard, 2 CPUs, no workers prestarted for the helper's own job) and waits on its stdin:
closing that pipe, or the session dying however it dies, ends the helper, whose reaper then
ends Ray's processes (docs/rollout.md). Its workers get the helper's environment (the test
session's, without ``RAY_ADDRESS``), not a joining driver's; each driver's job, its actors
with it, ends when the driver disconnects.

Ray 2.60 turns token authentication on for a cluster that ``ray.init`` starts (the token in
``~/.ray/auth_token``), and a driver joining it must ask for token mode itself
(``RAY_AUTH_MODE=token``), else it is refused as unauthenticated. The helper asks for it
explicitly, so the pair does not depend on that default.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent

HELPER = """
import sys

import ray

import rollout

rollout.init_local(num_cpus=2)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the session closes this pipe, or dies
"""


class SessionRay:
    """``with SessionRay() as ray_cluster:`` a local Ray at ``ray_cluster.address``."""

    def __init__(self) -> None:
        self.address = ""
        self._helper: subprocess.Popen[str] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a driver's environment needs to join this Ray."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token"}

    def __enter__(self) -> SessionRay:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_AUTH_MODE"] = "token"
        # Ray starts num_cpus idle workers for the first driver's job, the helper's, which
        # runs nothing: workers serve one job, so they would only idle for the session
        env["RAY_prestart_worker_first_driver"] = "0"
        self._helper = subprocess.Popen(
            [sys.executable, "-c", HELPER],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._helper.stdout is not None
        self.address = self._helper.stdout.readline().strip()
        if not self.address:
            self.__exit__(None, None, None)
            raise RuntimeError("the session's Ray did not start (see the helper's stderr above)")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        helper, self._helper = self._helper, None
        if helper is None:
            return
        for stream in (helper.stdin, helper.stdout):
            if stream is not None:
                stream.close()  # the helper's read ends: it exits, its reaper ends Ray
        try:
            helper.wait(timeout=60)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait(timeout=60)
