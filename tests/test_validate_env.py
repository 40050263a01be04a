"""Environment report (case C5): an older nvcc earlier on PATH than CUDA_HOME's nvcc is flagged, with
the real nvcc 13.1 from PyPI under CUDA_HOME and a stand-in older nvcc on PATH."""
from __future__ import annotations

import pytest

from stackprobe import env as envmod

from validate_support import cuda_home, fake_nvcc, run_suite, suite_venv

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cuda13():
    return cuda_home()


def test_c5_older_nvcc_first_on_path_is_flagged(cuda13, tmp_path, monkeypatch):
    old = fake_nvcc(tmp_path / "old-cuda" / "bin", "12.4", "12.4.131")
    monkeypatch.setenv("PATH", f"{old.parent}:{cuda13 / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(cuda13))
    nv = envmod.find_nvccs()
    assert nv["path"]["release"] == "12.4" and nv["path"]["path"] == str(old)
    assert nv["cuda_home_nvcc"]["release"] == "13.1" and nv["cuda_home_nvcc"]["version"] == "13.1.115"
    found = envmod.nvcc_findings(nv, torch_cuda="13.0")
    c5 = [f for f in found if f["case"] == "C5" and f["level"] == "error"]
    assert any(str(old) in f["message"] and str(cuda13 / "bin" / "nvcc") in f["message"] for f in c5)
    # and the PATH nvcc's CUDA major differs from torch's
    assert any("CUDA 12.4 but torch was built with CUDA 13.0" in f["message"] for f in c5)


def test_c5_consistent_toolkit_gives_no_finding(cuda13, monkeypatch):
    monkeypatch.setenv("PATH", f"{cuda13 / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(cuda13))
    nv = envmod.find_nvccs()
    assert nv["path"]["realpath"] == nv["cuda_home_nvcc"]["realpath"]
    assert [f for f in envmod.nvcc_findings(nv, torch_cuda="13.1") if f["level"] in ("error", "warning")] == []
    minor = envmod.nvcc_findings(nv, torch_cuda="13.0")
    assert [f["level"] for f in minor] == ["info", "info"]            # same major: minor-version compatible


def test_c5_in_the_report_of_a_real_run(cuda13, tmp_path):
    old = fake_nvcc(tmp_path / "old" / "bin", "12.6", "12.6.85")
    report, _ = run_suite(suite_venv(), [], ["--backend", "nccl-ring", "--markdown", str(tmp_path / "r.md")],
                          cuda=cuda13, path_first=[old.parent])
    env = report["environment"]
    assert env["nvcc"]["path"]["release"] == "12.6"
    assert env["nvcc"]["cuda_home_nvcc"]["release"] == "13.1"
    assert any(f["case"] == "C5" and f["level"] == "error" for f in env["findings"])
    assert env["torch"]["version"].startswith("2.13.0") and env["python"]["version"]
    md = (tmp_path / "r.md").read_text()
    assert "## Environment findings" in md and "(C5)" in md


def test_nccl_version_from_libnccl_and_c12_setting_form(tmp_path):
    """With a CPU torch (no NCCL inside), the version comes from the nvidia-nccl wheel's libnccl.so.2
    through ncclGetVersion(); NCCL_ALGO=Tree (process-wide) is named as the C12 fault, the
    per-collective form is not."""
    from validate_support import evidence, pip_target, verdict
    nccl = pip_target("nvidia-nccl-cu13==2.30.7")
    venv = suite_venv()
    args = ["--backend", "nccl-ring", "--backend", "nccl-tree"]
    plain, _ = run_suite(venv, [nccl], args)
    ring = verdict(plain, "nccl-ring")
    ver = evidence(ring, "NCCL version")
    assert ver["value"] == "2.30.7" and ver["source"].startswith("ncclGetVersion() of ") and "libnccl.so.2" in ver["source"]
    assert ring["status"] == "gate-passes"
    tree = verdict(plain, "nccl-tree")
    assert tree["status"] == "skipped" and tree["gate"] == "needs-runtime"
    forced, _ = run_suite(venv, [nccl], args, extra_env={"NCCL_ALGO": "Tree"})
    t = verdict(forced, "nccl-tree")
    assert t["status"] == "blocked" and t["gate"] == "setting" and "AllGather" in t["cause"] and "C12" in t["cause"]
    assert "allreduce:tree" in t["lift_detail"]
    per, _ = run_suite(venv, [nccl], args, extra_env={"NCCL_ALGO": "allreduce:tree"})
    assert verdict(per, "nccl-tree")["gate"] == "needs-runtime"


# `nvidia-smi topo -m` as recorded on a 2x H200 host (NVLink), header underlined with ANSI escapes
H200_TOPO = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
             "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
             "  PIX  = Connection traversing at most a single PCIe bridge\n"
             "  NV#  = Connection traversing a bonded set of # NVLinks\n")


def test_topology_matrix_parsing():
    t = envmod.parse_topology(H200_TOPO)
    assert t["pairs"] == 2 and t["nvlink_pairs"] == 2 and t["full_nvlink"]
    assert "\x1b" not in t["matrix"]
    pcie = H200_TOPO.replace("NV18", "SYS")
    p = envmod.parse_topology(pcie)
    assert p["pairs"] == 2 and p["nvlink_pairs"] == 0 and not p["full_nvlink"]


def test_every_nvcc_in_reach_is_listed_path_cuda_home_and_pypi_folders(cuda13, tmp_path, monkeypatch):
    """A "no nvcc" claim must rest on nothing being found: each nvcc on PATH (not only the first), CUDA_HOME's
    (the real PyPI 13.1 toolkit) and PyPI toolkit folders on sys.path (nvidia/cu13/bin, nvidia/cuda_nvcc/bin)."""
    import sys

    a = fake_nvcc(tmp_path / "a" / "bin", "12.8", "12.8.93")
    b = fake_nvcc(tmp_path / "b" / "bin", "12.9", "12.9.86")
    site = tmp_path / "site"
    pip = fake_nvcc(site / "nvidia" / "cuda_nvcc" / "bin", "12.8", "12.8.61")
    monkeypatch.setenv("PATH", f"{a.parent}:{b.parent}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(cuda13))
    monkeypatch.setattr(sys, "path", [str(site)] + sys.path)
    found = envmod.all_nvccs({"nvcc": envmod.find_nvccs()})
    by = {n["path"]: (n["found_by"], n["release"]) for n in found}
    assert by[str(a)] == (["PATH"], "12.8") and by[str(b)] == (["PATH"], "12.9")
    assert by[str(cuda13 / "bin" / "nvcc")] == (["CUDA_HOME"], "13.1")
    assert by[str(pip)] == (["PyPI toolkit"], "12.8")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent-cuda")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    # none of those left (this interpreter's own site-packages may still hold a PyPI toolkit)
    left = envmod.all_nvccs({"nvcc": envmod.find_nvccs()})
    assert not [n for n in left if n["found_by"] != ["PyPI toolkit"] or n["path"] == str(pip)], left


def test_nccl_tree_lift_is_the_setting_and_sglangs_own_switch():
    """Tree is turned on by a setting (the lift), and its speed is the runtime tier's question (the status)."""
    from stackprobe.probes import nccl
    from stackprobe.verdict import LIFT_SETTING

    class Ctx:
        env = {"torch": {"nccl_error": "no NCCL here"}}

    ring, tree = nccl.library_gate(Ctx())
    assert tree.status == "skipped"           # no NCCL at all: not installed, nothing to set
    import os
    from unittest import mock
    with mock.patch.object(nccl, "_nccl_version", return_value=("2.30.7", "test")), \
            mock.patch.object(nccl.gates, "nccl_library_gate", lambda *a, **k: None), \
            mock.patch.object(nccl, "_sglang_sets_tree", return_value="sglang/srt/server_args.py:2791"), \
            mock.patch.dict(os.environ, {"NCCL_ALGO": ""}):
        _, tree = nccl.library_gate(Ctx())
    assert tree.status == "skipped" and tree.gate == "needs-runtime" and tree.lift == LIFT_SETTING
    assert tree.lift_detail.startswith("NCCL_ALGO=allreduce:tree in the server's environment")
    assert "--enable-deterministic-inference, which sets it (sglang/srt/server_args.py:2791)" in tree.lift_detail
