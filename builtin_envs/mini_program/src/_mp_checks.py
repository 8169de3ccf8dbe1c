"""Sanity checks of a mini program's HTML, JavaScript, CSS and JSON, with the standard library.

They find the mistakes that break a page, not every mistake: they are no parser of the
languages and no linter.

- **HTML** (``html.parser``): elements opened and never closed, or closed out of order (elements
  whose end tag HTML lets you leave out, ``<p>``, ``<li>``, ``<td>``..., and void elements,
  ``<br>``, ``<img>``..., are exempt); end tags that close nothing; an unterminated comment;
  local files the page references (``<script src>``, ``<link href>``, ``<img src>``, ...) that
  are not in the project; addresses starting with ``/`` (in the preview they point outside the
  project); inline ``<script>`` and ``<style>`` blocks, checked as below. Warnings: no
  ``<!DOCTYPE html>``, no ``<title>``, a duplicate ``id``, ``<div/>`` (not self-closing in
  HTML), a resource from the network (the preview's policy blocks it), a link to a local page
  that is missing.
- **JavaScript** (a scanner, not a parser): brackets ``()[]{}`` balanced and matched, strings,
  template literals (with ``${...}``), regular expressions and comments terminated. It stops at
  the first problem of a script.
- **CSS**: braces, brackets and parentheses balanced, strings and comments terminated; a
  warning for a declaration without ``:``.
- **JSON**: ``json.loads``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from posixpath import dirname, normpath
from urllib.parse import unquote, urlsplit

__all__ = ["CHECKED_EXTENSIONS", "Problem", "check_file"]

CHECKED_EXTENSIONS = ("html", "htm", "js", "mjs", "css", "json")


@dataclass(frozen=True)
class Problem:
    """One finding: ``error`` (the page is likely broken) or ``warning``."""

    severity: str
    line: int
    message: str


# -- JavaScript --------------------------------------------------------------------------------

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {v: k for k, v in _OPEN.items()}
# after these words a `/` starts a regular expression, not a division
_REGEX_AFTER_WORDS = frozenset(
    [
        "return",
        "typeof",
        "instanceof",
        "in",
        "of",
        "new",
        "delete",
        "void",
        "throw",
        "case",
        "do",
        "else",
        "yield",
        "await",
    ]
)
_WORD = re.compile(r"[A-Za-z0-9_$\u0080-\uffff]")


def check_js(source: str, first_line: int = 1) -> list[Problem]:
    """The first structural problem of a script, if any (``first_line``: its first line's
    number in its file)."""
    scanner = _JsScanner(source, first_line)
    try:
        scanner.run()
    except _Stop as stop:
        return [stop.problem]
    return []


class _Stop(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


class _JsScanner:
    def __init__(self, source: str, first_line: int) -> None:
        self.s = source
        self.i = 0
        self.line = first_line
        # open brackets, and "`" for a template literal whose `${` is open
        self.stack: list[tuple[str, int]] = []
        self.last = ""  # the last significant token's kind: "word", "value", "punct" or ""
        self.last_word = ""

    def fail(self, message: str, line: int | None = None) -> None:
        raise _Stop(Problem("error", self.line if line is None else line, message))

    def run(self) -> None:
        s = self.s
        if s.startswith("#!"):
            self.skip_to_newline()
        while self.i < len(s):
            c = s[self.i]
            if c == "\n":
                self.line += 1
                self.i += 1
            elif c in " \t\r\f\v\ufeff":
                self.i += 1
            elif s.startswith("//", self.i):
                self.skip_to_newline()
            elif s.startswith("/*", self.i):
                self.block_comment()
            elif c in "'\"":
                self.string(c)
                self.last = "value"
            elif c == "`":
                self.i += 1
                self.template(self.line)
                self.last = "value"
            elif c == "/":
                if self.last in ("value", "word") and self.last_word not in _REGEX_AFTER_WORDS:
                    self.i += 1  # division
                    self.last = "punct"
                else:
                    self.regex()
                    self.last = "value"
            elif c in _OPEN:
                self.stack.append((c, self.line))
                self.i += 1
                self.last, self.last_word = "punct", ""
            elif c == "}" and self.stack and self.stack[-1][0] == "`":
                self.stack.pop()  # the end of a template's `${...}`: back in its text
                self.i += 1
                self.template(self.line)
                self.last, self.last_word = "value", ""
            elif c in _CLOSE:
                self.close(c)
                self.last, self.last_word = "value", ""
            elif _WORD.match(c):
                start = self.i
                while self.i < len(s) and _WORD.match(s[self.i]):
                    self.i += 1
                word = s[start : self.i]
                self.last, self.last_word = "word", word
            else:
                self.i += 1
                self.last, self.last_word = "punct", ""
        if self.stack:
            opener, line = self.stack[-1]
            if opener == "`":
                self.fail("a template literal's `${` is never closed with `}`", line)
            self.fail(f"`{opener}` opened at line {line} is never closed", line)

    def close(self, c: str) -> None:
        want = _CLOSE[c]
        if not self.stack:
            self.fail(f"`{c}` closes nothing")
        opener, line = self.stack[-1]
        if opener != want:
            shown = "${" if opener == "`" else opener
            self.fail(f"`{c}` does not match `{shown}` opened at line {line}")
        self.stack.pop()
        self.i += 1

    def skip_to_newline(self) -> None:
        end = self.s.find("\n", self.i)
        self.i = len(self.s) if end < 0 else end

    def block_comment(self) -> None:
        end = self.s.find("*/", self.i + 2)
        if end < 0:
            self.fail("a `/*` comment is never closed with `*/`")
        self.line += self.s.count("\n", self.i, end)
        self.i = end + 2

    def string(self, quote: str) -> None:
        start_line = self.line
        self.i += 1
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\":
                if s.startswith("\r\n", self.i + 1):
                    self.i += 1
                if self.i + 1 < len(s) and s[self.i + 1] == "\n":
                    self.line += 1
                self.i += 2
            elif c == quote:
                self.i += 1
                return
            elif c == "\n":
                break
            else:
                self.i += 1
        self.fail(f"a string opened with {quote} is not closed on its line", start_line)

    def template(self, start_line: int) -> None:
        """Scan a template literal's text (just after its "`" or a `}` closing a `${`)."""
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\":
                if self.i + 1 < len(s) and s[self.i + 1] == "\n":
                    self.line += 1
                self.i += 2
            elif c == "`":
                self.i += 1
                return
            elif s.startswith("${", self.i):
                self.stack.append(("`", self.line))
                self.i += 2
                self.last, self.last_word = "punct", ""
                return
            else:
                if c == "\n":
                    self.line += 1
                self.i += 1
        self.fail("a template literal (`) is never closed", start_line)

    def regex(self) -> None:
        s = self.s
        self.i += 1
        in_class = False
        while self.i < len(s):
            c = s[self.i]
            if c == "\\":
                self.i += 2
                continue
            if c == "\n":
                break
            if c == "[":
                in_class = True
            elif c == "]":
                in_class = False
            elif c == "/" and not in_class:
                self.i += 1
                while self.i < len(s) and _WORD.match(s[self.i]):
                    self.i += 1  # flags
                return
            self.i += 1
        self.fail("a regular expression (/.../) is not closed on its line")


