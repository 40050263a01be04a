"""Issue "Every verdict a maintainer would sign", point 6 for the releases the first fix left out: the communication
settings of sglang 0.5.9 (one ``ServerArgs`` dataclass whose help text and choices live in ``add_cli_args``'
``parser.add_argument`` calls) and of vllm 0.33.0 (its configuration classes, ``envs.py`` and modules), each mapped to
the verdict that judges it or listed as not assessed with its ``FILE:LINE``, read from the real wheels from PyPI, with
edited copies where a planted setting must show up. Point 7 for vLLM: its Markdown report shows the list.

Each test fails on the behaviour before the change (the reason is in its docstring)."""
from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from stackprobe.paths import PATHS
from stackprobe.engines.sglang import engine as se
from stackprobe.engines.sglang import paths as sp
from stackprobe.engines.vllm import engine as ve
from stackprobe.engines.vllm import paths as vp
from stackprobe.report import Report
from validate_support import engine_copy, pip_target, suite_env

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def v033():
    return pip_target("vllm==0.33.0")


def _sg(folder, version="0.5.9"):
    return se.Engine(version, folder / "sglang")


def _vl(folder, version="0.33.0"):
    return ve.Engine(version, folder / "vllm")


def _rows(rows):
    return {r["path"]: r for r in rows}


# --- sglang 0.5.9 ---------------------------------------------------------------------------------------------------
def test_sglang_059_settings_come_from_its_add_argument_calls(sglang059):
    """Before: only the ``ServerArgs`` dataclass fields were read, which carry no help text in 0.5.9, so three settings
    came out (--nccl-port, --speculative-moe-a2a-backend, --disable-flashinfer-cutlass-moe-fp4-allgather), and the
    --moe-a2a-backend choices (a module constant, MOE_A2A_BACKEND_CHOICES) were not resolved at all."""
    rows = _rows(sp.inventory(_sg(sglang059)))
    settings = {p: r for p, r in rows.items() if r["kind"] not in ("module", "kernel module")}
    assert len(settings) >= 20, sorted(settings)
    for flag, line, words in (("--deepep-mode", 4111, "DeepEP"), ("--elastic-ep-backend", 4194, "collective"),
                              ("--enable-two-batch-overlap", 4579, "two micro batches"),
                              ("--enable-single-batch-overlap", 4584, "communication overlap"),
                              ("--enable-p2p-check", 4646, "P2P"),
                              ("--enable-attn-tp-input-scattered", 4766, "scattered"),
                              ("--speculative-moe-a2a-backend", 4009, "speculative decoding"),
                              ("--enable-dp-lm-head", 4574, "all-gather")):
        r = settings[flag]
        assert r["status"] == "not-assessed" and r["where"] == f"sglang/srt/server_args.py:{line}", (flag, r)
        assert words in r["why"], (flag, r["why"])
    assert "choices: none, deepep, mooncake, mori, ascend_fuseep, flashinfer" in settings["--speculative-moe-a2a-backend"]["why"]
    a2a = {p: r for p, r in settings.items() if r["kind"] == "moe-a2a-backend"}
    assert set(a2a) == {f"--moe-a2a-backend {c}" for c in ("none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer")}
    assert a2a["--moe-a2a-backend flashinfer"]["maps_to"] == "ep-flashinfer-a2a"
    assert a2a["--moe-a2a-backend deepep"]["status"] == "not-assessed"
    for flag, backend in (("--disable-custom-all-reduce", "sglang-custom-allreduce"), ("--enable-mscclpp", "mscclpp"),
                          ("--enable-torch-symm-mem", "torch-symm-mem"),
                          ("--enable-flashinfer-allreduce-fusion", "flashinfer-allreduce-fusion")):
        assert (settings[flag]["status"], settings[flag]["maps_to"]) == ("assessed", backend), flag
    assert "--nccl-port" not in settings          # a rendezvous port selects no path
    assert "--tp-size" not in settings and "--tensor-parallel-size" not in settings


