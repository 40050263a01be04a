"""Verdict rules of the runtime tier (stackprobe.runtime.verdicts), on rows built here, and the five runs (case C23:
the same suite five times back to back) recorded on 2x H200 (SM90, NVLink) under results/, checked against
expectations written by hand: every row keeps its status in all five."""
import json
from pathlib import Path

import pytest

from stackprobe.runtime.probes import SETTINGS, collective_failure
from stackprobe.runtime.verdicts import decide, decide_all
from stackprobe.runtime.workload import preset

RESULTS = Path(__file__).resolve().parents[1] / "results" / "2xH200-SM90-NVLink"
KIMI = preset("kimi-k2")
HOST = {"compute_capability": "9.0", "topology": "nvlink", "world_size": 2, "driver_version": "580.159.04",
        "torch": "2.11.0+cu130", "nccl_version": "2.28.9"}


def row(name, ratio=(1.0, 0.99, 1.01), work=8.0, floor=1.2, kind="backend", ws=2, correct=True, graph="ok",
        no_work=False, **kw):
    rec = {"bytes": 43008, "eager_correct": correct, "sequence_correct": correct, "timed_correct": correct,
           "graph": graph, "rounds": 30, "time_us": {"mean": work + floor, "low": work + floor - 0.1,
                                                     "high": work + floor + 0.1},
           "work_us": {"mean": work, "low": work - 0.1, "high": work + 0.1},
           "floor_us": {"mean": floor, "low": floor, "high": floor}, "no_gpu_work": no_work,
           "ratio": {"value": ratio[0], "low": ratio[1], "high": ratio[2]}}
    if graph == "capture-failed":
        rec = {"bytes": 43008, "graph": "capture-failed", "error": "capture broke"}
    return dict({"backend": name, "world_size": ws, "kind": kind, "outcome": "ok", "sweep": [rec], "failure": None,
                 "pairing": "in-process"}, **kw)


@pytest.mark.parametrize("ratio,status", [((0.82, 0.81, 0.83), "faster"), ((1.0, 0.98, 1.02), "parity"),
                                          ((1.08, 1.06, 1.10), "slower"), ((1.04, 1.02, 1.06), "inconclusive"),
                                          ((0.95, 0.93, 0.97), "inconclusive")])
def test_status_comes_from_the_interval(ratio, status):
    v = decide(row("x", ratio), 0.05, KIMI, host=HOST)
    assert v.status == status and v.tier == "runtime"
    assert f"[{ratio[1]:.3f}, {ratio[2]:.3f}]" in v.cause
    assert v.measurements["ratio_low"] == ratio[1] and v.measurements["host"] == HOST
    assert v.measurements["step_us"] == pytest.approx(8.0 * 122)


def test_tolerance_moves_the_status():
    r = row("x", (1.08, 1.06, 1.10))
    assert decide(r, 0.05).status == "slower"
    assert decide(r, 0.10).status == "parity"


def test_baseline_and_no_gpu_work():
    assert decide(row("nccl-default", kind="baseline"), baseline_name="nccl-default").status == "baseline"
    empty = decide(row("torch-distributed-nccl", (0.01, 0.01, 0.01), work=0.01, no_work=True))
    assert empty.status == "error" and "no GPU work captured" in empty.cause   # C22: never faster
    # the baseline itself at or below the floor is an error too
    assert decide(row("nccl-default", kind="baseline", no_work=True), baseline_name="nccl-default").status == "error"


def test_blocked_kinds():
    wrong = decide(row("x", (0.5, 0.4, 0.6), correct=False))
    assert (wrong.status, wrong.gate) == ("blocked", "wrong-result") and "timed" in wrong.cause
    stale = row("x", (0.5, 0.4, 0.6))
    stale["sweep"][0]["timed_correct"] = False          # right when checked alone, wrong in the timed graph
    assert decide(stale).gate == "wrong-result"
    v = decide(row("x", graph="capture-failed"))
    assert (v.status, v.gate) == ("blocked", "cuda-graph") and "capture broke" in v.cause
    hang = decide({"backend": "x", "world_size": 2, "outcome": "hang", "tail": ["a", "stuck in barrier", ""],
                   "timeout_s": 30, "sweep": []})
    assert (hang.status, hang.gate) == ("blocked", "hang") and "stuck in barrier" in hang.cause
    crash = decide({"backend": "x", "world_size": 2, "outcome": "crash", "tail": ["Segmentation fault"],
                    "failed_rank": 1, "returncode": -11, "sweep": []})
    assert (crash.status, crash.gate) == ("blocked", "crash") and "-11" in crash.cause
    skipped = decide({"backend": "x", "world_size": 1, "outcome": "skipped", "sweep": [],
                      "skip_reason": "no peers: world size 1 moves no data between GPUs"})
    assert (skipped.status, skipped.gate) == ("skipped", "topology") and "no peers" in skipped.cause


def test_no_ratio_is_an_error_not_a_guess():
    r = row("x")
    del r["sweep"][0]["ratio"]
    assert decide(r).status == "error"


