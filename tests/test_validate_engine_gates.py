"""Cases C13-C18: the engine's answer, read from the real SGLang 0.5.23 wheel's source (and FlashInfer 0.7.2
for the library's answer), plus edited copies of it for the future-release cases (C14: the size table gains key
12; C17: gates that moved). Every engine gate also has a test that shows it failing closed: an error naming
the package, its version and the file, never gate-passes."""
from __future__ import annotations

import pytest

from validate_support import engine_copy, evidence, pip_target, run_suite, verdict

pytestmark = pytest.mark.network

FUSION = "flashinfer-allreduce-fusion"
SYMM = "torch-symm-mem"
CAR = "sglang-custom-allreduce"
PCIE = "flashinfer-pcie-ipc-allreduce"
MSCCLPP = "mscclpp"
COMM = "sglang/srt/distributed/device_communicators"
MSCCLPP_REL = "srt/distributed/device_communicators/pymscclpp.py"
# what a default-off flag reads as, by what setting it does on the target (schema 3; schema 2 said blocked (setting))
OFF_BY_DEFAULT = ("opt-in", "falls-back-if-set", "startup-failure-if-set", "not-installed")


@pytest.fixture(scope="module")
def real(venv, sglang, fi, nvcc131):
    """The target of the product: 12.0 on PCIe at world size 8, SGLang 0.5.23 and FlashInfer 0.7.2."""
    return run_suite(venv, [sglang, fi], ["--topology", "pcie", "--world-size", "8"], path_first=[nvcc131])[0]


def _engine_cites(v: dict, *needles: str) -> None:
    for n in needles:
        assert n in v["cause"], f"{n!r} not in {v['cause']!r}"


# --- C13 ---------------------------------------------------------------------------------------------
def test_c13_fusion_engine_answer_cites_sglangs_own_gates(real):
    lib, eng = verdict(real, FUSION, "library"), verdict(real, FUSION, "engine")
    assert lib["status"] == "gate-passes"                     # FlashInfer 0.7.2 admits major 12 ...
    assert eng["status"] == "startup-failure-if-set"          # ... SGLang 0.5.23 raises at start-up if set (C35)
    # first on SGLang's path: its platform check, read from the installed source (majors 9 and 10)
    plat = evidence(eng, "engine gate: platform check")
    assert plat["value"]["admits"] is False and plat["value"]["value"]["majors"] == [9, 10]
    assert plat["value"]["value"]["raises"].startswith("ValueError(")
    assert plat["source"].startswith("sglang/srt/layers/flashinfer_comm_fusion.py:") and "_resolve_backend" in plat["source"]
    assert eng["gate"] == "python-table"
    # and the multicast preflight, which nothing on PCIe lifts: the lift is the hardest of the two
    pre = evidence(eng, "engine gate: workspace preflight (multicast)")
    assert pre["value"]["admits"] is False and "_flashinfer_trtllm_workspace_allocation_sizes" in pre["source"]
    _engine_cites(eng, "cuMulticastGetGranularity", "CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0", "_resolve_backend")
    # the preflight is SGLang's code (FlashInfer 0.7.2's trtllm workspace is built without multicast): an sglang upgrade
    assert eng["lift"] == "package-upgrade"
    assert "an sglang release whose fusion workspace preflight does not require multicast" in eng["lift_detail"]
    assert "enable_multicast=False at flashinfer/comm/trtllm_ar.py:514" in eng["lift_detail"]
    arg = evidence(eng, "engine gate: server argument")
    assert arg["source"].startswith("sglang/srt/arg_groups/fields/exec_.py:770 ExecComm.flashinfer_allreduce_fusion_backend")
    assert "sglang/srt/arg_groups/arg_utils.py:290" in arg["source"]
    assert arg["value"]["value"].startswith("--flashinfer-allreduce-fusion-backend (default None")
    assert eng["scope"] == "engine" and eng["host"]["topology"] == "pcie" and eng["host"]["world_size"] == 8


def test_c13_on_an_admitted_arch_the_preflight_alone_blocks_on_pcie_and_passes_on_nvlink(venv, sglang, fi, nvcc131):
    r = run_suite(venv, [sglang, fi], ["--backend", FUSION, "--target-arch", "9.0", "--topology", "pcie"],
                  path_first=[nvcc131])[0]
    v = verdict(r, FUSION, "engine")
    assert v["status"] == "falls-back-if-set" and v["gate"] == "topology" and v["lift"] == "package-upgrade"
    _engine_cites(v, "flashinfer_comm_fusion.py:300 _flashinfer_trtllm_workspace_allocation_sizes")
    r = run_suite(venv, [sglang, fi], ["--backend", FUSION, "--target-arch", "9.0", "--topology", "nvlink"],
                  path_first=[nvcc131])[0]
    # every gate past the flag admits 9.0 on NVLink; the flag is still off by default: blocked (setting), the flag the lift
    v = verdict(r, FUSION, "engine")
    assert v["status"] == "opt-in" and v["gate"] == "setting" and v["lift"] == "setting"
    assert v["lift_detail"] == "--flashinfer-allreduce-fusion-backend auto (off by default in sglang 0.5.23)"


