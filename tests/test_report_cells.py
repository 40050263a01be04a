"""Every Markdown table the project writes keeps short cells (issue 42): at most ``mdtable.LIMIT`` (300) characters
a cell, the full cause and evidence under the path's own heading below the table, no heading with nothing under it.

Rendered from the committed report JSON (real reports of real images), and walked over every committed
``results/**/*.md``; each check has a failing twin on the old behaviour (an uncapped cell, an empty heading)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from stackprobe import mdtable
from stackprobe.report import Report, comparison_markdown

ROOT = Path(__file__).resolve().parents[1]
CU128 = ROOT / "tests" / "data" / "schema3" / "validate" / "cudastack_cu12.8-pip-sm120-runtime_2e50deed90f65a5e.json"
CU131 = ROOT / "tests" / "data" / "schema3" / "validate" / "cudastack_cu13.1-pip-sm120-runtime_7dbd01ad3ef27600.json"
RUNTIME = ROOT / "results" / "2xH200-SM90-NVLink" / "run1" / "runtime.json"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _section(md: str, heading: str) -> str:
    """The text under ``heading`` (a whole line) up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = md.splitlines()
    start = lines.index(heading)
    out = []
    for line in lines[start + 1:]:
        m = re.match(r"^(#{1,6})\s", line)
        if m and len(m.group(1)) <= level:
            break
        out.append(line)
    return "\n".join(out)


def check(md: str) -> list[str]:
    """The problems the committed reports are held to: cells over the limit, headings with nothing under them."""
    return ([f"line {n}: a {length}-character cell ({head!r}...)" for n, length, head in mdtable.long_cells(md)]
            + [f"line {n}: empty heading {h!r}" for n, h in mdtable.empty_headings(md)])


def _render_results():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "scripts" / "render_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_validate_report_has_short_cells_and_the_full_cause_under_its_path():
    r = Report.load(CU128)
    md = r.to_markdown()
    assert check(md) == []
    per_path = md.split("## Per path: cause, evidence and call chains", 1)[1]
    cut = 0
    for b in r.backends():
        v = r.verdict(b)
        if len(v.cause) > 200:   # cut in the matrix: whole under the path's heading
            cut += 1
            assert _flat(v.cause) in _flat(_section(per_path, f"### {b}")), b
    assert cut >= 3   # the cu12.8 report has long causes (fusion, custom allreduce, torch symmetric memory, ...)
    # the 1,038,365-character coverage row: a count and a few examples, the full list in the JSON
    cubin = r.package_coverage("flashinfer-cubin")
    row = next(ln for ln in md.splitlines() if ln.startswith("| flashinfer-cubin |"))
    assert f"{len(cubin['files_without'])} files: " in row and "the JSON lists them all" in row
    assert len(cubin["files_without"]) > 1000
    # every answer's evidence is still there, under its path
    for v in r.verdicts:
        for e in v.evidence:
            assert f"- {e.what}: `" in _section(per_path, f"### {v.backend}"), (v.backend, e.what)


def test_a_report_without_evidence_or_long_cells_has_no_per_path_heading():
    r = Report.load(CU128)
    for v in r.verdicts:
        v.evidence, v.warnings, v.cause, v.lift, v.lift_detail = [], [], "short", "none-needed", ""
    r.dispatch, r.engines = {}, []
    md = r.to_markdown()
    assert "## Per path" not in md and check(md) == []


def test_the_comparison_keeps_short_cells_and_every_why_below():
    a, b = Report.load(CU128), Report.load(CU131)
    md = comparison_markdown([a, b], ["cu12.8", "cu13.1"])
    assert check(md) == []
    from stackprobe.report import compare
    below = md.split("## Per path and row, in full", 1)[1]
    for c in compare([a, b], ["cu12.8", "cu13.1"]):
        parts = c.why.split(" | ")
        for part in parts[1:] + ([parts[0]] if len(parts[0]) > 200 else []):
            assert _flat(part) in _flat(_section(below, f"### {c.backend}")), c.backend