def test_c12_tree_verdict_names_the_setting_and_the_per_collective_form():
    checks = {"all_reduce": {"eager": "ok", "graph": "ok"},
              "all_gather": {"eager": "error", "graph": "capture-failed",
                             "eager_error": "NcclError: ncclAllGather failed: ncclInternalError (internal error): "
                                            "Error : no algorithm/protocol available for function AllGather"},
              "reduce_scatter": {"eager": "error", "graph": "capture-failed",
                                 "eager_error": "NcclError: ncclReduceScatter failed: ncclInvalidUsage"}}
    failure = collective_failure(checks, "Tree")
    assert failure["kind"] == "setting" and failure["lift_detail"] == "NCCL_ALGO=allreduce:tree"
    v = decide(row("nccl-tree", (1.07, 1.06, 1.08), kind="setting", failure=failure, checks=checks))
    assert (v.status, v.gate, v.lift) == ("blocked", "setting", "setting")
    assert "not CUDA graphs" in v.cause and "all_reduce ran and captured" in v.cause and "1.070" in v.cause
    assert collective_failure({c: {"eager": "ok", "graph": "ok"} for c in checks}, "allreduce:tree") is None
    other = collective_failure({"all_gather": {"eager": "error", "eager_error": "NcclError: ncclSystemError"}}, "Tree")
    assert other["kind"] == "error"                     # an unrelated NCCL failure is not blamed on the setting


def test_setting_rows_carry_their_precondition_and_sglang_answer():
    st = {k: SETTINGS["nccl-graph-mixing-off"][k] for k in ("env", "scope", "precondition", "source", "sglang")}
    v = decide(row("nccl-graph-mixing-off", (0.82, 0.81, 0.83), kind="setting", setting=st,
                   pairing="process-groups"))
    assert v.status == "faster" and "alternated process groups" in v.cause
    assert v.measurements["setting"]["scope"] == "process"
    assert any("not met by SGLang as shipped" in w and "outstanding" in w for w in v.warnings)
    assert "docs.nvidia.com/deeplearning/nccl" in st["source"]


# Written by hand from results/2xH200-SM90-NVLink/summary.txt (five back-to-back runs, world size 2):
# per row the 95% interval of the paired ratio in each run, and the status the rules must give it.
EXPECTED = {
    "nccl-default": ("baseline", [(1.000, 1.000)] * 5),
    "torch-distributed-nccl": ("parity", [(1.000, 1.002), (0.993, 1.001), (0.992, 0.997), (0.995, 0.997),
                                          (1.000, 1.005)]),
    "torch-symm-mem-one-shot": ("faster", [(0.907, 0.910), (0.908, 0.913), (0.901, 0.904), (0.907, 0.913),
                                           (0.907, 0.909)]),
    "torch-symm-mem-two-shot": ("faster", [(0.909, 0.912), (0.911, 0.916), (0.905, 0.908), (0.908, 0.914),
                                           (0.909, 0.912)]),
    "nccl-ring": ("parity", [(1.002, 1.004), (0.989, 0.994), (1.004, 1.011), (0.992, 0.995), (1.006, 1.012)]),
    "nccl-tree": ("blocked", [(1.076, 1.078), (1.071, 1.077), (1.068, 1.075), (1.073, 1.075), (1.071, 1.077)]),
    "nccl-allreduce-tree": ("slower", [(1.062, 1.065), (1.056, 1.062), (1.072, 1.079), (1.059, 1.062),
                                       (1.069, 1.075)]),
    # a process-wide row: 4 alternated process groups per run, below stats.MIN_PAIRS, so no status is read
    "nccl-graph-mixing-off": ("inconclusive", [(0.824, 0.829), (0.824, 0.828), (0.826, 0.830), (0.821, 0.829),
                                         (0.824, 0.831)]),
}


@pytest.mark.parametrize("run", [1, 2, 3, 4, 5])
def test_recorded_h200_runs_match_the_hand_written_expectations(run):
    rep = json.loads((RESULTS / f"run{run}" / "runtime.json").read_text())
    assert rep["host"]["compute_capability"] == "9.0" and rep["host"]["topology"] == "nvlink"
    assert rep["tolerance"] == 0.05 and rep["baseline"] == "nccl-default"
    (r,) = rep["runs"]
    assert r["world_size"] == 2 and r["host"]["world_size"] == 2
    again = {v.backend: v for v in decide_all(r["rows"], 0.05, KIMI, "nccl-default", host=r["host"])}
    for name, (status, intervals) in EXPECTED.items():
        lo, hi = intervals[run - 1]
        m = again[name].measurements
        assert m["ratio_low"] == pytest.approx(lo, abs=0.0015) and m["ratio_high"] == pytest.approx(hi, abs=0.0015)
        assert again[name].status == status, (name, again[name].cause)
        assert m["host"]["nccl_version"] == "2.28.9"
    assert again["nccl-tree"].gate == "setting"
    skipped = {n for n, v in again.items() if v.status == "skipped"}
    assert skipped == {"sglang-custom-allreduce", "flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce",
                       "ep-flashinfer-a2a", "mscclpp", "b12x"}     # not installed on that host
