"""Static arch coverage, for real: shared objects compiled by a real nvcc 13.1 (PyPI wheels) into a
fixture wheel (case C6), NVIDIA's cuobjdump as a cross-check of the fatbin reader, and the PyPI CUDA 13
sglang-kernel wheel (case C10)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from stackprobe.archs import parse_arch
from stackprobe.coverage import level_for, read_cuobjdump, read_elf, scan_files, scan_package

from validate_support import (build_fixture_wheel, cuda_home, cuobjdump, pip_target, run_suite, suite_venv)

pytestmark = pytest.mark.network

T120 = parse_arch("12.0")


@pytest.fixture(scope="module")
def nvcc():
    return cuda_home() / "bin" / "nvcc"


@pytest.fixture(scope="module")
def fixture_dirs(nvcc, tmp_path_factory):
    """Two fixture wheels, installed with pip into --target folders:
    c6old: libold.so (sm_80 + sm_90 SASS) and libptx.so (compute_90 PTX only);
    c6new: libnew.so (sm_80 + sm_120f SASS, the family target)."""
    out = tmp_path_factory.mktemp("wheels")
    old = build_fixture_wheel(out, "c6old", {"libold.so": ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"],
                                             "libptx.so": ["arch=compute_90,code=compute_90"]}, nvcc)
    new = build_fixture_wheel(out, "c6new", {"libnew.so": ["arch=compute_80,code=sm_80", "arch=compute_120f,code=sm_120f"]}, nvcc)
    dirs = {}
    for whl in (old, new):
        d = out / (whl.name.split("-")[0] + "-site")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(d), str(whl)], check=True)
        dirs[whl.name.split("-")[0]] = d
    return dirs


def test_c6_wheel_with_sm80_sm90_only_has_no_kernel_image_for_sm120(fixture_dirs):
    py = suite_venv()
    report, _ = run_suite(py, [fixture_dirs["c6old"]], ["--scan-dist", "c6old", "--backend", "nccl-ring"])
    cov = next(c for c in report["coverage"] if c["package"] == "c6old")
    by = {f["path"]: f for f in cov["files"]}
    assert by["c6old/libold.so"]["sass"] == ["sm_80", "sm_90"] and by["c6old/libold.so"]["level"] == "none"
    assert by["c6old/libptx.so"]["sass"] == [] and by["c6old/libptx.so"]["ptx"] == ["compute_90"]
    # PTX-only is a warning level of its own, not a pass; the package has no SASS for sm_120 at all
    assert by["c6old/libptx.so"]["level"] == "ptx-only"
    assert cov["level"] == "none"
    assert cov["files_without"] == ["c6old/libold.so"]          # C6 names the files
    assert cov["files_ptx_only"] == ["c6old/libptx.so"]
    md = subprocess.run([str(py), "-m", "stackprobe", "--quiet", "--scan-dist", "c6old", "--backend", "nccl-ring",
                         "--markdown", "-"], capture_output=True, text=True,
                        env=__import__("validate_support").suite_env([fixture_dirs["c6old"]])).stdout
    assert "| c6old | 1.0 | none |" in md and "c6old/libold.so" in md


def test_family_sass_covers_a_higher_minor_and_native_covers_its_own(fixture_dirs):
    files = [("c6new/libnew.so", str(fixture_dirs["c6new"] / "c6new" / "libnew.so"))]
    assert scan_files(files, T120, "elf", package="c6new").level == "native"
    cov121 = scan_files(files, parse_arch("12.1"), "elf", package="c6new")
    assert cov121.level == "family" and cov121.files[0].sass == ["sm_120f", "sm_80"]
    assert scan_files(files, parse_arch("10.0"), "elf", package="c6new").level == "none"


def test_cuobjdump_reader_agrees_with_the_fatbin_reader(fixture_dirs):
    exe = str(cuobjdump())
    for lib in (fixture_dirs["c6old"] / "c6old" / "libold.so", fixture_dirs["c6old"] / "c6old" / "libptx.so"):
        a = sorted(i.name for i in read_elf(str(lib)))
        b = sorted(i.name for i in read_cuobjdump(str(lib), exe))
        assert a == b and a
    # cuobjdump prints the family cubin as plain sm_120: the ELF reader keeps the f suffix
    lib = str(fixture_dirs["c6new"] / "c6new" / "libnew.so")
    assert sorted(i.name for i in read_cuobjdump(lib, exe)) == ["sm_120", "sm_80"]
    assert sorted(i.name for i in read_elf(lib)) == ["sm_120f", "sm_80"]
    assert level_for(read_cuobjdump(lib, exe), T120) == level_for(read_elf(lib), T120) == "native"


def test_c10_pypi_cuda13_sglang_kernel_wheel_carries_sm_120a():
    site = pip_target("sglang-kernel==0.4.10")
    sys.path.insert(0, str(site))
    try:
        cov = scan_package("sglang-kernel", T120)
    finally:
        sys.path.remove(str(site))
    assert cov is not None and cov.version == "0.4.10"
    by = {f.path: f for f in cov.files}
    for variant in ("sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/sm90/common_ops.abi3.so"):
        assert "sm_120a" in by[variant].sass and by[variant].level == "native"
        assert by[variant].compressed      # --compress-mode=size: read from headers, no decompression
    # the FA3 and FlashMLA libraries have no SM120 build: the package is partial and names them
    assert cov.level == "partial"
    assert "sgl_kernel/flash_ops.abi3.so" in cov.files_without
    assert all(by[f].level == "none" for f in cov.files_without)
