"""Cases C55-C60 (``CASES.md``) on real PyPI wheels, with edited copies or planted files where a case needs one.

Each test's docstring names what the suite said before (the old behaviour it fails on). To see a test fail on an
older suite, point ``STACKPROBE_SUITE_UNDER_TEST`` at that suite's ``validate`` folder: the suite is then run from
there, the wheels and the assertions stay the same.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from validate_support import CACHE, evidence, made_once, pip_target, run_suite, suite_env, verdict

pytestmark = pytest.mark.network

SYMM, RING, CA = "torch-symm-mem", "nccl-ring", "sglang-custom-allreduce"
NO_NVCC = {"CUDA_HOME": "/nonexistent-cuda"}
UNDER_TEST = os.environ.get("STACKPROBE_SUITE_UNDER_TEST")


def _env(paths: list[Path], extra: dict | None = None) -> dict:
    """The environment for the suite's run: the suite under test first on PYTHONPATH (this tree's, or the one
    ``STACKPROBE_SUITE_UNDER_TEST`` names), then ``paths``."""
    extra = dict(NO_NVCC, **(extra or {}))
    if UNDER_TEST:
        extra["PYTHONPATH"] = os.pathsep.join([UNDER_TEST] + [str(p) for p in paths])
    return extra


def _run(python: Path, paths: list[Path], args: list[str], extra: dict | None = None) -> tuple[dict, str]:
    """(JSON report, Markdown report) of one static run."""
    rep = run_suite(python, paths, args, extra_env=_env(paths, extra))[0]
    p = subprocess.run([str(python), "-m", "stackprobe", "--quiet", *args, "--markdown", "-"], capture_output=True,
                       text=True, env=suite_env(paths, extra=_env(paths, extra)), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return rep, p.stdout


def health_section(md: str) -> str:
    start = md.index("## Environment health")
    return md[start:md.index("\n## ", start + 5)]


@pytest.fixture(scope="module")
def bare_python() -> Path:
    """A virtual environment with nothing but the standard library: no pip, no packaging, no pyelftools, no
    pynvml (``python -m venv --without-pip``)."""
    d = CACHE / "venv-bare"
    py = d / "bin" / "python"
    if not py.exists():
        subprocess.run(["python3", "-m", "venv", "--without-pip", str(d)], check=True, capture_output=True)
    probe = subprocess.run([str(py), "-c", "import importlib.util as u; print([m for m in ('pip', 'packaging', "
                            "'elftools', 'pynvml') if u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]", probe.stdout
    return py


# ------------------------------------------------------------------------------------------------------ C60
@pytest.fixture(scope="module")
def c60(bare_python):
    """torch 2.9.1 (CUDA 12.8; its CUDA wheels left out, so ``import torch`` fails and the stack's CUDA is read from
    torch/version.py) beside sglang-kernel 0.4.6.post1, whose modules link libcudart.so.13, in the bare venv."""
    return _run(bare_python, [pip_target("torch==2.9.1"), pip_target("sglang-kernel==0.4.6.post1")], ["--backend", CA])


def test_c60_the_shared_object_check_runs_without_pyelftools_and_finds_the_other_major(c60):
    """Before: health.shared_objects held {"error": "ModuleNotFoundError: No module named 'elftools'"} for every
    file and the health section said "no errors"."""
    rep, md = c60
    health = rep["environment"]["health"]
    assert health["stack_cuda"] == "12.8"
    assert not [s for s in health["shared_objects"] if s.get("error")], health["shared_objects"][:2]
    bad = [s for s in health["shared_objects"] if s.get("mismatch")]
    assert bad and all("libcudart.so.13" in s["mismatch"] for s in bad), health["shared_objects"][:2]
    assert any(f["check"] == "shared_objects" and f["level"] == "error" and "libcudart.so.13" in f["message"]
               for f in health["findings"])
    v = verdict(rep, CA, "library")
    assert v["status"] == "blocked" and v["gate"] == "broken-install" and "libcudart.so.13" in v["cause"], v
    section = health_section(md)
    assert "no errors" not in section and "**ERROR: this environment is not healthy" in section
    # the same modules set the path's driver floor (CUDA 13: >= 580), kept as evidence where no driver is here (C56)
    floor = rep["environment"]["health"]["driver_floors"][CA]
    assert any(r["user"].startswith("sglang-kernel 0.4.6.post1") and r["needs"] == "580" for r in floor), floor


def test_c60_a_check_that_cannot_run_is_not_assessed_in_the_health_section_and_headline(c60):
    """Before: with neither packaging nor pip in the target the requirements check was one warning among the
    findings, and the header said nothing; now the health section's first line and the report's headline say
    which checks did not run and why."""
    rep, md = c60
    gaps = rep["environment"]["health"]["not_assessed"]
    req = next(g for g in gaps if g["check"] == "requirements")
    assert "No module named 'pip'" in req["why"] or "No module named 'packaging'" in req["why"], req
    section = health_section(md)
    assert "> **not assessed: declared requirements (" in section, section[:800]
    head = next(line for line in md.splitlines() if line.startswith("target "))
    assert "health: " in head and "not assessed: declared requirements" in head, head


def test_c60_no_torch_at_all_the_cuda_major_is_not_assessed_never_no_errors(bare_python):
    """The twin without torch: nothing to compare sglang-kernel's CUDA 13 libraries with. Before: "no errors"."""
    rep, md = _run(bare_python, [pip_target("sglang-kernel==0.4.6.post1")], ["--backend", CA])
    gaps = rep["environment"]["health"]["not_assessed"]
    assert any(g["check"] == "shared_objects" and "sglang-kernel" in g["what"] and "CUDA version is unknown" in g["why"]
               for g in gaps), gaps
    section = health_section(md)
    assert "no errors:" not in section and "> **not assessed: " in section, section[:600]
    assert "not assessed: " in next(line for line in md.splitlines() if line.startswith("target "))


