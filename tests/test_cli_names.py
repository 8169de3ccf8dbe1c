"""The CLI agrees with its docs (issue 13, point 7): unknown names exit 2 in every command, with
and without a hub; ``aenv instance create PATH``; the engine daemon serves its caller's
``AENV_ENV_PATH``; broken projects on ``AENV_ENV_PATH`` are reported, not skipped; an absolute
datasource under the hub's root; the annotation hint for an unannotated parameter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import Environment, register_tool
from aenv_ray.errors import ConfigurationError, DefinitionError
from aenv_ray.resolve import broken_environments, resolve_environment
from builtin_envs import builtin_refs
from envhub.routes.instances import datasource_path
from tests._cli import aenv as run_cli
from tests._hub import HubProcess

TOOL = '''from aenv_ray import register_tool


@register_tool
def where() -> str:
    """Say which project this is."""
    return "{name}"
'''


def project(parent: Path, name: str) -> Path:
    """A minimal project ``parent/name`` (``name@1.0.0``, one tool ``where``)."""
    root = parent / name
    (root / "src").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"name": name, "version": "1.0.0"}))
    (root / "src" / f"{name.replace('-', '_')}_tools.py").write_text(TOOL.format(name=name))
    return root


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user without a hub, with a private state dir and settings file."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AENV_SYSTEM_URL", "AENV_API_KEY", "AENV_ENV_PATH")
    }
    env["AENV_STATE_DIR"] = str(tmp_path / "state")
    env["AENV_CONFIG_FILE"] = str(tmp_path / "no-config.json")
    (tmp_path / "pol.py").write_text("async def policy(task, env):\n    return None\n")
    (tmp_path / "tasks.jsonl").write_text('{"x": 1}\n')
    yield env
    pid_file = tmp_path / "state" / "engine.pid"
    if pid_file.exists():  # a daemon started by a test: stop it and its instances
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_file.exists(), "the daemon did not stop on SIGTERM"


def aenv(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process, with ``env`` as its whole environment (tests/_cli.py)."""
    return run_cli(*args, environ=env, cwd=cwd)


