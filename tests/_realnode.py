"""The real single-node Kubernetes of ``../shared/tools/k8s-realnode`` for the tests: a kubelet
running pods from images through containerd and runc (securityContext, limits, OOM kills, probes
and pod IPs all real), where ``tests/_k8s.py``'s k8s-real has a fake kubelet running pod commands
as this host's processes.

:meth:`RealNode.start` **uses a running node** when its API server answers (and leaves it
running: others may use it), else sets the kit up once per machine (its ``setup``, only when
its binaries or base images are missing, as k8s-real's is) and starts it, and then stops it in
:meth:`RealNode.stop`. :func:`runtime_image` builds the generic aenv-ray image from this checkout
(deploy/Dockerfile, the kit's ``build-image``) under a tag keyed by the digest of everything the
Dockerfile copies: an unchanged tree builds nothing.

    with RealNode.start() as node:        # a RuntimeError says why it cannot
        node.runtime_image = runtime_image()
        engine = node.engine("my-namespace")   # OwnImage delivery, the built-ins from that image
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from aenv_ray import __version__
from tests._k8s import REPO, KubeCluster, kit_lock
from tests._later import wait_for_ends

__all__ = [
    "POD_MAX_PIDS",
    "RealNode",
    "built",
    "prune_images",
    "realnode_tools",
    "runtime_image",
    "runtime_image_inputs",
    "set_up",
]

POD_MAX_PIDS = 1024
"""The kubelet's ``--pod-max-pids`` on a node this session starts (a running node is used as it
is): the fork bomb of ``tests/test_k8s_realnode_security.py`` stops there. Chromium's threads
and a Harbor task's processes stay well under it."""

IMAGE_REPOSITORY = "realnode.local/aenv/aenv-ray"
"""Where :func:`runtime_image` tags its builds (``IMAGE_REPOSITORY:VERSION-DIGEST``)."""


def _dockerfile_inputs() -> list[str]:
    """deploy/Dockerfile's COPY sources (not those ``--from`` a stage), relative to the
    repository, and the Dockerfile itself."""
    text = (REPO / "deploy" / "Dockerfile").read_text()
    found = ["deploy/Dockerfile"]
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        found.extend(source.rstrip("/") for source in sources.split())
    return list(dict.fromkeys(found))


def realnode_tools() -> Path | None:
    """Where the kit's scripts are (``AENV_K8S_REALNODE_TOOLS``, else
    ``../shared/tools/k8s-realnode`` beside the repository), or None."""
    given = os.environ.get("AENV_K8S_REALNODE_TOOLS")
    path = Path(given) if given else REPO.parent / "shared" / "tools" / "k8s-realnode"
    return path if (path / "start").is_file() else None


