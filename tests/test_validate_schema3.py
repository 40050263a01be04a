"""Report schema 3: a schema-2 report is read in schema-3 statuses (translated) or refused with a message saying
what to do, never misread; a comparison of an old and a new report then speaks one vocabulary."""
from __future__ import annotations

import json

import pytest

from stackprobe import REPORT_SCHEMA_VERSION
from stackprobe.report import Report, ReportError, comparison_markdown
from stackprobe.verdict import Verdict

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
#: the schema-3 reports the images gave on 2026-12-02 (results/ before the 2026-12-07 re-reading): what a report
#: written by an older suite looks like, read through translate_v3
SCHEMA3 = ROOT / "tests" / "data" / "schema3"


def _v2_opt_in(evidence_ok: bool = True) -> dict:
    """A schema-2 engine answer as 0.5.23 with no flags wrote it for PCIe IPC: blocked (setting), the opt-in gate
    closed with its default in the evidence."""
    v = Verdict("flashinfer-pcie-ipc-allreduce", "blocked", gate="setting", lift="setting", scope="engine",
                cause="SGLang 0.5.23: SGLang builds the PCIe IPC communicator only when SGLANG_ENABLE_PCIE_IPC_ALLREDUCE "
                      "is set (default False; here unset)", lift_detail="SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")
    v.add("sglang version", "0.5.23", "distribution metadata")
    if evidence_ok:
        v.add("engine gate: opt-in SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
              {"admits": False, "value": {"default": False, "here": None}}, "sglang/srt/environ.py:1539")
    v.add("engine gate: supported world sizes", {"admits": True, "value": [2, 4, 8]}, "pcie_ipc_ar.py:76")
    return v.to_json()


def _report(schema: int, verdicts: list[dict], label: str) -> dict:
    return {"schema": schema, "suite_version": "0.1.0", "created": "2026-11-30T00:00:00Z", "label": label,
            "target_arch": "12.0", "tiers": ["static"], "options": {"topology": "pcie", "world_size": 8},
            "provenance": {"suite_digest": "sha256:x"}, "environment": {"packages": {"sglang": "0.5.23"}},
            "coverage": [], "verdicts": verdicts}


def _write(tmp_path, name: str, d: dict):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_schema_is_4():
    assert REPORT_SCHEMA_VERSION == 4


def _v3(engines: list) -> dict:
    """A schema-3 report dict: SGLang's sections at the top level, a second engine's dispatch in its entry."""
    sg = Verdict("dp-attention", "not-assessed", scope="engine", engine="sglang", cause="not judged").to_json()
    vl = Verdict("--enable-dbo", "not-assessed", scope="engine", engine="vllm", cause="not judged").to_json()
    old = Verdict("--old-flag", "not-assessed", scope="engine", cause="no engine named").to_json()
    return {"schema": 3, "target_arch": "12.0", "verdicts": [], "options": {"server_config": {"describe": "no flags"}},
            "server_config": {"describe": "no flags"}, "dispatch": {"serves": "nccl-ring"},
            "launch_environment": {"NCCL_CUMEM_ENABLE": {"value": "0"}}, "paths": [sg, vl, old], "engines": engines}


def test_a_schema_3_report_is_read_with_every_engine_section_in_its_entry():
    """Schema 4 holds every engine alike: SGLang's top-level dispatch, launch environment and paths of a schema-3
    report go to its entry, vLLM's path to vLLM's; the schema-3 number is kept (the comparison says what it read)."""
    r = Report.from_json(_v3([{"name": "sglang", "title": "SGLang", "version": "0.5.23"},
                              {"name": "vllm", "title": "vLLM", "version": "0.33.0", "dispatch": {"serves": "pynccl"}}]))
    sg, vl = r.engines
    assert sg["dispatch"] == {"serves": "nccl-ring"} and sg["launch_environment"]["NCCL_CUMEM_ENABLE"]["value"] == "0"
    assert [p["backend"] for p in sg["paths"]] == ["dp-attention", "--old-flag"]
    assert [p["backend"] for p in vl["paths"]] == ["--enable-dbo"] and vl["dispatch"] == {"serves": "pynccl"}
    assert sg["server_config"] == {"describe": "no flags"} and "server_config" not in vl
    assert r.dispatch == {"serves": "nccl-ring"} and len(r.paths) == 3 and r.schema == 3
    out = r.to_json()
    assert not {"dispatch", "paths", "launch_environment", "server_config"} & set(out)
    assert Report.from_json(out).engines == r.engines            # translating twice changes nothing


