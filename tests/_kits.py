"""The Kubernetes kits' one-time work, done ahead of the tests that need it.

On a machine that never ran the Kubernetes lane, its first test waits for k8s-real's and the
real node's ``setup`` (a Go build of Kubernetes: ~15-30 min of CPU on 2 cores) and then for this
checkout's images on the node (deploy/Dockerfile's runtime image, its variant with
mini-program's Chromium, mini-terminal's own ``aenv build`` image: minutes each).
``scripts/test`` runs this module in the background at ``nice -n 15`` as soon as the virtual
environment is set up, so that work fills the CPU the lint, the type check and the first lanes
leave idle, instead of stopping the suite for half an hour in the middle::

    .venv/bin/python -m tests._kits            # what scripts/test starts; prints each step

Every step takes :func:`tests._k8s.kit_lock` and does nothing when its result exists (the same
checks the fixtures make), so a test that needs a step's result waits for it, and a fixture
that finds it missing (this run failed, or was never started) makes it itself, as before.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests._k8s import REPO, set_up_k8s_real, tools_dir
from tests._k8s_images import CHROMIUM, built_environment
from tests._realnode import realnode_tools, runtime_image, set_up

__all__ = ["main", "mini_terminal_image"]


def mini_terminal_image() -> str:
    """The tag of mini-terminal's own image on the node (``aenv build``, then the kit's
    ``build-image``): what tests/test_k8s_realnode_security.py runs."""
    prefix = os.environ.get("AENV_TEST_IMAGE_PREFIX", "").rstrip("/") or "realnode.local/aenv"
    return f"{prefix}/mini-terminal:1.0.0"


def _step(what: str, run: Callable[[], object]) -> bool:
    started = time.monotonic()
    try:
        run()
    except Exception as exc:  # report and go on: the fixture that needs it will say it again
        print(f"tests._kits: {what} failed after {time.monotonic() - started:.0f} s: {exc}")
        return False
    print(f"tests._kits: {what} ready ({time.monotonic() - started:.0f} s)", flush=True)
    return True


def main() -> int:
    """Run every step whose kit is here; 0 when all that could run succeeded."""
    ok = True
    realnode = realnode_tools()
    k8s_real = tools_dir()
    if realnode is not None:
        ok &= _step("k8s-realnode setup", lambda: set_up(realnode))
    if k8s_real is not None:
        ok &= _step("k8s-real setup", lambda: set_up_k8s_real(k8s_real))
    if realnode is not None and ok:
        images: dict[str, str] = {}
        ok &= _step("the runtime image", lambda: images.setdefault("runtime", runtime_image()))
        if "runtime" in images:
            ok &= _step(
                "mini-program's image (the runtime image with Chromium)",
                lambda: runtime_image(extra_packages=CHROMIUM),
            )
        project = Path(REPO / "builtin_envs" / "mini_terminal")
        ok &= _step(
            "mini-terminal's own image", lambda: built_environment(project, mini_terminal_image())
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
