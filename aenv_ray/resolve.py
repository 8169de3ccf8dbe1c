"""Finding an environment definition's project directory by ``name@version``.

Built-in environments come first, then every directory on ``AENV_ENV_PATH`` (colon-separated),
each holding project directories with a ``config.json`` (or being one). A bare ``name`` means
its highest version.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

from aenv_ray.errors import EnvironmentNotFoundError

__all__ = ["available_environments", "resolve_environment", "version_key"]


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of a version: numeric parts compare as numbers, others as text.

    >>> sorted(["1.10.0", "1.2.0", "1.2.0-rc1"], key=version_key)
    ['1.2.0', '1.2.0-rc1', '1.10.0']
    """
    return tuple(
        (0, int(p)) if p.isdigit() else (1, p) for p in version.replace("-", ".").split(".")
    )


def _read_ref(config: Path) -> str | None:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        return f"{data['name']}@{data.get('version', '1.0.0')}"
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
    if "@" not in ref:
        versions = [r for r in known if r.split("@", 1)[0] == ref]
        if versions:
            best = max(versions, key=lambda r: version_key(r.split("@", 1)[1]))
            return best, known[best]
    names = sorted(known)
    close = difflib.get_close_matches(ref, names, n=1, cutoff=0.5)
    hint = f"; did you mean `{close[0]}`?" if close else "."
    where = "the built-in environments" + (f" and AENV_ENV_PATH={env_path}" if env_path else "")
    listing = ", ".join(f"`{n}`" for n in names) or "none"
    raise EnvironmentNotFoundError(
        f"no environment `{ref}` in {where} (known: {listing}){hint} Add its project's parent "
        "directory to AENV_ENV_PATH, or use Environment.from_project(path)",
        env_name=ref,
    )
