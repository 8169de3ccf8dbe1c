"""aenv_harbor.kube: the derived image of a Harbor task on Kubernetes (its Dockerfile, its
content-keyed tag) and the operator's builder, run as a real command line (a shell command
that writes what it was given stands in for `docker build`: the interface is the command)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv_harbor.kube import (
    LAYER,
    WORKSPACE,
    build_image,
    derived_dockerfile,
    derived_tag,
    layer,
)
from aenv_ray.errors import ConfigurationError


def test_the_derived_dockerfile_is_the_task_s_then_the_layer() -> None:
    text = derived_dockerfile("FROM a AS build\nRUN make\nFROM b\nCOPY --from=build /x /x\n")
    assert text.startswith("FROM a AS build\nRUN make\nFROM b\nCOPY --from=build /x /x\n")
    assert text.endswith(LAYER)
    assert f'ln -s "{WORKSPACE}/box$d" "$d"' in LAYER  # Harbor's paths become the workspace's
    assert derived_dockerfile(image="reg.io/task:1") == "FROM reg.io/task:1\n" + LAYER
    with pytest.raises(ConfigurationError, match="Dockerfile or its image"):
        derived_dockerfile()


def test_the_task_s_workdir_is_made_writable_too() -> None:
    text = derived_dockerfile(image="reg.io/task:1", paths=("/work",))
    assert 'for d in /root /logs /tests /solution /runtime "$wd" "/work"; do' in text
    with pytest.raises(ConfigurationError, match="plain absolute path"):
        layer(('/work"; rm -rf "/',))
    with pytest.raises(ConfigurationError, match="plain absolute path"):
        layer(("work",))


def test_the_tag_is_keyed_by_the_dockerfile_and_every_file_of_the_context(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("one")
    first = derived_tag("reg.local/aenv/", "FROM x\n", tmp_path)
    assert first.startswith("reg.local/aenv/harbor-task:")
    assert len(first.split(":")[-1]) == 16
    assert derived_tag("reg.local/aenv", "FROM x\n", tmp_path) == first
    (tmp_path / "data.txt").write_text("two")
    second = derived_tag("reg.local/aenv", "FROM x\n", tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.txt").write_text("")
    third = derived_tag("reg.local/aenv", "FROM x\n", tmp_path)
    assert len({first, second, third, derived_tag("reg.local/aenv", "FROM y\n", tmp_path)}) == 4


@pytest.fixture
def markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AENV_HARBOR_IMAGES_DIR", str(tmp_path / "markers"))
    return tmp_path


def test_the_builder_gets_the_tag_dockerfile_and_context_and_builds_once(markers: Path) -> None:
    context = markers / "context with space"
    context.mkdir()
    log = markers / "built.log"
    builder = f"echo {{tag}} {{context}} >> {log} && cat {{dockerfile}} >> {log}"
    assert build_image(builder, "reg/harbor-task:1", "FROM x\n", context) is True
    assert log.read_text() == f"reg/harbor-task:1 {context}\nFROM x\n"
    assert build_image(builder, "reg/harbor-task:1", "FROM x\n", context) is False  # kept
    assert build_image(builder, "reg/harbor-task:1", "FROM x\n", context, force=True) is True
    assert log.read_text().count("reg/harbor-task:1") == 2


def test_a_failing_builder_says_what_it_printed_and_is_tried_again(markers: Path) -> None:
    builder = "echo 'no space left on device' >&2; exit 7"
    with pytest.raises(RuntimeError, match=r"exited 7: no space left on device"):
        build_image(builder, "reg/harbor-task:2", "FROM x\n", markers)
    with pytest.raises(RuntimeError):  # nothing was remembered
        build_image(builder, "reg/harbor-task:2", "FROM x\n", markers)
    with pytest.raises(ConfigurationError, match=r"\{tag\}"):
        build_image("build {image}", "reg/harbor-task:2", "FROM x\n", markers)
