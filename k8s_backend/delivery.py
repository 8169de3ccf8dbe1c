"""How an environment's code reaches its pod: which image the runtime container runs, and the
command that starts the sandbox runtime in it.

- :class:`OwnImage` (the default): the environment's own image, as ``aenv build`` writes its
  Dockerfile (the project at ``/env``): an ``artifacts`` image, else ``imagePrefix`` +
  ``name:version`` (or the engine's ``image_prefix`` when the project names none).
- :class:`HostProcess`: a cluster whose kubelet runs container commands as processes on one
  host (the test cluster of ``../shared/tools/k8s-real``): this host's Python serves the project
  where it lies. Images are ignored there; never use it on a real cluster.

Each also says where a ``DualContainer`` pod's init container finds the exec helper
(``exec_helper()``, read through :func:`exec_helper_of`): the generic aenv-ray image, or on a
host-process cluster this host's build of it.

    >>> from aenv_ray.config import EnvConfig
    >>> OwnImage("reg.example/aenv").runtime(EnvConfig(name="demo"), None)
    ('reg.example/aenv/demo:1.0.0', ['python', '-m', 'sandbox_runtime', '/env'])
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Protocol

from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError
from k8s_backend.exec_helper import RUNTIME_IMAGE, ExecHelper, helper_binary

__all__ = ["Delivery", "HostProcess", "OwnImage", "exec_helper_of"]

IMAGE_PROJECT = "/env"
"""Where ``aenv build``'s Dockerfile puts the project in the image."""


class Delivery(Protocol):
    """Chooses the runtime container's image and command for one environment."""

    def runtime(self, config: EnvConfig, project: Path | None) -> tuple[str, list[str]]:
        """``(image, command)``; the engine appends ``--host $(POD_IP) --port PORT``."""
        ...


def exec_helper_of(delivery: Delivery) -> ExecHelper:
    """Where ``delivery`` has a ``DualContainer`` pod find the exec helper: its own
    ``exec_helper()`` when it has one (a delivery may leave it out), else the generic aenv-ray
    image of this version."""
    placement = getattr(delivery, "exec_helper", None)
    return placement() if callable(placement) else ExecHelper()


class OwnImage:
    """The environment's own image (see the module docstring). ``image_prefix`` is the
    registry path for projects whose ``deployConfig.imagePrefix`` is empty; ``runtime_image``
    is the generic aenv-ray image whose exec helper ``DualContainer`` pods copy (default: the
    published image of this version)."""

    def __init__(self, image_prefix: str = "", *, runtime_image: str = RUNTIME_IMAGE) -> None:
        self.image_prefix = image_prefix.strip()
        self.runtime_image = runtime_image

    def exec_helper(self) -> ExecHelper:
        """The helper at its place in ``runtime_image``."""
        return ExecHelper(image=self.runtime_image)

    def runtime(self, config: EnvConfig, project: Path | None) -> tuple[str, list[str]]:
        image = config.image
        if image is None and self.image_prefix:
            prefix = self.image_prefix.rstrip("/") + "/"
            image = prefix + config.image_tag
        if image is None:
            raise ConfigurationError(
                f"{config.ref} names no image for the Kubernetes engine: set "
                "deployConfig.imagePrefix (then `aenv build` tags and you push "
                f"PREFIX/{config.image_tag}), add an artifacts entry "
                '{"type": "image", "content": "REF"}, or pass KubernetesEngine(image_prefix=...)'
            )
        return image, ["python", "-m", "sandbox_runtime", IMAGE_PROJECT]

    def __repr__(self) -> str:
        return f"OwnImage({self.image_prefix!r})"


class HostProcess:
    """The runtime as a process of this host's ``python`` (default: this interpreter), serving
    the project from its directory here: for a test cluster whose kubelet runs commands on this
    host. ``image`` is a placeholder such a kubelet ignores."""

    def __init__(
        self,
        python: str | None = None,
        *,
        image: str = "aenv-ray/host-process",
        shared_root: str | Path | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.image = image
        self.shared_root = str(shared_root) if shared_root else None

    def exec_helper(self) -> ExecHelper:
        """This host's build of the helper (built on first use), and a directory of this host
        for each ``DualContainer`` pod's shared files under ``shared_root`` (default:
        ``aenv-shared-<uid>`` in the temporary directory; keep it short, a socket's path must
        stay under 108 bytes). Nobody removes those directories but you."""
        root = self.shared_root or str(Path(tempfile.gettempdir()) / f"aenv-shared-{os.getuid()}")
        return ExecHelper(image=self.image, binary=str(helper_binary()), host_dir=root)

    def runtime(self, config: EnvConfig, project: Path | None) -> tuple[str, list[str]]:
        if project is None:
            raise ConfigurationError(
                f"{config.ref}: HostProcess delivery needs the project's directory on this host"
            )
        return self.image, [self.python, "-m", "sandbox_runtime", str(project)]

    def __repr__(self) -> str:
        return f"HostProcess({self.python!r})"
