"""Reports of the runtime tier: Markdown and plot rendered from the JSON recorded on 2x H200 (SM90, NVLink),
the workload model, and the command line end to end on CPU (gloo, two real worker processes)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackprobe.runtime import report as rpt
from stackprobe.runtime.__main__ import parse_size
from stackprobe.runtime.workload import default_sizes, latency_at, preset, step_time

RECORDED = Path(__file__).resolve().parents[1] / "results" / "2xH200-SM90-NVLink" / "runtime.json"


def test_markdown_and_plot_from_the_recorded_gpu_run(tmp_path):
    rep = rpt.load(RECORDED)
    src = tmp_path / "runtime.json"
    shutil.copy(RECORDED, src)
    paths = rpt.write(rep, tmp_path, "again")
    md = paths["md"].read_text()
    assert "NOT the target (compute capability 12.0" in md and "compute capability 9.0" in md
    assert "## World size 1" in md and "## World size 2" in md
    ring = next(v for v in rep["runs"][-1]["verdicts"] if v["backend"] == "nccl-ring")
    assert f"| nccl-ring | {ring['measurements']['eager_us']:.1f} | {ring['measurements']['graph_us']:.1f} |" in md
    assert "| 42 KB |" in md and "| 16 MB |" in md  # the sweep tables, decode size first
    assert "NCCL_ALGO=allreduce:tree" in md
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert json.loads(paths["json"].read_text())["runs"] == rep["runs"]


def test_render_cli_rewrites_markdown_and_plot(tmp_path):
    shutil.copy(RECORDED, tmp_path / "runtime.json")
    r = subprocess.run([sys.executable, "-m", "stackprobe.runtime", "render", str(tmp_path / "runtime.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runtime.md").stat().st_size > 1000 and (tmp_path / "runtime.png").exists()
    # a stricter tolerance, decided again from the recorded rows: 0.335x Ring is no longer "faster by 70 %"
    r = subprocess.run([sys.executable, "-m", "stackprobe.runtime", "render", "--recompute-verdicts",
                        "--tolerance", "0.7", str(tmp_path / "runtime.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    again = json.loads((tmp_path / "runtime.json").read_text())
    ws2 = {v["backend"]: v for v in again["runs"][-1]["verdicts"]}
    assert again["tolerance"] == 0.7
    assert ws2["nccl-ring-graph-mixing-off"]["status"] == "works-but-slower"
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
    sizes = default_sizes(w)
    assert sizes[0] == 43008 and sizes[1] == 32 * 1024 and sizes[-1] == 16 * 2**20
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


def test_cli_run_on_cpu_end_to_end(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "stackprobe.runtime", "run", "--device", "cpu", "--world-size", "1,2",
           "--probes", "torch-gloo,test_runtime_fixture_probes:WrongResultProbe,nccl-ring,mscclpp",
           "--baseline", "torch-gloo", "--dtype", "float32", "--sizes", "43008,64K", "--iters", "3",
           "--repeats", "2", "--timeout", "120", "--out", str(out)]
    env = dict(__import__("os").environ, PYTHONPATH=str(Path(__file__).parent))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = rpt.load(out / "runtime.json")
    assert [run["world_size"] for run in rep["runs"]] == [1, 2]
    ws2 = {v["backend"]: v for v in rep["runs"][1]["verdicts"]}
    assert ws2["torch-gloo"]["status"] == "unblocked"
    assert ws2["torch-gloo"]["measurements"]["eager_us"] > 0
    assert (ws2["fixture-wrong"]["status"], ws2["fixture-wrong"]["gate"]) == ("blocked", "wrong-result")
    from stackprobe.runtime.suite import gpu_count
    if gpu_count() == 0:
        assert ws2["nccl-ring"]["status"] == "skipped" and "GPUs" in ws2["nccl-ring"]["cause"]
    assert ws2["mscclpp"]["gate"] == "not-installed"
    assert "running" in r.stderr and "ok in" in r.stderr  # progress
    assert (out / "runtime.md").exists() and (out / "runtime.png").exists()
