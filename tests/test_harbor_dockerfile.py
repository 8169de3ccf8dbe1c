"""aenv_harbor.dockerfile: a Harbor task's Dockerfile mapped onto an instance's box, and what
is refused (naming the line and why). Pure parsing: no Harbor, no instance."""

from __future__ import annotations

import pytest

from aenv_harbor.dockerfile import DEFAULT_PATH, UnmappableTaskError, parse_dockerfile


def test_workdir_env_arg_copy_and_run_become_the_boxs_steps() -> None:
    plan = parse_dockerfile(
        "# a comment\n"
        "FROM python:3.13-slim AS base\n"
        "ARG SUFFIX=txt\n"
        'ENV GREETING="hello there" \\\n'
        "    MODE=io\n"
        "ENV OLD old style value\n"
        "ENV PATH=/opt/tools:$PATH\n"
        "WORKDIR /srv\n"
        "WORKDIR app\n"
        "COPY data.${SUFFIX} ./\n"
        "COPY --chmod=755 --chown=root:root tool.sh /opt/tools/\n"
        'RUN ["echo", "a b"]\n'
        "RUN echo $MODE > built.txt\n"
        'CMD ["sleep", "infinity"]\n'
        "EXPOSE 8080\n"
    )
    assert plan.base == "python:3.13-slim"
    assert plan.workdir == "/srv/app"
    assert plan.env == {
        "GREETING": "hello there",
        "MODE": "io",
        "OLD": "old style value",
        "PATH": f"/opt/tools:{DEFAULT_PATH}",
    }
    copy, tool, run_list, run = plan.steps
    assert (copy.kind, copy.sources, copy.argument) == ("copy", ("data.txt",), "/srv/app/")
    assert (tool.sources, tool.argument, tool.chmod) == (("tool.sh",), "/opt/tools/", "755")
    assert run_list.argument == "echo 'a b'"
    assert (run.kind, run.argument, run.workdir, run.line) == (
        "run",
        "echo $MODE > built.txt",
        "/srv/app",
        13,
    )
    assert run.env["MODE"] == "io"
    assert run.env["SUFFIX"] == "txt"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("FROM a\nFROM b\n", "Dockerfile:2: a second FROM"),
        ("FROM a\nUSER agent\n", "Dockerfile:2: USER agent: an aenv-ray instance's user namespace"),
        (
            "FROM a\nCOPY --from=build /x /y\n",
            "Dockerfile:2: COPY --from: only files of environment/",
        ),
        ("FROM a\nADD https://x.org/f /f\n", "the instance has no network to fetch it"),
        ("FROM a\nADD pkg.tar.gz /opt/\n", "unpacking archives is not mapped"),
        ("FROM a\nCOPY ../secret /s\n", "outside the task's environment/ directory"),
        ("FROM a\nCOPY --chown=agent x /x\n", "only root exists"),
        (
            "FROM a\nRUN --mount=type=cache,target=/c make\n",
            "RUN options (`--mount=type=cache,target=/c`)",
        ),
        ('FROM a\nSHELL ["/bin/sh", "-c"]\n', "commands run with bash -c only"),
        ("FROM a\nONBUILD RUN x\n", "Dockerfile:2: the instruction ONBUILD cannot be mapped"),
        ("WORKDIR /app\n", "no FROM line"),
    ],
)
def test_what_cannot_be_mapped_is_refused_naming_the_line(text: str, says: str) -> None:
    with pytest.raises(UnmappableTaskError) as caught:
        parse_dockerfile(text)
    assert says in str(caught.value)
