"""Cases C41-C46 on real PyPI wheels (``pip install --no-deps --target`` folders, torch 2.14.1 with its CUDA 13
dependencies), plus a crafted flashinfer-jit-cache (C42) and a stand-in nvcc 12.8 (no CUDA 12.8 nvcc is on PyPI,
FACTS). Each test names what the suite said before the environment health stage existed."""
from __future__ import annotations

import importlib.util
import subprocess
import zipfile
from pathlib import Path

import pytest

from validate_support import CACHE, cuda_home, evidence, fake_nvcc, made_once, pip_target, run_suite, suite_venv, verdict

pytestmark = pytest.mark.network

CA, FUSION, EP, PCIE, RING = ("sglang-custom-allreduce", "flashinfer-allreduce-fusion", "ep-flashinfer-a2a",
                              "flashinfer-pcie-ipc-allreduce", "nccl-ring")
NO_NVCC = {"CUDA_HOME": "/nonexistent-cuda"}


@pytest.fixture(scope="module")
def venv():
    return suite_venv()


@pytest.fixture(scope="module")
def torch214():
    return pip_target("torch==2.14.1", deps=True)


@pytest.fixture(scope="module")
def c41(venv, torch214):
    paths = [torch214, pip_target("sglang-kernel==0.4.6.post1"), pip_target("sglang==0.5.23")]
    return run_suite(venv, paths, ["--backend", CA], extra_env=NO_NVCC)[0]


def test_c41_an_sgl_kernel_built_for_another_torch_blocks_every_path_that_imports_it(c41):
    """Before: custom allreduce read gate-passes (library) on this box."""
    for scope in ("library", "engine"):
        v = verdict(c41, CA, scope)
        assert v["status"] == "blocked" and v["gate"] == "broken-install", v
        assert "c10::" in v["cause"] and "libc10" in v["cause"]           # the symbol, demangled, and its library
        assert "sglang 0.5.23 requires sglang-kernel==0.4.10, installed sglang-kernel 0.4.6.post1" in v["cause"]
        assert "sglang-kernel==0.4.10" in v["lift_detail"]
        before = evidence(v, "answer before the environment health check")["value"]
        if scope == "library":   # what the suite said before this stage: green on a box where it cannot load
            assert before.startswith("gate-passes"), before
    health = c41["environment"]["health"]
    imp = next(r for r in health["imports"] if r["module"] == "sgl_kernel")
    # which way it was decided: the import's own undefined symbol, or (no driver here: libcuda.so.1) statically
    if imp["kind"] == "undefined-symbol":
        assert imp["symbol"].startswith("_ZN3c10")
    else:
        assert imp["kind"] == "needs-device"
        st = health["static_symbols"]["sglang-kernel"]
        assert st["missing"] and st["missing"][0]["symbol"].startswith("_ZN3c10") and "common_ops" in st["file"]
        assert "decided statically" in verdict(c41, CA, "library")["cause"]
    assert any(f["level"] == "error" and f["check"] == "requirements" and "sglang-kernel==0.4.10" in f["message"]
               for f in health["findings"])
    assert not [v for v in c41["verdicts"] if v["backend"] == CA and v["status"] == "gate-passes"]


def test_c41_markdown_shows_the_health_errors_first_and_strict_fails(venv, torch214, c41):
    paths = [torch214, pip_target("sglang-kernel==0.4.6.post1"), pip_target("sglang==0.5.23")]
    from validate_support import suite_env
    p = subprocess.run([str(venv), "-m", "stackprobe", "--quiet", "--strict", "--backend", CA, "--markdown", "-"],
                       capture_output=True, text=True, env=suite_env(paths, extra=NO_NVCC), timeout=900)
    assert p.returncode == 10, p.stderr[-2000:]
    md = p.stdout
    assert md.index("## Environment health") < md.index("| backend |")
    assert "**ERROR: this environment is not healthy" in md and "--strict" in p.stderr


def test_c41_control_the_pinned_sglang_kernel_is_not_blocked(venv, torch214):
    paths = [torch214, pip_target("sglang-kernel==0.4.10"), pip_target("sglang==0.5.23")]
    rep = run_suite(venv, paths, ["--backend", CA], extra_env=NO_NVCC)[0]
    assert all(v["gate"] != "broken-install" for v in rep["verdicts"])
    assert not rep["environment"]["health"]["static_symbols"]["sglang-kernel"]["missing"]


