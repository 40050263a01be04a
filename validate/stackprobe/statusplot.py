"""The comparison drawn: one row per path (backend), one column per image, each cell coloured by what the summary
block says a user should do with that path (stdlib; matplotlib only for :func:`plot`, optional).

The class of a cell comes from the same functions the summary block (:mod:`stackprobe.summary`) and the headline
use (:func:`stackprobe.userwords.headline`, whose per-answer phrase is ``userwords._phrase``), so the picture and the
text never disagree:

* ``serves now``: the path a decode-step allreduce takes with the flags asked about (the headline's ``serves``;
  NCCL's ring when nothing else serves);
* ``fix the host first``, ``try and measure``, ``do not set``, ``accepted, no gain`` (falls back if set, or
  preempted), ``engine admits, library blocked``, ``not assessed``: the summary's keys for an engine answer;
* ``broken here``: the library answer's gate is ``broken-install`` (the summary's "broken here");
* where the summary block says nothing of a path, its status in the suite's words: ``not integrated``,
  ``not installed``, ``blocked``, ``on, not serving``, ``serves other widths`` (a fallback that serves other decode
  widths, :func:`stackprobe.userwords._width_servers`), and for a report with no serving engine installed (the
  summary then says "nothing below says what a server would do") the library answer: ``library admits`` (every
  gate admits the target; the runtime tier must still measure), ``blocked``, ``not installed``, ``not assessed``
  (skipped for another reason, e.g. needs GPUs, or an error);
* ``absent`` where the report has no row for the path, and ``unknown`` for a status this module does not know: it
  is drawn in its own colour, never as a pass.

The figure shows the static answers the summary block reads; runtime measurements stay in the Markdown table.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from .verdict import (BLOCKED, ERROR, FALLS_BACK, GATE_BROKEN_INSTALL, GATE_NOT_INSTALLED, GATE_PASSES,
                      NOT_ASSESSED, NOT_INSTALLED, NOT_INTEGRATED, ON_AS_CONFIGURED, ON_BY_DEFAULT, SKIPPED)

#: class -> fill colour (RGB hex); the order is the legend's. Green for a path that serves or is worth trying, red
#: for what must not be set or is broken, amber for what needs care; greys, darker to lighter, for a path a gate closes,
#: one the engine does not reference, one whose package is missing; blue for not assessed, purple for unknown.
COLOURS: dict[str, str] = {
    "serves now": "#1a9850",
    "try and measure": "#91cf60",
    "library admits": "#d9ef8b",
    "on, not serving": "#a6d96a",
    "serves other widths": "#66bd63",
    "fix the host first": "#fdae61",
    "accepted, no gain": "#fee08b",
    "engine admits, library blocked": "#f4a582",
    "do not set": "#d73027",
    "broken here": "#7f0000",
    "blocked": "#878787",
    "not integrated": "#bababa",
    "not installed": "#e0e0e0",
    "not assessed": "#9ecae1",
    "absent": "#ffffff",
    "unknown": "#7b3294",
}
#: classes whose fill is dark enough for white text
DARK = frozenset({"serves now", "do not set", "broken here", "blocked", "unknown"})

#: the summary block's keys (userwords.headline / _phrase) -> the class drawn
_PHRASE_CLASS = {"serves": "serves now", "fix_host_first": "fix the host first", "opt_in": "try and measure",
                 "do_not_set": "do not set", "falls_back": "accepted, no gain", "preempted": "accepted, no gain",
                 "library_blocked": "engine admits, library blocked", "not_assessed": "not assessed",
                 "on": "serves now",   # "on": a path of another collective (all-to-all) that is on: it serves that
                 "avoid": "do not set"}  # "avoid": set, it takes decode widths from the path that serves


@dataclass(frozen=True)
class Cell:
    """One path in one image: ``cls`` (a key of :data:`COLOURS`), ``status`` (the deciding answer's status with its
    gate kind where it matters, :func:`stackprobe.userwords.status_word`; ``-`` when absent) and ``scope`` ("engine" or "library": which answer decided the class)."""

    cls: str
    status: str
    scope: str

    @property
    def colour(self) -> str:
        """The fill: ``COLOURS[cls]``, the ``unknown`` colour for a class not in :data:`COLOURS`."""
        return COLOURS.get(self.cls, COLOURS["unknown"])


@dataclass(frozen=True)
class Grid:
    """What the figure draws: ``rows`` (backends, in the order :func:`stackprobe.report.compare` lists them, each with
    its collective when it is not the decode allreduce), ``labels`` (one per report, older toolchain first as the
    callers pass them) and ``cells[row][column]``."""

    rows: list[str]
    labels: list[str]
    cells: list[list[Cell]]
    notes: list[str]        # per column: the flags asked about (when any), the path that serves when it has no row
    #                         of its own (nccl-symm-mem), that it reads library answers where no engine is installed

    def classes(self) -> list[str]:
        """The classes present, in legend order (unknown classes last)."""
        seen = {c.cls for row in self.cells for c in row}
        return [k for k in COLOURS if k in seen] + sorted(seen - set(COLOURS))


def _serving(h: dict) -> list[str]:
    """The paths the headline's ``serves`` names: the dispatch walk's answer (``nccl-symm-mem``, a path of its own),
    a comma list of paths that are on, or the phrase ``NCCL (pynccl): no other path ...`` (then nccl-ring, the
    baseline, is the one that serves)."""
    from .userwords import NCCL

    serves = str(h.get("serves") or "")
    if serves.startswith(NCCL):
        return ["nccl-ring"]
    return [s.split(" (")[0].strip() for s in serves.split(", ") if s.strip()]


def _library_class(lib) -> str:
    if lib.status == GATE_PASSES:
        return "library admits"
    if lib.status == BLOCKED:
        return "blocked"
    if lib.status == NOT_INSTALLED or (lib.status == SKIPPED and lib.gate == GATE_NOT_INSTALLED):
        return "not installed"
    if lib.status in (SKIPPED, ERROR, NOT_ASSESSED):
        return "not assessed"
    return "unknown"


def classify(report, backend: str) -> Cell:
    """The class of ``backend`` in ``report`` (a :class:`stackprobe.report.Report`), from the summary block's own
    functions (see the module docstring). Never raises for a status it does not know: that is ``unknown``."""
    from .userwords import _phrase, collective, headline, status_word

    a = report.answers(backend)
    lib, eng = a["library"], a["engine"]
    if lib is None and eng is None:
        v = report.verdict(backend)
        return Cell("absent", "-", "") if v is None else Cell("unknown", status_word(v), v.scope or "library")
    if lib is not None and lib.gate == GATE_BROKEN_INSTALL:
        return Cell("broken here", status_word(lib), "library")
    h = headline(report)
    if h["engine"] and eng is not None:
        phrase = _phrase(report, eng)
        if phrase is not None:
            return Cell(_PHRASE_CLASS.get(phrase[0], "unknown"), status_word(eng), "engine")
        if eng.status in (ON_BY_DEFAULT, ON_AS_CONFIGURED):
            return Cell("serves now" if backend in _serving(h) else "on, not serving", status_word(eng), "engine")
        if eng.status == FALLS_BACK:
            return Cell("serves other widths", status_word(eng), "engine")
        known = {NOT_INTEGRATED: "not integrated", NOT_INSTALLED: "not installed", BLOCKED: "blocked"}
        if eng.status == SKIPPED:
            return Cell("not installed" if eng.gate == GATE_NOT_INSTALLED else "not assessed", status_word(eng), "engine")
        return Cell(known.get(eng.status, "unknown"), status_word(eng), "engine")
    if lib is None:       # an engine answer only, in a report with no engine installed
        return Cell("not installed" if eng.status in (NOT_INSTALLED, SKIPPED) else "unknown", status_word(eng), "engine")
    if h["engine"] and backend in _serving(h) and lib.status == GATE_PASSES and collective(backend, lib) == "allreduce":
        return Cell("serves now", status_word(lib), "library")
    return Cell(_library_class(lib), status_word(lib), "library")


def grid(reports: list, labels: list[str] | None = None) -> Grid:
    """The grid of ``reports`` (Reports, older toolchain first) under ``labels`` (default: each report's label).
    Rows are every backend any report has, in :func:`stackprobe.report.compare`'s order. Raises ValueError when
    ``labels`` and ``reports`` differ in length or there is no report."""
    if not reports:
        raise ValueError("statusplot.grid: no report to draw; pass one Report per image.")
    labels = list(labels or [r.label or f"#{i + 1}" for i, r in enumerate(reports)])
    if len(labels) != len(reports):
        raise ValueError(f"statusplot.grid: {len(reports)} reports but {len(labels)} labels; give one label each.")
    from .userwords import collective, headline

    backends: list[str] = []
    for r in reports:
        backends += [b for b in r.backends() if b not in backends]
    rows, cells = [], []
    for b in backends:
        kind = collective(b, next((v for r in reports if (v := r.verdict(b)) is not None), None))
        rows.append(b if kind == "allreduce" else f"{b} ({kind.split(' (')[0]})")
        cells.append([classify(r, b) for r in reports])
    notes = []
    for r in reports:
        h = headline(r)
        own_row = any(b in backends for b in _serving(h))
        notes.append("; ".join(x for x in ("" if h["config"] == "no flags" else f"with {h['config']}",
                                           "" if own_row or not h["engine"] else f"serves now: {_serving(h)[0]}",
                                           "" if h["engine"] else "no serving engine here: library answers") if x))
    return Grid(rows, labels, cells, notes)


# --- drawing -----------------------------------------------------------------------------------------
DPI = 100
CELL_W, CELL_H = 2.3, 0.52          # inches per cell
LEFT, TOP, RIGHT = 3.1, 1.45, 0.2   # margins (inches): row labels, column labels
LEGEND_COLS, LEGEND_ROW_H = 3, 0.24


def layout(g: Grid) -> dict:
    """The figure's geometry in inches: ``{"width", "height", "left", "top", "bottom"}``; fixed by the grid's shape
    (rows, columns, legend entries), never by its text, so the same reports give the same image."""
    n_leg = len(g.classes())
    bottom = 0.35 + LEGEND_ROW_H * -(-n_leg // LEGEND_COLS)
    width = max(LEFT + CELL_W * len(g.labels) + RIGHT, 2.4 * LEGEND_COLS)
    return {"width": width, "height": TOP + CELL_H * len(g.rows) + bottom, "left": LEFT, "top": TOP,
            "bottom": bottom}


def cell_pixel(g: Grid, row: int, col: int, at: tuple[float, float] = (0.5, 0.5)) -> tuple[int, int]:
    """The pixel (x, y from the top) of point ``at`` (fractions of the cell, from its top-left corner) of cell
    (``row``, ``col``) in the PNG :func:`plot` writes."""
    lay = layout(g)
    return (round((lay["left"] + (col + at[0]) * CELL_W) * DPI), round((lay["top"] + (row + at[1]) * CELL_H) * DPI))


def _wrap_label(label: str, width: int = 24) -> str:
    parts = label.replace("/", "/\u200b").replace(":", ":\u200b").split("\u200b")
    lines, cur = [], ""
    for p in parts:
        if cur and len(cur) + len(p) > width:
            lines.append(cur)
            cur = ""
        cur += p
    lines.append(cur)
    return "\n".join(x for line in lines for x in textwrap.wrap(line, width + 8) or [""])


def plot(g: Grid, path: str | Path, title: str = "") -> bool:
    """Draw ``g`` as a PNG at ``path`` (written atomically): a coloured cell per path and image with its class and,
    below it, the answer's own status; a legend of the classes present. Deterministic: fixed geometry
    (:func:`layout`), no timestamp or software name in the PNG's metadata. Returns False (and writes nothing) when
    matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        return False
    from .atomic import atomic_path

    path = Path(path)
    lay = layout(g)
    W, H = lay["width"], lay["height"]
    nr, nc = len(g.rows), len(g.labels)
    fig = plt.figure(figsize=(W, H), dpi=DPI)
    try:
        ax = fig.add_axes((lay["left"] / W, lay["bottom"] / H, CELL_W * nc / W, CELL_H * nr / H))
        ax.set_xlim(0, nc)
        ax.set_ylim(nr, 0)
        ax.set_axis_off()
        for i, row in enumerate(g.cells):
            for j, c in enumerate(row):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=c.colour, edgecolor="white", linewidth=2))
                ink = "white" if c.cls in DARK or c.cls not in COLOURS else "black"
                word = c.cls if c.cls in COLOURS else f"unknown: {c.cls}"
                ax.text(j + 0.5, i + 0.42, word, ha="center", va="center", fontsize=8 if len(word) <= 24 else 6.5,
                        color=ink, fontweight="bold")
                if c.status != "-":
                    ax.text(j + 0.5, i + 0.75, f"{c.scope} {c.status}".strip(), ha="center", va="center",
                            fontsize=6, color=ink)
        for i, name in enumerate(g.rows):
            ax.text(-0.04, i + 0.5, "\n".join(textwrap.wrap(name, 34)), ha="right", va="center", fontsize=8)
        for j, (label, note) in enumerate(zip(g.labels, g.notes)):
            note = "\n".join(textwrap.wrap(f"({note})", 30, break_long_words=False)) if note else ""
            ax.text(j + 0.5, -0.08, _wrap_label(label) + ("\n" + note if note else ""), ha="center", va="bottom",
                    fontsize=7)
        if title:
            fig.text(0.01, 1 - 0.12 / H, title, ha="left", va="top", fontsize=9, fontweight="bold")
        handles = [Patch(facecolor=COLOURS.get(k, COLOURS["unknown"]), edgecolor="grey", label=k)
                   for k in g.classes()]
        fig.legend(handles=handles, loc="lower center", ncol=LEGEND_COLS, fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, 0.02))
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=DPI, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return True


