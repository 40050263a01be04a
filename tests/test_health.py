"""The environment health stage's parts, on real inputs: crafted shared objects built here with g++ (an extension
that needs a c10 symbol its library lacks, one that links another CUDA major), pip's own ``pip check`` on a
target folder of real PyPI wheels, and the import child on a module that fails to load."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from validate_support import SUITE, pip_target, suite_venv

sys.path.insert(0, str(SUITE))
from stackprobe import health, health_elf, health_stage  # noqa: E402
from stackprobe.probes import needs, probes  # noqa: E402


def _gxx(out: Path, src: str, *args) -> Path:
    c = out.with_suffix(".cpp")
    c.write_text(src)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(out), str(c), *map(str, args)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """libc10.so exporting c10::present() only; ext.so needing c10::present() and c10::absent(int); a stub
    libcudart.so.12 and an artifact linking it."""
    d = tmp_path_factory.mktemp("elf")
    lib = d / "lib"
    lib.mkdir()
    _gxx(lib / "libc10.so", "namespace c10 { int present() { return 1; } }\n", "-Wl,-soname,libc10.so")
    ext = _gxx(d / "badext.so", "namespace c10 { int present(); int absent(int); }\n"
               "extern \"C\" int entry() { return c10::present() + c10::absent(3); }\n", f"-L{lib}", "-lc10")
    good = _gxx(d / "goodext.so", "namespace c10 { int present(); }\nextern \"C\" int entry() { return c10::present(); }\n",
                f"-L{lib}", "-lc10")
    cu = d / "cu12"
    cu.mkdir()
    _gxx(cu / "libcudart.so", "extern \"C\" int cudaRuntimeGetVersion(int *v) { *v = 12080; return 0; }\n",
         "-Wl,-soname,libcudart.so.12")
    art = _gxx(d / "artifact.so", "extern \"C\" int cudaRuntimeGetVersion(int *);\n"
               "extern \"C\" int k() { int v; return cudaRuntimeGetVersion(&v); }\n", f"-L{cu}", "-lcudart",
               "-Wl,--no-as-needed")
    return {"lib": lib, "ext": ext, "good": good, "artifact": art}


def test_needs_table_names_every_backend_the_probes_answer_for():
    names = {b for m in probes() for b in getattr(m, "BACKENDS", ())}
    assert set(needs.NEEDS) == names
    with pytest.raises(KeyError, match="needs.NEEDS"):
        needs.need("no-such-backend")


def test_static_symbol_check_finds_the_c10_symbol_the_library_lacks(libs):
    res = health_elf.missing_symbols(str(libs["ext"]), [libs["lib"]])
    assert res["checked"] == 2 and res["unresolved_libraries"] == []
    assert [m["demangled"] for m in res["missing"]] == ["c10::absent(int)"]
    assert res["missing"][0]["expected_in"] == "libc10.so"
    # the control: an extension whose symbols the library exports
    assert health_elf.missing_symbols(str(libs["good"]), [libs["lib"]])["missing"] == []
    # without torch's library in reach nothing is judged (a CPU torch lacks libc10_cuda.so): said, not passed
    res = health_elf.missing_symbols(str(libs["ext"]), [libs["lib"].parent / "nowhere"])
    assert res["missing"] == [] and res["undecided"] and res["unresolved_libraries"] == ["libc10.so"]


def test_dt_needed_gives_the_artifacts_cuda_major(libs):
    assert "libcudart.so.12" in health_elf.needed(str(libs["artifact"]))
    assert health_elf.cuda_majors(health_elf.needed(str(libs["artifact"]))) == {"libcudart.so.12": 12}
    # cuFFT's soname is versioned on its own (CUDA 13.0 ships libcufft.so.12): not a CUDA major
    assert health_elf.cuda_majors(["libcufft.so.12", "libcublas.so.13", "libnccl.so.2"]) == {"libcublas.so.13": 13}
    assert health.artifact_mismatch(str(libs["artifact"]), {"torch": {"cuda": "13.0"}}) == \
        {"needs": ["libcudart.so.12"], "stack": "13.0"}
    assert health.artifact_mismatch(str(libs["artifact"]), {"torch": {"cuda": "12.8"}}) is None


def test_demangle_without_cxxfilt_keeps_the_name_and_says_so(monkeypatch):
    assert health_elf.demangle(["_ZN3c107presentEv"]) == {"_ZN3c107presentEv": "c10::present()"}
    monkeypatch.setattr(health_elf.shutil, "which", lambda _: None)
    assert "c++filt not found" in health_elf.demangle(["_ZN3c107presentEv"])["_ZN3c107presentEv"]


def test_a_real_import_that_fails_on_an_undefined_symbol_is_classified(libs, tmp_path):
    """The planted fault: a module whose shared object needs c10::absent(int) (dlopen with RTLD_NOW fails)."""
    pkg = tmp_path / "site"
    pkg.mkdir()
    os.symlink(libs["ext"], pkg / "badext.so")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SUITE), str(pkg)]), LD_LIBRARY_PATH=str(libs["lib"]))
    p = subprocess.run([sys.executable, "-m", "stackprobe.health_child"], input=json.dumps(["badext", "json"]),
                       capture_output=True, text=True, env=env, timeout=120)
    rows = [json.loads(x.split(" ", 1)[1]) for x in p.stdout.splitlines() if x.startswith("HEALTH-RESULT ")]
    bad, ok = (health.classify(r) for r in rows)
    assert ok["kind"] == "ok"
    assert bad["kind"] == "undefined-symbol" and bad["error_class"] == "ImportError"
    assert bad["demangled"] == "c10::absent(int)" and bad["expected_in"] == "libc10.so"


def test_classify_device_and_missing_dependency():
    dev = health.classify({"module": "m", "ok": False, "error_class": "ImportError",
                           "error": "libcuda.so.1: cannot open shared object file: No such file or directory"})
    assert dev["kind"] == "needs-device"
    miss = health.classify({"module": "flashinfer.comm", "ok": False, "error_class": "ImportError",
                            "error": "Could not import the 'cuda' module.", "chain": ["ModuleNotFoundError: No module named 'cuda'"]})
    assert miss["kind"] == "missing-module" and miss["missing"] == "cuda"
    other = health.classify({"module": "m", "ok": False, "error_class": "RuntimeError", "error": "versions differ"})
    assert other["kind"] == "error"
    # the CUDA runtime's own no-device text (cudaErrorNoDevice), and FlashInfer 0.6.3's comm/cuda_ipc.py assertion
    # where a CPU torch mapped no libcudart: the stack decides, not the package
    for msg in ("CUDA error: no CUDA-capable device is detected", "libcudart is not loaded in the current process"):
        assert health.classify({"module": "flashinfer.comm", "ok": False, "error_class": "AssertionError",
                                "error": msg})["kind"] == "needs-device", msg
    # a message that only mentions libcudart is not one
    assert health.classify({"module": "m", "ok": False, "error_class": "OSError",
                            "error": "libcudart.so.12: cannot open shared object file"})["kind"] == "missing-library"


def test_requirements_not_assessed_without_a_parser(monkeypatch):
    """Where neither packaging nor pip's vendored copy imports, the check says it was not assessed (never 'no breaks')."""
    import builtins
    real_import = builtins.__import__

    def no_packaging(name, *a, **k):
        if name.startswith(("packaging", "pip._vendor.packaging")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_packaging)
    with pytest.raises(health.RequirementsUnreadable, match="not assessed: neither packaging nor pip"):
        health.requirement_breaks({})


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_requirement_breaks_agree_with_pip_check(tmp_path):
    """Our reading of the metadata against pip's own `pip check`, on real wheels: sglang-kernel 0.4.6.post1 next to
    sglang 0.5.23 (which pins sglang-kernel==0.4.10) and the venv's torch."""
    venv = suite_venv()
    paths = [pip_target("sglang==0.5.23"), pip_target("sglang-kernel==0.4.6.post1")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SUITE)] + [str(p) for p in paths]))
    code = ("import json; from stackprobe import health; "
            "print(json.dumps([[b['dist'], b['name'], b['kind']] for b in health.requirement_breaks()]))")
    ours = json.loads(subprocess.run([str(venv), "-c", code], capture_output=True, text=True, env=env, check=True,
                                 cwd=tmp_path).stdout)   # a neutral folder: the caller's checkout is no installed dist
    pip = subprocess.run([str(venv), "-m", "pip", "check"], capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    assert ["sglang", "sglang-kernel", "conflict"] in ours
    assert ours[0][:2] == ["sglang", "sglang-kernel"] or ours[0][0] == "sglang"   # the engine's exact pins first
    for dist, name, kind in ours:
        word = "has requirement" if kind == "conflict" else "requires"
        def norm(x):
            return x.lower().replace("_", "-")
        assert any(norm(line).startswith(norm(dist) + " ") and word in line and norm(name) in norm(line)
                   for line in pip.splitlines()), (dist, name, kind, pip[:2000])
    assert len(ours) == len([x for x in pip.splitlines() if " requires " in x or " has requirement " in x])


def test_apply_blocks_once_keeps_the_answer_and_spares_not_installed():
    from stackprobe.verdict import GATE_PASSES, SKIPPED, Verdict
    block = {"scope": "", "gate": "broken-install", "cause": "broken install: x", "lift": "package-upgrade",
             "lift_detail": "fix x", "evidence": {"e": 1}, "source": "s"}
    hl = {"blocks": {"sglang-custom-allreduce": [block, dict(block, cause="second")]}}
    a = Verdict("sglang-custom-allreduce", GATE_PASSES, scope="library", cause="gate admits it")
    b = Verdict("sglang-custom-allreduce", SKIPPED, scope="engine", gate="not-installed", cause="not installed: sglang")
    health_stage.apply([a, b], hl)
    assert a.status == "blocked" and a.gate == "broken-install" and a.cause == "broken install: x"
    assert a.evidence[0].value.startswith("gate-passes") and len(a.evidence) == 3
    assert b.status == "skipped"
