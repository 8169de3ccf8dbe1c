"""The dependency direction of the packages, checked by walking every import with ``ast``.

Each package's docstring says what it owns and what it "May import" / "Must not import". The
rules below encode those sentences (quoted next to each rule); :func:`test_must_not_lists_match_
the_docstrings` parses the "Must not import" lists back out of the docstrings and
:func:`test_allowances_are_in_the_docstrings` checks that every allowance is written there, so
docstring and test cannot drift apart. What the code does beyond the docstrings is listed in
:data:`UNDOCUMENTED`, each with its reason, until the docstring says it.

An import inside a function body is lazy (it runs when the function does); one inside
``if TYPE_CHECKING:`` never runs and is ignored.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    "aenv",
    "aenv_ray",
    "sandbox_runtime",
    "local_backend",
    "envhub",
    "k8s_backend",
    "rollout",
    "builtin_envs",
]
STDLIB = frozenset(sys.stdlib_module_names)


# -- the import walker ------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    module: str  # the importing file, as a dotted name
    path: Path  # the importing file
    target: str  # what it imports, absolute
    top_level: bool  # runs at import time, not inside a function
    line: int
    names: tuple[str, ...] = ()  # ``from target import names``

    @property
    def root(self) -> str:
        return self.target.split(".", 1)[0]

    def __str__(self) -> str:
        when = "" if self.top_level else " (lazily)"
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.target}{when}"


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _dynamic_target(call: ast.Call) -> str | None:
    """``importlib.import_module("x")`` / ``__import__("x")`` with a literal name."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imports(path: Path, source: str | None = None) -> list[Import]:
    """Every import in ``path`` (whose text is ``source`` when given)."""
    module = _dotted(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def add(target: str, node: ast.AST, top: bool, names: tuple[str, ...] = ()) -> None:
        found.append(Import(module, path, target, top, getattr(node, "lineno", 0), names))

    def walk(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, top)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                add(node.module or "", node, top, tuple(a.name for a in node.names))
            else:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                if node.module:
                    add(f"{prefix}.{node.module}", node, top)
                else:
                    for alias in node.names:
                        add(f"{prefix}.{alias.name}", node, top)
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)):
            add(target, node, top)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            top = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                walk(child, top)
            return  # the body only runs for a type checker
        for child in ast.iter_child_nodes(node):
            walk(child, top)

    text = path.read_text(encoding="utf-8") if source is None else source
    walk(ast.parse(text, filename=str(path)), True)
    return found


def _files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


IMPORTS = [imp for package in PACKAGES for path in _files(package) for imp in _imports(path)]
EXAMPLES = [imp for path in sorted((ROOT / "examples").glob("*.py")) for imp in _imports(path)]


def _violations(rule: str, bad: list[Import]) -> str:
    return f"{rule}:\n" + "\n".join(f"  {imp}" for imp in bad)


def test_the_walker_sees_lazy_top_level_relative_dynamic_and_type_only_imports() -> None:
    lazy = [i for i in IMPORTS if i.module == "aenv_ray.engine" and i.target == "local_backend"]
    assert lazy
    assert not any(i.top_level for i in lazy)
    top = [i for i in IMPORTS if i.module == "sandbox_runtime.server" and i.target == "uvicorn"]
    assert top
    assert all(i.top_level for i in top)
    # a file of the walker's own, to see each form once (never written: the walker reads text)
    source = (
        "from typing import TYPE_CHECKING\n"
        "import a.b\n"
        "from . import sibling\n"
        "from ..up import thing\n"
        "if TYPE_CHECKING:\n"
        "    import typed_only\n"
        "else:\n"
        "    import runs_instead\n"
        "class K:\n"
        "    import in_class_body\n"
        "def f():\n"
        "    import importlib\n"
        "    importlib.import_module('dyn.amic')\n"
    )
    found = _imports(ROOT / "tests" / "_walker_probe" / "sub" / "mod.py", source)
    got = {(i.target, i.top_level) for i in found}
    assert ("a.b", True) in got
    assert ("tests._walker_probe.sub.sibling", True) in got
    assert ("tests._walker_probe.up", True) in got
    assert ("runs_instead", True) in got
    assert ("in_class_body", True) in got
    assert ("dyn.amic", False) in got
    assert not any(i.target == "typed_only" for i in found)