def test_runtime_and_radar_reports_have_short_cells():
    from cudastack.radar import walk
    from stackprobe.runtime import report as runtime_report
    rep = runtime_report.load(RUNTIME)
    md = runtime_report.markdown(rep, "runtime.png")
    assert check(md) == []
    v = next(v for run in rep["runs"] for v in run["verdicts"] if v["backend"] == "nccl-graph-mixing-off")
    pre = v["measurements"]["setting"]["precondition"]
    assert len(pre) > 200 and _flat(pre) in _flat(_section(md, "#### nccl-graph-mixing-off"))
    for d in json.loads((ROOT / "results" / "radar" / "radar.json").read_text()):
        r = walk.from_json(d)
        md = walk.render_markdown(r)
        assert check(md) == [], walk.out_name(r.toolchain, r.runtime)
        for row in r.rows:
            if len(row.holds) > 1:   # every reason, whole, under the component's heading
                under = _flat(_section(md, f"#### {row.name}"))
                assert all(_flat(h) in under for h in row.holds), row.name


def test_the_check_catches_the_old_behaviour():
    # failing twins: an uncapped cell (as the writers printed a cause, an evidence list, a file list) and the old
    # Evidence section's empty headings
    long = "x" * 1200
    assert check("\n".join(mdtable.header(("a", "b")) + [mdtable.row(("k", long), limit=None)]))
    assert mdtable.long_cells("| a | " + "y " * 200 + " |")[0][1] > 300
    old_evidence = "## Evidence\n\n### nccl-ring (static)\n\n### nccl-tree (static)\n- a: `1`\n\n### b12x (static)\n"
    assert [h for _, h in mdtable.empty_headings(old_evidence)] == ["## Evidence", "### nccl-ring (static)",
                                                                      "### b12x (static)"]
    # and the capped writer passes the same check, saying the cell was cut
    capped = mdtable.row(("k", long))
    assert check("\n".join(mdtable.header(("a", "b")) + [capped])) == [] and "[cut: " in capped
    # a pipe or a code span cut in half does not break the row
    odd = mdtable.cell("`" + "a|b " * 200 + "`")
    assert len(odd) <= mdtable.LIMIT and odd.count("`") % 2 == 0 and not odd.split(" ... [cut")[0].endswith("\\")
    # fenced code is not a table
    assert mdtable.long_cells("```\n| " + "z" * 400 + " |\n```\n") == []


def test_render_results_cuts_a_report_it_cannot_render_and_drops_empty_headings(tmp_path):
    rr = _render_results()
    text = ("# r\n\n| a | b |\n| --- | --- |\n| k | " + "w " * 400 + "|\n| short | row |\n\n## Evidence\n\n"
            "### x (static)\n\n### y (static)\n- e: `1`\n")
    assert check(text)
    out = rr.cap_cells(text)
    assert check(out) == [] and "| short | row |" in out and "### y (static)" in out and "### x (static)" not in out
    # and a real report JSON through the script: the same Markdown as the writer, nothing else touched
    (tmp_path / "r.json").write_text(CU131.read_text())
    lines = rr.render_one(f"{tmp_path / 'r.json'}={tmp_path / 'out.md'}")
    assert lines == [f"wrote {tmp_path / 'out.md'}"] and check((tmp_path / "out.md").read_text()) == []
    assert (tmp_path / "r.json").read_text() == CU131.read_text()


COMMITTED = sorted(p for p in (ROOT / "results").rglob("*.md"))


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(ROOT)) for p in COMMITTED])
def test_every_committed_report_has_short_cells_and_names_no_local_path(path):
    md = path.read_text()
    assert mdtable.long_cells(md) == [], "run python scripts/render_results.py (or shorten the hand-written table)"
    assert not re.search(r"(?<![\w.~])/(work|tmp)/", md), "a committed report names a local path"
