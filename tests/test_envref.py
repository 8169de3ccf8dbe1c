"""``EnvRef``: parsing, formatting, version order and "did you mean" (``aenv_ray.envref``)."""

from __future__ import annotations

import doctest
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aenv_ray.envref
from aenv_ray.envref import EnvRef, closest, did_you_mean, version_key
from aenv_ray.errors import ConfigurationError

PART = st.text(
    alphabet=st.characters(categories=("L", "N"), include_characters="-_.+"),
    min_size=1,
    max_size=20,
)


def test_the_docstring_examples_run() -> None:
    result = doctest.testmod(aenv_ray.envref)
    assert result.attempted > 5
    assert result.failed == 0


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("mini-terminal", ("mini-terminal", None, None)),
        ("mini-terminal@1.0.0", ("mini-terminal", "1.0.0", None)),
        ("notes@latest", ("notes", "latest", None)),
        ("alice/notes", ("notes", None, "alice")),
        ("alice/notes@1.0.0-rc1+local", ("notes", "1.0.0-rc1+local", "alice")),
    ],
)
def test_parse_reads_every_form_and_str_writes_it_back(
    text: str, fields: tuple[str, str | None, str | None]
) -> None:
    ref = EnvRef.parse(text)
    assert (ref.name, ref.version, ref.tenant) == fields
    assert str(ref) == text
    assert ref.bare == text.rpartition("/")[2]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "its name is empty"),
        ("@1.0", "its name is empty"),
        ("notes@", "its version is empty"),
        ("/notes", "its tenant is empty"),
        ("a@b@c", "more than one `@`"),
        ("a/b/c", "more than one `/`"),
        ("notes@1.0/alice", "the version goes last"),
        ("my notes", "holds whitespace"),
        ("notes@1.0\n", "holds whitespace"),
    ],
)
def test_bad_input_is_a_configuration_error_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        EnvRef.parse(text)
    assert isinstance(caught.value, ValueError)
    assert says in str(caught.value)
    assert f"`{text}`" in str(caught.value)
    assert "NAME@VERSION" in str(caught.value)  # what to write instead


def test_a_value_made_directly_is_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="its version `1/2` holds `@` or `/`"):
        EnvRef("notes", "1/2")
    with pytest.raises(ConfigurationError, match="is not a string"):
        EnvRef(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not 3"):
        EnvRef.parse(3)  # type: ignore[arg-type]


@given(name=PART, version=st.none() | PART, tenant=st.none() | PART)
def test_format_then_parse_is_the_identity(
    name: str, version: str | None, tenant: str | None
) -> None:
    ref = EnvRef(name, version, tenant)
    assert EnvRef.parse(str(ref)) == ref
    assert pickle.loads(pickle.dumps(ref)) == ref


def test_versions_order_numerically_then_as_text() -> None:
    versions = ["1.10.0", "1.2.0", "1.2.0-rc1", "0.9", "10", "2"]
    assert sorted(versions, key=version_key) == ["0.9", "1.2.0", "1.2.0-rc1", "1.10.0", "2", "10"]
    refs = [EnvRef.parse(t) for t in ("b@1", "a@1.10", "a@1.9", "a")]
    assert [str(r) for r in sorted(refs, key=EnvRef.sort_key)] == ["a", "a@1.9", "a@1.10", "b@1"]


def test_latest_and_selection() -> None:
    assert EnvRef.parse("notes").is_latest
    assert EnvRef.parse("notes@latest").is_latest
    assert not EnvRef.parse("notes@1.0").is_latest
    assert EnvRef.parse("alice/notes@1.0").without_version() == EnvRef("notes", tenant="alice")
    mine = EnvRef.parse("notes@1.0")
    assert mine.is_selected_by("notes@1.0")
    assert mine.is_selected_by("notes")
    assert not mine.is_selected_by("notes@2.0")
    assert not mine.is_selected_by("note")
    theirs = EnvRef.parse("alice/notes@1.0")
    assert theirs.is_selected_by("alice/notes")
    assert not theirs.is_selected_by("notes")


def test_did_you_mean_names_the_closest_choice_or_nothing() -> None:
    names = ["mini-terminal", "echo", "notes"]
    assert closest("mini-termnal", names) == "mini-terminal"
    assert did_you_mean("mini-termnal", names) == "; did you mean `mini-terminal`?"
    assert closest("zzzzzz", names) is None
    assert did_you_mean("zzzzzz", names) == ""
    assert did_you_mean("anything", []) == ""
    # the cutoff decides how far a suggestion may be
    assert closest("ex_cmd", ["execute_command"]) is None
    assert closest("ex_cmd", ["execute_command"], cutoff=0.5) == "execute_command"