# -- the rules, from the docstrings -----------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    may: frozenset[str]  # roots (or dotted prefixes) importable anywhere in the scope
    lazy: frozenset[str] = frozenset()  # importable inside functions only
    must_not: frozenset[str] = frozenset()  # the docstring's "Must not import"
    at_import_time: bool = False  # "Must not import at import time": lazily is another matter
    stdlib: bool = True
    own: bool = True  # the scope's own top-level package

    def allows(self, imp: Import) -> bool:
        if (self.stdlib and imp.root in STDLIB) or (self.own and imp.root == _root(imp.module)):
            return True
        if any(_covers(allowed, imp.target) for allowed in self.may):
            return True
        return not imp.top_level and any(_covers(allowed, imp.target) for allowed in self.lazy)


def _root(name: str) -> str:
    return name.split(".", 1)[0]


def _covers(allowed: str, target: str) -> bool:
    return target == allowed or target.startswith(allowed + ".")


RULES: dict[str, Rule] = {
    # "May import: pydantic, pydantic-settings, httpx (the hub's client), orjson, the mcp/fastmcp
    # clients, packaging (requirement specifiers in a bundle's lock), typer and rich (CLI only);
    # lazily, inside functions: ``local_backend`` and ``k8s_backend`` (new_engine) and
    # ``builtin_envs`` (finding built-ins by name), platformdirs and yaml (a pod template's
    # text). Must not import at import time: ray, kubernetes, gymnasium, the runtime."
    "aenv_ray": Rule(
        may=frozenset({"pydantic", "pydantic_settings", "httpx", "orjson", "mcp", "packaging"}),
        lazy=frozenset({"local_backend", "k8s_backend", "builtin_envs", "platformdirs", "yaml"}),
        must_not=frozenset(
            {"ray", "kubernetes", "gymnasium", "sandbox_runtime", "local_backend", "k8s_backend"}
        ),
        at_import_time=True,
    ),
    # "May import: the standard library only."
    "aenv_ray.errors": Rule(may=frozenset(), own=False),
    # "May import: ``aenv_ray``'s public API, pydantic (AEnvironment's models are pydantic
    # models); lazily, inside functions: agents (the OpenAI Agents SDK, for
    # ``list_openai_tools``). Must not import: ray, kubernetes, the runtime, ``local_backend``,
    # ``k8s_backend``."
    "aenv": Rule(
        may=frozenset({"aenv_ray", "pydantic"}),
        lazy=frozenset({"agents"}),
        must_not=frozenset(
            {"ray", "kubernetes", "sandbox_runtime", "local_backend", "k8s_backend"}
        ),
    ),
    # "May import: typer, rich, packaging (the wheel ``aenv build`` writes), ``aenv_ray``,
    # ``sandbox_runtime`` and ``rollout`` (inside commands)." The CLI is part of aenv_ray, so
    # aenv_ray's own allowances hold there too.
    "aenv_ray.cli": Rule(
        may=frozenset(
            {"typer", "rich", "pydantic", "pydantic_settings", "httpx", "orjson", "packaging"}
        ),
        lazy=frozenset(
            {
                "sandbox_runtime",
                "local_backend",
                "builtin_envs",
                "rollout",
                "envhub",
                "platformdirs",
            }
        ),
        must_not=frozenset({"ray", "kubernetes", "gymnasium", "sandbox_runtime"}),
        at_import_time=True,
    ),
    # the test helpers start runtimes; they may use the runtime (as the CLI may)
    "aenv_ray.testing": Rule(
        may=frozenset({"pydantic", "orjson", "sandbox_runtime"}),
        must_not=frozenset({"ray", "kubernetes", "gymnasium"}),
    ),
    # "May import: ``aenv_ray`` (models, registry, errors), fastmcp (server side),
    # starlette/uvicorn, orjson. Must not import: ray, kubernetes, envhub, rollout."
    "sandbox_runtime": Rule(
        may=frozenset({"aenv_ray", "fastmcp", "starlette", "uvicorn", "orjson"}),
        must_not=frozenset({"ray", "kubernetes", "envhub", "rollout", "local_backend"}),
    ),
    # "May import: ``aenv_ray`` (engine contract, config, errors), ``sandbox_runtime``,
    # platformdirs (where the compiled init is cached); Linux system calls through ctypes. Must
    # not import: ray, kubernetes, envhub, rollout."
    "local_backend": Rule(
        may=frozenset({"aenv_ray", "sandbox_runtime", "platformdirs"}),
        must_not=frozenset({"ray", "kubernetes", "envhub", "rollout"}),
    ),
    # "May import: ``aenv_ray``, fastapi, starlette, pydantic, uvicorn, aiohttp (the proxy's
    # client), redis (the Redis store), cryptography (the sealed tokens); lazily, inside
    # functions: platformdirs (the default store's place). Must not import: ray, kubernetes
    # (engines are injected)."
    "envhub": Rule(
        may=frozenset(
            {
                "aenv_ray",
                "fastapi",
                "starlette",
                "pydantic",
                "uvicorn",
                "aiohttp",
                "redis",
                "cryptography",
            }
        ),
        lazy=frozenset({"platformdirs"}),
        must_not=frozenset({"ray", "kubernetes"}),
    ),
    # "May import: ``aenv_ray``, orjson, yaml (a user's own pod template); kubernetes and
    # urllib3 (its transport) in one module only; lazily, platformdirs (where the exec helper's
    # build is cached). Must not import: ray, gymnasium."
    "k8s_backend": Rule(
        may=frozenset({"aenv_ray", "orjson", "yaml", "kubernetes", "urllib3"}),
        lazy=frozenset({"platformdirs"}),
        must_not=frozenset({"ray", "gymnasium"}),
    ),
    # "May import: ``aenv_ray``, ray, gymnasium. Engines are chosen by name through
    # ``aenv_ray.engine.new_engine`` ... Must not import: kubernetes, ``local_backend``,
    # ``k8s_backend``."
    "rollout": Rule(
        may=frozenset({"aenv_ray", "ray", "gymnasium"}),
        must_not=frozenset({"kubernetes", "local_backend", "k8s_backend"}),
    ),
    # "May import: ``aenv_ray``, gymnasium, numpy (the arrays of gymnasium's vector API). Must
    # not import: ray, kubernetes (engines are injected)."
    "rollout.gym": Rule(
        may=frozenset({"aenv_ray", "gymnasium", "numpy"}),
        must_not=frozenset({"ray", "kubernetes"}),
    ),
    # "May import: ``aenv_ray``, ``rollout``, aiohttp (the OpenAI-compatible policy), pyarrow
    # (Parquet output); lazily, inside functions: ``builtin_envs`` (demo tasks and policies).
    # Must not import: kubernetes (engines are injected)."
    "rollout.synthesis": Rule(
        may=frozenset({"aenv_ray", "rollout", "aiohttp", "pyarrow"}),
        lazy=frozenset({"builtin_envs"}),
        must_not=frozenset({"kubernetes"}),
    ),
    # "May import: ``aenv_ray``, ``rollout``, gymnasium, numpy; lazily, inside functions:
    # ray.tune. Must not import: kubernetes (engines are injected)."
    "rollout.rllib": Rule(
        may=frozenset({"aenv_ray", "rollout", "gymnasium", "numpy"}),
        lazy=frozenset({"ray.tune"}),
        must_not=frozenset({"kubernetes"}),
    ),
    # "May import: ``aenv_ray``, ``rollout``. Must not import: kubernetes."
    "rollout.areal": Rule(
        may=frozenset({"aenv_ray", "rollout"}), must_not=frozenset({"kubernetes"})
    ),
    # "May import: ``aenv_ray``'s public API, as a user's project would." (Plus, for a project's
    # modules, their siblings in the project's src/: see _project_siblings.)
    "builtin_envs": Rule(may=frozenset({"aenv_ray"})),
    # "May import: ``aenv_ray``'s public API (the SDK, the hub client), aiohttp (the model's HTTP
    # client)."
    "builtin_envs.agent": Rule(may=frozenset({"aenv_ray", "aiohttp"})),
    # "May import: pydantic, ``aenv_ray``'s public API (errors)." (tau2's data models are pydantic
    # models, as the original's: their dumps, hashes and validation errors are the outputs.)
    "builtin_envs.tau2": Rule(may=frozenset({"aenv_ray", "pydantic"})),
    # "May import: yaml, pytest (the offline ``uv run pytest``), ``aenv_ray``'s public API
    # (errors)." (task.yaml is YAML; a task's tests run with the instance's pytest.)
    "builtin_envs.terminal_bench": Rule(may=frozenset({"aenv_ray", "yaml", "pytest"})),
}

