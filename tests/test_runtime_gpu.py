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
    assert tuple(lib.version) == tuple(v[:3]) if isinstance(v, tuple) else True


@needs_gpu
@pytest.mark.parametrize("world_size", sorted({1, GPUS}) if GPUS else [1])
def test_ring_tree_and_symm_mem_run_correctly_in_cuda_graphs(world_size):
    from stackprobe.runtime.bench import BenchConfig
    from stackprobe.runtime.suite import run_suite
    from stackprobe.runtime.workload import preset
    cfg = BenchConfig(sizes=[43008, 1 << 20], warmup=2, iters=10, repeats=3, graph_calls=122, graph_replays=3)
    rep = run_suite(["nccl-ring", "nccl-tree", "nccl-allreduce-tree", "torch-symm-mem-two-shot"], [world_size], cfg,
                    timeout=240, workload=preset("kimi-k2"))
    rows = {r["backend"]: r for r in rep["runs"][0]["rows"]}
    verdicts = {v["backend"]: v for v in rep["runs"][0]["verdicts"]}
    ring = rows["nccl-ring"]
    assert ring["outcome"] == "ok", ring.get("tail")
    for rec in ring["sweep"]:
        assert rec["eager_correct"] and rec["graph_correct"], rec
        assert rec["graph"]["status"] == "ok" and rec["graph"]["median_us"] > 0
    assert verdicts["nccl-ring"]["status"] == "unblocked"
    assert rows["torch-distributed-nccl-ring"]["outcome"] == "ok"
    # C12: allreduce:tree runs every collective in a graph
    assert all(r["graph"] == "ok" for r in rows["nccl-allreduce-tree"]["checks"].values()), rows["nccl-allreduce-tree"]["checks"]
    tree = verdicts["nccl-tree"]
    if world_size > 1:
        assert tree["status"] == "blocked" and tree["gate"] == "setting", tree
        assert "allreduce:tree" in tree["lift_detail"]
    for row in rows.values():
        assert not row.get("leftover_pids"), row


@needs_gpu
@pytest.mark.skipif(GPUS < 2, reason="FlashInfer's allreduce kernels need at least 2 GPUs")
def test_flashinfer_allreduce_backends_run_correctly_in_cuda_graphs():
    """FlashInfer's TRT-LLM allreduce fusion and PCIe IPC allreduce at world size 2, eager and in CUDA graphs,
    every call checked (needs flashinfer importable and nvcc for its JIT modules)."""
    pytest.importorskip("flashinfer")
    from stackprobe.runtime.bench import BenchConfig
    from stackprobe.runtime.suite import run_suite
    from stackprobe.runtime.workload import preset
    cfg = BenchConfig(sizes=[43008, 1 << 20], warmup=2, iters=10, repeats=3, graph_calls=122, graph_replays=3)
    rep = run_suite(["nccl-ring", "flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"], [2], cfg,
                    timeout=900, workload=preset("kimi-k2"))
    rows = {r["backend"]: r for r in rep["runs"][0]["rows"]}
    for name in ("flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"):
        assert rows[name]["outcome"] == "ok", rows[name].get("tail")
        for rec in rows[name]["sweep"]:
            assert rec["eager_correct"] and rec["graph_correct"], rec
