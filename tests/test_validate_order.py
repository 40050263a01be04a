"""Comparisons read from older to newer toolchain (or as given), and a backend blocked in every image says
why it stays blocked. Uses the committed static reports of the two full-stack runtime images; no Docker."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackprobe.report import Report, compare, comparison_markdown

from cudastack.jobs import validate as V

ROOT = Path(__file__).resolve().parent.parent
REPORTS = {p.name.split("_")[1].split("-")[0]: p for p in (ROOT / "results" / "validate").glob("*.json")}


def _load(tc: str) -> Report:
    return Report.load(REPORTS[tc])


def test_toolchain_of_reads_label_then_nvcc_then_torch():
    r = _load("cu12.8")
    assert V.toolchain_of(r) == (12, 8)                       # torch's CUDA 12.8 (no nvcc in that image)
    r.options["ran_in"]["toolchain"] = "13.1"
    assert V.toolchain_of(r) == (13, 1)                       # the image label wins
    bare = Report.from_json(dict(json.loads(REPORTS["cu12.8"].read_text()), environment={}, options={}))
    assert V.toolchain_of(bare) is None


def _matrix_header(md: str) -> str:
    """The per-backend matrix's header (the comparison opens with environment health and the user-words lines)."""
    return next(line for line in md.splitlines() if line.startswith("| backend |"))


def test_newer_first_is_put_older_to_newer():
    new, old = _load("cu13.1"), _load("cu12.8")
    reports, labels = V.older_to_newer([new, old], ["new", "old"])
    assert labels == ["old", "new"] and reports == [old, new]
    md = comparison_markdown(reports, labels)
    assert _matrix_header(md).startswith("| backend | old | new |")
    fusion = next(line for line in md.splitlines() if line.startswith("| flashinfer-allreduce-fusion |"))
    assert "library blocked (python-table); engine falls-back-if-set" in fusion
    assert "library gate-passes; engine startup-failure-if-set" in fusion
    assert "| yes |" in fusion and "startup-failure-if-set [python-table]" in fusion
    # unknown toolchain: the given order is kept
    bare = Report.from_json(dict(json.loads(REPORTS["cu12.8"].read_text()), environment={}, options={}))
    assert V.older_to_newer([new, bare], ["a", "b"])[1] == ["a", "b"]


def test_blocked_in_both_says_why_it_stays_blocked():
    changes = {c.backend: c for c in compare([_load("cu12.8"), _load("cu13.1")], ["12.8", "13.1"])}
    c = changes["sglang-custom-allreduce"]
    assert c.statuses == ["blocked", "blocked"] and not c.changed, c
    assert c.why.startswith("still blocked [topology]"), c.why
    assert "what would lift it:" in c.why, c.why
    # torch symm-mem moved from a start-up failure (0.5.9's KeyError: 12) to a fallback (0.5.23's .get()): the why
    # names the table and the missing major
    t = changes["torch-symm-mem"]
    assert t.statuses == ["startup-failure-if-set", "falls-back-if-set"] and t.changed, t
    assert "python-table" in t.why and "major 12" in t.why, t.why
    assert not changes["nccl-ring"].why.startswith("still blocked")


def test_validate_many_orders_by_toolchain_unless_given(monkeypatch):
    by_image = {"img-13.1": _load("cu13.1"), "img-12.8": _load("cu12.8")}
    monkeypatch.setattr(V, "validate_image", lambda img, *a, **kw: by_image[img])   # no Docker here
    _, md = V.validate_many(["img-13.1", "img-12.8"], say=lambda s: None)
    assert _matrix_header(md).startswith("| backend | img-12.8 | img-13.1 |")
    _, md = V.validate_many(["img-13.1", "img-12.8"], say=lambda s: None, order="given")
    assert _matrix_header(md).startswith("| backend | img-13.1 | img-12.8 |")
    from cudastack.core.errors import UsageError
    with pytest.raises(UsageError, match="--order"):
        V.validate_many(["img-13.1"], order="newest", say=lambda s: None)


def test_committed_comparison_reads_older_to_newer():
    """The committed comparison has the 12.8 image before the 13.1 image, and reads as an upgrade."""
    (md_path,) = (ROOT / "results" / "validate").glob("comparison-*.md")
    assert md_path.name == "comparison-cu12.8-vs-cu13.1.md"
    header = _matrix_header(md_path.read_text())
    assert header.index("cu12.8-") < header.index("cu13.1-"), header
    assert "supported majors: [9, 10] -> [9, 10, 12]" in md_path.read_text()


def test_invoke_validate_refuses_a_bad_order():
    p = subprocess.run([sys.executable, "-m", "invoke", "validate", "--order", "newest"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "--order 'newest'" in p.stderr, p.stderr