# ------------------------------------------------------------------------------------------------------ C55
def _link_tree(src: Path, dest: Path, keep: dict[str, Path]) -> None:
    """``dest`` mirrors ``src`` with symlinks, folder by folder only where ``keep`` (relative path -> the file to copy
    in its place) reaches into it: the rest is one symlink per entry."""
    dest.mkdir(parents=True, exist_ok=True)
    inner = {}
    for rel, f in keep.items():
        head, _, tail = rel.partition("/")
        inner.setdefault(head, {})[tail] = f
    for entry in sorted(src.iterdir()):
        if entry.name in (".ready", "__pycache__"):
            continue
        q = dest / entry.name
        if entry.name not in inner:
            q.symlink_to(entry)
        elif "" in inner[entry.name]:
            shutil.copy2(inner[entry.name][""], q)
        else:
            _link_tree(entry, q, inner[entry.name])


def nccl_swapped(torch_site: Path) -> Path:
    """torch 2.14.1's install (with its CUDA 13 wheels) where ``nvidia/nccl/lib/libnccl.so.2`` of nvidia-nccl-cu13
    is replaced by nvidia-nccl-cu12 2.26.2's file (pytorch/pytorch#186591's state); everything else symlinked."""
    root = CACHE / "health-c55" / "site"

    def make(_: Path) -> None:
        cu12 = pip_target("nvidia-nccl-cu12==2.26.2") / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        assert (torch_site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").is_file(), "torch 2.14.1's NCCL moved"
        _link_tree(torch_site, root, {"nvidia/nccl/lib/libnccl.so.2": cu12})
    made_once(root.parent, make)
    return root


@pytest.fixture(scope="module")
def c55():
    from validate_support import suite_venv
    site = nccl_swapped(pip_target("torch==2.14.1", deps=True))
    return _run(suite_venv(), [site], ["--backend", SYMM, "--backend", RING])


def test_c55_an_installed_but_broken_torch_is_a_broken_install_on_every_path(c55):
    """Before: torch symmetric memory read "not installed: torch" although torch is installed (its import fails)."""
    rep, _ = c55
    for v in [v for v in rep["verdicts"] if v["backend"] in (SYMM, RING)]:
        assert "not installed: torch" not in v["cause"], (v["backend"], v["scope"], v["cause"])
    for b in (SYMM, RING):
        v = verdict(rep, b, "library")
        assert v["status"] == "blocked" and v["gate"] == "broken-install", (b, v["cause"])
        assert "ncclCommResume" in v["cause"]


def test_c55_the_lift_names_the_package_to_restore_from_torchs_own_requirement(c55):
    """Before: the lift said "reinstall torch so that `import torch` succeeds"; the broken file is NCCL's."""
    rep, _ = c55
    imp = next(r for r in rep["environment"]["health"]["imports"] if r["module"] == "torch")
    assert imp["kind"] == "undefined-symbol" and imp["symbol"] == "ncclCommResume", imp
    assert imp["owner"]["dist"] == "nvidia-nccl-cu13" and imp["owner"]["record"] == "differs", imp["owner"]
    for b in (SYMM, RING):
        lift = verdict(rep, b, "library")["lift_detail"]
        assert "pip install --force-reinstall 'nvidia-nccl-cu13==2.30.7'" in lift, lift
        assert "torch 2.14.1's requirement" in lift and "NCCL 2.26.2" in lift, lift


def test_c55_header_coverage_row_and_evidence_show_the_nccl_that_loads(c55):
    """Before: the header and the libnccl coverage row printed the wheel's 2.30.7, the NCCL that cannot load."""
    rep, md = c55
    nccl = rep["environment"]["health"]["nccl"]
    assert nccl["version"] == "2.26.2" and nccl["wheel"]["dist"] == "nvidia-nccl-cu13"
    assert nccl["wheel"]["version"] == "2.30.7" and nccl["wheel"]["record"] == "differs"
    head = next(line for line in md.splitlines() if line.startswith("target "))
    assert "NCCL 2.26.2 loaded (wheel metadata nvidia-nccl-cu13 2.30.7)" in head, head
    stack = next(line for line in md.splitlines() if line.startswith("stack:"))   # the summary block
    assert "NCCL 2.26.2 loaded (wheel metadata nvidia-nccl-cu13 2.30.7)" in stack, stack
    row = next(line for line in md.splitlines() if line.startswith("| libnccl |"))
    assert "2.26.2+cuda12.2 (the file; wheel metadata nvidia-nccl-cu13 2.30.7)" in row, row
    assert any(f["check"] == "nccl" and f["level"] == "error" and "2.26.2" in f["message"] and "2.30.7" in f["message"]
               for f in rep["environment"]["health"]["findings"])
    ev = evidence(verdict(rep, RING, "library"), "environment health")["value"]
    assert "2.26.2" in str(ev)
    assert "wheel metadata nvidia-nccl-cu13 2.30.7, the file differs from its RECORD" in health_section(md)
    # the NCCL that loads sets its own driver floor: built for CUDA 12 (C56)
    floor = rep["environment"]["health"]["driver_floors"][RING]
    assert any(r["user"] == "libnccl 2.26.2+cuda12.2" and r["cuda_major"] == 12 for r in floor), floor


def test_c55_control_torchs_own_nccl_keeps_its_answer(c55):
    """The twin: the same torch with its own NCCL imports; nothing is blocked as a broken install."""
    from validate_support import suite_venv
    rep, md = _run(suite_venv(), [pip_target("torch==2.14.1", deps=True)], ["--backend", SYMM, "--backend", RING])
    assert all(v["gate"] != "broken-install" for v in rep["verdicts"])
    assert rep["environment"]["health"]["nccl"]["wheel"]["record"] == "matches"
    assert "wheel metadata" not in next(line for line in md.splitlines() if line.startswith("target "))



# ------------------------------------------------------------------------------------------------------ C57
@pytest.mark.parametrize("arch", ["12.0", "9.0"])
def test_c57_tritons_bundled_ptxas_cannot_compile_for_sm120(bare_python, arch):
    """Before: triton 3.2.0 in the stack gave no finding beyond a requirements mismatch. Its bundled ptxas (CUDA 12.4)
    is asked for the target; the twin (9.0) compiles."""
    paths = [pip_target("triton==3.2.0"), pip_target("sglang==0.5.23")]
    rep = run_suite(bare_python, paths, ["--arch", arch, "--backend", CA], extra_env=_env(paths))[0]
    t = rep["environment"]["health"]["triton"]
    assert t["version"] == "3.2.0" and t["ptxas_release"] == "12.4" and t["ptxas"].endswith("nvidia/bin/ptxas")
    msgs = [f["message"] for f in rep["environment"]["health"]["findings"] if f["check"] == "triton"]
    if arch == "12.0":
        assert t["compiles"] is False and "Value 'sm_120' is not defined for option 'gpu-name'" in t["error"]
        assert len(msgs) == 1 and "CUDA 12.4" in msgs[0] and "sglang 0.5.23" in msgs[0], msgs
        assert "@triton.jit" in msgs[0] and "lmdeploy#3410" in msgs[0]
    else:
        assert t["compiles"] is True and t["target"] == "sm_90a" and not msgs


# ------------------------------------------------------------------------------------------------------ C56
EP, FUSION, PCIE = "ep-flashinfer-a2a", "flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"


def fake_smi(folder: Path, driver: str, cuda: str) -> Path:
    """A stand-in ``nvidia-smi`` printing the banner line the suite reads (no GPU here)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   f"echo '| NVIDIA-SMI {driver}             Driver Version: {driver}     CUDA Version: {cuda}     |'\n")
    exe.chmod(0o755)
    return folder


@pytest.mark.parametrize("driver,cuda", [("575.57.08", "12.9"), ("580.65.06", "13.0")])
def test_c56_cuda_bindings_13_needs_driver_580_on_the_paths_that_import_it(bare_python, tmp_path, driver, cuda):
    """Before: with a CUDA 12 torch the driver floor was torch's alone: EP all-to-all read open on a 575 driver,
    although FlashInfer's comm/mnnvl.py imports cuda.bindings.driver (cuda-bindings 13); and cuda-bindings was
    not among the environment's packages."""
    paths = [pip_target("torch==2.9.1"), pip_target("flashinfer-python==0.7.2"), pip_target("cuda-bindings==13.0.3")]
    rep, _ = run_suite(bare_python, paths, ["--backend", EP, "--backend", FUSION],
                       extra_env=_env(paths), path_first=[fake_smi(tmp_path / "bin", driver, cuda)])
    assert rep["environment"]["packages"].get("cuda-bindings") == "13.0.3"
    assert rep["environment"]["driver"]["version"] == driver
    floors = rep["environment"]["health"]["driver_floors"][EP]
    row = next(r for r in floors if r["user"] == "cuda-bindings 13.0.3")
    assert row["needs"] == "580" and "flashinfer.comm.mnnvl imports cuda.bindings" in row["evidence"], row
    v = verdict(rep, EP, "library")
    if driver.startswith("575"):
        assert v["status"] == "blocked" and v["gate"] == "driver", v["cause"]
        assert "cuda-bindings 13.0.3" in v["cause"] and ">= 580" in v["cause"] and "cutlass#2866" in v["cause"]
        assert "mnnvl" in v["cause"] and "575.57.08" in v["cause"]
        # flashinfer.comm imports it on the fusion path too (its verdict here reads not installed: FlashInfer's own
        # dependencies are left out of this environment, and a missing package keeps that answer)
        assert any(b["gate"] == "driver" for b in rep["environment"]["health"]["blocks"][FUSION])
    else:
        assert v["gate"] != "driver", v["cause"]


# ------------------------------------------------------------------------------------------------------ C58
def plant_jit_cache(base: Path, version: str, module: str, cudart_major: int) -> Path:
    """``<base>/.cache/flashinfer/<version>/120f/cached_ops/<module>/<module>.so`` linking ``libcudart.so.<major>``
    (a gcc-built stub library: only its soname matters), where FlashInfer 0.7.2's jit/env.py puts its JIT modules."""
    stub = base / "stub"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "rt.c").write_text("int cuda_stub_probe(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stub / "libcudart.so"), str(stub / "rt.c"),
                    f"-Wl,-soname,libcudart.so.{cudart_major}"], check=True, capture_output=True)
    so = base / ".cache" / "flashinfer" / version / "120f" / "cached_ops" / module / f"{module}.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    (stub / "m.c").write_text("extern int cuda_stub_probe(void); int module_entry(void) { return cuda_stub_probe(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(stub / "m.c"), f"-L{stub}", "-Wl,--no-as-needed",
                    "-lcudart"], check=True, capture_output=True)
    return so