# What the code imports beyond its docstring, with why; the docstring should say it. Each entry
# must still be in use (test_undocumented_allowances_are_still_used), so the list only shrinks.
UNDOCUMENTED: dict[tuple[str, str], str] = {
    ("aenv_ray.openai_tools", "agents"): "lazy, optional: list_agents_tools() (openai-agents)",
    ("sandbox_runtime", "pydantic"): "aenv_ray's models are pydantic models (ValidationError)",
    ("sandbox_runtime", "pydantic_core"): "the same: pydantic's core (to_jsonable_python)",
    ("sandbox_runtime", "mcp"): "the MCP SDK fastmcp is built on (content types)",
    ("sandbox_runtime", "uvloop"): "uvicorn's event loop",
    ("local_backend._sandbox", "builtin_envs"): "lazy: bind-mounts the built-ins' tree",
    ("local_backend.daemon", "aiohttp"): "the daemon's HTTP server on a Unix socket",
    ("local_backend.client", "aiohttp"): "DaemonEngine: HTTP client of the daemon's socket",
    ("builtin_envs.tau2.src._tau2_tooltable", "sandbox_runtime"): (
        "lazy: tau2's tool listing follows the domain; the runtime has no public hook for that "
        "yet (remove with PRIVATE_WORKAROUNDS once it has)"
    ),
}

