"""Load an environment project directory: ``config.json`` plus the modules under ``src/``."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError, DefinitionError
from aenv_ray.registry import DefinitionRegistry

__all__ = ["LoadedProject", "load_project"]

# The src directories load_project imported from in this process (tests load many projects).
_LOADED_SOURCES: set[Path] = set()


class LoadedProject:
    """A project's parsed configuration and the registry its modules filled."""

    def __init__(self, root: Path, config: EnvConfig, registry: DefinitionRegistry) -> None:
        self.root = root
        self.config = config
        self.registry = registry


def _python_files(src: Path) -> list[Path]:
    """Every ``.py`` file under ``src`` outside hidden directories, sorted."""
    return [
        path
        for path in sorted(src.rglob("*.py"))
        if not any(part.startswith(".") for part in path.relative_to(src).parts)
    ]


def _module_files(files: list[Path], src: Path) -> list[Path]:
    """The public modules among ``files``: those the loader imports itself."""
    public = []
    for path in files:
        rel = path.relative_to(src)
        if any(part.startswith("_") for part in rel.parts):
            continue  # private helpers are imported by the modules that need them
        if rel.parts[0] in ("tests", "test") or path.name.startswith("test_"):
            continue
        public.append(path)
    return public


def _is_inside(filename: str | None, src: Path) -> bool:
    if not filename:
        return False
    try:
        return Path(filename).resolve().is_relative_to(src)
    except (OSError, ValueError):
        return False


def _module_name(path: Path, src: Path) -> str:
    """The name a file under ``src`` has when imported with ``src`` on ``sys.path``."""
    parts = path.relative_to(src).with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _where(exc: BaseException, path: Path, src: Path) -> str:
    """``file:line`` where an import failed: the line of a syntax error in a project file, else
    the innermost traceback frame inside the project (in a sibling the module imported, say),
    else the module itself."""
    if (
        isinstance(exc, SyntaxError)
        and exc.lineno
        and exc.filename
        and _is_inside(exc.filename, src)
    ):
        return f"{Path(exc.filename).resolve()}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_inside(f.filename, src)]
    if frames and frames[-1].lineno:
        return f"{Path(frames[-1].filename).resolve()}:{frames[-1].lineno}"
    return str(path)


def _forget_earlier_load(src: Path) -> None:
    """Drop from ``sys.modules`` the modules an earlier load of this project imported.

    Loading the same project again (tests do; a runtime loads once) must run its decorators
    again, into the new registry. Only modules imported as project modules (their name is their
    path under ``src``) are dropped, never a library that merely lives below it.
    """
    prefix = os.path.join(src, "")
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        # a project module's file starts with src as put on sys.path; the string test is cheap,
        # resolving the path of every module in sys.modules is not
        if not isinstance(file, str) or not file.startswith(prefix) or not _is_inside(file, src):
            continue
        try:
            expected = _module_name(Path(file).resolve(), src)
        except ValueError:
            continue
        if name == expected:
            del sys.modules[name]


def _check_no_foreign_module(files: list[Path], src: Path) -> None:
    """Refuse a load whose modules (private helpers included) would silently be another
    project's: one loaded earlier in this process imported a module of the same name."""
    for path in files:
        name = _module_name(path, src)
        file = getattr(sys.modules.get(name), "__file__", None)
        if file is None or _is_inside(file, src):
            continue
        other = next((o for o in sorted(_LOADED_SOURCES) if o != src and _is_inside(file, o)), None)
        if other is not None:
            raise DefinitionError(
                f"module {path} is named `{name}`, which is already imported from {file} "
                f"(the project in {other}, loaded earlier in this process); an import of "
                f"`{name}` would get that one: rename the file",
                location=str(path),
            )


def load_project(root: str | Path) -> LoadedProject:
    """Import every public module under ``root/src`` (or ``root`` if it has no ``src/``).

    ``src`` is put on ``sys.path`` first, so modules import their siblings as the seeds allow
    (``from bash_session import ...``). An import error is a :class:`DefinitionError` naming the
    file and the line inside it; so is a project that registers nothing.
    """
    root = Path(root).resolve()
    config = EnvConfig.load(root)
    src = (root / "src").resolve() if (root / "src").is_dir() else root
    every_file = _python_files(src)
    files = _module_files(every_file, src)
    if not files:
        raise ConfigurationError(
            f"{src} holds no Python module; put the module with your @register_tool functions "
            "there (`aenv init NAME` creates an example)"
        )
    # First on sys.path, even when an earlier load put it further back: a sibling import must
    # find this project's module, not a same-named one of a project loaded since.
    while str(src) in sys.path:
        sys.path.remove(str(src))
    sys.path.insert(0, str(src))
    importlib.invalidate_caches()  # files written since the last import are seen
    _forget_earlier_load(src)
    _check_no_foreign_module(every_file, src)
    _LOADED_SOURCES.add(src)
    registry = DefinitionRegistry()
    with registry.collecting():
        for path in files:
            module_name = _module_name(path, src)
            loaded = sys.modules.get(module_name)
            if loaded is not None:
                if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
                    continue  # imported by a sibling during this load: its decorators ran
                raise DefinitionError(
                    f"module {path} is named `{module_name}`, which is already imported from "
                    f"{getattr(loaded, '__file__', 'a built-in module')}; rename the file",
                    location=str(path),
                )
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise DefinitionError(f"cannot import {path}", location=str(path))
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except DefinitionError:
                sys.modules.pop(module_name, None)
                raise
            except (Exception, SystemExit) as exc:  # sys.exit() at import is a broken project too
                sys.modules.pop(module_name, None)
                where = _where(exc, path, src)
                raise DefinitionError(
                    f"importing {path} failed at {where}: {type(exc).__name__}: {exc}",
                    location=where,
                ) from exc
    if config.reward.judge:
        if registry.reward is None:
            raise DefinitionError(
                f'{config.ref}: config.json asks for the judge ("reward": {{"judge": '
                "true}) but the project registers no reward; decorate one with @register_reward"
            )
        registry.reward = dataclasses.replace(registry.reward, judge=True)
    if not registry.tools and not registry.functions and registry.reward is None:
        raise DefinitionError(
            f"{config.ref} at {root} registers no tool, function or reward; decorate a function "
            "with @register_tool"
        )
    return LoadedProject(root, config, registry)
