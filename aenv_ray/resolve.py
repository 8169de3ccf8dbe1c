"""Finding an environment definition's project directory by ``name@version``.

Built-in environments come first, then every directory on ``AENV_ENV_PATH`` (colon-separated),
each holding project directories with a ``config.json`` (or being one). A bare ``name`` means
its highest version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aenv_ray.envref import EnvRef, closest
from aenv_ray.errors import EnvironmentNotFoundError

__all__ = ["available_environments", "resolve_environment"]


def _read_ref(config: Path) -> str | None:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        return str(EnvRef(data["name"], data.get("version", "1.0.0")))  # checks both parts
    except (OSError, ValueError, KeyError, TypeError):
        return None


def available_environments(env_path: str | None = None) -> dict[str, Path]:
    """``{"name@version": project_dir}`` of every environment ``Environment(name)`` can start
    without a server: the built-ins, then the projects on ``env_path`` (default: the
    ``AENV_ENV_PATH`` setting), an earlier one winning a name both have.

        >>> "mini-terminal@1.0.0" in available_environments("")
        True
    """
    from builtin_envs import builtin_refs

    if env_path is None:
        from aenv_ray.settings import get_settings

        env_path = get_settings().env_path

    found: dict[str, Path] = dict(builtin_refs())
    for entry in filter(None, env_path.split(os.pathsep)):
        base = Path(entry).expanduser()
        candidates = [base] if (base / "config.json").is_file() else sorted(base.glob("*/"))
        for project in candidates:
            ref = _read_ref(project / "config.json")
            if ref is not None:
                found.setdefault(ref, project.resolve())
    return found


def resolve_environment(ref: str, env_path: str | None = "") -> tuple[str, Path]:
    """``(name@version, project_dir)`` for ``ref`` (``name`` alone: its highest version), among
    the built-ins and ``env_path`` (``None``: the ``AENV_ENV_PATH`` setting).

    Raises :class:`EnvironmentNotFoundError` naming what exists and the closest match.
    """
    known = available_environments(env_path)
    if ref in known:
        return ref, known[ref]
    wanted = EnvRef.parse(ref)
    if wanted.is_latest and wanted.tenant is None:
        refs = [EnvRef.parse(r) for r in known]
        versions = [r for r in refs if r.name == wanted.name]
        if versions:
            best = str(max(versions, key=EnvRef.sort_key))
            return best, known[best]
    names = sorted(known)
    close = closest(ref, names, cutoff=0.5)
    hint = f"; did you mean `{close}`?" if close else "."
    where = "the built-in environments" + (f" and AENV_ENV_PATH={env_path}" if env_path else "")
    listing = ", ".join(f"`{n}`" for n in names) or "none"
    raise EnvironmentNotFoundError(
        f"no environment `{ref}` in {where} (known: {listing}){hint} Add its project's parent "
        "directory to AENV_ENV_PATH, or use Environment.from_project(path)",
        env_name=ref,
    )
