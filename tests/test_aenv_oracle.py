"""The ``aenv`` compatibility layer against AEnvironment itself (its PyPI package 0.1.7, in a
virtual environment of its own: tests/_oracles.py's ``AENVIRONMENT``).

One agent written against AEnvironment's documented SDK (tests/aenvironment/client.py) and one
environment written as its guides write them (tests/aenvironment/demo, with the ``config.json``
of AEnvironment's ``aenv init``) run twice, unchanged: AEnvironment's SDK against AEnvironment's
server (``python -m aenv.main``), and aenv-ray's ``aenv`` against ``aenv run``'s runtime; both in
AEnvironment's local mode (``DUMMY_INSTANCE_IP``). Each call's outcome is compared: the same
values, the same error results, the same exceptions (by AEnvironment's class names), the same
tool and function listings where the two agree by design; the differences docs/migrating.md
lists are asserted as such.

AEnvironment's server and SDK always use port 8081, so its side runs in a network namespace of
its own (``unshare --net``), where that port is free whatever else runs on this machine.

The same virtual environment shows the name clash: aenv-ray's ``aenv`` refuses to import where
AEnvironment is installed, and so does the ``aenv`` command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.testing import RuntimeProcess
from tests._cli import aenv as run_cli
from tests._oracles import AENVIRONMENT, oracle_python

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "aenvironment"
DEMO = HERE / "demo"
CLIENT = HERE / "client.py"

# AEnvironment's server on its fixed port, and its client, in one network namespace
_NAMESPACED = """
set -u
ip link set lo up
cd "$WORK"
"$PY" -m aenv.main "$DEMO" --port 8081 --log-dir "$WORK" > "$WORK/server.log" 2>&1 &
server=$!
for _ in $(seq 1 1200); do
  (echo > /dev/tcp/127.0.0.1/8081) 2>/dev/null && break
  sleep 0.05