def one_line_usage_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one ``aenv: error:`` line naming ``words`` (and nothing else on stderr: no
    progress bar is drawn before a lookup fails)."""
    assert done.returncode == 2, (done.args, done.stdout, done.stderr)
    text = done.stderr
    assert text.startswith("aenv: error: "), done.stderr
    assert text.count("\n") == 1, done.stderr
    for word in words:
        assert word in text, (word, done.stderr)


ROLLOUT = ("-n", "1", "--policy", "pol:policy", "--tasks", "tasks.jsonl", "--no-ray")


def rollout(env: dict[str, str], cwd: Path, name: str) -> subprocess.CompletedProcess[str]:
    """``aenv rollout NAME`` with the policy ``pol:policy`` of ``cwd`` (on PYTHONPATH here only:
    an engine daemon started with it would hand it to its instances)."""
    return aenv({**env, "PYTHONPATH": str(cwd)}, cwd, "rollout", name, *ROLLOUT, "-o", "out")


def test_unknown_names_exit_2_without_a_hub(base_env: dict[str, str], tmp_path: Path) -> None:
    listing = ("known: `", "`mini-terminal@1.0.0`")  # among the built-ins, in name order
    created = aenv(base_env, tmp_path, "instance", "create", "nope")
    one_line_usage_error(created, "no environment `nope`", *listing)
    close = aenv(base_env, tmp_path, "instance", "create", "mini-termnal")
    one_line_usage_error(close, "did you mean `mini-terminal@1.0.0`?")
    for verb in ("get", "delete"):
        one_line_usage_error(
            aenv(base_env, tmp_path, "instance", verb, "nope"), "no instance `nope`", "list"
        )
    ran = rollout(base_env, tmp_path, "nope")
    one_line_usage_error(ran, "no environment `nope`", *listing)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    root = tmp_path_factory.mktemp("datasources")
    (root / "sub").mkdir()
    (root / "sub" / "hello.txt").write_text("from the datasource\n")
    proc = HubProcess(
        tmp_path_factory.mktemp("hub"),
        auth=False,
        engine="local",
        extra=["--datasource-root", str(root)],
    )
    with proc:
        yield proc


def test_unknown_names_exit_2_with_a_hub(
    hub: HubProcess, base_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**base_env, "AENV_SYSTEM_URL": hub.url}
    for args, words in (
        (("get", "nope"), ["`nope`", "aenv list"]),
        (("get", "nope@1.0.0"), ["`nope@1.0.0`"]),
        (("pull", "nope"), ["`nope`", "aenv list"]),
        (("pull", "nope@2.0.0", "--dest", "x"), ["`nope@2.0.0`"]),
        (("deprecate", "nope@1.0.0"), ["`nope@1.0.0`"]),
        (("delete", "nope@1.0.0", "--yes"), ["`nope@1.0.0`"]),
        (("instance", "create", "nope"), ["`nope`"]),
        (("instance", "get", "0123456789ab"), ["`0123456789ab`", "aenv instance list"]),
        (("service", "create", "nope"), ["`nope`"]),
        (("service", "get", "svc-0000000000"), ["`svc-0000000000`", "aenv service list"]),
    ):
        one_line_usage_error(aenv(env, tmp_path, *args), *words)
    one_line_usage_error(rollout(env, tmp_path, "nope"), "`nope`", "aenv list")
    assert not (tmp_path / "x").exists()


async def test_instance_create_takes_a_project_path(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    project(tmp_path, "here")
    made = aenv(base_env, tmp_path, "instance", "create", "./here", "--json")
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    assert info["env_ref"] == "here@1.0.0"
    async with Environment.attach(info["url"], token=info["token"]) as env:
        assert (await env.call_tool("where", {})).text == "here"
    assert aenv(base_env, tmp_path, "instance", "delete", info["id"]).returncode == 0

    missing = aenv(base_env, tmp_path, "instance", "create", "./nowhere")
    one_line_usage_error(missing, "no project directory ./nowhere")
    (tmp_path / "empty").mkdir()
    no_config = aenv(base_env, tmp_path, "instance", "create", "./empty")
    one_line_usage_error(no_config, "no config.json at")


def test_instance_create_refuses_a_project_path_with_a_hub(
    hub: HubProcess, base_env: dict[str, str], tmp_path: Path
) -> None:
    project(tmp_path, "here")
    env = {**base_env, "AENV_SYSTEM_URL": hub.url}
    refused = aenv(env, tmp_path, "instance", "create", "./here")
    one_line_usage_error(refused, "./here is a project directory", "aenv push ./here")


async def test_the_daemon_serves_each_callers_env_path(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    project(a, "only-a")
    project(b, "only-b")
    first = aenv({**base_env, "AENV_ENV_PATH": str(a)}, tmp_path, "instance", "create", "only-a")
    assert first.returncode == 0, first.stderr  # this command started the daemon, with A
    assert (tmp_path / "state" / "engine.pid").exists()
    daemon = (tmp_path / "state" / "engine.pid").read_text()

    second = aenv(
        {**base_env, "AENV_ENV_PATH": str(b)}, tmp_path, "instance", "create", "only-b", "--json"
    )
    assert second.returncode == 0, second.stderr
    info = json.loads(second.stdout)
    assert info["env_ref"] == "only-b@1.0.0"
    assert (tmp_path / "state" / "engine.pid").read_text() == daemon  # the same daemon
    async with Environment.attach(info["url"], token=info["token"]) as env:
        assert (await env.call_tool("where", {})).text == "only-b"

    # and B's command no longer sees A's project
    gone = aenv({**base_env, "AENV_ENV_PATH": str(b)}, tmp_path, "instance", "create", "only-a")
    one_line_usage_error(gone, "no environment `only-a`", "`only-b@1.0.0`")


def test_broken_projects_on_the_env_path_are_reported(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    envs = tmp_path / "envs"
    project(envs, "fine")
    (envs / "bad").mkdir()
    (envs / "bad" / "config.json").write_text('{"name": "bad", "version": }')
    (envs / "nameless").mkdir()
    (envs / "nameless" / "config.json").write_text('{"version": "1.0.0"}')
    (envs / "notes").mkdir()  # no config.json: not a project, so not broken either
    bad_file, nameless_file = envs / "bad" / "config.json", envs / "nameless" / "config.json"

    broken = broken_environments(str(envs))
    assert sorted(broken) == [bad_file.resolve(), nameless_file.resolve()]
    assert broken[bad_file.resolve()].startswith(f"{bad_file.resolve()} is not valid JSON: ")
    assert broken[nameless_file.resolve()] == f"{nameless_file.resolve()} has no `name`"
    assert resolve_environment("fine", str(envs))[0] == "fine@1.0.0"  # the rest still resolve

    env = {**base_env, "AENV_ENV_PATH": str(envs)}
    asked = aenv(env, tmp_path, "instance", "create", "bad")
    one_line_usage_error(asked, "no environment `bad`", "Skipped 2 broken project(s)")
    # the one in the directory of the name asked for comes first
    assert asked.stderr.index(str(bad_file.resolve())) < asked.stderr.index(
        str(nameless_file.resolve())
    )
    assert "is not valid JSON: Expecting value: line 1 column" in asked.stderr

    listed = aenv(env, tmp_path, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {r["ref"] for r in rows if not r["error"]} == {"fine@1.0.0", *builtin_refs()}
    errors = {r["project"]: r["error"] for r in rows if r["error"]}
    assert errors == {str(p.parent.resolve()): broken[p.resolve()] for p in broken}
    table = aenv(env, tmp_path, "list")
    assert table.returncode == 0, table.stderr
    assert "broken" in table.stdout
    assert "fine" in table.stdout


def test_a_datasource_is_a_path_under_the_root_relative_or_absolute(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    inside = str((root / "sub").resolve())
    assert datasource_path("sub", root) == inside
    assert datasource_path("/sub", root) == inside  # as it always was: relative to the root
    assert datasource_path(inside, root) == inside
    assert datasource_path(str(root / "sub" / "deeper"), root) == inside + "/deeper"
    for refused in (str(tmp_path / "outside"), "../outside", "escape", str(root / "missing")):
        with pytest.raises(ConfigurationError, match="not a directory under the hub's"):
            datasource_path(refused, root)
    assert datasource_path(None, root) is None


async def test_an_absolute_datasource_through_the_cli(
    hub: HubProcess, base_env: dict[str, str], tmp_path: Path
) -> None:
    from tests._hub import run

    root = Path(hub.command()[hub.command().index("--datasource-root") + 1])
    env = {**base_env, "AENV_SYSTEM_URL": hub.url}
    made = aenv(env, tmp_path, "instance", "create", "mini-terminal", "--json",
                "--datasource", str(root / "sub"))  # fmt: skip
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    try:
        assert await run(info, "cat /data/hello.txt") == "from the datasource"
    finally:
        assert aenv(env, tmp_path, "instance", "delete", info["id"]).returncode == 0


def _limit(query: str, limit=10):  # type: ignore[no-untyped-def]
    return query


def _maybe(query: str, cursor=None):  # type: ignore[no-untyped-def]
    return query


def _items(query: str, ids=[1, 2]):  # type: ignore[no-untyped-def]  # noqa: B006
    return query


def _bare(query: str, what):  # type: ignore[no-untyped-def]
    return query


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (
            _limit,
            "argument `limit` has no type annotation; annotate `limit: int = 10` "
            "(its default is an int)",
        ),
        (
            _maybe,
            "annotate `cursor: str | None = None` (its default is None; put the type it "
            "takes otherwise)",
        ),
        (_items, "annotate `ids: list[int] = [1, 2]` (its default is a list[int])"),
        (_bare, "argument `what` has no type annotation; write e.g. `what: str`"),
    ],
)
def test_an_unannotated_parameter_gets_the_type_of_its_default(fn: object, hint: str) -> None:
    with pytest.raises(DefinitionError) as info:
        register_tool(name="subject")(fn)
    assert hint in str(info.value)


def test_aenv_run_names_the_annotation_to_write(base_env: dict[str, str], tmp_path: Path) -> None:
    root = project(tmp_path, "sloppy")
    (root / "src" / "sloppy_tools.py").write_text(
        "from aenv_ray import register_tool\n\n\n@register_tool\n"
        "def search(query: str, limit=10) -> str:\n    return query\n"
    )
    done = aenv(base_env, tmp_path, "run", "sloppy")
    one_line_usage_error(
        done, "sloppy_tools.py:4", "annotate `limit: int = 10` (its default is an int)"
    )
