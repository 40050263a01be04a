"""SGLang-side gates read from the real sglang 0.5.23 wheel's source (custom allreduce heuristic, the
symm-mem size table of case C11, the FlashInfer all-to-all preconditions), and from small sglang-like
fixture trees that vary what the real one has (a subscript lookup, a table that has key 12)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from validate_support import evidence, pip_target, run_suite, verdict

pytestmark = pytest.mark.network

SYMM = "torch-symm-mem"
CAR = "sglang-custom-allreduce"
EP = "ep-flashinfer-a2a"


@pytest.fixture(scope="module")
def real(venv, sglang, kern):
    return {
        "tp8": run_suite(venv, [sglang, kern], ["--backend", SYMM, "--backend", CAR])[0],
        "tp2": run_suite(venv, [sglang, kern], ["--backend", CAR, "--world-size", "2"])[0],
        "nvlink": run_suite(venv, [sglang, kern], ["--backend", CAR, "--topology", "nvlink"])[0],
    }


def test_c11_real_sglang_table_has_no_key_12(real):
    v = verdict(real["tp8"], SYMM, "engine")
    keys = evidence(v, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys")
    assert keys["value"] == {"admits": False, "value": [9, 10]}
    assert keys["source"].startswith("sglang/srt/distributed/device_communicators/") and "(ast)" in keys["source"]
    assert v["status"] == "falls-back-if-set" and v["gate"] == "python-table"
    assert "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES" in v["cause"] and "major 12" in v["cause"]
    assert "no CUDA upgrade" in v["cause"] and v["lift"] != "cuda-upgrade"
    # 0.5.23 looks the major up with .get(): the KeyError became a clean disable
    assert "lookup get at" in keys["source"]


def _fake_sglang(root: Path, table_src: str, lookup_src: str) -> Path:
    pkg = root / "sglang"
    comm = pkg / "srt" / "distributed" / "device_communicators"
    comm.mkdir(parents=True)
    for d in (pkg, pkg / "srt", pkg / "srt" / "distributed", comm):
        (d / "__init__.py").write_text("")
    (comm / "all_reduce_utils.py").write_text(textwrap.dedent(table_src))
    (comm / "torch_symm_mem.py").write_text(textwrap.dedent(lookup_src))
    # the server argument, as 0.5.9 declares it (the engine answer reads it and fails closed without it)
    (pkg / "srt" / "server_args.py").write_text(textwrap.dedent("""
        class ServerArgs:
            enable_torch_symm_mem: bool = False
        def add_cli_args(parser):
            parser.add_argument("--enable-torch-symm-mem", action="store_true")
    """))
    info = root / "sglang-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.1\n")
    (info / "RECORD").write_text("")
    return root


TABLE_9_10 = """
    MiB = 1024 * 1024
    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
        9: {2: 64 * MiB, 4: 64 * MiB, 6: 128 * MiB, 8: 128 * MiB},
        10: {2: 64 * MiB, 4: 64 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    }
"""
SUBSCRIPT = """
    from .all_reduce_utils import TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
    def max_size(major, world_size):
        return TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[major][world_size]
    def enabled(handle):
        if handle.multicast_ptr == 0:
            return False
        return True
