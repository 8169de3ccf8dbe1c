"""aenv-ray's wheel as a user gets it, for the tests that install it (tests/test_install.py,
tests/test_wheel.py): ``uv build`` of this checkout, a fresh virtual environment outside it,
and what runs there sees nothing of the checkout.

The wheel is built once per session (the ``built_wheel`` fixture of tests/conftest.py calls
:func:`build_wheel`).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

__all__ = [
    "PACKAGES",
    "ROOT",
    "build_wheel",
    "clean_env",
    "constraints",
    "new_venv",
    "run",
    "uv",
]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "aenv",
    "aenv_cli",
    "aenv_harbor",
    "aenv_openenv",
    "aenv_ray",
    "aenv_ui",
    "builtin_envs",
    "envhub",
    "k8s_backend",
    "local_backend",
    "rollout",
    "sandbox_runtime",
)
"""The top-level packages of the wheel (pyproject.toml's ``packages.find``)."""


def uv() -> str:
    """The uv that scripts/setup installed beside this Python (else the one on PATH)."""
    local = Path(sys.executable).with_name("uv")
    found = str(local) if local.is_file() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is not installed: run scripts/setup")
    return found


def clean_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment without what would reach into the checkout or its venv
    (``PYTHON*``, ``VIRTUAL_ENV``, aenv-ray's settings), and with no user configuration."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AENV_", "VIRTUAL_ENV", "PYTHON", "UV_PROJECT"))
        and k not in {"DUMMY_INSTANCE_IP", "PYTEST_CURRENT_TEST"}
    }
    env["AENV_CONFIG_FILE"] = str(tmp_path / "no-aenv-config.json")
    return env


def run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    """``args``'s standard output; its exit status and both streams in the failure if not 0."""
    done = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, by the build backend pyproject.toml names (``uv build``:
    isolated, setuptools from uv's cache or the index), written into ``out``."""
    env = clean_env(out)
    # setuptools builds in the checkout's build/ (its scratch, git-ignored) and puts all of
    # build/lib in the wheel: files of an earlier build, since removed or renamed, would come
    # along. Removed before and after.
    scratch = ROOT / "build"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        build = [uv(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(ROOT)]
        run(build, env=env, cwd=ROOT)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (wheel,) = out.glob("aenv_ray-*.whl")
    return wheel


def new_venv(path: Path, env: dict[str, str]) -> Path:
    """A new virtual environment of this Python at ``path``; its ``python``."""
    run([uv(), "venv", "--quiet", "--python", sys.executable, str(path)], env=env, cwd=path.parent)
    return path / "bin" / "python"


def constraints() -> str:
    """This environment's distributions pinned (a constraints file), aenv-ray left out: an
    install with them resolves offline, from what scripts/setup put in uv's cache."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name and name != "aenv-ray":
            pins.setdefault(name, dist.version)
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