def _cache() -> Path:
    """The kit's build cache (lib.sh's ``K8S_REAL``, default ``~/.cache/k8s-real``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("K8S_REAL") or Path(base) / "k8s-real")


def _node_dir() -> Path:
    return Path(os.environ.get("REALNODE_DIR") or _cache() / "realnode")


def _images_dir() -> Path:
    return Path(os.environ.get("REALNODE_IMAGES") or _cache() / "realnode-images")


def _set_up() -> bool:
    """Whether the kit's ``setup`` already ran on this machine: its binaries and the base
    images every build and pod starts from."""
    binaries = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
    images = ("k8s.gcr.io_pause_3.2.tar", "docker.io_library_python_3.11-slim-bookworm.tar")
    return all((_cache() / "bin" / name).is_file() for name in binaries) and all(
        (_images_dir() / name).is_file() for name in images
    )


def set_up(tools: Path, *, timeout: float = 3600.0) -> None:
    """The kit's ``setup`` when it never ran on this machine (a Go build of ~15-30 min, the base
    images), under :func:`tests._k8s.kit_lock`. Raises :class:`RuntimeError` when it fails."""
    if _set_up():
        return
    with kit_lock():  # made by another process meanwhile, or still missing
        if not _set_up():
            _run([str(tools / "setup")], timeout=timeout, what="k8s-realnode setup")


def _run(
    command: list[str], *, timeout: float, what: str, env: dict[str, str] | None = None
) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{(done.stdout + done.stderr)[-3000:]}")


class RealNode(KubeCluster):
    """The real node as a :class:`KubeCluster` (its pods run images: :meth:`engine` delivers
    with ``OwnImage``). ``started``: this object started it (and :meth:`stop` stops it)."""

    def __init__(self, kubeconfig: Path, *, started: bool) -> None:
        super().__init__(kubeconfig)
        self.started = started
        self._host_processes = False

    @staticmethod
    def kubeconfig_path() -> Path:
        """Where the kit writes the node's kubeconfig."""
        return Path(os.environ.get("KUBECONFIG_OUT") or _node_dir() / "kubeconfig")

    @staticmethod
    def answers(kubeconfig: Path) -> bool:
        """Whether the API server of ``kubeconfig`` answers, and its node is Ready."""
        if not kubeconfig.is_file():
            return False
        from kubernetes import client, config

        try:
            with config.new_client_from_config(config_file=str(kubeconfig)) as api:
                nodes = client.CoreV1Api(api).list_node(_request_timeout=5).items
        except Exception:  # any failure to answer: refused, TLS, 5xx, a bad file
            return False
        return any(
            c.type == "Ready" and c.status == "True"
            for node in nodes
            for c in (node.status.conditions or [])
        )

    @classmethod
    def start(cls, *, setup_timeout: float = 3600.0) -> RealNode:  # type: ignore[override]
        """The running node when it answers, else one this call starts (the kit set up first
        when it never was). Raises :class:`RuntimeError` saying why it cannot."""
        wait_for_ends()  # a node still stopping (tests/_later.py) would answer, then be gone
        kubeconfig = cls.kubeconfig_path()
        if cls.answers(kubeconfig):
            return cls(kubeconfig, started=False)
        tools = realnode_tools()
        if tools is None:
            raise RuntimeError(
                "no real node answers and no k8s-realnode kit to start one "
                "(AENV_K8S_REALNODE_TOOLS, else ../shared/tools/k8s-realnode)"
            )
        set_up(tools, timeout=setup_timeout)
        # a node this session starts bounds each pod's processes, as docs/kubernetes.md asks of
        # every node that runs aenv-ray's pods (the kit's kubelet sets no podPidsLimit itself)
        given = os.environ.get("KUBELET_ARGS", "")
        flags = given if "--pod-max-pids" in given else f"{given} --pod-max-pids={POD_MAX_PIDS}"
        _run(
            [str(tools / "start")],
            timeout=600,
            what="k8s-realnode start",
            env={**os.environ, "KUBELET_ARGS": flags.strip()},
        )
        node = cls(kubeconfig, started=True)
        if not cls.answers(kubeconfig):
            node.stop()
            raise RuntimeError(
                f"k8s-realnode started but its API server ({kubeconfig}) or node does not answer"
            )
        return node

    def stop(self) -> None:
        """Stop the node if this object started it (by the kit's ``stop``: every pod, then the
        control plane, and its host changes undone). Idempotent; a node it found running is
        left running, without the namespaces made here."""
        if not self.started:
            self.delete_namespaces()
            return
        self.started = False
        tools = realnode_tools()
        if tools is not None:
            _run([str(tools / "stop")], timeout=300, what="k8s-realnode stop")


def _files(paths: Iterable[str]) -> list[Path]:
    """The files under ``paths`` (relative to the repository), as the wheel takes them: no byte
    code, no hidden files, no ``__pycache__``."""
    found: list[Path] = []
    for name in paths:
        path = REPO / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in candidates:
            parts = file.relative_to(REPO).parts
            if (
                file.is_file()
                and file.suffix not in (".pyc", ".pyo")
                and not any(p.startswith(".") or p == "__pycache__" for p in parts)
            ):
                found.append(file)
    return found


