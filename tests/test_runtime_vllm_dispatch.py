"""vLLM's dispatch probe (``python -m stackprobe.runtime dispatch --engine vllm``) at world size 2 on CPU: two gloo
rank processes through the runtime tier's containment, each bringing up the real vllm 0.33.0 wheel's parallel state
with vLLM's own ``EngineArgs`` parser and ``init_worker_distributed_environment`` (``vllm/v1/worker/gpu_worker.py``).
The platform and vLLM's three CUDA-only communicator classes are stand-ins at the unit's edge
(tests/vllm_dispatch_standins.py says why and how); vLLM's ``CudaCommunicator`` builds them or not and
``CudaCommunicator.all_reduce`` dispatches between them.

Claims and their failing twins:

* with no flags vLLM builds custom allreduce and pynccl, its own log names them in dispatch order, custom allreduce
  serves and beats the same group with it switched off (served by pynccl): a 1 ms path against an 8 ms fallback;
* ``--disable-custom-all-reduce`` reaches vLLM's parser and its switch in every rank: custom allreduce is not built
  and pynccl serves (the baseline: the dispatch's NCCL step);
* the attribution follows vLLM's order, not SGLang's: with ``VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1`` PCIe IPC
  serves, and with it switched off custom allreduce serves (SGLang asks custom allreduce first);
* PCIe IPC serves only once vLLM's warmup step set its workspace up (the bring-up calls it): without it custom
  allreduce serves;
* a P2P-off topology skips custom allreduce and PCIe IPC before any rank starts: the planted hang in the
  custom-allreduce constructor is never reached and pynccl serves;
* a planted fault is reported as such, never as a ratio: custom allreduce that ignores being switched off, or that
  returns a wrong sum.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from test_runtime_dispatch_probe import P2P_OFF
from test_runtime_dispatch_probe import dispatch as run_dispatch
from validate_support import ROOT, pip_requirements, pip_target, suite_venv

pytestmark = pytest.mark.network

VLLM = "vllm==0.33.0"
PROBE = "vllm_dispatch_standins:StandInVllmDispatchProbe"
REQS = ROOT / "tests" / "fixtures" / "vllm_bring_up_requirements.txt"


@pytest.fixture(scope="module")
def venv_env():
    py = suite_venv()
    pp = [str(pip_target(VLLM)), str(pip_requirements(REQS)), str(ROOT / "validate"), str(ROOT / "tests")]
    return py, dict(os.environ, PYTHONPATH=os.pathsep.join(pp), VLLM_LOGGING_LEVEL="DEBUG")


def dispatch(venv_env, tmp: Path, *args: str, mode: str = "ok", p2p: dict | None = None, timeout: int = 150,
             rounds: int = 10) -> tuple[int, dict, str]:
    return run_dispatch(venv_env, tmp, *args, mode=mode, p2p=p2p, timeout=timeout, rounds=rounds, engine="vllm",
                        probe=PROBE)


def ranks(res: dict) -> list[dict]:
    return [r["bring_up"] for r in res["run"]["ranks"]]


def only(res: dict) -> dict:
    vs = [v for v in res["verdicts"] if v["status"] != "skipped"]
    assert len(vs) == 1, res["verdicts"]
    return vs[0]


def test_no_flags_custom_allreduce_serves_and_beats_pynccl(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path)
    assert rc == 0, log[-3000:]
    assert res["engine"] == "vllm"
    for b in ranks(res):
        assert "error" not in b, b.get("traceback")
        assert b["init"] == "vllm.v1.worker.gpu_worker.init_worker_distributed_environment"
        assert b["device_communicator"] == "CudaCommunicator"
        assert b["communicators"]["ca_comm"]["built"] and b["communicators"]["pynccl_comm"]["built"]
        assert not b["communicators"]["fi_pcie_ipc_ar_comm"]["built"]       # opt-in, not set
        assert b["pcie_ipc_setup"] == "not run: not built"
        fi = b["communicators"]["fi_ar_comm"]     # vLLM's own class: built by default, disables itself here
        assert (fi["built"], fi["class"], fi["disabled"]) == (True, "FlashInferAllReduce", True)
        assert b["all_reduce_flags"] == {"custom_all_reduce": True}
        assert b["after"]["paths"] == {"on": "ca_comm.custom_all_reduce", "off": "pynccl_comm.all_reduce"}
        assert b["after"]["checks"] == {"on": True, "off": True}            # real sums of the real inputs
    # vLLM's own log of what it built, in dispatch order (info_once, scope "global": rank 0 only)
    assert any("Using ['CUSTOM', 'PYNCCL'] all-reduce backends (in dispatch order) for group 'tp:0'" in ln
               for ln in ranks(res)[0]["log"])
    v = only(res)
    assert (v["backend"], v["status"]) == ("vllm-custom-allreduce", "faster")
    m = v["measurements"]
    assert m["ratio_high"] < 0.95 and m["baseline_path"] == "pynccl_comm.all_reduce"
    # a CPU host has no CUDA graph: the cause says the calls were eager, never "under graph capture"
    assert "in eager calls inside vLLM's graph_capture() context" in v["cause"]
    assert "under vLLM's graph capture" not in v["cause"] and "not a verdict for the target" in v["cause"]


def test_disable_custom_all_reduce_reaches_vllms_switch_and_pynccl_serves(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--server-args", "--disable-custom-all-reduce --port 8000")
    assert rc == 0, log[-3000:]
    for b in ranks(res):
        assert b["server_args"]["not_engine_args"] == ["--port", "8000"]     # vllm serve's front end: no TP group reads it
        assert b["server_args"]["disable_custom_all_reduce"] is True
        assert b["parallel_config"]["disable_custom_all_reduce"] is True
        assert b["all_reduce_flags"] == {"custom_all_reduce": False}
        assert not b["communicators"]["ca_comm"]["built"]
    v = only(res)
    assert (v["backend"], v["status"]) == ("vllm-pynccl", "baseline")
    assert "the dispatch's NCCL step" in v["cause"]


def test_pcie_ipc_opt_in_serves_ahead_of_custom_allreduce_in_vllms_order(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--env", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1")
    assert rc == 0, log[-3000:]
    for b in ranks(res):
        assert b["launch_env"]["VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"]["vllm.envs"] is True
        assert b["communicators"]["fi_pcie_ipc_ar_comm"]["built"] and b["communicators"]["ca_comm"]["built"]
        assert b["pcie_ipc_setup"] == {"workspace": True, "disabled": False}     # vLLM's warmup step, decode shape
        assert b["after"]["paths"] == {"on": "fi_pcie_ipc_ar_comm.all_reduce", "off": "ca_comm.custom_all_reduce"}
    v = only(res)
    assert v["backend"] == "vllm-flashinfer-pcie-ipc"
    assert v["status"] == "slower"                              # 3 ms against custom allreduce's 1 ms


def test_pcie_ipc_without_its_warmup_set_up_declines_and_custom_allreduce_serves(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--env", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1", mode="no-setup")
    assert rc == 0, log[-3000:]
    for b in ranks(res):
        assert b["communicators"]["fi_pcie_ipc_ar_comm"]["workspace"] is False
        assert b["after"]["paths"]["on"] == "ca_comm.custom_all_reduce"
    assert only(res)["backend"] == "vllm-custom-allreduce"


def test_p2p_off_skips_both_peer_paths_before_any_set_up(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--env", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1",
                            mode="hang-setup", p2p=P2P_OFF, timeout=120)
    assert rc == 0, log[-3000:]
    assert res["plan"]["env"]["VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"] == "0"
    skipped = {v["backend"] for v in res["verdicts"] if v["status"] == "skipped"}
    assert skipped == {"vllm-custom-allreduce", "vllm-flashinfer-pcie-ipc"}
    for b in ranks(res):
        assert not b["communicators"]["ca_comm"]["built"] and not b["communicators"]["fi_pcie_ipc_ar_comm"]["built"]
    assert only(res)["backend"] == "vllm-pynccl"


@pytest.mark.parametrize("mode,status,words", [
    ("sticky", "error", "switching the path off did not reach the dispatch"),
    ("wrong", "blocked", "wrong sum after a replay"),
])
def test_a_planted_fault_is_reported_never_a_ratio(venv_env, tmp_path, mode, status, words):
    rc, res, log = dispatch(venv_env, tmp_path, mode=mode)
    assert rc == 0, log[-3000:]
    v = only(res)
    assert v["backend"] == "vllm-custom-allreduce" and v["status"] == status and words in v["cause"]
    assert v["measurements"].get("ratio_to_baseline") is None
