"""The engine runner's verdict rules, on the rank records of a real run (SGLang 0.5.23 on 2x H200, saved under
results/), and on records changed to show each rule can fail. No GPU here."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from stackprobe.runtime.engine import SglangEngineProbe, classify, engine_verdicts

RUN = Path(__file__).resolve().parent.parent / "results" / "2xH200-SM90-NVLink" / "sglang-engine" / "engine.json"


@pytest.fixture(scope="module")
def run():
    return json.loads(RUN.read_text())


def _by_name(vs):
    return {v.backend: v for v in vs}


def test_the_real_run_gives_each_communicators_own_reason(run):
    vs = _by_name(engine_verdicts(run["run"]["ranks"], run["host"]))
    assert set(vs) == {"sglang-pynccl", "sglang-custom-allreduce", "sglang-torch-symm-mem", "sglang-mscclpp",
                       "sglang-pcie-ipc", "sglang-flashinfer-fusion-workspace"}
    assert vs["sglang-pynccl"].status == "gate-passes" and vs["sglang-pynccl"].measurements["graph_median_us"] > 0
    assert (vs["sglang-torch-symm-mem"].status, vs["sglang-torch-symm-mem"].gate) == ("blocked", "topology")
    assert "multicast operations are not supported" in vs["sglang-torch-symm-mem"].cause
    assert (vs["sglang-mscclpp"].status, vs["sglang-mscclpp"].gate) == ("blocked", "not-installed")
    assert (vs["sglang-pcie-ipc"].status, vs["sglang-pcie-ipc"].gate) == ("blocked", "setting")
    for v in vs.values():
        assert v.scope == "engine" and v.tier == "runtime"
        assert v.host["compute_capability"] == "9.0" and v.host["topology"] == "nvlink" and v.host["world_size"] == 2


def test_an_enabled_communicator_is_compared_with_pynccl_and_a_wrong_result_blocks(run):
    ranks = copy.deepcopy(run["run"]["ranks"])
    base = next(b for b in ranks[0]["backends"] if b["backend"] == "sglang-pynccl")
    for rk in ranks:
        sm = next(b for b in rk["backends"] if b["backend"] == "sglang-torch-symm-mem")
        sm["info"].update(enabled=True, why="")
        sm["sweep"] = copy.deepcopy(base["sweep"])
        for rec in sm["sweep"]:
            rec["graph"]["median_us"] = rec["graph"]["median_us"] / 2
    v = _by_name(engine_verdicts(ranks, run["host"]))["sglang-torch-symm-mem"]
    assert v.status == "unblocked" and v.measurements["graph_median_us"] < v.measurements["pynccl_graph_median_us"]
    for rk in ranks:
        sm = next(b for b in rk["backends"] if b["backend"] == "sglang-torch-symm-mem")
        sm["sweep"][0]["graph_correct"] = False
    v = _by_name(engine_verdicts(ranks, run["host"]))["sglang-torch-symm-mem"]
    assert v.status == "blocked" and v.gate == "wrong-result"
    # one rank disabled is enough: SGLang votes
    ranks[1]["backends"] = [dict(b, info=dict(b["info"], enabled=False, why="multicast not supported"))
                            if b["backend"] == "sglang-torch-symm-mem" else b for b in ranks[1]["backends"]]
    assert _by_name(engine_verdicts(ranks, run["host"]))["sglang-torch-symm-mem"].status == "blocked"


@pytest.mark.parametrize("why,kind", [
    ("not built as served: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is off (default False); ... PCIe", "setting"),
    ("No module named 'mscclpp'", "not-installed"),
    ("torch symmetric memory multicast operations are not supported.", "topology"),
    ("Device capability 12 not supported, communicator is not available.", "python-table"),
    ("something new", "needs-runtime"),
])
def test_classify(why, kind):
    assert classify(why) == kind


def test_the_runner_says_why_it_cannot_run_without_sglang_or_peers(monkeypatch):
    import stackprobe.runtime.probes as probes
    monkeypatch.setattr(probes, "_module_missing", lambda names: "sglang")
    assert SglangEngineProbe().skip_reason(2, 2) == "not installed: Python module 'sglang' is not importable"
    monkeypatch.setattr(probes, "_module_missing", lambda names: None)
    assert SglangEngineProbe().skip_reason(2, 1) == "needs 2 GPUs, 1 present"
    assert SglangEngineProbe().skip_reason(1, 1) == "needs world size >= 2"
