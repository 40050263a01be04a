"""The comparison drawn (stackprobe.statusplot): paths x images, each cell coloured by the class the summary block
gives the path; read from the committed reports (no network, no Docker, no GPU), each check with a twin that fails."""
from __future__ import annotations

import builtins
import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackprobe import statusplot as S
from stackprobe.report import Report
from stackprobe.summary import block

from cudastack.jobs import validate as V

ROOT = Path(__file__).resolve().parents[1]
VALIDATE = ROOT / "results" / "validate"
REPORTS = {p.name.split("_")[1].split("-")[0]: p for p in VALIDATE.glob("*.json")}


def _pair() -> tuple[list[Report], list[str]]:
    return [Report.load(REPORTS["cu12.8"]), Report.load(REPORTS["cu13.1"])], ["cu12.8", "cu13.1"]


def _row(g: S.Grid, backend: str) -> list[S.Cell]:
    return g.cells[next(i for i, name in enumerate(g.rows) if name.split(" (")[0] == backend)]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _pixel(png: Path, g: S.Grid, backend: str, col: int) -> tuple[int, int, int]:
    """The colour drawn near the top-left corner of a cell (clear of its text), read back from the PNG."""
    import matplotlib.image as mpimg
    img = mpimg.imread(png)
    row = next(i for i, name in enumerate(g.rows) if name.split(" (")[0] == backend)
    x, y = S.cell_pixel(g, row, col, at=(0.08, 0.15))
    return tuple(round(float(c) * 255) for c in img[y, x, :3])