# ------------------------------------------------------------------------------------------------------ C42
def _builder():
    spec = importlib.util.spec_from_file_location(
        "build_jit_cache", Path(__file__).resolve().parents[1] / "images" / "flashinfer-aot" / "build_jit_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def jit_cache_linking(cudart_major: int, version: str = "0.7.2+cu129") -> Path:
    """An installed flashinfer-jit-cache whose trtllm_comm / pcie_ipc_comm modules carry sm_120f SASS (the PyPI
    nvcc 13.1) and link a ``libcudart.so.<major>`` (a stub made with gcc: only its soname matters)."""
    root = CACHE / "health-jit-cache" / f"cudart{cudart_major}"
    site = root / "site"

    def make(root: Path) -> None:
        b = _builder()
        stub = root / "stub"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "rt.c").write_text("int stub_runtime_probe(int *v) { *v = 0; return 0; }\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stub / "libcudart.so"), str(stub / "rt.c"),
                        f"-Wl,-soname,libcudart.so.{cudart_major}"], check=True, capture_output=True)
        src = root / "k.cu"
        src.write_text('extern "C" int stub_runtime_probe(int *);\n'
                       'extern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n'
                       'extern "C" int host() { int v; return stub_runtime_probe(&v); }\n')
        stage = root / "stage"
        for m in ("trtllm_comm", "pcie_ipc_comm"):
            so = stage / b.PKG / "jit_cache" / m / f"{m}.so"
            so.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(cuda_home() / "bin" / "nvcc"), "-shared", "-Xcompiler", "-fPIC", "-cudart", "none",
                            "-gencode", "arch=compute_120f,code=sm_120f", "-o", str(so), str(src), f"-L{stub}", "-lcudart",
                            "-Xlinker", "--no-as-needed"], check=True, capture_output=True, timeout=600)
        (stage / b.PKG / "__init__.py").write_text(b.INIT_TEMPLATE.format(version=version, archs=("sm120f",),
                                                                          modules=("trtllm_comm", "pcie_ipc_comm"), dist=b.DIST))
        whl = b.write_wheel(stage, root / "dist", version, f"flashinfer-python=={version.split('+')[0]}")
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)

    made_once(root, make)
    return site


@pytest.mark.parametrize("major", [12, 13])
def test_c42_a_cuda_12_jit_cache_on_a_cuda_13_stack_is_not_jit_needed_no(venv, torch214, major):
    """Before: the CUDA 12 module read "JIT needed: no" and fusion gate-passes with no nvcc (its SASS fits)."""
    paths = [torch214, pip_target("flashinfer-python==0.7.2"), jit_cache_linking(major)]
    rep = run_suite(venv, paths, ["--backend", FUSION], extra_env=dict(NO_NVCC, FLASHINFER_CUDA_ARCH_LIST="12.0f"))[0]
    v = verdict(rep, FUSION, "library")
    jit = evidence(v, "JIT needed")["value"]
    if major == 12:
        assert jit.startswith("yes") and "libcudart.so.12" in jit and "CUDA 13.0" in jit
        assert v["status"] == "blocked" and v["gate"] == "toolchain"     # no nvcc here: the path is unavailable
        assert any(f["check"] == "shared_objects" and "libcudart.so.12" in f["message"]
                   for f in rep["environment"]["health"]["findings"])
    else:   # the control: a module of the stack's own major is still loaded ahead of time
        assert jit.startswith("no"), jit


# ------------------------------------------------------------------------------------------------------ C43
@pytest.mark.parametrize("preload", [True, False])
def test_c43_the_libnccl_torch_maps_is_judged_by_its_own_version(venv, torch214, preload):
    """Before: nccl-ring gate-passes with NCCL 2.26.2 (no data entry for NVIDIA/nccl#2418)."""
    lib = pip_target("nvidia-nccl-cu12==2.26.2") / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    extra = dict(NO_NVCC, **({"LD_PRELOAD": str(lib)} if preload else {}))
    rep = run_suite(venv, [torch214], ["--backend", RING], extra_env=extra)[0]
    nccl = rep["environment"]["health"]["nccl"]
    v = verdict(rep, RING, "library")
    if preload:
        assert nccl["library"] == str(lib) and nccl["version"] == "2.26.2"
        assert nccl["version_string"] == "2.26.2+cuda12.2"
        assert [e["id"] for e in nccl["known_bad"]] == ["nccl-2.26.2-pcie-illegal-access"]
        # torch 2.14.1 itself does not import against that libnccl (it needs ncclCommResume, which 2.26.2 lacks):
        # the health stage says so first (broken install), and still names the loaded release's known-bad entry.
        assert v["status"] == "blocked" and v["gate"] == "broken-install", (v["cause"], v["evidence"])
        assert "ncclCommResume" in v["cause"]
        msgs = [f["message"] for f in rep["environment"]["health"]["findings"] if f["check"] == "nccl"]
        assert any("nccl-2.26.2-pcie-illegal-access" in m and "nccl/issues/2418" in m and "512 KiB" in m
                   for m in msgs), msgs
    else:   # torch 2.14.1's own nvidia-nccl-cu13
        assert nccl["library"].endswith("nvidia/nccl/lib/libnccl.so.2") and nccl["version"] != "2.26.2"
        assert nccl["known_bad"] == [] and v["gate"] != "known-bad-release"