def test_sglang_059_twin_a_planted_flag_and_a2a_choice_show_up_as_not_assessed(sglang059, tmp_path):
    """The twin: an edited copy of 0.5.9's server_args.py gains a flag whose name says nothing (its help says
    all-reduce) and a new --moe-a2a-backend choice. Before: the flag's dataclass field ``enable_fast_path`` matched no
    term and its help was never read, and no --moe-a2a-backend choice was listed for 0.5.9: both were missed."""
    rel = "sglang/srt/server_args.py"
    src = (sglang059 / rel).read_text()
    field = "    enable_torch_symm_mem: bool = False\n"
    arg = '        parser.add_argument(\n            "--enable-mscclpp",\n'
    choice = 'MOE_A2A_BACKEND_CHOICES = [\n    "none",\n'
    assert field in src and arg in src and choice in src
    planted = ('        parser.add_argument(\n            "--enable-fast-path",\n            action="store_true",\n'
               '            help="One-shot all-reduce over PCIe peer memory.",\n        )\n')
    copy = engine_copy(sglang059, tmp_path / "sg", {rel: (field, field + "    enable_fast_path: bool = False\n")})
    text = (copy / rel).read_text().replace(arg, planted + arg).replace(choice, choice + '    "planted_a2a",\n')
    (copy / rel).write_text(text)
    line = text[:text.index('"--enable-fast-path"')].count("\n")
    rows = _rows(sp.inventory(_sg(copy)))
    r = rows["--enable-fast-path"]
    assert (r["status"], r["where"]) == ("not-assessed", f"sglang/srt/server_args.py:{line}")
    assert "One-shot all-reduce over PCIe" in r["why"]
    assert rows["--moe-a2a-backend planted_a2a"]["status"] == "not-assessed"
    # the same copy without the planted lines does not have them (the rows come from the file, not from the test)
    assert "--enable-fast-path" not in _rows(sp.inventory(_sg(sglang059)))


def test_sglang_judged_flags_name_backends_the_suite_answers_for():
    """Every flag the SGLang inventory calls assessed maps to a backend the suite has a record for."""
    assert set(sp.JUDGED_FLAGS.values()) <= set(PATHS)
    assert set(v for v in sp.A2A_JUDGED.values() if v) <= set(PATHS)


def test_sglang_023_fusion_off_switch_is_judged_by_the_fusion_verdict(sglang):
    """Review item 27. Before: --enforce-disable-flashinfer-allreduce-fusion, which clears the fusion backend
    (sglang 0.5.23 arg_groups/overrides.py:1005-1006), was listed as not assessed although the fusion verdict judges
    the path it switches off."""
    r = _rows(sp.inventory(_sg(sglang, "0.5.23")))["--enforce-disable-flashinfer-allreduce-fusion"]
    assert (r["status"], r["maps_to"]) == ("assessed", "flashinfer-allreduce-fusion")


def test_sglang_023_twin_a_renamed_off_switch_is_not_assessed(sglang, tmp_path):
    """The twin: the same field renamed in an edited copy is not in the judged flags, so it is listed as not assessed
    (the judged row comes from the name the fusion verdict knows, not from any flag that mentions fusion)."""
    rel = "sglang/srt/arg_groups/fields/exec_.py"
    old = "    enforce_disable_flashinfer_allreduce_fusion:"
    assert old in (sglang / rel).read_text()
    copy = engine_copy(sglang, tmp_path / "sg", {rel: (old, "    enforce_off_flashinfer_allreduce_fusion:")})
    rows = _rows(sp.inventory(_sg(copy, "0.5.23")))
    assert "--enforce-disable-flashinfer-allreduce-fusion" not in rows
    assert rows["--enforce-off-flashinfer-allreduce-fusion"]["status"] == "not-assessed"


