"""``aenv build``: a project -> an immutable, content-addressed bundle, its lock and an image.

``aenv build [PROJECT] [--out DIR]`` writes into ``DIR`` (default ``PROJECT/dist``):

- ``NAME-VERSION.aenv.tgz``: the bundle (what ``aenv push`` uploads and EnvHub serves);
- ``aenv.lock``: the project's requirements pinned from this interpreter's packages;
- ``NAME-VERSION.json``: the manifest, ``{"name", "version", "digest", "size", "files"}``;
- ``image/``: the image's build context (:mod:`._image`): its ``Dockerfile`` (the project's own,
  else one written for the bundle), ``env/`` (the bundle's files) and ``wheels/`` (a wheel of
  this aenv-ray, :mod:`._wheel`: the image never installs aenv-ray from an index by name).

Then, unless ``--no-image``, it checks that the context holds what the Dockerfile copies and
builds the image there with the first of docker, podman, buildah on PATH that can build here
(docker and podman need their daemon or service: ``docker info`` answers; buildah needs none).
With none that can, the bundle and the context are written and it exits 1 with one line naming
what to install, or ``--no-image``: a command that was asked for an image and made none has
failed.

May import: typer, ``aenv_ray`` (its bundle format and the CLI's image module inside the
command). Not ``envhub`` nor the runtime: the load check runs in a sandbox (``_loadcheck``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aenv_cli._common import EXIT_FAILURE, EXIT_USAGE, die
from aenv_ray.config import EnvConfig
from aenv_ray.errors import ConfigurationError

if TYPE_CHECKING:
    from aenv_cli._image import Context
    from aenv_ray.bundle import Bundle

__all__ = ["default_tag", "register"]

_TAIL_LINES = 20  # of a failed image build's output, shown before the error line
_TAG = re.compile(r"^[a-z0-9][a-z0-9._/:@-]*$", re.IGNORECASE)


def _shown(path: Path) -> str:
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def default_tag(config: EnvConfig) -> str:
    """``NAME:VERSION``, below ``deployConfig.imagePrefix`` when set.

    Image names are lowercase and tags cannot hold ``+``, so the name is lowercased and a ``+``
    in the version becomes ``_``.

    >>> default_tag(EnvConfig(name="Demo", version="1.0.0+local"))
    'demo:1.0.0_local'
    >>> deploy = {"imagePrefix": "reg.example/team"}
    >>> default_tag(EnvConfig.model_validate({"name": "demo", "deployConfig": deploy}))
    'reg.example/team/demo:1.0.0'
    """
    return config.image_tag


def _write(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _manifest(bundle: Bundle) -> dict[str, Any]:
    return {
        "name": bundle.config.name,
        "version": bundle.config.version,
        "digest": bundle.digest,
        "size": bundle.size,
        "files": list(bundle.files),
    }


def _dockerfile(project: Path, bundle: Bundle) -> tuple[str, str]:
    """The image's Dockerfile and where it comes from: the project's ``buildConfig.dockerfile``
    when that file exists (``aenv init`` writes one), else one written for the bundle."""
    from aenv_cli._image import base_image, dockerfile_text

    base_image(bundle.config)  # a bad buildConfig.baseImage is an error, whichever is used
    named = bundle.config.build_config.dockerfile
    path = project / named
    if not path.is_file():
        return dockerfile_text(bundle), f"written for the bundle: the project has no {named}"
    if not path.resolve().is_relative_to(project.resolve()):
        raise ConfigurationError(
            f"buildConfig.dockerfile `{named}` is outside the project {_shown(project)}; "
            "name a file inside it, e.g. ./Dockerfile"
        )
    try:
        return path.read_text(encoding="utf-8"), f"the project's {named}"
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read {_shown(path)}: {exc}") from exc


def _write_outputs(
    bundle: Bundle, project: Path, out: Path
) -> tuple[dict[str, Path], Context, str]:
    """Write the bundle, lock, manifest and the image's context into ``out``: their paths by
    label, the context, and where its Dockerfile comes from."""
    from aenv_cli._image import CONTEXT_DIR, prepare_context
    from aenv_cli._wheel import build_wheel

    # first: a bad baseImage or Dockerfile, or no wheel to be had, must leave nothing written
    dockerfile, origin = _dockerfile(project, bundle)
    wheel = build_wheel()
    stem = f"{bundle.config.name}-{bundle.config.version}"
    paths = {
        "bundle": out / f"{stem}.aenv.tgz",
        "lock": out / "aenv.lock",
        "manifest": out / f"{stem}.json",
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(paths["bundle"], bundle.data)
        _write(paths["lock"], bundle.lock.encode("utf-8"))
        manifest = json.dumps(_manifest(bundle), indent=2) + "\n"
        _write(paths["manifest"], manifest.encode("utf-8"))
        _remove_old_dockerfile(out)
    except OSError as exc:
        die(f"cannot write the build outputs into {_shown(out)}: {exc.strerror or exc}")
    context = prepare_context(bundle, dockerfile, (wheel.filename, wheel.data), out / CONTEXT_DIR)
    paths["context"] = context.path
    paths["Dockerfile"] = context.dockerfile
    return paths, context, origin


def _remove_old_dockerfile(out: Path) -> None:
    """Remove ``out/Dockerfile`` when an older ``aenv build`` wrote it (it installed aenv-ray by
    name and is now ``out/image/Dockerfile``): a stale copy would be built by mistake."""
    old = out / "Dockerfile"
    try:
        text = old.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    if "\n# Written by `aenv build`; build it in a directory holding the bundle's files." in text:
        old.unlink()


def _build_image(
    context: Context, builder: str, tag: str, timeout: float, say: Callable[[str], None]
) -> None:
    """Run ``builder build -t TAG -f CONTEXT/Dockerfile CONTEXT``."""
    name = Path(builder).name
    say(f"building image {tag} with {name} in {_shown(context.path)} ...")
    command = [builder, "build", "-t", tag, "-f", str(context.dockerfile), str(context.path)]
    try:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        die(f"`{name} build` did not finish within {timeout:g} s; the bundle is written")
    except OSError as exc:
        die(f"cannot run {builder}: {exc.strerror or exc}")
    if done.returncode != 0:
        tail = [line for line in done.stdout.splitlines() if line.strip()][-_TAIL_LINES:]
        for line in tail:
            print(f"  {name}: {line}", file=sys.stderr)
        last = tail[-1].strip() if tail else "no output"
        die(
            f"`{name} build` failed with exit code {done.returncode} ({last}); the bundle is "
            "written, fix the image build and run `aenv build` again",
            EXIT_FAILURE,
        )
    say(f"built image {tag}")


def build(
    project: Annotated[
        Path,
        typer.Argument(
            help="the project directory (holds config.json)",
            metavar="PROJECT",
            exists=True,
            file_okay=False,
            dir_okay=True,
        ),
    ] = Path("."),
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="where to write the outputs [PROJECT/dist]"),
    ] = None,
    tag: Annotated[
        str | None,
        typer.Option(
            "--tag", metavar="IMAGE", help="the image's tag [NAME:VERSION, below imagePrefix]"
        ),
    ] = None,
    no_image: Annotated[
        bool,
        typer.Option("--no-image", help="write the bundle and the image's context, build nothing"),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the manifest as JSON (messages go to stderr)")
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="seconds the image build may take", min=1.0)
    ] = 3600.0,
) -> None:
    """Bundle a project (content-addressed .aenv.tgz, aenv.lock) and build its image.

    The image's context is DIR/image: the project's Dockerfile (or one written for the bundle),
    env/ (the bundle's files), wheels/ (this aenv-ray). The image is built there with the first
    of docker, podman, buildah on PATH that can build here; with none, exit 1 (the bundle and
    the context written): install one, or pass --no-image and build the context elsewhere with
    `docker build -t NAME:VERSION DIR/image`.
    """
    from aenv_cli._loadcheck import check_loads, describe
    from aenv_ray.bundle import build_bundle

    _check_tag(tag)
    out_dir = project / "dist" if out is None else out
    bundle = build_bundle(project, exclude=[out_dir])
    # before anything is written
    loads = describe(check_loads(bundle.data, bundle.config.ref, _shown(project)))
    paths, context, origin = _write_outputs(bundle, project, out_dir)
    _report(bundle, loads, paths, origin, as_json=as_json)
    if not no_image:
        _check_context(context)
        image = tag or default_tag(bundle.config)
        _build_image_with_a_builder(context, image, timeout, _sayer(as_json))


def _check_tag(tag: str | None) -> None:
    """Refuse a ``--tag`` no image builder would take."""
    if tag is not None and not _TAG.fullmatch(tag):
        raise typer.BadParameter(
            f"`{tag}` is not an image tag, e.g. demo:1.0.0", param_hint="--tag"
        )


def _sayer(as_json: bool) -> Callable[[str], None]:
    """Prints a progress line: on stderr when stdout carries the JSON manifest."""

    def say(line: str) -> None:
        print(line, file=sys.stderr if as_json else sys.stdout, flush=True)

    return say


def _report(
    bundle: Bundle, loads: str, paths: dict[str, Path], origin: str, *, as_json: bool
) -> None:
    """Print what was built: the manifest as JSON, or a summary with the outputs' paths (and
    where the Dockerfile comes from)."""
    if as_json:
        print(json.dumps(_manifest(bundle), indent=2), flush=True)
        return
    print(f"built {bundle.config.ref}")
    print(f"  digest      {bundle.digest}")
    print(f"  size        {bundle.size} bytes, {len(bundle.files)} files")
    print(f"  loads       {loads}")
    for label, path in paths.items():
        print(f"  {label:<11} {_shown(path)}{f' ({origin})' if label == 'Dockerfile' else ''}")
    print(f"  image       {expected_image(bundle.config)}")


def expected_image(config: EnvConfig) -> str:
    """The image the Kubernetes engine runs for ``config`` when it delivers code in the
    environment's own image (``OwnImage``), and where that comes from.

        >>> image = [{"type": "image", "content": "r.io/d:7"}]
        >>> expected_image(EnvConfig(name="demo", artifacts=image))
        'r.io/d:7 (the Kubernetes engine runs it: artifacts)'
    """
    from aenv_ray.settings import get_settings

    if config.image is not None:
        named = any(a.get("type") == "image" and a.get("content") for a in config.artifacts)
        source = "artifacts" if named else "deployConfig.imagePrefix"
        return f"{config.image} (the Kubernetes engine runs it: {source})"
    image = config.image_below(get_settings().k8s_image_prefix)
    if image is not None:
        return f"{image} (the Kubernetes engine runs it: AENV_K8S_IMAGE_PREFIX)"
    return (
        f"{config.image_tag} has no registry: the Kubernetes engine needs "
        "deployConfig.imagePrefix or AENV_K8S_IMAGE_PREFIX (or `aenv push` and bundle delivery)"
    )


def _check_context(context: Context) -> None:
    """Exit 2 when the Dockerfile copies a file the context does not hold (a Dockerfile
    written for another layout): before any builder runs, and where none exists."""
    from aenv_cli._image import ENV_DIR, WHEELS_DIR, missing_sources

    missing = missing_sources(context.dockerfile.read_text(encoding="utf-8"), context.path)
    if not missing:
        return
    where = ", ".join(f"line {line}: `{source}`" for line, source in missing)
    die(
        f"the image's Dockerfile copies what its context {_shown(context.path)} does not hold "
        f"({where}); the context holds Dockerfile, {ENV_DIR}/ (the bundle's files: config.json, "
        f"src/, aenv.lock ...) and {WHEELS_DIR}/ (aenv-ray): copy from there, e.g. "
        f"`COPY {ENV_DIR}/ /env/` (`aenv init` writes a Dockerfile that does); the bundle is "
        "written",
        EXIT_USAGE,
    )


def _build_image_with_a_builder(
    context: Context, tag: str, timeout: float, say: Callable[[str], None]
) -> None:
    """Build the image ``tag`` in ``context`` with the first container builder on PATH that can
    build here; with none, exit 1 in one line naming what to install, or ``--no-image`` (the
    bundle and the context are written already)."""
    from aenv_cli._image import find_image_builder

    builder, problems = find_image_builder()
    if builder is not None:
        _build_image(context, builder, tag, timeout, say)
        return
    found = f"none of them can build here ({'; '.join(problems)})" if problems else "none on PATH"
    die(
        f"no image built: it takes docker, podman or buildah, and {found}; install buildah "
        "(it needs no daemon), or podman or docker with its daemon running, or pass "
        f"--no-image for the bundle and the image's context alone (written: "
        f"{_shown(context.path)}; `docker build -t {tag} {_shown(context.path)}` builds it "
        "where docker runs)",
        EXIT_FAILURE,
    )


def register(app: typer.Typer) -> None:
    """Add ``build`` to ``app``."""
    app.command("build")(build)
