"""Render a results folder's Markdown again from its JSON reports (after a change to how reports are written):
each ``<image>.json`` gives ``<image>.md`` (``Report.to_markdown``); two or more give
``comparison-<older>-vs-<newer>.md`` (``comparison_markdown``, older toolchain first, as ``invoke validate``
writes it). The JSON reports are read, never rewritten.

Usage: ``python scripts/render_results.py results/validate [results/validate-pcie-ipc ...]``
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from cudastack.jobs.validate import older_to_newer
from stackprobe.atomic import write_atomic
from stackprobe.report import Report, comparison_markdown


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
        write_atomic(folder / name, comparison_markdown(reports, labels))
        out.append(folder / name)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["results/validate"]:
        for f in render(Path(arg)):
            print(f"wrote {f}")
