"""vLLM's own answers (issue 26), read from the real vLLM 0.33.0 and b12x 1.5.1 wheels from PyPI (with FlashInfer
0.7.2 for the PCIe IPC workspace), for the target of the product: compute capability 12.0, PCIe, world size 8.
Edited copies of the vLLM folder (``engine_copy``) plant the faults a future release could bring: a gate that moved
(an error naming vllm, its version and the file, never a pass) and a size table that gains the target's key (the
answer changes). The engine interface itself: ``--engine`` on the suite and on ``invoke validate``."""
from __future__ import annotations

import subprocess

import pytest

from validate_support import engine_copy, pip_target, run_suite, suite_env, suite_venv

pytestmark = pytest.mark.network

VLLM = "vllm==0.33.0"        # the newest vLLM on PyPI when this was written (it pins flashinfer-python==0.7.2.post1)
B12X = "b12x==1.5.1"
DC = "vllm/distributed/device_communicators"


@pytest.fixture(scope="module")
def wheels():
    return {"vllm": pip_target(VLLM), "b12x": pip_target(B12X), "fi": pip_target("flashinfer-python==0.7.2")}


@pytest.fixture(scope="module")
def real(wheels):
    """``python -m stackprobe --engine vllm`` on the real wheels (12.0, PCIe, world size 8)."""
    return run_suite(suite_venv(), [wheels["vllm"], wheels["b12x"], wheels["fi"]],
                     ["--engine", "vllm", "--topology", "pcie", "--world-size", "8"])[0]


def _v(report: dict, backend: str) -> dict:
    return next(v for v in report["verdicts"] if v["backend"] == backend and v.get("engine") == "vllm")


def _read(wheels, monkeypatch, root=None, env=None, args=None, topology="pcie", ws=8):
    """vLLM's answers in this process for ``root`` (an edited copy's ``vllm`` folder; default the wheel's)."""
    from stackprobe.archs import parse_arch
    from stackprobe.probes import Context
    from stackprobe.engines.vllm import engine as ve
    from stackprobe.serverconfig import ServerConfig

    for p in (wheels["b12x"], wheels["fi"]):
        monkeypatch.syspath_prepend(str(p))
    eng = ve.Engine("0.33.0", root or wheels["vllm"] / "vllm")
    ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, topology=topology, world_size=ws,
                  server_config=ServerConfig(args=dict(args or {}), env=dict(env or {})))
    verdicts, dispatch = ve.engine_verdicts(ctx, engine=eng)
    return {v.backend: v for v in verdicts}, dispatch


# --- the real wheels --------------------------------------------------------------------------------------------
def test_report_names_the_engine(real):
    assert [e["name"] for e in real["engines"]] == ["vllm"]
    assert real["engines"][0]["version"] == "0.33.0"
    assert real["engines"][0]["dispatch"]["vllm"] == "0.33.0" and real["engines"][0]["dispatch"]["serves"] == "nccl-ring"
    assert all(v.get("engine") == "vllm" for v in real["verdicts"] if v.get("scope") == "engine")


def test_custom_allreduce_nvlink_rule(real):
    v = _v(real, "vllm-custom-allreduce")
    assert (v["status"], v["gate"], v["lift"]) == ("blocked", "topology", "nothing-on-this-topology")
    assert f"{DC}/custom_all_reduce.py:267" in v["cause"] and "world_size > 2" in v["cause"]


def test_torch_symm_mem_table_has_no_12_0(real):
    v = _v(real, "torch-symm-mem")
    assert (v["status"], v["gate"]) == ("blocked", "python-table")      # on by default, then the table declines
    assert "no '12.0'" in v["cause"] and f"{DC}/all_reduce_utils.py:58" in v["cause"]
    assert f"{DC}/symm_mem.py:66" in v["cause"] and f"{DC}/symm_mem.py:106" in v["cause"]   # and multicast after it
    gate = next(e for e in v["evidence"] if e["what"] == "engine gate: VLLM_ALLREDUCE_USE_SYMM_MEM")
    assert gate["value"]["admits"] is True and "vllm/envs.py:1957" in gate["source"]     # default '1'


