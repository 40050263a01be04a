"""FlashInfer allreduce fusion, read from the real packages (cases C9 and C4).

flashinfer-python 0.6.16, 0.6.18 and 0.7.4 from PyPI (``--no-deps`` targets) side by side, a CPU torch,
and the PyPI CUDA 13.1 nvcc. C4 needs a CUDA 12.8 nvcc, which PyPI does not carry (FACTS): a stand-in
``nvcc`` that answers ``--version`` like 12.8's sits at the edge; FlashInfer's own normalisation code
does the rest.
"""
from __future__ import annotations

import subprocess

import pytest

from validate_support import (cuda_home, evidence, fake_nvcc, pip_target, run_suite, suite_env, suite_venv, verdict)

pytestmark = pytest.mark.network

FUSION = "flashinfer-allreduce-fusion"


@pytest.fixture(scope="module")
def venv():
    return suite_venv()


@pytest.fixture(scope="module")
def fi():
    return {v: pip_target(f"flashinfer-python=={v}") for v in ("0.6.16", "0.6.18", "0.7.4")}


@pytest.fixture(scope="module")
def cuda13():
    return cuda_home()


@pytest.fixture(scope="module")
def c9_reports(venv, fi, cuda13):
    return {v: run_suite(venv, [fi[v]], ["--backend", FUSION, "--backend", "flashinfer-pcie-ipc-allreduce",
                                         "--label", f"fi-{v}"], cuda=cuda13)[0] for v in ("0.6.16", "0.7.4")}


def test_c9_flashinfer_0_6_16_is_blocked_by_its_own_python_list(c9_reports):
    v = verdict(c9_reports["0.6.16"], FUSION)
    assert v["status"] == "blocked" and v["gate"] == "python-table" and v["lift"] == "package-upgrade"
    majors = evidence(v, "gen_trtllm_comm_module supported majors")
    assert majors["value"] == [9, 10]
    assert majors["source"].startswith("flashinfer/jit/comm.py:") and "(ast)" in majors["source"]
    # the same refusal, from FlashInfer's own gate code called in a child interpreter
    assert "No supported CUDA architectures found for major versions [9, 10]" in evidence(v, "gen_trtllm_comm_module() raised")["value"]
    # CUDA is not the problem: FlashInfer normalises 12.0 to 12.0f on this nvcc 13.1
    assert evidence(v, "CUDA version FlashInfer detects")["value"] == "13.1"
    assert evidence(v, "normalisation of 12.0")["value"] == "12.0f"


def test_c9_flashinfer_0_7_4_gate_passes(c9_reports):
    v = verdict(c9_reports["0.7.4"], FUSION)
    assert v["status"] == "gate-passes" and v["gate"] == ""
    assert evidence(v, "gen_trtllm_comm_module supported majors")["value"] == [9, 10, 12]
    assert evidence(v, "gen_trtllm_comm_module gencode flags")["value"] == ["-gencode=arch=compute_120f,code=sm_120f"]
    assert "not run" in evidence(v, "compile-only JIT build")["value"]        # opt-in: CI stays fast
    pcie = verdict(c9_reports["0.7.4"], "flashinfer-pcie-ipc-allreduce")
    assert pcie["status"] == "gate-passes"
    sizes = evidence(pcie, "PcieIpcAllReduceWorkspace supported world sizes")
    assert 8 in sizes["value"] and sizes["source"].startswith("flashinfer/comm/pcie_ipc_ar.py:")
    assert verdict(c9_reports["0.6.16"], "flashinfer-pcie-ipc-allreduce")["status"] == "skipped"


def test_c9_comparison_says_what_changed_and_why(c9_reports, tmp_path):
    import json
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(c9_reports["0.6.16"]))
    b.write_text(json.dumps(c9_reports["0.7.4"]))
    out = subprocess.run([str(suite_venv()), "-m", "stackprobe", "--compare", str(a), str(b)], capture_output=True,
                         text=True, env=suite_env([]), check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith(f"| {FUSION} "))
    # no SGLang in either environment: the headline is the engine's "skipped", the library's answer changed
    assert "library blocked (python-table)" in row and "library gate-passes" in row and "| yes |" in row
    assert "[9, 10] -> [9, 10, 12]" in row