# Private names a built-in environment reaches across packages, with why. Each one is a runtime
# feature the environment needs and the runtime lacks; the list only shrinks.
PRIVATE_WORKAROUNDS: dict[tuple[str, str], str] = {
    ("builtin_envs.tau2.src._tau2_tooltable", "aenv_ray.registry"): (
        "_target: the registry being loaded, to serve tools whose set follows tau2's domain and "
        "whose arguments reach tau2 unvalidated (its errors are the outputs)"
    ),
    ("builtin_envs.tau2.src._tau2_tooltable", "sandbox_runtime"): (
        "_http.RuntimeApp: its tool listing is fixed at load; tau2's follows the domain"
    ),
}


def _scope(module: str) -> str:
    return max((s for s in RULES if _covers(s, module)), key=len)


@cache
def _project_siblings(path: Path) -> frozenset[str]:
    """Modules a built-in project's file may import as siblings (its src/ is on sys.path)."""
    rel = path.relative_to(ROOT).parts
    if rel[0] != "builtin_envs" or "src" not in rel:
        return frozenset()
    src = ROOT.joinpath(*rel[: rel.index("src") + 1])
    return frozenset(p.stem for p in src.glob("*.py")) | frozenset(
        p.name for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )


def _undocumented(imp: Import) -> bool:
    return any(
        _covers(module, imp.module) and _covers(target, imp.target)
        for module, target in UNDOCUMENTED
    )


@pytest.mark.parametrize("scope", sorted(RULES))
def test_imports_respect_may_import(scope: str) -> None:
    rule = RULES[scope]
    bad = [
        imp
        for imp in IMPORTS
        if _scope(imp.module) == scope
        and not rule.allows(imp)
        and imp.root not in _project_siblings(imp.path)
        and not _undocumented(imp)
    ]
    assert not bad, _violations(f"{scope} imports what its docstring does not allow", bad)


@pytest.mark.parametrize("scope", sorted(RULES))
def test_imports_respect_must_not_import(scope: str) -> None:
    rule = RULES[scope]
    bad = [
        imp
        for imp in IMPORTS
        if _scope(imp.module) == scope
        and any(_covers(banned, imp.target) for banned in rule.must_not)
        and (imp.top_level or not rule.at_import_time)
    ]
    assert not bad, _violations(f"{scope} imports what its docstring forbids", bad)
    assert not rule.may & rule.must_not


def test_undocumented_allowances_are_still_used() -> None:
    unused = [
        key
        for key in UNDOCUMENTED
        if not any(_covers(key[0], i.module) and _covers(key[1], i.target) for i in IMPORTS)
    ]
    assert not unused, f"remove these from UNDOCUMENTED, nothing imports them now: {unused}"


def _docstring(module: str) -> str:
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


_SPELLING = {"the runtime": "sandbox_runtime", "pydantic-settings": "pydantic_settings"}


