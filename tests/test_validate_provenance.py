"""Cases C19 (torch's own arch list lacks the target) and C20 (a runtime verdict from another host never
replaces the target's), and the report's provenance (suite digest; a comparison across suites warns). No
network: the suite runs in this interpreter with its environment probe replaced where a case needs another
torch."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import stackprobe.static as static_mod
from stackprobe.archs import parse_arch
from stackprobe.report import Report, comparison_markdown, suite_digest
from stackprobe.static import arch_entry_runs_on, torch_lacks_target
from stackprobe.verdict import BLOCKED, GATE_PASSES, UNBLOCKED, Verdict

# torch 2.6.0's CUDA 12.4 wheel, torch.cuda.get_arch_list() (its release notes list sm_50..sm_90)
TORCH_260_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


@pytest.mark.parametrize("entry,target,runs", [
    ("sm_120", "12.0", True), ("sm_120", "12.1", True), ("sm_121", "12.0", False),
    ("sm_120a", "12.0", True), ("sm_120a", "12.1", False), ("sm_120f", "12.1", True),
    ("sm_90", "12.0", False), ("sm_80", "8.6", True), ("compute_90", "12.0", True), ("compute_120", "9.0", False),
    ("bogus", "12.0", False),
])
def test_arch_entry_compatibility_rules(entry, target, runs):
    assert arch_entry_runs_on(entry, parse_arch(target)) is runs


def test_c19_torch_without_the_target_blocks_every_backend_that_runs_torch_kernels(monkeypatch):
    real_collect = static_mod.envmod.collect

    def collect(timeout=180.0):
        env = real_collect(timeout)
        env["torch"] = dict(env["torch"], version="2.6.0+cu124", cuda="12.4", arch_list=TORCH_260_ARCHS,
                            symm_mem_ops={"one_shot_all_reduce": True, "two_shot_all_reduce_": True})
        return env
    monkeypatch.setattr(static_mod.envmod, "collect", collect)
    r = static_mod.run_static("12.0", backends=["torch-symm-mem", "nccl-ring"])
    f = [x for x in r.environment["findings"] if x.get("case") == "C19"]
    assert f and "torch 2.6.0+cu124 carries no kernel image for 12.0" in f[0]["message"]
    lib = next(v for v in r.verdicts if v.backend == "torch-symm-mem" and v.scope == "library")
    assert lib.status == BLOCKED and lib.gate == "compiled-binary" and "C19" in lib.cause
    # the same torch with sm_120 in its list: no finding, the library gate passes again
    monkeypatch.setattr(static_mod.envmod, "collect", lambda timeout=180.0: dict(
        collect(timeout), torch=dict(collect(timeout)["torch"], arch_list=TORCH_260_ARCHS + ["sm_120"])))
    r2 = static_mod.run_static("12.0", backends=["torch-symm-mem"])
    assert not [x for x in r2.environment["findings"] if x.get("case") == "C19"]
    assert next(v for v in r2.verdicts if v.scope == "library").status == GATE_PASSES


def test_c19_a_cpu_torch_is_not_judged_and_a_ptx_entry_counts():
    t = parse_arch("12.0")
    assert torch_lacks_target({"torch": {"version": "2.13.0+cpu", "cuda": None, "arch_list": []}}, t) == ""
    assert torch_lacks_target({"torch": {"version": "x", "cuda": "12.4", "arch_list": ["sm_90", "compute_90"]}}, t) == ""
    assert torch_lacks_target({"torch": {"version": "x", "cuda": "12.4", "arch_list": ["sm_90"]}}, t) != ""


def _target_report() -> Report:
    r = Report(target_arch="12.0", options={"topology": "pcie", "world_size": 8})
    r.add(Verdict("torch-symm-mem", BLOCKED, scope="library", gate="python-table", cause="library"))
    r.add(Verdict("torch-symm-mem", BLOCKED, scope="engine", gate="topology", cause="static engine answer"))
    return r


def test_c20_a_runtime_verdict_from_h200_nvlink_stays_beside_the_targets_verdict():
    r = _target_report()
    h200 = {"compute_capability": "9.0", "topology": "nvlink", "world_size": 2, "driver": "580", "torch": "2.11.0",
            "nccl": "2.28.9"}
    r.add(Verdict("sglang-torch-symm-mem", UNBLOCKED, tier="runtime", scope="engine", cause="fast on H200", host=h200))
    head = r.verdict("torch-symm-mem")
    assert head.tier == "static" and head.status == BLOCKED and head.cause == "static engine answer"
    a = r.answers("torch-symm-mem")
    assert [v.cause for v in a["measured_here"]] == ["fast on H200"]
    md = r.to_markdown()
    assert "measured here" in md and "SGLang sglang-torch-symm-mem: unblocked (SM90, nvlink, ws 2)" in md
    assert "The host differs from the target" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| torch-symm-mem |"))
    assert row.split("|")[2].strip().startswith("blocked")        # the headline is not "unblocked"
    # a runtime verdict measured on a host that matches the target replaces it
    r.add(Verdict("sglang-torch-symm-mem", UNBLOCKED, tier="runtime", scope="engine", cause="measured on target",
                  host={"compute_capability": "12.0", "topology": "pcie", "world_size": 8}))
    assert r.verdict("torch-symm-mem").cause == "measured on target"


def test_c20_a_runtime_verdict_without_host_takes_this_environments(monkeypatch):
    r = _target_report()
    r.environment = {"gpus": [{"capability": "9.0"}], "topology": {"pairs": 2, "full_nvlink": True}}
    r.add(Verdict("torch-symm-mem-one-shot", UNBLOCKED, tier="runtime", measurements={"world_size": 2}))
    v = r.verdicts[-1]
    assert v.host["compute_capability"] == "9.0" and v.host["topology"] == "nvlink" and v.host["world_size"] == 2
    assert r.verdict("torch-symm-mem").tier == "static"          # library kernel on another host: beside, not instead
    assert "library kernel torch-symm-mem-one-shot: unblocked (SM90, nvlink, ws 2)" in r.to_markdown()
    # a library kernel measured on the target host still never stands for the engine's answer
    r.add(Verdict("torch-symm-mem-one-shot", UNBLOCKED, tier="runtime",
                  host={"compute_capability": "12.0", "topology": "pcie", "world_size": 8}))
    assert r.verdict("torch-symm-mem").cause == "static engine answer"
    assert "library kernel torch-symm-mem-one-shot: unblocked (SM120, pcie, ws 8)" in r.to_markdown()


def test_provenance_suite_digest_follows_the_suite_and_comparisons_warn(tmp_path):
    suite = Path(static_mod.__file__).parent
    copy = tmp_path / "stackprobe"
    shutil.copytree(suite, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert suite_digest(copy) == suite_digest(suite)
    (copy / "probes" / "nccl.py").write_text((copy / "probes" / "nccl.py").read_text() + "\n# changed\n")
    assert suite_digest(copy) != suite_digest(suite)
    a, b = _target_report(), _target_report()
    assert a.to_json()["provenance"]["suite_digest"] == suite_digest(suite)
    assert "different suites" not in comparison_markdown([a, b], ["a", "b"])
    b.provenance = {"suite_digest": suite_digest(copy)}
    assert "made by different suites" in comparison_markdown([a, b], ["a", "b"])
    back = Report.from_json(b.to_json())
    assert back.provenance["suite_digest"] == suite_digest(copy)


def test_c19_torch_shared_objects_without_the_target_when_its_arch_list_is_unreadable():
    from types import SimpleNamespace
    env = {"torch": {"version": "2.6.0+cu124", "cuda": "12.4", "arch_list": []}}
    none = SimpleNamespace(level="none", files_without=["torch/lib/libtorch_cuda.so"])
    assert "libtorch_cuda.so" in torch_lacks_target(env, parse_arch("12.0"), none)
    assert torch_lacks_target(env, parse_arch("12.0"), SimpleNamespace(level="native", files_without=[])) == ""
