"""The engines' own compile caches (check 8 of ``stackprobe.health``, :mod:`stackprobe.health_enginecache`) on real
wheels: SGLang 0.5.23 and 0.5.9 (with apache-tvm-ffi 0.1.11), vLLM 0.33.0 and triton 3.9.0 from PyPI, and cache
entries planted from real artefacts in folders the engines' environment variables name.

Case (issue 38 item 5, second half): a compiled module an engine keeps on disk and loads before it would compile
one is checked like an installed one. Before, none of these caches was read: a cached module linking
``libcudart.so.13`` beside a CUDA 12 torch, or a Triton entry whose metadata names this target but whose cubin is
for another SM, left the health section at "no errors". Planted files:

* a CUDA 13 module: torch 2.14.1's ``libc10_cuda.so`` (links ``libcudart.so.13`` and ``libc10.so``), a CUDA 12
  one: torch 2.9.1's (links ``libcudart.so.12``); torch 2.9.1 is the stack, so the first also needs c10 symbols
  torch 2.9.1 does not export;
* a Triton entry: ``<key>/<kernel>.json`` with ``"target": {"backend": "cuda", "arch": N}`` beside a real sm_100a
  cubin from flashinfer-cubin 0.6.3.

The failing twin runs the suite of the commit before this check (``git archive``) on the same planted caches.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from validate_support import CACHE, SUITE, engine_copy, pip_target, run_suite, suite_env

pytestmark = pytest.mark.network

#: the suite before the engines' caches were read (its FlashInfer cache check was there already)
OLD_SUITE_COMMIT = "47597c2"
CA = "sglang-custom-allreduce"


def _scan(paths: list[Path], target: str, env: dict, stack_major: int = 12) -> dict:
    """``health_enginecache.scan`` run by a child interpreter whose ``sys.path`` holds ``paths`` (the engines
    found as installed there), with ``findings`` added."""
    code = ("import json, sys; from stackprobe import health as h, health_enginecache as ec; "
            "from stackprobe.archs import parse_arch; "
            f"r = ec.scan(h.installed(), {stack_major}, parse_arch({target!r})); "
            f"r['findings'] = ec.findings(r, '{stack_major}.x'); print(json.dumps(r))")
    p = subprocess.run([str(_bare()), "-c", code], capture_output=True, text=True,
                       env=suite_env(paths, extra=env), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def _torch_lib(spec: str) -> Path:
    deps = spec == "torch==2.14.1"
    return pip_target(spec, deps=deps) / "torch" / "lib"


def _so(major: int) -> Path:
    """A real shared object linking ``libcudart.so.<major>``: torch's ``libc10_cuda.so``."""
    return _torch_lib({12: "torch==2.9.1", 13: "torch==2.14.1"}[major]) / "libc10_cuda.so"


def _cubin_sm100a() -> Path:
    root = pip_target("flashinfer-cubin==0.6.3")
    return min((p for p in root.rglob("*Sm100a*.cubin")), key=lambda p: p.stat().st_size)


def plant_triton(root: Path, key: str, arch: int) -> Path:
    """``<root>/<key>/_k.json`` naming CUDA ``arch`` beside a real sm_100a cubin (Triton's cache layout)."""
    d = root / key
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(_cubin_sm100a(), d / "_k.cubin")
    meta = d / "_k.json"
    meta.write_text(json.dumps({"name": "_k", "target": {"backend": "cuda", "arch": arch, "warp_size": 32}}))
    (d / "__grp___k.json").write_text(json.dumps({"child_paths": {"_k.json": str(meta)}}))
    return meta


def plant_sglang_jit(root: Path, tag: str, module: str, major: int) -> Path:
    """``<root>/<tag>/<module>/build-<key>/deps-<key>/<module>.so`` (SGLang 0.5.23 ``cache.py:15-21``)."""
    so = root / tag / module / "build-0123456789abcdef" / "deps-fedcba9876543210" / f"{module}.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_so(major), so)
    return so


def _sglang_paths() -> list[Path]:
    return [pip_target("sglang==0.5.23"), pip_target("torch==2.9.1"), pip_target("triton==3.9.0")]


