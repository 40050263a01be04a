"""The suite's command line and report model in the project's own environment (no backends needed):
bad input, exit codes, the versioned JSON record, Markdown, comparison, and a crashing probe."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stackprobe import REPORT_SCHEMA_VERSION
from stackprobe import static as static_mod
from stackprobe.report import Report, ReportError, compare, comparison_markdown
from stackprobe.verdict import BLOCKED, GATE_PYTHON, Verdict


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "stackprobe", *args], capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.parametrize("spec", ["13.7", "banana", "5"])
def test_unknown_target_arch_is_refused_listing_the_valid_ones(spec, tmp_path):
    out = tmp_path / "r.json"
    p = cli("--arch", spec, "--json", str(out))
    assert p.returncode == 2
    assert "12.0" in p.stderr and "7.5" in p.stderr and "12.1" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not out.exists()                      # refused before any work


def test_bad_world_size_is_refused():
    p = cli("--world-size", "0")
    assert p.returncode == 2 and "--world-size" in p.stderr


@pytest.fixture(scope="module")
def report_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("reports")
    p = cli("--quiet", "--target-arch", "12.0", "--json", str(d / "a.json"), "--markdown", str(d / "a.md"), "--label", "here")
    assert p.returncode == 0, p.stderr
    return d


def test_report_is_versioned_json_with_every_backend(report_files):
    d = json.loads((report_files / "a.json").read_text())
    assert d["schema"] == REPORT_SCHEMA_VERSION and d["target_arch"] == "12.0" and d["label"] == "here"
    assert d["tiers"] == ["static"]
    names = [v["backend"] for v in d["verdicts"]]
    for b in ("nccl-ring", "nccl-tree", "flashinfer-allreduce-fusion", "sglang-custom-allreduce", "torch-symm-mem",
              "ep-flashinfer-a2a", "flashinfer-pcie-ipc-allreduce", "b12x", "mscclpp"):
        assert b in names
    for v in d["verdicts"]:
        assert v["status"] in ("unblocked", "gate-passes", "works-but-slower", "blocked", "skipped", "error")
        assert v["cause"]
    env = d["environment"]
    assert env["python"]["executable"] and "findings" in env and "packages" in env
    r = Report.from_json(d)
    assert [v.backend for v in r.verdicts] == names
    md = (report_files / "a.md").read_text()
    assert md.startswith("# stackprobe report: here")
    assert all(f"| {b} |" in md for b in names)


def test_newer_schema_and_foreign_json_are_refused(report_files, tmp_path):
    d = json.loads((report_files / "a.json").read_text())
    d["schema"] = REPORT_SCHEMA_VERSION + 1
    with pytest.raises(ReportError, match="newer"):
        Report.from_json(d)
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    p = cli("--compare", str(report_files / "a.json"), str(bad))
    assert p.returncode == 2 and "not a stackprobe report" in p.stderr


def test_comparison_names_what_changed_and_why(report_files):
    a = Report.load(report_files / "a.json")
    b = Report.load(report_files / "a.json")
    b.label = "after"
    same = compare([a, b], ["before", "after"])
    assert not any(c.changed for c in same)
    # a runtime verdict measured on the target host takes precedence over the static one for that backend (C20)
    target = {"compute_capability": "12.0", "topology": b.options["topology"], "world_size": b.options["world_size"]}
    b.add(Verdict("torch-symm-mem", BLOCKED, tier="runtime", gate=GATE_PYTHON, cause="measured refusal", host=target,
                  scope="engine"))
    assert b.tiers == ["static", "runtime"] and b.verdict("torch-symm-mem").tier == "runtime"
    changes = {c.backend: c for c in compare([a, b], ["before", "after"])}
    if a.verdict("torch-symm-mem").status != BLOCKED:
        assert changes["torch-symm-mem"].changed and "measured refusal" in changes["torch-symm-mem"].why
    md = comparison_markdown([a, b], ["before", "after"])
    # schema 3: the comparison opens with what each image gives a user, then the matrix
    assert md.startswith("## Environment health\n")   # health first (a broken install must not be missed)
    assert "\n## What each image gives a user\n\n- **before**: " in md
    assert md.index("## Environment health") < md.index("## What each image gives a user") < md.index("| backend |")
    assert "\n| backend | before | after | changed | why |\n" in md


def test_a_crashing_probe_is_an_error_verdict(monkeypatch):
    class Broken:
        BACKENDS = ("broken-backend",)

        @staticmethod
        def probe(ctx):
            raise ZeroDivisionError("division by zero in a probe")

    real = static_mod.probes()
    monkeypatch.setattr(static_mod, "probes", lambda: [Broken] + real[:1])
    r = static_mod.run_static("12.0")
    v = r.verdict("broken-backend")
    assert v.status == "error" and "ZeroDivisionError" in v.cause
    assert r.verdict("nccl-ring") is not None            # the rest of the suite still ran



def test_invoke_validate_without_image_validates_this_environment(tmp_path):
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    inv = [sys.executable, "-m", "invoke", "validate", "--out", str(tmp_path), "--markdown", str(tmp_path / "m.md")]
    p = subprocess.run(inv, capture_output=True, text=True, cwd=root, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "| flashinfer-allreduce-fusion |" in p.stdout
    d = json.loads((tmp_path / "current-environment.json").read_text())
    assert d["schema"] == REPORT_SCHEMA_VERSION and d["environment"]["python"]["executable"]
    assert (tmp_path / "m.md").read_text().strip() == p.stdout.strip()
    bad = subprocess.run(inv[:4] + ["--arch", "13.7"], capture_output=True, text=True, cwd=root, timeout=600)
    assert bad.returncode == 4 and "12.0" in bad.stderr      # the README: a bad --arch exits 4 on every task


def test_help_is_grouped_and_no_option_is_left_ungrouped():
    """``python -m stackprobe --help`` groups its options (issue 42 item 4): the target, reports, tiers, readers.
    An option added without a group would land under argparse's own "options:" heading beside -h: none may."""
    from stackprobe.__main__ import build_parser

    text = build_parser().format_help()
    for head in ("what the verdicts are for", "reports:", "tiers and comparisons:", "readers and limits:"):
        assert head in text, head
    ungrouped = text.split("options:", 1)[1].split("\n\n", 1)[0]
    assert [ln.split()[0] for ln in ungrouped.strip().splitlines() if ln.strip().startswith("-")] == ["-h,"], ungrouped
    assert "--arch CC" in text.split("what the verdicts are for", 1)[1].split("reports:", 1)[0]
