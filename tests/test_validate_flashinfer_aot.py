"""The suite's check of FlashInfer modules compiled ahead of time (flashinfer-jit-cache), on real files.

Each jit-cache here is a wheel written by the flashinfer node's own packaging
(images/flashinfer-aot/build_jit_cache.py) around shared objects that the PyPI CUDA 13.1 nvcc compiles for a
chosen ``-gencode`` and names as FlashInfer's modules (``trtllm_comm``, ``pcie_ipc_comm``). The suite runs
with flashinfer-python 0.7.4 from PyPI and no nvcc: the library gates of allreduce fusion and PCIe IPC pass
only when the module FlashInfer would load carries SASS that runs on 12.0 and its version is accepted.
"""
from __future__ import annotations

import importlib.util
import subprocess
import zipfile
from pathlib import Path

import pytest

from validate_support import CACHE, cuda_home, evidence, made_once, pip_target, run_suite, suite_venv, verdict

pytestmark = pytest.mark.network

FUSION, PCIE = "flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"
BUILDER = Path(__file__).resolve().parents[1] / "images" / "flashinfer-aot" / "build_jit_cache.py"


def _builder():
    spec = importlib.util.spec_from_file_location("build_jit_cache", BUILDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def jit_cache(name: str, gencode: str, version: str, modules=("trtllm_comm", "pcie_ipc_comm")) -> Path:
    """An installed (unpacked) flashinfer-jit-cache ``version`` whose modules carry ``gencode`` only."""
    root = CACHE / "aot-jit-cache" / name
    site = root / "site"

    def make(root: Path) -> None:
        b = _builder()
        stage = root / "stage"
        src = root / "k.cu"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text('extern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n')
        nvcc = cuda_home() / "bin" / "nvcc"
        for m in modules:
            so = stage / b.PKG / "jit_cache" / m / f"{m}.so"
            so.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(nvcc), "-shared", "-Xcompiler", "-fPIC", "-cudart", "none", "-gencode", gencode,
                            "-o", str(so), str(src)], check=True, capture_output=True, timeout=600)
        sm = "sm" + gencode.split("sm_")[1]
        (stage / b.PKG / "__init__.py").write_text(b.INIT_TEMPLATE.format(version=version, archs=(sm,),
                                                                          modules=tuple(modules), dist=b.DIST))
        whl = b.write_wheel(stage, root / "dist", version, f"flashinfer-python=={version.split('+')[0]}")
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)

    made_once(root, make)
    return site


@pytest.fixture(scope="module")
def reports():
    venv, fi = suite_venv(), pip_target("flashinfer-python==0.7.4")
    caches = {
        "sm_120f": jit_cache("sm120f", "arch=compute_120f,code=sm_120f", "0.7.4+cu131"),
        "sm_90": jit_cache("sm90", "arch=compute_90,code=sm_90", "0.7.4+cu131"),
        "old-version": jit_cache("sm120f-072", "arch=compute_120f,code=sm_120f", "0.7.2+cu131"),
        "fusion-only": jit_cache("sm120f-fusion", "arch=compute_120f,code=sm_120f", "0.7.4+cu131",
                                 modules=("trtllm_comm",)),
    }
    # as in the runtime image: the arch list in the environment, and no nvcc (PATH holds only the OS folders)
    no_nvcc = {"CUDA_HOME": "/nonexistent-cuda", "FLASHINFER_CUDA_ARCH_LIST": "12.0f"}
    out = {k: run_suite(venv, [fi, site], ["--backend", FUSION, "--backend", PCIE, "--label", k], extra_env=no_nvcc)[0]
           for k, site in caches.items()}
    out["none"] = run_suite(venv, [fi], ["--backend", FUSION, "--backend", PCIE, "--label", "none"], extra_env=no_nvcc)[0]
    return out


def test_sm_120f_modules_lift_the_no_nvcc_gate_and_need_no_jit(reports):
    for backend, module in ((FUSION, "trtllm_comm"), (PCIE, "pcie_ipc_comm")):
        v = verdict(reports["sm_120f"], backend, "library")
        if backend == FUSION:
            assert evidence(v, "nvcc for the JIT")["value"] in (None, "", False)
        aot = evidence(v, "AOT module")["value"]
        assert aot["module"] == module and aot["sass"] == ["sm_120f"] and aot["level"] == "native" and aot["covers"]
        assert aot["file"] == f"flashinfer_jit_cache/jit_cache/{module}/{module}.so"
        assert evidence(v, "JIT needed")["value"].startswith("no")
        assert v["status"] == "gate-passes", (backend, v["cause"])
        assert "no JIT needed" in v["cause"]


def test_modules_with_sass_only_for_sm_90_do_not_cover_12_0(reports):
    for backend in (FUSION, PCIE):
        v = verdict(reports["sm_90"], backend, "library")
        aot = evidence(v, "AOT module")["value"]
        assert aot["sass"] == ["sm_90"] and aot["level"] == "none" and aot["covers"] is False
        assert v["status"] == "blocked" and v["gate"] == "toolchain"
        assert "sm_90" in v["cause"] and evidence(v, "JIT needed")["value"].startswith("yes")


