"""``[tenant/]name[@version]`` as a value: :class:`EnvRef`, version order and "did you mean".

An environment is named ``name@version`` (``mini-terminal@1.0.0``) or ``name`` alone (its
highest version; ``name@latest`` means the same). On a hub, ``tenant/name@version`` names another
tenant's version explicitly (:mod:`envhub.resolve`). Every place that reads such a string parses
it once with :meth:`EnvRef.parse` and works with the fields.

    >>> ref = EnvRef.parse("alice/notes@1.2.0")
    >>> ref.tenant, ref.name, ref.version
    ('alice', 'notes', '1.2.0')
    >>> str(ref), ref.bare, str(EnvRef.parse("notes"))
    ('alice/notes@1.2.0', 'notes@1.2.0', 'notes')
    >>> sorted(["1.10.0", "1.2.0", "1.2.0-rc1"], key=version_key)
    ['1.2.0', '1.2.0-rc1', '1.10.0']
    >>> did_you_mean("mini-termnal", ["mini-terminal", "echo"])
    '; did you mean `mini-terminal`?'

The value checks structure only (one ``@`` at most, one ``/`` at most, no empty part, no
whitespace); whether a name exists, or is a name a project may take
(:class:`~aenv_ray.config.EnvConfig`), is the lookup's business, which answers with
:class:`~aenv_ray.errors.EnvironmentNotFoundError` and the closest name.

A tool's qualified name ``env@ver/tool`` is not an environment reference (its last part is a
tool): :mod:`aenv_ray.openai_tools` and ``Environment.call_tool`` split off the tool at the last
``/`` and read what precedes it with :meth:`EnvRef.parse`.

May import: the standard library, ``aenv_ray.errors``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from aenv_ray.errors import ConfigurationError

__all__ = ["LATEST", "EnvRef", "closest", "closest_ref", "did_you_mean", "version_key"]

LATEST = "latest"
"""The version word that means "the highest version", as no version at all does."""

VersionKey = tuple[tuple[int, int | str], ...]


def version_key(version: str) -> VersionKey:
    """Sort key of a version: numeric parts compare as numbers, others as text.

    >>> sorted(["2", "10", "1.0.0-b", "1.0.0-a"], key=version_key)
    ['1.0.0-a', '1.0.0-b', '2', '10']
    """
    return tuple(
        (0, int(p)) if p.isdigit() else (1, p) for p in version.replace("-", ".").split(".")
    )


_FORMS = "write NAME, NAME@VERSION or TENANT/NAME@VERSION"


def _problem(part: object, what: str) -> str | None:
    """Why ``part`` cannot be an EnvRef's ``what``, or None."""
    if not isinstance(part, str):
        return f"its {what} {part!r} is not a string"
    if not part:
        return f"its {what} is empty"
    if any(c.isspace() for c in part):
        return f"its {what} `{part}` holds whitespace"
    if "@" in part or "/" in part:
        return f"its {what} `{part}` holds `@` or `/`"
    return None


