"""``pip install aenv-ray``, bare, in a fresh virtual environment: what it brings works, and what
it leaves out says which extra brings it.

One test (about a minute: it installs the session's wheel (``uv build``, the ``built_wheel``
fixture) with ``uv pip install`` from the configured index into a new virtual environment under
a temporary directory, and starts a local-engine instance there). It runs README.md's SDK
example, as README says: ``aenv init notes``, README's ``notes/src/notes.py``,
``AENV_ENV_PATH=. python agent.py`` on the embedded local engine. Then, in that environment:
importing ``rollout``, ``envhub`` and ``k8s_backend`` fails with the one line naming their
extra, as does ``aenv rollout`` (exit status 1), and pytest is not installed (it is no
dependency of the SDK).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests._wheel import ROOT, clean_env, new_venv, run, uv

README = ROOT / "README.md"

# run in the bare environment: each optional package, imported; what it raised, as JSON
PROBE = """
import importlib, importlib.util, json
out = {"pytest": importlib.util.find_spec("pytest") is not None}
for name in ("rollout", "envhub", "k8s_backend"):
    try:
        importlib.import_module(name)
        out[name] = None
    except ImportError as exc:
        out[name] = [type(exc).__name__, str(exc), getattr(exc, "extra", None)]
print(json.dumps(out))
"""


def _readme_block(marker: str) -> str:
    """The fenced block that follows the HTML comment ``marker`` in README.md."""
    text = README.read_text(encoding="utf-8")
    found = re.search(re.escape(marker) + r"\s*\n```[a-z]*\n(.*?)\n```", text, re.S)
    assert found is not None, f"README.md has no block after {marker}"
    return found.group(1) + "\n"


@pytest.mark.timeout(900)
def test_the_bare_wheel_runs_the_readme_sdk_example_and_names_each_missing_extra(
    built_wheel: Path, tmp_path: Path
) -> None:
    env = clean_env(tmp_path)

    # the wheel (pyproject.toml's build backend), installed bare (no extra) into a new virtual
    # environment of this Python
    venv = tmp_path / "venv"
    python = new_venv(venv, env)
    install = [uv(), "pip", "install", "--quiet", "--python", str(python), str(built_wheel)]
    run(install, env=env, cwd=tmp_path)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    # README's SDK example, as README says to run it
    work = tmp_path / "work"
    work.mkdir()
    run([str(venv / "bin" / "aenv"), "init", "notes"], env=env, cwd=work)
    notes = _readme_block("<!-- file: notes/src/notes.py -->")
    (work / "notes" / "src" / "notes.py").write_text(notes, encoding="utf-8")
    (work / "agent.py").write_text(_readme_block("<!-- setup: notes-project -->"), "utf-8")
    output = run([str(python), "agent.py"], env={**env, "AENV_ENV_PATH": "."}, cwd=work)
    lines = output.splitlines()
    assert len(lines) == 4, output
    assert "'notes@1.0.0/add_note'" in lines[0]
    assert lines[1].startswith("False [{'type': 'text'")
    assert "buy milk" in lines[1]
    assert lines[2] == "1.0"
    assert "'function'" in lines[3]
    assert "add_note" in lines[3]

    # what the bare install leaves out: one line each, naming the extra
    probe = json.loads(run([str(python), "-c", PROBE], env=env, cwd=work))
    assert probe["pytest"] is False, "pytest must not come with the SDK"
    for module, extra in (("rollout", "ray"), ("envhub", "hub"), ("k8s_backend", "kubernetes")):
        kind, message, named = probe[module]
        assert kind == "MissingExtraError", probe[module]
        assert named == extra
        assert "\n" not in message
        assert message.startswith(f"aenv-ray: {module}"), message
        assert f"needs the '{extra}' extra: pip install 'aenv-ray[{extra}]'" in message

    # uncaught, the line is the last one Python prints
    bare = subprocess.run(
        [str(python), "-c", "import rollout"], env=env, cwd=work, capture_output=True, text=True
    )
    assert bare.returncode == 1
    assert bare.stderr.splitlines()[-1].startswith(
        "aenv_ray.errors.MissingExtraError: aenv-ray: rollout needs the 'ray' extra: "
        "pip install 'aenv-ray[ray]'"
    ), bare.stderr

    # the CLI: the same line, once, and a failure exit status
    cli = subprocess.run(
        [str(venv / "bin" / "aenv"), "rollout", "notes@1.0.0", "--episodes", "1"],
        env={**env, "AENV_ENV_PATH": "."},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 1, (cli.stdout, cli.stderr)
    assert "Traceback" not in cli.stderr
    assert cli.stderr.strip().splitlines()[-1] == f"aenv: error: {probe['rollout'][1]}", cli.stderr

    # `aenv ui` without the `ui` extra (plotly, whose plotly.min.js it serves): the same way
    ui = subprocess.run(
        [str(venv / "bin" / "aenv"), "ui", str(work)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ui.returncode == 1, (ui.stdout, ui.stderr)
    assert ui.stderr.strip().splitlines()[-1] == (
        "aenv: error: aenv-ray: aenv ui (its charts: plotly.js) needs the 'ui' extra: "
        "pip install 'aenv-ray[ui]' (from a checkout: pip install -e '.[ui]'); plotly not installed"
    ), ui.stderr
