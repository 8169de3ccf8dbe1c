"""A Harbor task's ``environment/Dockerfile``, mapped onto an aenv-ray instance's box.

There is no Docker engine here: the box's system is the instance's (``/usr``, ``/etc``), and a
Dockerfile's instructions become what the provider does after the instance starts. What maps:

=================  ==============================================================================
instruction        becomes
=================  ==============================================================================
``FROM image``     noted (:attr:`DockerPlan.base`): the instance's system stands in for the image;
                   a second ``FROM`` (a multi-stage build) is refused
``WORKDIR dir``    the box's working directory, made at start (relative to the one before)
``ENV k=v``        the environment of every command (``ENV k v`` too); ``$k``/``${k}`` expanded
``ARG k[=v]``      a build variable for the lines after it (its default; ``--build-arg`` none)
``COPY``/``ADD``   files of ``environment/`` uploaded into the box at start (``--chmod`` kept;
                   ``--chown`` to root only); a URL, an archive ``ADD`` unpacks, ``--from`` refused
``RUN cmd``        run in the box at start, as root, in the ``WORKDIR``, with the ``ENV``; a
                   failure fails ``start`` naming the line (no package manager reaches a network)
``USER``           ``root``/``0`` only (the instance's user namespace maps no other user)
``CMD``, ...       ``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``, ``VOLUME``, ``STOPSIGNAL``,
                   ``MAINTAINER``, ``HEALTHCHECK``, ``SHELL`` (``["/bin/bash", "-c"]`` only)
                   ignored: Harbor execs its commands itself
=================  ==============================================================================

Anything else is refused with :class:`UnmappableTaskError` naming the line and why.

    >>> text = "FROM ubuntu:24.04\\nWORKDIR /app\\nENV GREETING=hi\\nRUN echo $GREETING"
    >>> plan = parse_dockerfile(text)
    >>> plan.base, plan.workdir, plan.env, [step.argument for step in plan.steps]
    ('ubuntu:24.04', '/app', {'GREETING': 'hi'}, ['echo $GREETING'])

May import: the standard library, aenv_ray.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field

from aenv_ray.errors import ConfigurationError

__all__ = ["DEFAULT_PATH", "DockerPlan", "Step", "UnmappableTaskError", "parse_dockerfile"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` in the box unless an ``ENV`` sets it (as in Docker images); ``$PATH`` expands to it."""

IGNORED = frozenset(
    {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "STOPSIGNAL", "MAINTAINER", "HEALTHCHECK"}
)
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")


class UnmappableTaskError(ConfigurationError):
    """A Harbor task asks for what an aenv-ray instance cannot give (a second ``FROM``, a user
    other than root, a compose file, a prebuilt image on the local engine, ...): the message
    names it and says why. Raised before any instance starts, or by ``start`` for a ``RUN``
    line that fails."""


@dataclass(frozen=True)
class Step:
    """One thing to do at start, in order: ``run`` a command, or ``copy`` ``sources`` (paths
    in ``environment/``) to ``target`` (a path in the box)."""

    kind: str  # "run" or "copy"
    argument: str  # the command, or the target
    line: int
    sources: tuple[str, ...] = ()
    chmod: str | None = None
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class DockerPlan:
    """What a Dockerfile becomes: its base image (noted), the box's working directory and
    environment, and the steps to run at start."""

    base: str | None = None
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """The instructions with their first line numbers: continuations joined, comments and
    blank lines dropped."""
    lines: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1])
            continue
        current.append(stripped)
        lines.append((start, " ".join(part for part in current if part)))
        current = []
    if current:
        lines.append((start, " ".join(current)))
    return lines


