"""EnvHub never publishes what cannot load, and never shows its own paths.

``aenv build``, ``aenv push`` (of a project and of a bundle) and the hub on receiving a bundle
load the project in a sandbox first: broken projects (a syntax error, a missing module, a bad
name imported from a package, a failing sibling module, an exception, ``os._exit`` at import)
are refused with the file and line told as the user knows them, and a hostile one's import-time
code never runs in the CLI's process. The hub's answers (a load error, a store that fails) show
no path of the hub's own. Real CLI, real hubs (``aenv serve``) on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest

from aenv_cli._scaffold import module_name, write_project
from aenv_ray.bundle import build_bundle
from aenv_ray.errors import DefinitionError, EnvironmentNotFoundError
from aenv_ray.hub import HubClient
from tests._cli import aenv as run_cli
from tests._hub import HubProcess

SOURCE_ROOT = str(Path(__file__).resolve().parent.parent)

# what is appended to the module `aenv init` writes (40 lines), and what the error must say
# (src/demo.py standing for the project's module)
BROKEN: dict[str, tuple[str, str]] = {
    "syntax error": ("\ndef broken(:\n    pass\n", "src/demo.py:42: SyntaxError"),
    "missing module": ("import nope_aenv_missing\n", "src/demo.py:41: ModuleNotFoundError"),
    "bad name": ("from aenv_ray import no_such_name\n", "src/demo.py:41: ImportError"),
    "sibling": ("import helper\n", "src/helper.py:2: ModuleNotFoundError"),
    "raises": ("raise RuntimeError('boom at import')\n", "src/demo.py:41: RuntimeError: boom"),
    "exits": ("import os\nos._exit(3)\n", "exited while importing the project"),
}


def broken_project(root: Path, case: str, name: str = "demo") -> Path:
    project = root / case.replace(" ", "-")
    write_project(project, name)
    module = project / "src" / f"{module_name(name)}.py"
    assert len(module.read_text().splitlines()) == 40  # the lines BROKEN counts on
    module.write_text(module.read_text() + BROKEN[case][0])
    if case == "sibling":
        (project / "src" / "helper.py").write_text("x = 1\nimport nope_aenv_deep\n")
    return project


def run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process (tests/_cli.py)."""
    return run_cli(*args, cwd=cwd, env=env)


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aenv: error: "), lines
    return lines[0]


# -- aenv build and aenv push, before anything is written or sent --------------------------------


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_build_refuses_a_project_that_does_not_load_naming_file_and_line(
    case: str, tmp_path: Path
) -> None:
    project = broken_project(tmp_path, case)
    built = run("build", project.name, "--no-image", cwd=tmp_path)
    assert built.returncode == 2, built
    line = one_error(built)
    assert "demo@1.0.0 does not load" in line
    said = BROKEN[case][1]
    assert (f"{project.name}/{said}" if said.startswith("src/") else said) in line
    assert "aenv-check-" not in line  # not where the check unpacked it
    assert not (project / "dist").exists()


def test_push_refuses_a_broken_project_or_bundle_before_asking_the_hub(tmp_path: Path) -> None:
    project = broken_project(tmp_path, "syntax error")
    bundle = tmp_path / "demo.aenv.tgz"
    bundle.write_bytes(build_bundle(project).data)
    nowhere = {"AENV_SYSTEM_URL": "http://127.0.0.1:9", "AENV_API_KEY": "x"}  # never reached
    from_dir = run("push", project.name, cwd=tmp_path, **nowhere)
    assert from_dir.returncode == 2, from_dir
    assert f"{project.name}/src/demo.py:42: SyntaxError" in one_error(from_dir)
    from_bundle = run("push", bundle.name, cwd=tmp_path, **nowhere)
    assert from_bundle.returncode == 2, from_bundle
    line = one_error(from_bundle)
    assert "(the bundle demo.aenv.tgz) does not load" in line
    assert "failed at src/demo.py:42: SyntaxError" in line


