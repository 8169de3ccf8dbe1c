"""How an environment's code reaches its pod: which image the runtime container runs, and the
command that starts the sandbox runtime in it.

- :class:`OwnImage` (the default): the environment's own image, as ``aenv build`` writes its
  Dockerfile (the project at ``/env``): an ``artifacts`` image, else ``imagePrefix`` +
  ``name:version`` (or the engine's ``image_prefix`` when the project names none).
- :class:`HubBundle`: no image per environment: one generic runtime image (aenv-ray and
  Python) fetches the version's bundle from EnvHub by digest when the pod starts, checks the
  digest, and serves it (``python -m sandbox_runtime --bundle URL --digest sha256:HEX``).
- :class:`HostProcess`: a cluster whose kubelet runs container commands as processes on one
  host (a test cluster such as k8s-real): this host's Python serves the project where it lies.
  Images are ignored there; never use it on a real cluster.

**Built-in environments need no image of their own and no hub.** The generic runtime image
(``deploy/Dockerfile``) installs aenv-ray with its built-ins (:mod:`builtin_envs`), so a pod of
a built-in runs that image and serves the image's own copy by name: ``python -m
sandbox_runtime --builtin NAME@VERSION --definition sha256:HEX`` (:func:`builtin_of` says whether
a project is one), the digest being the engine's copy's definition, which the image's copy must
match (:func:`builtin_command`).
:class:`OwnImage` does so for a built-in whose ``config.json`` names no image, whatever its
``image_prefix`` (nothing builds ``PREFIX/mini-terminal:1.0.0``), and :class:`HubBundle` for
every built-in (a built-in cannot be pushed, so it has no bundle to fetch). What runs is the
image's aenv-ray: build the runtime image from the checkout or wheel your engines run.

A delivery gives the runtime container's image and command (:meth:`Delivery.runtime`) and the
variables aenv-ray adds to it (:meth:`Delivery.env`: the hub key of :class:`HubBundle`). Each
also says where a ``DualContainer`` pod's init container finds the exec helper
(``exec_helper()``, read through :func:`exec_helper_of`): the generic aenv-ray image, or on a
host-process cluster this host's build of it.

    >>> from aenv_ray.config import EnvConfig
    >>> OwnImage("reg.example/aenv").runtime(EnvConfig(name="demo"), None)
    ('reg.example/aenv/demo:1.0.0', ['python', '-m', 'sandbox_runtime', '/env'])
    >>> digest = "sha256:" + 64 * "a"
    >>> pushed = EnvConfig(name="demo", artifacts=[{"type": "bundle", "digest": digest}])
    >>> image, command = HubBundle("http://envhub.aenv.svc:8080").runtime(pushed, None)
    >>> image == RUNTIME_IMAGE, command[3:5], command[-2:] == ["--digest", digest]
    (True, ['--bundle', 'http://envhub.aenv.svc:8080/v1/envs/demo/1.0.0/bundle'], True)
    >>> from aenv_ray.resolve import builtin_environments
    >>> terminal = builtin_environments()["mini-terminal@1.0.0"]
    >>> image, command = OwnImage("reg.example/aenv").runtime(EnvConfig.load(terminal), terminal)
    >>> image == RUNTIME_IMAGE, command[3:5]
    (True, ['--builtin', 'mini-terminal@1.0.0'])
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from aenv_ray.bundle import DIGEST_MARKER, definition_digest
from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError
from aenv_ray.protocol import BUNDLE_KEY_ENV
from aenv_ray.resolve import builtin_environments
from k8s_backend.exec_helper import RUNTIME_IMAGE, ExecHelper, helper_binary

__all__ = [
    "RUNTIME_IMAGE",
    "Delivery",
    "HostProcess",
    "HubBundle",
    "OwnImage",
    "builtin_command",
    "builtin_of",
    "bundle_digest",
    "exec_helper_of",
]

IMAGE_PROJECT = "/env"
"""Where ``aenv build``'s Dockerfile puts the project in the image."""
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class Delivery(Protocol):
    """Chooses the runtime container's image, command and added variables for one
    environment."""

    def runtime(self, config: EnvConfig, project: Path | None) -> tuple[str, list[str]]:
        """``(image, command)``; the engine appends ``--host $(POD_IP) --port PORT``."""
        ...

    def env(self, config: EnvConfig) -> list[dict[str, Any]]:
        """Variables (Kubernetes ``EnvVar`` objects) the runtime container needs besides
        aenv-ray's own; a user's variables cannot replace them."""
        ...