def test_a_schema_3_report_without_an_engine_list_gets_sglangs_entry_only_for_a_section():
    """Reports made before the engine list answered for SGLang: its sections go to an SGLang entry. Twin: with no
    section to hold, no entry is made up."""
    r = Report.from_json(_v3([]))
    assert [e["name"] for e in r.engines] == ["sglang", "vllm"] and r.engines[0]["dispatch"]["serves"] == "nccl-ring"
    bare = {"schema": 3, "target_arch": "12.0", "verdicts": [], "engines": []}
    assert Report.from_json(bare).engines == [] and Report.from_json(bare).dispatch == {}


def test_a_schema_4_report_keeps_no_top_level_section():
    """The twin of the translation: a schema-4 report is read as written; a stray top-level ``dispatch`` is not an
    engine's (it is not moved into an entry)."""
    d = {"schema": 4, "target_arch": "12.0", "verdicts": [], "dispatch": {"serves": "stray"},
         "engines": [{"name": "vllm", "dispatch": {"serves": "pynccl"}}]}
    assert Report.from_json(d).dispatch == {"serves": "pynccl"}


def test_a_schema_2_opt_in_reads_opt_in_with_the_old_status_in_a_warning(tmp_path):
    nint = Verdict("b12x", "blocked", gate="not-integrated", scope="engine", cause="not integrated").to_json()
    on = Verdict("sglang-custom-allreduce", "gate-passes", scope="engine", cause="admitted at ws 2").to_json()
    lib = Verdict("flashinfer-pcie-ipc-allreduce", "gate-passes", scope="library", cause="lib").to_json()
    r = Report.load(_write(tmp_path, "old.json", _report(2, [lib, _v2_opt_in(), nint, on], "old")))
    eng = r.answers("flashinfer-pcie-ipc-allreduce")["engine"]
    assert eng.status == "opt-in" and "read from a schema-2 report: blocked (setting) -> opt-in" in eng.warnings
    assert r.answers("flashinfer-pcie-ipc-allreduce")["library"].status == "gate-passes"   # library words unchanged
    assert r.verdict("b12x").status == "not-integrated"
    assert r.verdict("sglang-custom-allreduce").status == "on-by-default"
    assert r.options["read_from_schema"] == 2 and "read from a schema-2 report" in r.to_markdown()


def test_a_schema_2_blocked_setting_without_its_opt_in_evidence_is_refused_not_guessed(tmp_path):
    path = _write(tmp_path, "old.json", _report(2, [_v2_opt_in(evidence_ok=False)], "old"))
    with pytest.raises(ReportError) as e:
        Report.load(path)
    msg = str(e.value)
    assert str(path) in msg and "flashinfer-pcie-ipc-allreduce" in msg and "'blocked (setting)'" in msg
    assert "Re-run the suite (schema 3) on that image" in msg


def test_a_schema_2_blocked_of_another_kind_stays_blocked_and_says_why(tmp_path):
    v = Verdict("flashinfer-allreduce-fusion", "blocked", gate="python-table", scope="engine", cause="majors [9, 10]")
    r = Report.load(_write(tmp_path, "old.json", _report(2, [v.to_json()], "old")))
    eng = r.verdict("flashinfer-allreduce-fusion")
    assert eng.status == "blocked" and "did not tell a start-up failure from a fallback" in eng.warnings[-1]


