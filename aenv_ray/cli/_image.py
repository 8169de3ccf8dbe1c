"""The image of a bundle for ``aenv build``: its Dockerfile and the container builder.

A bundle (:mod:`aenv_ray.bundle`) is what the hub needs; an image is an optional extra that
``aenv build`` makes with the first of docker, podman, buildah on PATH. The Dockerfile installs
the locked requirements and this aenv-ray, copies the bundle's files and starts the runtime.

May import: the standard library, ``aenv_ray`` (bundle, config, errors, protocol ports, version).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from aenv_ray import __version__
from aenv_ray.bundle import LOCK_NAME, Bundle
from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, DEFAULT_MCP_PORT

__all__ = [
    "DEFAULT_BASE_IMAGE",
    "IMAGE_BUILDERS",
    "base_image",
    "dockerfile_text",
    "find_image_builder",
    "write_dockerfile",
]

DEFAULT_BASE_IMAGE = "python:3.11-slim"
IMAGE_BUILDERS = ("docker", "podman", "buildah")

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


def dockerfile_text(bundle: Bundle) -> str:
    """The Dockerfile of :func:`write_dockerfile`."""
    top_files = [n for n in bundle.files if "/" not in n and n != LOCK_NAME]
    top_dirs = sorted({n.split("/", 1)[0] for n in bundle.files if "/" in n})
    copies = [f"COPY {json.dumps([*top_files, '/env/'])}"]
    copies += [f"COPY {json.dumps([f'{d}/', f'/env/{d}/'])}" for d in top_dirs]
    return "\n".join(
        [
            f"# {bundle.config.ref}, bundle {bundle.digest}",
            "# Written by `aenv build`; build it in a directory holding the bundle's files.",
            f"FROM {base_image(bundle.config)}",
            "ENV PYTHONUNBUFFERED=1",
            "WORKDIR /env",
            f'COPY ["{LOCK_NAME}", "/env/{LOCK_NAME}"]',
            f'RUN pip install --no-cache-dir "aenv-ray=={__version__}" -r /env/{LOCK_NAME}',
            *copies,
            f"EXPOSE {DEFAULT_FUNCTIONS_PORT} {DEFAULT_MCP_PORT}",
            'CMD ["python", "-m", "sandbox_runtime", "/env", "--host", "0.0.0.0"]',
            "",
        ]
    )


def write_dockerfile(bundle: Bundle, out_dir: str | Path) -> Path:
    """Write ``out_dir/Dockerfile`` for the bundle's files (the build context holds them)."""
    path = Path(out_dir) / "Dockerfile"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dockerfile_text(bundle), encoding="utf-8")
    return path


def find_image_builder() -> str | None:
    """The path of the first of docker, podman, buildah on PATH, or None."""
    for name in IMAGE_BUILDERS:
        if found := shutil.which(name):
            return found
    return None
