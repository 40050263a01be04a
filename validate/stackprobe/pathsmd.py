"""Markdown for two engine sections of a report that had only JSON (stdlib only): the paths the installed engine ships
that this suite does not judge (``Report.paths``, from :func:`stackprobe.engines.sglang.paths.paths`), and the answer
per decode width (``Report.dispatch["per_width"]``, from :func:`stackprobe.engines.vllm.engine.per_width`).

Both are lists a reader must see beside the verdicts: a path that is not assessed is not a path that is fine, and
one row count is not the answer when the path changes with the decode width."""
from __future__ import annotations

from . import mdtable


def not_assessed_markdown(report, spill: mdtable.Spill | None = None) -> list[str]:
    """``## Not assessed here (N)`` and one table row per not-assessed path (path, why, where the engine ships it);
    [] when the report has none. A long why goes to ``spill`` under the path's name (a section of its own after the
    table when none is given)."""
    own = spill is None
    spill = spill if spill is not None else mdtable.Spill()
    rows = []
    for p in getattr(report, "paths", None) or []:
        name = p.get("backend", "?")
        where = next((e.get("source") for e in p.get("evidence") or [] if e.get("what") == "shipped by"), "")
        rows.append((name, spill.cell(name, p.get("cause") or "not judged by this suite", "why not assessed"),
                     spill.cell(name, where or "-", "where")))
    if not rows:
        return []
    return ["", f"## Not assessed here ({len(rows)})", "",
            "Paths and settings the installed engine ships that this suite does not judge: nothing below says they work "
            "or fail on the target.", "", *mdtable.table(("path or setting", "why not assessed", "where"), rows),
            *(spill.markdown("Not assessed here, in full", "The why of each path above, whole.") if own else [])]


def per_width_markdown(dispatch: dict) -> list[str]:
    """``### Per decode width`` with the row ranges and which path serves each, from the dispatch's ``per_width``;
    a line saying it was not assessed when the widths could not be read; [] when the dispatch has no such section."""
    pw = (dispatch or {}).get("per_width")
    if not pw:
        return []
    if pw.get("error"):
        return ["", f"Per decode width: {pw['error']}"]
    rows = [(g["rows"], g["serves"], mdtable.listed(g.get("captured") or [], 12, "widths"))
            for g in pw.get("ranges") or []]
    return ["", f"### Per decode width (hidden {pw.get('hidden')}, {pw.get('dtype')}, {pw.get('tokens')} tokens per "
            f"verify step)", "", f"Widths vLLM captures: {pw.get('source')}.", "",
            *mdtable.table(("rows", "serves", "captured widths in that range"), rows)]