def test_comparing_an_old_and_a_new_report_speaks_one_vocabulary(tmp_path):
    new = Verdict("flashinfer-pcie-ipc-allreduce", "on-as-configured", scope="engine", cause="set")
    new.add("user setting", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1", "gates")
    old = Report.load(_write(tmp_path, "old.json", _report(2, [_v2_opt_in()], "old")))
    nr = Report.from_json(_report(3, [new.to_json()], "new"))
    md = comparison_markdown([old, nr], ["old", "new"])
    assert "| flashinfer-pcie-ipc-allreduce | **opt-in**" in md and "**on-as-configured**" in md
    assert "opt-in, worth measuring on the target: flashinfer-pcie-ipc-allreduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)" in md
    assert "blocked" not in md.split("| backend |")[1].split("\n")[2]    # no old word in the new vocabulary's row


def test_a_newer_schema_is_refused(tmp_path):
    with pytest.raises(ReportError, match="newer than this suite's"):
        Report.load(_write(tmp_path, "new.json", _report(REPORT_SCHEMA_VERSION + 1, [], "x")))


def test_headline_takes_the_dispatch_walks_answer(tmp_path):
    """The 0.5.9 report asked about --enable-symm-mem: its dispatch walk serves the decode allreduce with NCCL
    symmetric memory and no engine verdict carries dispatch evidence; the headline says what the walk says. With
    the walk taken out of the same report the headline falls back to NCCL (pynccl): it reads the walk."""
    import json

    from stackprobe.report import Report
    from stackprobe.userwords import headline_line

    path = SCHEMA3 / "validate-pcie-ipc-symm-mem" / "cudastack_cu12.8-pip-sm120-runtime_2e50deed90f65a5e.json"
    data = json.loads(path.read_text())
    assert data["dispatch"]["serves"] == "nccl-symm-mem"
    assert headline_line(Report.from_json(data)).split("; ")[0].endswith("a decode-step allreduce takes nccl-symm-mem")
    data["dispatch"] = {}
    assert "a decode-step allreduce takes NCCL (pynccl)" in headline_line(Report.from_json(data))


@pytest.mark.parametrize("folder", ["validate", "validate-pcie-ipc", "validate-pcie-ipc-symm-mem"])
def test_committed_markdown_is_what_the_writer_makes_of_the_committed_json(folder, tmp_path):
    """scripts/render_results.py on a copy of a results folder gives back the committed Markdown byte for byte (a
    change to the writer shows here until the folder is rendered again); an empty folder is refused."""
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("render_results", ROOT / "scripts" / "render_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    copy = tmp_path / folder
    copy.mkdir()
    for p in (SCHEMA3 / folder).glob("*.json"):
        shutil.copy(p, copy / p.name)
    written = mod.render(copy)
    assert len(written) == 3
    for f in written:
        assert f.read_text() == (SCHEMA3 / folder / f.name).read_text(), f.name
    with pytest.raises(FileNotFoundError, match="no \\*.json report"):
        mod.render(tmp_path)


def test_headline_falls_back_to_the_path_that_serves():
    """With PCIe IPC serving (0.5.23, variable set), a setting that falls back lands on PCIe IPC, not on NCCL; with
    no flags it lands on NCCL."""
    import json

    from stackprobe.report import Report
    from stackprobe.userwords import headline_line

    ipc = json.loads((SCHEMA3 / "validate-pcie-ipc" /
                      "cudastack_cu13.1-pip-sm120-runtime_7dbd01ad3ef27600.json").read_text())
    line = headline_line(Report.from_json(ipc))
    assert "takes flashinfer-pcie-ipc-allreduce" in line
    assert "falls back to flashinfer-pcie-ipc-allreduce if set" in line and "falls back to NCCL" not in line
    none = json.loads((SCHEMA3 / "validate" / "cudastack_cu13.1-pip-sm120-runtime_7dbd01ad3ef27600.json").read_text())
    assert "falls back to NCCL if set" in headline_line(Report.from_json(none))


def test_headline_speaks_for_no_engine_that_is_not_installed(tmp_path):
    """A report made where SGLang is not installed (its rows are not-installed skips) gets no 'takes NCCL' headline;
    the same report with sglang in its packages gets one (the guard reads the install, not the rows)."""
    import json
    import os
    import subprocess
    import sys

    from stackprobe.report import Report
    from stackprobe.userwords import headline_line

    out = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "validate"))
    subprocess.run([sys.executable, "-m", "stackprobe", "--quiet", "--json", str(out)], check=True, env=env,
                   cwd=tmp_path, timeout=600)
    data = json.loads(out.read_text())
    assert "sglang" not in (data["environment"].get("packages") or {})
    line = headline_line(Report.from_json(data))
    assert line.startswith("no serving engine answer (SGLang is not installed here)") and "takes" not in line
    data["environment"].setdefault("packages", {})["sglang"] = "0.5.23"
    assert "takes NCCL" in headline_line(Report.from_json(data))
