"""Finding an environment definition's project directory by ``name@version``.

Built-in environments come first, then every directory on ``AENV_ENV_PATH`` (colon-separated),
each holding project directories with a ``config.json`` (or being one). A bare ``name`` means
its highest version. The built-ins are found through the ``aenv_ray.builtins`` entry points
(:data:`BUILTINS_GROUP`): each names a callable returning ``{"name@version": project_dir}``
(aenv-ray's own is ``builtin_envs.builtin_refs``), so another package ships environments the
same way.

A project whose ``config.json`` cannot be read, is not JSON or names no valid ``name@version``
is **broken**: it names no environment, so lookups pass it by, but it is not forgotten. A
lookup that fails lists the broken projects with what is wrong in each (the file and the
problem), and :func:`broken_environments` lists them for a listing (``aenv list`` without a
hub shows them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aenv_ray.envref import EnvRef, closest_ref
from aenv_ray.errors import ConfigurationError, EnvironmentNotFoundError

__all__ = [
    "BUILTINS_GROUP",
    "available_environments",
    "broken_environments",
    "builtin_environments",
    "resolve_environment",
]

BUILTINS_GROUP = "aenv_ray.builtins"
"""The entry-point group of the packages that ship environments (see the module's docstring)::

    [project.entry-points."aenv_ray.builtins"]
    my-envs = "my_envs:environments"
"""

_SHOWN_BROKEN = 3  # broken projects a not-found message names (then "and N more")


def _read_ref(config: Path) -> str:
    """The ``name@version`` that ``config`` declares; ConfigurationError naming the file and
    what is wrong with it when it declares none."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read {config} ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ConfigurationError(f"{config} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigurationError(f"{config} must hold a JSON object")
    if "name" not in data:
        raise ConfigurationError(f"{config} has no `name`")
    name, version = data["name"], data.get("version", "1.0.0")
    if not isinstance(name, str) or not isinstance(version, str):
        raise ConfigurationError(f"{config}: `name` and `version` must be strings")
    try:
        return str(EnvRef(name, version))  # checks both parts
    except ConfigurationError as exc:
        raise ConfigurationError(f"{config}: {exc}") from exc


def builtin_environments() -> dict[str, Path]:
    """``{"name@version": project_dir}`` of every installed package's built-in environments
    (:data:`BUILTINS_GROUP`), in the order of the entry points' names; an earlier one wins a
    name two packages have.

        >>> "tau2@1.0.0" in builtin_environments()
        True
    """
    from aenv_ray._entry_points import entry_points_of

    found: dict[str, Path] = {}
    for entry in entry_points_of(BUILTINS_GROUP).values():
        try:
            refs = entry.load()()
        except ImportError as exc:
            raise ConfigurationError(
                f"the built-in environments of `{entry.name}` ({entry.value}) cannot be "
                f"imported: {exc}; reinstall that package"
            ) from exc
        for ref, project in refs.items():
            found.setdefault(str(ref), Path(project))
    return found


def _scan(env_path: str | None) -> tuple[dict[str, Path], dict[Path, str]]:
    """The environments on ``env_path`` (after the built-ins) and its broken projects:
    ``({"name@version": project_dir}, {config.json: what is wrong})``."""
    if env_path is None:
        from aenv_ray.settings import get_settings

        env_path = get_settings().env_path

    found: dict[str, Path] = builtin_environments()
    broken: dict[Path, str] = {}
    for entry in filter(None, env_path.split(os.pathsep)):
        base = Path(entry).expanduser()
        candidates = [base] if (base / "config.json").is_file() else sorted(base.glob("*/"))
        for project in candidates:
            config = project / "config.json"
            if not config.is_file():
                continue  # not a project (src/, dist/, __pycache__)
            try:
                ref = _read_ref(config)
            except ConfigurationError as exc:
                broken.setdefault(config.resolve(), str(exc))
                continue
            found.setdefault(ref, project.resolve())
    return found, broken


def available_environments(env_path: str | None = None) -> dict[str, Path]:
    """``{"name@version": project_dir}`` of every environment ``Environment(name)`` can start
    without a server: the built-ins, then the projects on ``env_path`` (default: the
    ``AENV_ENV_PATH`` setting), an earlier one winning a name both have. Broken projects are
    not among them (:func:`broken_environments`).

        >>> "mini-terminal@1.0.0" in available_environments("")
        True
    """
    return _scan(env_path)[0]


def broken_environments(env_path: str | None = None) -> dict[Path, str]:
    """``{config.json: what is wrong}`` for every project on ``env_path`` (default: the
    ``AENV_ENV_PATH`` setting) that names no environment because its ``config.json`` is broken.

        >>> broken_environments("")
        {}
    """
    return _scan(env_path)[1]


def _broken_note(broken: dict[Path, str]) -> str:
    """`` Skipped N broken project(s) ...: WHAT IS WRONG.`` for a not-found message, or ``""``."""
    if not broken:
        return ""
    shown = "; ".join(list(broken.values())[:_SHOWN_BROKEN])
    more = len(broken) - _SHOWN_BROKEN
    extra = f" (and {more} more: `aenv list` shows them)" if more > 0 else ""
    return f" Skipped {len(broken)} broken project(s) on AENV_ENV_PATH: {shown}{extra}."


def resolve_environment(ref: str, env_path: str | None = "") -> tuple[str, Path]:
    """``(name@version, project_dir)`` for ``ref`` (``name`` alone: its highest version), among
    the built-ins and ``env_path`` (``None``: the ``AENV_ENV_PATH`` setting).

    Raises :class:`EnvironmentNotFoundError` naming what exists and the closest match.
    """
    if env_path is None:
        from aenv_ray.settings import get_settings

        env_path = get_settings().env_path
    known, broken = _scan(env_path)
    if ref in known:
        return ref, known[ref]
    wanted = EnvRef.parse(ref)
    if wanted.is_latest and wanted.tenant is None:
        refs = [EnvRef.parse(r) for r in known]
        versions = [r for r in refs if r.name == wanted.name]
        if versions:
            best = str(max(versions, key=EnvRef.sort_key))
            return best, known[best]
    # a broken project in a directory of the name asked for is the likely culprit: first
    broken = dict(sorted(broken.items(), key=lambda item: item[0].parent.name != wanted.name))
    names = sorted(known)
    close = closest_ref(ref, names)
    hint = f"; did you mean `{close}`?" if close else "."
    where = "the built-in environments" + (f" and AENV_ENV_PATH={env_path}" if env_path else "")
    listing = ", ".join(f"`{n}`" for n in names) or "none"
    raise EnvironmentNotFoundError(
        f"no environment `{ref}` in {where} (known: {listing}){hint}{_broken_note(broken)} "
        "Add its project's parent directory to AENV_ENV_PATH, or give the project's directory "
        "instead of a name (Environment.from_project(path); on the command line a path such as "
        "./NAME)",
        env_name=ref,
    )
