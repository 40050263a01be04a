"""The engine runner (stackprobe.runtime.engine): its verdicts on rank records in the paired-sweep format, each
rule shown failing on records changed to break it; its real sweep and vote on CPU (gloo stand-ins for SGLang's
communicators, in real worker processes); and the saved 2x H200 run under results/. No GPU here."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from stackprobe.runtime.bench import FLOOR
from stackprobe.runtime.engine import (BASELINE, COMMUNICATORS, EngineRecordError, SglangEngineProbe, classify,
                                       engine_verdicts, main)

RESULTS = Path(__file__).resolve().parent.parent / "results" / "2xH200-SM90-NVLink" / "sglang-engine"
HOST = {"compute_capability": "9.0", "topology": "nvlink", "world_size": 2, "gpu": "test"}
CHECKS_OK = {"eager_correct": True, "sequence_correct": True, "timed_correct": True, "graph": "ok"}
DISABLED_WHY = {
    "sglang-pynccl": "Failed to load NCCL library from libnccl.so.2",
    "sglang-custom-allreduce": "RuntimeError: parallel name 'world_group' has not been written in this process.",
    "sglang-torch-symm-mem": "WARNING sglang.srt...torch_symm_mem: TorchSymmMemCommunicator: torch symmetric memory "
                             "multicast operations are not supported.",
    "sglang-mscclpp": "WARNING ...pymscclpp: PyMscclpp is unavailable because its dependencies failed to import: "
                      "No module named 'mscclpp'",
    "sglang-pcie-ipc": "not built as served: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is off (default False)",
    "sglang-flashinfer-fusion-workspace": "workspace preflight skipped fusion: ...; flashinfer.comm allreduce_fusion "
                                          "API not importable here",
}
ROUNDS = 20


def _series(mean: float, spread: float = 0.0) -> list[float]:
    """``ROUNDS`` samples alternating ``mean - spread`` and ``mean + spread``."""
    return [mean + (spread if i % 2 else -spread) for i in range(ROUNDS)]


def _ranks(timed: dict[str, dict], *, floor: float = 1.0, world_size: int = 2) -> list[dict]:
    """Rank records as SglangEngineProbe.run writes them: every communicator of COMMUNICATORS, the ones in
    ``timed`` enabled and measured (``{name: unit}``, a unit as Harness.measure_size records it), the others
    disabled with their own reason."""
    ranks = []
    for r in range(world_size):
        metas = []
        for name in COMMUNICATORS:
            on = name in timed
            metas.append({"backend": name, "label": "", "kind": "baseline" if name == BASELINE else "backend",
                          "info": {"constructed": True, "enabled": on, "timed": on,
                                   "why": "" if on else DISABLED_WHY[name]},
                          "checks": {}, "failure": None})
        units = {FLOOR: {"samples_us": _series(floor)}}
        units.update({n: copy.deepcopy(u) for n, u in timed.items()})
        ranks.append({"rank": r, "env": {}, "baseline": BASELINE, "backends": metas,
                      "sweep": [{"bytes": 43008, "units": units}]})
    return ranks


def _unit(work: float, spread: float = 0.0, floor: float = 1.0, **checks) -> dict:
    return dict(CHECKS_OK, samples_us=_series(work + floor, spread), calls_per_trial=1220, **checks)


def _named(verdicts):
    return {v.backend: v for v in verdicts}


def _by_name(ranks, tolerance=0.05):
    return {v.backend: v for v in engine_verdicts(ranks, HOST, tolerance)}


def test_pynccl_is_the_baseline_and_disabled_rows_keep_their_own_reasons():
    vs = _by_name(_ranks({BASELINE: _unit(10.0, 0.1)}))
    assert set(vs) == set(COMMUNICATORS)
    b = vs[BASELINE]
    assert b.status == "baseline" and b.scope == "engine" and b.tier == "runtime" and b.host == HOST
    assert b.measurements["rounds"] == ROUNDS and b.measurements["work_us"] == pytest.approx(10.0)
    assert b.measurements["work_low_us"] <= 10.0 <= b.measurements["work_high_us"]
    want = {"sglang-custom-allreduce": "needs-runtime", "sglang-torch-symm-mem": "topology",
            "sglang-mscclpp": "not-installed", "sglang-pcie-ipc": "setting",
            "sglang-flashinfer-fusion-workspace": "not-installed"}
    for name, gate in want.items():
        assert (vs[name].status, vs[name].gate) == ("blocked", gate), name
        assert vs[name].cause == f"SGLang built it disabled here: {DISABLED_WHY[name]}"


@pytest.mark.parametrize("work,spread,status", [
    (5.0, 0.1, "faster"),          # interval far below 0.95
    (10.0, 0.05, "parity"),        # interval inside [0.95, 1.05]
    (20.0, 0.1, "slower"),         # interval far above 1.05
    (10.5, 0.6, "inconclusive"),   # interval straddles 1.05
])
def test_an_enabled_communicator_gets_its_status_from_the_interval_of_its_ratio_to_pynccl(work, spread, status):
    vs = _by_name(_ranks({BASELINE: _unit(10.0), "sglang-torch-symm-mem": _unit(work, spread)}))
    v = vs["sglang-torch-symm-mem"]
    m = v.measurements
    assert v.status == status, (m["ratio_low"], m["ratio_high"])
    assert m["ratio_low"] <= m["ratio_to_baseline"] <= m["ratio_high"]
    assert m["ratio_to_baseline"] == pytest.approx(work / 10.0)
    assert "sglang-pynccl" in v.cause and "95% interval" in v.cause
    if status == "inconclusive":
        assert m["ratio_low"] < 1.05 < m["ratio_high"]


def test_the_tolerance_is_the_callers():
    ranks = _ranks({BASELINE: _unit(10.0), "sglang-torch-symm-mem": _unit(10.5, 0.05)})
    assert _by_name(ranks, 0.05)["sglang-torch-symm-mem"].status == "inconclusive"
    assert _by_name(ranks, 0.10)["sglang-torch-symm-mem"].status == "parity"
    assert _by_name(ranks, 0.02)["sglang-torch-symm-mem"].status == "slower"


def test_a_wrong_result_on_any_rank_blocks_and_is_never_a_speed():
    ranks = _ranks({BASELINE: _unit(10.0), "sglang-mscclpp": _unit(2.0)})
    assert _by_name(ranks)["sglang-mscclpp"].status == "faster"
    bad = copy.deepcopy(ranks)
    u = bad[1]["sweep"][0]["units"]["sglang-mscclpp"]
    u["timed_correct"] = False
    del u["samples_us"]          # the harness does not time a wrong op
    v = _by_name(bad)["sglang-mscclpp"]
    assert (v.status, v.gate) == ("blocked", "wrong-result") and "timed" in v.cause


def test_a_row_at_the_empty_graph_floor_is_an_error_not_a_speed_up():
    v = _by_name(_ranks({BASELINE: _unit(10.0), "sglang-mscclpp": _unit(0.001)}))["sglang-mscclpp"]
    assert v.status == "error" and v.cause.startswith("no GPU work captured")
    # the baseline itself at the floor is no baseline either
    assert _by_name(_ranks({BASELINE: _unit(0.0)}))[BASELINE].status == "error"


def test_one_rank_disabled_means_disabled_and_a_missing_baseline_gives_no_ratio():
    ranks = _ranks({BASELINE: _unit(10.0), "sglang-mscclpp": _unit(5.0)})
    split = copy.deepcopy(ranks)
    m = next(b for b in split[1]["backends"] if b["backend"] == "sglang-mscclpp")
    m["info"].update(enabled=False, timed=False, why=DISABLED_WHY["sglang-mscclpp"])
    v = _by_name(split)["sglang-mscclpp"]
    assert (v.status, v.gate) == ("blocked", "not-installed")
    nobase = _ranks({"sglang-mscclpp": _unit(5.0)})
    v = _by_name(nobase)["sglang-mscclpp"]
    assert v.status == "error" and "no sglang-pynccl baseline" in v.cause
    assert _by_name(nobase)[BASELINE].status == "blocked"


def test_a_build_failure_is_an_error_and_an_enabled_row_without_a_timing_op_is_skipped():
    ranks = _ranks({BASELINE: _unit(10.0)})
    for rk in ranks:
        for b in rk["backends"]:
            if b["backend"] == "sglang-pcie-ipc":
                b["failure"] = {"kind": "error", "message": "RuntimeError: planted"}
            if b["backend"] == "sglang-flashinfer-fusion-workspace":
                b["info"].update(enabled=True, timed=False, why="")
    vs = _by_name(ranks)
    assert (vs["sglang-pcie-ipc"].status, vs["sglang-pcie-ipc"].gate) == ("error", "crash")
    assert vs["sglang-flashinfer-fusion-workspace"].status == "skipped"


def test_records_of_the_old_harness_are_refused_with_what_to_do(tmp_path, capsys):
    old = [{"rank": 0, "backends": [{"backend": BASELINE, "info": {"enabled": True},
                                     "sweep": [{"bytes": 43008, "graph": {"median_us": 18.5}}]}]}]
    with pytest.raises(EngineRecordError, match="Re-run"):
        engine_verdicts(old, HOST)
    saved = tmp_path / "engine.json"
    saved.write_text(json.dumps({"host": HOST, "run": {"status": "ok", "seconds": 1, "ranks": old}}))
    assert main(["--from-json", str(saved), "--out", str(tmp_path / "out")]) == 2
    assert "Re-run" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_from_json_rederives_and_writes_both_files(tmp_path):
    ranks = _ranks({BASELINE: _unit(10.0), "sglang-torch-symm-mem": _unit(5.0, 0.1)})
    saved = tmp_path / "engine.json"
    saved.write_text(json.dumps({"host": HOST, "config": {"rounds": ROUNDS},
                                 "run": {"status": "ok", "seconds": 1.0, "ranks": ranks}}))
    assert main(["--from-json", str(saved), "--out", str(tmp_path / "out"), "--tolerance", "0.05"]) == 0
    res = json.loads((tmp_path / "out" / "engine.json").read_text())
    st = {v["backend"]: v["status"] for v in res["verdicts"]}
    assert st[BASELINE] == "baseline" and st["sglang-torch-symm-mem"] == "faster"
    md = (tmp_path / "out" / "engine.md").read_text()
    assert "| sglang-torch-symm-mem | yes | faster |" in md and "| sglang-mscclpp | no | blocked |" in md


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
    assert SglangEngineProbe().skip_reason(1, 1).startswith("no peers")


def test_the_runners_sweep_and_vote_for_real_on_cpu(tmp_path):
    """SglangEngineProbe.run in two real worker processes (gloo), SGLang's communicators replaced by stand-ins
    (tests/runtime_engine_fixtures.py): one sweep with the baseline, the vote, the checks, the verdicts."""
    from dataclasses import asdict

    from stackprobe.runtime.bench import BenchConfig
    from stackprobe.runtime.engine import markdown, write_result
    from stackprobe.runtime.orchestrate import run_probe

    cfg = BenchConfig(sizes=[4096], rounds=8, sweep_rounds=2, graph_calls=4, graph_replays=2, warmup=1)
    run = run_probe("runtime_engine_fixtures:CpuEngineProbe", 2, asdict(cfg), device="cpu", timeout=120)
    assert run.status == "ok", run.tail
    rk0 = run.ranks[0]
    assert rk0["baseline"] == BASELINE
    units = rk0["sweep"][0]["units"]
    # one sweep: the floor, the baseline and the communicators enabled on every rank; the split vote is left out
    assert set(units) == {FLOOR, BASELINE, "sglang-custom-allreduce", "sglang-mscclpp"}
    assert all(len(units[n]["samples_us"]) == 8 for n in (FLOOR, BASELINE, "sglang-mscclpp"))
    vs = _by_name(run.ranks)
    assert vs[BASELINE].status == "baseline"
    assert (vs["sglang-custom-allreduce"].status, vs["sglang-custom-allreduce"].gate) == ("blocked", "wrong-result")
    assert (vs["sglang-torch-symm-mem"].status, vs["sglang-torch-symm-mem"].gate) == ("blocked", "topology")
    m = vs["sglang-mscclpp"].measurements
    assert vs["sglang-mscclpp"].status in ("faster", "parity", "slower", "inconclusive")
    assert m["rounds"] == 8 and m["ratio_low"] <= m["ratio_to_baseline"] <= m["ratio_high"]
    assert (vs["sglang-pcie-ipc"].status, vs["sglang-pcie-ipc"].gate) == ("error", "crash")
    assert "planted build failure" in vs["sglang-pcie-ipc"].cause
    assert vs["sglang-flashinfer-fusion-workspace"].status == "skipped"
    res = {"host": HOST, "config": cfg.to_json(), "tolerance": 0.05, "run": run.to_json(),
           "verdicts": [v.to_json() for v in vs.values()]}
    write_result(res, tmp_path)
    assert json.loads((tmp_path / "engine.json").read_text())["verdicts"][0]["backend"] == BASELINE
    assert (tmp_path / "engine.md").read_text() == markdown(res)


def test_a_reference_row_is_decided_but_never_stands_for_sglang():
    ranks = _ranks({BASELINE: _unit(10.0), "nccl-default": _unit(9.0, 0.05)})
    for rk in ranks:
        rk["backends"].append({"backend": "nccl-default", "label": "", "kind": "reference",
                               "info": {"constructed": True, "enabled": True, "timed": True, "why": ""},
                               "checks": {}, "failure": None})
    v = _by_name(ranks)["nccl-default"]
    assert v.status == "faster" and v.scope == "library" and "not an SGLang communicator" in v.warnings[0]
    assert _by_name(ranks)[BASELINE].scope == "engine"


@pytest.fixture(scope="module")
def saved():
    return json.loads((RESULTS / "engine.json").read_text())


def test_the_saved_h200_run_rederives_to_what_it_recorded(saved):
    vs = _named(engine_verdicts(saved["run"]["ranks"], saved["host"], saved["tolerance"]))
    assert {v["backend"]: v["status"] for v in saved["verdicts"]} == {n: v.status for n, v in vs.items()}
    assert set(vs) == set(COMMUNICATORS) | {"nccl-default"}
    b = vs[BASELINE]
    assert b.status == "baseline" and b.measurements["rounds"] == 30 and b.measurements["work_us"] > 0
    assert b.measurements["time_us"] > b.measurements["floor_us"] > 0
    ref = vs["nccl-default"].measurements
    assert ref["ratio_low"] <= ref["ratio_to_baseline"] <= ref["ratio_high"]
    assert (vs["sglang-torch-symm-mem"].status, vs["sglang-torch-symm-mem"].gate) == ("blocked", "topology")
    assert "multicast operations are not supported" in vs["sglang-torch-symm-mem"].cause
    assert (vs["sglang-mscclpp"].status, vs["sglang-mscclpp"].gate) == ("blocked", "not-installed")
    assert (vs["sglang-pcie-ipc"].status, vs["sglang-pcie-ipc"].gate) == ("blocked", "setting")
    for v in vs.values():
        assert v.tier == "runtime" and v.host["compute_capability"] == "9.0" and v.host["topology"] == "nvlink"
        assert v.host["world_size"] == 2


def test_the_saved_run_with_pynccl_poisoned_on_one_rank_is_wrong_result_and_leaves_no_ratio(saved):
    ranks = copy.deepcopy(saved["run"]["ranks"])
    u = ranks[1]["sweep"][0]["units"][BASELINE]
    u["timed_correct"] = False
    vs = _named(engine_verdicts(ranks, saved["host"]))
    assert (vs[BASELINE].status, vs[BASELINE].gate) == ("blocked", "wrong-result")
    ranks = copy.deepcopy(saved["run"]["ranks"])
    for rk in ranks:   # the reference at the floor: no GPU work, no verdict
        u = rk["sweep"][0]["units"]["nccl-default"]
        u["samples_us"] = list(rk["sweep"][0]["units"][FLOOR]["samples_us"])
    assert _named(engine_verdicts(ranks, saved["host"]))["nccl-default"].cause.startswith("no GPU work captured")
