"""Markdown tables, the one writer behind every table the project prints (the validate reports, the runtime
report, the comparison, the upgrade radar). GitHub-flavoured Markdown's table extension (GFM spec 0.29,
"Tables (extension)", https://github.github.com/gfm/#tables-extension-): a row is one line of cells between
pipes, the second line says each column's alignment, and a pipe inside a cell is written ``\\|`` (which holds
inside code spans and emphasis too).

Shapes: :func:`cell` takes any value and gives one cell's text; :func:`row` a sequence of values and gives one
line; :func:`header` the column names and gives the two heading lines; :func:`table` all of it as a list of
lines (no trailing blank line). No errors are raised: every value is written through ``str``.
"""
from __future__ import annotations

from typing import Any, Iterable

_BREAKS = ("\r\n", "\n", "\r")


def cell(value: Any) -> str:
    """``value`` as the text of one cell: ``str(value)`` with each ``|`` written ``\\|`` (a backslash already
    before a pipe is doubled first, so the pipe still reads as text) and each line break (CR LF, LF or CR) one
    space, since a row must stay on one line."""
    text = str(value).replace("\\|", "\\\\|").replace("|", "\\|")
    for br in _BREAKS:
        text = text.replace(br, " ")
    return text


def row(cells: Iterable[Any]) -> str:
    """One table line: ``| a | b |`` with every cell escaped by :func:`cell`."""
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def header(names: Iterable[Any], right: Iterable[int] = ()) -> list[str]:
    """The heading line and the delimiter line; the columns whose 0-based index is in ``right`` are
    right-aligned (``---:``, for numbers), the rest left (``---``)."""
    names = list(names)
    right = set(right)
    return [row(names), "| " + " | ".join("---:" if i in right else "---" for i in range(len(names))) + " |"]


def table(names: Iterable[Any], rows: Iterable[Iterable[Any]], right: Iterable[int] = ()) -> list[str]:
    """:func:`header` then one :func:`row` per item of ``rows``."""
    return header(names, right) + [row(r) for r in rows]