def bundle_digest(config: EnvConfig, project: Path | None) -> str | None:
    """The digest of the bundle a version was published as: its ``artifacts`` entry of type
    ``bundle`` (a hub's record of it), else the marker an unpacked bundle carries (a hub's
    ``bundles/`` directory, :func:`aenv_ray.bundle.extract_bundle`); None for a project that
    was never pushed.

        >>> bundle_digest(EnvConfig(name="demo"), None) is None
        True
    """
    for artifact in config.artifacts:
        digest = artifact.get("digest")
        if (
            artifact.get("type") == "bundle"
            and isinstance(digest, str)
            and _DIGEST.fullmatch(digest)
        ):
            return digest
    if project is not None:
        try:
            marked = (Path(project) / DIGEST_MARKER).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return marked if _DIGEST.fullmatch(marked) else None
    return None


def builtin_of(config: EnvConfig, project: Path | None) -> str | None:
    """``name@version`` when ``project`` is the directory of an installed built-in environment
    (:func:`aenv_ray.resolve.builtin_environments`) and ``config`` is its definition, else
    None: a project elsewhere (on ``AENV_ENV_PATH``, a hub's unpacked bundle) is never taken
    for a built-in, whatever its name.

        >>> builtin_of(EnvConfig(name="mini-terminal"), Path("/tmp/mini-terminal")) is None
        True
    """
    if project is None:
        return None
    installed = builtin_environments().get(config.ref)
    if installed is None:
        return None
    try:
        same = Path(project).resolve() == installed.resolve()
    except OSError:
        return None
    return config.ref if same else None


