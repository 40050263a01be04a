"""GPU tests of the runtime tier (marked ``gpu``; skipped where no NVIDIA GPU is visible).

They run the real probes: NCCL called directly through the ctypes binding, the NCCL Tree settings of case C12,
and torch symmetric memory, at world size 1 and at every GPU present, with a short sweep.
"""
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    out = subprocess.run([exe, "-L"], capture_output=True, text=True).stdout
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


GPUS = _gpus()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no NVIDIA GPU visible")


@needs_gpu
def test_nccl_binding_loads_the_library_torch_uses():
    import torch
    from stackprobe.runtime.ncclbind import NcclLibrary
    lib = NcclLibrary()
    assert len(lib.unique_id()) == 128
    v = torch.cuda.nccl.version()
    assert isinstance(v, tuple), f"torch.cuda.nccl.version() returned {v!r}, not a version tuple"
    assert tuple(lib.version) == tuple(v[:3])


def _cfg():
    from stackprobe.runtime.bench import BenchConfig
    return BenchConfig(sizes=[43008, 1 << 20], warmup=1, rounds=6, sweep_rounds=2, graph_calls=122, graph_replays=3)


@needs_gpu
@pytest.mark.parametrize("world_size", sorted({1, GPUS}) if GPUS else [1])
def test_baseline_settings_and_symm_mem_run_correctly_in_cuda_graphs(world_size):
    from stackprobe.runtime.suite import run_suite
    from stackprobe.runtime.workload import preset
    rep = run_suite(["nccl-default", "torch-distributed-nccl", "nccl-ring", "nccl-tree", "nccl-allreduce-tree",
                     "torch-symm-mem-two-shot"], [world_size], _cfg(), timeout=240, workload=preset("kimi-k2"))
    rows = {r["backend"]: r for r in rep["runs"][0]["rows"]}
    verdicts = {v["backend"]: v for v in rep["runs"][0]["verdicts"]}
    base = rows["nccl-default"]
    assert base["outcome"] == "ok", base.get("tail")
    for rec in base["sweep"]:
        assert rec["eager_correct"] and rec["sequence_correct"] and rec["timed_correct"], rec
        assert rec["work_us"]["mean"] > 0 and not rec["no_gpu_work"]
    assert verdicts["nccl-default"]["status"] == "baseline"
    assert rep["host"]["compute_capability"] and rep["host"]["nccl_version"]
    if world_size == 1:
        for name in ("torch-distributed-nccl", "nccl-ring", "nccl-tree", "torch-symm-mem-two-shot"):
            assert verdicts[name]["status"] == "skipped" and "no peers" in verdicts[name]["cause"]
        return
    assert verdicts["torch-distributed-nccl"]["status"] in ("faster", "parity", "slower", "inconclusive")
    # C12: allreduce:tree runs every collective in a graph; Tree refuses all_gather / reduce_scatter
    assert all(r["graph"] == "ok" for r in rows["nccl-allreduce-tree"]["checks"].values())
    tree = verdicts["nccl-tree"]
    assert tree["status"] == "blocked" and tree["gate"] == "setting", tree
    assert "allreduce:tree" in tree["lift_detail"]
    for row in rows.values():
        assert not row.get("leftover_pids"), row


@needs_gpu
@pytest.mark.skipif(GPUS < 2, reason="needs peers")
def test_planted_op_that_writes_nothing_under_capture_is_a_wrong_result():
    """C21 on GPU: an NCCL allreduce that works eagerly but records nothing while a graph is captured."""
    import os
    import sys
    from stackprobe.runtime.suite import run_suite
    sys.path.insert(0, os.path.dirname(__file__))
    rep = run_suite(["nccl-default", "test_runtime_fixture_probes:StaleUnderCaptureProbe"], [2], _cfg(), timeout=240)
    v = {x["backend"]: x for x in rep["runs"][0]["verdicts"]}
    stale = v["fixture-stale-under-capture"]
    assert (stale["status"], stale["gate"]) == ("blocked", "wrong-result"), stale
    row = next(r for r in rep["runs"][0]["rows"] if r["backend"] == "fixture-stale-under-capture")
    assert row["sweep"][0]["eager_correct"] is True and row["sweep"][0]["timed_correct"] is False


@needs_gpu
@pytest.mark.skipif(GPUS < 2, reason="FlashInfer's allreduce kernels need at least 2 GPUs")
def test_flashinfer_allreduce_backends_run_correctly_in_cuda_graphs():
    """FlashInfer's TRT-LLM allreduce fusion and PCIe IPC allreduce at world size 2, paired with the baseline,
    every check passed (needs flashinfer importable and nvcc for its JIT modules)."""
    pytest.importorskip("flashinfer")
    from stackprobe.runtime.suite import run_suite
    from stackprobe.runtime.workload import preset
    rep = run_suite(["nccl-default", "flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"], [2], _cfg(),
                    timeout=900, workload=preset("kimi-k2"))
    rows = {r["backend"]: r for r in rep["runs"][0]["rows"]}
    for name in ("flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"):
        assert rows[name]["outcome"] == "ok", rows[name].get("tail")
        for rec in rows[name]["sweep"]:
            assert rec["eager_correct"] and rec["sequence_correct"] and rec["timed_correct"], rec