@dataclass(frozen=True)
class EnvRef:
    """An environment's name, its version (``None``: the highest) and, on a hub, the tenant
    that publishes it (``None``: the caller's own, or a built-in).

    Every part is checked when the value is made: none is empty, none holds whitespace, ``@``
    or ``/`` (:class:`~aenv_ray.errors.ConfigurationError`, a ``ValueError``, otherwise).
    """

    name: str
    version: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        parts = (("name", self.name), ("version", self.version), ("tenant", self.tenant))
        for what, part in parts:
            if part is None and what != "name":
                continue
            problem = _problem(part, what)
            if problem is not None:
                shown = "/".join(str(p) for p in (self.tenant, self.name) if p is not None)
                shown += "" if self.version is None else f"@{self.version}"
                raise ConfigurationError(
                    f"`{shown}` is not an environment reference: {problem}; {_FORMS}"
                )

    @classmethod
    def parse(cls, text: str) -> EnvRef:
        """``[tenant/]name[@version]`` -> an :class:`EnvRef`.

        Raises :class:`~aenv_ray.errors.ConfigurationError` (a ``ValueError``) naming the
        problem when ``text`` is not of that form.

            >>> EnvRef.parse("mini-terminal@1.0.0")
            EnvRef(name='mini-terminal', version='1.0.0', tenant=None)
            >>> EnvRef.parse("a@b@c")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            aenv_ray.errors.ConfigurationError: `a@b@c` is not an environment reference: ...
        """
        if not isinstance(text, str):
            raise ConfigurationError(
                f"an environment reference is a string such as `name@1.0.0`, not {text!r}"
            )
        for sep in "/@":
            if text.count(sep) > 1:
                raise ConfigurationError(
                    f"`{text}` is not an environment reference: it holds more than one "
                    f"`{sep}`; {_FORMS}"
                )
        tenant, slash, rest = text.rpartition("/")
        name, at, version = rest.partition("@")
        if "@" in tenant:
            raise ConfigurationError(
                f"`{text}` is not an environment reference: the version goes last; {_FORMS}"
            )
        return cls(name, version if at else None, tenant if slash else None)

    def __str__(self) -> str:
        """``[tenant/]name[@version]``, what :meth:`parse` reads back."""
        return f"{self.tenant}/{self.bare}" if self.tenant else self.bare

    @property
    def bare(self) -> str:
        """``name[@version]`` without the tenant."""
        return f"{self.name}@{self.version}" if self.version is not None else self.name

    @property
    def is_latest(self) -> bool:
        """True when the reference means the highest version (no version, or ``latest``)."""
        return self.version in (None, LATEST)

    def without_version(self) -> EnvRef:
        """The same reference with no version (it means the highest)."""
        return EnvRef(self.name, None, self.tenant)

    def is_selected_by(self, query: str) -> bool:
        """True when the filter ``query`` names this reference: all of it, or all of it but
        the version (``notes`` selects ``notes@1.0``; ``alice/notes`` selects
        ``alice/notes@1.0``, ``notes`` does not).

            >>> EnvRef.parse("notes@1.0").is_selected_by("notes")
            True
            >>> EnvRef.parse("alice/notes@1.0").is_selected_by("notes")
            False
        """
        return query in (str(self), str(self.without_version()))

    def sort_key(self) -> tuple[str, VersionKey]:
        """Order by name, then by :func:`version_key` (a missing version first)."""
        return self.name, () if self.version is None else version_key(self.version)


def closest(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The choice most like ``word`` (:func:`difflib.get_close_matches`), or None.

    >>> closest("exec_cmd", ["execute_command", "read_file"], cutoff=0.5)
    'execute_command'
    """
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def closest_ref(wanted: str, refs: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The reference among ``refs`` most like ``wanted``, or None when no name is close.

    Names are compared, not whole references: the version every reference carries
    (``@1.0.0``) would make any name look close to any other (``notes@1.0.0`` to
    ``swe@1.0.0``). Of the closest name, the version asked for when there is one, else the
    highest.

    >>> refs = ["agent@1.0.0", "swe@1.0.0", "mini-terminal@1.0.0", "mini-terminal@2.0.0"]
    >>> closest_ref("mini-termnal", refs)
    'mini-terminal@2.0.0'
    >>> closest_ref("mini-termnal@1.0.0", refs)
    'mini-terminal@1.0.0'
    >>> closest_ref("notes@1.0.0", refs) is None
    True
    """
    want = EnvRef.parse(wanted)
    parsed = [EnvRef.parse(ref) for ref in refs]
    name = closest(want.name, sorted({ref.name for ref in parsed}), cutoff=cutoff)
    if name is None:
        return None
    named = [ref for ref in parsed if ref.name == name]
    asked = [ref for ref in named if (ref.tenant, ref.version) == (want.tenant, want.version)]
    return str(asked[0] if asked else max(named, key=EnvRef.sort_key))


def did_you_mean(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str:
    """``"; did you mean `x`?"`` for the closest of ``choices``, or ``""`` when none is close."""
    found = closest(word, choices, cutoff=cutoff)
    return f"; did you mean `{found}`?" if found is not None else ""