def _must_not(doc: str) -> set[str]:
    match = re.search(r"Must not import(?: at import time)?:(.*?)(?:\.\s|\.$)", doc, re.S)
    if not match:
        return set()
    names = set()
    for item in re.sub(r"\([^)]*\)", "", match.group(1)).split(","):
        word = " ".join(item.replace("`", "").split())
        names.add(_SPELLING.get(word, word))
    return names


@pytest.mark.parametrize("scope", [*PACKAGES, "rollout.gym"])
def test_must_not_lists_match_the_docstrings(scope: str) -> None:
    assert _must_not(_docstring(scope)) == set(RULES[scope].must_not)


@pytest.mark.parametrize("scope", sorted(RULES))
def test_allowances_are_in_the_docstrings(scope: str) -> None:
    # the encoded allowances are no wider than what the scope's docstring (or, for a
    # subpackage without its own rule, its package's) says
    doc = _docstring(scope) or _docstring(_root(scope))
    if scope == "aenv_ray.cli":  # the CLI inherits aenv_ray's allowances
        doc += _docstring("aenv_ray")
    if scope == "aenv_ray.testing":
        doc = "sandbox_runtime " + _docstring("aenv_ray")  # see the rule's comment
    if scope == "aenv_ray.errors":
        assert "the standard library only" in doc
    normalized = doc.replace("-", "_").replace("`", "")
    rule = RULES[scope]
    for name in rule.may | rule.lazy:
        assert re.search(rf"\b{re.escape(name)}\b", normalized), f"{name} not in {scope}'s doc"


# -- the rules the project relies on most, stated on their own --------------------------------


def test_only_rollout_imports_ray_and_gymnasium() -> None:
    bad = [
        i
        for i in IMPORTS + EXAMPLES
        if i.root in ("ray", "gymnasium") and _root(i.module) != "rollout"
    ]
    assert not bad, _violations("ray and gymnasium belong to rollout", bad)


def test_only_k8s_backend_imports_kubernetes_and_in_one_module() -> None:
    users = [i for i in IMPORTS + EXAMPLES if i.root == "kubernetes"]
    bad = [i for i in users if _root(i.module) != "k8s_backend"]
    assert not bad, _violations("kubernetes belongs to k8s_backend (engines are injected)", bad)
    assert {i.module for i in users} == {"k8s_backend._api"}, _violations(
        "kubernetes in one module only: k8s_backend._api", users
    )
    transport = [i for i in IMPORTS if i.root == "urllib3"]
    assert {i.module for i in transport} <= {"k8s_backend._api"}, _violations(
        "urllib3 (the client's transport) only beside the client", transport
    )


def test_the_sdk_reaches_the_runtime_only_lazily_outside_the_cli_and_testing() -> None:
    lazily_allowed = ("local_backend", "builtin_envs")
    bad = [
        i
        for i in IMPORTS
        if _root(i.module) == "aenv_ray"
        and i.root in ("sandbox_runtime", "builtin_envs")
        and not _covers("aenv_ray.cli", i.module)
        and not _covers("aenv_ray.testing", i.module)
        and (i.top_level or not any(_covers(a, i.target) for a in lazily_allowed))
    ]
    assert not bad, _violations(
        "aenv_ray imports local_backend and builtin_envs inside functions only", bad
    )
    cli = [
        i
        for i in IMPORTS
        if i.module.startswith("aenv_ray.cli") and i.root == "sandbox_runtime" and i.top_level
    ]
    assert not cli, _violations("the CLI imports the runtime inside commands only", cli)


# what ``aenv build`` and ``aenv push`` run: their commands, with the bundle format and image
BUILD_AND_PUSH = ("aenv_ray.cli._build", "aenv_ray.cli._hub", "aenv_ray.cli._loadcheck")
MODULES = frozenset(imp.module for imp in IMPORTS)


def _modules_named(imp: Import) -> set[str]:
    """The modules of ours ``imp`` loads: its target (or the nearest package holding it), and
    ``from package import module`` names that are modules."""
    found = {f"{imp.target}.{name}" for name in imp.names} & MODULES
    target = imp.target
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return found | ({target} if target else set())