def test_sglang_0523_jit_cache_cuda13_module_flagged_cuda12_not(tmp_path):
    sg = tmp_path / "sgl"
    bad = plant_sglang_jit(sg, "sm90a", "fused_bad", 13)
    good = plant_sglang_jit(sg, "sm90a", "fused_good", 12)
    plant_sglang_jit(sg, "sm100a", "fused_other", 13)   # another target's: never looked up on a 9.0 GPU
    r = _scan(_sglang_paths(), "9.0", {"SGLANG_JIT_CACHE_DIR": str(sg), "TRITON_CACHE_DIR": str(tmp_path / "t")})
    assert r["not_assessed"] == []
    c = next(c for c in r["caches"] if c["kind"] == "sglang-jit")
    assert c["engine"] == "sglang 0.5.23" and c["root"] == str(sg) and c["other_targets"] == 1
    rows = {m["module"]: m for m in c["modules"]}
    assert set(rows) == {"fused_bad", "fused_good"}
    assert rows["fused_bad"]["path"] == str(bad) and rows["fused_bad"]["mismatch"] == ["libcudart.so.13"]
    assert rows["fused_bad"]["symbols_missing"], "torch 2.14.1's c10_cuda needs c10 symbols torch 2.9.1 lacks"
    assert rows["fused_bad"]["finding"] == "warning"   # key holds nvcc --version; a failed load is rebuilt
    assert rows["fused_good"]["path"] == str(good)
    assert rows["fused_good"]["mismatch"] == [] and rows["fused_good"]["symbols_missing"] == []
    assert rows["fused_good"]["finding"] == ""
    msgs = [f["message"] for f in r["findings"] if f["level"] != "info"]
    assert len(msgs) == 1 and "fused_bad" in msgs[0] and "loader.py:135-138" in msgs[0]
    assert any("1 for other targets not read" in f["message"] for f in r["findings"] if f["level"] == "info")


def test_sglang_059_tvm_ffi_cache_cuda13_module_is_an_error(tmp_path):
    """SGLang 0.5.9 builds through tvm-ffi, whose cache key has no compiler in it: the stale module loads."""
    cache = tmp_path / "tvm"
    for name, major in (("sgl_kernel_jit_bad_1", 13), ("sgl_kernel_jit_good_2", 12)):
        d = cache / f"{name}_0a1b2c3d"
        d.mkdir(parents=True)
        shutil.copy(_so(major), d / f"{name}.so")
    paths = [pip_target("sglang==0.5.9"), pip_target("apache-tvm-ffi==0.1.11"), pip_target("torch==2.9.1")]
    r = _scan(paths, "9.0", {"TVM_FFI_CACHE_DIR": str(cache), "SGLANG_JIT_CACHE_DIR": str(tmp_path / "none")})
    assert r["not_assessed"] == []
    c = next(c for c in r["caches"] if c["kind"] == "sglang-tvm-ffi")
    assert c["engine"] == "sglang 0.5.9" and "tvm_ffi" in c["source"]
    rows = {m["module"]: m for m in c["modules"]}
    assert rows["sgl_kernel_jit_bad_1"]["finding"] == "error"
    assert rows["sgl_kernel_jit_good_2"]["finding"] == ""
    errs = [f["message"] for f in r["findings"] if f["level"] == "error"]
    assert len(errs) == 1 and "sgl_kernel_jit_bad_1" in errs[0] and "extension.py" in errs[0]


def test_vllm_0330_torch_compile_cache_module_and_triton_entry(tmp_path):
    root = tmp_path / "vllm"
    hashdir = root / "torch_compile_cache" / "0123456789"
    so = hashdir / "inductor_cache" / "ab" / "cabcdef.so"
    so.parent.mkdir(parents=True)
    shutil.copy(_so(13), so)
    stale = plant_triton(hashdir / "triton_cache", "KEYSTALE", 90)   # names 9.0, holds sm_100a
    plant_triton(hashdir / "triton_cache", "KEYOTHER", 100)           # another target's key
    paths = [pip_target("vllm==0.33.0"), pip_target("torch==2.9.1")]
    r = _scan(paths, "9.0", {"VLLM_CACHE_ROOT": str(root)})
    c = next(c for c in r["caches"] if c["kind"] == "vllm-torch-compile")
    assert c["engine"] == "vllm 0.33.0" and c["root"] == str(root / "torch_compile_cache")
    assert [m["path"] for m in c["modules"]] == [str(so)] and c["modules"][0]["mismatch"] == ["libcudart.so.13"]
    assert [t["path"] for t in c["triton"]] == [str(stale)] and c["triton"][0]["cubin_sm"] == 100
    assert c["triton"][0]["finding"] == "error" and c["other_targets"] == 1
    assert sum(f["level"] == "error" for f in r["findings"]) == 1