def test_sglang_environment_variables_enumerated_from_environ(sglang, sglang059):
    """Review item 33. Before: the SGLang lists had flags and files but no SGLANG_* variable; the four the reviewer
    named (SGLANG_SYMM_MEM_PREALLOC_GB_SIZE, SGLANG_CUSTOM_ALL_REDUCE_V2_*, SGLANG_DETERMINISTIC_NCCL_NCHANNELS,
    SGLANG_DP_USE_REDUCE_SCATTER) were missing. Now read from ``class Envs`` in srt/environ.py of both releases."""
    rows = _rows(sp.inventory(_sg(sglang, "0.5.23")))
    env = {p: r for p, r in rows.items() if r["kind"] == "environment variable"}
    for name in ("SGLANG_SYMM_MEM_PREALLOC_GB_SIZE", "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB",
                 "SGLANG_DETERMINISTIC_NCCL_NCHANNELS", "SGLANG_DP_USE_REDUCE_SCATTER"):
        assert env[name]["status"] == "not-assessed" and env[name]["where"].startswith("sglang/srt/environ.py:"), name
    assert env["SGLANG_SYMM_MEM_PREALLOC_GB_SIZE"]["where"] == "sglang/srt/environ.py:2127"
    assert (env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"]["status"], env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"]["maps_to"]) == (
        "assessed", "flashinfer-pcie-ipc-allreduce")
    assert env["SGLANG_M3_ALLOW_CUSTOM_AR"]["why"].startswith("does not apply here: for another platform")
    assert not [p for p in env if "DEBUG" in p or "KIMI_K3" in p]       # diagnostics and one model's variables
    old = _rows(sp.inventory(_sg(sglang059)))
    assert old["SGLANG_SYMM_MEM_PREALLOC_GB_SIZE"]["where"] == "sglang/srt/environ.py:483"
    # 0.5.9 has no PCIe IPC, so the variable its verdict reads is not claimed as judged there
    assert old["SGLANG_USE_1STAGE_ALLREDUCE"]["status"] == "not-assessed"


def test_sglang_environment_twin_a_planted_variable_shows_up_and_a_plain_one_does_not(sglang, tmp_path):
    """The twin: an edited copy of environ.py gains a variable whose comment says all-reduce (listed, with its line)
    and one that says nothing about communication (not listed): the filter is the collective terms, not a list."""
    rel = "sglang/srt/environ.py"
    anchor = "    SGLANG_SYMM_MEM_PREALLOC_GB_SIZE = EnvInt(-1)\n"
    assert anchor in (sglang / rel).read_text()
    planted = ("    # One-shot all-reduce over PCIe peer memory.\n    SGLANG_PLANTED_FAST_PATH = EnvBool(False)\n"
               "    SGLANG_PLANTED_PLAIN = EnvBool(False)\n")
    copy = engine_copy(sglang, tmp_path / "sg", {rel: (anchor, anchor + planted)})
    text = (copy / rel).read_text()
    rows = _rows(sp.inventory(_sg(copy, "0.5.23")))
    line = text[:text.index("SGLANG_PLANTED_FAST_PATH")].count("\n") + 1
    assert rows["SGLANG_PLANTED_FAST_PATH"]["where"] == f"sglang/srt/environ.py:{line}"
    assert "One-shot all-reduce over PCIe" in rows["SGLANG_PLANTED_FAST_PATH"]["why"]
    assert "SGLANG_PLANTED_PLAIN" not in rows


def test_sglang_model_specific_kernels_dropped_by_the_models_directory(sglang):
    """Review item 33. Before: kernels/ops/communication/ listed every file, muse_spark_*, inkling_* and beam_* among
    them (kernels for one named model). Now a file whose name starts with a module of srt/models/ is left out; the
    HIP kernel says it does not apply here."""
    rows = _rows(sp.inventory(_sg(sglang, "0.5.23")))
    kernels = {p for p, r in rows.items() if r["kind"] == "kernel module"}
    assert not [k for k in kernels if k.split("/")[-1].startswith(("muse_spark", "inkling", "beam"))], kernels
    assert {"kernels/ops/communication/all_reduce.py", "kernels/ops/communication/all_reduce_fusion.py",
            "kernels/ops/communication/nvlink_comm.py"} <= kernels
    assert rows["kernels/ops/communication/all_reduce_mhc_hip.py"]["why"].startswith("does not apply here: ROCm only")


