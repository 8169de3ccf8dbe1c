"""``envhub.names.name_key``: the key under which lookalike environment names are one name."""

from __future__ import annotations

import string
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envhub.names import CONFUSABLES, imitated, name_key, skeleton

ALPHABET = string.ascii_lowercase + string.digits
SEPARATORS = ["-", "_", ".", " ", "\u200b", "\u00ad", "－", "＿"]  # incl. zero-width, fullwidth


def _lookalikes(char: str) -> list[str]:
    """Characters a reader takes for ``char`` (each folds as ``char`` does)."""
    target = CONFUSABLES.get(char, char)
    found = {char}
    for other, folded in CONFUSABLES.items():
        if folded == target:
            found.add(other)
    found.add(target)
    out = set()
    for candidate in found:
        out.add(candidate)
        upper = candidate.upper()
        if len(upper) == 1 and upper.casefold() == candidate:
            out.add(upper)
        if "!" <= candidate <= "~":
            out.add(chr(ord(candidate) + 0xFEE0))  # its fullwidth form
        if candidate.isalpha():
            out.add(candidate + "\u0301")  # with a combining accent
    return sorted(out)


@st.composite
def lookalike_pair(draw: st.DrawFn) -> tuple[str, str]:
    """A name of the registry's alphabet and a variant of it a reader would mistake for it."""
    base = draw(st.text(ALPHABET, min_size=1, max_size=20))
    parts = []
    for char in base:
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from(SEPARATORS)))
        parts.append(draw(st.sampled_from(_lookalikes(char))))
    if draw(st.booleans()):
        parts.append(draw(st.sampled_from(SEPARATORS)))
    return base, "".join(parts)


@given(lookalike_pair())
def test_a_lookalike_has_the_same_key(pair: tuple[str, str]) -> None:
    base, variant = pair
    assert name_key(variant) == name_key(base), (base, variant)


@given(st.text())
def test_the_key_is_idempotent(text: str) -> None:
    key = name_key(text)
    assert name_key(key) == key


@given(st.text(ALPHABET + "-_", min_size=1, max_size=63))
def test_keys_of_registry_names_are_plain_lowercase_ascii(name: str) -> None:
    key = name_key(name)
    assert set(key) <= set(string.ascii_lowercase + "23456789")
    assert "rn" not in key
    assert "vv" not in key


def test_every_confusable_folds_to_a_final_character() -> None:
    for char, folded in CONFUSABLES.items():
        assert folded not in CONFUSABLES, (char, folded)
        assert len(folded) == 1
        assert name_key(folded) == folded
        assert unicodedata.normalize("NFKC", char).casefold() == char, char


@pytest.mark.parametrize(
    "name",
    [
        "mini-terminal",
        "Mini-Terminal",
        "MINI_TERMINAL",
        "mini_terminal",
        "mini.terminal",
        "miniterminal",
        "mini--terminal",
        "m1ni-terminal",
        "mini-termina1",
        "rnini-terminal",
        "mіni-terminal",  # Cyrillic і
        "mini-tеrminal",  # Cyrillic е
        "mini-termіnаl",  # Cyrillic і and а
        "mini-terminαl",  # Greek α
        "ｍｉｎｉ－ｔｅｒｍｉｎａｌ",  # fullwidth
        "mini\u200b-terminal",  # a zero-width space
        "mïni-terminal",  # an accent
        "Mini Terminal",
    ],
)
def test_lookalikes_of_mini_terminal(name: str) -> None:
    assert name_key(name) == name_key("mini-terminal") == "miniterminai"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("mini-terminal", "maxi-terminal"),
        ("notes", "note"),
        ("swe-bench", "swe-gym"),
        ("web-shop", "webshop2"),
        ("alpha", "beta"),
    ],
)
def test_different_names_keep_different_keys(one: str, other: str) -> None:
    assert name_key(one) != name_key(other)


def test_separators_only_give_an_empty_key() -> None:
    assert name_key("-_. ") == ""
    assert name_key("") == ""


BUILTINS = ["agent", "mini-program", "mini-terminal", "swe", "tau2", "terminal-bench"]


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("mini-program0", "mini-program"),  # a trailing digit
        ("Mini_Program2", "mini-program"),
        ("aegnt", "agent"),  # two letters swapped
        ("agnet", "agent"),
        ("agents", "agent"),  # a letter added
        ("agentb", "agent"),
        ("agen", "agent"),  # a letter dropped
        ("mini-progarm", "mini-program"),
        ("miniprogarm", "mini-program"),
        ("m1n1-pr0gram", "mini-program"),  # digits for letters
        ("mini-pr0gr4m", "mini-program"),
        ("terminal-bnech", "terminal-bench"),
        ("termina1-8ench", "terminal-bench"),
        ("tau3", "tau2"),  # another trailing digit
        ("tau", "tau2"),
        ("5we", "swe"),
        ("SWE", "swe"),
    ],
)
def test_a_lookalike_of_a_builtin_is_caught(name: str, builtin: str) -> None:
    assert imitated(name, BUILTINS) == builtin


@pytest.mark.parametrize(
    "name",
    # a word of its own before or after a built-in's, or names merely near a short one
    ["agent-b", "agent_b2", "my-agent", "mini-program-x", "swe-bench", "sue", "urgent", "notes"],
)
def test_a_name_of_its_own_is_not_a_lookalike(name: str) -> None:
    assert imitated(name, BUILTINS) is None


def test_the_skeleton_is_coarser_than_the_key() -> None:
    assert skeleton("mini-pr0gr4m5") == skeleton("mini-program") == "miniprogram"
    assert name_key("mini-pr0gr4m") != name_key("mini-program")  # tenants keep the exact key