@pytest.mark.parametrize("target,meta_arch,bad", [("9.0", 90, True), ("10.0", 100, False), ("10.0", 90, False)])
def test_triton_cache_entry_checked_against_its_key_target(tmp_path, target, meta_arch, bad):
    """A cubin for another SM under a key naming this target is an error; an entry naming another target is never
    looked up (Triton's key holds the arch: backends/nvidia/compiler.py ``hash``) and is only counted."""
    meta = plant_triton(tmp_path / "tri", "KEY", meta_arch)
    r = _scan([pip_target("triton==3.9.0")], target, {"TRITON_CACHE_DIR": str(tmp_path / "tri")})
    c = next(c for c in r["caches"] if c["kind"] == "triton")
    assert c["engine"] == "triton 3.9.0" and c["root"] == str(tmp_path / "tri")
    errs = [f["message"] for f in r["findings"] if f["level"] == "error"]
    if bad:
        assert len(errs) == 1 and str(meta) in errs[0] and "sm_100" in errs[0]
    else:
        assert errs == []
        looked_up = meta_arch == int(target.replace(".", ""))
        assert len(c["triton"]) == int(looked_up) and c["other_targets"] == int(not looked_up)


def test_a_layout_the_reader_does_not_know_is_not_assessed(tmp_path):
    """An edited copy of SGLang 0.5.23 whose cache.py reads another variable and folder: the planted CUDA 13
    module is not judged, and the cache is "not assessed: why", never silently clean."""
    src = pip_target("sglang==0.5.23")
    copy = engine_copy(src, tmp_path / "sg", {"sglang/kernels/jit/utils/compile/cache.py": (
        'envs.SGLANG_JIT_CACHE_DIR.get() or "~/.cache/sglang/jit"',
        'envs.SGLANG_KERNEL_STORE.get() or "~/.cache/sglang/store"')})
    sg = tmp_path / "sgl"
    plant_sglang_jit(sg, "sm90a", "fused_bad", 13)
    r = _scan([copy, pip_target("torch==2.9.1")], "9.0", {"SGLANG_JIT_CACHE_DIR": str(sg)})
    assert not any(c["kind"] == "sglang-jit" for c in r["caches"])
    gap = next(g for g in r["not_assessed"] if g["what"].startswith("sglang 0.5.23"))
    assert "cache.py lacks \"~/.cache/sglang/jit\"" in gap["why"]


def _bare() -> Path:
    """A virtual environment with the standard library only (``python -m venv --without-pip``): what the child
    finds installed is what ``paths`` hold."""
    d = CACHE / "venv-bare"
    py = d / "bin" / "python"
    if not py.exists():
        subprocess.run(["python3", "-m", "venv", "--without-pip", str(d)], check=True, capture_output=True)
    return py


@pytest.fixture(scope="module")
def bare_python() -> Path:
    return _bare()