@pytest.fixture(scope="module")
def cuda128(tmp_path_factory):
    home = tmp_path_factory.mktemp("cuda-12.8")
    fake_nvcc(home / "bin", "12.8", "12.8.93")
    return home


def test_c4_flashinfer_0_6_18_on_cuda_12_8_has_an_empty_effective_list(venv, fi, cuda128):
    report, _ = run_suite(venv, [fi["0.6.18"]], ["--backend", FUSION], cuda=cuda128)
    v = verdict(report, FUSION)
    assert evidence(v, "gen_trtllm_comm_module supported majors")["value"] == [9, 10, 12]
    assert evidence(v, "CUDA version FlashInfer detects")["value"] == "12.8"
    assert "requires CUDA >= 12.9" in evidence(v, "normalisation of 12.0")["value"]
    assert evidence(v, "effective target arch list")["value"] == []
    # FlashInfer's own CompilationContext() for a detected 12.0 GPU logs the error and keeps nothing
    assert any("requires CUDA >= 12.9" in m for m in evidence(v, "FlashInfer swallowed")["value"])
    assert v["status"] == "blocked" and v["gate"] == "toolchain"
    assert "empty (case C4)" in v["cause"]
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0a" in v["lift_detail"]


def test_c4_explicit_suffixed_list_lifts_it(venv, fi, cuda128):
    report, _ = run_suite(venv, [fi["0.6.18"]], ["--backend", FUSION], cuda=cuda128,
                          extra_env={"FLASHINFER_CUDA_ARCH_LIST": "12.0a"})
    v = verdict(report, FUSION)
    assert evidence(v, "effective target arch list")["value"] == ["12.0a"]
    assert evidence(v, "gen_trtllm_comm_module gencode flags")["value"] == ["-gencode=arch=compute_120a,code=sm_120a"]
    assert v["status"] == "gate-passes"


def test_c4_flashinfer_0_7_4_keeps_sm120_on_cuda_12_8_as_12_0a(venv, fi, cuda128):
    report, _ = run_suite(venv, [fi["0.7.4"]], ["--backend", FUSION], cuda=cuda128)
    v = verdict(report, FUSION)
    assert evidence(v, "normalisation of 12.0")["value"] == "12.0a"
    assert v["status"] == "gate-passes"


def test_c4_an_arch_list_without_the_target_is_flagged(venv, fi, cuda13):
    report, _ = run_suite(venv, [fi["0.7.4"]], ["--backend", FUSION], cuda=cuda13,
                          extra_env={"FLASHINFER_CUDA_ARCH_LIST": "9.0a 10.0a"})
    v = verdict(report, FUSION)
    assert evidence(v, "effective target arch list")["value"] == ["10.0a", "9.0a"]
    assert v["status"] == "blocked" and v["gate"] == "toolchain" and "C4" in v["cause"]


def test_no_nvcc_blocks_the_jit_backends(venv, fi):
    report, _ = run_suite(venv, [fi["0.7.4"]], ["--backend", FUSION, "--backend", "flashinfer-pcie-ipc-allreduce"],
                          extra_env={"CUDA_HOME": "/nonexistent-cuda"})
    v = verdict(report, FUSION)
    # no nvcc and a CPU torch: FlashInfer cannot tell the CUDA version, so normalisation fails
    assert v["status"] == "blocked" and v["gate"] == "toolchain"
    assert any(f["message"].startswith("no nvcc") for f in report["environment"]["findings"])
    assert verdict(report, "flashinfer-pcie-ipc-allreduce")["gate"] == "toolchain"


def test_import_failure_is_a_verdict_not_a_crash(fi, cuda13, tmp_path):
    """A FlashInfer whose imports fail (here: its dependencies are absent from a bare venv) gives a
    verdict, not a crash; the suite still writes its report. The import error names torch, a declared
    dependency of flashinfer-python that is not installed: blocked (not installed: torch), case C29, with
    the probe's own error verdict kept as evidence."""
    bare = tmp_path / "bare"
    subprocess.run(["python3", "-m", "venv", str(bare)], check=True)
    report, p = run_suite(bare / "bin" / "python", [fi["0.7.4"]], ["--backend", FUSION], cuda=cuda13)
    v = verdict(report, FUSION)
    assert v["status"] == "blocked" and v["gate"] == "not-installed"
    assert v["cause"].startswith("not installed: torch")
    before = evidence(v, "verdict before the dependency check")["value"]
    assert before.startswith("error") and "ModuleNotFoundError" in before and "torch" in before


