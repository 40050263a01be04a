"""Issue 39 ("every verdict a maintainer would sign"), the review's left-over verdict readings, each read from the real
wheels from PyPI (vllm 0.33.0, sglang 0.5.23, flashinfer-python 0.7.2) with a failing twin: an edited copy of the
wheel's source file that gives the old, wrong answer where the new reading gives the right one.

1. What serves once a variable turns vLLM's PCIe IPC off is read, not named: ``VLLM_BATCH_INVARIANT=1`` leaves the
   decode allreduce on pynccl (``cuda_communicator.py:432-438``) with ``NCCL_ALGO=ring,tree;allreduce:tree`` pinned
   by vLLM itself (``model_executor/determinism/batch_invariant.py:1419``): Tree, not the "nccl-ring" once written
   for every such variable.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from validate_support import engine_copy, pip_target, suite_env

pytestmark = pytest.mark.network

BI = "vllm/model_executor/determinism/batch_invariant.py"
PIN = '"NCCL_ALGO": "ring,tree;allreduce:tree",'


@pytest.fixture(scope="module")
def vllm033():
    return pip_target("vllm==0.33.0")


def _run(venv, paths, code: str):
    p = subprocess.run([str(venv), "-c", code], capture_output=True, text=True, env=suite_env(paths), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


OFF_BY = """
import json
from types import SimpleNamespace
from stackprobe.probes import vllm_engine as ve
from stackprobe.serverconfig import ServerConfig
ctx = SimpleNamespace(server_config=ServerConfig(args={}, env={}, source="test"))
print(json.dumps(ve._pcie_ipc_turned_off_by(ve.installed(), ctx)))
"""


# --- point 1: what serves once PCIe IPC is turned off ----------------------------------------------------------
def test_point1_batch_invariant_leaves_pynccl_with_the_allreduce_pinned_to_tree(venv, vllm033):
    """Before: ``"then": "nccl-ring"`` for every variable that turns PCIe IPC off; vLLM 0.33.0's batch-invariant mode
    pins NCCL allreduce to Tree."""
    off = _run(venv, [vllm033], OFF_BY)
    bi = next(a for a in off if a["setting"] == "VLLM_BATCH_INVARIANT=1")
    assert bi["then"] == "NCCL (pynccl, allreduce algorithm tree)"
    assert bi["where"] == "vllm/distributed/device_communicators/cuda_communicator.py:75"
    assert f"NCCL_ALGO=ring,tree;allreduce:tree ({BI}:1419)" in bi["why"]
    assert "ring" not in bi["then"]


def test_point1_twin_a_copy_whose_mode_pins_ring_or_nothing_reads_so(venv, vllm033, tmp_path):
    """The twin: an edited copy whose batch-invariant mode pins allreduce to Ring reads Ring (the algorithm is read,
    not written in); one that pins no NCCL_ALGO names no algorithm at all: NCCL (pynccl)."""
    ring = engine_copy(vllm033, tmp_path / "ring", {BI: (PIN, '"NCCL_ALGO": "ring",')})
    bi = next(a for a in _run(venv, [ring], OFF_BY) if a["setting"] == "VLLM_BATCH_INVARIANT=1")
    assert bi["then"] == "NCCL (pynccl, allreduce algorithm ring)"
    bare = engine_copy(vllm033, tmp_path / "bare", {BI: (PIN, "")})
    bi = next(a for a in _run(venv, [bare], OFF_BY) if a["setting"] == "VLLM_BATCH_INVARIANT=1")
    assert bi["then"] == "NCCL (pynccl)" and "NCCL_ALGO" not in bi["why"]