def test_nccl_symm_mem_opt_in_that_declines_the_decode_tensor(real):
    v = _v(real, "nccl-symm-mem")
    assert v["status"] == "falls-back-if-set" and "VLLM_USE_NCCL_SYMM_MEM=1" in v["cause"]
    assert "43008 bytes" in v["cause"] and "(16384, 131072)" in v["cause"] and "vllm/envs.py:2090" in v["cause"]


def test_pcie_ipc_opt_in(real):
    v = _v(real, "flashinfer-pcie-ipc-allreduce")
    assert (v["status"], v["gate"]) == ("opt-in", "setting")
    assert "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1" in v["cause"] and "vllm/envs.py:1967" in v["cause"]
    gates = {e["what"]: e for e in v["evidence"]}
    assert gates["engine gate: _SUPPORTED_WORLD_SIZES"]["value"] == {"admits": True, "value": [2, 4, 8]}
    assert gates["engine gate: _SUPPORTED_DTYPES"]["value"]["value"] == ["bfloat16", "float16"]
    assert gates["engine gate: flashinfer.comm.PcieIpcAllReduceWorkspace"]["value"]["admits"] is True


def test_flashinfer_allreduce_and_fusion_pass_table_has_no_120(real):
    fi, fusion = _v(real, "flashinfer-allreduce"), _v(real, "flashinfer-allreduce-fusion")
    assert (fi["status"], fi["gate"]) == ("blocked", "python-table")        # VLLM_ALLREDUCE_USE_FLASHINFER: default 1
    # off by default for 12.0; the size table declines it, and the override that replaces the table is one more opt-in
    # (issue 39 point 9: past the table FlashInfer's trtllm workspace admits major 12 and a failure is caught)
    assert fusion["status"] == "opt-in"
    for v in (fi, fusion):
        assert "no 120" in v["cause"] and "vllm/compilation/passes/fusion/allreduce_rms_fusion.py:104" in v["cause"]
    assert "vllm/config/vllm.py:179" in fusion["cause"] and "fuse_allreduce_rms" in fusion["cause"]
    # the standalone path is cited at the default-table read that decides it (not FlashInferAllReduce.__init__ at
    # :394), and the pass-config override is said not to reach it (from the review against the wheel)
    assert "flashinfer_all_reduce.py:420, reading only the default table" in fi["cause"]
    assert "flashinfer_all_reduce.py:394" not in fi["cause"]


def test_quick_allreduce_rocm_only_all2all_b12x(real):
    q = _v(real, "quick-allreduce")
    assert q["status"] == "not-integrated" and "only on ROCm" in q["cause"] and "cuda_communicator.py:185" in q["cause"]
    a = _v(real, "ep-flashinfer-a2a")
    assert (a["status"], a["gate"]) == ("opt-in", "setting") and "is not read here (runtime)" in a["cause"]
    b = _v(real, "b12x")
    assert b["status"] == "not-integrated" and "b12x_fp6 = b12x.integration.vllm.plugin:register_b12x_fp6" in b["cause"]


def test_headline_and_markdown_name_vllm(wheels):
    venv = suite_venv()
    p = subprocess.run([str(venv), "-m", "stackprobe", "--engine", "vllm", "--quiet", "--markdown", "-"],
                       capture_output=True, text=True, timeout=600,
                       env=suite_env([wheels["vllm"], wheels["b12x"], wheels["fi"]]))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "**What vLLM does here**: with no flags: a decode-step allreduce takes NCCL" in p.stdout
    assert "flashinfer-pcie-ipc-allreduce (VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1)" in p.stdout
    assert "| vLLM 0.33.0 will enable it here |" in p.stdout and "## vLLM's dispatch for a decode allreduce" in p.stdout