def draw(reports: list, labels: list[str], path: str | Path, title: str = "") -> bool:
    """:func:`grid` then :func:`plot`: the comparison of ``reports`` under ``labels`` as a PNG at ``path``; False
    without matplotlib (the caller's Markdown then says so, see :func:`stackprobe.report.comparison_markdown`)."""
    return plot(grid(reports, labels), path, title)


TITLE = "Each path per image, classed as the summary block does (static answers; why: the table below)"
ALT = "paths x images, each cell coloured by what the summary block says of that path"


def figure_markdown(name: str | None) -> str:
    """The Markdown that places the figure at the top of a comparison: ``![ALT](name)`` and a blank line, or, when
    ``name`` is None (matplotlib was missing), ``(no plot: matplotlib is not installed)``, as the runtime report
    says it (:func:`stackprobe.runtime.report.markdown`)."""
    return (f"![{ALT}]({name})" if name else "(no plot: matplotlib is not installed)") + "\n\n"


def write_beside(reports: list, labels: list[str], markdown_path: str | Path) -> str:
    """Draw the comparison of ``reports`` as the PNG beside ``markdown_path`` (same name, ``.png``) and return the
    Markdown to open the comparison with (:func:`figure_markdown`): the image's name, or the no-plot note when
    matplotlib is not installed (then no PNG is written)."""
    png = Path(markdown_path).with_suffix(".png")
    return figure_markdown(png.name if draw(reports, labels, png, TITLE) else None)
