"""Load an environment project directory: ``config.json`` plus the modules under ``src/``."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError, DefinitionError
from aenv_ray.registry import Registry

__all__ = ["LoadedProject", "load_project"]


class LoadedProject:
    """A project's parsed configuration and the registry its modules filled."""

    def __init__(self, root: Path, config: EnvConfig, registry: Registry) -> None:
        self.root = root
        self.config = config
        self.registry = registry


def _module_files(src: Path) -> list[Path]:
    files = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if any(part.startswith(("_", ".")) for part in rel.parts):
            continue  # private helpers are imported by the modules that need them
        if rel.parts[0] in ("tests", "test") or path.name.startswith("test_"):
            continue
        files.append(path)
    return files


def _is_inside(filename: str | None, src: Path) -> bool:
    if not filename:
        return False
    try:
        return Path(filename).resolve().is_relative_to(src)
    except (OSError, ValueError):
        return False


def _where(exc: BaseException, path: Path, src: Path) -> str:
    """``file:line`` where an import failed: the innermost frame inside the project (a sibling
    the module imported, say), or the line of a syntax error; else the module itself."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{Path(exc.filename).resolve()}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_inside(f.filename, src)]
    if frames and frames[-1].lineno:
        return f"{Path(frames[-1].filename).resolve()}:{frames[-1].lineno}"
    return str(path)


def load_project(root: str | Path) -> LoadedProject:
    """Import every public module under ``root/src`` (or ``root`` if it has no ``src/``).

    ``src`` is put on ``sys.path`` first, so modules import their siblings as the seeds allow
    (``from bash_session import ...``). An import error is a :class:`DefinitionError` naming the
    file and the line inside it; so is a project that registers nothing.
    """
    root = Path(root).resolve()
    config = EnvConfig.load(root)
    src = root / "src" if (root / "src").is_dir() else root
    files = _module_files(src)
    if not files:
        raise ConfigurationError(
            f"{src} holds no Python module; put the module with your @register_tool functions "
            "there (`aenv init NAME` creates an example)"
        )
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    # A module of this project imported by an earlier load (the same project loaded twice in
    # one process) is imported afresh, so that its decorators register into this registry.
    for name, module in list(sys.modules.items()):
        if _is_inside(getattr(module, "__file__", None), src):
            del sys.modules[name]
    registry = Registry()
    with registry.collecting():
        for path in files:
            rel = path.relative_to(src).with_suffix("")
            module_name = ".".join(rel.parts)
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
                del sys.modules[module_name]
                raise
            except Exception as exc:
                sys.modules.pop(module_name, None)
                where = _where(exc, path, src)
                raise DefinitionError(
                    f"importing {path} failed at {where}: {type(exc).__name__}: {exc}",
                    location=where,
                ) from exc
    if not registry.tools and not registry.functions and registry.reward is None:
        raise DefinitionError(
            f"{config.ref} at {root} registers no tool, function or reward; decorate a function "
            "with @register_tool"
        )
    return LoadedProject(root, config, registry)