@pytest.mark.parametrize("torch_spec,major,bad", [("torch==2.9.1", 13, True), ("torch==2.9.1", 12, False),
                                                  ("torch==2.14.1", 12, True)])
def test_c58_a_stale_flashinfer_jit_cache_module_is_named_and_distrusted(bare_python, tmp_path, torch_spec, major, bad):
    """Before: FlashInfer's JIT cache was never read. Here trtllm_comm.so under the cache of the installed
    FlashInfer links libcudart.so.<major> beside torch 2.9.1 (CUDA 12.8) or 2.14.1 (CUDA 13.0)."""
    so = plant_jit_cache(tmp_path / "ws", "0.7.2", "trtllm_comm", major)
    deps = torch_spec == "torch==2.14.1"
    paths = [pip_target(torch_spec, deps=deps), pip_target("flashinfer-python==0.7.2")]
    python = bare_python
    if deps:
        from validate_support import suite_venv
        python = suite_venv()
    rep = run_suite(python, paths, ["--backend", FUSION],
                    extra_env=_env(paths, {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}))[0]
    jc = rep["environment"]["health"]["jit_cache"]
    assert jc["layout"] is True and jc["root"].endswith(".cache/flashinfer/0.7.2")
    row = next(m for m in jc["modules"] if m["module"] == "trtllm_comm")
    assert row["path"] == str(so) and row["cuda"] == {f"libcudart.so.{major}": major}
    msgs = [f["message"] for f in rep["environment"]["health"]["findings"] if f["check"] == "jit_cache"]
    if bad:
        assert row["mismatch"] == [f"libcudart.so.{major}"]
        assert len(msgs) == 1 and "trtllm_comm" in msgs[0] and "flashinfer#5145" in msgs[0] and "try_load" in msgs[0]
        block = rep["environment"]["health"]["blocks"][FUSION][0]
        assert block["gate"] == "broken-install" and str(so.parent) in block["lift_detail"]
        if deps:   # an importable torch: the verdict itself carries it
            v = verdict(rep, FUSION, "library")
            assert v["status"] == "blocked" and "JIT cache module trtllm_comm" in v["cause"], v["cause"]
    else:
        assert row["mismatch"] == [] and not msgs


