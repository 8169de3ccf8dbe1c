"""The wheel of aenv-ray that ``aenv build`` puts in the image's context (``aenv_cli._wheel``).

No container builder runs here, so what the image's ``RUN pip install`` does is done for real
outside one: the wheel is installed, with its dependencies resolved from its own metadata, into a
fresh virtual environment, offline (``uv`` from its cache, every version pinned to this
environment's, as ``scripts/setup`` installed them); that environment's ``aenv build`` prepares
a context, and its runtime serves the context's ``env/`` as the image's ``CMD`` would.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import aenv_ray
from aenv_cli._scaffold import write_project
from aenv_cli._wheel import Wheel, build_wheel
from aenv_ray import __version__
from aenv_ray.testing import RuntimeProcess
from tests._wheel import PACKAGES, constraints

CHECKOUT = Path(aenv_ray.__file__).resolve().parent.parent
UV = Path(sys.executable).with_name("uv")
WHEEL_NAME = f"aenv_ray-{__version__}-py3-none-any.whl"


@pytest.fixture(scope="module")
def wheel() -> Wheel:
    return build_wheel()


def members(wheel: Wheel) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(wheel.data)).namelist()


def isolated(**extra: str) -> dict[str, str]:
    """An environment in which nothing of this checkout or this venv is importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PYTHONSAFEPATH": "1", **extra}


def test_the_wheel_holds_every_module_and_package_file_and_nothing_else(wheel: Wheel) -> None:
    assert wheel.filename == WHEEL_NAME
    names = members(wheel)
    assert names == list(dict.fromkeys(names))  # no member twice
    modules = sorted(
        path.relative_to(CHECKOUT).as_posix()
        for package in PACKAGES
        for path in (CHECKOUT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )
    assert modules, "no module found in the checkout"
    assert sorted(n for n in names if n.endswith(".py")) == modules
    for data in ("aenv_ray/py.typed", "builtin_envs/mini_terminal/config.json"):
        assert data in names
    assert "local_backend/init.c" in names  # compiled at run time: package data
    assert not [n for n in names if n.startswith(("tests/", "pyproject", "README"))]
    info = f"aenv_ray-{__version__}.dist-info"
    assert names[-1] == f"{info}/RECORD"
    archive = zipfile.ZipFile(io.BytesIO(wheel.data))
    # the installed one: not the checkout's aenv_ray.egg-info (the current directory's)
    installed = next(
        dist
        for dist in importlib.metadata.distributions(name="aenv-ray")
        if dist.read_text("METADATA") is not None
    )
    assert archive.read(f"{info}/METADATA").decode() == installed.read_text("METADATA")
    assert "aenv = aenv_cli:main" in archive.read(f"{info}/entry_points.txt").decode()
    assert archive.testzip() is None
    assert build_wheel().data == wheel.data  # the same files, the same bytes


def test_an_installed_wheel_gives_the_same_wheel_again(wheel: Wheel, tmp_path: Path) -> None:
    # the other source of files: a regular install's RECORD (what `pip install aenv-ray` makes)
    (tmp_path / WHEEL_NAME).write_bytes(wheel.data)
    target = tmp_path / "site"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    done = subprocess.run(
        [*command, "--target", str(target), str(tmp_path / WHEEL_NAME)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [installed] = importlib.metadata.distributions(path=[str(target)])
    assert installed.read_text("INSTALLER") is not None  # pip's own file: not carried over
    again = build_wheel(installed)
    assert again.filename == wheel.filename
    assert again.data == wheel.data


def run(*command: str | Path, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_into_a_fresh_venv_and_serves_the_context(
    wheel: Wheel, tmp_path: Path
) -> None:
    (tmp_path / WHEEL_NAME).write_bytes(wheel.data)
    (tmp_path / "constraints.txt").write_text(constraints())
    venv = tmp_path / "venv"
    env = isolated()
    run(UV, "venv", "-q", "--python", sys.executable, venv, cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    # as the image's RUN does: the wheel, its dependencies resolved from its own metadata
    options = ["-q", "--offline", "--python", str(python), "-c", "constraints.txt"]
    install = subprocess.run(
        [str(UV), "pip", "install", *options, WHEEL_NAME],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, (
        "the wheel did not install offline with its dependencies pinned to this venv's; is uv's "
        f"cache (filled by scripts/setup) there? {install.stderr}"
    )
    where = run(
        python,
        "-c",
        # the packages of the bare wheel (the image's): the hub, rollout and Kubernetes are
        # extras (tests/test_install.py checks that they say so)
        "import aenv_ray, aenv_cli, sandbox_runtime, local_backend, builtin_envs; "
        "print(sandbox_runtime.__file__); print(aenv_ray.__file__)",
        cwd=tmp_path,
        env=env,
    )
    site = venv.resolve()
    assert all(Path(line).resolve().is_relative_to(site) for line in where.split()), where
    assert run(venv / "bin" / "aenv", "--version", cwd=tmp_path, env=env).strip() == (
        f"aenv-ray {__version__}"
    )

    # that venv's aenv build prepares a context whose wheel is this one, byte for byte
    write_project(tmp_path / "notes", "notes")
    out = tmp_path / "notes" / "dist"
    no_builder = {**env, "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    run(venv / "bin" / "aenv", "build", "notes", "--no-image", cwd=tmp_path, env=no_builder)
    assert (out / "image" / "wheels" / WHEEL_NAME).read_bytes() == wheel.data

    # and serves the context's env/ as the image's CMD does (from /env)
    async def episode(runtime: RuntimeProcess) -> None:
        async with runtime.environment() as environment:
            result = await environment.call_tool("add_note", {"text": "buy milk"})
            assert not result.is_error, result.text
            assert await environment.call_reward({"expected": "milk"}) == 1.0

    served = RuntimeProcess(out / "image" / "env", python=str(python), env={"PYTHONSAFEPATH": "1"})
    with served:
        asyncio.run(episode(served))