JIT_SCRIPT = """
import json, sys
from pathlib import Path
from stackprobe import env as envmod
from stackprobe.archs import parse_arch
from stackprobe.probes import Context
from stackprobe.probes import flashinfer_common as fi
ctx = Context(target=parse_arch('12.0'), env=envmod.collect(), coverage={}, jit_compile=True, cache_dir=Path(sys.argv[1]))
runs = [fi.jit_compile(ctx, 'gen_vllm_comm_module', '12.0f') for _ in range(2)]
print(json.dumps([{k: v for k, v in r.items() if k != 'log'} for r in runs]))
"""


def test_compile_only_jit_build_makes_sm120_objects_and_is_cached_by_content(venv, fi, cuda13, tmp_path):
    """The compile-only JIT machinery on a real FlashInfer module with the real nvcc 13.1: FlashInfer
    writes its ninja file, only the object files are built (no link: pip wheels lack libcudart.so), the
    objects carry sm_120f SASS, and the second call is answered from the content-keyed cache. (The fusion
    module itself takes about 5 minutes on 2 cores, so this uses FlashInfer's one-file vllm_comm module.)"""
    p = subprocess.run([str(venv), "-c", JIT_SCRIPT, str(tmp_path / "cache")], capture_output=True, text=True,
                       env=suite_env([fi["0.7.4"]], cuda=cuda13), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    first, second = __import__("json").loads(p.stdout.strip().splitlines()[-1])
    assert first["ran"] and first["built"] and not first["cached"]
    assert first["objects"] and all(o["sass"] == ["sm_120f"] and o["level"] == "native" for o in first["objects"])
    assert second["cached"] and not second["ran"] and second["key"] == first["key"]


def test_gate_is_read_when_the_package_init_fails(venv, fi, cuda13, tmp_path):
    """FlashInfer 0.6.16's ``import flashinfer`` fails on a GPU-less host with a CUDA torch (it asks
    device 0's properties at import). Reproduced by a copy whose ``__init__`` raises (the rest linked to
    the real package): the gate is still read, from FlashInfer's own submodules."""
    src = fi["0.6.16"]
    site = tmp_path / "site"
    pkg = site / "flashinfer"
    pkg.mkdir(parents=True)
    for entry in (src / "flashinfer").iterdir():
        if entry.name != "__init__.py":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "__init__.py").write_text("raise RuntimeError('CUDA error: no CUDA-capable device is detected')\n")
    for info in src.glob("flashinfer_python-*.dist-info"):
        (site / info.name).symlink_to(info)
    report, _ = run_suite(venv, [site], ["--backend", FUSION], cuda=cuda13)
    v = verdict(report, FUSION)
    imp = evidence(v, "import flashinfer")
    assert "no CUDA-capable device" in imp["value"] and "submodules-only" in imp["source"]
    assert "No supported CUDA architectures found for major versions [9, 10]" in evidence(v, "gen_trtllm_comm_module() raised")["value"]
    assert v["status"] == "blocked" and v["gate"] == "python-table"


def test_b12x_gate_from_its_own_gating_code(venv, fi, cuda13):
    """FlashInfer 0.7.4 ships b12x; its vendored gate is_b12x() admits SM120/121 only, and its kernels need
    nvidia-cutlass-dsl (absent from this venv on purpose)."""
    r120 = verdict(run_suite(venv, [fi["0.7.4"]], ["--backend", "b12x"], cuda=cuda13)[0], "b12x")
    assert evidence(r120, "is_b12x() for 12.0")["value"] is True
    assert "gating.py" in evidence(r120, "is_b12x() for 12.0")["source"]
    assert r120["status"] == "blocked" and r120["gate"] == "toolchain" and "nvidia-cutlass-dsl" in r120["cause"]
    r90 = verdict(run_suite(venv, [fi["0.7.4"]], ["--backend", "b12x", "--target-arch", "9.0"], cuda=cuda13)[0], "b12x")
    assert evidence(r90, "is_b12x() for 9.0")["value"] is False
    assert r90["status"] == "blocked" and r90["gate"] == "python-table"
    assert verdict(run_suite(venv, [fi["0.6.16"]], ["--backend", "b12x"], cuda=cuda13)[0], "b12x")["status"] == "skipped"
