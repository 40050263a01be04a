"""Process orchestration of the runtime tier, for real on CPU: worker processes, process groups, timeouts,
cleanup, crash reports, and the environment every probe process gets."""
import os
import re
import time

import psutil
import pytest

from stackprobe.runtime.orchestrate import MULTICAST_OFF, child_env, processes_with_marker, run_probe

pytest.importorskip("torch")

CFG = {"sizes": [4096, 65536], "dtype": "float32", "warmup": 1, "iters": 3, "repeats": 2}
FIX = "test_runtime_fixture_probes"


def test_hanging_probe_is_killed_reported_as_hang_and_leaves_no_process():
    t0 = time.monotonic()
    run = run_probe(f"{FIX}:HangProbe", 2, CFG, device="cpu", timeout=20)
    elapsed = time.monotonic() - t0
    assert run.status == "hang"
    assert elapsed < 45
    assert any("hanging now" in ln for ln in run.tail), run.tail
    pids = [int(p) for ln in run.tail for p in re.findall(r"(?:child|detached) pid (\d+)", ln)]
    assert len(pids) == 2, run.tail
    # the detached grandchild left the process group; the run marker found and killed it
    assert run.killed_pids, "the detached grandchild should have been killed by the marker scan"
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    assert run.leftover_pids == []
    assert processes_with_marker(run.run_id) == []


def test_crashing_rank_is_reported_with_its_last_lines_and_the_group_is_ended():
    t0 = time.monotonic()
    run = run_probe(f"{FIX}:CrashProbe", 2, CFG, device="cpu", timeout=120, crash_grace=2)
    assert run.status == "crash"
    assert run.failed_rank == 1
    assert run.returncodes[1] not in (0, None)
    text = "\n".join(run.tail)
    assert "injected failure on rank 1" in text and "about to fail on purpose" in text
    assert time.monotonic() - t0 < 60, "rank 0 must be ended after the grace period, not at the timeout"
    assert processes_with_marker(run.run_id) == []


@pytest.mark.parametrize("world_size", [2, 3])  # nothing may assume two ranks
def test_gloo_probe_runs_for_real_with_multicast_off_in_every_rank(world_size):
    run = run_probe("stackprobe.runtime.probes:by_name_torch_gloo", world_size, CFG, device="cpu", timeout=120)
    assert run.status == "ok", run.tail
    assert len(run.ranks) == world_size
    for rank in run.ranks:
        env = rank["env"]["env"]
        for k, v in MULTICAST_OFF.items():
            assert env[k] == v
        sweep = rank["backends"][0]["sweep"]
        assert [r["bytes"] for r in sweep] == CFG["sizes"]
        assert all(r["eager_correct"] for r in sweep)
        assert all(r["eager"]["median_us"] > 0 and r["eager"]["repeats"] == 2 for r in sweep)
    assert processes_with_marker(run.run_id) == []


def test_child_env_sets_multicast_off_unless_overridden_explicitly():
    env = child_env({"NCCL_ALGO": "Tree"}, base={"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert env["NCCL_NVLS_ENABLE"] == "0"  # a parent's setting does not turn multicast on
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["NCCL_ALGO"] == "Tree"
    env = child_env({"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "1"}, base={})
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_NVLS_ENABLE"] == "1"  # explicit user overrides win


def test_flashinfer_probes_are_runners_with_a_token_shape():
    from stackprobe.runtime import probes as P

    reg = P.registry()
    for name in ("flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"):
        probe = reg[name]
        assert not isinstance(probe, P.NotRunnableProbe) and "flashinfer" in probe.requires
        assert probe.min_world_size == 2
        assert probe.skip_reason(1, 1) is not None            # world size 1, or flashinfer missing: skipped
    assert P._token_shape(43008 // 2) == (3, 7168)          # the kimi-k2 decode message
    assert P._token_shape(16 << 20 >> 1) == (2048, 4096)
    with pytest.raises(ValueError):
        P._token_shape(100)