def test_a_hostile_projects_import_time_code_never_runs_in_the_cli(tmp_path: Path) -> None:
    """Its module writes a file on the host and reads a secret of the CLI's environment: in the
    sandbox, neither reaches the host (a private /tmp, no inherited variables)."""
    marker = Path("/tmp") / f"aenv-hostile-build-{os.getpid()}"
    project = tmp_path / "hostile"
    write_project(project, "hostile")
    module = project / "src" / "hostile.py"
    module.write_text(
        module.read_text()
        + "import os\n"
        + f"open({str(marker)!r}, 'w').write(os.environ.get('AENV_TEST_HOST_SECRET', '-'))\n"
        + "import nope_aenv_after_the_attack\n"
    )
    try:
        built = run("build", "hostile", "--no-image", cwd=tmp_path, AENV_TEST_HOST_SECRET="s3")
        assert built.returncode == 2, built
        assert "hostile/src/hostile.py:43: ModuleNotFoundError" in one_error(built)
        assert not marker.exists()
    finally:
        marker.unlink(missing_ok=True)


# -- the hub, on receiving a bundle ------------------------------------------------------------


@pytest.fixture
def hub(open_hub: HubProcess) -> HubProcess:
    """The session's hub without auth (tests/conftest.py): the names these tests push are
    their own and never published."""
    return open_hub


def assert_no_hub_path(text: str, hub: HubProcess) -> None:
    for path in (str(hub.data_dir), str(hub.data_dir.resolve()), sys.prefix, SOURCE_ROOT):
        assert path not in text, text
    assert "bundles/sha256" not in text


@pytest.mark.parametrize("case", ["syntax error", "bad name", "sibling", "exits"])
async def test_the_hub_refuses_a_bundle_that_does_not_load_and_shows_none_of_its_paths(
    case: str, hub: HubProcess, tmp_path: Path
) -> None:
    """Sent straight to the hub (no CLI check): refused with the bundle's file and line."""
    name = f"broken-{case.replace(' ', '-')}"
    bundle = build_bundle(broken_project(tmp_path, case, name))
    async with HubClient(hub.url) as client:
        with pytest.raises(DefinitionError) as refused:
            await client.push(bundle.data)
        message = str(refused.value)
        said = BROKEN[case][1].replace("src/demo.py", f"src/{module_name(name)}.py")
        assert said in message, message
        assert_no_hub_path(message, hub)
        assert_no_hub_path(refused.value.location or "", hub)
        with pytest.raises(EnvironmentNotFoundError):
            await client.get_version(name, "1.0.0")  # nothing was published


async def test_a_failing_store_is_answered_without_the_hubs_paths(hub: HubProcess) -> None:
    """A document changed outside the hub makes the store fail: the 503 says so, without the
    store file's path. (The session's hub: the document is taken out again afterwards.)"""
    db = hub.store.removeprefix("sqlite:///")
    key = f"broken-{uuid.uuid4().hex[:8]}@1"
    with sqlite3.connect(db) as connection:
        connection.execute(
            "INSERT INTO docs (kind, key, doc) VALUES ('versions', ?, 'not json')", (key,)
        )
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{hub.url}/v1/envs") as answer,
        ):
            assert answer.status == 503
            body = json.loads(await answer.text())
    finally:
        with sqlite3.connect(db) as connection:
            connection.execute("DELETE FROM docs WHERE kind = 'versions' AND key = ?", (key,))
    assert body["type"] == "StoreError"
    assert "is not JSON" in body["error"]
    assert "<hub>" in body["error"]
    assert_no_hub_path(json.dumps(body), hub)
    assert db not in body["error"]
    async with (  # the store is whole again
        aiohttp.ClientSession() as session,
        session.get(f"{hub.url}/v1/envs") as answer,
    ):
        assert answer.status == 200, await answer.text()


def test_scrub_paths_keeps_what_is_not_below_a_root() -> None:
    from aenv_ray.loadcheck import scrub_paths

    roots = {"/srv/hub": "<hub>", "/srv/hub/data/ds": "/srv/hub/data/ds"}
    text = "/srv/hub/a.py, /srv/hubs/b, /srv/hub/data/ds/x, /srv/hub."
    assert scrub_paths(text, roots) == "<hub>/a.py, /srv/hubs/b, /srv/hub/data/ds/x, <hub>."
    assert asyncio.run(_no_inspect()) is None


async def _no_inspect() -> object:
    from aenv_ray.loadcheck import load_in_sandbox

    return await load_in_sandbox(object(), Path("/nowhere"))