def test_sglang_model_specific_twin_a_kernel_named_for_no_model_stays(sglang, tmp_path):
    """The twin: in an edited copy, renaming srt/models/beam.py makes beam_all_reduce.py a kernel of no known model,
    so it is listed again (the rule reads the models directory, not a list of names)."""
    copy = engine_copy(sglang, tmp_path / "sg", {})
    (copy / "sglang/srt/models/beam.py").rename(copy / "sglang/srt/models/beam_renamed.py")
    rows = _rows(sp.inventory(_sg(copy, "0.5.23")))
    assert rows["kernels/ops/communication/beam_all_reduce.py"]["status"] == "not-assessed"


# --- vllm 0.33.0 ----------------------------------------------------------------------------------------------------
def test_vllm_033_settings_and_modules_enumerated_from_its_declarations(v033):
    """Before: nothing of vLLM was enumerated; a vLLM report had no not-assessed list, so --enable-dbo, the DeepEP,
    mori, moonep, nixl_ep and pplx all-to-all backends, --dcp-comm-backend, VLLM_FLASHINFER_ALLREDUCE_BACKEND, the
    VLLM_DEEPEP_* variables ... were neither assessed nor named as not assessed."""
    rows = vp.inventory(_vl(v033))
    by = _rows(rows)
    kinds = Counter(r["kind"] for r in rows)
    assert kinds["server argument"] >= 10 and kinds["environment variable"] >= 20 and kinds["all2all-backend"] == 14
    for path, where in (("--enable-dbo", "vllm/config/parallel.py:258"),
                        ("--dcp-comm-backend", "vllm/config/parallel.py:401"),
                        ("--enable-elastic-ep", "vllm/config/parallel.py:253"),
                        ("EPLBConfig.communicator", "vllm/config/parallel.py:97"),
                        ("--all2all-backend deepep_low_latency", "vllm/config/parallel.py:220"),
                        ("--all2all-backend allgather_reducescatter", "vllm/config/parallel.py:220"),
                        ("VLLM_DEEPEP_BUFFER_SIZE_MB", "vllm/envs.py:2036"),
                        ("VLLM_DBO_COMM_SMS", "vllm/envs.py:2069"),
                        ("VLLM_SKIP_P2P_CHECK", "vllm/envs.py:1214"),
                        ("VLLM_USE_DIRECT_DCP_A2A", "vllm/envs.py:2245"),
                        ("mnnvl_compat.py", "vllm/distributed/device_communicators/mnnvl_compat.py")):
        assert (by[path]["status"], by[path]["where"]) == ("not-assessed", where), (path, by[path])
    assert "not a command-line choice (taken off at vllm/engine/arg_utils.py:1159)" in by["--all2all-backend passthrough"]["why"]
    assert "command-line" not in by["--all2all-backend deepep_low_latency"]["why"]
    assert "choices: ag_rs, a2a" in by["--dcp-comm-backend"]["why"]
    # judged since review item 11: an explicit value has no trtllm fallback on the fusion pass's path
    assert (by["VLLM_FLASHINFER_ALLREDUCE_BACKEND"]["status"], by["VLLM_FLASHINFER_ALLREDUCE_BACKEND"]["where"]) == (
        "assessed", "vllm/envs.py:1811")
    for path, backend in (("VLLM_USE_NCCL_SYMM_MEM", "nccl-symm-mem"), ("VLLM_ALLREDUCE_USE_SYMM_MEM", "torch-symm-mem"),
                          ("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "flashinfer-pcie-ipc-allreduce"),
                          ("VLLM_ALLREDUCE_USE_FLASHINFER", "flashinfer-allreduce"),
                          ("--disable-custom-all-reduce", "vllm-custom-allreduce"),
                          ("--enable-expert-parallel", "ep-flashinfer-a2a"),
                          ("--all2all-backend flashinfer_nvlink_two_sided", "ep-flashinfer-a2a"),
                          ("pass_config.fuse_allreduce_rms", "flashinfer-allreduce-fusion"),
                          ("pass_config.fi_allreduce_fusion_max_size_mb", "flashinfer-allreduce-fusion"),
                          ("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "flashinfer-allreduce-fusion"),
                          ("custom_all_reduce.py", "vllm-custom-allreduce"),
                          ("allreduce_rms_fusion.py", "flashinfer-allreduce-fusion")):
        assert (by[path]["status"], by[path]["maps_to"]) == ("assessed", backend), path
    assert not [r for r in rows if r["status"] == "unknown"]
    assert not [p for p in by if p.endswith(("_PORT", "_IP")) or "timeout" in p.lower()]


def test_vllm_033_review15_missed_variables_listed_noise_dropped_by_rule(v033):
    """Review item 15. Before: VLLM_BATCH_INVARIANT (its help names no collective) and VLLM_DISABLE_PYNCCL ("pynccl"
    does not match ``\\bnccl``) were missing, while VLLM_RPC_BASE_PATH, LD_LIBRARY_PATH, --worker-extension-cls
    ("collective_rpc"), assigned_physical_gpu_ids, EPLBConfig.log_balancedness, VLLM_P2P_MAX_PEERS (KV transfer), the
    NIC-mapping variables and VLLM_KIMI_K3_* were listed; the ROCm and SM100 rows did not say they do not apply."""
    by = _rows(vp.inventory(_vl(v033)))
    bi, dp = by["VLLM_BATCH_INVARIANT"], by["VLLM_DISABLE_PYNCCL"]
    assert (bi["status"], bi["where"]) == ("not-assessed", "vllm/envs.py:638")
    assert "read by vllm/distributed/device_communicators/" in bi["why"]
    assert (dp["status"], dp["where"]) == ("not-assessed", "vllm/envs.py:1241")
    assert "read by vllm/distributed/device_communicators/pynccl.py:127" in dp["why"]
    for noise in ("VLLM_RPC_BASE_PATH", "LD_LIBRARY_PATH", "--worker-extension-cls",
                  "ParallelConfig.assigned_physical_gpu_ids", "EPLBConfig.log_balancedness", "VLLM_P2P_MAX_PEERS",
                  "VLLM_GPU_NIC_PCIE_MAPPING", "VLLM_NIC_SELECTION_VARS", "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT",
                  "VLLM_CACHE_ROOT"):
        assert noise not in by, noise
    assert by["VLLM_ENABLE_GEMM_RS"]["why"].startswith("does not apply here unless the target is compute capability 10.x")
    for rocm in ("VLLM_ROCM_QUICK_REDUCE_QUANTIZATION", "VLLM_ROCM_USE_AITER_CUSTOM_AR", "aiter_custom_all_reduce.py"):
        assert by[rocm]["why"].startswith("does not apply here: ROCm only"), rocm
    assert not by["VLLM_DBO_COMM_SMS"]["why"].startswith("does not apply")     # "64 on ROCm" is a default, not a limit
    assert not by["VLLM_FLASHINFER_ALLREDUCE_BACKEND"]["why"].startswith("does not apply")


def test_vllm_033_review15_twin_the_rules_not_names_decide(v033, tmp_path):
    """The twin: in an edited copy a variable with a plain help is listed only once a judged module (the CUDA
    communicator) reads it, and a variable whose help names all-reduce is dropped once its help says it is for one
    model; the same help without that is listed."""
    anchor = '    # Whether to use pytorch symmetric memory for allreduce\n'
    plant = ('    # Use the planted mode.\n'
             '    "VLLM_PLANTED_MODE": lambda: bool(int(os.getenv("VLLM_PLANTED_MODE", "0"))),\n'
             '    # Kimi-K9 only. One-shot all-reduce of the shared expert.\n'
             '    "VLLM_PLANTED_MODEL_AR": lambda: bool(int(os.getenv("VLLM_PLANTED_MODEL_AR", "0"))),\n'
             '    # One-shot all-reduce of the shared expert.\n'
             '    "VLLM_PLANTED_AR": lambda: bool(int(os.getenv("VLLM_PLANTED_AR", "0"))),\n')
    read = "use_torch_symm_mem = envs.VLLM_ALLREDUCE_USE_SYMM_MEM\n"
    cc = "vllm/distributed/device_communicators/cuda_communicator.py"
    unread = _rows(vp.inventory(_vl(engine_copy(v033, tmp_path / "a", {"vllm/envs.py": (anchor, plant + anchor)}))))
    assert "VLLM_PLANTED_MODE" not in unread
    assert "VLLM_PLANTED_MODEL_AR" not in unread and unread["VLLM_PLANTED_AR"]["status"] == "not-assessed"
    copy = engine_copy(v033, tmp_path / "b", {"vllm/envs.py": (anchor, plant + anchor),
                                              cc: (read, read.rstrip() + " and not envs.VLLM_PLANTED_MODE\n")})
    r = _rows(vp.inventory(_vl(copy)))["VLLM_PLANTED_MODE"]
    assert r["status"] == "not-assessed" and f"read by vllm/{cc.removeprefix('vllm/')}:" in r["why"]


def test_vllm_assessed_settings_name_its_deciders():
    """Every vLLM setting called assessed maps to a backend vLLM's reader decides (``vllm_engine.DECIDERS``), and the
    variables and flags among them are read by that reader's source (not a claim the reader does not back)."""
    assert set(vp.ASSESSED.values()) <= set(ve.DECIDERS)
    assert {m for m, _ in vp.MODULES.values() if m} <= set(ve.DECIDERS) | {"nccl-ring"}
    reader = open(ve.__file__).read()
    for name in vp.ASSESSED:
        key = name.split()[0].removeprefix("pass_config.")
        assert key in reader, name


def test_vllm_033_twin_planted_variable_choice_and_module_show_up(v033, tmp_path):
    """The twin: an edited copy of vllm 0.33.0 gains an environment variable (its name says nothing; the comment above
    it says all-reduce), an All2AllBackend choice and a device communicator module. Each shows up, not assessed, with
    its line; the module is ``unknown``. Before: no vLLM enumeration existed, so none of them appeared."""
    anchor = '    # Whether to use pytorch symmetric memory for allreduce\n'
    var = ('    # One-shot all-reduce over PCIe peer memory.\n'
           '    "VLLM_PLANTED_FAST_PATH": lambda: bool(int(os.getenv("VLLM_PLANTED_FAST_PATH", "0"))),\n')
    choice = 'All2AllBackend = Literal[\n    "naive",\n'
    copy = engine_copy(v033, tmp_path / "v", {"vllm/envs.py": (anchor, var + anchor),
                                              "vllm/config/parallel.py": (choice, choice + '    "planted_ep",\n')})
    (copy / "vllm/distributed/device_communicators/planted_comm.py").write_text("class PlantedCommunicator: ...\n")
    text = (copy / "vllm/envs.py").read_text()
    line = text[:text.index('"VLLM_PLANTED_FAST_PATH":')].count("\n") + 1
    by = _rows(vp.inventory(_vl(copy)))
    assert (by["VLLM_PLANTED_FAST_PATH"]["status"], by["VLLM_PLANTED_FAST_PATH"]["where"]) == (
        "not-assessed", f"vllm/envs.py:{line}")
    assert "One-shot all-reduce over PCIe" in by["VLLM_PLANTED_FAST_PATH"]["why"]
    assert by["--all2all-backend planted_ep"]["status"] == "not-assessed"
    assert by["planted_comm.py"]["status"] == "unknown" and "not assessed" in by["planted_comm.py"]["why"]
    assert not {"VLLM_PLANTED_FAST_PATH", "--all2all-backend planted_ep", "planted_comm.py"} & set(
        _rows(vp.inventory(_vl(v033))))


def test_vllm_034_variables_come_from_the_live_table_not_the_removed_one():
    """vllm 0.34.0 declares ``removed_environment_variables`` before ``environment_variables`` in envs.py; a reader
    that took the first dict whose name contains "environment_variables" found no variable at all there."""
    rows = vp.inventory(_vl(pip_target("vllm==0.34.0"), "0.34.0"))
    env = {r["path"] for r in rows if r["kind"] == "environment variable"}
    assert len(env) >= 20 and {"VLLM_USE_NCCL_SYMM_MEM", "VLLM_FLASHINFER_ALLREDUCE_BACKEND"} <= env


def test_vllm_enumeration_that_finds_nothing_says_not_assessed(tmp_path):
    """A vLLM folder whose layout the reader does not know gives one not-assessed row, never an empty list."""
    (tmp_path / "vllm" / "config").mkdir(parents=True)
    out = vp.report_paths(None, eng=ve.Engine("9.9.9", tmp_path / "vllm"))
    assert len(out) == 1 and out[0]["backend"] == "vllm-paths" and out[0]["status"] == "not-assessed"
    assert "could not be enumerated" in out[0]["cause"]


# --- point 7 for vLLM: the report ----------------------------------------------------------------------------------
DRIVER = """
import json, sys
from stackprobe.static import run_static
from stackprobe.serverconfig import ServerConfig
from stackprobe.engines import select
sc = ServerConfig(args={}, env={}, source="test")
print(json.dumps(run_static(server_config=sc, engines=select(sys.argv[1]), topology="pcie", world_size=8,
                            backends=["nccl-symm-mem"]).to_json(), default=str))
"""


def _report(venv, paths, engine, tmp_path):
    script = tmp_path / "drive.py"
    script.write_text(DRIVER)
    p = subprocess.run([str(venv), str(script), engine], capture_output=True, text=True, timeout=900,
                       env=suite_env(paths))
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads(p.stdout)
    return d, Report.from_json(d)


def test_point7_vllm_report_lists_its_not_assessed_settings_in_json_and_markdown(venv, v033, tmp_path):
    """Before: a vLLM report's ``paths`` was empty, so its Markdown had no "Not assessed here" section."""
    d, report = _report(venv, [v033, pip_target("flashinfer-python==0.7.2.post1")], "vllm", tmp_path)
    names = {p["backend"] for p in report.paths}
    assert {"--enable-dbo", "--all2all-backend deepep_low_latency", "--dcp-comm-backend"} <= names
    assert not {"VLLM_USE_NCCL_SYMM_MEM", "--disable-custom-all-reduce",
                "VLLM_FLASHINFER_ALLREDUCE_BACKEND"} & names     # assessed: not listed
    md = report.to_markdown()
    assert f"## Not assessed here ({len(report.paths)})" in md
    assert "| --enable-dbo |" in md and "vllm/config/parallel.py:258" in md


def test_point7_twin_an_sglang_only_report_has_no_vllm_rows(venv, sglang059, tmp_path):
    _, report = _report(venv, [sglang059], "sglang", tmp_path)
    assert report.paths and not [p for p in report.paths if p["backend"].startswith(("VLLM_", "--all2all-backend"))]


def test_point7_twin_the_same_vllm_report_without_paths_has_no_such_section(venv, v033, tmp_path):
    import copy
    _, report = _report(venv, [v033, pip_target("flashinfer-python==0.7.2.post1")], "vllm", tmp_path)
    bare = copy.copy(report)
    bare.engines = [{k: v for k, v in e.items() if k != "paths"} for e in report.engines]   # schema 4: per engine
    assert report.paths and not bare.paths
    assert "## Not assessed here" not in bare.to_markdown()


def test_a_source_file_that_does_not_parse_is_named_not_dropped(v033, tmp_path):
    """A file the enumeration reads settings from that does not parse (here vLLM's envs.py, with its ~35
    variables) is named as not assessed in the report's paths, not skipped in silence. Twin: the unedited wheel
    names no such file; SGLang's reader does the same for its srt/environ.py."""
    from stackprobe.archs import parse_arch

    class Ctx:
        target, topology, world_size, topology_source = parse_arch("12.0"), "pcie", 8, "given"

    copy = engine_copy(v033, tmp_path / "v", {"vllm/envs.py": ("environment_variables", "environment_variables ((")})
    rows = [v.backend for v in vp.paths(_vl(copy), Ctx())]
    assert "vllm/envs.py" in rows
    assert not [r for r in (v.backend for v in vp.paths(_vl(v033), Ctx())) if r.endswith(".py") and "/" in r]
    sg = engine_copy(pip_target("sglang==0.5.23"), tmp_path / "s",
                     {"sglang/srt/environ.py": ("class Envs", "class Envs((")})
    from stackprobe.engines.sglang import paths as sp
    got = [v for v in sp.paths(_sg(sg, "0.5.23"), Ctx()) if v.backend == "sglang/srt/environ.py"]
    assert got and "does not parse" in got[0].cause