# -- CSS ---------------------------------------------------------------------------------------


def check_css(source: str, first_line: int = 1) -> list[Problem]:
    """Brackets, strings and comments of a style sheet; declarations without ``:``."""
    problems: list[Problem] = []
    stack: list[tuple[str, int]] = []
    line = first_line
    i = 0
    segment = ""  # text since the last `{`, `}` or `;`
    segment_line = line
    while i < len(source):
        c = source[i]
        if c == "\n":
            line += 1
        if source.startswith("/*", i):
            end = source.find("*/", i + 2)
            if end < 0:
                return [*problems, Problem("error", line, "a `/*` comment is never closed")]
            line += source.count("\n", i, end)
            i = end + 2
            continue
        if c in "'\"":
            end = i + 1
            while end < len(source) and source[end] not in (c, "\n"):
                end += 2 if source[end] == "\\" else 1
            if end >= len(source) or source[end] != c:
                unclosed = f"a string opened with {c} is not closed"
                return [*problems, Problem("error", line, unclosed)]
            segment += source[i : end + 1]
            i = end + 1
            continue
        if c in "([{":
            stack.append((c, line))
            if c == "{":
                segment, segment_line = "", line
                i += 1
                continue
        elif c in ")]}":
            want = _CLOSE[c]
            if not stack:
                return [*problems, Problem("error", line, f"`{c}` closes nothing")]
            opener, opened = stack.pop()
            if opener != want:
                wrong = f"`{c}` does not match `{opener}` opened at line {opened}"
                return [*problems, Problem("error", line, wrong)]
            if c == "}":
                _declaration(segment, segment_line, problems)
                segment, segment_line = "", line
                i += 1
                continue
        elif c == ";" and not any(o in "([" for o, _ in stack):
            if stack:
                _declaration(segment, segment_line, problems)
            segment, segment_line = "", line
            i += 1
            continue
        if not segment.strip():
            segment_line = line
        segment += c
        i += 1
    if stack:
        opener, opened = stack[-1]
        never = f"`{opener}` opened at line {opened} is never closed"
        problems.append(Problem("error", opened, never))
    return problems


def _declaration(text: str, line: int, problems: list[Problem]) -> None:
    text = " ".join(text.split())
    if text and ":" not in text and not text.startswith("@"):
        problems.append(
            Problem("warning", line, f"`{text[:60]}` is not a `property: value` declaration")
        )


# -- HTML --------------------------------------------------------------------------------------

_VOID = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "param",
        "source",
        "track",
        "wbr",
    ]
)
# elements whose end tag HTML lets an author leave out: never reported unclosed
_OPTIONAL_END = frozenset(
    [
        "html",
        "head",
        "body",
        "p",
        "li",
        "dt",
        "dd",
        "option",
        "optgroup",
        "tr",
        "td",
        "th",
        "thead",
        "tbody",
        "tfoot",
        "colgroup",
        "caption",
        "rb",
        "rt",
        "rtc",
        "rp",
    ]
)
# elements that do not break the text around them (others start a new block of text)
_INLINE = frozenset(
    [
        "a",
        "abbr",
        "b",
        "bdi",
        "bdo",
        "cite",
        "code",
        "data",
        "dfn",
        "em",
        "i",
        "kbd",
        "mark",
        "q",
        "s",
        "samp",
        "small",
        "span",
        "strong",
        "sub",
        "sup",
        "time",
        "u",
        "var",
    ]
)
_JS_TYPES = frozenset(
    {"", "text/javascript", "application/javascript", "module", "text/ecmascript"}
)
# (element, attribute) pairs that load a resource the page needs
_RESOURCES = {
    ("script", "src"),
    ("img", "src"),
    ("source", "src"),
    ("audio", "src"),
    ("video", "src"),
    ("video", "poster"),
    ("track", "src"),
    ("iframe", "src"),
    ("embed", "src"),
    ("object", "data"),
    ("input", "src"),
}
_LINK_RESOURCES = frozenset({"stylesheet", "icon", "modulepreload", "manifest", "preload"})
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class _Page(HTMLParser):
    """One pass over a page: its problems, the text it shows, the scripts it runs."""

    def __init__(self, path: str, files: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.path = path
        self.files = files
        self.problems: list[Problem] = []
        self.stack: list[tuple[str, int]] = []  # open elements and their lines
        self.ids: dict[str, int] = {}
        self.doctype = False
        self.title = False
        self.raw: str | None = None  # "script" or "style" while inside one that is checked
        self.raw_line = 0
        self.raw_text: list[str] = []
        self.text: list[str] = []  # what the page shows
        self.hidden = 0  # depth inside <script>, <style>, <template>, <head>, <title>
        self.scripts: list[str] = []  # the project files of the scripts it loads
        self.inline_scripts: list[str] = []

    def add(self, severity: str, line: int, message: str) -> None:
        self.problems.append(Problem(severity, line, message))

    def handle_decl(self, decl: str) -> None:
        if decl.lower().startswith("doctype"):
            self.doctype = True

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        line = self.getpos()[0]
        values = {name: value or "" for name, value in attrs}
        if (
            tag in _OPTIONAL_END
            and self.stack
            and self.stack[-1][0] == tag
            and tag
            in (
                "p",
                "li",
                "dt",
                "dd",
                "option",
                "tr",
                "td",
                "th",
            )
        ):
            self.stack.pop()  # a second <li> ends the first
        if tag == "title":
            self.title = True
        if "id" in values:
            if values["id"] in self.ids:
                self.add(
                    "warning",
                    line,
                    f"id `{values['id']}` is used again (first at line {self.ids[values['id']]})",
                )
            else:
                self.ids[values["id"]] = line
        for name, value in values.items():
            self.reference(tag, name, value, values, line)
        if tag in ("script", "style"):
            kind = values.get("type", "").lower()
            checked = tag == "style" or ("src" not in values and kind in _JS_TYPES)
            self.raw = tag if checked else None
            self.raw_line, self.raw_text = line, []
            if tag == "script" and "src" in values and kind in _JS_TYPES:
                target = self.local(values["src"])
                if target is not None:
                    self.scripts.append(target)
        if tag not in _INLINE:
            self.text.append(" ")
        if tag in ("script", "style", "template", "head", "title"):
            self.hidden += 1
        if tag not in _VOID:
            self.stack.append((tag, line))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _VOID:
            self.add(
                "warning",
                self.getpos()[0],
                f"`<{tag}/>` is not self-closing in HTML: it opens a `<{tag}>`; write "
                f"`<{tag}></{tag}>`",
            )
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        line = self.getpos()[0]
        if tag in _VOID:
            return
        if tag in ("script", "style") and self.raw == tag:
            source = "".join(self.raw_text)
            check = check_js if tag == "script" else check_css
            where = "inline <script>" if tag == "script" else "<style>"
            for problem in check(source, self.raw_line):
                self.problems.append(
                    Problem(problem.severity, problem.line, f"{where}: {problem.message}")
                )
            if tag == "script":
                self.inline_scripts.append(source)
        self.raw = None
        if tag not in _INLINE:
            self.text.append(" ")
        if tag in ("script", "style", "template", "head", "title"):
            self.hidden = max(0, self.hidden - 1)
        if not any(open_tag == tag for open_tag, _ in self.stack):
            if tag in _OPTIONAL_END:
                return
            self.add("error", line, f"`</{tag}>` closes nothing (no `<{tag}>` is open here)")
            return
        while self.stack:
            open_tag, opened = self.stack.pop()
            if open_tag == tag:
                return
            if open_tag not in _OPTIONAL_END:
                self.add(
                    "error",
                    opened,
                    f"`<{open_tag}>` opened at line {opened} is not closed before `</{tag}>` "
                    f"at line {line}",
                )

    def handle_data(self, data: str) -> None:
        if self.raw is not None:
            self.raw_text.append(data)
        elif not self.hidden:
            self.text.append(data)

    def close(self) -> None:
        super().close()
        for tag, line in self.stack:
            if tag not in _OPTIONAL_END:
                self.add("error", line, f"`<{tag}>` opened at line {line} is never closed")

    def local(self, url: str) -> str | None:
        """The project file a local address names, or None (not local, or not a file)."""
        url = url.strip()
        if not url or url.startswith(("#", "//")) or _SCHEME.match(url):
            return None
        parts = urlsplit(url)
        path = unquote(parts.path)
        if not path or path.startswith("/"):
            return None
        joined = normpath(f"{dirname(self.path)}/{path}" if dirname(self.path) else path)
        return None if joined.startswith("..") else joined

    def reference(self, tag: str, name: str, value: str, values: dict[str, str], line: int) -> None:
        resource = (tag, name) in _RESOURCES or (
            tag == "link"
            and name == "href"
            and bool(_LINK_RESOURCES & set(values.get("rel", "").lower().split()))
        )
        page_link = (tag, name) in (("a", "href"), ("form", "action"))
        if not (resource or page_link):
            return
        url = value.strip()
        if not url or url.startswith(("#", "data:", "blob:", "javascript:", "mailto:", "tel:")):
            return
        if url.startswith("//") or _SCHEME.match(url):
            if resource:
                self.add(
                    "warning",
                    line,
                    f"`{url}` is loaded from the network: the preview's policy allows only the "
                    "project's own files (and an instance has no network); put the file in "
                    "the project",
                )
            return
        path = unquote(urlsplit(url).path)
        if path.startswith("/"):
            self.add(
                "error" if resource else "warning",
                line,
                f"`{url}` starts with `/`: in the preview that is outside the project; write "
                f"it relative to this page (`{path.lstrip('/')}`)",
            )
            return
        if not path:
            return
        target = self.local(url)
        if target is None:
            self.add("error", line, f"`{url}` leaves the project")
            return
        folder = target.rstrip("/")
        exists = target in self.files or (
            (path.endswith("/") or not target) and f"{folder}/index.html".lstrip("/") in self.files
        )
        if not exists:
            self.add(
                "error" if resource else "warning",
                line,
                f"`{url}` ({tag} {name}) is not a file of the project",
            )


def _check_html(path: str, source: str, files: frozenset[str]) -> tuple[list[Problem], _Page]:
    page = _Page(path, files)
    page.feed(source)
    page.close()
    problems = list(page.problems)
    opened = source.rfind("<!--")
    if opened >= 0 and source.find("-->", opened + 4) < 0:
        problems.append(
            Problem("error", source.count("\n", 0, opened) + 1, "a `<!--` comment is never closed")
        )
    if not page.doctype:
        problems.append(
            Problem("warning", 1, "no `<!DOCTYPE html>`: browsers render the page in quirks mode")
        )
    if not page.title:
        problems.append(Problem("warning", 1, "no `<title>`"))
    return problems, page


def check_file(path: str, source: str, files: frozenset[str]) -> list[Problem]:
    """The problems of the project file ``path`` (its text ``source``; ``files``: every file
    of the project, for the references a page makes), sorted by line."""
    extension = path.rpartition(".")[2].lower()
    if extension in ("html", "htm"):
        problems, _ = _check_html(path, source, files)
    elif extension in ("js", "mjs"):
        problems = check_js(source)
    elif extension == "css":
        problems = check_css(source)
    elif extension == "json":
        try:
            json.loads(source)
            problems = []
        except json.JSONDecodeError as exc:
            problems = [Problem("error", exc.lineno, f"not JSON: {exc.msg}")]
    else:
        problems = []
    return sorted(problems, key=lambda p: (p.line, p.severity))