def test_a_jit_cache_of_another_flashinfer_version_is_not_loaded(reports):
    v = verdict(reports["old-version"], FUSION, "library")
    aot = evidence(v, "AOT module")["value"]
    assert aot["version_ok"] is False and aot["covers"] is False
    assert v["status"] == "blocked" and "does not match flashinfer-python 0.7.4" in v["cause"]


def test_each_gate_asks_for_its_own_module(reports):
    assert verdict(reports["fusion-only"], FUSION, "library")["status"] == "gate-passes"
    v = verdict(reports["fusion-only"], PCIE, "library")
    assert v["status"] == "blocked" and "no pcie_ipc_comm/pcie_ipc_comm.so" in v["cause"]
    assert "trtllm_comm" in v["cause"]          # it says what the package does hold


def test_without_a_jit_cache_or_nvcc_both_stay_blocked(reports):
    for backend in (FUSION, PCIE):
        v = verdict(reports["none"], backend, "library")
        assert v["status"] == "blocked" and "not installed" in evidence(v, "JIT needed")["value"]


def test_aot_claim_rests_on_flashinfers_load_order_not_on_a_hidden_nvcc(tmp_path):
    """An nvcc in reach (here a stand-in in a PyPI-toolkit folder, site-packages/nvidia/cu13/bin, the layout of the
    CUDA 13 nvcc wheel) does not change the answer: FlashInfer's build_and_load loads the AOT module first. The suite
    lists that nvcc, and cites FlashInfer's own load order (flashinfer/jit/core.py, read from the installed wheel)."""
    from validate_support import fake_nvcc

    venv, fi = suite_venv(), pip_target("flashinfer-python==0.7.4")
    site = jit_cache("sm120f", "arch=compute_120f,code=sm_120f", "0.7.4+cu131")
    nv = tmp_path / "nvsite"
    fake_nvcc(nv / "nvidia" / "cu13" / "bin", "13.1", "13.1.80")
    r = run_suite(venv, [fi, site, nv], ["--backend", FUSION, "--backend", PCIE],
                  extra_env={"CUDA_HOME": "/nonexistent-cuda", "FLASHINFER_CUDA_ARCH_LIST": "12.0f"})[0]
    for backend in (FUSION, PCIE):
        v = verdict(r, backend, "library")
        found = evidence(v, "every nvcc in reach")["value"]
        assert [n["path"] for n in found] == [str(nv / "nvidia" / "cu13" / "bin" / "nvcc")], found
        assert found[0]["found_by"] == ["PyPI toolkit"] and found[0]["release"] == "13.1"
        jit = evidence(v, "JIT needed")
        assert jit["value"] == "no: FlashInfer's build_and_load calls try_load, which loads the AOT module, before any build"
        assert "flashinfer/jit/core.py:" in jit["source"] and "build_and_load" in jit["source"] and "try_load" in jit["source"]
        assert v["status"] == "gate-passes" and "whatever nvcc is in reach" in v["cause"]


def test_pcie_ipc_engine_note_drops_jit_wording_when_the_module_is_ahead_of_time():
    venv, fi, sg = suite_venv(), pip_target("flashinfer-python==0.7.4"), pip_target("sglang==0.5.23")
    no_nvcc = {"CUDA_HOME": "/nonexistent-cuda", "FLASHINFER_CUDA_ARCH_LIST": "12.0f"}
    site = jit_cache("sm120f", "arch=compute_120f,code=sm_120f", "0.7.4+cu131")
    fb = evidence(verdict(run_suite(venv, [sg, fi, site], ["--backend", PCIE], extra_env=no_nvcc)[0], PCIE, "engine"),
                  "workspace build failure")["value"]
    assert "provided ahead of time (flashinfer_jit_cache/jit_cache/pcie_ipc_comm/pcie_ipc_comm.so" in fb
    assert "JIT-build" not in fb and "silently stay on NCCL" in fb
    fb0 = evidence(verdict(run_suite(venv, [sg, fi], ["--backend", PCIE], extra_env=no_nvcc)[0], PCIE, "engine"),
                   "workspace build failure")["value"]
    assert "JIT-build at first use" in fb0 and "this environment has no nvcc" in fb0


def test_fusion_no_nvcc_warning_only_when_no_aot_module_serves_the_target():
    venv, fi = suite_venv(), pip_target("flashinfer-python==0.7.4")
    no_nvcc = {"CUDA_HOME": "/nonexistent-cuda", "FLASHINFER_CUDA_ARCH_LIST": "12.0f"}
    site = jit_cache("sm120f", "arch=compute_120f,code=sm_120f", "0.7.4+cu131")
    served = verdict(run_suite(venv, [fi, site], ["--backend", FUSION], extra_env=no_nvcc)[0], FUSION, "library")
    assert not [w for w in served.get("warnings") or [] if "JIT-compiles this module at first use" in w], served
    bare = verdict(run_suite(venv, [fi], ["--backend", FUSION], extra_env=no_nvcc)[0], FUSION, "library")
    assert [w for w in bare.get("warnings") or [] if "JIT-compiles this module at first use" in w], bare