"""


def test_c11_subscript_lookup_is_named_as_keyerror_12(venv, tmp_path):
    root = _fake_sglang(tmp_path, TABLE_9_10, SUBSCRIPT)
    v = verdict(run_suite(venv, [root], ["--backend", SYMM])[0], SYMM, "engine")
    assert v["status"] == "blocked" and v["gate"] == "python-table"
    assert "`KeyError: 12`" in v["cause"]
    assert "lookup subscript at" in evidence(v, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys")["source"]


def test_c11_a_table_with_key_12_passes_on_nvlink_and_the_value_is_read_not_assumed(venv, tmp_path):
    table = TABLE_9_10.replace("    }\n", "        12: {2: 32 * MiB, 8: 64 * MiB},\n    }\n")
    root = _fake_sglang(tmp_path, table, SUBSCRIPT)
    report = run_suite(venv, [root], ["--backend", SYMM, "--topology", "nvlink"])[0]
    v = verdict(report, SYMM, "engine")
    assert evidence(v, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys")["value"]["value"] == [9, 10, 12]
    assert evidence(v, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[12] world sizes")["value"]["value"] == [2, 8]
    # every gate past the flag admits; the flag is off by default, so the answer is that setting
    assert v["status"] == "opt-in" and v["gate"] == "setting" and v["lift"] == "setting"
    assert v["lift_detail"] == "--enable-torch-symm-mem (off by default in sglang 0.0.1)"
    # and for a world size the table lacks, the same table blocks
    v6 = verdict(run_suite(venv, [root], ["--backend", SYMM, "--world-size", "6", "--topology", "nvlink"])[0], SYMM, "engine")
    assert v6["status"] == "blocked" and "world size 6" in v6["cause"]


def test_custom_allreduce_pcie_heuristic_from_the_installed_source(real):
    v = verdict(real["tp8"], CAR, "engine")
    rule = evidence(v, "engine gate: PCIe world-size rule")
    assert rule["value"]["value"] == "disabled when world_size > 2 without full NVLink"
    assert "custom_all_reduce_utils.py" in rule["source"] and "world_size > 2" in rule["source"]
    assert evidence(v, "engine gate: CustomAllreduce._SUPPORTED_WORLD_SIZES")["value"]["value"] == [2, 4, 6, 8]
    assert v["status"] == "blocked" and v["gate"] == "topology" and v["lift"] == "nothing-on-this-topology"
    ops = evidence(verdict(real["tp8"], CAR, "library"), "sglang-kernel common_ops coverage")["value"]
    assert ops and all(level == "native" and "sm_120a" in sass for _, level, sass in ops)
    # at TP2, or on NVLink, the heuristic admits it and the kernels carry sm_120a
    assert verdict(real["tp2"], CAR, "engine")["status"] == "on-by-default"
    assert verdict(real["nvlink"], CAR, "engine")["status"] == "on-by-default"
    assert verdict(real["tp2"], CAR, "library")["status"] == "gate-passes"


def test_ep_flashinfer_a2a_preconditions_and_api_match(venv, sglang):
    fi16, fi74 = pip_target("flashinfer-python==0.6.16"), pip_target("flashinfer-python==0.7.4")
    r16 = run_suite(venv, [sglang, fi16], ["--backend", EP])[0]
    r74 = run_suite(venv, [sglang, fi74], ["--backend", EP])[0]
    v16, v74 = verdict(r16, EP, "engine"), verdict(r74, EP, "engine")
    # no topology gate on this path: with FlashInfer 0.6.16 only settings remain (opt-in: the a2a backend, DP attention
    # with dp == tp, the MoE runner); with 0.7.4 the names its dispatcher imports are missing (blocked, python-table)
    assert v16["status"] == "opt-in" and v16["gate"] == "setting"
    assert v74["status"] == "blocked" and v74["gate"] == "python-table"
    for v in (v16, v74):
        pre = evidence(v, "engine gate: required setting: DP attention")
        assert pre["value"]["admits"] is False and pre["value"]["value"]["admits"] == [False, True]
        assert pre["source"].startswith("sglang/srt/arg_groups/moe_hook.py:43 _flashinfer_a2a_topology_is_supported")
    # 0.5.23 deprecates --enable-dp-attention for --attn-dp-size (srt/server_args.py:416-424; issue 39 point 1c)
    assert v16["lift"] == "setting" and "--attn-dp-size 8" in v16["lift_detail"]
    names = evidence(v16, "engine gate: FlashInfer names the a2a dispatcher imports")
    assert names["value"]["admits"] is True and "flashinfer.comm.MoeAlltoAll" in names["value"]["value"]
    miss = evidence(v74, "engine gate: FlashInfer names the a2a dispatcher imports")
    assert miss["value"]["admits"] is False and "flashinfer.comm.MoeAlltoAll" in miss["value"]["value"]
    assert v74["lift"] == "package-upgrade" and "does not export" in v74["cause"]


def test_c11_older_real_sglang_raises_keyerror_12(venv):
    """sglang 0.5.9 (the CUDA 12.8 recipe's pin) indexes the table directly: the real `KeyError: 12`."""
    v = verdict(run_suite(venv, [pip_target("sglang==0.5.9")], ["--backend", SYMM])[0], SYMM, "engine")
    keys = evidence(v, "engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys")
    assert keys["value"]["value"] == [9, 10] and "lookup subscript at" in keys["source"]
    assert v["status"] == "startup-failure-if-set" and v["gate"] == "python-table" and "`KeyError: 12`" in v["cause"]


def test_mscclpp_world_sizes_from_sglang_and_kernels_from_sglang_kernel(venv, sglang):
    kern = pip_target("sglang-kernel==0.4.10")
    r8 = run_suite(venv, [sglang, kern], ["--backend", "mscclpp"])[0]
    v8 = verdict(r8, "mscclpp", "engine")
    sizes = evidence(v8, "engine gate: PyMscclppCommunicator supported world sizes")
    assert 8 in sizes["value"]["value"] and "pymscclpp.py" in sizes["source"]
    assert all(level == "native" for _, level in evidence(verdict(r8, "mscclpp", "library"), "sglang-kernel common_ops")["value"])
    assert v8["status"] == "not-installed" and v8["gate"] == "not-installed"        # C15: no standalone mscclpp
