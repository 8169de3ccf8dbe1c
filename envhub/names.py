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

May import: the standard library only.
"""

from __future__ import annotations

import unicodedata

__all__ = ["CONFUSABLES", "name_key"]

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
