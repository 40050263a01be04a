"""FlashInfer ahead of time (recipe method ``aot``): the recipe schema, the plan's arch flags per toolchain
(12.0f on CUDA 13.x, 12.0a on 12.8), the refusals before any build, and the builder script's own packaging
(a flashinfer-jit-cache wheel that FlashInfer's loader interface reads). No Docker, no nvcc."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile

import pytest

from cudastack.core.errors import ArchError, RecipeError
from cudastack.plan.planner import PROJECT_ROOT, make_plan, nvcc_gencode_flags, render_plan
from cudastack.plan.rules import Resources
from recipe_support import edit

SMALL = Resources(2, 24.0, "test: 2 cores, 24 GiB")
BUILDER = PROJECT_ROOT / "images" / "flashinfer-aot" / "build_jit_cache.py"
MODULES = ["flashinfer.jit.comm:gen_trtllm_comm_module", "flashinfer.jit.comm:gen_pcie_ipc_comm_module"]


def _aot(cuda: str, modules=MODULES, **extra):
    version = "0.6.3" if cuda == "12.8" else "0.7.2"   # what sglang.yaml requires per toolchain

    def fn(d):
        pins = [f"flashinfer-python=={version}"] + ([f"flashinfer-cubin=={version}"] if cuda == "12.8" else [])
        d["toolchains"][cuda] = {"method": "aot", "packages": pins,
                                 "modules": list(modules), **extra}
    return fn


def _plan(recipes, cuda, **kw):
    kw.setdefault("resources", SMALL)
    return make_plan(recipes, cuda, **kw)


def test_the_real_13_1_recipe_compiles_the_comm_modules_for_12_0f():
    p = _plan(None, "13.1")
    n = p.node("flashinfer")
    assert n.method == "aot" and n.dockerfile == "images/wheels-aot.Dockerfile"
    assert n.build_args["AOT_MODULES"].split() == MODULES
    assert n.build_args["AOT_LOCAL_VERSION"] == "cu131"
    env = n.build_args["BUILD_ENV"]
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0f" in env and "MAX_JOBS=" in env
    assert n.context["aot"].endswith("images/flashinfer-aot")
    assert "flashinfer-jit-cache" in n.wheel_packages
    text = render_plan(p)
    assert "nvcc -gencode=arch=compute_120f,code=sm_120f (FLASHINFER_CUDA_ARCH_LIST=12.0f)" in text
    section = text.split("] flashinfer  kind")[1].split("\n[")[0]       # the flashinfer node's lines, wherever it sits
    assert "sm_120a" not in section and "compute_120f" in section
    # the runtime image keeps the same list in its environment
    assert p.node("runtime").build_args["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"


def test_aot_on_12_8_renders_12_0a_on_a_base_with_nvcc(recipes_copy):
    edit(recipes_copy / "flashinfer.yaml", _aot("12.8"))
    p = _plan(recipes_copy, "12.8", base="nvidia")
    n = p.node("flashinfer")
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0a" in n.build_args["BUILD_ENV"]
    assert n.build_args["AOT_LOCAL_VERSION"] == "cu128"
    assert "nvcc -gencode=arch=compute_120a,code=sm_120a" in render_plan(p)
    assert "compute_120f" not in render_plan(p)


def test_a_wrong_arch_for_the_toolchain_fails_before_building(recipes_copy):
    edit(recipes_copy / "flashinfer.yaml", _aot("12.8"))
    with pytest.raises(ArchError, match="12.0a"):      # family targets need nvcc >= 12.9 (case C3)
        _plan(recipes_copy, "12.8", base="nvidia", archs="12.0f")


def test_aot_on_the_pip_base_of_cuda_12_8_is_refused_naming_the_fix(recipes_copy):
    # the finding for the locked 12.8 stack: its pip base has no nvcc, so FlashInfer cannot be built AOT there
    edit(recipes_copy / "flashinfer.yaml", _aot("12.8"))
    with pytest.raises(ArchError) as e:
        _plan(recipes_copy, "12.8", base="pip", skip=["flash-attn"])
    assert "flashinfer" in str(e.value) and "--base nvidia" in str(e.value)


def test_gencode_flags_follow_the_list_verbatim_and_refuse_garbage():
    assert nvcc_gencode_flags("12.0f") == ["-gencode=arch=compute_120f,code=sm_120f"]
    assert nvcc_gencode_flags("12.0a 10.0a") == ["-gencode=arch=compute_120a,code=sm_120a",
                                                  "-gencode=arch=compute_100a,code=sm_100a"]
    with pytest.raises(Exception, match="not an arch"):
        nvcc_gencode_flags("sm120")


@pytest.mark.parametrize("change, key", [
    (lambda e: e.pop("modules"), "modules"),
    (lambda e: e.update(modules=[]), "modules"),
    (lambda e: e.update(modules=["trtllm_comm"]), "modules[0]"),
    (lambda e: e.update(modules=[MODULES[0], MODULES[0]]), "modules"),
    (lambda e: e.update(packages=["flashinfer-python>=0.7"]), "packages[0]"),
])
def test_bad_aot_entries_name_the_key(recipes_copy, change, key):
    def fn(d):
        _aot("13.1")(d)
        change(d["toolchains"]["13.1"])
    edit(recipes_copy / "flashinfer.yaml", fn)
    with pytest.raises(RecipeError, match=re.escape(f'toolchains."13.1".{key}')):
        _plan(recipes_copy, "13.1")


def test_modules_on_a_wheel_entry_and_aot_without_a_suffixed_arch_knob_are_refused(recipes_copy):
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"]["13.1"].update(method="wheel"))
    with pytest.raises(RecipeError, match="only an aot recipe compiles modules"):
        _plan(recipes_copy, "13.1")
    edit(recipes_copy / "flashinfer.yaml", lambda d: (d["toolchains"]["13.1"].update(method="aot"),
                                                      d.pop("arch_knob")))
    with pytest.raises(RecipeError, match="FLASHINFER_CUDA_ARCH_LIST"):
        _plan(recipes_copy, "13.1")


def test_aot_changes_only_the_flashinfer_and_runtime_hashes(recipes_copy):
    before = {n.name: n.hash for n in _plan(recipes_copy, "13.1").nodes}
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"]["13.1"]["modules"].pop())
    after = {n.name: n.hash for n in _plan(recipes_copy, "13.1").nodes}
    assert {n for n in before if before[n] != after[n]} == {"flashinfer", "runtime"}


# ------------------------------------------------------------------------- the builder's packaging
def _builder():
    spec = importlib.util.spec_from_file_location("build_jit_cache", BUILDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_jit_cache_wheel_offers_both_loader_interfaces(tmp_path):
    b = _builder()
    stage = tmp_path / "stage"
    so = stage / b.PKG / "jit_cache" / "trtllm_comm" / "trtllm_comm.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"\x7fELF not really")
    (stage / b.PKG / "__init__.py").write_text(b.INIT_TEMPLATE.format(
        version="0.7.2+cu131", archs=("sm120f",), modules=("trtllm_comm",), dist=b.DIST))
    whl = b.write_wheel(stage, tmp_path / "out", "0.7.2+cu131", "flashinfer-python==0.7.2")
    assert whl.name.startswith("flashinfer_jit_cache-0.7.2+cu131-py3-none-linux_")
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        record = z.read("flashinfer_jit_cache-0.7.2+cu131.dist-info/RECORD").decode()
        z.extractall(site)
    assert "flashinfer_jit_cache/jit_cache/trtllm_comm/trtllm_comm.so" in names
    assert all(n in record for n in names)
    code = ("import flashinfer_jit_cache as m, os; p = m.get_jit_cache_providers()[0]; "
            "print(m.__version__, p.version, p.distribution, sorted(p.cuda_architectures), sorted(p.modules), "
            "os.path.isfile(os.path.join(m.get_jit_cache_dir(), 'trtllm_comm', 'trtllm_comm.so')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0.7.2+cu131", "0.7.2+cu131", "flashinfer-jit-cache", "['sm120f']", "['trtllm_comm']",
                           "True"]


def test_the_builder_refuses_a_missing_arch_list_and_a_patch_that_matches_nothing(tmp_path, monkeypatch):
    b = _builder()
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    assert b.main(["--modules", MODULES[0], "--out", str(tmp_path)]) == 2
    with pytest.raises(b.Refused, match="not an arch"):
        b.sm_names("12.0 sm_120")
    assert b.sm_names("12.0f 12.0a") == ["sm120a", "sm120f"]
    pkg = tmp_path / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "jit" / "comm.py").write_text("supported_major_versions=[9, 10]\n")
    with pytest.raises(b.Refused, match="does not occur"):
        b.apply_patches(pkg, [{"file": "jit/comm.py", "replace": "[9, 10, 11]", "with": "x"}])
    with pytest.raises(b.Refused, match="inside the flashinfer package"):
        b.apply_patches(pkg, [{"file": "../setup.py", "replace": "a", "with": "b"}])
    done = b.apply_patches(pkg, [{"file": "jit/comm.py", "replace": "[9, 10]", "with": "[9, 10, 12]", "why": "t"}])
    assert done[0]["matches"] == 1 and "[9, 10, 12]" in (pkg / "jit" / "comm.py").read_text()
