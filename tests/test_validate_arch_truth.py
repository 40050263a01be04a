"""CUDA's compatibility rules, toolkit coherence, driver floors and known-bad releases (cases C24-C29),
on real binaries: shared objects and cubins built by a real nvcc 13.1 (PyPI wheels), torch 2.15.0's own
libraries read from its PyPI wheel, libnccl from nvidia-nccl-cu12 2.25.1, and the mixed CUDA 13 wheels
the 13.1 runtime lock once installed side by side."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stackprobe import driver as drivermod
from stackprobe import env as envmod
from stackprobe import known_bad
from stackprobe.archs import parse_arch
from stackprobe.coverage import file_level, read_elf, scan_files

from validate_support import (cuda_home, evidence, mixed_cuda_site, pip_target, run_suite,
                              suite_venv, venv_without, verdict, wheel_members)

pytestmark = pytest.mark.network

KERNEL = ('extern "C" __global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n'
          'extern "C" int host_entry() { return 7; }\n')
OTHER = 'extern "C" __global__ void shift(float *x, float a) { x[threadIdx.x] += a; }\n'


def nvcc(home: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(home / "bin" / "nvcc"), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Libraries and cubins from nvcc 13.1: plain sm_120, sm_80, sm_120a, PTX-only compute_90, a two-CU
    library whose second CU has sm_80 only (partial for 12.0), and raw sm_120 / sm_120a / sm_120f cubins."""
    home = cuda_home()
    d = tmp_path_factory.mktemp("c24")
    (d / "k.cu").write_text(KERNEL)
    (d / "o.cu").write_text(OTHER)
    libs = {"plain120.so": ["arch=compute_120,code=sm_120"], "sm80.so": ["arch=compute_80,code=sm_80"],
            "arch120a.so": ["arch=compute_120a,code=sm_120a"], "ptx90.so": ["arch=compute_90,code=compute_90"]}
    out = {}
    for name, gencodes in libs.items():
        args = ["-shared", "-Xcompiler", "-fPIC", "-cudart", "none", "-o", name, "k.cu"]
        for g in gencodes:
            args += ["-gencode", g]
        p = nvcc(home, *args, cwd=d)
        assert p.returncode == 0, p.stderr
        out[name] = d / name
    for src, gencodes in (("k.cu", ["arch=compute_80,code=sm_80", "arch=compute_120,code=sm_120"]),
                          ("o.cu", ["arch=compute_80,code=sm_80"])):
        args = ["-c", "-Xcompiler", "-fPIC", "-o", src + ".o", src]
        for g in gencodes:
            args += ["-gencode", g]
        assert nvcc(home, *args, cwd=d).returncode == 0
    p = nvcc(home, "-shared", "-cudart", "none", "-o", "twocu.so", "k.cu.o", "o.cu.o", cwd=d)
    assert p.returncode == 0, p.stderr
    out["twocu.so"] = d / "twocu.so"
    for sfx in ("", "a", "f"):
        p = nvcc(home, "-cubin", "-o", f"k120{sfx}.cubin", "-gencode", f"arch=compute_120{sfx},code=sm_120{sfx}", "k.cu",
                 cwd=d)
        assert p.returncode == 0, p.stderr
        out[f"k120{sfx}.cubin"] = d / f"k120{sfx}.cubin"
    assert nvcc(home, "-ptx", "-o", "k90.ptx", "-arch=compute_90", "k.cu", cwd=d).returncode == 0
    out["k90.ptx"] = d / "k90.ptx"
    return out


def level(path: Path, target: str) -> tuple[str, dict]:
    return file_level(read_elf(str(path)), parse_arch(target))


# ------------------------------------------------------------------------------------------- C24
def test_c24_plain_sass_runs_on_a_higher_minor_of_its_major(built):
    assert level(built["plain120.so"], "12.0")[0] == "native"
    assert level(built["plain120.so"], "12.1")[0] == "same-major"     # was "none": the C24 defect
    assert level(built["sm80.so"], "8.6")[0] == "same-major"
    assert level(built["sm80.so"], "8.9")[0] == "same-major"
    # and where CUDA's rule says no: another major, or a lower minor
    assert level(built["sm80.so"], "9.0")[0] == "none"
    assert level(built["sm80.so"], "7.5")[0] == "none"
    assert level(built["plain120.so"], "10.0")[0] == "none"