done
DUMMY_INSTANCE_IP=http://localhost "$PY" "$CLIENT" "$OUT" > "$WORK/client.log" 2>&1
code=$?
kill "$server"
wait "$server" 2>/dev/null
exit $code
"""


def _namespace_command() -> list[str]:
    """``unshare`` into a new network namespace (as root of a user namespace when not root)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("no unshare or ip: AEnvironment's fixed port 8081 needs a network namespace")
    command = ["unshare", "--net", "--map-root-user"]
    probe = subprocess.run([*command, "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.decode().strip()}")
    return command


def _transcript(path: Path) -> dict[str, dict[str, Any]]:
    return {record["step"]: record for record in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """(AEnvironment's transcript, aenv-ray's): both sides run at the same time."""
    python = oracle_python(AENVIRONMENT)
    command = _namespace_command()
    theirs_dir = tmp_path_factory.mktemp("aenvironment")
    ours_dir = tmp_path_factory.mktemp("aenv-ray")
    env = {
        **os.environ,
        "PY": str(python),
        "DEMO": str(DEMO),
        "CLIENT": str(CLIENT),
        "OUT": str(theirs_dir / "out.jsonl"),
        "WORK": str(theirs_dir),
    }
    oracle = subprocess.Popen([*command, "bash", "-c", _NAMESPACED], env=env)
    try:
        with RuntimeProcess(DEMO) as runtime:
            ours = subprocess.run(
                [sys.executable, str(CLIENT), str(ours_dir / "out.jsonl")],
                env={**os.environ, "DUMMY_INSTANCE_IP": runtime.url},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        assert ours.returncode == 0, ours.stderr[-3000:]
        code = oracle.wait(timeout=240)
    finally:
        if oracle.poll() is None:
            oracle.kill()
            oracle.wait()
    log = (theirs_dir / "client.log").read_text(errors="replace")[-3000:]
    assert code == 0, f"AEnvironment's run failed ({code}): {log}"
    return _transcript(theirs_dir / "out.jsonl"), _transcript(ours_dir / "out.jsonl")


# the same value on both sides
SAME_VALUE = [
    "version",
    "echo",
    "echo_namespaced",
    "run_defaults",
    "run_timeout_int",
    "text",
    "nothing",
    "after_timeout",
    "pydantic_model",
    "simple_types",
    "function",
    "function_calls",
    "reward",
    "env_info_keys",
    "openai_tools",
    "release",
    "function_after_release",
    "release_again",
    "context_manager",
]
# raised on both sides, as AEnvironment's class (aenv-ray's may be a subclass of it)
SAME_RAISE = {
    "echo_other_env": "ToolError",
    "timeout": "ToolError",
    "function_raises": "EnvironmentError",
    "function_unknown": "EnvironmentError",
    "function_bad_arguments": "EnvironmentError",
}
# an error result on both sides (its text is each project's own)
ERROR_RESULT = ["boom", "unknown_tool", "bad_argument", "missing_argument", "extra_argument"]


def _value(transcript: dict[str, dict[str, Any]], step: str) -> Any:
    if step == "env_info_keys":
        return sorted(transcript["env_info"]["value"])
    record = transcript[step]
    assert "raised" not in record, f"{step} raised: {record}"
    return record["value"]


@pytest.mark.parametrize("step", SAME_VALUE)
def test_the_same_value(transcripts: tuple[dict, dict], step: str) -> None:
    theirs, ours = transcripts
    assert _value(ours, step) == _value(theirs, step)


@pytest.mark.parametrize("step", sorted(SAME_RAISE))
def test_the_same_exception(transcripts: tuple[dict, dict], step: str) -> None:
    theirs, ours = transcripts
    expected = SAME_RAISE[step]
    assert theirs[step]["raised"][0] == expected
    assert expected in ours[step]["raised"], ours[step]
    assert "AEnvError" in ours[step]["raised"]  # aenv-ray's error tree as well


@pytest.mark.parametrize("step", ERROR_RESULT)
def test_the_same_error_result(transcripts: tuple[dict, dict], step: str) -> None:
    theirs, ours = transcripts
    assert theirs[step]["value"]["is_error"] is True
    assert ours[step]["value"]["is_error"] is True
    assert ours[step]["value"]["content"][0]["type"] == "text"


def test_initialize_and_release_succeed_on_both_sides(transcripts: tuple[dict, dict]) -> None:
    theirs, ours = transcripts
    for step in ("initialize", "initialize_again"):
        assert "raised" not in theirs[step]
        assert "raised" not in ours[step]
        assert ours[step]["value"] is True  # AEnvironment 0.1.7 returns None in local mode


def _resolve(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if isinstance(ref, str):
        resolved: dict[str, Any] = schema["$defs"][ref.rsplit("/", 1)[-1]]
        return resolved
    return prop


def test_the_same_tools_and_schemas(transcripts: tuple[dict, dict]) -> None:
    theirs, ours = transcripts
    mine = {t["name"]: t for t in ours["list_tools"]["value"]}
    assert sorted(mine) == sorted(t["name"] for t in theirs["list_tools"]["value"])
    for tool in theirs["list_tools"]["value"]:
        own = mine[tool["name"]]
        their_schema, our_schema = tool["inputSchema"], own["inputSchema"]
        assert sorted(our_schema.get("required", [])) == sorted(their_schema.get("required", []))
        assert sorted(our_schema["properties"]) == sorted(their_schema["properties"])
        for name, prop in their_schema["properties"].items():
            mine_prop = _resolve(our_schema, our_schema["properties"][name])
            if "type" in prop:
                assert mine_prop["type"] == prop["type"], (tool["name"], name)
            if "properties" in prop:  # a pydantic model: the same fields
                assert sorted(mine_prop["properties"]) == sorted(prop["properties"])
            if "default" in prop:
                assert mine_prop["default"] == prop["default"]
            if "type" not in prop and "default" in prop:
                # FastMCP leaves an unannotated parameter untyped; aenv-ray gives it the type of
                # its default (docs/migrating.md)
                kind = {int: "integer", float: "number", bool: "boolean", str: "string"}
                assert mine_prop["type"] == kind[type(prop["default"])], (tool["name"], name)
        # AEnvironment's description is the whole docstring, aenv-ray's its first part (the
        # `Args:` go to each property's description)
        if own["description"] is None:
            assert tool["description"] is None
        else:
            assert tool["description"].startswith(own["description"])


def test_the_same_functions(transcripts: tuple[dict, dict]) -> None:
    theirs, ours = transcripts
    their_listing, our_listing = theirs["list_functions"]["value"], ours["list_functions"]["value"]
    for group in ("functions", "reward"):
        assert our_listing[group] == their_listing[group], group
    # AEnvironment lists its own default health handler beside the environment's
    their_health = {h["name"]: h for h in their_listing["health"]}
    for health in our_listing["health"]:
        assert health == their_health[health["name"]]
    listed = sum(len(our_listing[g]) for g in ("functions", "reward", "health"))
    assert our_listing["total"] == listed


def test_the_same_health_envelope(transcripts: tuple[dict, dict]) -> None:
    theirs, ours = transcripts
    for transcript in (theirs, ours):
        answer = transcript["health"]["value"]
        assert answer["success"] is True
        assert answer["data"]["status"] in ("healthy", "success")
    # AEnvironment 0.1.7 answers with its default handler, which shadows the environment's own
    # health check; aenv-ray runs the environment's
    assert ours["health"]["value"]["data"] == {"status": "healthy", "calls": 3}


def test_env_info_names_the_environment_and_its_runtime(transcripts: tuple[dict, dict]) -> None:
    theirs, ours = transcripts
    mine = ours["env_info"]["value"]
    assert mine["name"] == theirs["env_info"]["value"]["name"] == "aenv-demo@1.0.0"
    assert mine["status"] == theirs["env_info"]["value"]["status"] == "Running"
    assert mine["ip"].startswith("http://127.0.0.1:")  # the runtime's URL


# -- the name clash ------------------------------------------------------------------------------


def test_aenv_refuses_to_import_beside_aenvironment() -> None:
    python = oracle_python(AENVIRONMENT)
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import aenv"
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "ImportError: AEnvironment (the `aenvironment` package, 0.1.7) is installed" in (
        done.stderr
    )
    assert "pip uninstall aenvironment" in done.stderr
    # AEnvironment's own package is untouched: its SDK imports where aenv-ray's is not first
    theirs = subprocess.run(
        [str(python), "-c", "import aenv; print(aenv.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=python.parent,
    )
    assert theirs.returncode == 0, theirs.stderr
    assert "site-packages" in theirs.stdout


# `--version` and the help are answered before typer is imported (aenv_cli._fast): the check too
@pytest.mark.parametrize("args", [["version"], ["--version"], ["--help"]])
def test_the_aenv_command_refuses_to_run_beside_aenvironment(
    tmp_path: Path, args: list[str]
) -> None:
    python = oracle_python(AENVIRONMENT)
    # AEnvironment's installed metadata, and nothing else of it, on this interpreter's path
    site = next(Path(python).parent.parent.glob("lib/python*/site-packages"))
    meta = next(site.glob("aenvironment-*.dist-info"))
    shutil.copytree(meta, tmp_path / meta.name)
    done = run_cli("version", env={"PYTHONPATH": str(tmp_path)})  # PYTHONPATH: on sys.path
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        "aenv: error: AEnvironment (the `aenvironment` package, 0.1.7) is installed"
    )
    assert "pip uninstall aenvironment" in done.stderr