def test_c13_fails_closed_when_the_platform_checks_moved(venv, sglang, tmp_path):
    rel = "sglang/srt/layers/flashinfer_comm_fusion.py"
    per_call = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("def _resolve_backend(", "def _resolve_fusion_backend("),
                                                 per_call: ("def flashinfer_ar_fusion_applies(", "def fusion_applies(")})
    v = verdict(run_suite(venv, [copy], ["--backend", FUSION])[0], FUSION, "engine")
    assert v["status"] == "error"
    assert v["cause"].startswith(f"gate not found in sglang 0.5.23 at {rel}: neither a platform check in _resolve_backend")
    # one of the two is enough to decide
    copy2 = engine_copy(sglang, tmp_path / "sg2", {rel: ("def _resolve_backend(", "def _resolve_fusion_backend(")})
    v2 = verdict(run_suite(venv, [copy2], ["--backend", FUSION])[0], FUSION, "engine")
    assert v2["status"] == "falls-back-if-set" and "flashinfer_ar_fusion_applies admits majors [9, 10]" in v2["cause"]


def test_c13_sglang_0_5_9_per_call_check_and_no_multicast_preflight(venv, fi, nvcc131):
    v = verdict(run_suite(venv, [pip_target("sglang==0.5.9"), fi], ["--backend", FUSION], path_first=[nvcc131])[0],
                FUSION, "engine")
    assert v["status"] == "falls-back-if-set" and v["gate"] == "python-table"
    assert "sglang/srt/layers/communicator.py:91 apply_flashinfer_allreduce_fusion" in v["cause"]
    pre = evidence(v, "engine gate: workspace preflight (multicast)")
    assert pre["value"] == {"admits": True, "value": "none in this release: it builds the older CUDA-IPC workspace"}


def test_c13_fails_closed_when_the_preflight_is_gone(venv, sglang, tmp_path):
    rel = "sglang/srt/layers/flashinfer_comm_fusion.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("cuda_driver.cuMulticastGetGranularity(", "cuda_driver.cuGranularity(")})
    v = verdict(run_suite(venv, [copy], ["--backend", FUSION, "--target-arch", "9.0"])[0], FUSION, "engine")
    assert v["status"] == "error" and "sglang 0.5.23" in v["cause"] and rel in v["cause"]
    assert "cuMulticastGetGranularity" in v["cause"] and "unified (multicast) workspace" in v["cause"]


# --- C11 / C14 ---------------------------------------------------------------------------------------
def test_c11_c14_symm_mem_engine_answer_on_the_real_release(real):
    lib, eng = verdict(real, SYMM, "library"), verdict(real, SYMM, "engine")
    assert lib["status"] == "gate-passes"                      # torch has the ops
    assert eng["status"] == "falls-back-if-set" and eng["gate"] == "python-table"
    keys = evidence(eng, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys")
    assert keys["value"] == {"admits": False, "value": [9, 10]}
    assert keys["source"].startswith(f"{COMM}/all_reduce_utils.py:3 (ast); lookup get at {COMM}/torch_symm_mem.py:80")
    mc = evidence(eng, "engine gate: multicast pointer check")
    assert mc["value"]["admits"] is False and mc["source"].startswith(f"{COMM}/torch_symm_mem.py:116")
    assert eng["lift"] == "nothing-on-this-topology"


@pytest.fixture(scope="module")
def sglang_key12(sglang, tmp_path_factory):
    rel = f"{COMM}/all_reduce_utils.py"
    return engine_copy(sglang, tmp_path_factory.mktemp("key12") / "sg", {rel: (
        "    10: {\n", "    12: {\n        2: 64 * MiB,\n        4: 64 * MiB,\n        8: 64 * MiB,\n    },\n    10: {\n")})


def test_c14_a_table_with_key_12_is_still_blocked_by_multicast_on_pcie(venv, sglang_key12):
    v = verdict(run_suite(venv, [sglang_key12], ["--backend", SYMM])[0], SYMM, "engine")
    assert evidence(v, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys")["value"] == {"admits": True, "value": [9, 10, 12]}
    assert v["status"] == "falls-back-if-set" and v["gate"] == "topology" and v["lift"] == "nothing-on-this-topology"
    assert "multicast" in v["cause"] and "multicast_ptr == 0" in evidence(v, "engine gate: multicast pointer check")["source"]
    assert "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES" in v["lift_detail"] and "multicast" in v["lift_detail"]   # both named
    # on NVLink (multicast) every gate of the same copy admits but its default-off flag, and at a world size the
    # table lacks it blocks again
    nv = verdict(run_suite(venv, [sglang_key12], ["--backend", SYMM, "--topology", "nvlink"])[0], SYMM, "engine")
    assert nv["status"] == "opt-in" and nv["gate"] == "setting" and nv["lift"] == "setting"
    assert nv["lift_detail"] == "--enable-torch-symm-mem (off by default in sglang 0.5.23)"
    v6 = verdict(run_suite(venv, [sglang_key12], ["--backend", SYMM, "--topology", "nvlink", "--world-size", "6"])[0],
                 SYMM, "engine")
    assert v6["status"] == "blocked" and "world size 6" in v6["cause"]     # what SGLang does there is not read


def test_c17_symm_mem_table_moved_into_a_class_is_an_error(venv, sglang, tmp_path):
    rel = f"{COMM}/all_reduce_utils.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {",
                                                       "class Sizes:\n  TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {")})
    v = verdict(run_suite(venv, [copy], ["--backend", SYMM])[0], SYMM, "engine")
    assert v["status"] == "error"
    assert v["cause"].startswith("gate not found in sglang 0.5.23 at sglang/srt: no module-level TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")


def test_c17_symm_mem_multicast_check_gone_is_an_error(venv, sglang_key12, tmp_path):
    rel = f"{COMM}/torch_symm_mem.py"
    copy = engine_copy(sglang_key12, tmp_path / "sg", {rel: ("handle.multicast_ptr == 0", "handle is None")})
    v = verdict(run_suite(venv, [copy], ["--backend", SYMM])[0], SYMM, "engine")
    assert v["status"] == "error" and f"at {rel}" in v["cause"] and "multicast_ptr" in v["cause"]


# --- custom allreduce (C17) ----------------------------------------------------------------------
def test_custom_allreduce_engine_rule_and_its_per_call_twin(real):
    eng = verdict(real, CAR, "engine")
    rule = evidence(eng, "engine gate: PCIe world-size rule")
    assert rule["value"] == {"admits": False, "value": "disabled when world_size > 2 without full NVLink"}
    assert rule["source"].startswith(f"{COMM}/custom_all_reduce_utils.py:492")
    assert eng["status"] == "blocked" and eng["gate"] == "topology" and eng["lift"] == "nothing-on-this-topology"
    assert "should_custom_ar" in eng["cause"]


def test_c17_custom_allreduce_rule_written_with_self_world_size_is_an_error(venv, sglang, tmp_path):
    rel = f"{COMM}/custom_all_reduce_utils.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("if world_size > 2 and not full_nvlink:",
                                                       "if self.world_size > 2 and not full_nvlink:")})
    v = verdict(run_suite(venv, [copy], ["--backend", CAR])[0], CAR, "engine")
    assert v["status"] == "error"
    assert v["cause"].startswith("gate not found in sglang 0.5.23 at sglang/srt/distributed: no `world_size > N and not full_nvlink` rule")