def test_c24_arch_specific_sass_runs_only_on_its_own_compute_capability(built):
    assert level(built["arch120a.so"], "12.0")[0] == "native"
    assert level(built["arch120a.so"], "12.1")[0] == "none"


def test_c24_raw_cubins_keep_their_a_and_f_suffix(built):
    names = {k: [i.name for i in read_elf(str(built[k]))] for k in ("k120.cubin", "k120a.cubin", "k120f.cubin")}
    assert names == {"k120.cubin": ["sm_120"], "k120a.cubin": ["sm_120a"], "k120f.cubin": ["sm_120f"]}
    assert level(built["k120a.cubin"], "12.1")[0] == "none"
    assert level(built["k120f.cubin"], "12.1")[0] == "family"
    assert level(built["k120.cubin"], "12.1")[0] == "same-major"


def test_c24_a_file_where_the_target_has_fewer_fatbins_is_partial_with_counts(built):
    lvl, detail = level(built["twocu.so"], "12.0")
    assert lvl == "partial"
    assert detail["target"] == 1 and detail["most"] == 2 and detail["most_arch"] == "sm_80" and detail["unit"] == "fatbins"
    assert level(built["twocu.so"], "8.0")[0] == "native"             # every CU has sm_80: not partial
    cov = scan_files([("twocu.so", str(built["twocu.so"]))], parse_arch("12.0"), "elf", package="twocu")
    assert cov.level == "partial" and cov.files_partial == ["twocu.so"]


def test_c24_torch_2_15_0_wheel_at_12_1_reads_same_major_not_partial():
    libs = wheel_members("torch==2.15.0", "torch/lib/", ".so")
    files = [(name, str(path)) for name, path in libs.items()]
    cov121 = scan_files(files, parse_arch("12.1"), "elf", package="torch", version="2.15.0")
    by = {f.path: f for f in cov121.files}
    cuda = by["torch/lib/libtorch_cuda.so"]
    assert "sm_120" in cuda.sass and "sm_121a" in cuda.sass
    # one CU carries sm_121a (exact); the rest run by binary compatibility from sm_120
    assert cuda.level == "same-major" and cuda.detail["levels"].get("native") == 1
    assert cuda.detail["target"] == cuda.detail["most"]
    assert by["torch/lib/libtorch_cuda_linalg.so"].level == "same-major"
    assert cov121.level == "same-major" and not cov121.files_without
    assert scan_files(files, parse_arch("12.0"), "elf", package="torch").level == "native"
    # the control: no SASS or PTX of its builds runs on 11.0 (Thor), which CUDA's rules refuse
    assert scan_files(files, parse_arch("11.0"), "elf", package="torch").level == "none"


# ------------------------------------------------------------------------------------------- C27
def test_c27_ptx_only_row_names_the_ptx_isa_and_the_driver_that_can_jit_it(built):
    lvl, detail = level(built["ptx90.so"], "12.0")
    isa = re.search(r"^\.version (\d+\.\d+)", built["k90.ptx"].read_text(), re.M).group(1)
    assert lvl == "ptx-only" and detail["ptx_isa"] == [isa] == ["9.1"]     # nvcc 13.1 writes PTX ISA 9.1
    assert detail["ptx_needs"] == "PTX ISA 9.1: a driver for CUDA >= 13.1 (>= 590.44.01)"
    cov = scan_files([("ptx90.so", str(built["ptx90.so"]))], parse_arch("12.0"), "elf", package="p")
    old = drivermod.ptx_too_new([cov], {"version": "580.65.06", "cuda": "13.0"})
    assert old == [{"package": "p", "path": "ptx90.so", "ptx_isa": "9.1", "needs_cuda": "13.1", "driver_cuda": "13.0"}]
    assert drivermod.ptx_too_new([cov], {"version": "590.44.01", "cuda": "13.1"}) == []


