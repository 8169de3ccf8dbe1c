"""Running Python as an unprivileged user (``nobody``, through ``setpriv``) for the tests that
check the local engine without root; run by another user, as that user directly."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["NOBODY", "unprivileged_python"]

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534


def _unprivileged(home: Path) -> tuple[list[str], dict[str, str]] | str:
    """The command prefix and environment that run Python unprivileged, or why there is none."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),
        "AENV_STATE_DIR": str(home / "state"),
        "LANG": "C.UTF-8",
    }
    if os.geteuid() != 0:
        return [sys.executable], env
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "no setpriv (util-linux) to run the engine as nobody"
    os.chown(home, NOBODY, NOBODY)
    drop = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    # this interpreter, or (when nobody may not run it, e.g. under /root) the system's of the
    # same version with this environment's packages on its path
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    paths = os.pathsep.join([str(REPO), *site.getsitepackages()])
    candidates = [([sys.executable], {}), ([f"/usr/bin/{version}"], {"PYTHONPATH": paths})]
    # the engine starts its zygotes with sys.executable: nobody must be able to run that again
    check = "import aenv_ray, os, sys; os.execv(sys.executable, [sys.executable, '-c', ''])"
    for python, extra in candidates:
        command = [*drop, *python]
        try:
            ok = subprocess.run(
                [*command, "-c", check], env={**env, **extra}, capture_output=True, timeout=60
            )
        except OSError:
            continue
        if ok.returncode == 0:
            return command, {**env, **extra}
    return f"nobody can run neither {sys.executable} nor /usr/bin/{version} with the packages"


def unprivileged_python() -> Iterator[tuple[list[str], dict[str, str]]]:
    """``(command prefix, environment)`` that run this suite's Python as nobody (skips when
    there is none, or where unprivileged namespaces are unavailable); its home goes after."""
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux only")
    # not pytest's (root's only), not under /tmp (which every instance covers with its own)
    parent = "/var/tmp" if os.path.isdir("/var/tmp") else "/tmp"
    home = Path(tempfile.mkdtemp(prefix="aenv-nobody-", dir=parent))
    try:
        yield from _probed(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _probed(home: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    how = _unprivileged(home)
    if isinstance(how, str):
        pytest.skip(how)
    command, env = how
    probe = "from local_backend._sandbox import namespaces_available as n; print(n() or '')"
    why_not = subprocess.run(
        [*command, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    if why_not:
        pytest.skip(f"unprivileged namespaces unavailable: {why_not}")
    yield command, env
