"""GPU tests of the P2P check (marked ``gpu``; skipped where no NVIDIA GPU is visible): the torch peer copy and the
PTX kernel through the driver API on real devices. With one GPU: the self-test (the device to itself) passes, and a
planted wrong element and a planted stall are found; with two or more: every pair passes or is unsupported, and a
planted wrong element on pair 0-1 is found there only."""
import os
import shutil
import subprocess

import pytest

from stackprobe.runtime import p2pcheck

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    out = subprocess.run([exe, "-L"], capture_output=True, text=True).stdout
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


GPUS = _gpus()


def _env(fault=""):
    env = {k: v for k, v in os.environ.items() if k != p2pcheck.FAULT_VAR}
    if fault:
        env[p2pcheck.FAULT_VAR] = fault
    return env


@pytest.mark.skipif(GPUS < 1, reason="no NVIDIA GPU visible")
def test_the_self_test_runs_the_copy_and_the_ptx_kernel_on_a_real_gpu():
    rep = p2pcheck.run_check([0], device="cuda", repeats=5, timeout=120, self_test=True, env=_env())
    st = rep["self_test"]
    assert st["status"] == "ok", st
    assert st["transfer_us"] > 0 and len(st["steps"]["kernel"]["directions"]) == 2
    bad = p2pcheck.run_check([0], device="cuda", repeats=2, timeout=120, self_test=True,
                             env=_env("corrupt:0-0:kernel"))
    assert bad["self_test"]["status"] == "wrong-data", bad["self_test"]
    hung = p2pcheck.run_check([0], device="cuda", repeats=2, timeout=30, self_test=True, env=_env("hang:0-0"))
    assert hung["self_test"]["status"] == "hang" and hung["leftover_pids"] == []


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_every_pair_passes_or_is_unsupported_and_a_planted_fault_is_found_on_its_pair_only():
    rep = p2pcheck.run_check(list(range(GPUS)), device="cuda", repeats=5, timeout=120, env=_env())
    assert all(p["status"] in ("ok", "unsupported") for p in rep["pairs"]), rep["pairs"]
    bad = p2pcheck.run_check([0, 1], device="cuda", repeats=2, timeout=120, env=_env("corrupt:0-1"))
    assert bad["pairs"][0]["status"] in ("wrong-data", "unsupported")
