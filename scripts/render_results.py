"""Render the committed results' Markdown again from their JSON (after a change to how reports are written). The JSON
files are read, never rewritten; plots are not redrawn (a runtime report links the ``.png`` beside it when there is one).

Arguments, any number, each one of:

* a folder of validate reports: each ``<image>.json`` gives ``<image>.md`` (``Report.to_markdown``); two or more give
  ``comparison-<older>-vs-<newer>.md`` (``comparison_markdown``, older toolchain first, as ``invoke validate``
  writes it);
* ``REPORT.md``: a committed report with no JSON this script renders: its cells are cut in place (below);
* ``REPORT.json`` or ``REPORT.json=OUT.md``: one report alone, whichever kind it is: a validate report
  (``Report.to_markdown``), a runtime report (``stackprobe.runtime.report.markdown``), an engine run
  (``stackprobe.runtime.engine.markdown``) or the radar's ``radar.json`` (``cudastack.radar.walk.render_markdown``,
  one ``cu<toolchain>[-<runtime>].md`` per radar beside it); ``OUT.md`` defaults to the JSON's name with ``.md``.

A JSON this suite cannot read any more (a schema-2 report whose engine answers cannot be translated without guessing,
a runtime report from before a field it needs) is not re-rendered: its committed Markdown is kept, with every table
cell over :data:`stackprobe.mdtable.LIMIT` characters cut where it stands and marked so (the JSON keeps the whole
text); the script says which files it treated so.

Usage: ``python scripts/render_results.py results/validate results/host/p2p-off.json ...``; with no argument it
renders every committed report (:data:`ALL`).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from cudastack.jobs.validate import older_to_newer
from stackprobe import mdtable
from stackprobe.atomic import write_atomic
from stackprobe.report import Report, comparison_markdown
from stackprobe.statusplot import write_beside

ROOT = Path(__file__).resolve().parents[1]

#: every committed report this script renders, as arguments (folders of validate reports, single JSON files)
ALL = ["results/validate", "results/validate-pcie-ipc", "results/validate-pcie-ipc-symm-mem",
       "results/validate-vllm/vllm-0.33.0.json", "results/validate-vllm/vllm-0.33.0-pcie-ipc.json",
       "results/validate-vllm-13.1/cudastack_cu13.1-pip-sm120-vllm_6c86af6f05889b1c.json=results/validate-vllm-13.1/report.md",
       "results/validate-vllm-13.1/pcie-ipc/cudastack_cu13.1-pip-sm120-vllm_6c86af6f05889b1c.json"
       "=results/validate-vllm-13.1/pcie-ipc/report.md",
       "results/validate-aot-13.1/cudastack_cu13.1-pip-sm120-runtime_f6a405f2ef1fb0da.json=results/validate-aot-13.1/report.md",
       "results/host/p2p-off.json", "results/host/acs-redirect.json", "results/host/iommu-translated.json",
       "results/2xH200-SM90-NVLink/sglang-engine/engine.json",
       "results/2xH200-SM90-NVLink/sglang-engine/target-12.0-pcie-ws8-with-h200-engine.json",
       *(f"results/2xH200-SM90-NVLink/run{i}/runtime.json" for i in range(1, 6)),
       "results/2xH200-SM90-NVLink/stale-under-capture/runtime.json",
       "results/2xH200-SM90-NVLink/with-flashinfer/runtime.json", "results/4xH200-SM90-NVLink/runtime.json",
       "results/4xH200-SM90-NVLink/with-flashinfer/runtime.json", "results/radar/radar.json",
       # no JSON this script renders: a schema-1 report kept as Markdown only, and the resolver benchmark's tables
       # (benchmarks/resolver_compare.py writes them from a network run)
       "results/2xH200-SM90-NVLink/integrated-static-and-runtime.md", "results/resolver/resolver_compare.md"]


def render(folder: Path) -> list[Path]:
    """Write the folder's Markdown; returns the files written. Raises FileNotFoundError for a folder with no
    ``*.json`` report."""
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"{folder}: no *.json report to render")
    reports = [Report.from_json(json.loads(p.read_text()), name=str(p)) for p in paths]
    labels = [r.label or p.stem for r, p in zip(reports, paths)]
    out = []
    for r, p in zip(reports, paths):
        write_atomic(p.with_suffix(".md"), r.to_markdown())
        out.append(p.with_suffix(".md"))
    if len(reports) > 1:
        reports, labels = older_to_newer(reports, labels)
        cu = [m.group(0) for lab in labels for m in [re.search(r"cu\d+\.\d+", lab)] if m]
        name = f"comparison-{cu[0]}-vs-{cu[-1]}.md" if len(cu) == len(labels) else "comparison.md"
        head = write_beside(reports, labels, folder / name)     # comparison-....png beside it (matplotlib)
        write_atomic(folder / name, head + comparison_markdown(reports, labels))
        out.append(folder / name)
    return out


def markdown_of(src: Path) -> dict[Path, str]:
    """``{Markdown path: text}`` for one JSON file of any kind this script knows. Raises ValueError (ReportError
    included) or KeyError for a JSON this suite cannot render."""
    d = json.loads(src.read_text())
    if isinstance(d, list):   # radar.json: one radar per toolchain and runtime
        from cudastack.radar import walk
        return {src.parent / walk.out_name(r.toolchain, r.runtime): walk.render_markdown(r)
                for r in map(walk.from_json, d)}
    if d.get("tier") == "runtime":
        from stackprobe.runtime import report as runtime_report
        png = src.with_suffix(".png")
        return {src.with_suffix(".md"): runtime_report.markdown(d, png.name if png.exists() else "")}
    if "schema" not in d and {"host", "run", "verdicts"} <= set(d):
        from stackprobe.runtime.engine import markdown as engine_markdown
        return {src.with_suffix(".md"): engine_markdown(d)}
    return {src.with_suffix(".md"): Report.from_json(d, name=str(src)).to_markdown()}


def cap_cells(text: str) -> str:
    """``text`` with every table row's cells re-cut to :data:`stackprobe.mdtable.LIMIT` (rows already short are left
    byte for byte) and the headings with nothing under them dropped (an ``## Evidence`` whose answers have headings
    gets a line saying so): for a committed report whose JSON this suite can no longer render."""
    out = []
    for line in text.split("\n"):
        cells = [c for _, c in mdtable.table_cells(line)]
        if cells and any(len(c) > mdtable.LIMIT for c in cells):
            line = "| " + " | ".join(c if len(c) <= mdtable.LIMIT else _cut(c) for c in cells) + " |"
        out.append(line)
    while True:
        empty = mdtable.empty_headings("\n".join(out))
        drop = []
        for n, head in empty:
            nxt = next((x for x in out[n:] if x.strip()), "")
            if nxt.startswith("#") and len(nxt) - len(nxt.lstrip("#")) > len(head) - len(head.lstrip("#")):
                out[n:n] = ["", "One heading per answer with evidence; an answer that read none has no heading."]
                break
            drop.append(n - 1)
        else:
            if not drop:
                return "\n".join(out)
        for i in reversed(drop):
            del out[i]
            while i < len(out) and i > 0 and not out[i].strip() and not out[i - 1].strip():
                del out[i]


def _cut(escaped: str) -> str:
    note = mdtable.CUT_NOTE.format(n=len(escaped))
    kept = mdtable._trim(escaped, mdtable.LIMIT - len(note))
    return kept + mdtable.CUT_NOTE.format(n=len(escaped) - len(kept))


def render_one(arg: str) -> list[str]:
    """Render one argument (see the module docstring); returns one line per file written."""
    src, _, dest = arg.partition("=")
    path = Path(src)
    if path.is_dir():
        return [f"wrote {f}" for f in render(path)]
    if path.suffix == ".md":   # a committed report with no JSON beside it, or one its own writer makes
        write_atomic(path, cap_cells(path.read_text()))
        return [f"kept {path} (no JSON this script renders); table cells over {mdtable.LIMIT} characters cut in place"]
    try:
        docs = markdown_of(path)
    except (ValueError, KeyError) as e:
        md = Path(dest) if dest else path.with_suffix(".md")
        if not md.is_file():
            raise
        write_atomic(md, cap_cells(md.read_text()))
        return [f"kept {md} (its JSON cannot be rendered by this suite: {str(e).splitlines()[0][:300]}); "
                f"table cells over {mdtable.LIMIT} characters cut in place"]
    if dest:
        (only,) = docs.values()
        docs = {Path(dest): only}
    for md, text in docs.items():
        write_atomic(md, text)
    return [f"wrote {md}" for md in docs]


if __name__ == "__main__":
    for arg in sys.argv[1:] or ALL:
        for line in render_one(arg if sys.argv[1:] else str(ROOT / arg.split("=")[0])
                               + ("=" + str(ROOT / arg.split("=")[1]) if "=" in arg else "")):
            print(line)