def _report(python: Path, paths: list[Path], env: dict) -> tuple[dict, str]:
    """(JSON report, health section of the Markdown report) of one static run for ``CA``."""
    args = ["--backend", CA, "--arch", "9.0"]
    rep = run_suite(python, paths, args, extra_env=env)[0]
    p = subprocess.run([str(python), "-m", "stackprobe", "--quiet", *args, "--markdown", "-"], capture_output=True,
                       text=True, env=suite_env(paths, extra=env), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    start = p.stdout.index("## Environment health")
    return rep, p.stdout[start:p.stdout.index("\n## ", start + 5)]


def _stale_named(rep: dict, md: str, so: Path, meta: Path) -> bool:
    """The planted CUDA 13 module and the stale Triton entry both reach the report's health section as errors."""
    errs = [f["message"] for f in rep["environment"]["health"]["findings"] if f["level"] == "error"]
    return (any(str(so) in m for m in errs) and any(str(meta) in m for m in errs)
            and str(so) in md and str(meta) in md and "no errors" not in md.split("\n- ")[0])


@pytest.mark.parametrize("suite", ["this", "before"])
def test_report_health_section_names_stale_engine_cache_entries(bare_python, tmp_path, suite):
    """End to end: SGLang 0.5.9 + tvm-ffi 0.1.11 + torch 2.9.1 + triton 3.9.0, a CUDA 13 module in tvm-ffi's cache
    and a stale Triton entry; the health section names both. ``before``: the suite of the commit before this check,
    on the same planted caches, names neither (the failing twin: the caches were never read)."""
    cache = tmp_path / "tvm" / "sgl_kernel_jit_bad_1_0a1b2c3d"
    cache.mkdir(parents=True)
    so = cache / "sgl_kernel_jit_bad_1.so"
    shutil.copy(_so(13), so)
    meta = plant_triton(tmp_path / "tri", "KEY", 90)
    paths = [pip_target("sglang==0.5.9"), pip_target("apache-tvm-ffi==0.1.11"), pip_target("torch==2.9.1"),
             pip_target("triton==3.9.0")]
    env = {"TVM_FFI_CACHE_DIR": str(tmp_path / "tvm"), "TRITON_CACHE_DIR": str(tmp_path / "tri"),
           "SGLANG_JIT_CACHE_DIR": str(tmp_path / "none"), "CUDA_HOME": "/nonexistent-cuda"}
    if suite == "before":
        old = tmp_path / "old"
        old.mkdir()
        arch = subprocess.run(["git", "-C", str(SUITE.parent), "archive", OLD_SUITE_COMMIT, "validate"],
                              capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=arch, check=True)
        env["PYTHONPATH"] = ":".join([str(old / "validate")] + [str(p) for p in paths])
    rep, md = _report(bare_python, paths, env)
    if suite == "this":
        assert _stale_named(rep, md, so, meta), md
        assert rep["environment"]["health"]["engine_cache"]["not_assessed"] == []
    else:
        assert "engine_cache" not in rep["environment"]["health"]
        assert not _stale_named(rep, md, so, meta)


@pytest.mark.parametrize("with_sglang", [True, False])
def test_import_sglang_moves_triton_and_flashinfer_caches_and_both_are_read(tmp_path, with_sglang):
    """SGLang 0.5.23's ``import sglang`` points ``TRITON_CACHE_DIR`` at ``$SGLANG_CACHE_DIR/triton`` and
    ``FLASHINFER_WORKSPACE_BASE`` at ``$SGLANG_CACHE_DIR`` where unset (srt/environ.py ``third_party_cache_defaults``).
    A stale Triton entry and a CUDA 13 FlashInfer module planted there are flagged; without SGLang installed
    (the twin: nothing moves the caches) that folder is not where anything loads from, and it is not read."""
    base = tmp_path / "sgc"
    meta = plant_triton(base / "triton", "KEY", 90)
    so = base / ".cache" / "flashinfer" / "0.7.2" / "90a" / "cached_ops" / "trtllm_comm" / "trtllm_comm.so"
    so.parent.mkdir(parents=True)
    shutil.copy(_so(13), so)
    paths = [pip_target("flashinfer-python==0.7.2"), pip_target("torch==2.9.1"), pip_target("triton==3.9.0")]
    if with_sglang:
        paths.insert(0, pip_target("sglang==0.5.23"))
    env = {"SGLANG_CACHE_DIR": str(base), "SGLANG_JIT_CACHE_DIR": str(tmp_path / "none"),
           "HOME": str(tmp_path / "home")}
    r = _scan(paths, "9.0", env)
    code = ("import json; from stackprobe import health as h, health_jitcache as j; "
            "from stackprobe.archs import parse_arch; print(json.dumps(j.scan_all(h.installed(), 12, "
            "parse_arch('9.0'))))")
    p = subprocess.run([str(_bare()), "-c", code], capture_output=True, text=True, env=suite_env(paths, extra=env),
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    jc = json.loads(p.stdout)
    errs = [f["message"] for f in r["findings"] if f["level"] == "error"]
    fi_rows = [m for m in jc["modules"] if m["path"] == str(so)]
    if with_sglang:
        moved = next(c for c in r["caches"] if c["kind"].startswith("triton (where import sglang"))
        assert moved["root"] == str(base / "triton") and len(errs) == 1 and str(meta) in errs[0]
        assert str(base / ".cache" / "flashinfer" / "0.7.2") in jc["roots"]
        assert len(fi_rows) == 1 and fi_rows[0]["mismatch"] == ["libcudart.so.13"]
    else:
        assert errs == [] and [c["root"] for c in r["caches"]] == [str(tmp_path / "home" / ".triton" / "cache")]
        assert fi_rows == [] and jc["roots"] == [str(tmp_path / "home" / ".cache" / "flashinfer" / "0.7.2")]


def test_a_triton_entry_whose_cubin_cannot_be_read_is_not_assessed_not_counted_clean(tmp_path):
    """An entry whose metadata names this target but has no cubin beside it cannot be judged: it is listed as not
    assessed (``health_enginecache.unread``, which the health section's not-assessed list takes), never only counted
    among the entries read. Twin: the same entry with its cubin is judged (an error here: sm_100a under sm_90's key)
    and is not in the not-assessed list."""
    from stackprobe import health_enginecache as ec

    meta = plant_triton(tmp_path / "tri", "KEY", 90)
    meta.with_suffix(".cubin").unlink()
    r = _scan([pip_target("triton==3.9.0")], "9.0", {"TRITON_CACHE_DIR": str(tmp_path / "tri")})
    gaps = ec.unread(r)
    assert [g["what"].split(" (")[0] for g in gaps] == [f"Triton cache entry {meta}"], gaps
    assert gaps[0]["why"] == "no .cubin beside the metadata"
    assert not any(f["level"] == "error" for f in r["findings"])
    twin = plant_triton(tmp_path / "tri2", "KEY", 90)
    r2 = _scan([pip_target("triton==3.9.0")], "9.0", {"TRITON_CACHE_DIR": str(tmp_path / "tri2")})
    assert ec.unread(r2) == [] and any(str(twin) in f["message"] for f in r2["findings"] if f["level"] == "error")
