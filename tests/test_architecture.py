"""The house: packages as rooms, imports as arrows, checked by walking every import with ``ast``.

Each package's docstring, and each module's or subpackage's that states rules of its own, is the
single source of its rules; this file reads them from there and holds no table of its own. The
grammar (docs/architecture.md, "Rules in docstrings"):

- ``May import: ITEM, ITEM and ITEM; lazily, inside functions: ITEM.`` (the sentence runs to
  its full stop). After a ``;`` a clause that begins with ``lazily`` or ``inside`` lists what
  only a function body may import.
- ``Must not import: ITEM, ...`` and ``Must not import at import time: ITEM, ...`` (the
  latter: a function body may).
- An ITEM is a module (``aenv_ray``, ``envhub.document``, ``pydantic-settings``: a dash is an
  underscore), ``the standard library``, ``the runtime`` (``sandbox_runtime``) or ``X's public
  API``; ``starlette/uvicorn`` is two. Text in parentheses is a note. ``only`` after the list
  closes the scope's own package: only what the list names of it.

A scope's own top-level package and the standard library are always allowed (unless closed).
The nearest scope's "May import" governs a file; every enclosing scope's "Must not import"
holds. An import inside a function body is lazy; one inside ``if TYPE_CHECKING:`` never runs
and is ignored.

Beyond the docstrings, the house itself: no arrow runs up (the packages' imports form no
cycle, and ``aenv_ray``, the foundation, imports no other room), no import loop joins more than
two files, and what crosses packages is public, module and name.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests._wheel import PACKAGES as WHEEL_PACKAGES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = list(WHEEL_PACKAGES)  # the top-level packages: the rooms of the house
FOUNDATION = "aenv_ray"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


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
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.target}{names}{when}"


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
            names = tuple(a.name for a in node.names)
            if node.level == 0:
                add(node.module or "", node, top, names)
            else:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                add(f"{prefix}.{node.module}" if node.module else prefix, node, top, names)
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


FILES = {_dotted(path): path for package in PACKAGES for path in _files(package)}
MODULES = frozenset(FILES)


@cache
def _project_imports() -> list[Import]:
    """Every import of the packages' files: parsed when a test first asks (a few seconds of
    CPU), not when the file is collected, which each pytest-xdist worker does."""
    return [imp for path in FILES.values() for imp in _imports(path)]


@cache
def _example_imports() -> list[Import]:
    """Every import of examples/*.py (as :func:`_project_imports`)."""
    return [imp for path in sorted((ROOT / "examples").glob("*.py")) for imp in _imports(path)]


def _root(name: str) -> str:
    return name.split(".", 1)[0]


def _covers(allowed: str, target: str) -> bool:
    return target == allowed or target.startswith(allowed + ".")


def _violations(rule: str, bad: list[Import]) -> str:
    return f"{rule}:\n" + "\n".join(f"  {imp}" for imp in bad)


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


def _absolute(imp: Import) -> str:
    """``imp``'s target as a dotted name of this tree: a built-in project's sibling import
    (``from bash_session import x``) names the file in the project's src/."""
    if imp.root in _project_siblings(imp.path):
        rel = imp.path.relative_to(ROOT).parts
        return ".".join(rel[: rel.index("src") + 1]) + "." + imp.target
    return imp.target


def _targets(imp: Import) -> list[str]:
    """What ``imp`` imports, as dotted names: ``from package import module, ...`` names the
    modules, anything else its target."""
    target = _absolute(imp)
    modules = [f"{target}.{name}" for name in imp.names]
    return modules if modules and all(m in MODULES for m in modules) else [target]


def _modules_named(imp: Import) -> set[str]:
    """The files of ours ``imp`` loads: its target (or the nearest package holding it), and
    ``from package import module`` names that are modules."""
    target = _absolute(imp)
    found = {f"{target}.{name}" for name in imp.names} & MODULES
    if imp.names and len(found) == len(imp.names):
        return found  # ``from package import module, ...``: the modules, not the package
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return found | ({target} if target else set())


def test_the_walker_sees_lazy_top_level_relative_dynamic_and_type_only_imports() -> None:
    lazy = [
        i
        for i in _project_imports()
        if i.module == "aenv_ray.resolve" and i.target == "aenv_ray.settings"
    ]
    assert lazy
    assert not any(i.top_level for i in lazy)
    top = [
        i
        for i in _project_imports()
        if i.module == "sandbox_runtime.server" and i.target == "uvicorn"
    ]
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
    assert ("tests._walker_probe.sub", True) in got  # ``from . import sibling``: names sibling
    assert [i.names for i in found if i.target == "tests._walker_probe.sub"] == [("sibling",)]
    assert ("tests._walker_probe.up", True) in got
    assert ("runs_instead", True) in got
    assert ("in_class_body", True) in got
    assert ("dyn.amic", False) in got
    assert not any(i.target == "typed_only" for i in found)


# -- the rules, read from the docstrings ------------------------------------------------------


STD = "the standard library"
_SPELLING = {"the runtime": "sandbox_runtime"}
_ITEM = re.compile(r"[A-Za-z_][\w.]*")


@dataclass
class Rules:
    """What one scope's docstring says."""

    scope: str
    may: set[str] = field(default_factory=set)
    lazy: set[str] = field(default_factory=set)
    must_not: set[str] = field(default_factory=set)
    must_not_at_import: set[str] = field(default_factory=set)
    closed: bool = False  # "... only": the own package only as far as the list names it
    unreadable: list[str] = field(default_factory=list)

    def allows(self, imp: Import) -> bool:
        if imp.root in STDLIB or imp.root in _project_siblings(imp.path):
            return True
        return all(self._allows(imp, target) for target in _targets(imp))

    def _allows(self, imp: Import, target: str) -> bool:
        if _root(target) == _root(self.scope) and not self.closed:
            return True
        if _covers(self.scope, target) or _covers(target, self.scope):
            return True  # itself, its own parts, and the packages holding it
        if any(_covers(item, target) for item in self.may):
            return True
        return not imp.top_level and any(_covers(item, target) for item in self.lazy)

    def forbids(self, imp: Import) -> bool:
        return any(
            any(_covers(item, target) for item in self.must_not)
            or (imp.top_level and any(_covers(i, target) for i in self.must_not_at_import))
            for target in _targets(imp)
        )


def _docstring(module: str) -> str:
    path = FILES.get(module) or ROOT.joinpath(*module.split(".")).with_suffix(".py")
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def _sentence(doc: str, lead: str) -> str | None:
    """The text after ``lead`` up to the sentence's full stop (a ``.`` that ends the text or
    is followed by white space), notes in parentheses dropped."""
    at = doc.find(lead)
    if at < 0:
        return None
    text = doc[at + len(lead) :]
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\s*\([^()]*\)", "", text)
    match = re.match(r"(.*?)\.(?:\s|$)", text, re.S)
    body = match.group(1) if match else text
    return " ".join(body.split())


def _items(text: str, rules: Rules) -> list[str]:
    """The modules a list names (``unreadable`` collects what is none)."""
    found = []
    for raw in re.split(r",|;|\band\b", text):
        item = raw.strip().replace("`", "").replace(":mod:", "").replace(":func:", "")
        if not item:
            continue
        if item.endswith(" only"):
            item = item[: -len(" only")].strip()
            rules.closed = True
        item = _SPELLING.get(item, item)
        if item == STD:
            found.append(STD)
            continue
        item = item.removesuffix("'s public API")
        for part in item.split("/"):
            name = part.strip().replace("-", "_")
            if _ITEM.fullmatch(name):
                found.append(name)
            else:
                rules.unreadable.append(part.strip())
    return found


def _parse(scope: str, doc: str) -> Rules:
    rules = Rules(scope)
    may = _sentence(doc, "May import:")
    if may is not None:
        eager, lazy = may, ""
        clause = re.search(r";\s*(lazily|inside)\b[^:]*:", may)
        if clause:
            eager, lazy = may[: clause.start()], may[clause.end() :]
        rules.may = set(_items(eager, rules))
        rules.lazy = set(_items(lazy, rules))
    for lead, into in (
        ("Must not import at import time:", rules.must_not_at_import),
        ("Must not import:", rules.must_not),
    ):
        text = _sentence(doc, lead)
        if text is not None:
            into |= set(_items(text, rules)) - {STD}
    return rules


@cache
def _rules() -> dict[str, Rules]:
    """Every scope: a module or package whose docstring says what it may or must not import."""
    found = {}
    for module in sorted(MODULES):
        doc = _docstring(module)
        if "May import:" in doc or "Must not import" in doc:
            found[module] = _parse(module, doc)
    return found


def _scopes_of(module: str) -> list[Rules]:
    """The scopes holding ``module``, nearest first."""
    return sorted(
        (r for s, r in _rules().items() if _covers(s, module)),
        key=lambda r: -len(r.scope),
    )


def test_the_parser_reads_the_grammar() -> None:
    doc = (
        "May import: ``aenv_ray``'s public API, pydantic-settings (a note, with, commas), "
        "starlette/uvicorn and the runtime; lazily, inside functions: platformdirs. "
        "Must not import: ray, kubernetes (engines are injected).\n"
        "Must not import at import time: gymnasium."
    )
    rules = _parse("pkg", doc)
    assert rules.may == {"aenv_ray", "pydantic_settings", "starlette", "uvicorn", "sandbox_runtime"}
    assert rules.lazy == {"platformdirs"}
    assert rules.must_not == {"ray", "kubernetes"}
    assert rules.must_not_at_import == {"gymnasium"}
    assert not rules.closed
    assert not rules.unreadable
    closed = _parse("pkg.mod", "May import: the standard library and ``pkg.errors`` only.")
    assert closed.closed
    assert closed.may == {STD, "pkg.errors"}
    assert _parse("x", "May import: the mcp clients.").unreadable == ["the mcp clients"]
    # what the rules answer (an import of a file of the walker's own, never written)
    probe = _imports(ROOT / "pkg" / "mod.py", "import pkg.other\nimport pkg.errors\nimport os\n")
    assert [closed.allows(i) for i in probe] == [False, True, True]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_states_its_rules(package: str) -> None:
    doc = _docstring(package)
    assert doc.split("\n", 1)[0].startswith(f"{package}:"), doc[:80]
    assert re.search(r"\b(Owns|Will own)\b", doc) or package == "builtin_envs", doc
    assert "May import:" in doc
    assert package in _rules()


@pytest.mark.parametrize("scope", sorted(_rules()))
def test_rules_are_readable(scope: str) -> None:
    rules = _rules()[scope]
    assert not rules.unreadable, (
        f"{scope}'s docstring names no module in {rules.unreadable}: write modules, "
        "`the standard library`, or put the words in a note (parentheses)"
    )
    forbidden = {item for outer in _scopes_of(scope) for item in outer.must_not}
    both = {i for i in rules.may | rules.lazy if any(_covers(f, i) for f in forbidden)}
    assert not both, f"{scope} allows what it or a scope holding it forbids: {sorted(both)}"
    ours = [item for item in rules.may | rules.lazy if _root(item) in PACKAGES]
    unknown = [item for item in ours if not any(_covers(item, m) for m in MODULES)]
    assert not unknown, f"{scope} allows modules that do not exist: {unknown}"


@pytest.mark.parametrize("scope", sorted(_rules()))
def test_imports_follow_may_import(scope: str) -> None:
    rules = _rules()[scope]
    bad = [
        imp
        for imp in _project_imports()
        if _covers(scope, imp.module)
        and _scopes_of(imp.module)[0] is rules
        and not rules.allows(imp)
    ]
    assert not bad, _violations(f"{scope} imports what its docstring does not allow", bad)


@pytest.mark.parametrize("scope", sorted(_rules()))
def test_imports_follow_must_not_import(scope: str) -> None:
    rules = _rules()[scope]
    bad = [imp for imp in _project_imports() if _covers(scope, imp.module) and rules.forbids(imp)]
    assert not bad, _violations(f"{scope} imports what its docstring forbids", bad)


# -- the house --------------------------------------------------------------------------------


def _room_arrows() -> dict[str, set[str]]:
    """Package -> the packages it imports (lazily too)."""
    arrows: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for imp in _project_imports():
        target = _root(_absolute(imp))
        if target in PACKAGES and target != _root(imp.module):
            arrows[_root(imp.module)].add(target)
    return arrows


def _floors(arrows: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 + the highest floor it imports (the foundation is floor 1)."""
    floors: dict[str, int] = {}

    def floor(room: str, path: tuple[str, ...]) -> int:
        if room in path:
            raise AssertionError(f"the rooms import each other: {' -> '.join((*path, room))}")
        if room not in floors:
            floors[room] = 1 + max((floor(r, (*path, room)) for r in arrows[room]), default=0)
        return floors[room]

    for room in arrows:
        floor(room, ())
    return floors


def test_the_house_has_no_arrow_going_up() -> None:
    arrows = _room_arrows()
    floors = _floors(arrows)  # raises on a cycle: an arrow that runs back up
    assert arrows[FOUNDATION] == set(), f"{FOUNDATION} imports {sorted(arrows[FOUNDATION])}"
    assert floors[FOUNDATION] == 1
    assert floors["aenv_cli"] == max(floors.values()), "the composition root stands on top"
    assert all(
        floors[upper] > floors[lower] for upper, lowers in arrows.items() for lower in lowers
    )
    # the check can fail: an arrow back down from the foundation would close a cycle
    with pytest.raises(AssertionError, match="import each other"):
        _floors({**arrows, FOUNDATION: {"envhub"}})


def test_the_floors_in_architecture_md_are_the_codes() -> None:
    """docs/architecture.md's table of rooms gives each package's floor as the code has it."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    written = {m[1]: int(m[0]) for m in re.findall(r"^\| (\d) \| `(\w+)`", text, re.M)}
    assert written == _floors(_room_arrows())


def _defined(path: Path) -> set[str]:
    """Every function and class name ``path`` defines, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return {node.name for node in ast.walk(tree) if isinstance(node, kinds)}


def test_architecture_md_links_to_code_that_exists() -> None:
    """Each link of docs/architecture.md to a source file names a file that exists, and a
    name in backticks as its text (``Class.method``, ``function``) is defined in that file."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    links = re.findall(r"\[([^\]]+)\]\(\.\./([\w/.]+\.py)\)", text)
    assert len(links) > 20, links
    bad = []
    for label, target in links:
        path = ROOT / target
        if not path.is_file():
            bad.append(f"{target}: no such file")
            continue
        named = re.fullmatch(r"`(?:[\w.]+\.)?(\w+)(?:\([^)]*\))?`(?: .*)?", label)
        if named and "/" not in label and not label.endswith(".py`"):
            name = named.group(1)
            if name not in _defined(path) and name != path.stem:
                bad.append(f"{target}: `{name}` is defined nowhere in it")
    assert not bad, "docs/architecture.md links to what is not there:\n" + "\n".join(bad)


def _file_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in _project_imports():
        graph[imp.module] |= _modules_named(imp) - {imp.module}
    return graph


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_loop_joins_more_than_two_files() -> None:
    loops = _loops(_file_graph())
    long = [loop for loop in loops if len(loop) > 2]
    assert not long, "import loops of more than two files:\n" + "\n".join(
        f"  {' <-> '.join(loop)}" for loop in long
    )
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _private(imp: Import) -> list[str]:
    """The private parts ``imp`` reaches: ``_module`` in its path, or ``_name`` it imports."""
    parts = [p for p in imp.target.split(".")[1:] if p.startswith("_") and not p.startswith("__")]
    return parts + [n for n in imp.names if n.startswith("_") and not n.startswith("__")]


def _crosses(imp: Import) -> bool:
    return imp.root in PACKAGES and imp.root != _root(imp.module)


def test_what_crosses_packages_is_public_module_and_name() -> None:
    bad = [i for i in _project_imports() + _example_imports() if _crosses(i) and _private(i)]
    assert not bad, _violations("what crosses packages is public (no _private imports)", bad)
    probe = _imports(
        ROOT / "envhub" / "probe.py",
        "from aenv_ray.x import _y\nimport aenv_ray._z\nfrom sandbox_runtime import _http\n",
    )
    assert [_private(i) for i in probe] == [["_y"], ["_z"], ["_http"]]  # all three forms


@cache
def _public_names(module: str) -> frozenset[str] | None:
    """The names ``module`` declares public (its ``__all__``), or None when it declares none."""
    names = _declared_all(ast.parse(FILES[module].read_text(encoding="utf-8")))
    return None if names is None else frozenset(names)


def test_names_taken_from_another_package_are_in_its_all() -> None:
    """``from envhub.store import open_store`` across packages: ``open_store`` is in
    ``envhub.store.__all__`` (or is a submodule), not merely defined there."""
    bad = []
    for imp in _project_imports() + _example_imports():
        if not _crosses(imp) or imp.target not in MODULES or not imp.names:
            continue
        public = _public_names(imp.target)
        for name in imp.names:
            if f"{imp.target}.{name}" in MODULES or name == "*":
                continue
            if public is not None and name not in public:
                bad.append(f"  {imp}: `{name}` is not in {imp.target}.__all__")
    assert not bad, "names taken across packages are public:\n" + "\n".join(bad)


# -- the rules the project relies on most, stated on their own --------------------------------


def test_only_rollout_imports_ray_and_gymnasium() -> None:
    bad = [
        i
        for i in _project_imports() + _example_imports()
        if i.root in ("ray", "gymnasium") and _root(i.module) != "rollout"
    ]
    assert not bad, _violations("ray and gymnasium belong to rollout", bad)


def test_only_k8s_backend_imports_kubernetes_and_in_one_module() -> None:
    users = [i for i in _project_imports() + _example_imports() if i.root == "kubernetes"]
    bad = [i for i in users if _root(i.module) != "k8s_backend"]
    assert not bad, _violations("kubernetes belongs to k8s_backend (engines are injected)", bad)
    assert {i.module for i in users} == {"k8s_backend._api"}, _violations(
        "kubernetes in one module only: k8s_backend._api", users
    )
    transport = [i for i in _project_imports() if i.root == "urllib3"]
    assert {i.module for i in transport} <= {"k8s_backend._api"}, _violations(
        "urllib3 (the client's transport) only beside the client", transport
    )


# what ``aenv build`` and ``aenv push`` run: their commands, with the bundle format and image
BUILD_AND_PUSH = ("aenv_cli._build", "aenv_cli._hub", "aenv_cli._loadcheck")


def _reached(starts: tuple[str, ...], loaded: tuple[str, ...] = ()) -> dict[str, bool]:
    """Every module of ours that running ``starts`` (after loading ``loaded``) may load, each
    with whether its functions may run (True) or only its top level (False: loaded as a package
    or a sibling). An engine's package is not entered: an engine is where environment code runs
    (in a sandbox)."""
    seen: dict[str, bool] = {}
    todo = [(m, True) for m in starts] + [(m, False) for m in loaded]
    while todo:
        module, runs = todo.pop()
        if seen.get(module) in (runs, True) or _root(module) in ("local_backend", "k8s_backend"):
            continue
        seen[module] = runs
        parts = module.split(".")
        todo += [(".".join(parts[:n]), False) for n in range(1, len(parts))]  # its packages
        for imp in _project_imports():
            if imp.module == module and (runs or imp.top_level):
                todo += [(m, runs) for m in _modules_named(imp)]
    return seen


def test_aenv_build_and_push_import_neither_the_hub_nor_the_runtime() -> None:
    reached = _reached(BUILD_AND_PUSH, loaded=("aenv_cli._app",))  # the app mounts every command
    # the walk means something: the commands reach the format, the image, the hub client and
    # the engine contract, and load the other commands' modules without running them
    assert reached["aenv_ray.bundle"]
    assert reached["aenv_cli._image"]
    assert reached["aenv_ray.hub"]
    assert reached["aenv_ray.engine"]
    assert reached["aenv_cli._serve"] is False  # a sibling: `aenv serve` imports envhub
    bad = [
        imp
        for imp in _project_imports()
        if imp.module in reached
        and (reached[imp.module] or imp.top_level)
        and imp.root in ("envhub", "sandbox_runtime")
    ]
    assert not bad, _violations("aenv build/push reach the hub or the runtime", bad)
    # what the walk would report, so the check can fail: `aenv serve` reaches the hub
    served = _reached(("aenv_cli._serve",))
    assert any(i.module in served and i.root == "envhub" for i in _project_imports())


def test_environments_and_examples_use_public_names_only() -> None:
    bad = [
        i
        for i in _project_imports() + _example_imports()
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


# what the SDK's own first use brings; ``import aenv_ray`` alone brings none of it (issue 24: a
# bare import costs at most 6x starting Python; benchmarks/bench_startup.py measures it)
SDK_WEIGHT = ["pydantic", "pydantic_core", "pydantic_settings", "asyncio", "orjson", "aiohttp"]


def test_importing_aenv_ray_imports_the_error_tree_alone() -> None:
    _, added = _modules_added_by("import aenv_ray")
    assert {"aenv_ray", "aenv_ray.errors"} <= added
    heavy = _roots(added) & set(SDK_WEIGHT)
    assert not heavy, f"import aenv_ray imports {sorted(heavy)}: make it lazy (_LAZY)"
    assert not {m for m in added if m.startswith("aenv_ray.")} - {"aenv_ray.errors"}


def test_the_sdk_names_are_imported_on_first_use() -> None:
    # the lazy names resolve to the very objects of their modules, and bring their weight then
    _, added = _modules_added_by(
        "import aenv_ray, aenv_ray.environment as e, aenv_ray.registry as r\n"
        "assert aenv_ray.Environment is e.Environment\n"
        "assert aenv_ray.register_tool is r.register_tool\n"
        "from aenv_ray import EnvConfig, ToolResult, keep_processes, available_environments\n"
        "assert aenv_ray.config.EnvConfig is EnvConfig"
    )
    assert {"pydantic", "asyncio", "orjson"} <= _roots(added)
    assert {"aenv_ray.config", "aenv_ray.protocol", "aenv_ray.resolve"} <= added


def test_importing_the_cli_imports_no_server() -> None:
    _, added = _modules_added_by("from aenv_cli import app")
    assert "typer" in _roots(added)
    # "the app imports typer, and commands import the runtime when they run"
    heavy = _roots(added) & {*HEAVY, "sandbox_runtime", "starlette"}
    assert not heavy, f"the aenv_cli app imports {sorted(heavy)}"


def test_importing_the_cli_package_imports_no_typer() -> None:
    # the console script imports the package: `aenv --help` and `--version` answer from there
    _, added = _modules_added_by("import aenv_cli")
    assert {"aenv_cli", "aenv_cli._fast"} <= added
    heavy = _roots(added) & {"typer", "rich", *SDK_WEIGHT}
    assert not heavy, f"import aenv_cli imports {sorted(heavy)}"
    assert "aenv_cli._app" not in added


def test_importing_the_runtime_imports_no_layer_above_it() -> None:
    _, added = _modules_added_by("import sandbox_runtime, local_backend")
    assert "aenv_ray" in _roots(added)
    heavy = _roots(added) & {"ray", "kubernetes", "gymnasium", "envhub", "rollout"}
    assert not heavy, f"import sandbox_runtime imports {sorted(heavy)}"


# -- docstrings and public names --------------------------------------------------------------


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


@pytest.mark.parametrize("package", PACKAGES)
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
# an import name a distribution provides besides its own (pytest's plugins live in `_pytest`:
# terminal-bench's warm pytest imports its plugin list from there, once)
_ALSO_PROVIDED = {"_pytest": "pytest"}
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
        _ALSO_PROVIDED.get(i.root, i.root)
        for i in _project_imports()
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
    for imp in _project_imports():
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


def test_every_line_naming_an_extra_says_how_from_an_install_and_from_a_checkout() -> None:
    """The README installs from a checkout (``pip install -e '.[ray]'``), a user of a built
    wheel has aenv-ray installed (``pip install 'aenv-ray[ray]'`` adds the extra's packages):
    the line says both, and every message naming an extra gets it from the one helper."""
    from aenv_ray.errors import MissingExtraError
    from aenv_ray.extras import extra_imports, install_hint

    with pytest.raises(MissingExtraError) as caught, extra_imports("kubernetes", "k8s_backend"):
        raise ModuleNotFoundError("No module named 'kubernetes'", name="kubernetes")
    assert str(caught.value) == (
        "aenv-ray: k8s_backend needs the 'kubernetes' extra: pip install "
        "'aenv-ray[kubernetes]' (from a checkout: pip install -e '.[kubernetes]'); "
        "kubernetes not installed"
    )
    assert caught.value.extra == "kubernetes"
    with pytest.raises(ValueError, match="no extra `rayy`"):
        install_hint("rayy")
    # no message spells an install command of its own (docstrings may show one)
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    spelled = []
    for package in PACKAGES:
        for path in _files(package):
            if path.name == "extras.py" and path.parent.name == "aenv_ray":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, documented)
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            spelled += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "aenv-ray[" in node.value
                and id(node) not in docstrings
            ]
    assert not spelled, f"use aenv_ray.extras.install_hint: {spelled}"