# ------------------------------------------------------------------------------------------------------ C59
@pytest.mark.parametrize("p2p_disable,world", [("1", 2), ("0", 2), ("1", 4)])
def test_c59_nccl_2_27_5_with_p2p_disabled_is_flagged_with_its_condition(bare_python, p2p_disable, world):
    """Before: nothing; the known-bad data had no environment condition and no message-size bound."""
    paths = [pip_target("nvidia-nccl-cu12==2.27.5")]
    rep = run_suite(bare_python, paths, ["--backend", RING, "--world-size", str(world), "--topology", "pcie"],
                    extra_env=_env(paths, {"NCCL_P2P_DISABLE": p2p_disable}))[0]
    v = verdict(rep, RING, "library")
    if p2p_disable == "1" and world == 2:
        assert v["status"] == "blocked" and v["gate"] == "known-bad-release", v["cause"]
        c = v["cause"]
        assert "nccl-2.27.5-shm-p2p-disabled-512k" in c and "NCCL_P2P_DISABLE=1" in c and "world size ==2 (2 here)" in c
        assert "512 KiB and more" in c and "decode allreduce (43,008 B at 3 tokens) is below it" in c
        assert "prefill's reaches it from 37 tokens" in c and "nccl/issues/1852" in c
        assert "NCCL_P2P_DISABLE unset" in v["lift_detail"]
    else:
        assert v["gate"] != "known-bad-release", v["cause"]
