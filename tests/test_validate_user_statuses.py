"""Cases C34-C38: engine answers in the words a user acts on, read from the real sglang 0.5.23 / 0.5.9 and
flashinfer-python 0.7.2 wheels from PyPI, for a given server configuration (``ctx.server_config``), plus edited
copies of them (planted faults) that flip each answer. Before this change every one of these answers read
``blocked`` (``setting`` or ``python-table``): the planted faults show each new status can fail."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from stackprobe.report import Report
from stackprobe.userwords import headline_line
from validate_support import engine_copy, evidence, suite_env, verdict

pytestmark = pytest.mark.network

FUSION = "flashinfer-allreduce-fusion"
SYMM = "torch-symm-mem"
PCIE = "flashinfer-pcie-ipc-allreduce"
PCIE_REL = "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py"
ON = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}

DRIVER = """
import json, sys
from stackprobe.static import run_static
from stackprobe.serverconfig import ServerConfig
cfg, kw = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sc = ServerConfig(args=cfg.get("args", {}), env=cfg.get("env", {}), source="test")
print(json.dumps(run_static(server_config=sc, **kw).to_json(), default=str))
"""


@pytest.fixture(scope="module")
def drive(venv, nvcc131, tmp_path_factory):
    """``drive(paths, args=..., env=..., backends=...)`` -> report dict of the static tier for 12.0, PCIe, ws 8 and
    that server configuration (the engine answers read ``ctx.server_config``)."""
    script = tmp_path_factory.mktemp("driver") / "drive.py"
    script.write_text(DRIVER)

    def run(paths, *, args=None, env=None, backends=(FUSION, SYMM, PCIE)):
        kw = {"topology": "pcie", "world_size": 8, "backends": list(backends)}
        p = subprocess.run([str(venv), str(script), json.dumps({"args": args or {}, "env": env or {}}), json.dumps(kw)],
                           capture_output=True, text=True, env=suite_env(paths, path_first=[nvcc131]), timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout)
    return run


@pytest.fixture(scope="module")
def none23(drive, sglang, fi):
    return drive([sglang, fi], backends=(FUSION, SYMM, PCIE, "sglang-custom-allreduce", "mscclpp", "b12x"))


# --- C34 -----------------------------------------------------------------------------------------------
def test_c34_pcie_ipc_is_opt_in_with_upstreams_figures_as_upstreams_claim(none23, sglang):
    v = verdict(none23, PCIE, "engine")
    assert (v["status"], v["gate"], v["lift"]) == ("opt-in", "setting", "setting")
    assert "opt-in: set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in v["cause"]
    assert evidence(v, "user setting")["value"] == "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"
    # upstream's figures, read from the installed module docstring, labelled as upstream's claim with file:lines
    claim = evidence(v, "upstream's claim: Measured on one 8x SM120 host")
    text = (sglang / PCIE_REL).read_text().splitlines()
    lo, hi = (int(x) for x in claim["source"].split(":")[1].split(" ")[0].split("-"))
    assert claim["source"].startswith(f"{PCIE_REL}:{lo}-{hi} (module docstring; upstream's claim, not measured")
    assert text[lo - 1].startswith("====") and text[hi - 1].startswith("====")
    assert claim["value"]["rows"][0] == re.split(r"\s{2,}", text[lo + 2].strip())
    assert claim["value"]["rows"][0][:3] == ["12 KiB", "5.3 us", "205.1 us"]
    assert not v["measurements"]          # never mixed with the suite's own figures
    # the image's headline names it as the path to measure, with the claim as upstream's
    line = headline_line(Report.from_json(none23))
    assert line.startswith("with no flags: a decode-step allreduce takes NCCL (pynccl)")
    assert "opt-in, worth measuring on the target: flashinfer-pcie-ipc-allreduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)" in line
    assert f"[upstream's claim ({PCIE_REL}:{lo}-{hi}), not measured here: 12 KiB: FlashInfer 5.3 us, NCCL 205.1 us" in line
    # every value of the flag reaches the uncaught raise, and 0.5.23's deprecated switch sets it to auto
    assert ("do not set: --flashinfer-allreduce-fusion-backend (any value: auto, trtllm, mnnvl, cutedsl), or the "
            "deprecated --enable-flashinfer-allreduce-fusion (it sets auto, sglang/srt/arg_groups/serving_hook.py:285-297)"
            " (flashinfer-allreduce-fusion: start-up failure)") in line


def test_c34_with_the_variable_set_it_is_on_as_configured_and_other_paths_keep_their_status(none23, drive, sglang, fi):
    r = drive([sglang, fi], env=ON, backends=(PCIE,))
    v = verdict(r, PCIE, "engine")
    assert v["status"] == "on-as-configured" and "sets SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in v["cause"]
    assert evidence(v, "TP allreduce dispatch: the path")["value"] == PCIE
    # the rest of the no-flags answers: not integrated, not installed, blocked by topology (on by default, declined)
    assert verdict(none23, "b12x", "engine")["status"] == "not-integrated"
    assert verdict(none23, "mscclpp", "engine")["status"] == "not-installed"
    car = verdict(none23, "sglang-custom-allreduce", "engine")
    assert (car["status"], car["gate"]) == ("blocked", "topology")


# --- C35 -----------------------------------------------------------------------------------------------
def test_c35_fusion_backend_flag_on_major_12_is_a_start_up_failure_naming_the_raise_and_its_call_path(none23):
    v = verdict(none23, FUSION, "engine")
    assert (v["status"], v["gate"]) == ("startup-failure-if-set", "python-table")
    assert "setting --flashinfer-allreduce-fusion-backend auto makes the server fail at start-up" in v["cause"]
    assert ("_resolve_backend raises ValueError('FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.') at "
            "sglang/srt/layers/flashinfer_comm_fusion.py:49-51") in v["cause"]
    assert "warmup -> _warmup (sglang/srt/model_executor/runner/base_runner.py:255)" in v["cause"]
    assert "_resolve_backend (sglang/srt/layers/flashinfer_comm_fusion.py:100); no try on the path catches ValueError" in v["cause"]


def test_c35_deprecated_fusion_switch_is_named_only_where_the_release_maps_it(drive, sglang, fi, tmp_path):
    """sglang 0.5.23 maps the deprecated ``--enable-flashinfer-allreduce-fusion`` onto the backend flag (``auto``):
    the same start-up failure, so "do not set" names both. Failing twin: an edited copy whose mapping no longer
    sets the backend leaves the alias out (before this reading, the alias was never named at all)."""
    rel = "sglang/srt/arg_groups/serving_hook.py"
    text = (sglang / rel).read_text()
    assert 'flashinfer_allreduce_fusion_backend="auto",' in text
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ('            flashinfer_allreduce_fusion_backend="auto",\n',
                                                      '            other_field="auto",\n')})
    edited = headline_line(Report.from_json(drive([copy, fi], backends=(FUSION,))))
    assert "do not set: --flashinfer-allreduce-fusion-backend (any value: auto, trtllm, mnnvl, cutedsl) (" in edited
    assert "deprecated" not in edited


def test_c35_planted_try_around_the_raise_turns_it_into_a_fallback(drive, sglang, fi, tmp_path):
    rel = "sglang/srt/layers/flashinfer_comm_fusion.py"
    old = "    return _resolve_backend(backend, get_parallel().nnodes > 1)\n"
    new = ("    try:\n        return _resolve_backend(backend, get_parallel().nnodes > 1)\n"
           "    except ValueError:\n        return None\n")
    copy = engine_copy(sglang, tmp_path / "sg", {rel: (old, new)})
    v = verdict(drive([copy, fi], args={"--flashinfer-allreduce-fusion-backend": "auto"}, backends=(FUSION,)),
                FUSION, "engine")
    assert v["status"] == "falls-back-if-set" and "caught at sglang/srt/layers/flashinfer_comm_fusion.py:" in v["cause"]


# --- C36 -----------------------------------------------------------------------------------------------
def test_c36_sglang_0_5_9_torch_symm_mem_is_a_start_up_failure_keyerror_12(drive, sglang059, fi):
    v = verdict(drive([sglang059, fi], args={"--enable-torch-symm-mem": True}, backends=(SYMM,)), SYMM, "engine")
    assert v["status"] == "startup-failure-if-set"
    assert "the configuration asked about sets --enable-torch-symm-mem: the server fails at start-up" in v["cause"]
    assert ("`KeyError: 12` from `TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]` at "
            "sglang/srt/distributed/device_communicators/torch_symm_mem.py:83 in TorchSymmMemCommunicator.__init__, "
            "constructed at sglang/srt/distributed/parallel_state.py:384 outside any try") in v["cause"]


def test_c36_planted_try_around_the_0_5_9_constructor_is_a_fallback(drive, sglang059, fi, tmp_path):
    rel = "sglang/srt/distributed/parallel_state.py"
    old = ("            self.torch_symm_mem_comm = TorchSymmMemCommunicator(\n                group=self.cpu_group,\n"
           "                device=self.device,\n            )\n")
    new = ("            try:\n                self.torch_symm_mem_comm = TorchSymmMemCommunicator(\n"
           "                    group=self.cpu_group,\n                    device=self.device,\n                )\n"
           "            except KeyError:\n                pass\n")
    copy = engine_copy(sglang059, tmp_path / "sg", {rel: (old, new)})
    v = verdict(drive([copy, fi], args={"--enable-torch-symm-mem": True}, backends=(SYMM,)), SYMM, "engine")
    assert v["status"] == "falls-back-if-set" and "the KeyError is caught at sglang/srt/distributed/parallel_state.py:" in v["cause"]


def test_c36_sglang_0_5_23_same_flag_falls_back_naming_the_check(none23):
    v = verdict(none23, SYMM, "engine")
    assert (v["status"], v["gate"]) == ("falls-back-if-set", "python-table")
    assert "setting --enable-torch-symm-mem is accepted, then the check TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES" in v["cause"]
    assert "stays disabled at sglang/srt/distributed/device_communicators/torch_symm_mem.py:83 `if supported_max_sizes is None" in v["cause"]
    assert "the tensor goes to NCCL (pynccl, SGLang's in-place fallback) instead" in v["cause"]


def test_c36_planted_subscript_in_0_5_23_is_a_start_up_failure(drive, sglang, fi, tmp_path):
    rel = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"
    old = "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(\n            self.device_capability\n        )"
    new = "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[\n            self.device_capability\n        ]"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: (old, new)})
    v = verdict(drive([copy, fi], backends=(SYMM,)), SYMM, "engine")
    assert v["status"] == "startup-failure-if-set" and "`KeyError: 12`" in v["cause"]


# --- C37 (the dispatch reader's preemption, as a status) ---------------------------------------------------
def test_c37_pcie_ipc_preempted_by_nccl_symmetric_memory(drive, sglang, fi):
    v = verdict(drive([sglang, fi], env=ON, args={"--enable-symm-mem": True}, backends=(PCIE,)), PCIE, "engine")
    assert v["status"] == "preempted" and v["cause"].startswith("SGLang 0.5.23: preempted by nccl-symm-mem")
    assert "sglang/srt/distributed/parallel_state.py:" in v["cause"]


# --- C38 -----------------------------------------------------------------------------------------------
def test_c38_deterministic_inference_keeps_pcie_ipc_off_and_names_nccl_tree(drive, sglang, fi):
    v = verdict(drive([sglang, fi], env=ON, args={"--enable-deterministic-inference": True}, backends=(PCIE,)),
                PCIE, "engine")
    assert (v["status"], v["gate"]) == ("falls-back-if-set", "setting")
    for cite in (f"{PCIE_REL}:111 `if deterministic: return False` in eligible_group",
                 "sglang/srt/distributed/parallel_state.py:487 eligible_group(deterministic=self._deterministic_collectives_enabled())",
                 "sglang/srt/distributed/parallel_state.py:1358 _deterministic_collectives_enabled",
                 "--enable-deterministic-inference sets SGLANG_ENABLE_DETERMINISTIC_INFERENCE (sglang/srt/arg_groups/serving_hook.py:444",
                 "NCCL_ALGO=allreduce:tree (sglang/srt/arg_groups/attention_hook.py:676)"):
        assert cite in v["cause"], cite


def test_c38_one_stage_allreduce_variable_decides_alone_when_set(drive, sglang, fi):
    v = verdict(drive([sglang, fi], env={**ON, "SGLANG_USE_1STAGE_ALLREDUCE": "1"}, backends=(PCIE,)), PCIE, "engine")
    assert v["status"] == "falls-back-if-set"
    assert "SGLANG_USE_1STAGE_ALLREDUCE=1 is set, so it decides (sglang/srt/distributed/parallel_state.py:1359)" in v["cause"]
    assert "NCCL_ALGO" not in v["cause"]          # only the deterministic-inference mode sets it
    # set to 0 it wins over the flag (is_set() first): PCIe IPC stays on
    v0 = verdict(drive([sglang, fi], env={**ON, "SGLANG_USE_1STAGE_ALLREDUCE": "0"},
                       args={"--enable-deterministic-inference": True}, backends=(PCIE,)), PCIE, "engine")
    assert v0["status"] == "on-as-configured"