def _reached(starts: tuple[str, ...]) -> dict[str, bool]:
    """Every module of ours that running ``starts`` may load, each with whether its functions
    may run (True) or only its top level (False: loaded as a package or a sibling). An engine's
    package is not entered: an engine is where environment code runs (in a sandbox)."""
    seen: dict[str, bool] = {}
    todo = [(m, True) for m in starts]
    while todo:
        module, runs = todo.pop()
        if seen.get(module) in (runs, True) or _root(module) in ("local_backend", "k8s_backend"):
            continue
        seen[module] = runs
        parts = module.split(".")
        todo += [(".".join(parts[:n]), False) for n in range(1, len(parts))]  # its packages
        for imp in IMPORTS:
            if imp.module == module and (runs or imp.top_level):
                todo += [(m, runs) for m in _modules_named(imp)]
    return seen


def test_aenv_build_and_push_import_neither_the_hub_nor_the_runtime() -> None:
    reached = _reached(BUILD_AND_PUSH)
    # the walk means something: the commands reach the format, the image, the hub client and
    # the engine contract, and load the other commands' modules without running them
    assert reached["aenv_ray.bundle"]
    assert reached["aenv_ray.cli._image"]
    assert reached["aenv_ray.hub"]
    assert reached["aenv_ray.engine"]
    assert reached["aenv_ray.cli._serve"] is False  # a sibling: `aenv serve` imports envhub
    bad = [
        imp
        for imp in IMPORTS
        if imp.module in reached
        and (reached[imp.module] or imp.top_level)
        and imp.root in ("envhub", "sandbox_runtime")
    ]
    assert not bad, _violations("aenv build/push reach the hub or the runtime", bad)
    # what the walk would report, so the check can fail: `aenv serve` reaches the hub
    served = _reached(("aenv_ray.cli._serve",))
    assert any(i.module in served and i.root == "envhub" for i in IMPORTS)


def test_new_engine_is_the_sdks_one_lazy_import_of_an_engine() -> None:
    users = [
        i
        for i in IMPORTS
        if _root(i.module) == "aenv_ray"
        and i.root in ("local_backend", "k8s_backend")
        and not _covers("aenv_ray.cli", i.module)
    ]
    assert sorted((i.module, i.target, i.top_level) for i in users) == [
        ("aenv_ray.engine", "k8s_backend", False),
        ("aenv_ray.engine", "local_backend", False),
    ], _violations("the SDK reaches an engine through new_engine() only", users)


def _private(imp: Import) -> list[str]:
    """The private parts ``imp`` reaches: ``_module`` in its path, or ``_name`` it imports."""
    parts = [p for p in imp.target.split(".")[1:] if p.startswith("_")]
    return parts + [n for n in imp.names if n.startswith("_") and not n.startswith("__")]


def test_no_package_imports_another_packages_private_modules_or_names() -> None:
    bad = [
        i
        for i in IMPORTS + EXAMPLES
        if i.root in PACKAGES
        and i.root != _root(i.module)
        and _private(i)
        and (i.module, i.target) not in PRIVATE_WORKAROUNDS
    ]
    used = {(i.module, i.target) for i in IMPORTS}
    assert set(PRIVATE_WORKAROUNDS) <= used, "remove the PRIVATE_WORKAROUNDS nothing uses now"
    assert not bad, _violations("what crosses packages is public (no _private imports)", bad)
    probe = _imports(
        ROOT / "envhub" / "probe.py", "from aenv_ray.x import _y\nimport aenv_ray._z\n"
    )
    assert [_private(i) for i in probe] == [["_y"], ["_z"]]  # the check sees both forms


def test_environments_and_examples_use_public_names_only() -> None:
    bad = [
        i
        for i in IMPORTS + EXAMPLES
        if _root(i.module) in ("builtin_envs", "examples")
        and i.root in ("aenv_ray", "sandbox_runtime")
        and any(part.startswith("_") for part in i.target.split(".")[1:])
    ]
    assert not bad, _violations("user-facing code imports no private module", bad)


# -- what an import costs ---------------------------------------------------------------------

HEAVY = ["ray", "kubernetes", "gymnasium", "fastmcp", "uvicorn"]