def _no_matplotlib(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", fake)


# --- the classes --------------------------------------------------------------------------------------
def test_the_committed_upgrade_moves_five_paths_between_classes():
    g = S.grid(*_pair())
    moved = {name.split(" (")[0]: (a.cls, b.cls) for name, (a, b) in zip(g.rows, g.cells) if a.cls != b.cls}
    assert moved == {
        "flashinfer-allreduce-fusion": ("accepted, no gain", "do not set"),
        "torch-symm-mem": ("do not set", "accepted, no gain"),
        "ep-flashinfer-a2a": ("engine admits, library blocked", "try and measure"),
        "flashinfer-pcie-ipc-allreduce": ("not integrated", "try and measure"),
        "mscclpp": ("try and measure", "not installed"),
    }, moved
    assert [c.cls for c in _row(g, "nccl-ring")] == ["serves now", "serves now"]
    assert [c.cls for c in _row(g, "sglang-custom-allreduce")] == ["blocked", "blocked"]
    for backend in moved:
        a, b = _row(g, backend)
        assert a.colour != b.colour, backend


def test_every_class_agrees_with_the_summary_block_of_every_committed_comparison():
    """What the figure calls "do not set", "try and measure", ... is what the summary block of the same report says
    under that key (the same userwords functions decide both)."""
    keys = {"do not set": ("do not set",), "try and measure": ("try and measure:", "opt-in, worth measuring"),
            "accepted, no gain": ("accepted, no gain:", "falls back if set", "preempted"),
            "fix the host first": ("fix the host first",),
            "engine admits, library blocked": ("engine admits, library", "not worth measuring here")}
    checked = 0
    for folder in ("validate", "validate-pcie-ipc", "validate-pcie-ipc-symm-mem"):
        reports = [Report.load(p) for p in sorted((ROOT / "results" / folder).glob("*.json"))]
        g = S.grid(reports, [f"#{i}" for i in range(len(reports))])
        for j, r in enumerate(reports):
            text = "\n".join(block(r))
            for name, row in zip(g.rows, g.cells):
                c, backend = row[j], name.split(" (")[0]
                lines = [ln for ln in text.splitlines() if backend in ln]
                if c.cls in keys:
                    assert any(k in ln for k in keys[c.cls] for ln in lines), (folder, backend, c, lines)
                    checked += 1
                elif c.cls == "serves now" and backend != "nccl-ring":
                    assert any(ln.startswith("serves now:") for ln in lines), (folder, backend, c)
                    checked += 1
    assert checked >= 20, checked


def test_a_p2p_risk_reads_fix_the_host_first_never_serves_now():
    r = Report.load(ROOT / "results" / "host" / "p2p-off.json")
    c = S.classify(r, "flashinfer-pcie-ipc-allreduce")
    assert c.cls == "fix the host first" and c.status == "on-as-configured", c
    twin = copy.deepcopy(r)            # the same answer without the risk: it serves
    for v in twin.verdicts:
        if v.backend == "flashinfer-pcie-ipc-allreduce" and v.scope == "engine":
            v.host_risk = {}
    assert S.classify(twin, "flashinfer-pcie-ipc-allreduce").cls == "serves now"


def test_an_unknown_status_is_drawn_as_unknown_never_as_a_pass():
    reports, labels = _pair()
    twin = copy.deepcopy(reports[1])
    for v in twin.verdicts:
        if v.backend == "nccl-ring" and v.scope == "library":
            v.status = "frobnicated"
    c = S.classify(twin, "nccl-ring")
    assert c.cls == "unknown" and c.colour == S.COLOURS["unknown"], c
    assert c.colour not in {S.COLOURS[k] for k in ("serves now", "try and measure", "library admits")}
    assert S.Cell("a class nobody defined", "x", "engine").colour == S.COLOURS["unknown"]
    assert S.classify(reports[1], "nccl-ring").cls == "serves now"          # the untouched report


def test_a_broken_install_reads_broken_here_and_no_engine_reads_library_answers():
    reports, _ = _pair()
    twin = copy.deepcopy(reports[1])
    for v in twin.verdicts:
        if v.backend == "flashinfer-pcie-ipc-allreduce" and v.scope == "library":
            v.status, v.gate = "blocked", "broken-install"
    assert S.classify(twin, "flashinfer-pcie-ipc-allreduce").cls == "broken here"
    assert S.classify(reports[1], "flashinfer-pcie-ipc-allreduce").cls == "try and measure"
    bare = copy.deepcopy(reports[1])
    bare.environment = dict(bare.environment, packages={})
    bare.engines = [{"name": "sglang", "title": "SGLang", "version": None}]
    g = S.grid([reports[1], bare], ["with sglang", "without"])
    assert g.notes == ["", "no serving engine here: library answers"], g.notes
    ring, ipc = _row(g, "nccl-ring"), _row(g, "flashinfer-pcie-ipc-allreduce")
    assert [c.cls for c in ring] == ["serves now", "library admits"]
    assert [(c.cls, c.scope) for c in ipc] == [("try and measure", "engine"), ("library admits", "library")]


def test_bad_input_is_refused_before_drawing():
    reports, _ = _pair()
    with pytest.raises(ValueError, match="2 reports but 1 labels"):
        S.grid(reports, ["only one"])
    with pytest.raises(ValueError, match="no report"):
        S.grid([], [])


# --- the picture --------------------------------------------------------------------------------------
def test_the_png_shows_the_class_colours_and_is_reproducible(tmp_path):
    pytest.importorskip("matplotlib")
    reports, labels = _pair()
    g = S.grid(reports, labels)
    png = tmp_path / "a.png"
    assert S.plot(g, png, S.TITLE)
    for backend in ("torch-symm-mem", "mscclpp", "nccl-ring"):
        for col, cell in enumerate(_row(g, backend)):
            assert _pixel(png, g, backend, col) == _rgb(cell.colour), (backend, col, cell)
    assert _pixel(png, g, "torch-symm-mem", 0) != _pixel(png, g, "torch-symm-mem", 1)
    again = tmp_path / "b.png"
    S.plot(S.grid(reports, labels), again, S.TITLE)
    data = png.read_bytes()
    assert data == again.read_bytes()
    assert b"matplotlib" not in data and len(data) < 150_000, len(data)
    # the twin: an unknown status in the same cell reads back purple, not the green it was
    twin = copy.deepcopy(reports[1])
    for v in twin.verdicts:
        if v.backend == "nccl-ring" and v.scope == "library":
            v.status = "frobnicated"
    g2 = S.grid([reports[0], twin], labels)
    S.plot(g2, tmp_path / "c.png")
    assert _pixel(tmp_path / "c.png", g2, "nccl-ring", 1) == _rgb(S.COLOURS["unknown"])


def test_without_matplotlib_no_png_and_the_markdown_says_so(tmp_path, monkeypatch):
    reports, labels = _pair()
    _no_matplotlib(monkeypatch)
    md = tmp_path / "comparison.md"
    assert S.plot(S.grid(reports, labels), tmp_path / "x.png") is False
    assert S.write_beside(reports, labels, md) == "(no plot: matplotlib is not installed)\n\n"
    assert list(tmp_path.iterdir()) == []


def test_write_beside_names_the_png_it_wrote(tmp_path):
    pytest.importorskip("matplotlib")
    reports, labels = _pair()
    head = S.write_beside(reports, labels, tmp_path / "comparison-cu12.8-vs-cu13.1.md")
    assert head == f"![{S.ALT}](comparison-cu12.8-vs-cu13.1.png)\n\n"
    assert (tmp_path / "comparison-cu12.8-vs-cu13.1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- where comparisons are written ----------------------------------------------------------------------
def test_invoke_validate_writes_the_png_beside_the_comparison(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    by_image = {"img-13.1": Report.load(REPORTS["cu13.1"]), "img-12.8": Report.load(REPORTS["cu12.8"])}
    monkeypatch.setattr(V, "validate_image", lambda img, *a, **kw: by_image[img])   # no Docker here
    md = tmp_path / "cmp.md"
    V.validate(image=["img-13.1", "img-12.8"], out=None, markdown=str(md))
    text = md.read_text()
    assert text.startswith(f"![{S.ALT}](cmp.png)\n\n") and "| backend | img-12.8 | img-13.1 |" in text
    assert (tmp_path / "cmp.png").stat().st_size > 1000
    _, plain = V.validate_many(["img-13.1", "img-12.8"], say=lambda s: None)    # no file asked for: no figure
    assert "![" not in plain and not (tmp_path / "x.png").exists()


def test_invoke_validate_without_matplotlib_says_no_plot(tmp_path, monkeypatch):
    by_image = {"img-13.1": Report.load(REPORTS["cu13.1"]), "img-12.8": Report.load(REPORTS["cu12.8"])}
    monkeypatch.setattr(V, "validate_image", lambda img, *a, **kw: by_image[img])
    _no_matplotlib(monkeypatch)
    md = tmp_path / "cmp.md"
    V.validate(image=["img-13.1", "img-12.8"], out=None, markdown=str(md))
    assert md.read_text().startswith("(no plot: matplotlib is not installed)")
    assert not (tmp_path / "cmp.png").exists()


def test_render_results_writes_the_figure_for_the_committed_reports(tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "validate"
    folder.mkdir()
    for p in REPORTS.values():
        shutil.copy(p, folder / p.name)
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "render_results.py"), str(folder)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    png = folder / "comparison-cu12.8-vs-cu13.1.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "comparison-cu12.8-vs-cu13.1.md").read_text().startswith(f"![{S.ALT}]({png.name})")



@pytest.mark.parametrize("folder", ["validate", "validate-pcie-ipc", "validate-pcie-ipc-symm-mem"])
def test_the_committed_figures_show_the_committed_reports(folder):
    """Each committed comparison opens with its figure, and every cell of the committed PNG has the colour of the
    class its reports give now (a figure left stale after a verdict changed fails here: re-run render_results.py)."""
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg
    from cudastack.jobs.validate import older_to_newer
    d = ROOT / "results" / folder
    (md,) = d.glob("comparison-*.md")
    png = md.with_suffix(".png")
    assert md.read_text().startswith(f"![{S.ALT}]({png.name})"), md
    assert png.stat().st_size < 150_000, png.stat().st_size
    paths = sorted(d.glob("*.json"))
    reports, labels = older_to_newer([Report.load(p) for p in paths], [p.stem for p in paths])
    g = S.grid(reports, labels)
    lay = S.layout(g)
    assert mpimg.imread(png).shape[:2] == (round(lay["height"] * S.DPI), round(lay["width"] * S.DPI))
    for i, row in enumerate(g.cells):
        for j, cell in enumerate(row):
            assert _pixel(png, g, g.rows[i].split(" (")[0], j) == _rgb(cell.colour), (folder, g.rows[i], j, cell)
