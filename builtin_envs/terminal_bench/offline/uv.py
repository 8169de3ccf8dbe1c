"""uv, offline: what terminal-bench@1.0.0's test runs use for ``uv`` (see docs/builtins.md).

A task's ``run-tests.sh`` installs uv and pytest from the network, then runs pytest through uv.
The instance has no network, so this stands in for the commands such scripts use, with the
Python that serves the instance (``$TB_PYTHON``), whose pytest is one of aenv-ray's
dependencies:

- ``uv init``: a ``pyproject.toml``, ``main.py``, ``README.md`` and ``.python-version`` in the
  working directory, as uv writes them (exit 2 when a project is already there);
- ``uv add REQ...`` and ``uv pip install REQ...``: succeed when each requirement is installed,
  saying which version is used when it is not the one asked for; fail (exit 1) otherwise;
- ``uv venv [DIR]``: ``DIR/bin/activate`` that puts ``python`` and ``pytest`` on ``PATH``;
- ``uv run pytest ARGS``: pytest, as its console script runs it (plugins other than pytest's
  own are not loaded: a fresh environment has none); ``uv run python ARGS``, ``uv run CMD``.

Run as a script by ``uv/uv`` (``-I -S``: it starts in a few milliseconds; the site-packages
are added when a command needs them); standard library only, imported where a command needs
it (a test run starts ``uv`` three times: ``re`` and ``pathlib`` alone would double each
start), pytest lazily.
"""

from __future__ import annotations

import os
import sys

VERSION = "uv 0.7.13 (aenv-ray offline)"
_REQUIREMENT = r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _name(directory: str) -> str:
    """The project's name: the directory's, each run of other characters than letters, digits,
    ``.``, ``_`` and ``-`` made one ``-``, lower case."""
    kept: list[str] = []
    replaced = False
    for char in os.path.basename(directory):
        if char in _NAME_CHARS:
            kept.append(char)
            replaced = False
        elif not replaced:
            kept.append("-")
            replaced = True
    return "".join(kept).strip("-").lower() or "project"


def init(args: list[str]) -> int:
    """``uv init [DIR]``: a project in DIR (default: the working directory)."""
    where = next((a for a in args if not a.startswith("-")), ".")
    os.makedirs(where, exist_ok=True)
    directory = os.path.realpath(where)
    if os.path.exists(os.path.join(directory, "pyproject.toml")):
        _say(
            f"error: Project is already initialized in `{directory}` (`pyproject.toml` file exists)"
        )
        return 2
    name = _name(directory)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    _write(
        os.path.join(directory, "pyproject.toml"),
        "[project]\n"
        f'name = "{name}"\n'
        'version = "0.1.0"\n'
        'description = "Add your description here"\n'
        'readme = "README.md"\n'
        f'requires-python = ">={python}"\n'
        "dependencies = []\n",
    )
    if not os.path.exists(os.path.join(directory, "main.py")):
        _write(
            os.path.join(directory, "main.py"),
            f'def main():\n    print("Hello from {name}!")\n\n\n'
            'if __name__ == "__main__":\n    main()\n',
        )
    for file, text in (("README.md", ""), (".python-version", f"{python}\n")):
        if not os.path.exists(os.path.join(directory, file)):
            _write(os.path.join(directory, file), text)
    here = os.path.normpath(where) == "."
    _say(f"Initialized project `{name}`" + ("" if here else f" at `{directory}`"))
    return 0


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _site() -> None:
    """This Python's site-packages on ``sys.path`` (uv runs without them, to start fast), and
    the instance's pytest's (``TB_SITE_PACKAGES``)."""
    import site

    if sys.flags.no_site:
        site.main()
    extra = os.environ.get("TB_SITE_PACKAGES")
    if extra and extra not in sys.path:  # where the instance's pytest is, when not in site
        sys.path.append(extra)


def _versions() -> dict[str, str]:
    """``{normalized name: version}`` of what this Python has installed (its dist-info)."""
    _site()
    found: dict[str, str] = {}
    for directory in sys.path:
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for entry in names:
            if entry.endswith((".dist-info", ".egg-info")) and "-" in entry:
                name, _, version = entry.rsplit(".", 1)[0].partition("-")
                found.setdefault(_normalized(name), version)
    return found


def _normalized(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "_", name).lower()


def _installed(requirements: list[str]) -> tuple[list[str], list[str]]:
    """``(lines saying what is used, requirements not installed)``."""
    import re

    versions = _versions()
    used, missing = [], []
    for requirement in requirements:
        match = re.fullmatch(_REQUIREMENT, requirement)
        version = versions.get(_normalized(match.group(1))) if match else None
        if match is None or version is None:
            missing.append(requirement)
            continue
        name, wanted = match.group(1), match.group(3).strip()
        note = ""
        if wanted.startswith("==") and wanted[2:].strip() != version:
            note = f" (offline: {requirement} was asked for; this Python has {version})"
        used.append(f" + {name}=={version}{note}")
    return used, missing


def add(args: list[str], *, record: bool) -> int:
    """``uv add REQ...`` (``record``: into ``pyproject.toml``) and ``uv pip install REQ...``."""
    requirements = [a for a in args if not a.startswith("-")]
    used, missing = _installed(requirements)
    if missing:
        _say(
            f"error: cannot install {', '.join(missing)}: aenv-ray's offline uv has no network, "
            f"and {sys.executable} does not have it"
        )
        return 1
    if record and os.path.exists("pyproject.toml"):
        with open("pyproject.toml") as handle:
            text = handle.read()
        listed = ", ".join(f'"{r}"' for r in requirements)
        _write("pyproject.toml", text.replace("dependencies = []", f"dependencies = [{listed}]", 1))
    _say(f"Resolved {len(used)} packages (offline: the instance's Python)")
    for line in used:
        _say(line)
    return 0


def venv(args: list[str]) -> int:
    """``uv venv [DIR]``: an ``activate`` script that puts this Python and pytest on PATH."""
    from pathlib import Path

    where = Path(next((a for a in args if not a.startswith("-")), ".venv")).resolve()
    (where / "bin").mkdir(parents=True, exist_ok=True)
    offline = os.environ.get("TB_OFFLINE", str(Path(__file__).parent))
    (where / "bin" / "activate").write_text(
        f'VIRTUAL_ENV="{where}"\nexport VIRTUAL_ENV\nPATH="{offline}/venv-bin:$PATH"\nexport PATH\n'
    )
    _say(f"Using {sys.executable} (offline)\nCreating virtual environment at: {where}")
    return 0


def _warm_pytest(fd: int, args: list[str]) -> int | None:
    """pytest started by the instance's warm pytest (it imported pytest once for every run),
    with this process's descriptors, directory and environment; its exit status. None when it
    cannot be asked (then pytest runs here)."""
    import json
    import socket

    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    request = {"argv": args, "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask}
    with sock:
        try:
            socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
        except OSError:
            return None
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                _say("error: the instance's pytest ended before the tests did")
                return 3
            reply += chunk
    return int(json.loads(reply)["code"])


def run(args: list[str]) -> int:
    """``uv run CMD ARGS``: pytest in this process, python and other commands by exec."""
    while args and args[0].startswith("-"):
        args = args[1:]
    if not args:
        _say("error: `uv run` needs a command")
        return 2
    command, rest = args[0], args[1:]
    if command == "pytest":
        warm = os.environ.get("TB_PYTEST_FD", "")
        if warm.isdigit():
            code = _warm_pytest(int(warm), rest)
            if code is not None:
                return code
        os.environ.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        sys.argv = ["pytest", *rest]
        _site()
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:1] = [os.path.dirname(sys.executable), *extra]  # as its console script has it
        import pytest

        return int(pytest.main())
    if command in ("python", "python3"):
        os.execv(sys.executable, [sys.executable, *rest])
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.execvp(command, [command, *rest])
    return 127  # not reached


def main(argv: list[str]) -> int:
    """Dispatch ``uv ARGS``."""
    if not argv or argv[0] in ("--version", "-V", "version", "self"):
        print(VERSION)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "init":
        return init(rest)
    if command == "add":
        return add(rest, record=True)
    if command == "pip" and rest[:1] == ["install"]:
        return add(rest[1:], record=False)
    if command == "venv":
        return venv(rest)
    if command == "run":
        return run(rest)
    _say(f"error: aenv-ray's offline uv cannot `uv {command}` (it has no network)")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
