"""The smaller points a new user met (issue 25, point 8), one test each: help and tables in a
pipe are never cut, flags show no ``<bool>`` and help no RST markup; one command for instances;
"did you mean" only for a close name; ``aenv rollout`` asks for what is missing; no double slash
in a load error's paths; a config.json note printed once; docs/index.md tells what is there.
(``aenv build`` with no image builder: tests/test_bundle.py.) The CLI runs in this process
(tests/_cli.py), whose stdout is no terminal, as a pipe."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from aenv_cli._app import _for_output, app
from aenv_ray.loadcheck import scrub_paths
from builtin_envs import builtin_refs
from tests._cli import CHILD, environment
from tests._cli import aenv as run_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def user(tmp_path: Path) -> dict[str, str]:
    """A user without a hub (no URL, no settings file), with a state directory of their own."""
    return {
        "AENV_SYSTEM_URL": "",
        "AENV_CONFIG_FILE": str(tmp_path / "no-config.json"),
        "AENV_STATE_DIR": str(tmp_path / "state"),
        "AENV_ENV_PATH": "",
    }


def aenv(
    *args: str | Path, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=env)


def one_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one ``aenv: error:`` line of a failed command."""
    assert result.returncode == code, (result.args, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aenv: error: ")
    return lines[0]


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the app under ``command``, with its path (``("instance", "list")``)."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def project(parent: Path, name: str, config: dict[str, Any] | None = None) -> Path:
    root = parent / name
    (root / "src").mkdir(parents=True)
    (root / "config.json").write_text(
        json.dumps({"name": name, "version": "1.0.0", **(config or {})})
    )
    (root / "src" / f"{name}_tools.py").write_text(
        "from aenv_ray import register_tool\n\n\n@register_tool\n"
        "def where() -> str:\n    return 'here'\n"
    )
    return root


# -- help and tables: never cut in a pipe ---------------------------------------------------------


def test_help_in_a_pipe_is_plain_wrapped_and_never_cut() -> None:
    # rich laid it out for 80 columns: `an OpenAI-compatib…`, `--no-retry-fai…`, and its
    # markup ate `[@VERSION]`; click's plain help wraps words instead
    done = aenv("rollout", "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    flat = " ".join(text.split())
    assert "an OpenAI-compatible endpoint" in flat
    assert "--retry-failed / --no-retry-failed" in flat
    assert "environment NAME[@VERSION]" in flat
    assert "…" not in text
    assert "╭" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    (logprobs,) = [line for line in text.splitlines() if "--logprobs" in line]
    assert "<bool>" not in logprobs
    assert "ask --model" in logprobs


def test_every_groups_help_in_a_pipe_is_whole() -> None:
    # the commands' summaries in a group's list are whole (click would end them with `...`)
    root = typer.main.get_command(app)
    for path, command in commands(root):
        if command.hidden or not getattr(command, "commands", None):
            continue  # a command's own help: rollout's above
        done = aenv(*path, "--help")
        assert done.returncode == 0, (path, done.stderr)
        assert "<bool>" not in done.stdout, path
        assert "…" not in done.stdout, path
        flat = _flat(done.stdout)
        for name, sub in getattr(command, "commands", {}).items():
            if sub.hidden or not sub.help:
                continue
            summary = _flat(sub.help.split("\n\n")[0])
            assert summary in flat, (path, name, summary)
            assert not re.search(rf"\n  {re.escape(name)} .*\.\.\.\n", done.stdout), (path, name)


def _flat(text: str) -> str:
    """``text`` on one line, as wrapped text reads (click breaks lines after a hyphen too)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def test_help_on_a_terminal_is_rich_with_brackets_kept_and_no_bool() -> None:
    # on a terminal typer's panels stay (here: rendered as on a 200-column terminal)
    command = typer.main.get_command(app)
    _for_output(command, terminal=True)
    out = io.StringIO()
    with environment({"COLUMNS": "200"}, unset=["TERMINAL_WIDTH"]), contextlib.redirect_stdout(out):
        command.main(["rollout", "--help"], prog_name="aenv", standalone_mode=False)
    text = out.getvalue()
    assert "╭─ Options" in text
    assert "environment NAME[@VERSION]" in text
    (logprobs,) = [line for line in text.splitlines() if "--logprobs" in line]
    assert "<bool>" not in logprobs
    (helps,) = [line for line in text.splitlines() if "Show this message" in line]
    assert "<bool>" not in helps
    assert "<int range>" in text  # what takes a value still says what


def test_no_help_text_carries_rst_markup() -> None:
    # the commands' docstrings are their --help: ``literal`` and :class:`X` would show as typed
    markup = re.compile(r"``|:[a-z]+:`|^\.\. ", re.MULTILINE)
    root = typer.main.get_command(app)
    for path, command in commands(root):
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        for text in texts:
            assert not markup.search(text), (path, text)
    shown = aenv("config", "set", "--help").stdout
    assert "(`url`)" in shown
    assert "``" not in shown


def test_a_table_in_a_pipe_keeps_every_cell_whole(tmp_path: Path, user: dict[str, str]) -> None:
    # `aenv list` without a hub: the project's path, far longer than 80 columns, on one line
    deep = tmp_path / ("a-directory-with-a-long-name-" * 3) / "envs"
    about = "a description that goes on and on, longer than sixty characters, and is kept whole"
    root = project(deep, "longpath", {"description": about})
    done = aenv("list", **{**user, "AENV_ENV_PATH": str(deep)})
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.split()[:1] == ["longpath"]]
    assert str(root) in row
    assert about in row
    assert len(row) > 80
    assert "…" not in done.stdout


# -- one command for instances -------------------------------------------------------------------


def test_instances_is_a_hidden_spelling_of_instance_list() -> None:
    top = aenv("--help").stdout
    listed = [line.split()[0] for line in top.splitlines() if re.match(r"  [a-z]", line)]
    assert "instance" in listed
    assert "instances" not in listed
    # AEnvironment's scripts still run it (docs/migrating.md): its options are parsed as before
    shown = aenv("instances", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "aenv instance list" in " ".join(shown.stdout.split())
    assert "--version needs --name" in one_error(aenv("instances", "--version", "1.0.0"))


# -- did you mean: only a close name ---------------------------------------------------------------


def test_did_you_mean_only_for_a_close_name(tmp_path: Path, user: dict[str, str]) -> None:
    far = one_error(aenv("rollout", "notes@1.0.0", "--no-ray", "-o", tmp_path / "o", **user))
    assert "no environment `notes@1.0.0`" in far
    assert "did you mean" not in far  # every built-in shares `@1.0.0`; none is named like it
    close = one_error(
        aenv("rollout", "mini-termnal@1.0.0", "--no-ray", "-o", tmp_path / "o", **user)
    )
    assert "did you mean `mini-terminal@1.0.0`?" in close
    other_version = one_error(
        aenv("rollout", "tau2@9.0.0", "--no-ray", "-o", tmp_path / "o", **user)
    )
    assert "did you mean `tau2@1.0.0`?" in other_version


# -- aenv rollout: what is missing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "missing", "not_asked"),
    [
        (["--tasks", "tasks.jsonl"], "--policy MODULE:CALLABLE (or --base-url/--model)", "--tasks"),
        (["--policy", "pol:policy"], "--tasks FILE", "--policy"),
        ([], "--policy MODULE:CALLABLE (or --base-url/--model) and --tasks FILE", None),
    ],
)
def test_rollout_of_a_project_names_only_what_is_missing(
    tmp_path: Path, user: dict[str, str], given: list[str], missing: str, not_asked: str | None
) -> None:
    project(tmp_path, "mine")
    (tmp_path / "tasks.jsonl").write_text('{"x": 1}\n')
    done = aenv("rollout", "./mine", *given, "--no-ray", "-o", "out", cwd=tmp_path, **user)
    line = one_error(done)
    assert line.endswith(f"so it has no demo policy or tasks: pass {missing}")
    if not_asked is not None:
        assert not_asked not in line.split("pass ", 1)[1]


def test_rollout_tasks_that_are_a_directory_are_one_line(
    tmp_path: Path, user: dict[str, str]
) -> None:
    line = one_error(
        aenv(
            "rollout",
            "mini-terminal",
            "--tasks",
            tmp_path,
            "--no-ray",
            "-o",
            "out",
            cwd=tmp_path,
            **user,
        )
    )
    assert f"cannot read the tasks file {tmp_path}: Is a directory" in line


# -- paths in errors: one slash ------------------------------------------------------------------


def test_a_load_error_told_below_a_directory_has_no_double_slash(tmp_path: Path) -> None:
    # rollout's precheck tells a project's files below `PROJECT/` (rollout/precheck.py)
    message = f"importing {tmp_path}/src/a.py failed at {tmp_path}/src/a.py:3"
    told = scrub_paths(message, {str(tmp_path): f"{tmp_path}/"})
    assert told == message
    assert "//" not in scrub_paths(message, {str(tmp_path): "./mine/"})


# -- config.json notes: once ---------------------------------------------------------------------


@pytest.mark.process  # the load check's sandbox is a process: its stderr is the command's
def test_a_config_note_is_printed_once_by_build(tmp_path: Path, user: dict[str, str]) -> None:
    # subprocess: the subject is what a fresh process and its zygote print on one stderr (in
    # this process, what earlier tests did to the logging tree could hide the note)
    root = project(tmp_path, "noted", {"deployConfig": {"service": {"port": 9000}}})
    done = subprocess.run(
        [*CHILD, "build", str(root), "--no-image"],
        env={**os.environ, **user},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("deployConfig.service.port is not used by aenv-ray") == 1, done.stderr


# -- docs/index.md -------------------------------------------------------------------------------


def test_the_index_tells_what_is_there() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    assert "not there yet" not in index
    for ref in builtin_refs():
        assert f"`{ref}`" in index, ref
    assert "| `k8s_backend` |" in index
    assert "being built" not in index
