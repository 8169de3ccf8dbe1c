"""``aenv build``: a project -> an immutable, content-addressed bundle, its lock and a Dockerfile.

``aenv build [PROJECT] [--out DIR]`` writes into ``DIR`` (default ``PROJECT/dist``):

- ``NAME-VERSION.aenv.tgz``: the bundle (what ``aenv push`` uploads and EnvHub serves);
- ``aenv.lock``: the project's requirements pinned from this interpreter's packages;
- ``Dockerfile``: an image for the bundle's files;
- ``NAME-VERSION.json``: the manifest, ``{"name", "version", "digest", "size", "files"}``.

Then, unless ``--no-image``, it builds the image with the first of docker, podman, buildah on
PATH, in a context directory holding the extracted bundle and the Dockerfile; with none, it says
so in one line and stops there (exit 0: the bundle is what EnvHub needs).

May import: typer, ``aenv_ray`` (its bundle format and the CLI's image module inside the
command). Not ``envhub`` nor the runtime: the load check runs in a sandbox (``_loadcheck``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aenv_ray.cli._common import EXIT_FAILURE, die
from aenv_ray.config import EnvConfig

if TYPE_CHECKING:
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


def _write_outputs(bundle: Bundle, out: Path) -> dict[str, Path]:
    """Write the bundle, lock, Dockerfile and manifest into ``out``; their paths by label."""
    from aenv_ray.cli._image import dockerfile_text

    dockerfile = dockerfile_text(bundle)  # first: a bad baseImage must leave nothing written
    stem = f"{bundle.config.name}-{bundle.config.version}"
    paths = {
        "bundle": out / f"{stem}.aenv.tgz",
        "lock": out / "aenv.lock",
        "Dockerfile": out / "Dockerfile",
        "manifest": out / f"{stem}.json",
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(paths["bundle"], bundle.data)
        _write(paths["lock"], bundle.lock.encode("utf-8"))
        _write(paths["Dockerfile"], dockerfile.encode("utf-8"))
        manifest = json.dumps(_manifest(bundle), indent=2) + "\n"
        _write(paths["manifest"], manifest.encode("utf-8"))
    except OSError as exc:
        die(f"cannot write the build outputs into {_shown(out)}: {exc.strerror or exc}")
    return paths


def _build_image(
    bundle: Bundle, builder: str, tag: str, timeout: float, say: Callable[[str], None]
) -> None:
    """Run ``builder build -t TAG -f Dockerfile CONTEXT`` on the extracted bundle."""
    from aenv_ray.bundle import extract_bundle
    from aenv_ray.cli._image import write_dockerfile

    name = Path(builder).name
    say(f"building image {tag} with {name} ...")
    with tempfile.TemporaryDirectory(prefix="aenv-build-") as tmp:
        context = extract_bundle(bundle.data, Path(tmp, "context"))
        dockerfile = write_dockerfile(bundle, context)
        command = [builder, "build", "-t", tag, "-f", str(dockerfile), str(context)]
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
        bool, typer.Option("--no-image", help="write the bundle and Dockerfile only")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the manifest as JSON (messages go to stderr)")
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="seconds the image build may take", min=1.0)
    ] = 3600.0,
) -> None:
    """Bundle a project (content-addressed .aenv.tgz, aenv.lock, Dockerfile) and build its image.

    The image is built with the first of docker, podman, buildah on PATH; without one, the
    Dockerfile is written for building elsewhere.
    """
    from aenv_ray.bundle import build_bundle
    from aenv_ray.cli._loadcheck import check_loads, describe

    _check_tag(tag)
    out_dir = project / "dist" if out is None else out
    bundle = build_bundle(project, exclude=[out_dir])
    # before anything is written
    loads = describe(check_loads(bundle.data, bundle.config.ref, _shown(project)))
    paths = _write_outputs(bundle, out_dir)
    _report(bundle, loads, paths, as_json=as_json)
    if not no_image:
        _build_image_if_possible(bundle, paths["Dockerfile"], tag, timeout, _sayer(as_json))


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


def _report(bundle: Bundle, loads: str, paths: dict[str, Path], *, as_json: bool) -> None:
    """Print what was built: the manifest as JSON, or a summary with the outputs' paths."""
    if as_json:
        print(json.dumps(_manifest(bundle), indent=2), flush=True)
        return
    print(f"built {bundle.config.ref}")
    print(f"  digest      {bundle.digest}")
    print(f"  size        {bundle.size} bytes, {len(bundle.files)} files")
    print(f"  loads       {loads}")
    for label, path in paths.items():
        print(f"  {label:<11} {_shown(path)}")
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


def _build_image_if_possible(
    bundle: Bundle,
    dockerfile: Path,
    tag: str | None,
    timeout: float,
    say: Callable[[str], None],
) -> None:
    """Build the image (``tag``, else :func:`default_tag`) with the first container builder on
    PATH; with none, or one that cannot build here, say so in one line and stop (the bundle is
    what EnvHub needs)."""
    from aenv_ray.cli._image import find_image_builder

    builder = find_image_builder()
    if builder is None:
        say(
            "no container builder (docker, podman, buildah) on PATH: wrote "
            f"{_shown(dockerfile)}; build the image where one exists, or push the "
            "bundle with `aenv push`"
        )
        return
    problem = _unusable(builder)
    if problem is not None:
        say(
            f"{Path(builder).name} is on PATH but cannot build images here ({problem}): wrote "
            f"{_shown(dockerfile)}; build the image where a builder works, or push the "
            "bundle with `aenv push`"
        )
        return
    _build_image(bundle, builder, tag or default_tag(bundle.config), timeout, say)


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


def register(app: typer.Typer) -> None:
    """Add ``build`` to ``app``."""
    app.command("build")(build)