# ------------------------------------------------------------------------------------------------------ C44
@pytest.mark.parametrize("cubin", [True, False])
def test_c44_a_stale_flashinfer_cubin_is_a_broken_install_not_an_arch_list(venv, cubin):
    """Before: the import error was read as C4's empty arch list, lift FLASHINFER_CUDA_ARCH_LIST."""
    paths = [pip_target("flashinfer-python==0.6.17")] + ([pip_target("flashinfer-cubin==0.6.3")] if cubin else [])
    rep = run_suite(venv, paths, ["--backend", FUSION], extra_env=NO_NVCC)[0]
    v = verdict(rep, FUSION, "library")
    if cubin:
        assert v["status"] == "blocked" and v["gate"] == "broken-install"
        assert "0.6.3" in v["cause"] and "0.6.17" in v["cause"]
        assert "align flashinfer-cubin with flashinfer-python, or remove it" in v["lift_detail"]
        assert "FLASHINFER_CUDA_ARCH_LIST" not in v["lift_detail"]
    else:
        assert v["gate"] != "broken-install"


# ------------------------------------------------------------------------------------------------------ C45
@pytest.fixture(scope="module")
def cuda128(tmp_path_factory):
    home = tmp_path_factory.mktemp("cuda-12.8")
    fake_nvcc(home / "bin", "12.8", "12.8.93")
    return home


@pytest.mark.parametrize("arch_list", ["", "12.0a"])
def test_c45_ep_all_to_all_fails_the_same_cuda_check_as_fusion(venv, cuda128, arch_list):
    """Before: EP over FlashInfer all-to-all read skipped (needs-runtime) with nvcc 12.8 and flashinfer 0.6.17."""
    extra = {"FLASHINFER_CUDA_ARCH_LIST": arch_list} if arch_list else {}
    rep = run_suite(venv, [pip_target("flashinfer-python==0.6.17")], ["--backend", EP, "--backend", FUSION],
                    cuda=cuda128, extra_env=extra)[0]
    ep, fu = verdict(rep, EP, "library"), verdict(rep, FUSION, "library")
    if not arch_list:
        assert fu["status"] == "blocked" and fu["gate"] == "toolchain"
        assert ep["status"] == "blocked" and ep["gate"] == "toolchain", ep
        assert "requires CUDA >= 12.9" in ep["cause"] and "FLASHINFER_CUDA_ARCH_LIST=12.0a" in ep["lift_detail"]
    else:   # the lift works: an explicit suffixed entry
        assert ep["status"] == "skipped" and ep["gate"] == "needs-runtime"


# ------------------------------------------------------------------------------------------------------ C46
@pytest.mark.parametrize("release", ["12.8", "13.0"])
def test_c46_an_nvcc_of_another_major_than_torch_blocks_every_jit_built_path(venv, torch214, tmp_path, release):
    """Before: the C5 mismatch was printed among the findings and every JIT path still read "nvcc available".
    Here torch is the CUDA 13.0 build and the nvcc a CUDA 12.8 one (the case's mismatch the other way round: PyPI
    has no CUDA 12.8 nvcc, and a CUDA 12.8 torch does not import without its own CUDA 12 wheels)."""
    home = tmp_path / "cuda"
    fake_nvcc(home / "bin", release, f"{release}.90")
    rep = run_suite(venv, [torch214, pip_target("flashinfer-python==0.7.2")],
                    ["--backend", FUSION, "--backend", PCIE, "--backend", EP], cuda=home,
                    extra_env={"FLASHINFER_CUDA_ARCH_LIST": "12.0a"})[0]
    tool = rep["environment"]["health"]["toolchain"]
    for b in (FUSION, PCIE, EP):
        v = verdict(rep, b, "library")
        if release == "12.8":
            assert tool["mismatch"] and v["status"] == "blocked" and v["gate"] == "toolchain", (b, v)
            assert "CUDA 12.8" in v["cause"] and "CUDA 13.0" in v["cause"] and "libcudart.so.12" in v["cause"]
        else:
            assert not tool["mismatch"] and "C46" not in v["cause"]
