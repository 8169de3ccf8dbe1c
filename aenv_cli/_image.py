"""The image of a bundle for ``aenv build``: its build context, its Dockerfile, the builder.

A bundle (:mod:`aenv_ray.bundle`) is what the hub needs; an image is an optional extra.
``aenv build`` prepares the image's build context, ``DIR/image/``:

- ``Dockerfile``: the project's own (``buildConfig.dockerfile``, the one ``aenv init`` writes),
  else one written for the bundle (:func:`dockerfile_text`);
- ``env/``: the bundle's files (``config.json``, ``src/``, ``aenv.lock`` ...);
- ``wheels/``: one wheel of the aenv-ray that built the bundle (:mod:`._wheel`).

Every Dockerfile installs that wheel and the locked requirements, copies ``env/`` to ``/env``
and starts the runtime: aenv-ray never comes from a package index by name. The image is built
there with the first of docker, podman, buildah on PATH that can build here
(:func:`find_image_builder`), or by hand with ``docker build -t NAME:VERSION DIR/image``.

May import: the standard library, ``aenv_ray`` (bundle, config, errors, protocol ports).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aenv_ray.bundle import LOCK_NAME, Bundle, extract_bundle
from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, DEFAULT_MCP_PORT

__all__ = [
    "CONTEXT_DIR",
    "DEFAULT_BASE_IMAGE",
    "ENV_DIR",
    "IMAGE_BUILDERS",
    "WHEELS_DIR",
    "Context",
    "base_image",
    "dockerfile_lines",
    "dockerfile_text",
    "find_image_builder",
    "missing_sources",
    "prepare_context",
]

DEFAULT_BASE_IMAGE = "python:3.11-slim"
IMAGE_BUILDERS = ("docker", "podman", "buildah")
CONTEXT_DIR = "image"  # below aenv build's output directory
ENV_DIR = "env"  # in the context: the bundle's files
WHEELS_DIR = "wheels"  # in the context: the wheel of aenv-ray
_MARKER = ".aenv-context"  # in a context aenv build prepared: may be replaced by the next

_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


def base_image(config: EnvConfig) -> str:
    """``buildConfig.baseImage`` when set, else :data:`DEFAULT_BASE_IMAGE`."""
    extra = config.build_config.model_extra or {}
    image = extra.get("baseImage", extra.get("base_image"))
    if image is None or image == "":
        return DEFAULT_BASE_IMAGE
    if not isinstance(image, str) or not _IMAGE.fullmatch(image) or len(image) > 255:
        raise ConfigurationError(
            f"buildConfig.baseImage `{image!r}` is not an image reference; write e.g. "
            '"python:3.12-slim"'
        )
    return image


def dockerfile_lines(image: str) -> list[str]:
    """The instructions of an image built in the context :func:`prepare_context` makes:
    aenv-ray from ``wheels/`` and the lock's requirements, ``env/`` at ``/env``, the runtime.

    >>> print("\\n".join(dockerfile_lines("python:3.11-slim")[3:6]))
    COPY ["wheels/", "/tmp/aenv-wheels/"]
    COPY ["env/aenv.lock", "/env/aenv.lock"]
    RUN pip install --no-cache-dir /tmp/aenv-wheels/*.whl -r /env/aenv.lock \\
        && rm -rf /tmp/aenv-wheels
    """
    return [
        f"FROM {image}",
        "ENV PYTHONUNBUFFERED=1",
        "WORKDIR /env",
        f'COPY ["{WHEELS_DIR}/", "/tmp/aenv-wheels/"]',
        f'COPY ["{ENV_DIR}/{LOCK_NAME}", "/env/{LOCK_NAME}"]',
        f"RUN pip install --no-cache-dir /tmp/aenv-wheels/*.whl -r /env/{LOCK_NAME} \\\n"
        "    && rm -rf /tmp/aenv-wheels",
        f'COPY ["{ENV_DIR}/", "/env/"]',
        f"EXPOSE {DEFAULT_FUNCTIONS_PORT} {DEFAULT_MCP_PORT}",
        'CMD ["python", "-m", "sandbox_runtime", "/env", "--host", "0.0.0.0"]',
    ]


def dockerfile_text(bundle: Bundle) -> str:
    """The Dockerfile ``aenv build`` writes for a project that has none of its own."""
    return "\n".join(
        [
            f"# {bundle.config.ref}, bundle {bundle.digest}",
            f"# Written by `aenv build` into the image's context ({CONTEXT_DIR}/): {ENV_DIR}/ "
            f"holds the bundle's files, {WHEELS_DIR}/ the aenv-ray that built it.",
            f"# Build it there: docker build -t {bundle.config.image_tag} .",
            *dockerfile_lines(base_image(bundle.config)),
            "",
        ]
    )


@dataclass(frozen=True)
class Context:
    """A prepared build context: its directory and its Dockerfile."""

    path: Path
    dockerfile: Path


def prepare_context(
    bundle: Bundle, dockerfile: str, wheel: tuple[str, bytes], dest: str | Path
) -> Context:
    """Write the context ``dest``: ``Dockerfile``, ``env/`` (the bundle), ``wheels/FILE.whl``.

    The files go to a temporary directory next to ``dest`` that then replaces it, so ``dest``
    is whole or as it was. A ``dest`` that this function did not write (no ``.aenv-context``
    inside) and that is not empty is a :class:`ConfigurationError`: it is never removed.
    """
    dest = Path(dest)
    if (dest.exists() or dest.is_symlink()) and not _replaceable(dest):
        raise ConfigurationError(
            f"{dest} exists and was not written by `aenv build`; remove it, or pass another --out"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    old = partial.with_suffix(".old")
    try:
        extract_bundle(bundle.data, partial / ENV_DIR)
        (partial / WHEELS_DIR).mkdir()
        filename, data = wheel
        (partial / WHEELS_DIR / filename).write_bytes(data)
        (partial / "Dockerfile").write_text(dockerfile, encoding="utf-8")
        (partial / _MARKER).write_text(f"{bundle.digest}\n", encoding="utf-8")
        partial.chmod(0o755)
        if dest.exists():
            os.rename(dest, old)
        try:
            os.rename(partial, dest)
        except OSError:
            if old.exists():
                os.rename(old, dest)  # as it was
            raise
    except OSError as exc:
        raise ConfigurationError(f"cannot write the image's context {dest}: {exc}") from exc
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return Context(dest, dest / "Dockerfile")


def _replaceable(dest: Path) -> bool:
    if dest.is_symlink() or not dest.is_dir():
        return False
    return (dest / _MARKER).is_file() or not any(dest.iterdir())


# -- what a Dockerfile copies --------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[int, str]]:
    """``(line number, instruction)`` of a Dockerfile: comments dropped, ``\\`` continuations
    joined (the default escape character)."""
    found: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending:
            start = number
            if not line or line.startswith("#"):
                continue
        elif line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        found.append((start, (pending + line).strip()))
        pending = ""
    if pending.strip():
        found.append((start, pending.strip()))
    return found


def _sources(arguments: str) -> list[str] | None:
    """The context paths a COPY/ADD copies, or None when it copies from elsewhere (another
    stage, an image, a heredoc, a URL)."""
    words = arguments.split()
    while words and words[0].startswith("--"):
        if words[0].startswith("--from="):
            return None
        words.pop(0)
    rest = " ".join(words)
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            words = parsed
    sources = words[:-1]
    if any(s.startswith(("<<", "git@")) or "://" in s for s in sources):
        return None
    return [s for s in sources if "$" not in s]  # a build argument: its value is unknown here


def missing_sources(dockerfile: str, context: str | Path) -> list[tuple[int, str]]:
    """``(line, source)`` of every COPY/ADD source that ``context`` does not hold.

    >>> missing_sources('FROM x\\nCOPY ["a.txt", "/app/"]\\nCOPY --from=b /x /y\\n', "/nonexistent")
    [(2, 'a.txt')]
    """
    context = Path(context)
    missing = []
    for number, instruction in _instructions(dockerfile):
        keyword, _, arguments = instruction.partition(" ")
        if keyword.upper() not in ("COPY", "ADD"):
            continue
        for source in _sources(arguments) or ():
            relative = source.lstrip("/") or "."
            if any(c in relative for c in "*?["):
                found = any(True for _ in context.glob(relative.rstrip("/")))
            else:
                found = (context / relative).exists()
            if not found:
                missing.append((number, source))
    return missing


def find_image_builder() -> tuple[str | None, list[str]]:
    """The path of the first of docker, podman, buildah on PATH that can build here (None: no
    such one), and why each one found before it cannot (``docker: Cannot connect to ...``):
    docker and podman need their daemon or service (``NAME info`` answers), buildah none."""
    problems: list[str] = []
    for name in IMAGE_BUILDERS:
        path = shutil.which(name)
        if path is None:
            continue
        problem = _unusable(path)
        if problem is None:
            return path, problems
        problems.append(f"{name}: {problem}")
    return None, problems


def _unusable(builder: str) -> str | None:
    """Why ``builder`` cannot build here (docker/podman without a daemon), or None."""
    if Path(builder).name == "buildah":  # daemonless
        return None
    try:
        done = subprocess.run(
            [builder, "info"], capture_output=True, text=True, errors="replace", timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = done.stderr if done.stderr.strip() else done.stdout
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    return lines[-1] if lines else f"`{Path(builder).name} info` exited {done.returncode}"