def runtime_image_inputs() -> str:
    """The digest (hex) of everything deploy/Dockerfile copies from this checkout, paths and
    contents: the content key of :func:`runtime_image`."""
    digest = hashlib.sha256()
    for file in _files(_dockerfile_inputs()):
        digest.update(str(file.relative_to(REPO)).encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def built(tag: str) -> bool:
    """Whether the kit holds an image tagged ``tag`` (its ``build-image`` saves each build with
    a ``.ref`` list of its tags, imported into the node's containerd)."""
    return any(
        tag in ref.read_text().split() for ref in _images_dir().glob("*.tar.ref") if ref.is_file()
    )


def runtime_image(*, extra_packages: Sequence[str] = (), timeout: float = 1800.0) -> str:
    """The generic aenv-ray image of this checkout on ``node``: ``IMAGE_REPOSITORY:VERSION-
    DIGEST`` (:func:`runtime_image_inputs`), built with the kit's ``build-image`` from
    deploy/Dockerfile only when no build of the same inputs exists (~5 min of CPU the first
    time; then ~30 s for a new tree: the builder's cache keeps the dependencies' and the
    system packages' layers). The first build on a node without the published tag
    (``ghcr.io/aenv-ray/aenv-ray:VERSION``, what an engine's default settings name) tags it too.

    ``extra_packages`` (Debian packages) builds the Dockerfile's variant with them
    (``--build-arg EXTRA_PACKAGES=...``: mini-program's image has Chromium), tagged
    ``...-DIGEST-PKGS`` where ``PKGS`` digests the package names. Its packages' layer sits below
    aenv-ray's, so a new tree rebuilds only aenv-ray's layer above it. Raises
    :class:`RuntimeError` when the build fails."""
    from k8s_backend.exec_helper import RUNTIME_IMAGE

    tag = f"{IMAGE_REPOSITORY}:{__version__}-{runtime_image_inputs()[:16]}"
    packages = " ".join(extra_packages)
    if packages:
        tag += "-" + hashlib.sha256(packages.encode()).hexdigest()[:8]
    if built(tag):
        return tag
    with kit_lock():
        if built(tag):
            return tag
        tools = realnode_tools()
        if tools is None:
            raise RuntimeError("no k8s-realnode kit to build the runtime image with")
        published = not packages and not built(RUNTIME_IMAGE)
        tags = ["-t", tag] + (["-t", RUNTIME_IMAGE] if published else [])
        variant = ["--build-arg", f"EXTRA_PACKAGES={packages}"] if packages else []
        dockerfile = str(REPO / "deploy" / "Dockerfile")
        # the kit imports it into the running node's containerd (else at the node's next start)
        command = [str(tools / "build-image"), *tags, *variant, "-f", dockerfile, str(REPO)]
        _run(command, timeout=timeout, what=f"building {tag} from deploy/Dockerfile")
    prune_images()
    return tag


PRUNE_KEEP = 3
"""How many builds of each of the tests' tree-keyed images :func:`prune_images` keeps."""

PRUNE_AFTER = 2 * 3600.0
"""How old (seconds since its build) an image must be before :func:`prune_images` removes it:
another checkout's session may be using a recent one."""

_NOT_TREE_KEYED = ("harbor-task",)
"""Families keyed by something else than this checkout (a Harbor task's own content: each task
is an image of its own, all of them in use): :func:`prune_images` leaves them."""


def prune_images(*, keep: int = PRUNE_KEEP, older_than: float = PRUNE_AFTER) -> list[str]:
    """Remove the tests' images of other trees from the kit's store (and from the node's
    containerd when it runs). A family is the images whose tags differ only by a content key
    (16 hex digits: the runtime image, each of its variants, each layer on it): of each, the
    newest ``keep`` builds stay, and so does any built less than ``older_than`` seconds ago
    and any that also carries a tag without a key (the published runtime tag, an
    environment's own image). Each new tree adds ~2-3 GB of images: without this a CI
    machine's disk fills. Returns the removed tags."""
    prefix = IMAGE_REPOSITORY.rsplit("/", 1)[0].replace("/", "_").replace(":", "_") + "_"
    families: dict[str, list[tuple[float, Path]]] = {}
    for archive in _images_dir().glob(f"{prefix}*.tar"):
        ref = archive.with_name(archive.name + ".ref")
        name = archive.name[len(prefix) : -len(".tar")]
        family = re.sub(r"[0-9a-f]{16}", "*", name)
        if family == name or family.startswith(_NOT_TREE_KEYED) or not ref.is_file():
            continue
        if not all(re.search(r"[0-9a-f]{16}", tag) for tag in ref.read_text().split()):
            continue  # it also carries a tag that names no content: not ours to drop
        families.setdefault(family, []).append((archive.stat().st_mtime, archive))
    now = time.time()
    removed: list[str] = []
    for builds in families.values():
        builds.sort(reverse=True)
        for mtime, archive in builds[keep:]:
            if now - mtime < older_than:
                continue
            ref = archive.with_name(archive.name + ".ref")
            removed.extend(ref.read_text().split())
            archive.unlink(missing_ok=True)
            ref.unlink(missing_ok=True)
    if removed:
        _forget(removed)
    return removed


def _forget(tags: list[str]) -> None:
    """Remove ``tags`` from the running node's containerd (its content is then garbage
    collected); nothing when the node is not running."""
    tools = realnode_tools()
    if tools is None:
        return
    script = f'. "{tools}/lib.sh" && for t in "$@"; do ctr_ images rm "$t" >/dev/null 2>&1; done'
    subprocess.run(
        ["bash", "-c", script, "forget", *tags], capture_output=True, timeout=300, check=False
    )
