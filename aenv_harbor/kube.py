"""A Harbor task's environment on Kubernetes: the image its pod runs.

On the Kubernetes engine the pod is the box: one instance of ``harbor-pod@1.0.0``
(``aenv_harbor/pod``) is a ``DualContainer`` pod whose ``datasource`` container runs the task's
own image, with aenv-ray's exec helper placed in it by the pod's init container (as for any
image without aenv-ray: docs/kubernetes.md, *Two containers*), and whose ``runtime`` container
relays Harbor's commands and files to that helper. The engine's pods run as user 65534 with a
read-only root file system and no capability, and that does not change for Harbor; so the
task's image is *derived*: the task's ``environment/Dockerfile`` (or ``FROM`` the task's
``docker_image``) plus :data:`LAYER`, which moves Harbor's writable paths (``/logs``,
``/tests``, ``/solution``, ``/runtime``, ``/root`` and the image's ``WORKDIR``) into the pod's
workspace (``/harbor``, an ``emptyDir``) by symbolic links, their contents kept as a seed that
``start`` copies there.

The operator's image builder makes it: a command (``AENV_HARBOR_BUILDER`` or ``--ek builder=``)
with ``{tag}``, ``{dockerfile}`` and ``{context}`` in it, such as ``docker build -t {tag} -f
{dockerfile} {context} && docker push {tag}``, or the real-node kit's ``build-image -t {tag} -f
{dockerfile} {context}``. The tag is content-keyed (:func:`derived_tag`): ``REGISTRY/harbor-task:``
and the first 16 hex digits of the SHA-256 of the layer, the Dockerfile and every file of
``environment/``, so an unchanged task is built once per builder (a marker under
``~/.cache/aenv-ray/harbor-images`` remembers it; Harbor's ``--force-build`` builds again).

    >>> text = derived_dockerfile("FROM debian:bookworm-slim\\nWORKDIR /app\\n")
    >>> text.splitlines()[:2], "ln -s" in text
    (['FROM debian:bookworm-slim', 'WORKDIR /app'], True)

May import: the standard library, aenv_ray.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from aenv_ray.errors import ConfigurationError

__all__ = [
    "BUILDER_VARIABLE",
    "LAYER",
    "REGISTRY_VARIABLE",
    "WORKSPACE",
    "build_image",
    "derived_dockerfile",
    "derived_tag",
    "layer",
    "seed_command",
]

BUILDER_VARIABLE = "AENV_HARBOR_BUILDER"
"""The operator's image builder: a command line with ``{tag}``, ``{dockerfile}``, ``{context}``."""
REGISTRY_VARIABLE = "AENV_HARBOR_REGISTRY"
"""Where derived images are tagged (default: ``AENV_K8S_IMAGE_PREFIX``)."""
WORKSPACE = "/harbor"
"""The pod's workspace (harbor-pod's ``deployConfig.workspace``): the box's writable paths."""
WRITABLE = ("/root", "/logs", "/tests", "/solution", "/runtime")
"""Harbor's paths (and ``$HOME``) made writable, with the image's ``WORKDIR``."""


def layer(paths: tuple[str, ...] = ()) -> str:
    """:data:`LAYER` with ``paths`` (absolute: the task's ``workdir``) made writable too."""
    for path in paths:
        if not path.startswith("/") or any(c in path for c in "\"'$`\\\n"):
            raise ConfigurationError(f"{path!r} is not a plain absolute path")
    extra = "".join(f' "{path}"' for path in paths)
    return LAYER.replace('"$wd"; do', f'"$wd"{extra}; do', 1)


LAYER = f"""
# aenv-ray's Harbor layer (aenv_harbor.kube): the pod's root file system is read-only and its
# user is 65534, so Harbor's paths and the WORKDIR become links into the pod's workspace
# ({WORKSPACE}, an emptyDir), their contents kept under /aenv-harbor/seed for `start` to copy.
USER root
RUN set -e; wd="$(pwd)"; mkdir -p /aenv-harbor/seed; printf '%s\\n' "$wd" > /aenv-harbor/workdir; \\
    : > /aenv-harbor/links; \\
    for d in {" ".join(WRITABLE)} "$wd"; do \\
        case "$d" in /|{WORKSPACE}|{WORKSPACE}/*|/tmp|/tmp/*|/aenv-*|/proc*|/sys*|/dev*) \\
            continue;; esac; \\
        [ -L "$d" ] && continue; \\
        inside=; while read -r p; do case "$d" in "$p"/*) inside=1;; esac; \\
        done < /aenv-harbor/links; [ -n "$inside" ] && continue; \\
        if [ -e "$d" ]; then \\
            mkdir -p "/aenv-harbor/seed$(dirname "$d")"; mv "$d" "/aenv-harbor/seed$d"; \\
        fi; \\
        mkdir -p "$(dirname "$d")"; ln -s "{WORKSPACE}/box$d" "$d"; \\
        printf '%s\\n' "$d" >> /aenv-harbor/links; \\
    done; \\
    chmod -R a+rX /aenv-harbor
WORKDIR /
ENV HOME=/root
"""