def _expand(value: str, variables: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        if name in variables:
            return variables[name]
        return default if default is not None else ""

    return _VARIABLE.sub(one, value)


def _pairs(argument: str, variables: dict[str, str]) -> dict[str, str]:
    words = shlex.split(argument)
    if len(words) >= 2 and "=" not in words[0]:  # the old form: ENV KEY value with spaces
        return {words[0]: _expand(argument.split(None, 1)[1], variables)}
    found: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(word)
        found[key] = _expand(value, variables)
    return found


def parse_dockerfile(text: str, *, where: str = "Dockerfile") -> DockerPlan:
    """Map a Dockerfile's instructions (see the module's table); :class:`UnmappableTaskError`
    for one that cannot be, naming ``where`` and its line."""
    plan = DockerPlan()
    build_args: dict[str, str] = {}

    def refuse(line: int, why: str) -> UnmappableTaskError:
        return UnmappableTaskError(f"{where}:{line}: {why}")

    for line, instruction in _logical_lines(text):
        keyword, _, argument = instruction.partition(" ")
        keyword = keyword.upper()
        argument = argument.strip()
        variables = {"PATH": DEFAULT_PATH, **build_args, **plan.env}
        if keyword == "FROM":
            if plan.base is not None:
                raise refuse(
                    line,
                    "a second FROM (a multi-stage build) cannot be mapped: the instance's "
                    "system stands in for one image; build the task's image yourself and run "
                    "it on the Kubernetes engine",
                )
            words = argument.split()
            plan.base = words[0] if words else ""
        elif keyword == "WORKDIR":
            target = _expand(argument, variables)
            plan.workdir = posixpath.normpath(posixpath.join(plan.workdir, target))
        elif keyword == "ENV":
            try:
                plan.env.update(_pairs(argument, variables))
            except ValueError as exc:
                raise refuse(line, f"ENV `{argument}` is not KEY=VALUE ({exc})") from None
        elif keyword == "ARG":
            name, sep, default = argument.partition("=")
            build_args[name.strip()] = _expand(default.strip().strip('"'), variables) if sep else ""
        elif keyword == "RUN":
            command = argument
            if command.startswith("["):
                try:
                    command = shlex.join(json.loads(command))
                except (ValueError, TypeError):
                    raise refuse(line, f"RUN `{argument}` is not a JSON list") from None
            if command.startswith("--"):
                raise refuse(line, f"RUN options (`{command.split()[0]}`) cannot be mapped")
            plan.steps.append(
                Step("run", command, line, workdir=plan.workdir, env={**build_args, **plan.env})
            )
        elif keyword in ("COPY", "ADD"):
            plan.steps.append(_copy(keyword, argument, line, plan, variables, refuse))
        elif keyword == "USER":
            user = _expand(argument, variables).split(":")[0]
            if user not in ("root", "0"):
                raise refuse(
                    line,
                    f"USER {user}: an aenv-ray instance's user namespace maps only root, so "
                    "its commands cannot run as another user",
                )
        elif keyword == "SHELL":
            if json.loads(argument) not in (["/bin/bash", "-c"], ["bash", "-c"]):
                raise refuse(line, f"SHELL {argument}: commands run with bash -c only")
        elif keyword in IGNORED:
            continue
        else:
            raise refuse(line, f"the instruction {keyword} cannot be mapped onto an instance")
    if plan.base is None:
        raise UnmappableTaskError(f"{where}: no FROM line: this is not a Dockerfile")
    return plan


def _copy(
    keyword: str,
    argument: str,
    line: int,
    plan: DockerPlan,
    variables: dict[str, str],
    refuse: object,
) -> Step:
    assert callable(refuse)
    try:
        words = json.loads(argument) if argument.startswith("[") else shlex.split(argument)
    except ValueError:
        raise refuse(line, f"{keyword} `{argument}` cannot be read") from None
    chmod = None
    while words and words[0].startswith("--"):
        flag, _, value = words.pop(0).partition("=")
        if flag == "--chmod":
            chmod = value
        elif flag == "--chown":
            if value.split(":")[0] not in ("root", "0"):
                raise refuse(line, f"{keyword} --chown={value}: only root exists in the instance")
        else:
            raise refuse(
                line,
                f"{keyword} {flag}: only files of environment/ can be copied "
                "(no other stage, image or build context)",
            )
    words = [_expand(word, variables) for word in words]
    if len(words) < 2:
        raise refuse(line, f"{keyword} needs a source and a destination")
    *sources, target = words
    for source in sources:
        if "://" in source:
            raise refuse(line, f"{keyword} {source}: the instance has no network to fetch it")
        if keyword == "ADD" and source.endswith((".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")):
            raise refuse(
                line, f"ADD {source}: unpacking archives is not mapped; use COPY and RUN tar"
            )
        normal = posixpath.normpath(source)
        if normal.startswith("..") or posixpath.isabs(normal):
            raise refuse(line, f"{keyword} {source}: outside the task's environment/ directory")
    keep_slash = target.endswith(("/", "/.")) or target == "."  # a directory, as Docker reads it
    target = posixpath.normpath(posixpath.join(plan.workdir, target))
    target += "/" if keep_slash and target != "/" else ""
    return Step("copy", target, line, tuple(sources), chmod, plan.workdir, dict(plan.env))
