"""When two environment names are the same name to a reader: :func:`name_key`.

A hub's registry refuses a name whose key equals the key of a built-in's name or of a name
another tenant publishes, so nobody can publish ``Mini_Terminal`` or ``m1ni-terminal`` (or, were
the name syntax ever widened, ``mіni-terminal`` with a Cyrillic ``і``) beside ``mini-terminal``.
The key is deliberately coarse: a refused name that merely resembles another costs its publisher
a rename, while an accepted lookalike costs its victims their code.

The steps, in order (each one a pure function of the text):

1. NFKC: compatibility forms become their plain letters (fullwidth ``ｍ``, ligatures, ``ℹ``);
2. casefold;
3. marks and invisible characters go: combining accents (``ï`` -> ``i``), zero-width joiners,
   soft hyphens;
4. a small confusable table: Cyrillic, Greek and other letters that look like Latin ones, and
   the digits ``0`` and ``1`` (``o``, ``i``; ``l`` and ``|`` also become ``i``);
5. separators go: everything that is not a letter or a digit (``-``, ``_``, ``.``, spaces);
6. letter pairs that read as one letter: ``rn`` -> ``m``, ``vv`` -> ``w``.

    >>> name_key("mini-terminal") == name_key("Mini_Terminal") == name_key("m1ni.terminal")
    True
    >>> name_key("ｍｉｎｉ-terminal") == name_key("mіni-tеrminal")  # fullwidth; Cyrillic і, е
    True
    >>> name_key("mini-terminal") == name_key("maxi-terminal")
    False

A built-in's name is guarded more widely (:func:`imitated`): beside its key, a name that differs
from it only by trailing digits (``mini-program0``, ``tau3``), by digits read as letters (``5``
as ``s``, ``4`` as ``a``, ...) or, for a built-in of five or more letters, by one edit or one
swap of neighbours (``aegnt``, ``mini-progam``, ``agents``) is refused, unless the edit is a
whole word of its own (``agent-b``, ``my-agent``). Tenants' names keep the exact key:
``notes-v1`` and ``notes-v2`` may belong to different tenants, but nobody may publish ``agents``.

    >>> imitated("aegnt", ["agent", "swe"]), imitated("mini-program0", ["mini-program"])
    ('agent', 'mini-program')
    >>> imitated("swe-bench", ["agent", "swe", "mini-program"]) is None
    True

May import: the standard library only.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["CONFUSABLES", "imitated", "name_key", "skeleton"]

# one character -> the Latin letter (or digit) it passes for; every value is final (no value is
# itself a key), so folding twice changes nothing
CONFUSABLES: dict[str, str] = {
    # digits and ASCII that pass for letters
    "0": "o",
    "1": "i",
    "l": "i",
    "|": "i",
    # Cyrillic
    "а": "a",
    "б": "6",
    "в": "b",
    "г": "r",
    "е": "e",
    "з": "3",
    "к": "k",
    "м": "m",
    "н": "h",
    "о": "o",
    "п": "n",
    "р": "p",
    "с": "c",
    "т": "t",
    "у": "y",
    "х": "x",
    "ъ": "b",
    "ь": "b",
    "ѕ": "s",
    "і": "i",
    "ј": "j",
    "ԁ": "d",
    "ԛ": "q",
    "ԝ": "w",
    "ү": "y",
    "һ": "h",
    "ӏ": "i",
    "ɡ": "g",
    # Greek
    "α": "a",
    "β": "b",
    "γ": "y",
    "ε": "e",
    "η": "n",
    "ι": "i",
    "κ": "k",
    "ν": "v",
    "ο": "o",
    "ρ": "p",
    "τ": "t",
    "υ": "u",
    "χ": "x",
    "ω": "w",
    # Latin letters that pass for others; Armenian
    "ı": "i",
    "ȷ": "j",
    "ɩ": "i",
    "ʟ": "i",
    "օ": "o",
    "ս": "u",
    "ց": "g",
    "հ": "h",
}

_PAIRS = (("rn", "m"), ("vv", "w"))


def name_key(name: str) -> str:
    """The key under which ``name`` and every name that looks like it are the same name.

    Pure and idempotent (``name_key(name_key(x)) == name_key(x)``); ``""`` for a name that is
    only separators.
    """
    text = unicodedata.normalize("NFKC", name).casefold()
    kept = []
    for char in unicodedata.normalize("NFD", text):
        category = unicodedata.category(char)
        if category in ("Mn", "Me", "Cf"):  # accents and invisible characters
            continue
        char = CONFUSABLES.get(char, char)
        if char.isalnum():  # separators and punctuation go
            kept.append(char)
    key = unicodedata.normalize("NFC", "".join(kept))
    for pair, single in _PAIRS:
        key = key.replace(pair, single)
    return key


# digits that pass for letters beside ``0`` and ``1`` (which :data:`CONFUSABLES` folds already);
# used for built-ins' names only, so tenants' stored name keys keep their meaning
_DIGIT_LETTERS = str.maketrans(
    {"2": "z", "3": "e", "4": "a", "5": "s", "6": "b", "7": "t", "8": "b", "9": "g"}
)
_EDITABLE = 5  # a built-in's skeleton this long or longer also guards its one-edit neighbours


def skeleton(name: str) -> str:
    """The coarser key a built-in's name is guarded under: trailing digits (and separators)
    dropped, then :func:`name_key`, then every digit left read as the letter it passes for.

        >>> skeleton("Mini_Program0"), skeleton("tau2"), skeleton("5we"), skeleton("42")
        ('miniprogram', 'tau', 'swe', 'az')
    """
    trimmed = name.rstrip("0123456789-_. ")
    key = name_key(trimmed) or name_key(name)  # a name of digits only keeps them
    return key.translate(_DIGIT_LETTERS)


def _one_edit(one: str, other: str) -> bool:
    """Whether ``one`` becomes ``other`` by at most one insertion, deletion, substitution or
    swap of two neighbouring characters."""
    if one == other:
        return True
    if abs(len(one) - len(other)) > 1:
        return False
    if len(one) > len(other):
        one, other = other, one
    start = 0
    while start < len(one) and one[start] == other[start]:
        start += 1
    if len(one) == len(other):
        rest = start + 1
        swapped = rest < len(one) and one[start] == other[rest] and one[rest] == other[start]
        return one[rest:] == other[rest:] or (swapped and one[rest + 1 :] == other[rest + 1 :])
    return one[start:] == other[start + 1 :]  # ``other`` has one more character


def imitated(name: str, builtins: Iterable[str]) -> str | None:
    """The built-in whose name ``name`` imitates (see the module), else None."""
    mine = skeleton(name)
    for builtin in builtins:
        theirs = skeleton(builtin)
        if name_key(name) == name_key(builtin) or mine == theirs:
            return builtin
        if len(theirs) >= _EDITABLE and _one_edit(mine, theirs) and not _adds_words(name, builtin):
            return builtin
    return None


def _words(name: str) -> list[str]:
    return [skeleton(word) for word in re.split(r"[^0-9A-Za-z]+", name.rstrip("0123456789-_. "))]


def _adds_words(name: str, builtin: str) -> bool:
    """Whether ``name`` is ``builtin``'s words with whole words before or after them
    (``agent-b``, ``my-agent``): a name of its own, not a lookalike."""
    mine, theirs = _words(name), _words(builtin)
    size = len(theirs)
    return len(mine) > size and theirs in (mine[:size], mine[-size:])