def _modules_added_by(statement: str) -> tuple[set[str], set[str]]:
    """(modules already there before, modules the statement added), in a fresh interpreter."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"{statement}\n"
        "print(' '.join(sorted(before)))\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    before, added = out.stdout.splitlines()
    return set(before.split()), set(added.split())


def _roots(modules: set[str]) -> set[str]:
    return {_root(m) for m in modules}


def test_importing_the_sdk_stays_light() -> None:
    before, added = _modules_added_by("import aenv_ray")
    assert "aenv_ray" in _roots(added)  # the statement did import it: the check means something
    assert not _roots(before) & {*HEAVY, "aenv_ray"}
    # "Must not import at import time: ray, kubernetes, gymnasium, the runtime"; typer and rich
    # are the CLI's
    heavy = _roots(added) & {*HEAVY, "sandbox_runtime", "builtin_envs", "typer", "rich"}
    assert not heavy, f"import aenv_ray imports {sorted(heavy)}"


def test_importing_the_cli_imports_no_server() -> None:
    _, added = _modules_added_by("import aenv_ray.cli")
    assert "typer" in _roots(added)
    # "Importing this package imports typer only; commands import the runtime when they run."
    heavy = _roots(added) & {*HEAVY, "sandbox_runtime", "starlette"}
    assert not heavy, f"import aenv_ray.cli imports {sorted(heavy)}"


def test_importing_the_runtime_imports_no_layer_above_it() -> None:
    _, added = _modules_added_by("import sandbox_runtime, local_backend")
    assert "aenv_ray" in _roots(added)
    heavy = _roots(added) & {"ray", "kubernetes", "gymnasium", "envhub", "rollout"}
    assert not heavy, f"import sandbox_runtime imports {sorted(heavy)}"


# -- docstrings and public names --------------------------------------------------------------


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_say_what_they_own_and_may_import(package: str) -> None:
    doc = _docstring(package)
    assert doc.split("\n", 1)[0].startswith(f"{package}:"), doc[:80]
    assert re.search(r"\b(Owns|Will own)\b", doc) or package == "builtin_envs", doc
    assert "May import:" in doc


def _modules_with_all() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in _files(package)
        if "__all__" in path.read_text(encoding="utf-8") and path.name != "__main__.py"
    ]


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names the module defines; with a module ``__getattr__`` (PEP 562, lazy attributes), the
    names its ``if TYPE_CHECKING:`` block imports count too (the import test checks they resolve).
    """
    names: set[str] = set()
    lazy = any(
        isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body
    )
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif lazy and isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    names |= {(a.asname or a.name).split(".")[0] for a in inner.names}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = ast.literal_eval(node.value)  # type: ignore[arg-type]
            return list(value)
    return None


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest, each alphabetical."""
    if name.isupper() and len(name) > 1:
        return 0, name
    return (1 if name[:1].isupper() else 2), name


@pytest.mark.parametrize(
    "path", _modules_with_all(), ids=lambda p: str(p.relative_to(ROOT)).replace("/", ".")
)
def test_all_is_a_sorted_list_of_names_the_module_defines(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _declared_all(tree)
    assert names is not None, "__all__ must be a literal list of strings"
    # the linter's order (constants first), which ruff keeps (RUF022)
    assert names == sorted(names, key=_isort_key), f"sort __all__: {sorted(names, key=_isort_key)}"
    assert len(names) == len(set(names)), "a name is listed twice"
    missing = set(names) - _top_level_names(tree)
    assert not missing, f"__all__ lists names the module does not define: {sorted(missing)}"


@pytest.mark.parametrize("package", [*PACKAGES, "aenv_ray.cli"])
def test_every_package_declares_its_public_names_and_they_import(package: str) -> None:
    module = importlib.import_module(package)
    names = list(getattr(module, "__all__", None) or [])
    assert hasattr(module, "__all__"), f"{package} has no __all__"
    assert names == sorted(names, key=_isort_key)
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing
    assert all(not n.startswith("_") or n == "__version__" for n in names)


# -- dependencies match imports ---------------------------------------------------------------

# a distribution whose import name is not its normalized name
_IMPORT_NAMES = {"openai-agents": "agents", "pydantic-core": "pydantic_core", "pyyaml": "yaml"}
# declared, yet no source imports it (yet): each with why; the list only shrinks
_DECLARED_UNUSED: dict[str, str] = {}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _project() -> dict[str, Any]:
    import tomllib

    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"
    ]
    return project


def _import_names(requirements: list[str]) -> set[str]:
    names = _requirement_names(requirements) - {"aenv-ray"}  # an extra naming another
    return {_IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names}


def _declared() -> tuple[set[str], set[str]]:
    """(import names of the base dependencies, of the extras' and dev ones)."""
    project = _project()
    extras = [r for reqs in project.get("optional-dependencies", {}).values() for r in reqs]
    return _import_names(project["dependencies"]), _import_names(extras)


def _checked_extras(path: Path) -> set[str]:
    """The extras a file checks at import time: its module-level ``require_extra("X", ...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value.args[0].value
        for node in tree.body
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "require_extra"
        and node.value.args
        and isinstance(node.value.args[0], ast.Constant)
        and isinstance(node.value.args[0].value, str)
    }


def _guarding(path: Path) -> set[str]:
    """The extras checked before ``path`` runs: by it, or by a package ``__init__`` above it."""
    found = _checked_extras(path)
    here = path.parent
    while here != ROOT and (here / "__init__.py").is_file():
        if here / "__init__.py" != path:
            found |= _checked_extras(here / "__init__.py")
        here = here.parent
    return found


def test_dependencies_match_imports() -> None:
    required, optional = _declared()
    used = {
        i.root
        for i in IMPORTS
        if i.root not in STDLIB
        and i.root not in PACKAGES
        and i.root != "__future__"
        and i.root not in _project_siblings(i.path)
    }
    undeclared = used - required - optional
    assert not undeclared, f"imported, not declared in pyproject.toml: {sorted(undeclared)}"
    unused = required - used - set(_DECLARED_UNUSED)
    assert not unused, f"required, imported by no source (move to dev or drop): {sorted(unused)}"
    stale = {name for name in _DECLARED_UNUSED if name in used or name not in required}
    assert not stale, f"remove from _DECLARED_UNUSED: {sorted(stale)}"


def test_what_an_extra_brings_is_imported_behind_its_check() -> None:
    """A bare install (``pip install aenv-ray``) has only the base dependencies. A module that
    imports one of an extra's at import time runs only after ``require_extra`` of that extra
    (its own, or its package's, at module level: the one line naming the extra); any other
    optional import sits inside a function, so the module works without it."""
    from aenv_ray.extras import EXTRAS

    required, optional = _declared()
    bad = []
    for imp in IMPORTS:
        if imp.root not in optional - required or not imp.top_level:
            continue
        if "demo_tasks" in imp.path.parts:  # a task's own tests, run by pytest in its box
            continue
        extras = {name for name, modules in EXTRAS.items() if imp.root in modules}
        if not extras & _guarding(imp.path):
            bad.append(imp)
    assert not bad, _violations(
        "imported at import time without require_extra of an extra that brings it", bad
    )


def test_the_extras_named_in_code_are_the_ones_pyproject_declares() -> None:
    from aenv_ray.extras import EXTRAS

    declared = _project()["optional-dependencies"]
    assert set(EXTRAS) == set(declared) - {"all", "dev"}
    assert set(_requirement_names(declared["all"])) == {"aenv-ray"}
    assert f"aenv-ray[{','.join(sorted(EXTRAS, key=list(declared).index))}]" in declared["all"]
    for extra, modules in EXTRAS.items():
        # what an extra installs itself (an extra it names, e.g. [hub], is checked on its own)
        assert _import_names(declared[extra]) <= set(modules), extra
    # every extra's check is used somewhere, at import time or in a function
    sources = "\n".join(p.read_text(encoding="utf-8") for pkg in PACKAGES for p in _files(pkg))
    for extra in EXTRAS:
        assert f'require_extra("{extra}"' in sources, f"no code checks the `{extra}` extra"


# -- what mypy checks -------------------------------------------------------------------------


def test_mypy_checks_every_package_and_every_builtin_project() -> None:
    """``mypy --strict`` (in scripts/test) covers each package, and names each built-in
    project's modules as an instance imports them: its ``src/`` is a mypy_path entry.
    Without that entry a project's sibling imports (``from bash_session import ...``) would
    not resolve and go unchecked."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert sorted(config["files"]) == sorted(PACKAGES)
    assert config["strict"] is True
    assert config["explicit_package_bases"] is True
    sources = sorted(p.parent for p in (ROOT / "builtin_envs").glob("*/config.json"))
    assert sources, "no built-in project found"
    expected = [f"$MYPY_CONFIG_FILE_DIR/{(p / 'src').relative_to(ROOT)}" for p in sources]
    assert sorted(config["mypy_path"]) == sorted(["$MYPY_CONFIG_FILE_DIR", *expected])
