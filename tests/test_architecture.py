"""The dependency direction of the packages, checked by walking imports with ``ast``.

The rules are the "May import" lines of each package's docstring (and docs/style.md's table).
Imports inside a function body are lazy: they are allowed where a rule below says so.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["aenv_ray", "sandbox_runtime", "envhub", "k8s_backend", "rollout", "builtin_envs"]


@dataclass(frozen=True)
class Import:
    module: str  # the importing file, as a dotted name
    target: str  # what it imports
    top_level: bool  # at module level (runs at import time), not inside a function
    line: int


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[Import] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(_dotted(path), alias.name, top, child.lineno))
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append(Import(_dotted(path), child.module, top, child.lineno))
            visit(child, inner)

    visit(tree, True)
    return found


def _all_imports() -> list[Import]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    files += list((ROOT / "examples").glob("*.py"))
    return [imp for path in files for imp in _imports(path)]


def _root(name: str) -> str:
    return name.split(".", 1)[0]


IMPORTS = _all_imports()


def _violations(rule: str, bad: list[Import]) -> str:
    return f"{rule}:\n" + "\n".join(f"  {i.module}:{i.line} imports {i.target}" for i in bad)


def test_the_walker_sees_lazy_and_top_level_imports() -> None:
    lazy = [
        i for i in IMPORTS if i.module == "aenv_ray.engine" and i.target == "sandbox_runtime.local"
    ]
    assert lazy
    assert not lazy[0].top_level
    top = [i for i in IMPORTS if i.module == "sandbox_runtime.server" and i.target == "uvicorn"]
    assert top
    assert top[0].top_level


def test_only_rollout_imports_ray_and_gymnasium() -> None:
    bad = [
        i
        for i in IMPORTS
        if _root(i.target) in ("ray", "gymnasium") and _root(i.module) != "rollout"
    ]
    assert not bad, _violations("ray and gymnasium belong to rollout", bad)


def test_only_k8s_backend_imports_kubernetes() -> None:
    bad = [
        i for i in IMPORTS if _root(i.target) == "kubernetes" and _root(i.module) != "k8s_backend"
    ]
    assert not bad, _violations("kubernetes belongs to k8s_backend (engines are injected)", bad)


def test_sandbox_runtime_stays_below_the_control_plane_and_rollout() -> None:
    bad = [
        i
        for i in IMPORTS
        if _root(i.module) == "sandbox_runtime"
        and _root(i.target) in ("ray", "kubernetes", "envhub", "rollout", "gymnasium")
    ]
    assert not bad, _violations("sandbox_runtime must not import the layers above it", bad)


def test_the_sdk_does_not_import_the_runtime_at_import_time() -> None:
    # aenv_ray may reach the runtime lazily: the CLI's commands, the test helpers, and the
    # embedded default engine and built-in lookup (inside functions)
    allowed_anywhere = ("aenv_ray.cli", "aenv_ray.testing")
    bad = [
        i
        for i in IMPORTS
        if _root(i.module) == "aenv_ray"
        and _root(i.target) in ("sandbox_runtime", "builtin_envs")
        and not i.module.startswith(allowed_anywhere)
        and i.top_level
    ]
    assert not bad, _violations("aenv_ray imports sandbox_runtime only lazily", bad)


def test_environments_and_examples_use_public_names_only() -> None:
    bad = [
        i
        for i in IMPORTS
        if (_root(i.module) in ("builtin_envs", "examples"))
        and _root(i.target) in ("aenv_ray", "sandbox_runtime")
        and any(part.startswith("_") for part in i.target.split(".")[1:])
    ]
    assert not bad, _violations("user-facing code imports no private module", bad)


def test_importing_the_sdk_stays_light() -> None:
    code = (
        "import sys, aenv_ray, aenv_ray.cli;"
        "heavy = ['ray', 'kubernetes', 'gymnasium', 'fastmcp', 'uvicorn', 'sandbox_runtime'];"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_say_what_they_own_and_may_import(package: str) -> None:
    module = importlib.import_module(package)
    doc = module.__doc__ or ""
    assert doc.split("\n", 1)[0].startswith(f"{package}:"), doc[:80]
    assert "May import" in doc


@pytest.mark.parametrize(
    "module",
    [
        "aenv_ray",
        "aenv_ray.engine",
        "aenv_ray.errors",
        "aenv_ray.protocol",
        "aenv_ray.testing",
        "sandbox_runtime",
        "sandbox_runtime.local",
        "builtin_envs",
    ],
)
def test_public_names_are_sorted_and_exist(module: str) -> None:
    mod = importlib.import_module(module)
    names = list(mod.__all__)
    assert names == sorted(names)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing
