"""Markdown tables, the one writer behind every table the project prints (the validate reports, the runtime
report, the comparison, the upgrade radar). GitHub-flavoured Markdown's table extension (GFM spec 0.29,
"Tables (extension)", https://github.github.com/gfm/#tables-extension-): a row is one line of cells between
pipes, the second line says each column's alignment, and a pipe inside a cell is written ``\\|`` (which holds
inside code spans and emphasis too).

Short cells: a table is read across, so no cell is longer than :data:`LIMIT` characters (as written, escapes
included). A writer keeps the status, the deciding line and the lift in the cell and moves the rest under a heading
of its own below the table (:class:`Spill`); a long list becomes a count and a few examples (:func:`listed`), the
full list staying in the JSON. :func:`row` cuts any cell still over the limit and says so in the cell, so no writer
can print a paragraph into a table. :func:`long_cells` and :func:`empty_headings` are the checks the tests and
the committed reports are held to.

Shapes: :func:`cell` takes any value and gives one cell's text; :func:`row` a sequence of values and gives one
line; :func:`header` the column names and gives the two heading lines; :func:`table` all of it as a list of
lines (no trailing blank line). No errors are raised: every value is written through ``str``.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

_BREAKS = ("\r\n", "\n", "\r")

#: the longest a table cell may be, in characters as written in the Markdown file (escapes included)
LIMIT = 300

#: what a cell cut by :func:`row` ends with (the writer did not move the text below: the JSON has it)
CUT_NOTE = " ... [cut: {n} characters more in the JSON]"


def _escape(value: Any) -> str:
    text = str(value).replace("\\|", "\\\\|").replace("|", "\\|")
    for br in _BREAKS:
        text = text.replace(br, " ")
    return text


def _trim(text: str, room: int) -> str:
    """``text`` cut to at most ``room`` characters at a word boundary where one is near, never inside an escape
    (a trailing backslash is dropped) and with an opened code span closed."""
    if len(text) <= room:
        return text
    cut = text[:room]
    space = cut.rfind(" ")
    if space > room * 0.6:
        cut = cut[:space]
    cut = cut.rstrip("\\ ;,")
    if cut.count("`") % 2:
        cut = cut[:-1] + "`" if len(cut) >= room else cut + "`"
    return cut


def cell(value: Any, limit: int | None = LIMIT) -> str:
    """``value`` as the text of one cell: ``str(value)`` with each ``|`` written ``\\|`` (a backslash already
    before a pipe is doubled first, so the pipe still reads as text) and each line break (CR LF, LF or CR) one
    space, since a row must stay on one line. A cell over ``limit`` characters (None: no limit) is cut and ends
    with :data:`CUT_NOTE`."""
    text = _escape(value)
    if limit is None or len(text) <= limit:
        return text
    note = CUT_NOTE.format(n=len(text))
    kept = _trim(text, limit - len(note))
    return kept + CUT_NOTE.format(n=len(text) - len(kept))


def row(cells: Iterable[Any], limit: int | None = LIMIT) -> str:
    """One table line: ``| a | b |`` with every cell escaped and capped by :func:`cell`."""
    return "| " + " | ".join(cell(c, limit) for c in cells) + " |"


def header(names: Iterable[Any], right: Iterable[int] = ()) -> list[str]:
    """The heading line and the delimiter line; the columns whose 0-based index is in ``right`` are
    right-aligned (``---:``, for numbers), the rest left (``---``)."""
    names = list(names)
    right = set(right)
    return [row(names), "| " + " | ".join("---:" if i in right else "---" for i in range(len(names))) + " |"]


def table(names: Iterable[Any], rows: Iterable[Iterable[Any]], right: Iterable[int] = ()) -> list[str]:
    """:func:`header` then one :func:`row` per item of ``rows``."""
    return header(names, right) + [row(r) for r in rows]


def short(text: Any, limit: int = 200, more: str = " ... (in full below)") -> str:
    """``text`` as it is when it has at most ``limit`` characters, else its first sentence or words up to
    ``limit`` (``more`` included) followed by ``more``. For a cell whose full text the writer puts below."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    room = limit - len(more)
    head = text[:room]
    stop = max(head.rfind(". "), head.rfind("; "), head.rfind(": "))
    if stop > room * 0.5:
        head = head[:stop + 1]
    return _trim(head, room).rstrip() + more


def listed(items: Iterable[Any], examples: int = 3, unit: str = "files", where: str = "the JSON lists them all",
           limit: int = 240) -> str:
    """A list as a count and a few examples: ``"412 files: a.so, b.so, c.so, ... (the JSON lists them all)"``;
    the whole list when it is short; ``"-"`` when empty."""
    items = [str(i) for i in items]
    if not items:
        return "-"
    whole = ", ".join(items)
    if len(whole) <= limit:
        return whole
    head: list[str] = []
    for i in items[:examples]:
        if len(", ".join(head + [i])) > limit - 60:
            break
        head.append(i)
    shown = ", ".join(head) or short(items[0], limit - 60, "...")
    return f"{len(items)} {unit}: {shown}, ... ({where})"


class Spill:
    """The text cut from a table's cells, kept for headings below the table: one heading per key (a path, a
    component, a row), in the order the keys were first seen, none for a key with nothing to add.

    ``cell(key, text, what)`` gives the cell (``text`` itself, or :func:`short` of it when it is over ``limit``)
    and keeps the full text under ``key``; ``add(key, line)`` puts a line (evidence, a warning) under ``key``
    whatever the cells; ``markdown(title, intro, level)`` gives the section (``[]`` when nothing was kept)."""

    def __init__(self, limit: int = 200):
        self.limit = limit
        self.items: dict[str, list[str]] = {}

    def cell(self, key: str, text: Any, what: str = "", limit: int | None = None) -> str:
        text = " ".join(str(text).split())
        lim = limit or self.limit
        if len(_escape(text)) <= lim:
            return text
        self.add(key, f"{what}: {text}" if what else text)
        return short(text, lim)

    def add(self, key: str, line: str) -> None:
        self.items.setdefault(key, []).append(line)

    def markdown(self, title: str, intro: str, level: int = 2) -> list[str]:
        if not self.items:
            return []
        lines = ["", "#" * level + " " + title, "", intro]
        for key, texts in self.items.items():
            lines += ["", "#" * (level + 1) + " " + key, ""]
            lines += [t if t.startswith(("- ", "  - ")) else f"- {t}" for t in texts]
        return lines + [""]


# --- the checks --------------------------------------------------------------------------------------------
_SPLIT = re.compile(r"(?<!\\)\|")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^#{1,6}\s")


def table_cells(markdown: str) -> Iterable[tuple[int, str]]:
    """``(line number, cell text)`` for every cell of every table row in ``markdown`` (outside fenced code)."""
    fenced = False
    for n, line in enumerate(markdown.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        s = line.strip()
        if fenced or not s.startswith("|"):
            continue
        s = s[1:-1] if s.endswith("|") and not s.endswith("\\|") else s[1:]
        for c in _SPLIT.split(s):
            yield n, c.strip()


def long_cells(markdown: str, limit: int = LIMIT) -> list[tuple[int, int, str]]:
    """``(line number, length, first 80 characters)`` for every table cell longer than ``limit``."""
    return [(n, len(c), c[:80]) for n, c in table_cells(markdown) if len(c) > limit]


def empty_headings(markdown: str) -> list[tuple[int, str]]:
    """``(line number, heading)`` for each heading followed (blank lines aside) by another heading or the end of
    the document: a heading with nothing under it."""
    lines = markdown.splitlines()
    out, fenced = [], False
    heads = []
    for n, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and _HEADING.match(line):
            heads.append(n)
    for n in heads:
        rest = [x for x in lines[n:] if x.strip()]
        if not rest or _HEADING.match(rest[0]):
            out.append((n, lines[n - 1]))
    return out
