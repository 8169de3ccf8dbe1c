"""The ``aenv`` command line as a new user runs it: parsing, output and exit codes in this process
(tests/_cli.py); ``aenv run`` as a server in a subprocess (the console script: it serves until a
signal stops it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aenv_ray import Environment
from aenv_ray.testing import free_port

from ._cli import aenv as run_cli
from ._cli import imported_by as _imported_by
from .conftest import PROBE

AENV = str(Path(sys.executable).with_name("aenv"))


def aenv(
    *args: str, cwd: Path | None = None, fds: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process; ``env`` entries override the environment's."""
    return run_cli(*args, cwd=cwd, env=env, fds=fds)


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            _, err = process.communicate()
            raise AssertionError(f"aenv run exited with {process.returncode}: {err}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    raise AssertionError(f"{url} did not become healthy in {timeout} s")


@contextmanager
def served(*args: str, cwd: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """``aenv run ARGS`` in the background, a subprocess: a server stopped by a signal."""
    process = subprocess.Popen(
        [AENV, "run", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def stop(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


# -- help ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["--help"], ["-h"]])
def test_bare_aenv_and_help_print_the_commands(command: list[str]) -> None:
    result = aenv(*command)
    assert result.returncode == 0, result.stderr
    for name in ("init", "run", "test"):
        assert name in result.stdout


@pytest.mark.parametrize("command", ["init", "run", "test"])
def test_every_command_has_help(command: str) -> None:
    result = aenv(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"aenv {command}" in result.stdout
    assert "Usage" in result.stdout


def test_version() -> None:
    from aenv_ray import __version__

    result = aenv("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"aenv-ray {__version__}"


def test_version_is_answered_without_typer() -> None:
    from aenv_ray import __version__

    result, imported = _imported_by("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"aenv-ray {__version__}\n"
    assert "aenv_cli" in imported  # the check sees the CLI's own imports
    assert not {m for m in imported if m.split(".")[0] in ("typer", "rich", "pydantic")}


def test_help_is_rendered_once_then_answered_without_typer(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "80"}
    kept = tmp_path / "cache" / "aenv-ray" / "help"
    first, imported = _imported_by("--help", **env)
    assert first.returncode == 0, first.stderr
    assert "typer" in imported  # rendered by the app, as before
    assert [p.read_text() for p in kept.glob("*.txt")] == [first.stdout]
    again, imported = _imported_by("--help", **env)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert not {m for m in imported if m.split(".")[0] in ("typer", "rich")}
    assert "aenv_cli._app" not in imported
    # the same text for -h and a bare aenv, as the app prints it
    assert aenv("-h", **env).stdout == aenv(**env).stdout == first.stdout
    # another width is another rendering: the app renders it again, at that width
    narrow = aenv("--help", **{**env, "COLUMNS": "60"})
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 60
    assert max(len(line) for line in first.stdout.splitlines()) > 60
    assert len(list(kept.glob("*.txt"))) == 4  # --help, -h, bare, and --help at 60


def test_help_without_a_writable_cache_is_rendered_each_time(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    for _ in range(2):
        result = aenv("--help", XDG_CACHE_HOME=str(blocked), COLUMNS="80")
        assert result.returncode == 0, result.stderr
        assert "Usage: aenv [OPTIONS] COMMAND [ARGS]..." in result.stdout
        assert not result.stderr


# -- usage mistakes: one line, exit 2 ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["bogus"], "no such command"),
        (["run", "--bogus"], "no such option: --bogus"),
        (["init"], "missing argument 'NAME'"),
        (["init", "bad name"], "`bad name` must start with a letter or digit"),
        (["run", "/nonexistent/project"], "'/nonexistent/project' does not exist"),
        (["run", str(PROBE), "--port", "many"], "'--port': Input should be a valid integer"),
        (["run", str(PROBE), "--port", "70000"], "'--port': Input should be less than or equal"),
        (["run", str(PROBE), "--default-timeout", "0"], "must be a positive number"),
        (["test", str(PROBE), "extra"], "unexpected extra argument"),
    ],
)
def test_usage_mistakes_are_one_line_and_exit_2(args: list[str], expected: str) -> None:
    result = aenv(*args)
    assert result.returncode == 2, result
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aenv: error: ")
    assert expected in lines[0]
    assert "--help'" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_broken_project_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    project = tmp_path / "broken"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"name": "broken", "version": "1.0.0"}')
    (project / "src" / "tools.py").write_text(
        "from aenv_ray import register_tool\n\n@register_tool\ndef bad(x):\n    return x\n"
    )
    for command in ("run", "test"):
        result = aenv(command, str(project))
        assert result.returncode == 2, result
        (line,) = error_lines(result)
        if command == "run":
            assert "tools.py:3" in line  # where the decorated definition starts
            assert "`x`" in line
        else:
            assert "testConfig.script" in line  # no script configured: say how to add one


def test_a_bad_config_json_is_a_usage_error(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "config.json").write_text('{"name": "p", "version": ')
    result = aenv("run", str(project))
    assert result.returncode == 2, result
    (line,) = error_lines(result)
    assert "config.json" in line


def test_init_refuses_an_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    result = aenv("init", "taken", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = error_lines(result)
    assert "already exists" in line
    assert "--force" in line
    assert list((tmp_path / "taken").iterdir()) == []


def test_run_on_a_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = aenv("run", str(PROBE), "--port", str(port), "--mcp-port", str(free_port()))
    assert result.returncode == 1, result
    (line,) = error_lines(result)
    assert line.startswith("aenv: error: ")
    assert "in use" in line.lower()


# -- aenv test -----------------------------------------------------------------------------------


def test_aenv_test_exits_with_the_scripts_code(tmp_path: Path) -> None:
    result = aenv("init", "scripted", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config_path = tmp_path / "scripted" / "config.json"
    config = json.loads(config_path.read_text())
    config["testConfig"]["script"] = 'echo "in $(basename $PWD) with $(command -v python)"; exit 7'
    config_path.write_text(json.dumps(config))
    result = aenv("test", "scripted", cwd=tmp_path, fds=True)  # the script writes to fd 1
    assert result.returncode == 7
    # the script runs in the project directory, with aenv's own Python first on PATH
    assert result.stdout.strip() == f"in scripted with {Path(sys.executable).parent}/python"


# -- a new user's first ten minutes --------------------------------------------------------------


async def test_init_test_run_call_stop(tmp_path: Path) -> None:
    created = aenv("init", "notes", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    root = tmp_path / "notes"
    for name in ("config.json", "Dockerfile", "README.md", "requirements.txt"):
        assert (root / name).is_file()
    assert (root / "src" / "notes.py").is_file()
    assert json.loads((root / "config.json").read_text())["name"] == "notes"

    tested = aenv("test", "notes", cwd=tmp_path, fds=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout

    port, mcp_port = free_port(), free_port()
    with served("notes", "--port", str(port), "--mcp-port", str(mcp_port), cwd=tmp_path) as proc:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        os.environ["DUMMY_INSTANCE_IP"] = f"http://127.0.0.1:{port}"
        try:
            async with Environment("notes@1.0.0") as env:
                tools = await env.list_tools()
                saved = await env.call_tool("add_note", {"text": "buy milk"})
                reward = await env.call_reward({"expected": "milk"})
                health = await env.check_health()
        finally:
            del os.environ["DUMMY_INSTANCE_IP"]
        code, out, err = stop(proc)
    assert [tool["name"] for tool in tools] == ["notes@1.0.0/add_note"]
    assert saved.structured == {"saved": "buy milk", "count": 1}
    assert reward == 1.0
    assert health["notes"] == 1
    assert code == 0, err
    assert "serving notes@1.0.0" in out
    assert f"http://127.0.0.1:{mcp_port}/mcp" in out
    assert "Traceback" not in err


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_default_ports_are_the_seeds_8080_and_8081() -> None:
    if not (_port_is_free(8080) and _port_is_free(8081)):
        pytest.skip("something else on this machine listens on 8080 or 8081")
    from fastmcp import Client

    with served(str(PROBE), "--quiet") as proc:
        wait_healthy("http://127.0.0.1:8080", proc)
        os.environ["DUMMY_INSTANCE_IP"] = "http://localhost"
        try:
            async with Environment("probe@0.1.0") as env:
                echoed = await env.call_tool("echo", {"text": "local mode"})
                mcp_url = env.mcp_url
        finally:
            del os.environ["DUMMY_INSTANCE_IP"]
        assert mcp_url == "http://localhost:8081/mcp"
        async with Client(mcp_url) as client:
            via_mcp = await client.call_tool("echo", {"text": "over mcp"})
        code, out, _ = stop(proc)
    assert echoed.text == "local mode"
    assert via_mcp.content[0].text == "over mcp"  # type: ignore[union-attr]
    assert code == 0
    assert out == ""  # --quiet: no banner


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("4K", 4096), ("4kb", 4096), ("64M", 64 << 20), ("2 GB", 2 << 30), ("7b", 7)],
)
def test_serve_reads_sizes_in_bytes_kib_mib_and_gib(text: str, size: int) -> None:
    import typer

    from aenv_cli._serve import _size

    assert _size(text) == size
    with pytest.raises(typer.BadParameter, match="is not a size"):
        _size(text + "x")