def builtin_command(ref: str, project: Path, python: str = "python") -> list[str]:
    """The runtime's command serving built-in ``ref`` from the image's installed packages, if
    the image's copy is the definition at ``project`` (its
    :func:`~aenv_ray.bundle.definition_digest`): an image of another aenv-ray fails the pod at
    once, saying so, instead of serving other tools.

    >>> from aenv_ray.resolve import builtin_environments
    >>> terminal = builtin_environments()["mini-terminal@1.0.0"]
    >>> command = builtin_command("mini-terminal@1.0.0", terminal)
    >>> command[3:6], command[6].startswith("sha256:")
    (['--builtin', 'mini-terminal@1.0.0', '--definition'], True)
    """
    definition = definition_digest(project)
    return [python, "-m", "sandbox_runtime", "--builtin", ref, "--definition", definition]


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
    published image of this version, ``AENV_K8S_RUNTIME_IMAGE``), and the image that serves a
    built-in whose ``config.json`` names no image of its own (:func:`builtin_command`)."""

    def __init__(self, image_prefix: str = "", *, runtime_image: str = RUNTIME_IMAGE) -> None:
        self.image_prefix = image_prefix.strip()
        self.runtime_image = runtime_image

    def exec_helper(self) -> ExecHelper:
        """The helper at its place in ``runtime_image``."""
        return ExecHelper(image=self.runtime_image)

    def runtime(self, config: EnvConfig, project: Path | None) -> tuple[str, list[str]]:
        builtin = builtin_of(config, project) if config.image is None else None
        if builtin is not None and project is not None:
            return self.runtime_image, builtin_command(builtin, project)
        image = config.image_below(self.image_prefix)
        if image is None:
            raise ConfigurationError(
                f"{config.ref} names no image for the Kubernetes engine: set "
                "deployConfig.imagePrefix (then `aenv build` tags and you push "
                f"PREFIX/{config.image_tag}), add an artifacts entry "
                '{"type": "image", "content": "REF"}, or pass KubernetesEngine(image_prefix=...)'
            )
        return image, ["python", "-m", "sandbox_runtime", IMAGE_PROJECT]

    def env(self, config: EnvConfig) -> list[dict[str, Any]]:
        return []

    def __repr__(self) -> str:
        return f"OwnImage({self.image_prefix!r})"


class HubBundle:
    """One generic runtime image for every environment: the pod fetches the version's bundle
    from the hub at ``hub_url`` (as the pod reaches it, e.g. ``http://envhub.aenv.svc:8080``),
    checks its digest and serves it (see :mod:`sandbox_runtime._fetch`). Only versions pushed
    to that hub can run: the digest comes from the version's record or its unpacked bundle.
    A built-in needs no bundle: the same image serves its own copy (:func:`builtin_command`).

    Args:
        hub_url: the hub, as seen from inside the pods.
        api_key: the hub key the pods fetch with, given to the runtime as ``AENV_BUNDLE_KEY``
            in the pod's spec (whoever may read pods in the namespace may read it; the runtime
            drops it before the environment's code loads). Or:
        api_key_secret: ``(secret name, key)`` of a Secret in the namespace that holds the key
            (the pod reads it; the engine never sees it).
        image: the runtime image (default :data:`RUNTIME_IMAGE`, ``AENV_K8S_RUNTIME_IMAGE``).
        python: the image's Python (a test cluster that runs commands on its host: this
            host's interpreter).
        bundle_dir: where the runtime unpacks (default: its temporary directory, ``/tmp``).
        max_bundle: the most bytes a pod downloads (default: the runtime's, 64 MiB).
    """

    def __init__(
        self,
        hub_url: str,
        api_key: str | None = None,
        *,
        api_key_secret: tuple[str, str] | None = None,
        image: str | None = None,
        python: str = "python",
        bundle_dir: str | None = None,
        max_bundle: int | None = None,
    ) -> None:
        url = hub_url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"HubBundle needs the hub's http(s) URL as the pods reach it, got {hub_url!r} "
                "(AENV_K8S_HUB_URL)"
            )
        if api_key and api_key_secret:
            raise ConfigurationError("HubBundle takes api_key or api_key_secret, not both")
        if max_bundle is not None and max_bundle < 1:
            raise ConfigurationError("HubBundle(max_bundle=) must be a positive number of bytes")
        self.hub_url = url
        self.api_key = api_key or None
        self.api_key_secret = api_key_secret
        self.image = image or RUNTIME_IMAGE
        self.python = python
        self.bundle_dir = bundle_dir
        self.max_bundle = max_bundle

    def bundle_url(self, config: EnvConfig) -> str:
        """The version's bundle on the hub: ``HUB/v1/envs/NAME/VERSION/bundle``."""
        name, version = (urllib.parse.quote(p, safe="") for p in (config.name, config.version))
        return f"{self.hub_url}/v1/envs/{name}/{version}/bundle"

    def exec_helper(self) -> ExecHelper:
        """The exec helper of ``DualContainer`` pods, from the same generic image."""
        return ExecHelper(image=self.image)

    def runtime(self, config: EnvConfig, project: Path | None) -> tuple[str, list[str]]:
        digest = bundle_digest(config, project)
        if digest is None:
            builtin = builtin_of(config, project)
            if builtin is not None and project is not None:
                return self.image, builtin_command(builtin, project, self.python)
            raise ConfigurationError(
                f"{config.ref} has no bundle digest, so a pod cannot fetch it from the hub: "
                f"publish it first (`aenv push` to {self.hub_url}) and create instances of "
                "the pushed version (through that hub, or from its record), or deliver it "
                "in its own image (AENV_K8S_DELIVERY=image)"
            )
        command = [self.python, "-m", "sandbox_runtime", "--bundle", self.bundle_url(config)]
        command += ["--digest", digest]
        if self.bundle_dir:
            command += ["--bundle-dir", self.bundle_dir]
        if self.max_bundle:
            command += ["--max-bundle", str(self.max_bundle)]
        return self.image, command

    def env(self, config: EnvConfig) -> list[dict[str, Any]]:
        """The hub key, for the pods that fetch a bundle: none for a built-in's, which fetches
        nothing (a hub refuses to publish a built-in's name, so a version of that name with no
        bundle digest is the built-in)."""
        if bundle_digest(config, None) is None and config.ref in builtin_environments():
            return []
        if self.api_key_secret is not None:
            secret, key = self.api_key_secret
            ref = {"secretKeyRef": {"name": secret, "key": key}}
            return [{"name": BUNDLE_KEY_ENV, "valueFrom": ref}]
        if self.api_key:
            return [{"name": BUNDLE_KEY_ENV, "value": self.api_key}]
        return []

    def __repr__(self) -> str:  # never the key
        return f"HubBundle({self.hub_url!r}, image={self.image!r})"


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

    def env(self, config: EnvConfig) -> list[dict[str, Any]]:
        return []

    def __repr__(self) -> str:
        return f"HostProcess({self.python!r})"
