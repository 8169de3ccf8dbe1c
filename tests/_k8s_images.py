"""Images that add to this checkout's runtime image on the real node (``tests/_realnode.py``
builds the runtime image itself, from deploy/Dockerfile, keyed by its inputs).

:func:`layered_image` is an image ``FROM`` the runtime image that adds system packages a
built-in needs (swe's demo rows at ``/data/swe``), or an environment's definition (harbor-pod's,
for ``OwnImage`` delivery), so they share the runtime image as their base layer. A built-in's
system packages (mini-program's Chromium) are a variant of the runtime image instead
(:func:`runtime_variant_or_skip`), below aenv-ray's own layer. Its tag is
``AENV_TEST_IMAGE_PREFIX/NAME:KEY`` (default prefix ``realnode.local/aenv``), or
``PREFIX/NAME-KEY/NAME:VERSION`` for an environment's own image, where ``KEY`` digests the
Dockerfile it builds (which names the base by its content key): a tag the kit already built is
used as it is, any other is built with the kit's ``build-image`` (buildah;
``AENV_K8S_REALNODE_TOOLS``, else ``../shared/tools/k8s-realnode``), which imports it into the
node's containerd. Without the kit the caller skips, saying so.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from tests._k8s import kit_lock
from tests._realnode import built, realnode_tools, runtime_image

__all__ = [
    "CHROMIUM",
    "SWE_DATA",
    "ImageUnavailable",
    "builder_command",
    "built_environment",
    "image_prefix",
    "layered_image",
    "layered_or_skip",
    "runtime_variant_or_skip",
]

CHROMIUM = ("chromium", "fonts-dejavu-core")
"""mini-program's Debian packages: Chromium, which renders the page its reward grades
(``builtin_envs/mini_program``). Its image is deploy/Dockerfile's variant with them
(:func:`runtime_variant_or_skip`), not a layer on the runtime image: their layer then sits below
aenv-ray's, and a new tree rebuilds only aenv-ray's layer above it (~30 s, not ~2 min)."""


SWE_DATA = (
    "RUN mkdir -p /data/swe && cp -r \"$(python -c 'import builtin_envs.swe as s, os; "
    "print(os.path.dirname(s.__file__))')/data/.\" /data/swe/",
)
"""swe's demo rows and their repositories copied to the image's ``/data/swe``, where only a
pod's judge container reads them (``SWE_DATASET=/data/swe/demo.jsonl``)."""


class ImageUnavailable(RuntimeError):
    """No image of that content on the node, and no way to build one here (the message says
    why)."""


def image_prefix() -> str:
    """Where the tests tag their images: ``AENV_TEST_IMAGE_PREFIX``, else
    ``realnode.local/aenv``."""
    return os.environ.get("AENV_TEST_IMAGE_PREFIX", "").strip().rstrip("/") or "realnode.local/aenv"


def builder_command() -> str:
    """The kit's ``build-image`` as an image builder's command line with ``{tag}``,
    ``{dockerfile}`` and ``{context}`` in it (``AENV_HARBOR_BUILDER``'s form, aenv_harbor.kube),
    run at low priority. Raises :class:`ImageUnavailable` without the kit."""
    tools = realnode_tools()
    if tools is None:
        raise ImageUnavailable(
            "no real-node kit to build images with "
            "(AENV_K8S_REALNODE_TOOLS, else ../shared/tools/k8s-realnode)"
        )
    build = shlex.quote(str(tools / "build-image"))
    return f"nice -n 10 {build} -t {{tag}} -f {{dockerfile}} {{context}}"


def _build(tag: str, dockerfile: Path, context: Path) -> None:
    tools = realnode_tools()
    if tools is None:
        raise ImageUnavailable(
            f"{tag} is not on the node and there is no real-node kit to build it "
            "(AENV_K8S_REALNODE_TOOLS, else ../shared/tools/k8s-realnode)"
        )
    command = ["nice", "-n", "10", str(tools / "build-image"), "-t", tag, "-f", str(dockerfile)]
    done = subprocess.run(
        [*command, str(context)], capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise ImageUnavailable(f"building {tag} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def layered_image(
    base: str, name: str, lines: tuple[str, ...], *, version: str | None = None
) -> str:
    """An image ``FROM base`` plus the Dockerfile ``lines`` (as root; the image's user is put
    back after them): ``PREFIX/NAME:KEY``, built when the kit has none of that content.

    With ``version`` it is environment ``NAME``'s own image, tagged
    ``PREFIX/NAME-KEY/NAME:VERSION``: what ``OwnImage("PREFIX/NAME-KEY")`` runs for
    ``NAME@VERSION`` (``imagePrefix/NAME:VERSION``), so that other content is another prefix,
    never an old image under the same tag. Raises :class:`ImageUnavailable`."""
    text = "\n".join([f"FROM {base}", "USER 0:0", *lines, "USER 10001:10001", ""])
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    tag = (
        f"{image_prefix()}/{name}:{key}"
        if version is None
        else f"{image_prefix()}/{name}-{key}/{name}:{version}"
    )
    if built(tag):
        return tag
    with kit_lock():
        if not built(tag):
            with tempfile.TemporaryDirectory(prefix="aenv-image-") as context:
                dockerfile = Path(context) / "Dockerfile"
                dockerfile.write_text(text)
                _build(tag, dockerfile, Path(context))
    return tag


def layered_or_skip(base: str, name: str, lines: tuple[str, ...]) -> str:
    """:func:`layered_image`, or the calling test skipped saying why when it cannot be had
    (a failure instead under ``AENV_REQUIRE_K8S=1``)."""
    import pytest

    try:
        return layered_image(base, name, lines)
    except ImageUnavailable as exc:
        if os.environ.get("AENV_REQUIRE_K8S") == "1":
            raise
        pytest.skip(str(exc))


def runtime_variant_or_skip(packages: tuple[str, ...]) -> str:
    """This checkout's runtime image built with the Debian ``packages`` too
    (:func:`tests._realnode.runtime_image`'s ``extra_packages``), or the calling test skipped
    saying why when it cannot be had (a failure instead under ``AENV_REQUIRE_K8S=1``)."""
    import pytest

    try:
        return runtime_image(extra_packages=packages)
    except RuntimeError as exc:
        if os.environ.get("AENV_REQUIRE_K8S") == "1" or realnode_tools() is not None:
            raise
        pytest.skip(str(exc))


def built_environment(project: Path, tag: str) -> str:
    """``tag``, the image of the environment ``project`` built the documented way (``aenv
    build PROJECT --no-image`` writes its context, the kit's ``build-image`` builds it), when
    the kit has no image of that tag yet (minutes, once per machine). Raises
    :class:`ImageUnavailable`."""
    if built(tag):
        return tag
    with kit_lock():
        if not built(tag):
            _build_environment(project, tag)
    return tag


def _build_environment(project: Path, tag: str) -> None:
    with tempfile.TemporaryDirectory(prefix="aenv-build-") as out:
        done = subprocess.run(
            [sys.executable, "-m", "aenv_cli", "build", str(project), "--out", out, "--no-image"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise ImageUnavailable(f"aenv build {project} failed:\n{done.stderr[-3000:]}")
        context = Path(out) / "image"
        _build(tag, context / "Dockerfile", context)