def derived_dockerfile(
    dockerfile: str | None = None, *, image: str | None = None, paths: tuple[str, ...] = ()
) -> str:
    """The derived image's Dockerfile: the task's ``dockerfile`` (every stage, as written), or
    ``FROM image``, then :data:`LAYER` (with ``paths`` writable too: :func:`layer`)."""
    if dockerfile is None:
        if not image:
            raise ConfigurationError("a derived image needs the task's Dockerfile or its image")
        dockerfile = f"FROM {image}\n"
    return dockerfile.rstrip("\n") + "\n" + layer(paths)


def _files(context: Path | None) -> Iterator[tuple[str, bytes]]:
    if context is None or not context.is_dir():
        return
    for path in sorted(context.rglob("*")):
        if path.is_file():
            yield path.relative_to(context).as_posix(), path.read_bytes()


def derived_tag(registry: str, dockerfile_text: str, context: Path | None) -> str:
    """``REGISTRY/harbor-task:HEX16``, keyed by the derived Dockerfile and the context's files.

    >>> derived_tag("reg.local/aenv", "FROM x\\n", None)
    'reg.local/aenv/harbor-task:5e50475e952eb91b'
    """
    digest = hashlib.sha256(dockerfile_text.encode())
    for name, data in _files(context):
        digest.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(data).digest())
    return f"{registry.rstrip('/')}/harbor-task:{digest.hexdigest()[:16]}"


def _markers() -> Path:
    base = os.environ.get("AENV_HARBOR_IMAGES_DIR")
    return Path(base) if base else Path.home() / ".cache" / "aenv-ray" / "harbor-images"


def build_image(
    builder: str,
    tag: str,
    dockerfile_text: str,
    context: Path,
    *,
    force: bool = False,
    timeout: float = 3600.0,
) -> bool:
    """Build ``tag`` with the operator's ``builder`` (once per tag: True when it built now).
    Two trials of one task wait for one build. A failed build is a ``RuntimeError`` with what
    the builder printed last."""
    markers = _markers()
    markers.mkdir(parents=True, exist_ok=True)
    marker = markers / (hashlib.sha256(f"{builder}\0{tag}".encode()).hexdigest()[:24] + ".built")
    with open(marker.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and not force:
            return False
        with tempfile.TemporaryDirectory(prefix="aenv-harbor-build-") as scratch:
            dockerfile = Path(scratch) / "Dockerfile"
            dockerfile.write_text(dockerfile_text)
            values = {"tag": tag, "dockerfile": str(dockerfile), "context": str(context)}
            try:
                line = builder.format(**{k: shlex.quote(v) for k, v in values.items()})
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigurationError(
                    f"{BUILDER_VARIABLE} `{builder}` is not a command line with {{tag}}, "
                    f"{{dockerfile}} and {{context}}: {exc}"
                ) from exc
            done = subprocess.run(
                ["/bin/sh", "-c", line],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if done.returncode != 0:
                said = (done.stderr.strip() or done.stdout.strip())[-2000:]
                raise RuntimeError(f"`{line}` exited {done.returncode}: {said}")
        with contextlib.suppress(OSError):
            marker.write_text(tag + "\n")
        return True


def seed_command() -> str:
    """What ``start`` runs in the task's container: the seed copied into the workspace, each
    link's target made, and the image's ``WORKDIR`` printed (exit 3: not a derived image)."""
    return (
        "set -e; [ -f /aenv-harbor/links ] || exit 3; "
        f"mkdir -p {WORKSPACE}/box; cp -R /aenv-harbor/seed/. {WORKSPACE}/box/; "
        f'while read -r d; do mkdir -p "{WORKSPACE}/box$d"; done < /aenv-harbor/links; '
        "cat /aenv-harbor/workdir"
    )
