"""The exec helper of ``DualContainer`` pods (``aenv_exec.c``): how it is built, and where it
comes from in a pod.

The helper is a small C program, linked statically so that it runs in a second container whose
image has no libc it could use (``scratch``, distroless, Alpine's musl): no Python and no shell
needed. :func:`build` compiles it with the system's C compiler; :func:`helper_binary` builds it
once per machine and caches it by the source's hash (for a test cluster whose kubelet runs pod
commands on this host, and for the tests). The generic aenv-ray image carries it at
:data:`IMAGE_PATH`, built there with the same flags (:data:`CFLAGS`, ``-static -s``); a pod's
init container copies it from that image into the volume both containers share
(:class:`ExecHelper`).

    >>> ExecHelper(image="ghcr.io/aenv-ray/aenv-ray:0.1.0").binary
    '/opt/aenv-ray/bin/aenv-exec'
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from aenv_ray import __version__
from aenv_ray.errors import ConfigurationError

__all__ = [
    "CFLAGS",
    "IMAGE_PATH",
    "RUNTIME_IMAGE",
    "SOURCE",
    "ExecHelper",
    "build",
    "helper_binary",
]

log = logging.getLogger("k8s_backend")

SOURCE = Path(__file__).with_name("aenv_exec.c")
IMAGE_PATH = "/opt/aenv-ray/bin/aenv-exec"
"""Where the generic aenv-ray image holds the helper."""
RUNTIME_IMAGE = f"ghcr.io/aenv-ray/aenv-ray:{__version__}"
"""The generic aenv-ray image of this version: the init container that places the helper."""
CFLAGS = ("-O2", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong", "-Wall", "-Wextra")


@dataclass(frozen=True)
class ExecHelper:
    """Where a ``DualContainer`` pod's init container finds the helper: ``binary`` in
    ``image``. ``host_dir`` is only for a test cluster whose kubelet runs pod commands as
    processes of one host and mounts no volumes: the pod's shared directory is then
    ``host_dir/<instance id>`` on that host instead of an ``emptyDir``, and the second container
    runs ``binary`` (a host path) itself (see :mod:`k8s_backend.manifests`)."""

    image: str = RUNTIME_IMAGE
    binary: str = IMAGE_PATH
    host_dir: str | None = field(default=None)


def build(target: Path, *, static: bool = True, extra: tuple[str, ...] = ()) -> bool:
    """Compile the helper to ``target``; True when it is linked statically. Without a static C
    library (``libc.a``) it falls back to dynamic linking, and says so in the log. Raises
    :class:`ConfigurationError` when there is no C compiler or the build fails."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise ConfigurationError(
            "no C compiler (cc) to build the exec helper of DualContainer pods; install one "
            "(e.g. apt-get install gcc libc6-dev)"
        )
    attempts = [True, False] if static else [False]
    failure = ""
    for linked_statically in attempts:
        flags = [*CFLAGS, *(("-static",) if linked_statically else ()), *extra]
        result = subprocess.run(
            [compiler, *flags, "-o", str(target), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            if static and not linked_statically:
                log.warning(
                    "built the exec helper dynamically linked: no static C library",
                    extra={"path": str(target), "why": failure[-300:]},
                )
            os.chmod(target, 0o755)
            return linked_statically
        failure = result.stderr.strip()
    raise ConfigurationError(f"building {SOURCE.name} failed: {failure[-500:]}")


def _cache_dir() -> Path:
    import platformdirs

    return platformdirs.user_cache_path("aenv")


def helper_binary() -> Path:
    """The helper built for this machine (once; cached by the source's hash)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = _cache_dir() / f"aenv-exec-{digest}"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / "aenv-exec"
        build(built)
        os.replace(built, target)  # atomic: concurrent builders agree on the result
    log.info("built the exec helper", extra={"path": str(target)})
    return target