# --- C15 -------------------------------------------------------------------------------------------
def test_c15_mscclpp_without_the_standalone_package_is_not_installed_whatever_sgl_kernel_carries(real):
    eng, lib = verdict(real, MSCCLPP, "engine"), verdict(real, MSCCLPP, "library")
    assert eng["status"] == "not-installed" and eng["gate"] == "not-installed" and "not installed: mscclpp" in eng["cause"]
    imp = evidence(eng, "engine gate: import mscclpp")
    assert imp["value"] == {"admits": False, "value": "not importable"}
    assert imp["source"].startswith(f"{COMM}/pymscclpp.py:1048 (ImportError caught at :1051")
    assert lib["status"] == "skipped" and lib["gate"] == "not-installed"


def test_c15_an_importable_mscclpp_opens_that_gate(venv, sglang, tmp_path):
    fake = tmp_path / "mscclpp_pkg"
    (fake / "mscclpp").mkdir(parents=True)
    (fake / "mscclpp" / "__init__.py").write_text("")
    v = verdict(run_suite(venv, [sglang, fake], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    assert evidence(v, "engine gate: import mscclpp")["value"]["admits"] is True
    # world size 8 is in (4, 8, 16, 32, 64): only the default-off flag is left
    assert v["status"] == "opt-in" and v["gate"] == "setting" and v["lift_detail"].startswith("--enable-mscclpp (off by default")
    v2 = verdict(run_suite(venv, [sglang, fake], ["--backend", MSCCLPP, "--world-size", "2"])[0], MSCCLPP, "engine")
    assert v2["status"] == "blocked" and "not 2" in v2["cause"]          # what SGLang does there is not read


def test_c15_fails_closed_when_the_guarded_import_is_gone(venv, sglang, tmp_path):
    rel = f"{COMM}/pymscclpp.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("except ImportError as exc:", "except OSError as exc:")})
    v = verdict(run_suite(venv, [copy], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    assert v["status"] == "error" and f"at {rel}" in v["cause"] and "0.5.23" in v["cause"]


def test_mscclpp_in_sglang_0_5_9_runs_sgl_kernels_bundled_ops(venv, tmp_path):
    """0.5.9 (the CUDA 12.8 image's pin) had no standalone import: its gate is sgl-kernel's bundled ops."""
    sg = pip_target("sglang==0.5.9")
    v = verdict(run_suite(venv, [sg], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    assert v["status"] == "not-installed" and v["gate"] == "not-installed" and "not installed: sgl-kernel" in v["cause"]
    kern = pip_target("sglang-kernel==0.4.10")
    v = verdict(run_suite(venv, [sg, kern], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    assert evidence(v, "engine gate: sgl-kernel's MSCCL++ ops")["value"]["admits"] is True
    # every gate admits but --enable-mscclpp is off by default (server_args.py:594): blocked (setting), the flag the lift
    assert v["status"] == "opt-in" and v["gate"] == "setting" and v["lift"] == "setting"
    assert v["lift_detail"] == "--enable-mscclpp (off by default in sglang 0.5.9)"
    assert "default False at sglang/srt/server_args.py:594" in v["cause"]
    assert evidence(v, "engine gate: PyMscclppCommunicator supported world sizes")["value"]["value"] == [8, 16]
    cap = evidence(v, "runs only inside CUDA-graph capture")
    assert cap["source"] == (f"{COMM}/pymscclpp.py:228 `self.disabled = True`; sglang/srt/distributed/parallel_state.py:525 "
                             "`pymscclpp_comm.change_state(enable=True)`")
    size = evidence(v, "message-size cap")
    assert size["value"].startswith("allreduce messages up to 1MB only") and size["source"] == f"{COMM}/pymscclpp.py:93 _MAX_BYTES"
    # the notes are read, not assumed: a release whose communicator starts enabled gets no capture note
    copy = engine_copy(sg, tmp_path / "sg", {f"sglang/{MSCCLPP_REL}": ("        # PyMscclpp is enabled only in cuda graph\n        self.disabled = True",
                                                                        "        self.disabled = False")})
    v2 = verdict(run_suite(venv, [copy, kern], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    with pytest.raises(KeyError):
        evidence(v2, "runs only inside CUDA-graph capture")


# --- C16 -------------------------------------------------------------------------------------------
def test_c16_pcie_ipc_is_a_default_off_setting_named_exactly(real, venv, sglang, fi, nvcc131):
    eng = verdict(real, PCIE, "engine")
    assert eng["status"] == "opt-in" and eng["gate"] == "setting" and eng["lift"] == "setting"
    assert eng["lift_detail"] == "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 in the server's environment"
    opt = evidence(eng, "engine gate: opt-in SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")
    assert opt["value"] == {"admits": False, "value": {"default": False, "configured": None}}
    assert "sglang/srt/environ.py:1539" in opt["source"] and f"{COMM}/pcie_ipc_ar.py:98 eligible_group" in opt["source"]
    assert verdict(real, PCIE, "library")["status"] == "gate-passes"
    r = run_suite(venv, [sglang, fi], ["--backend", PCIE], path_first=[nvcc131],
                  extra_env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})[0]
    # the suite's own environment is not the server configuration asked about: still opt-in, the variable noted
    e = verdict(r, PCIE, "engine")
    assert e["status"] == "opt-in"
    assert evidence(e, "engine gate: opt-in")["value"]["value"]["this process"] == "1"


def test_c16_fails_closed_when_the_opt_in_is_renamed(venv, sglang, tmp_path):
    rel = "sglang/srt/environ.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = EnvBool(False)",
                                                       "SGLANG_PCIE_IPC = EnvBool(False)")})
    v = verdict(run_suite(venv, [copy], ["--backend", PCIE])[0], PCIE, "engine")
    assert v["status"] == "error" and v["cause"] == (f"gate not found in sglang 0.5.23 at {rel}: "
                                                     "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is not declared")


# --- b12x -----------------------------------------------------------------------------------------
def test_b12x_is_not_integrated_in_sglang_0_5_23(real):
    v = verdict(real, "b12x", "engine")
    assert v["status"] == "not-integrated" and v["gate"] == "not-integrated" and "sglang 0.5.23" in v["cause"]


def test_b12x_referenced_by_an_engine_is_not_called_not_integrated(venv, sglang, tmp_path):
    rel = f"{COMM}/pcie_ipc_ar.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ('_ELIGIBLE_GROUP_NAMES = frozenset({"tp"})',
                                                       '_ELIGIBLE_GROUP_NAMES = frozenset({"tp"})  # b12x next')})
    v = verdict(run_suite(venv, [copy], ["--backend", "b12x"])[0], "b12x", "engine")
    assert v["gate"] != "not-integrated" and v["status"] != "gate-passes"


# --- C18 --------------------------------------------------------------------------------------------
def test_c18_without_sglang_every_engine_answer_is_skipped_and_no_headline_passes(venv, fi, nvcc131):
    from stackprobe.report import Report
    d = run_suite(venv, [fi], [], path_first=[nvcc131])[0]
    r = Report.from_json(d)
    engine = [v for v in r.verdicts if v.scope == "engine"]
    assert {v.backend for v in engine} >= {FUSION, SYMM, CAR, PCIE, MSCCLPP, "b12x"}
    assert all(v.status == "skipped" and v.cause.startswith("not installed: sglang") for v in engine)
    assert verdict(d, SYMM, "library")["status"] == "gate-passes"
    for b in (FUSION, SYMM, PCIE):
        assert r.verdict(b).status != "gate-passes" and r.verdict(b).scope == "engine"
    assert "| torch-symm-mem | skipped (not-installed) | gate-passes | skipped (not-installed) |" in r.to_markdown()


# --- server arguments, read from the installed release -----------------------------------------------
def test_server_arguments_read_from_sglang_0_5_9_and_0_5_23(venv, sglang, sglang059, fi, fi063):
    want = {FUSION: ("--enable-flashinfer-allreduce-fusion", "sglang/srt/server_args.py:4107", "server_args.py:500"),
            MSCCLPP: ("--enable-mscclpp", "sglang/srt/server_args.py:4550", "server_args.py:594"),
            CAR: ("--disable-custom-all-reduce", "sglang/srt/server_args.py:4545", "server_args.py:593"),
            SYMM: ("--enable-torch-symm-mem", "sglang/srt/server_args.py:4555", "server_args.py:595")}
    r = run_suite(venv, [sglang059, fi063], [a for b in want for a in ("--backend", b)])[0]
    for b, (flag, where, default) in want.items():
        arg = evidence(verdict(r, b, "engine"), "engine gate: server argument")
        assert arg["source"] == f"{where} add_argument({flag!r})", arg
        assert arg["value"]["value"].startswith(f"{flag} (default False at sglang/srt/{default}")
    assert "on by default" in evidence(verdict(r, CAR, "engine"), "engine gate: server argument")["value"]["value"]
    r23 = run_suite(venv, [sglang, fi], ["--backend", MSCCLPP])[0]
    arg = evidence(verdict(r23, MSCCLPP, "engine"), "engine gate: server argument")
    assert arg["source"].startswith("sglang/srt/arg_groups/fields/exec_.py:732 ExecComm.enable_mscclpp")


def test_server_argument_gone_is_an_error_naming_version_and_files(venv, sglang, sglang059, tmp_path):
    rel9 = "sglang/srt/server_args.py"
    copy = engine_copy(sglang059, tmp_path / "sg9", {rel9: ('"--enable-torch-symm-mem",', '"--torch-symm-mem",')})
    v = verdict(run_suite(venv, [copy], ["--backend", SYMM])[0], SYMM, "engine")
    assert v["status"] == "error"
    assert v["cause"] == ("gate not found in sglang 0.5.9: no server argument --enable-torch-symm-mem (searched "
                          "add_argument calls and arg-group fields in sglang/srt/server_args.py)")
    # 0.5.23: the field turned into a no-CLI field
    rel = "sglang/srt/arg_groups/fields/exec_.py"
    copy = engine_copy(sglang, tmp_path / "sg23", {rel: (
        '    enable_mscclpp: A[\n        bool,\n        "Enable MSCCL++',
        '    enable_mscclpp: A[\n        bool, Arg(no_cli=True),\n        "Enable MSCCL++')})
    v = verdict(run_suite(venv, [copy], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    assert v["status"] == "error" and v["cause"].startswith("gate not found in sglang 0.5.23: no server argument --enable-mscclpp")
    assert "sglang/srt/arg_groups/*.py, sglang/srt/server_args.py" in v["cause"]


def test_fusion_on_0_5_9_lift_names_sglang_flashinfer_and_a_compiler(venv, sglang059, fi063, nvcc131):
    r = run_suite(venv, [sglang059, fi063], ["--backend", FUSION], extra_env={"CUDA_HOME": "/nonexistent-cuda"})[0]
    v = verdict(r, FUSION, "engine")
    assert v["status"] == "falls-back-if-set" and v["gate"] == "python-table" and v["lift"] == "package-upgrade"
    d = v["lift_detail"]
    assert "an sglang release whose apply_flashinfer_allreduce_fusion admits major 12" in d
    assert "flashinfer-python 0.6.3 admits [9, 10] at flashinfer/jit/comm.py:59" in d
    assert "nvcc (a CUDA toolkit) or a flashinfer-jit-cache" in d
    # with a compiler present the toolchain clause is gone
    r2 = run_suite(venv, [sglang059, fi063], ["--backend", FUSION], path_first=[nvcc131],
                   extra_env={"CUDA_HOME": "/nonexistent-cuda"})[0]
    assert "nvcc" not in verdict(r2, FUSION, "engine")["lift_detail"]


# --- EP over FlashInfer all-to-all --------------------------------------------------------------------
EP = "ep-flashinfer-a2a"


def test_ep_a2a_on_0_5_9_is_a_setting_with_the_flashinfer_cutlass_runner(venv, sglang059, fi063, nvcc131):
    r = run_suite(venv, [sglang059, fi063], ["--backend", EP], extra_env={"CUDA_HOME": "/nonexistent-cuda"})[0]
    eng, lib = verdict(r, EP, "engine"), verdict(r, EP, "library")
    assert eng["status"] == "opt-in" and eng["gate"] == "setting" and eng["lift"] == "setting"
    assert eng["lift_detail"].startswith("--moe-a2a-backend flashinfer (off by default in sglang 0.5.9); "
                                         "--moe-runner-backend flashinfer_cutlass; ")
    s = evidence(eng, "engine gate: required setting: MoE runner")
    assert s["source"].startswith("sglang/srt/server_args.py:2214 `assert self.moe_runner_backend in ['flashinfer_cutlass']`")
    tok = evidence(eng, "engine gate: dispatch tokens per rank")
    assert tok["value"]["value"] == "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 1024) x ep_size tokens"
    assert tok["source"] == "sglang/srt/layers/moe/token_dispatcher/flashinfer.py:102"
    assert "topology" not in (eng["gate"], lib["gate"])
    # library: no nvcc -> toolchain; with one -> needs-runtime (PCIe viability is measured, not guessed)
    assert lib["status"] == "blocked" and lib["gate"] == "toolchain"
    r2 = run_suite(venv, [sglang059, fi063], ["--backend", EP], path_first=[nvcc131])[0]
    lib2 = verdict(r2, EP, "library")
    assert lib2["status"] == "skipped" and lib2["gate"] == "needs-runtime" and "SYS_PTRACE" in lib2["cause"]
    assert evidence(lib2, "MnnvlMemory handle types")["source"].startswith("flashinfer/comm/mnnvl.py:")


def test_ep_a2a_setting_gate_fails_closed(venv, sglang, sglang059, fi, fi063, tmp_path):
    rel9 = "sglang/srt/server_args.py"
    c9b = engine_copy(sglang059, tmp_path / "sg9b", {rel9: ('if self.moe_a2a_backend == "flashinfer":', 'if self.moe_a2a_backend == "flashinfer-x":')})
    v = verdict(run_suite(venv, [c9b, fi063], ["--backend", EP])[0], EP, "engine")
    assert v["status"] == "error" and v["cause"].startswith("gate not found in sglang 0.5.9: neither _flashinfer_a2a_topology_is_supported")
    rel = "sglang/srt/arg_groups/moe_hook.py"
    c23 = engine_copy(sglang, tmp_path / "sg23", {rel: ("    if attn_dp_enabled and attn_dp_size == tp_size:\n        return True",
                                                       "    if attn_dp_enabled and attn_dp_size == tp_size:\n        return False")})
    v = verdict(run_suite(venv, [c23, fi], ["--backend", EP])[0], EP, "engine")
    assert v["status"] == "blocked" and v["gate"] == "python-table" and v["lift"] == "package-upgrade"


# --- PCIe IPC conditions past the opt-in (0.5.23) and NCCL Tree under deterministic inference ----------------------
def test_pcie_ipc_conditions_read_from_sglang_0_5_23(real, venv, sglang, fi, nvcc131):
    eng = verdict(real, PCIE, "engine")
    ws = evidence(eng, "engine gate: supported world sizes")
    assert ws["value"] == {"admits": True, "value": [2, 4, 8]} and ws["source"].startswith(f"{COMM}/pcie_ipc_ar.py:77")
    assert evidence(eng, "eligible process groups")["value"].startswith("only ['tp']")
    assert evidence(eng, "deterministic inference")["source"] == f"{COMM}/pcie_ipc_ar.py:111"
    assert evidence(eng, "dtype")["value"].startswith("bf16 only")
    fb = evidence(eng, "workspace build failure")
    assert "silently stay on NCCL" in fb["value"] and "_ensure_workspace" in fb["source"]
    # world size 6 is not among them: blocked even with the opt-in set
    r = run_suite(venv, [sglang, fi], ["--backend", PCIE, "--world-size", "6"], path_first=[nvcc131],
                  extra_env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})[0]
    v = verdict(r, PCIE, "engine")
    assert v["status"] == "falls-back-if-set" and v["gate"] == "python-table" and "not 6" in v["cause"]


def test_pcie_ipc_world_sizes_gone_is_an_error(venv, sglang, tmp_path):
    rel = f"{COMM}/pcie_ipc_ar.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("_SUPPORTED_WORLD_SIZES = (2, 4, 8)", "_WORLD_SIZES = (2, 4, 8)")})
    v = verdict(run_suite(venv, [copy], ["--backend", PCIE])[0], PCIE, "engine")
    assert v["status"] == "error" and v["cause"] == (f"gate not found in sglang 0.5.23 at {rel}: "
                                                     "no module-level _SUPPORTED_WORLD_SIZES")


def test_nccl_tree_notes_that_sglang_sets_it_under_deterministic_inference(venv, sglang, sglang059, tmp_path):
    for sg, where in ((sglang059, "sglang/srt/server_args.py:2791"), (sglang, "sglang/srt/arg_groups/attention_hook.py:676")):
        v = verdict(run_suite(venv, [sg], ["--backend", "nccl-tree"])[0], "nccl-tree")
        assert evidence(v, "SGLang sets NCCL_ALGO itself")["source"] == where
    rel = "sglang/srt/arg_groups/attention_hook.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ('os.environ["NCCL_ALGO"] = "allreduce:tree"', 'os.environ["NCCL_ALGO"] = "ring"')})
    v = verdict(run_suite(venv, [copy], ["--backend", "nccl-tree"])[0], "nccl-tree")
    with pytest.raises(KeyError):
        evidence(v, "SGLang sets NCCL_ALGO itself")


# --- review of the committed reports (CUDA 12.8: sglang 0.5.9 / flashinfer 0.6.3; CUDA 13.1: 0.5.23 / 0.7.2) ----------
def test_mscclpp_library_on_0_5_9_is_sgl_kernels_bundled_ops_not_the_standalone_package(venv, sglang059, kern, real, tmp_path):
    lib = verdict(run_suite(venv, [sglang059, kern], ["--backend", MSCCLPP])[0], MSCCLPP, "library")
    assert lib["status"] == "gate-passes" and lib["lift"] == "none-needed", lib["cause"]
    assert (f"{COMM}/custom_all_reduce_ops.py:21 `import sgl_kernel.allreduce as _custom_ar` (ImportError at :22 clears "
            f"IS_MSCCLPP_AR_AVAILABLE); {COMM}/pymscclpp.py:117 `ops.IS_MSCCLPP_AR_AVAILABLE`") in lib["cause"]
    assert "not the standalone mscclpp package" in lib["cause"] and "mscclpp package" not in lib["lift_detail"]
    # without sgl-kernel the bundled flavour is not installed (not "install mscclpp")
    lib0 = verdict(run_suite(venv, [sglang059], ["--backend", MSCCLPP])[0], MSCCLPP, "library")
    assert lib0["status"] == "skipped" and lib0["cause"].startswith("not installed: sgl-kernel")
    # 0.5.23 imports the standalone package: still not installed
    lib23 = verdict(real, MSCCLPP, "library")
    assert lib23["status"] == "skipped" and lib23["cause"].startswith("not installed: mscclpp")
    assert evidence(lib23, "MSCCL++ SGLang runs")["source"] == f"{COMM}/pymscclpp.py:1048"
    # the flavour is read, never guessed: a guarded import that no longer clears the flag is an error (both scopes)
    copy = engine_copy(sglang059, tmp_path / "sg", {f"{COMM}/custom_all_reduce_ops.py": (
        "    IS_MSCCLPP_AR_AVAILABLE = False", "    IS_MSCCLPP_AR_AVAILABLE = _is_cuda")})
    r = run_suite(venv, [copy, kern], ["--backend", MSCCLPP])[0]
    for scope in ("library", "engine"):
        v = verdict(r, MSCCLPP, scope)
        assert v["status"] == "error" and v["cause"].startswith(
            f"gate not found in sglang 0.5.9 at sglang/{MSCCLPP_REL}: neither an import of mscclpp"), (scope, v["cause"])


def test_every_default_off_flag_reads_what_setting_it_does_with_the_flag_in_the_lift(venv, sglang, sglang059, fi, fi063, kern,
                                                                            nvcc131, tmp_path):
    backends = [a for b in (FUSION, SYMM, CAR, PCIE, MSCCLPP, "ep-flashinfer-a2a") for a in ("--backend", b)]
    seen = set()
    for paths in ([sglang059, fi063, kern], [sglang, fi, kern]):
        r = run_suite(venv, paths, backends, path_first=[nvcc131])[0]
        for v in (x for x in r["verdicts"] if x.get("scope") == "engine" and x["tier"] == "static"):
            for e in v["evidence"]:
                if not e["what"].startswith("engine gate: server argument") and "opt-in" not in e["what"]:
                    continue
                val = e["value"]["value"]
                off = "off by default" in str(val) or (isinstance(val, dict) and not val.get("default"))
                flag = str(val).split(" ")[0] if isinstance(val, str) else e["what"].split("opt-in ")[1]
                if off:
                    seen.add(v["backend"])
                    assert e["value"]["admits"] is False and v["status"] in OFF_BY_DEFAULT, (v["backend"], v["status"])
                    assert flag in v["lift_detail"] and flag in v["cause"], (v["backend"], v["lift_detail"])
                else:      # on by default (custom allreduce): not a lift
                    assert e["value"]["admits"] is True and flag not in v["lift_detail"]
    assert seen >= {FUSION, SYMM, PCIE, MSCCLPP, "ep-flashinfer-a2a"}
    # the rule follows the declared default: an sglang whose --enable-mscclpp defaults to True no longer names it
    fake = tmp_path / "mscclpp_pkg"
    (fake / "mscclpp").mkdir(parents=True)
    (fake / "mscclpp" / "__init__.py").write_text("")
    on = engine_copy(sglang, tmp_path / "sg", {"sglang/srt/arg_groups/fields/exec_.py": (
        '"Enable MSCCL++ for tuned AllReduce and AllGather messages, with NCCL fallback.",\n    ] = False',
        '"Enable MSCCL++ for tuned AllReduce and AllGather messages, with NCCL fallback.",\n    ] = True')})
    v = verdict(run_suite(venv, [on, fake], ["--backend", MSCCLPP])[0], MSCCLPP, "engine")
    assert v["status"] == "on-by-default" and v["lift"] == "none-needed"


def test_fusion_engine_lift_names_the_flag_and_cites_the_sm90_sm100_auto_enable(venv, sglang, sglang059, fi, fi063, nvcc131):
    for paths, flag, auto in (([sglang059, fi063], "--enable-flashinfer-allreduce-fusion",
                               "sglang/srt/server_args.py:1680-1695"),
                              ([sglang, fi], "--flashinfer-allreduce-fusion-backend auto",
                               "sglang/srt/arg_groups/overrides.py:987-995")):
        v = verdict(run_suite(venv, paths, ["--backend", FUSION], path_first=[nvcc131])[0], FUSION, "engine")
        # 0.5.9: the per-call check declines (falls back); 0.5.23: _resolve_backend raises at warmup (C35)
        assert v["status"] in ("falls-back-if-set", "startup-failure-if-set") and v["gate"] == "python-table"
        assert v["lift"] == "package-upgrade"
        assert v["lift_detail"].startswith(f"{flag} (off by default in sglang ")
        assert "an sglang release whose" in v["lift_detail"]          # and still the arch-list releases
        a = evidence(v, "auto-enable (listed models only)")
        assert a["source"] == auto and a["value"]["majors"] == [9, 10] and a["value"]["admits target"] is False
        assert "auto-enable turns it on only for listed models on compute-capability majors [9, 10]" in v["cause"]


def test_ep_a2a_0_5_9_library_lift_is_nvcc_or_jit_cache_and_the_engine_lift_names_it(venv, sglang059, fi063, nvcc131):
    r = run_suite(venv, [sglang059, fi063], ["--backend", EP], extra_env={"CUDA_HOME": "/nonexistent-cuda"})[0]
    lib, eng = verdict(r, EP, "library"), verdict(r, EP, "engine")
    assert lib["status"] == "blocked" and lib["gate"] == "toolchain" and lib["lift"] == "package-upgrade"
    assert lib["lift_detail"].startswith("install nvcc (a CUDA devel base image; CUDA >= 12.8 compiles sm_120a")
    assert "or a flashinfer-jit-cache holding mnnvl_moe_alltoall with SASS for 12.0" in lib["lift_detail"]
    assert evidence(lib, "every nvcc in reach")["value"].startswith("none")
    # 0.6.3 chooses the handle type by CPU type, not by fabric availability
    h = evidence(lib, "MnnvlMemory handle types")
    assert h["value"].startswith("FABRIC on aarch64 CPUs, POSIX file descriptors otherwise: chosen by CPU type")
    assert h["source"] == "flashinfer/comm/mnnvl.py:408-415 get_allocation_prop"
    # the engine lift carries the library blocker
    assert eng["lift_detail"].endswith(lib["lift_detail"]) and "and install nvcc" in eng["lift_detail"]
    assert evidence(eng, "library blocker: a2a module build")["value"] == lib["cause"]
    r2 = run_suite(venv, [sglang059, fi063], ["--backend", EP], path_first=[nvcc131],
                   extra_env={"CUDA_HOME": "/nonexistent-cuda"})[0]
    assert "install nvcc" not in verdict(r2, EP, "engine")["lift_detail"]


def test_ep_a2a_0_5_23_moe_runner_gate_and_fabric_probe(real, venv, sglang, fi, tmp_path):
    eng, lib = verdict(real, EP, "engine"), verdict(real, EP, "library")
    g = evidence(eng, "engine gate: required setting: MoE runner")
    assert g["source"].startswith("sglang/srt/arg_groups/moe_hook.py:531-541 `assert resolved_view(server_args).moe_runner_backend in [")
    assert g["value"]["admits"] is False and g["value"]["value"]["default"] == "auto"
    assert g["value"]["value"]["runners"] == ["flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm",
                                              "flashinfer_trtllm_routed", "deep_gemm"]
    assert g["value"]["value"]["auto"]["where"] == "sglang/srt/arg_groups/overrides.py:1513-1518"
    assert g["value"]["value"]["auto"]["quantization"] == "modelopt_fp4"
    assert "--moe-runner-backend flashinfer_cutlass (for models other than modelopt_fp4" in eng["lift_detail"]
    h = evidence(lib, "MnnvlMemory handle types")
    assert h["value"].startswith("FABRIC when the GPU supports fabric handles") and h["source"].startswith("flashinfer/comm/mnnvl.py:327-334")
    rel = "sglang/srt/arg_groups/moe_hook.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ("assert resolved_view(server_args).moe_runner_backend in [",
                                                       "assert resolved_view(server_args).moe_runner in [")})
    v = verdict(run_suite(venv, [copy, fi], ["--backend", EP])[0], EP, "engine")
    assert v["status"] == "error" and v["cause"].startswith(f"gate not found in sglang 0.5.23 at {rel}: no `assert ...moe_runner_backend")


def test_custom_allreduce_v2_gate_and_jit_build_on_0_5_23(real, venv, sglang, kern, tmp_path):
    eng = verdict(real, CAR, "engine")
    g = evidence(eng, "CustomAllReduceV2 NVLink rule")
    assert g["value"]["admits"] is False
    assert g["source"] == (f"{COMM}/custom_all_reduce_v2.py:591-597 `return full_nvlink is True`; chosen at "
                           f"{COMM}/custom_all_reduce.py:387-395 (sglang/srt/environ.py:1532 EnvBool(True))")
    assert "CustomAllReduceV2" in eng["cause"] and eng["lift"] == "nothing-on-this-topology"
    lib = verdict(run_suite(venv, [sglang, kern], ["--backend", CAR])[0], CAR, "library")
    assert lib["status"] == "gate-passes" and "sm_120a" in lib["cause"]
    assert "CustomAllReduceV2, JIT-built at first use (sglang/kernels/ops/communication/all_reduce.py:50 load_jit" in lib["cause"]
    assert "it needs nvcc in the image" in lib["cause"]
    # switched off, the V2 gate is not on the path; its rule gone is an error
    r = run_suite(venv, [sglang], ["--backend", CAR], extra_env={"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "0"})[0]
    with pytest.raises(KeyError):
        evidence(verdict(r, CAR, "engine"), "CustomAllReduceV2 NVLink rule")
    copy = engine_copy(sglang, tmp_path / "sg", {f"{COMM}/custom_all_reduce_v2.py": ("    return full_nvlink is True",
                                                                                    "    return True")})
    v = verdict(run_suite(venv, [copy], ["--backend", CAR])[0], CAR, "engine")
    assert v["status"] == "error" and "can_use_custom_all_reduce_v2" in v["cause"] and "0.5.23" in v["cause"]


def test_pcie_ipc_engine_notes_the_decode_width_cap(real, venv, sglang, tmp_path):
    eng = verdict(real, PCIE, "engine")
    cap = evidence(eng, "message-size cap")
    assert cap["source"] == (f"{COMM}/pcie_ipc_ar.py:259-276 _ensure_workspace, :402 should_pcie_ipc_ar "
                             "`inp.numel() > self.max_numel`")
    assert "SGLANG_PCIE_IPC_MAX_NUMEL overrides" in cap["value"] and "prefill's, stay on NCCL" in eng["cause"]
    # read, not assumed: without the per-call comparison there is no note
    copy = engine_copy(sglang, tmp_path / "sg", {f"{COMM}/pcie_ipc_ar.py": ("if inp.numel() > self.max_numel:",
                                                                           "if inp.numel() > 0 and False:")})
    v = verdict(run_suite(venv, [copy], ["--backend", PCIE])[0], PCIE, "engine")
    with pytest.raises(KeyError):
        evidence(v, "message-size cap")
