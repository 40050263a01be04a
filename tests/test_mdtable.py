"""The one Markdown table writer (stackprobe.mdtable): its escaper keeps a pipe and a line break inside the
cell, and the report writers go through it (a cause with both stays in its row)."""
from __future__ import annotations

from stackprobe import mdtable


def _split(line: str) -> list[str]:
    """A GFM table row's cells: split on the pipes no backslash escapes (what a renderer does)."""
    cells, cur, i = [], "", 0
    body = line.strip()
    assert body.startswith("| ") and body.endswith(" |"), line
    body = body[2:-2]
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            cur += body[i:i + 2]
            i += 2
            continue
        if body.startswith(" | ", i):
            cells.append(cur)
            cur, i = "", i + 3
            continue
        cur += body[i]
        i += 1
    return cells + [cur]


def test_a_pipe_and_a_newline_stay_in_their_cell():
    line = mdtable.row(["a|b", "two\nlines\r\nand\rthree", "plain"])
    assert "\n" not in line and "\r" not in line
    assert _split(line) == ["a\\|b", "two lines and three", "plain"]
    assert mdtable.cell("x | y") == "x \\| y"


def test_a_backslash_before_a_pipe_does_not_unescape_it():
    # `a\|b` as text: the backslash is doubled, then the pipe escaped, so the renderer shows a\|b in one cell
    assert mdtable.cell("a\\|b") == "a\\\\\\|b"
    assert len(_split(mdtable.row(["a\\|b", "c"]))) == 2


def test_an_unescaped_writer_would_split_the_row():
    """The check can fail: a row written without the escaper has one cell too many."""
    raw = "| " + " | ".join(["a | b", "c"]) + " |"
    assert len(_split(raw)) == 3
    assert len(_split(mdtable.row(["a | b", "c"]))) == 2


def test_header_aligns_the_named_columns_right_and_table_writes_every_row():
    assert mdtable.header(["n", "name", "s"], right=(0, 2)) == ["| n | name | s |", "| ---: | --- | ---: |"]
    assert mdtable.table(("k", "v"), [(1, None), ("x|y", "a\nb")]) == [
        "| k | v |", "| --- | --- |", "| 1 | None |", "| x\\|y | a b |"]


def test_the_engine_report_keeps_a_cause_with_a_pipe_and_a_newline_in_its_row():
    from stackprobe.runtime.engine import markdown

    result = {"host": {}, "run": {"status": "ok", "seconds": 1}, "config": {}, "verdicts": [
        {"backend": "sglang-pynccl", "status": "baseline", "gate": None, "cause": "line one | with a pipe\nline two",
         "measurements": {}, "evidence": []}]}
    row = next(ln for ln in markdown(result).splitlines() if ln.startswith("| sglang-pynccl |"))
    assert len(_split(row)) == 7 and _split(row)[-1] == "line one \\| with a pipe line two"
