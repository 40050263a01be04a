"""The SGLang dispatch probe (stackprobe.runtime.dispatch) at world size 2 on CPU: two gloo rank processes started
by ``python -m stackprobe.runtime dispatch`` through the runtime tier's containment, each bringing up the real
sglang 0.5.23 wheel's parallel state with the user's server arguments (SGLang's parser, its all-reduce switches,
publish, initialize_model_parallel). SGLang's CUDA-only communicator classes are replaced by stand-ins at the
unit's edge (tests/sglang_dispatch_standins.py says why and how); SGLang's own code builds them or not and
dispatches between them.

Claims and their failing twins:

* the server args reach SGLang's parser in every rank: ``--disable-custom-all-reduce`` shows parsed, switches
  custom allreduce off and leaves pynccl serving (without it custom allreduce is built and serves);
* the attribution follows the installed dispatch: custom allreduce serves, with it off pynccl does, and with
  the PCIe IPC opt-in PCIe IPC does (SGLang asks it right after custom allreduce);
* a P2P-off topology (a saved report) skips custom allreduce and PCIe IPC with the reason, and their set-up is
  never started: a planted hang in the custom-allreduce constructor does not happen; with P2P on it does, and is
  reported as a hang within the timeout with no rank left;
* the paired timing gives a ratio with its 95% interval (a 1 ms path against an 8 ms fallback: faster); a
  planted fault (the path ignores being switched off, or returns a wrong sum) is reported as such, never as a
  ratio.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_runtime_sglang_dispatch import PARALLEL_STATE_DEPS
from validate_support import ROOT, pip_target, suite_venv

# beyond PARALLEL_STATE_DEPS, what sglang 0.5.23's runtime_context.publish (srt/configs: transformers and the model
# config helpers) and initialize_model_parallel (srt/layers/sampler -> openai protocol types) import, found by
# importing them against --no-deps folders; torchvision is the stand-in in tests/fixtures/torchvision_standin
BRING_UP_DEPS = ("transformers==5.19.0", "tokenizers==0.23.2", "huggingface-hub==1.33.0", "safetensors==0.8.0",
                 "regex==2026.11.19", "pyyaml==6.0.4", "filelock==4.3.1", "fsspec==2026.9.0", "httpx==0.29.0",
                 "httpcore==1.0.9", "h11==0.16.0", "idna==3.20", "certifi==2026.10.19.post1", "uvloop==0.23.0",
                 "compressed-tensors==0.18.0", "hf-xet==1.8.0", "typing-extensions==4.16.0", "dill==0.4.1",
                 "sentencepiece==0.2.3", "loguru==0.7.3", "annotated-types==0.8.0", "gguf==0.19.0",
                 "openai==3.57.0", "httpx2==2.16.2", "sniffio==1.3.1", "partial-json-parser==0.2.1.1.post7")
PROBE = "sglang_dispatch_standins:StandInDispatchProbe"
P2P_OFF = {"peers": {"count": 2, "cuda": {"0-1": False, "1-0": False}, "nvml": {}, "errors": []},
           "iommu": {"mode": "translated", "units": ["dmar0"], "group_types": {"DMA": 12}, "cmdline": []},
           "acs": {"source": "lspci -vvv", "redirecting": [], "bridges_with_acs": 0}, "env": {}}
P2P_ON = dict(P2P_OFF, peers={"count": 2, "cuda": {"0-1": True, "1-0": True}, "nvml": {}, "errors": []},
              iommu={"mode": "passthrough", "units": ["dmar0"], "group_types": {"identity": 12}, "cmdline": ["iommu=pt"]})
# CUDA says peer access is possible, but the IOMMU translates: a risk CUDA's answer does not cancel (NVIDIA/nccl#1999)
P2P_ON_TRANSLATED = dict(P2P_OFF, peers=P2P_ON["peers"])


@pytest.fixture(scope="module")
def venv_env():
    py = suite_venv()
    paths = [pip_target("sglang==0.5.23")] + [pip_target(s) for s in PARALLEL_STATE_DEPS + BRING_UP_DEPS]
    pp = [str(p) for p in paths] + [str(ROOT / "tests" / "fixtures" / "torchvision_standin"), str(ROOT / "validate"),
                                    str(ROOT / "tests")]
    return py, dict(os.environ, PYTHONPATH=os.pathsep.join(pp), SGLANG_LOGGING_LEVEL="warning")


def dispatch(venv_env, tmp: Path, *args: str, mode: str = "ok", p2p: dict | None = None, timeout: int = 120,
             rounds: int = 10, engine: str = "sglang", probe: str = PROBE) -> tuple[int, dict, str]:
    """``python -m stackprobe.runtime dispatch`` for ``engine`` with the stand-in ``probe`` at world size 2 on CPU,
    the P2P report ``p2p`` (default: peers on), ``STANDIN_MODE=mode`` in the ranks: (exit status, dispatch.json or
    {}, its output)."""
    py, env = venv_env
    out = tmp / "out"
    report = tmp / "p2p.json"
    report.write_text(json.dumps(p2p or P2P_ON))
    cmd = [str(py), "-m", "stackprobe.runtime", "dispatch", "--engine", engine, "--device", "cpu", "--world-size", "2",
           "--calls", "4", "--replays", "2", "--rounds", str(rounds), "--warmup", "1", "--timeout", str(timeout),
           "--probe", probe, "--p2p-report", str(report), "--out", str(out), "--env", f"STANDIN_MODE={mode}", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 120)
    res = json.loads((out / "dispatch.json").read_text()) if (out / "dispatch.json").is_file() else {}
    return p.returncode, res, p.stdout + p.stderr


def row(res: dict, name: str) -> dict:
    return next(v for v in res["verdicts"] if v["backend"] == name)


def ranks(res: dict) -> list[dict]:
    return [r["bring_up"] for r in res["run"]["ranks"]]


@pytest.fixture(scope="module")
def default_run(venv_env, tmp_path_factory):
    return dispatch(venv_env, tmp_path_factory.mktemp("default"))


# --- (a) the server args reach SGLang's parser in each rank ---------------------------------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_disable_custom_all_reduce_is_parsed_in_every_rank_and_switches_it_off(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--server-args", "--disable-custom-all-reduce")
    assert rc == 0, log[-3000:]
    for b in ranks(res):
        assert b["server_args"]["disable_custom_all_reduce"] is True, b
        assert b["all_reduce_flags"]["custom_all_reduce"] is False
        assert b["communicators"]["ca_comm"] == {"built": False}
    v = row(res, "sglang-pynccl")
    assert v["status"] == "baseline" and "pynccl_comm.all_reduce" in v["cause"], v
    assert res["plan"]["server_args"] == "--disable-custom-all-reduce"


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_without_the_flag_custom_allreduce_is_built_and_serves(default_run):
    rc, res, log = default_run
    assert rc == 0, log[-3000:]
    for b in ranks(res):
        assert b["server_args"]["disable_custom_all_reduce"] is False
        assert b["all_reduce_flags"]["custom_all_reduce"] is True
        assert b["communicators"]["ca_comm"]["built"] is True
    assert not any(v["backend"] == "sglang-pynccl" for v in res["verdicts"])


# --- (b) the attribution follows the installed dispatch ---------------------------------------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_custom_allreduce_serves_and_pynccl_serves_with_it_off(default_run):
    _, res, _ = default_run
    assert res["merged"]["paths_per_rank"] == [{"on": "ca_comm.custom_all_reduce",
                                                "off": "pynccl_comm.all_reduce"}] * 2


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_with_the_pcie_ipc_opt_in_the_next_step_is_pcie_ipc(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")
    assert rc == 0, log[-3000:]
    assert res["merged"]["paths"] == {"on": "ca_comm.custom_all_reduce", "off": "pcie_ipc_comm.pcie_ipc_all_reduce"}
    assert all(b["communicators"]["pcie_ipc_comm"]["built"] for b in ranks(res))


# --- (c) P2P off: the peer-memory paths are skipped with the reason and never started --------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_p2p_off_skips_custom_allreduce_and_pcie_ipc_with_the_reason(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, "--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1", mode="hang-setup",
                            p2p=P2P_OFF)
    assert rc == 0, log[-3000:]          # the planted hang in custom allreduce's constructor was never reached
    for name in ("sglang-custom-allreduce", "sglang-pcie-ipc"):
        v = row(res, name)
        assert v["status"] == "skipped" and v["gate"] == "topology", v
        assert v["cause"].startswith("skipped: no P2P between GPU 0 and 1") and "nvidia-smi topo -p2p" in v["cause"]
    for b in ranks(res):
        assert b["server_args"]["disable_custom_all_reduce"] is True
        assert b["communicators"]["ca_comm"] == {"built": False}
        assert b["communicators"]["pcie_ipc_comm"] == {"built": False}
        assert b["launch_env"]["before"]["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "0"
    assert row(res, "sglang-pynccl")["status"] == "baseline"


# --- (d) a planted hang in the bring-up is a hang, and no rank survives ------------------------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_a_hang_in_custom_allreduce_set_up_is_reported_as_a_hang_and_no_rank_survives(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, mode="hang-setup", p2p=P2P_ON, timeout=75)
    assert rc == 9, log[-3000:]
    run = res["run"]
    assert run["status"] == "hang" and run["seconds"] < 75 + 15, run
    assert run["leftover_pids"] == [], run
    assert not [p for p in run["killed_pids"] if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[-1].split()[0]]
    v = row(res, "sglang-dispatch")
    assert v["status"] == "blocked" and v["gate"] == "hang" and "every rank was killed" in v["cause"], v
    assert not any(v["backend"] == "sglang-custom-allreduce" for v in res["verdicts"])


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_the_same_run_without_the_planted_hang_is_not_a_hang(default_run):
    assert default_run[1]["run"]["status"] == "ok"


# --- (e) the paired timing, and planted faults that must not become a ratio ------------------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_the_paired_timing_gives_a_ratio_with_its_interval(default_run):
    _, res, _ = default_run
    v = row(res, "sglang-custom-allreduce")
    m = v["measurements"]
    assert v["status"] == "faster", v
    assert m["ratio_low"] <= m["ratio_to_baseline"] <= m["ratio_high"] < 0.95, m
    assert m["rounds"] == 10 and m["baseline_path"] == "pynccl_comm.all_reduce"
    assert res["merged"]["checks"] == {"on": True, "off": None}     # pynccl's in-place result is on the meta tensor


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_a_path_that_ignores_being_switched_off_is_a_fault_not_a_ratio(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, mode="sticky")
    assert rc == 0, log[-3000:]
    v = row(res, "sglang-custom-allreduce")
    assert v["status"] == "error" and v["cause"].startswith("fault: with ca_comm switched off"), v
    assert "ratio_to_baseline" not in v["measurements"]


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_a_wrong_sum_is_blocked_not_a_ratio(venv_env, tmp_path):
    rc, res, log = dispatch(venv_env, tmp_path, mode="wrong")
    assert rc == 0, log[-3000:]
    v = row(res, "sglang-custom-allreduce")
    assert v["status"] == "blocked" and v["gate"] == "wrong-result", v
    assert "ratio_to_baseline" not in v["measurements"]


# --- the report: measured here, not the target's verdict (C20) ----------------------------------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_every_result_says_measured_here_when_the_host_is_not_the_target(default_run):
    _, res, _ = default_run
    assert res["target_note"]["for_target"] is False
    for v in res["verdicts"]:
        assert v["measurements"]["measured_here"].startswith("measured here (SM?, none, ws 2)")
        assert "not a verdict for the target" in v["measurements"]["measured_here"]
    assert "not a verdict for the target" in (tmp := res["target_note"]["note"]) and "measured here" in tmp


def test_plan_and_target_rules_on_their_own():
    from stackprobe.runtime import dispatch as d
    off = d.plan("--tp 2", {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, 2, P2P_OFF)
    assert off["server_args"] == "--tp 2 --disable-custom-all-reduce" and off["env"]["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "0"
    assert [s["backend"] for s in off["skipped"]] == ["sglang-custom-allreduce", "sglang-pcie-ipc"]
    on = d.plan("--tp 2", {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, 2, P2P_ON)
    assert on["server_args"] == "--tp 2" and on["skipped"] == [] and on["p2p_reason"] is None
    unknown = dict(P2P_OFF, peers={"count": 0, "cuda": {}, "nvml": {}, "errors": []})   # unknown, IOMMU translated
    assert d.plan("", {}, 2, unknown)["skipped"][0]["reason"].startswith("skipped: this host shows IOMMU in translated")
    risky = d.plan("--tp 2", {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, 2, P2P_ON_TRANSLATED)
    assert [s["backend"] for s in risky["skipped"]] == ["sglang-custom-allreduce", "sglang-pcie-ipc"]
    assert "peer access reported possible, which does not cancel it" in risky["skipped"][0]["reason"]
    assert d.plan("", {}, 1, P2P_OFF)["skipped"] == []                                  # no pairs at world size 1
    with pytest.raises(ValueError, match="not one shell-quoted string"):
        d.plan("--tp 'x", {}, 2, P2P_ON)
    target = {"compute_capability": "12.0", "topology": "pcie", "world_size": 8}
    here = d.target_note({"compute_capability": "9.0", "topology": "nvlink", "world_size": 2}, target)
    assert here == {"for_target": False, "note": "measured here (SM90, nvlink, ws 2); the target is SM120, pcie, "
                                                 "ws 8: not a verdict for the target"}
    assert d.target_note({"compute_capability": "12.0", "topology": "pcie", "world_size": 8}, target)["for_target"]


# --- bad input: a clear error before any rank starts ----------------------------------------------------------------
@pytest.mark.network      # suite_venv installs torch from PyPI
def test_bad_env_and_bad_p2p_report_exit_2_before_any_rank(venv_env, tmp_path):
    py, env = venv_env
    base = [str(py), "-m", "stackprobe.runtime", "dispatch", "--device", "cpu", "--out", str(tmp_path / "o")]
    p = subprocess.run(base + ["--env", "NOEQUALS"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "write KEY=VALUE" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p = subprocess.run(base + ["--p2p-report", str(bad)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "not a P2P report" in p.stderr
    good = tmp_path / "p2p.json"
    good.write_text(json.dumps(P2P_ON))
    p = subprocess.run(base + ["--server-args", "--tp 'unclosed", "--p2p-report", str(good)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "not one shell-quoted string" in p.stderr
    assert not (tmp_path / "o" / "dispatch.json").exists()


if sys.platform != "linux":
    pytestmark = pytest.mark.skip(reason="gloo ranks over TCP and /proc on Linux")


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_in_the_static_report_a_dispatch_verdict_from_another_host_is_measured_here_not_the_targets(default_run):
    from stackprobe.report import Report
    from stackprobe.verdict import Verdict
    _, res, _ = default_run
    report = Report(target_arch="12.0", options={"topology": "pcie", "world_size": 8})
    for v in res["verdicts"]:
        report.add(Verdict.from_json(v))
    a = report.answers("sglang-custom-allreduce")
    assert [v.backend for v in a["measured_here"]] == ["sglang-custom-allreduce"] and a["runtime_target"] == []
    same = Report(target_arch="12.0", options={"topology": "none", "world_size": 2})
    v = Verdict.from_json(dict(row(res, "sglang-custom-allreduce"), host={**res["host"], "compute_capability": "12.0"}))
    same.add(v)
    assert same.answers("sglang-custom-allreduce")["runtime_target"] == [v]     # the twin: a matching host is the target's


def test_the_runtime_tier_says_why_the_dispatch_probe_did_not_run():
    import importlib.util
    from types import SimpleNamespace

    from stackprobe.runtime import run_engine_dispatch
    from stackprobe.report import Report
    r, args = Report(target_arch="12.0"), SimpleNamespace(server_args="", env=[])
    assert run_engine_dispatch(r, args, 1, "x", print).startswith("not run: world size 1")
    if importlib.util.find_spec("sglang") is None:
        assert run_engine_dispatch(r, args, 2, "x", print) == "not run: sglang is not importable here"
    assert run_engine_dispatch(r, args, 1, "x", print, engine="vllm").startswith(
        "not run: world size 1 (vLLM's all_reduce returns its input unchanged")
    if importlib.util.find_spec("vllm") is None:
        assert run_engine_dispatch(r, args, 2, "x", print, engine="vllm") == "not run: vllm is not importable here"
