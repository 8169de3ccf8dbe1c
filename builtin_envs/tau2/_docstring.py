"""Google-style docstrings, split into what a tool schema shows: summary, rest, arguments.

tau2's tool descriptions come from the tool functions' docstrings: the first line is the summary,
the lines after it (up to the first section title) the long description, and each ``Args:`` entry
the description of one parameter. This parser follows those rules, including their quirks (a
summary that wraps onto a second line is cut after the first line).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

__all__ = ["Docstring", "parse_docstring"]

_SECTIONS = (
    "Arguments",
    "Args",
    "Parameters",
    "Params",
    "Raises",
    "Exceptions",
    "Except",
    "Attributes",
    "Example",
    "Examples",
    "Returns",
    "Yields",
)
_PARAM_SECTIONS = frozenset({"Arguments", "Args", "Parameters", "Params"})
_TITLE = re.compile("^(" + "|".join(f"({t})" for t in _SECTIONS) + ")" + ":[ \t\r\f\v]*$", re.M)
_TYPED_ARG = re.compile(r"\s*(.+?)\s*\(\s*(.*[^\s]+)\s*\)")


@dataclass(frozen=True)
class Docstring:
    """The parts of a docstring a tool schema uses."""

    short: str = ""
    long: str = ""
    params: dict[str, str] = field(default_factory=dict)

    @property
    def description(self) -> str:
        """The summary, then a blank line and the long description when there is one."""
        return f"{self.short}\n\n{self.long}" if self.long else self.short


def _param_entry(text: str) -> tuple[str, str] | None:
    if ":" not in text:
        return None
    before, desc = text.split(":", 1)
    if before and "\n" in before:
        first, rest = before.split("\n", 1)
        before = first + inspect.cleandoc(rest)
    if desc:
        if desc[0] == " ":
            desc = desc[1:]
        if "\n" in desc:
            first, rest = desc.split("\n", 1)
            desc = first + "\n" + inspect.cleandoc(rest)
        desc = desc.strip("\n")
    typed = _TYPED_ARG.match(before)
    return (typed.group(1) if typed else before), desc


def parse_docstring(text: str | None) -> Docstring:
    """Parse ``text`` (a function's ``__doc__``)."""
    if not text:
        return Docstring()
    text = inspect.cleandoc(text)
    first_title = _TITLE.search(text)
    desc_chunk = text[: first_title.start()] if first_title else text
    meta_chunk = text[first_title.start() :] if first_title else ""
    head, _, tail = desc_chunk.partition("\n")
    short, long = head, tail.strip()
    params: dict[str, str] = {}
    titles = list(_TITLE.finditer(meta_chunk))
    for i, title in enumerate(titles):
        if title.group(1) not in _PARAM_SECTIONS:
            continue
        end = titles[i + 1].start() if i + 1 < len(titles) else len(meta_chunk)
        chunk = meta_chunk[title.end() : end]
        unknown = re.search(r"\n\S", chunk)
        if unknown is not None:
            chunk = chunk[: unknown.start()]
        chunk = chunk.strip("\n")
        indent = re.match(r"^\s*", chunk)
        starts = list(
            re.finditer("^" + (indent.group() if indent else "") + r"(?=\S)", chunk, re.M)
        )
        for j, start in enumerate(starts):
            stop = starts[j + 1].start() if j + 1 < len(starts) else len(chunk)
            entry = _param_entry(chunk[start.end() : stop].strip("\n"))
            if entry is not None:
                params[entry[0]] = entry[1]
    return Docstring(short=short, long=long, params=params)