def test_c27_ptx_isa_of_nvcc_13_5_is_9_5(tmp_path):
    home = mixed_cuda_site() / "nvidia" / "cu13"
    (tmp_path / "k.cu").write_text(KERNEL)
    p = nvcc(home, "-shared", "-Xcompiler", "-fPIC", "-cudart", "none", "-o", "p.so", "k.cu",
             "-gencode", "arch=compute_90,code=compute_90", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lvl, detail = level(tmp_path / "p.so", "12.0")
    assert lvl == "ptx-only" and detail["ptx_isa"] == ["9.5"]
    assert drivermod.ptx_too_new([scan_files([("p.so", str(tmp_path / "p.so"))], parse_arch("12.0"), "elf")],
                                 {"version": "580.95.05", "cuda": "13.0"})[0]["needs_cuda"] == "13.5"


# ------------------------------------------------------------------------------------------- C25
THRUST = ("#include <thrust/device_vector.h>\n#include <thrust/reduce.h>\n"
          "int sum(int n) { thrust::device_vector<int> v(n, 1); return thrust::reduce(v.begin(), v.end()); }\n")


def test_c25_mixed_cuda_wheels_fail_a_cccl_compile_and_the_report_flags_the_root(tmp_path):
    site = mixed_cuda_site()
    home = site / "nvidia" / "cu13"
    (tmp_path / "t.cu").write_text(THRUST)
    p = nvcc(home, "-c", "-o", "t.o", "t.cu", "-gencode", "arch=compute_120f,code=sm_120f", cwd=tmp_path)
    assert p.returncode != 0 and "CUDA compiler and CUDA toolkit headers are incompatible" in p.stderr
    sys.path.insert(0, str(site))
    try:
        roots = envmod.toolkit_roots()
    finally:
        sys.path.remove(str(site))
    root = next(r for r in roots if r["root"] == str(home))
    assert root["nvcc"] == "13.5" and root["cudart"] == "13.0" and root["coherent"] is False
    assert root["wheels"]["nvidia-cuda-cccl"] == "13.3.5.0.6"
    findings = envmod.toolkit_findings(roots)
    assert any(f["case"] == "C25" and f["level"] == "error" and str(home) in f["message"] for f in findings)


def test_c25_a_coherent_toolkit_compiles_and_reads_coherent(tmp_path):
    home = cuda_home()
    (tmp_path / "t.cu").write_text(THRUST)
    p = nvcc(home, "-c", "-o", "t.o", "t.cu", "-gencode", "arch=compute_120f,code=sm_120f", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    site = home.parent.parent
    sys.path.insert(0, str(site))
    try:
        roots = envmod.toolkit_roots()
    finally:
        sys.path.remove(str(site))
    root = next(r for r in roots if r["root"] == str(home))
    assert root["nvcc"] == root["cudart"] == "13.1" and root["coherent"] is True
    assert envmod.toolkit_findings([root]) == []


def test_c25_suite_report_shows_every_root_and_the_error(tmp_path):
    py = suite_venv()
    report, _ = run_suite(py, [mixed_cuda_site()], ["--backend", "nccl-ring"], cuda=cuda_home())
    roots = report["environment"]["toolkit_roots"]
    assert any(r["coherent"] is True and "CUDA_HOME" in r["found_by"] for r in roots)
    assert any(r["coherent"] is False and r["nvcc"] == "13.5" for r in roots)
    assert any(f["case"] == "C25" for f in report["environment"]["findings"])
    assert report["environment"]["driver"] == {"none": "no driver: static only"} or report["environment"]["driver"].get("version")
    md = subprocess.run([str(py), "-m", "stackprobe", "--quiet", "--backend", "nccl-ring", "--markdown", "-"],
                        capture_output=True, text=True,
                        env=__import__("validate_support").suite_env([mixed_cuda_site()], cuda=cuda_home())).stdout
    assert "## Toolkit roots" in md and "**no**: nvcc is CUDA 13.5" in md


# ------------------------------------------------------------------------------------------- C26
@pytest.fixture(scope="module")
def nccl225():
    return pip_target("nvidia-nccl-cu12==2.25.1")


def test_c26_libnccl_2_25_1_is_scanned_and_the_baseline_is_flagged_on_sm120(nccl225):
    report, _ = run_suite(suite_venv(), [nccl225], ["--backend", "nccl-ring", "--target-arch", "12.0"])
    cov = next(c for c in report["coverage"] if c["package"] == "libnccl")
    assert cov["version"] == "2.25.1" and cov["source"] == "nvidia-nccl-cu12"
    f = cov["files"][0]
    assert cov["level"] == "ptx-only" and "sm_90" in f["sass"] and f["ptx"] == ["compute_90"]
    assert f["ptx_isa"] == ["8.2"]
    v = verdict(report, "nccl-ring")
    assert v["status"] == "blocked" and v["gate"] == "known-bad-release"
    assert "nccl-sm120-before-2.26.2" in v["cause"] and "2.26.2" in v["lift_detail"]
    assert "github.com/NVIDIA/nccl-tests/issues/287" in v["cause"]
    assert evidence(v, "libnccl coverage")["value"]["level"] == "ptx-only"


def test_c26_the_same_library_passes_where_the_advisory_does_not_apply(nccl225):
    report, _ = run_suite(suite_venv(), [nccl225], ["--backend", "nccl-ring", "--target-arch", "9.0"])
    v = verdict(report, "nccl-ring")
    assert v["status"] == "gate-passes"
    assert evidence(v, "libnccl coverage")["value"]["level"] == "native"


def test_known_bad_data_is_read_and_matched_without_code():
    entries = known_bad.load()
    e = next(x for x in entries if x.id == "nccl-sm120-before-2.26.2")
    assert e.applies("2.25.1", "12.0") and not e.applies("2.26.2", "12.0") and not e.applies("2.25.1", "9.0")
    assert known_bad.version_matches("0.6.5", ">=0.6.0,<0.6.17") and not known_bad.version_matches("0.6.17", ">=0.6.0,<0.6.17")


def test_known_bad_file_errors_name_the_entry(tmp_path):
    bad = tmp_path / "kb.toml"
    bad.write_text('[[release]]\nid = "x"\npackage = "nccl"\nversions = "2.26"\nsymptom = "s"\nfixed_in = "1"\nsource = "u"\n')
    with pytest.raises(known_bad.KnownBadError, match="no operator"):
        known_bad.load(bad)
    bad.write_text('[[release]]\nid = "y"\npackage = "nccl"\nversions = "<2"\n')
    with pytest.raises(known_bad.KnownBadError, match="y.*lacks symptom"):
        known_bad.load(bad)


# ------------------------------------------------------------------------------------------- C28
def test_c28_driver_floor_blocks_every_verdict_with_the_lift():
    low = drivermod.driver_floor("13.0", {"version": "575.57.08", "cuda": "12.9"})
    assert low and low["lift"] == "driver >= 580"
    assert drivermod.driver_floor("13.0", {"version": "580.65.06", "cuda": "13.0"}) is None
    assert drivermod.driver_floor("12.8", {"version": "575.57.08", "cuda": "12.9"}) is None
    assert drivermod.driver_floor("13.0", {"none": drivermod.NO_DRIVER}) is None
    assert drivermod.parse_nvidia_smi("| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: 12.9  |") == \
        {"version": "575.57.08", "cuda": "12.9"}


def fake_nvidia_smi(folder: Path, driver: str, cuda: str) -> Path:
    """A stand-in ``nvidia-smi`` printing NVIDIA's banner line (no GPU host here; NVML is absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   f"echo '| NVIDIA-SMI {driver}      Driver Version: {driver}      CUDA Version: {cuda}     |'\n")
    exe.chmod(0o755)
    return exe


def test_c28_a_cuda_13_stack_on_an_older_driver_reads_blocked_driver(tmp_path):
    smi = fake_nvidia_smi(tmp_path / "old", "575.57.08", "12.9").parent
    report, _ = run_suite(suite_venv(), [], ["--backend", "nccl-ring", "--backend", "nccl-tree"], cuda=cuda_home(),
                          path_first=[smi])
    assert report["environment"]["driver"]["version"] == "575.57.08"
    for b in ("nccl-ring", "nccl-tree"):
        v = verdict(report, b)
        assert v["status"] == "blocked" and v["gate"] == "driver" and v["lift_detail"] == "driver >= 580"
    assert any(f["case"] == "C28" for f in report["environment"]["findings"])
    ok = fake_nvidia_smi(tmp_path / "new", "580.95.05", "13.0").parent
    report, _ = run_suite(suite_venv(), [], ["--backend", "nccl-ring"], cuda=cuda_home(), path_first=[ok])
    assert verdict(report, "nccl-ring")["gate"] != "driver"


# ------------------------------------------------------------------------------------------- C29
FUSION = "flashinfer-allreduce-fusion"


def test_c29_flashinfer_without_apache_tvm_ffi_reads_not_installed():
    fi = pip_target("flashinfer-python==0.7.4")
    py = venv_without(["apache-tvm-ffi"])
    report, _ = run_suite(py, [fi], ["--backend", FUSION], cuda=cuda_home())
    v = verdict(report, FUSION)
    assert v["status"] == "blocked" and v["gate"] == "not-installed"
    assert v["cause"].startswith("not installed: apache-tvm-ffi") and "C4" not in v["cause"]
    assert evidence(v, "missing dependency")["value"]["required_by"] == "flashinfer-python"
    # the control: with the dependency present the verdict is FlashInfer's own gate, not a missing package
    full, _ = run_suite(suite_venv(), [fi], ["--backend", FUSION], cuda=cuda_home())
    assert verdict(full, FUSION)["gate"] != "not-installed"


def test_c29_an_undeclared_missing_module_is_not_blamed_on_a_distribution():
    from stackprobe.gates import missing_dependency
    assert missing_dependency("ModuleNotFoundError: No module named 'not_a_dependency_xyz'", ["pytest"]) is None
    assert missing_dependency("ValueError: something else", ["pytest"]) is None


def test_report_json_round_trip_keeps_the_new_fields(built, tmp_path):
    cov = scan_files([("twocu.so", str(built["twocu.so"]))], parse_arch("12.0"), "elf", package="twocu")
    d = json.loads(json.dumps(cov.to_json()))
    assert d["files"][0]["detail"]["target"] == 1 and d["files_partial"] == ["twocu.so"]


def test_c27_a_verdict_on_ptx_the_driver_cannot_jit_says_so(built):
    from stackprobe.verdict import Verdict
    cov = scan_files([("ptx90.so", str(built["ptx90.so"]))], parse_arch("12.0"), "elf", package="libnccl")
    uses = Verdict("nccl-ring", "gate-passes").add("libnccl coverage", "ptx-only", "libnccl: ptx90.so")
    other = Verdict("b12x", "gate-passes").add("b12x version", "1.0", "metadata")
    old = drivermod.ptx_too_new([cov], {"version": "580.65.06", "cuda": "13.0"})
    drivermod.apply_ptx_driver([uses, other], old)
    assert uses.status == "blocked" and uses.gate == "driver" and "cudaErrorUnsupportedPtxVersion" in uses.cause
    assert uses.lift_detail == "a driver for CUDA >= 13.1 (>= 590.44.01)"
    assert other.status == "gate-passes"
    fine = Verdict("nccl-ring", "gate-passes").add("libnccl coverage", "ptx-only", "libnccl: ptx90.so")
    drivermod.apply_ptx_driver([fine], drivermod.ptx_too_new([cov], {"version": "590.44.01", "cuda": "13.1"}))
    assert fine.status == "gate-passes"


def test_c24_sglang_kernel_custom_allreduce_at_8_6_is_not_a_false_binary_gate():
    """sglang-kernel 0.4.10's common_ops carries sm_80 SASS: it runs on 8.6 (same major, higher minor), so
    at TP2 the custom allreduce gate passes; at 7.5 nothing runs and the compiled-binary gate holds."""
    paths = [pip_target("sglang==0.5.23"), pip_target("sglang-kernel==0.4.10")]
    args = ["--backend", "sglang-custom-allreduce", "--world-size", "2"]
    v86 = verdict(run_suite(suite_venv(), paths, args + ["--target-arch", "8.6"])[0], "sglang-custom-allreduce")
    assert v86["status"] == "gate-passes", v86["cause"]
    ops = evidence(v86, "sglang-kernel common_ops coverage")["value"]
    assert any(level == "same-major" and "sm_80" in sass for _, level, sass in ops)
    v75 = verdict(run_suite(suite_venv(), paths, args + ["--target-arch", "7.5"])[0], "sglang-custom-allreduce")
    assert v75["status"] == "blocked" and v75["gate"] == "compiled-binary"


def test_c26_a_libnccl_without_any_image_for_the_target_blocks_the_baseline(built):
    from types import SimpleNamespace
    from stackprobe.gates import nccl_library_gate
    from stackprobe.verdict import Verdict
    cov = scan_files([("nvidia/nccl/lib/libnccl.so.2", str(built["sm80.so"]))], parse_arch("12.0"), "elf",
                     package="libnccl", version="2.99.0")
    ctx = SimpleNamespace(coverage={"libnccl": cov}, target=parse_arch("12.0"), topology="pcie")
    ring = nccl_library_gate(ctx, [Verdict("nccl-ring", "gate-passes")], "2.99.0")[0]
    assert ring.status == "blocked" and ring.gate == "compiled-binary" and "sm_80" in ring.cause
    ctx86 = SimpleNamespace(coverage={"libnccl": scan_files([("l", str(built["sm80.so"]))], parse_arch("8.6"), "elf")},
                            target=parse_arch("8.6"), topology="pcie")
    assert nccl_library_gate(ctx86, [Verdict("nccl-ring", "gate-passes")], "2.99.0")[0].status == "gate-passes"
