"""Case C25 in the lock: one CUDA release for a closure's toolkit wheels. pip's real resolver over a local
PEP 503 index of tiny wheels named like PyPI's CUDA 13 component wheels: a torch-like package pins the
runtime of CUDA 13.0, a humming-kernels-like package asks for nvcc and cccl without an upper bound (what
sglang 0.5.23's humming-kernels[cu13] does on PyPI, which made the 13.1 runtime lock mix nvcc 13.5.37,
cccl 13.3.5 and runtime 13.0.96)."""
from __future__ import annotations

import pytest

from cudastack.lock import cuda_wheels
from cudastack import lock as L
from cudastack.plan.model import Node, Plan
from lock_support import TARGET, make_index, make_wheel


@pytest.fixture
def index(tmp_path):
    return cuda_index(tmp_path)


def cuda_index(tmp_path):
    """A local index of CUDA toolkit wheels at two releases plus three consumers (case C25's shape)."""
    d = tmp_path / "files"
    files = [make_wheel(d, "nvidia-cuda-runtime", v) for v in ("13.0.96", "13.5.37")]
    files += [make_wheel(d, "nvidia-cuda-nvcc", v, ["nvidia-cuda-runtime"]) for v in ("13.0.88", "13.5.37")]
    files += [make_wheel(d, "nvidia-cuda-cccl", v) for v in ("13.0.85", "13.3.5.0.6")]
    files += [make_wheel(d, "tinytorch", "1.0", ["nvidia-cuda-runtime==13.0.96"]),
              make_wheel(d, "humming", "1.0", ["nvidia-cuda-nvcc", "nvidia-cuda-cccl"]),
              make_wheel(d, "needsnew", "1.0", ["nvidia-cuda-nvcc>=13.5"])]
    return make_index(tmp_path / "idx", files)


def plan(index_url: str, specs: str) -> Plan:
    node = Node("runtime", "image", "images/image.Dockerfile", [], {"PIP_SPECS": specs, "PIP_INDEX_URL": index_url},
                hash="a" * 64, method="wheel", inputs={"dockerfile": "ARG PIP_SPECS\n"})
    return Plan("9.9", "9.9.0", ["12.0"], "pip", [node], "wheelhouse/cu9.9")


def closure(lock) -> dict:
    return {p["name"]: p["version"] for p in lock["nodes"]["runtime"]["installs"]["PIP_SPECS"]["packages"]}


def test_unbounded_cuda_wheels_are_kept_on_the_runtime_release(index):
    # what pip alone picks: the newest nvcc and cccl beside the pinned 13.0 runtime (the C25 mix)
    raw = L.pip_resolve(["tinytorch==1.0", "humming==1.0"], target=TARGET, index=index)
    assert cuda_wheels.off_release(raw) == {"nvidia-cuda-nvcc": "13.5.37", "nvidia-cuda-cccl": "13.3.5.0.6"}
    lock = L.resolve_lock(plan(index, "tinytorch==1.0 humming==1.0"), target=TARGET)
    got = closure(lock)
    assert got["nvidia-cuda-runtime"] == "13.0.96" and got["nvidia-cuda-nvcc"] == "13.0.88"
    assert got["nvidia-cuda-cccl"] == "13.0.85"
    note = next(w for w in lock["warnings"] if "kept on CUDA 13.0" in w)
    assert "nvidia-cuda-nvcc 13.5.37 -> 13.0.88" in note and "humming requires nvidia-cuda-nvcc" in note


def test_a_dependency_that_forces_the_mix_is_named(index):
    lock = L.resolve_lock(plan(index, "tinytorch==1.0 needsnew==1.0"), target=TARGET)
    got = closure(lock)
    assert got["nvidia-cuda-nvcc"] == "13.5.37" and got["nvidia-cuda-runtime"] == "13.0.96"
    note = next(w for w in lock["warnings"] if "mix releases" in w)
    assert "cannot be kept on 13.0" in note and "needsnew requires nvidia-cuda-nvcc>=13.5" in note


def test_a_coherent_closure_is_left_alone(index):
    lock = L.resolve_lock(plan(index, "tinytorch==1.0"), target=TARGET)
    assert cuda_wheels.off_release([{"name": n, "version": v} for n, v in closure(lock).items()]) == {}
    assert not any("CUDA toolkit wheels" in w for w in lock.get("warnings", []))


@pytest.mark.network
def test_unlocked_runtime_build_constrains_cuda_wheels_to_the_runtime_release(tmp_path):
    """The runtime Dockerfile's unlocked install writes ``name==<release>.*`` constraints from the installed
    nvidia-cuda-runtime; run that snippet for real in a venv holding PyPI's nvidia-cuda-runtime 13.0.96 and
    let pip resolve nvidia-cuda-nvcc (unbounded) against it: 13.0.x, where unconstrained pip picks a newer one."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "images" / "runtime.Dockerfile").read_text()
    start = text.index(': "one CUDA release')
    end = text.index("with-build-ca pip install -c", start)
    snippet = "\n".join(ln.strip().rstrip("\\").strip() for ln in text[start:end].splitlines())
    cons = tmp_path / "c.txt"
    snippet = snippet.replace("/tmp/cuda-constraints.txt", str(cons))
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "--no-deps", "nvidia-cuda-runtime==13.0.96"], check=True, timeout=600)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    p = subprocess.run(["sh", "-euc", snippet], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "constrained to CUDA 13.0" in p.stdout and "nvidia-cuda-nvcc==13.0.*" in cons.read_text()

    def resolve(extra):
        report = tmp_path / "r.json"
        subprocess.run(pip + ["install", "--dry-run", "--ignore-installed", "--no-deps", "--report", str(report)]
                       + extra + ["nvidia-cuda-nvcc"], check=True, timeout=600)
        return json.loads(report.read_text())["install"][0]["metadata"]["version"]

    assert re.match(r"13\.0\.", resolve(["-c", str(cons)]))
    assert not resolve([]).startswith("13.0.")          # without the constraints: a newer release


def test_cuda_release_of_a_wheel_version():
    from stackprobe.archs import cuda_wheel_release
    assert cuda_wheel_release("nvidia-cuda-nvcc", "13.5.37") == "13.5"
    assert cuda_wheel_release("nvidia-cuda-cccl", "13.0.85") == "13.0"
    assert cuda_wheel_release("nvidia-cuda-cccl", "13.3.5.0.6") == "13.5"      # CCCL 3.5.0 of CUDA 13.5
    assert cuda_wheel_release("nvidia-cuda-cccl", "13.3.4.2.1") == "13.4"
    assert cuda_wheel_release("nvidia-cuda-runtime", "13.0.96") == "13.0"