# --- configurations asked about --------------------------------------------------------------------------------
def test_pcie_ipc_set_serves_the_decode_tensor(wheels, monkeypatch):
    got, d = _read(wheels, monkeypatch, env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"})
    assert got["flashinfer-pcie-ipc-allreduce"].status == "on-as-configured"
    assert d["serves"] == "flashinfer-pcie-ipc-allreduce"
    off, d0 = _read(wheels, monkeypatch)
    assert off["flashinfer-pcie-ipc-allreduce"].status == "opt-in" and d0["serves"] == "nccl-ring"


def test_symm_mem_variable_set_to_zero_turns_it_off(wheels, monkeypatch):
    got, _ = _read(wheels, monkeypatch, env={"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"})
    v = got["torch-symm-mem"]
    assert v.status == "blocked" and v.gate == "setting" and "VLLM_ALLREDUCE_USE_SYMM_MEM=0" in v.cause


def test_disable_custom_all_reduce_flag(wheels, monkeypatch):
    from stackprobe.engines.vllm import engine as ve
    from stackprobe.engines.sglang.flags import ConfigError

    eng = ve.Engine("0.33.0", wheels["vllm"] / "vllm")
    cfg = ve.parse_config("--disable-custom-all-reduce", [], eng)
    assert cfg.args == {"--disable-custom-all-reduce": True}
    with pytest.raises(ConfigError, match="--enable-symm-mem is not a server argument of the installed vllm 0.33.0"):
        ve.parse_config("--enable-symm-mem", [], eng)          # SGLang's flag, not vLLM's
    got, _ = _read(wheels, monkeypatch, args=cfg.args, topology="nvlink")
    assert got["vllm-custom-allreduce"].gate == "setting"    # on NVLink only the flag closes it


# --- edited copies: planted faults -------------------------------------------------------------------------------
def _copy(wheels, tmp_path, rel, old, new):
    return engine_copy(wheels["vllm"], tmp_path / "vllm-copy", {rel: (old, new)}) / "vllm"


def test_symm_mem_table_gaining_12_0_changes_the_answer(wheels, monkeypatch, tmp_path):
    root = _copy(wheels, tmp_path, f"{DC}/all_reduce_utils.py", 'SYMM_MEM_ALL_REDUCE_MAX_SIZES = {\n',
                 'SYMM_MEM_ALL_REDUCE_MAX_SIZES = {\n    "12.0": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},\n')
    pcie, _ = _read(wheels, monkeypatch, root=root)
    v = pcie["torch-symm-mem"]
    assert (v.status, v.gate) == ("blocked", "topology")      # past the table, multicast closes it on PCIe
    nvl, d = _read(wheels, monkeypatch, root=root, topology="nvlink")
    assert nvl["torch-symm-mem"].status == "preempted"        # on NVLink it is on, behind vLLM's custom allreduce
    assert d["serves"] == "vllm-custom-allreduce"
    real_nvl, _ = _read(wheels, monkeypatch, topology="nvlink")
    assert real_nvl["torch-symm-mem"].gate == "python-table"  # the wheel as shipped: the table still decides


@pytest.mark.parametrize("rel,old,new,backend,names", [
    (f"{DC}/all_reduce_utils.py", "SYMM_MEM_ALL_REDUCE_MAX_SIZES = {", "SYMM_MEM_SIZES = {", "torch-symm-mem",
     "all_reduce_utils.py"),
    (f"{DC}/symm_mem.py", "if handle.multicast_ptr == 0:", "if not handle.multicast_ptr:", "torch-symm-mem",
     "symm_mem.py"),
    (f"{DC}/custom_all_reduce.py", "if same_node and world_size > 2 and not fully_connected:",
     "if same_node and world_size > 2 and not all_linked:", "vllm-custom-allreduce", "custom_all_reduce.py"),
    ("vllm/envs.py", '"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": lambda', '"VLLM_FLASHINFER_PCIE_IPC": lambda',
     "flashinfer-pcie-ipc-allreduce", "envs.py"),
    (f"{DC}/flashinfer_pcie_ipc_all_reduce.py", "_SUPPORTED_WORLD_SIZES = (2, 4, 8)", "_WORLD_SIZES = (2, 4, 8)",
     "flashinfer-pcie-ipc-allreduce", "flashinfer_pcie_ipc_all_reduce.py"),
    ("vllm/compilation/passes/fusion/allreduce_rms_fusion.py", "FI_ALLREDUCE_FUSION_MAX_SIZE_MB: dict",
     "FI_AR_MAX_MB: dict", "flashinfer-allreduce", "allreduce_rms_fusion.py"),
    (f"{DC}/cuda_communicator.py", "self.qr_comm = QuickAllReduce(", "self.qr_comm = make_quick_reduce(",
     "quick-allreduce", "cuda_communicator.py"),
])
def test_a_moved_gate_is_an_error_naming_vllm_and_the_file(wheels, monkeypatch, tmp_path, rel, old, new, backend,
                                                            names):
    rel_in = rel.removeprefix("vllm/")
    root = engine_copy(wheels["vllm"], tmp_path / "vllm-copy", {rel: (old, new)}) / "vllm"
    assert (root / rel_in).read_text().count(new) >= 1
    got, _ = _read(wheels, monkeypatch, root=root)
    v = got[backend]
    assert v.status == "error", (v.status, v.cause)
    assert "vllm 0.33.0" in v.cause and names in v.cause


def test_a_moved_dispatch_step_fails_closed(wheels, monkeypatch, tmp_path):
    root = _copy(wheels, tmp_path, f"{DC}/cuda_communicator.py", "return fi_pcie_ipc_ar_comm.all_reduce(input_)",
                 "return fi_pcie_ipc_ar_comm.reduce(input_)")
    got, d = _read(wheels, monkeypatch, root=root, env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"})
    v = got["flashinfer-pcie-ipc-allreduce"]
    assert v.status == "error" and "no longer calls fi_pcie_ipc_ar_comm.all_reduce" in v.cause
    assert "error" in d


# --- the interface ------------------------------------------------------------------------------------------------
def test_engine_choice(wheels):
    from stackprobe.engines import EngineChoiceError, select

    assert [e.name for e in select("vllm")] == ["vllm"] and [e.name for e in select("sglang")] == ["sglang"]
    with pytest.raises(EngineChoiceError, match="use one of auto, sglang, vllm"):
        select("trtllm")
    p = subprocess.run([str(suite_venv()), "-m", "stackprobe", "--engine", "trtllm", "--quiet"], capture_output=True,
                       text=True, timeout=300, env=suite_env([wheels["vllm"]]))
    assert p.returncode == 2 and "--engine 'trtllm'" in p.stderr


def test_auto_gives_both_when_both_are_installed(wheels):
    both, _ = run_suite(suite_venv(), [wheels["vllm"], wheels["b12x"], wheels["fi"], pip_target("sglang==0.5.23")],
                        ["--backend", "torch-symm-mem"])
    assert [e["name"] for e in both["engines"]] == ["sglang", "vllm"]
    eng = {v["engine"]: v for v in both["verdicts"] if v["backend"] == "torch-symm-mem" and v["scope"] == "engine"}
    assert set(eng) == {"sglang", "vllm"} and eng["vllm"]["status"] == "blocked"
    assert eng["sglang"]["status"] == "falls-back-if-set"     # SGLang 0.5.23's answer, unchanged by the interface


def test_invoke_passes_engine_through():
    from cudastack.jobs.validate import suite_args

    assert suite_args("12.0", engine="vllm")[-2:] == ["--engine", "vllm"]
    assert "--engine" not in suite_args("12.0")


# --- review of the committed report (issue 26d) -----------------------------------------------------------------
def test_all2all_is_opt_in_needing_ep_dp_and_backend(wheels, monkeypatch):
    got, _ = _read(wheels, monkeypatch)
    a = got["ep-flashinfer-a2a"]
    assert (a.status, a.gate, a.lift) == ("opt-in", "setting", "setting"), a.cause
    assert "the PCIe outcome of flashinfer_all2allv, flashinfer_nvlink_two_sided is not read here (runtime)" in a.cause
    assert "vllm/config/parallel.py:790" in a.cause and "parallel_state.py:2339" in a.cause
    assert "fused_moe/config.py:1037" in a.cause
    for flag in ("--enable-expert-parallel", "--data-parallel-size 2", "--all2all-backend flashinfer_nvlink_two_sided"):
        assert flag in a.lift_detail
    ev = {e.what: e for e in a.evidence}
    assert "all2all.py:679" in ev["MNNVL transport import (inside the manager's initialize(), not a check)"].source
    one, _ = _read(wheels, monkeypatch, args={"--enable-expert-parallel": True,
                                              "--all2all-backend": "flashinfer_nvlink_two_sided"})
    assert one["ep-flashinfer-a2a"].status == "opt-in" and "--data-parallel-size 2" in one["ep-flashinfer-a2a"].cause
    all3, _ = _read(wheels, monkeypatch, args={"--enable-expert-parallel": True, "--data-parallel-size": "2",
                                               "--all2all-backend": "flashinfer_nvlink_two_sided"})
    assert all3["ep-flashinfer-a2a"].status == "on-as-configured"


def test_fusion_pass_lift_names_the_size_override(wheels, monkeypatch):
    flag = {"--compilation-config": '{"pass_config": {"fuse_allreduce_rms": true}}'}
    got, _ = _read(wheels, monkeypatch, args=flag)
    v = got["flashinfer-allreduce-fusion"]
    assert v.status == "opt-in" and v.lift == "setting"          # issue 39 point 9: the override is an opt-in
    assert '"fi_allreduce_fusion_max_size_mb": N' in v.lift_detail and "past the size table" in v.lift_detail
    assert "vllm/config/compilation.py:162" in v.lift_detail and "vllm/config/compilation.py:191" in v.lift_detail
    over, _ = _read(wheels, monkeypatch, args={"--compilation-config": '{"pass_config": {"fuse_allreduce_rms": true, '
                                                                       '"fi_allreduce_fusion_max_size_mb": 4}}'})
    o = over["flashinfer-allreduce-fusion"]
    assert o.status == "on-as-configured" and any("past the size table" in w for w in o.warnings)


def test_point9_fusion_override_reaches_a_trtllm_workspace_that_admits_12_and_is_caught(wheels, monkeypatch, tmp_path):
    """Issue 39 point 9. Before: the override was only a "lift" of a falls-back-if-set answer. On one node the pass
    reaches FlashInfer's mnnvl workspace, then trtllm (flashinfer_all_reduce.py:157-163, :226-232), FlashInfer's
    gen_trtllm_comm_module admits major 12, and a failed workspace is recorded, not raised: an opt-in to measure, with
    the caveat of every peer written at once over PCIe. Twin: a copy where the failure is no longer recorded as
    caught keeps the old answer (falls back if set)."""
    got, _ = _read(wheels, monkeypatch)
    v = got["flashinfer-allreduce-fusion"]
    # one --compilation-config, the one that carries both keys: given twice, argparse keeps only the last
    setting = next(e.value for e in v.evidence if e.what == "user setting")
    assert setting == ('--compilation-config \'{"pass_config": {"fuse_allreduce_rms": true, '
                       '"fi_allreduce_fusion_max_size_mb": N}}\''), setting
    ev = next(e for e in v.evidence if e.what.startswith("past the size table"))
    assert ev.value["admits"] is True and 12 in ev.value["majors"]
    assert "flashinfer_all_reduce.py:157-163" in ev.source or "flashinfer_all_reduce.py:15" in ev.source
    assert "writes to every peer at once" in v.cause
    root = _copy(wheels, tmp_path, f"{DC}/flashinfer_all_reduce.py", "_fi_ar_workspace_failed = True",
                 "_fi_ar_workspace_failed = bool(1)")
    twin, _ = _read(wheels, monkeypatch, root=root)
    assert twin["flashinfer-allreduce-fusion"].status == "falls-back-if-set"


FI_BACKEND = "VLLM_FLASHINFER_ALLREDUCE_BACKEND"
FUSION = "flashinfer-allreduce-fusion"


def test_review11_fusion_names_the_backend_variable_and_sizes_n_from_the_workload(wheels, monkeypatch):
    """Review item 11. Before: VLLM_FLASHINFER_ALLREDUCE_BACKEND (envs.py:1811) was listed as not assessed although
    any explicit value returns (backend, False) at flashinfer_all_reduce.py:154 (no trtllm fallback), and N of
    fi_allreduce_fusion_max_size_mb had no guidance. Now the caveat is read from the source, =mnnvl on PCIe is a
    silent fall-back, =trtllm stays an opt-in, and N is stated from the workload preset (hidden 7168 bf16)."""
    got, _ = _read(wheels, monkeypatch)
    v = got[FUSION]
    assert v.status == "opt-in"
    assert (f"{FI_BACKEND} (vllm/envs.py:1811, default 'auto', choices ['auto', 'trtllm', 'mnnvl']) sits on this "
            f"path: any value but auto returns (backend, False) at {DC}/flashinfer_all_reduce.py:154") in v.cause
    assert "=mnnvl on PCIe leaves the pass unfused (a silent fall-back), =trtllm skips the MNNVL attempt" in v.cause
    words = ("one decode row at hidden 7168 bfloat16 is 14,336 B, so N MB covers N x 1048576 / 14,336 rows "
             "(73 rows per MB; N=1 covers 73 rows); the captured decode widths reach 512 rows")
    assert words in v.cause and "which N=7 covers" in v.cause and words in v.lift_detail
    assert f"do not set {FI_BACKEND}=mnnvl on PCIe" in v.lift_detail
    mn, _ = _read(wheels, monkeypatch, env={FI_BACKEND: "mnnvl"})
    assert (mn[FUSION].status, mn[FUSION].gate) == ("falls-back-if-set", "topology")
    assert f"{FI_BACKEND}=mnnvl (no trtllm fallback) declines" in mn[FUSION].cause
    tr, _ = _read(wheels, monkeypatch, env={FI_BACKEND: "trtllm"})
    assert tr[FUSION].status == "opt-in"
    nv, _ = _read(wheels, monkeypatch, env={FI_BACKEND: "mnnvl"}, topology="nvlink")
    assert nv[FUSION].status != "falls-back-if-set"


def test_review11_twin_a_backend_that_keeps_the_fallback_and_another_workload(wheels, monkeypatch, tmp_path):
    """The twins: a copy where an explicit value keeps the trtllm fallback (returns (backend, True)) loses the caveat
    and =mnnvl on PCIe is no longer a fall-back; a workload of hidden 4096 moves the rows per MB (not hard-coded)."""
    root = _copy(wheels, tmp_path, f"{DC}/flashinfer_all_reduce.py",
                 'logger.debug_once("Using flashinfer allreduce backend: %s", backend)\n        return backend, False',
                 'logger.debug_once("Using flashinfer allreduce backend: %s", backend)\n        return backend, True')
    got, _ = _read(wheels, monkeypatch, root=root, env={FI_BACKEND: "mnnvl"})
    assert got[FUSION].status != "falls-back-if-set" and "no trtllm fallback" not in got[FUSION].cause
    from stackprobe.engines.vllm import engine as ve
    from stackprobe.engines.sglang.dispatch import DecodeTensor
    monkeypatch.setattr(ve, "decode_tensor", lambda: DecodeTensor(hidden=4096))
    small, _ = _read(wheels, monkeypatch)
    assert "hidden 4096 bfloat16 is 8,192 B" in small[FUSION].cause and "128 rows per MB" in small[FUSION].cause
    assert "which N=4 covers" in small[FUSION].cause


def test_fusion_override_gone_is_an_error(wheels, monkeypatch, tmp_path):
    root = _copy(wheels, tmp_path, "vllm/config/compilation.py", "max_size_mb = self.fi_allreduce_fusion_max_size_mb",
                 "max_size_mb = None")
    got, _ = _read(wheels, monkeypatch, root=root)
    v = got["flashinfer-allreduce-fusion"]
    assert v.status == "error" and "vllm 0.33.0" in v.cause and "compilation.py" in v.cause


def test_all2all_dp_rule_gone_is_an_error(wheels, monkeypatch, tmp_path):
    root = _copy(wheels, tmp_path, "vllm/config/parallel.py", "            self.data_parallel_size > 1\n            or",
                 "            self.data_parallel_size > 0\n            or")
    got, _ = _read(wheels, monkeypatch, root=root)
    v = got["ep-flashinfer-a2a"]
    assert v.status == "error" and "vllm 0.33.0" in v.cause and "parallel.py" in v.cause


def test_dispatch_carries_the_configuration(wheels, monkeypatch):
    _, d = _read(wheels, monkeypatch, env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"})
    assert d["config"]["describe"] == "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1"
    from stackprobe.report import dispatch_markdown
    assert "(vllm 0.33.0, VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1)" in dispatch_markdown(d)[1]


def test_pcie_ipc_setup_catches_nothing(wheels, monkeypatch, tmp_path):
    got, _ = _read(wheels, monkeypatch)
    v = got["flashinfer-pcie-ipc-allreduce"]
    assert "catches nothing" in v.cause and "stops start-up" in v.cause
    assert f"{DC}/flashinfer_pcie_ipc_all_reduce.py:127" in v.cause and "kernel_warmup.py:263" in v.cause
    root = _copy(wheels, tmp_path, "vllm/model_executor/warmup/kernel_warmup.py",
                 "        flashinfer_pcie_ipc_all_reduce.warmup_flashinfer_pcie_ipc_allreduce(worker)\n",
                 "        try:\n            flashinfer_pcie_ipc_all_reduce.warmup_flashinfer_pcie_ipc_allreduce(worker)\n"
                 "        except Exception:\n            pass\n")
    caught, _ = _read(wheels, monkeypatch, root=root)
    assert caught["flashinfer-pcie-ipc-allreduce"].status == "error"
    assert "kernel_warmup.py" in caught["flashinfer-pcie-ipc-allreduce"].cause


def test_one_sided_all2all_is_a_start_up_failure_on_pcie_not_an_alternative(wheels, monkeypatch, tmp_path):
    """From the fresh review: vLLM's flashinfer_nvlink_one_sided goes through flashinfer.moe_ep, whose
    mnnvl_mapping_and_config raises RuntimeError on every rank without NVLink (nvlink_common.py:86 in 0.7.2)."""
    got, _ = _read(wheels, monkeypatch)
    a = got["ep-flashinfer-a2a"]
    assert "flashinfer_nvlink_one_sided is a start-up failure without NVLink" in a.cause
    assert "nvlink_common.py:86 `raise RuntimeError(...)`" in a.cause
    assert "one_sided" not in a.lift_detail                 # not offered as an alternative on PCIe
    ev = {e.what: e for e in a.evidence}
    assert ev["flashinfer_nvlink_one_sided set-up: FlashInfer's NVLink check (raises, vLLM does not catch it)"].value is True
    nv, _ = _read(wheels, monkeypatch, topology="nvlink")
    assert "flashinfer_nvlink_one_sided" in nv["ep-flashinfer-a2a"].lift_detail   # on NVLink it stays an option
    # failing twin: a FlashInfer copy whose check no longer raises -> nothing is said of one-sided
    rel = "flashinfer/moe_ep/backends/split/comm/nvlink_common.py"
    src = (wheels["fi"] / rel).read_text()
    raised = src[src.index("        raise RuntimeError("):src.index("        )", src.index("        raise RuntimeError(")) + 10]
    edited = engine_copy(wheels["fi"], tmp_path / "fi", {rel: (raised, "        pass\n")})
    monkeypatch.setitem(wheels, "fi", edited)
    quiet, _ = _read(wheels, monkeypatch)
    q = quiet["ep-flashinfer-a2a"]
    assert "start-up failure" not in q.cause and "flashinfer_nvlink_one_sided" in q.lift_detail


def test_a_flag_two_gates_set_is_typed_once_with_the_last_value_and_distinct_flags_all_stay():
    """The user setting of an opt-in path (``sglang_engine._flags``): the same flag from two gates is written once,
    with the later gate's value (argparse keeps the last of a repeated flag); twin: distinct flags and variables are
    all kept, in path order."""
    from stackprobe.engines.sglang.engine import Gate, _flags

    a = Gate("a", False, "x", flag="--compilation-config", set_to="'{\"k\": 1}'")
    b = Gate("b", False, "x", flag="--compilation-config", set_to="'{\"k\": 1, \"n\": 2}'")
    assert _flags([a, b]) == "--compilation-config '{\"k\": 1, \"n\": 2}'"
    c = Gate("c", False, "x", flag="--enable-expert-parallel")
    d = Gate("d", False, "x", flag="VLLM_X")
    assert _flags([c, a, d]) == "--enable-expert-parallel, --compilation-config '{\"k\": 1}', VLLM_X=1"
