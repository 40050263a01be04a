"""Verdict rules of the runtime tier (stackprobe.runtime.verdicts), on rows built here and on the rows
recorded by a real run on 2x H200 (SM90, NVLink) committed under results/."""
import json
from pathlib import Path

import pytest

from stackprobe.runtime.probes import collective_failure
from stackprobe.runtime.verdicts import decide, decide_all
from stackprobe.runtime.workload import preset

RECORDED = Path(__file__).resolve().parents[1] / "results" / "2xH200-SM90-NVLink" / "runtime.json"
KIMI = preset("kimi-k2")


def row(name, graph_us, eager_us=30.0, ws=2, correct=True, graph_status="ok", lo=0.98, hi=1.02, **kw):
    g = {"status": graph_status, "median_us": graph_us, "min_us": graph_us * lo, "max_us": graph_us * hi,
         "spread_pct": 100 * (hi - lo), "repeats": 5, "calls_per_graph": 122,
         "busbw_gbps": 1.0} if graph_status == "ok" else {"status": graph_status, "error": "capture broke"}
    rec = {"bytes": 43008, "eager_correct": correct, "graph_correct": correct,
           "eager": {"median_us": eager_us, "spread_pct": 3.0, "repeats": 5, "calls_per_repeat": 50}, "graph": g}
    return dict({"backend": name, "world_size": ws, "outcome": "ok", "sweep": [rec], "failure": None}, **kw)


RING = row("nccl-ring", 16.0)


@pytest.mark.parametrize("us,status", [(6.4, "unblocked"), (15.1, "unblocked"), (15.5, "works-but-slower"),
                                       (16.0, "works-but-slower"), (24.0, "works-but-slower")])
def test_ratio_against_ring_with_tolerance(us, status):
    v = decide(row("x", us), RING, tolerance=0.05, workload=KIMI)
    assert v.status == status
    assert v.tier == "runtime"
    assert v.measurements["ratio_to_baseline"] == pytest.approx(us / 16.0)
    assert v.measurements["graph_us"] == us and v.measurements["eager_us"] == 30.0
    assert v.measurements["step_us"] == pytest.approx(us * 122)


def test_faster_by_median_but_within_the_noise_is_not_unblocked():
    noisy = decide(row("x", 14.0, lo=0.95, hi=1.15), RING)  # max 16.1 us > Ring's fastest repeat 15.7 us
    assert noisy.status == "works-but-slower" and "overlap" in noisy.cause
    assert noisy.measurements["ranges_separated"] is False
    assert decide(row("x", 14.0), RING).status == "unblocked"


def test_parity_and_slower_are_told_apart_in_the_cause():
    assert "at parity" in decide(row("x", 16.3), RING).cause
    assert "slower beyond" in decide(row("x", 20.0), RING).cause


def test_blocked_kinds():
    assert decide(row("x", 5.0, correct=False), RING).gate == "wrong-result"
    v = decide(row("x", 5.0, graph_status="capture-failed"), RING)
    assert (v.status, v.gate) == ("blocked", "cuda-graph") and "capture broke" in v.cause
    hang = decide({"backend": "x", "world_size": 2, "outcome": "hang", "tail": ["a", "stuck in barrier", ""],
                   "timeout_s": 30, "sweep": []}, RING)
    assert (hang.status, hang.gate) == ("blocked", "hang") and "stuck in barrier" in hang.cause
    crash = decide({"backend": "x", "world_size": 2, "outcome": "crash", "tail": ["Segmentation fault"],
                    "failed_rank": 1, "returncode": -11, "sweep": []}, RING)
    assert (crash.status, crash.gate) == ("blocked", "crash") and "-11" in crash.cause
    skipped = decide({"backend": "x", "world_size": 2, "outcome": "skipped", "sweep": [],
                      "skip_reason": "not installed: Python module 'mscclpp' is not importable"}, RING)
    assert (skipped.status, skipped.gate) == ("skipped", "not-installed")


def test_no_baseline_is_an_error_not_a_guess():
    bad_ring = dict(RING, outcome="crash", sweep=[])
    assert decide(row("x", 5.0), bad_ring).status == "error"


def test_c12_tree_verdict_names_the_setting_and_the_per_collective_form():
    checks = {"all_reduce": {"eager": "ok", "graph": "ok"},
              "all_gather": {"eager": "error", "graph": "capture-failed",
                             "eager_error": "NcclError: ncclAllGather failed: ncclInvalidUsage: no algorithm/protocol "
                                            "available for function AllGather ... NCCL_ALGO was set to Tree."},
              "reduce_scatter": {"eager": "error", "graph": "capture-failed",
                                 "eager_error": "NcclError: ncclReduceScatter failed: ncclInvalidUsage"}}
    failure = collective_failure(checks, "Tree")
    assert failure["kind"] == "setting" and failure["lift_detail"] == "NCCL_ALGO=allreduce:tree"
    v = decide(row("nccl-tree", 18.2, failure=failure, checks=checks), RING)
    assert (v.status, v.gate, v.lift) == ("blocked", "setting", "setting")
    assert "not CUDA graphs" in v.cause and "all_reduce ran and captured" in v.cause
    assert v.measurements["ratio_to_baseline"] == pytest.approx(18.2 / 16.0)  # allreduce is still measured
    assert collective_failure({c: {"eager": "ok", "graph": "ok"} for c in checks}, "allreduce:tree") is None


def test_recorded_h200_run_gives_the_recorded_verdicts():
    rep = json.loads(RECORDED.read_text())
    assert rep["environment"]["compute_capability"] == "9.0"
    for run in rep["runs"]:
        again = decide_all(run["rows"], rep["tolerance"], KIMI, rep["baseline"])
        assert [v.status for v in again] == [v["status"] for v in run["verdicts"]]
        assert [v.gate for v in again] == [v["gate"] for v in run["verdicts"]]
    ws2 = {v["backend"]: v for v in next(r for r in rep["runs"] if r["world_size"] == 2)["verdicts"]}
    assert ws2["nccl-ring"]["status"] == "unblocked" and ws2["nccl-ring"]["measurements"]["graph_us"] > 0
    assert ws2["nccl-tree"]["gate"] == "setting"
    assert "ncclInvalidUsage" in ws2["nccl-tree"]["cause"] and "allreduce:tree" in ws2["nccl-tree"]["lift_detail"]
    assert ws2["nccl-allreduce-tree"]["status"] in ("unblocked", "works-but-slower")
