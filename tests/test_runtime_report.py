"""Reports of the runtime tier: Markdown and plot rendered from a JSON recorded on 2x H200 (SM90, NVLink), the
workload model, and the command line end to end on CPU (gloo, real worker processes), including the planted
stale-output op (CPU analogue of case C21) and the empty op against the floor (C22)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackprobe.runtime import report as rpt
from stackprobe.runtime.__main__ import parse_size
from stackprobe.runtime.workload import default_sizes, latency_at, preset, step_time

RECORDED = Path(__file__).resolve().parents[1] / "results" / "2xH200-SM90-NVLink" / "run1" / "runtime.json"
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                   str(Path(__file__).resolve().parents[1] / "validate")]))


def test_markdown_and_plot_from_a_recorded_gpu_run(tmp_path):
    rep = rpt.load(RECORDED)
    paths = rpt.write(rep, tmp_path, "again")
    md = paths["md"].read_text()
    assert "NOT the target (compute capability 12.0" in md and "compute capability 9.0" in md
    assert "| measured on | 9.0 | NVIDIA H200 | 2 | nvlink | 580.159.04 | 2.11.0+cu130 |" in md
    assert "### Backends" in md and "### NCCL settings (ranked apart" in md
    backends = md.split("### Backends")[1].split("### NCCL settings")[0]
    settings = md.split("### NCCL settings")[1].split("###")[0]
    assert "nccl-graph-mixing-off" not in backends and "torch-symm-mem-one-shot" in backends
    assert "nccl-graph-mixing-off" in settings
    assert "no: not shown" in settings and "docs.nvidia.com/deeplearning/nccl" in settings
    v = {x["backend"]: x for x in rep["runs"][0]["verdicts"]}
    m = v["torch-symm-mem-one-shot"]["measurements"]
    assert f"{m['ratio_to_baseline']:.3f} [{m['ratio_low']:.3f}, {m['ratio_high']:.3f}]" in backends
    assert "**faster**" in backends and "**parity**" in backends and "**slower**" in settings
    assert "| 42 KB |" in md and "| 16 MB |" in md
    assert "NCCL_ALGO=allreduce:tree" in md
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert json.loads(paths["json"].read_text())["runs"] == rep["runs"]


def test_render_cli_recomputes_statuses_with_another_tolerance(tmp_path):
    shutil.copy(RECORDED, tmp_path / "runtime.json")
    r = subprocess.run([sys.executable, "-m", "stackprobe.runtime", "render", str(tmp_path / "runtime.json")],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runtime.md").stat().st_size > 1000 and (tmp_path / "runtime.png").exists()
    # 10 %: allreduce:tree's interval (about 1.06-1.08) now lies inside the parity band; symm-mem's (about
    # 0.90-0.91) straddles 0.90, so it is inconclusive, not faster
    r = subprocess.run([sys.executable, "-m", "stackprobe.runtime", "render", "--recompute-verdicts",
                        "--tolerance", "0.1", str(tmp_path / "runtime.json")], capture_output=True, text=True,
                       timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    again = json.loads((tmp_path / "runtime.json").read_text())
    ws2 = {v["backend"]: v for v in again["runs"][-1]["verdicts"]}
    assert again["tolerance"] == 0.1
    assert ws2["nccl-allreduce-tree"]["status"] == "parity"
    assert ws2["nccl-graph-mixing-off"]["status"] == "inconclusive"   # 4 pairs < stats.MIN_PAIRS
    assert ws2["nccl-tree"]["gate"] == "setting"


def test_load_refuses_a_static_report(tmp_path):
    p = tmp_path / "static.json"
    p.write_text(json.dumps({"schema": 1, "verdicts": []}))
    with pytest.raises(ValueError, match="not a runtime report"):
        rpt.load(p)


def test_kimi_k2_workload_model():
    w = preset("kimi-k2")
    assert (w.message_bytes, w.calls_per_step) == (43008, 122)
    assert preset("kimi-k2", tokens=1).message_bytes == 14336
    assert default_sizes(w) == [43008, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
    with pytest.raises(ValueError, match="factor"):
        default_sizes(w, factor=1)
    pts = [(32768, 10.0), (65536, 20.0)]
    assert latency_at(pts, 32768) == 10.0
    assert 10.0 < latency_at(pts, 43008) < 20.0
    assert latency_at(pts, 1 << 30) is None
    assert step_time(w, [(43008, 16.0)]) == pytest.approx(16.0 * 122)
    with pytest.raises(ValueError, match="known: kimi-k2"):
        preset("nope")


def test_parse_size():
    assert [parse_size(s) for s in ("43008", "32K", "64KB", "16M")] == [43008, 32768, 65536, 16 * 2**20]
    with pytest.raises(ValueError, match="32K, 16M"):
        parse_size("lots")


@pytest.mark.parametrize("args,msg", [(["--repeats", "1"], "at least 2 paired rounds"),
                                      (["--tolerance", "5"], "fraction between 0 and 1"),
                                      (["--rounds", "1"], "at least 2 alternated"),
                                      (["--graph-calls", "300"], "beyond the integers bfloat16 holds exactly"),
                                      (["--probes", "nccl-rnig"], "unknown probe 'nccl-rnig'")])
def test_bad_flags_are_refused_before_any_process_starts(args, msg):
    r = subprocess.run([sys.executable, "-m", "stackprobe.runtime", "run", "--device", "cpu", "--world-size", "2",
                        *args], capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert "running" not in r.stderr


def test_cli_run_on_cpu_end_to_end(tmp_path):
    """gloo baseline at world sizes 1 and 2 with the planted ops: plus-one (wrong), stale after the first call
    (the CPU analogue of an op that writes nothing under capture), and the skipped rows."""
    pytest.importorskip("torch")
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "stackprobe.runtime", "run", "--device", "cpu", "--world-size", "1,2",
           "--probes", "torch-gloo,test_runtime_fixture_probes:WrongResultProbe,"
                       "test_runtime_fixture_probes:StaleOutputProbe,nccl-default,mscclpp",
           "--dtype", "float32", "--sizes", "43008,64K", "--graph-calls", "20", "--graph-replays", "1",
           "--repeats", "4", "--sweep-repeats", "2", "--timeout", "120", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = rpt.load(out / "runtime.json")
    assert [run["world_size"] for run in rep["runs"]] == [1, 2]
    assert rep["host"]["topology"] == "none" and rep["runs"][1]["host"]["world_size"] == 2
    ws1 = {v["backend"]: v for v in rep["runs"][0]["verdicts"]}
    assert ws1["torch-gloo"]["status"] == "baseline"
    assert ws1["fixture-wrong"]["status"] == "skipped" and "no peers" in ws1["fixture-wrong"]["cause"]
    ws2 = {v["backend"]: v for v in rep["runs"][1]["verdicts"]}
    assert ws2["torch-gloo"]["status"] == "baseline" and ws2["torch-gloo"]["measurements"]["work_us"] > 0
    assert (ws2["fixture-wrong"]["status"], ws2["fixture-wrong"]["gate"]) == ("blocked", "wrong-result")
    stale = ws2["fixture-stale"]
    assert (stale["status"], stale["gate"]) == ("blocked", "wrong-result")
    rows = {row["backend"]: row for row in rep["runs"][1]["rows"]}
    rec = rows["fixture-stale"]["sweep"][0]
    assert rec["eager_correct"] is True                     # one call alone is right ...
    assert rec["sequence_correct"] is False and rec["timed_correct"] is False   # ... the series is not
    assert ws2["nccl-default"]["status"] == "skipped" and "GPUs" in ws2["nccl-default"]["cause"]
    assert ws2["mscclpp"]["gate"] == "not-installed"
    assert "running" in r.stderr and "ok in" in r.stderr  # progress
    assert (out / "runtime.md").exists() and (out / "runtime.png").exists()
