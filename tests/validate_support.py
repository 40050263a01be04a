"""Shared set-up for the validation-suite tests: real packages from PyPI, cached on disk.

Everything lands under ``$CUDASTACK_TEST_CACHE`` (default ``~/.cache/cudastack-tests``), keyed by the
exact pins, so a rerun costs seconds:

* ``venv-validate``: a virtual environment with a CPU torch and the light dependencies FlashInfer's JIT
  modules import (apache-tvm-ffi, numpy, ninja, ...) plus pyelftools;
* ``pip install --no-deps --target`` folders for each backend version (flashinfer-python 0.6.16 /
  0.6.18 / 0.7.4, sglang 0.5.23, sglang-kernel 0.4.10), put on PYTHONPATH side by side;
* a CUDA 13.1 toolkit from PyPI wheels (``cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.1.1``), whose
  ``nvidia/cu13`` folder serves as CUDA_HOME.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "validate"
CACHE = Path(os.environ.get("CUDASTACK_TEST_CACHE", Path.home() / ".cache" / "cudastack-tests"))

TORCH_SPEC = "torch==2.13.0"
VENV_DEPS = ["apache-tvm-ffi>=0.1.12,<0.2", "numpy", "packaging", "requests", "tqdm", "einops", "click",
             "tabulate", "ninja", "nvidia-ml-py", "pyelftools>=0.31"]
CUDA_TOOLKIT_SPEC = "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.1.1"
CUOBJDUMP_SPEC = "nvidia-cuda-cuobjdump==13.2.78"


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


@contextlib.contextmanager
def cache_lock(d: Path):
    """Hold an exclusive lock (``flock``) on ``<d>.lock`` beside the cache folder ``d`` while it is checked and
    made: the test lanes (scripts/dev.sh) run pytest processes side by side over one cache, and a folder another
    process is still filling must be neither taken as ready nor deleted under it."""
    lock = d.parent / f".{d.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def made_once(d: Path, make) -> Path:
    """``d`` made by ``make(d)`` once: a ``.ready`` marker written last says it is whole; under ``cache_lock`` so
    concurrent test processes wait for one maker. Returns ``d``."""
    if (d / ".ready").is_file():
        return d
    with cache_lock(d):
        if not (d / ".ready").is_file():
            shutil.rmtree(d, ignore_errors=True)
            make(d)
            (d / ".ready").write_text("ok")
    return d


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:10]


def suite_venv() -> Path:
    """The venv's python. Created once (CPU torch + FlashInfer's light import deps + pyelftools)."""
    d = CACHE / f"venv-validate-{_key(TORCH_SPEC, VENV_DEPS, sys.version_info[:2])}"

    def make(d: Path) -> None:
        _run([sys.executable, "-m", "venv", d])
        _run([d / "bin" / "python", "-m", "pip", "install", "-q", TORCH_SPEC] + VENV_DEPS, timeout=1800)
    return made_once(d, make) / "bin" / "python"





def pip_target(spec: str, *, deps: bool = False) -> Path:
    """``pip install [--no-deps] --target <cache>/<spec>``; returns the folder."""
    d = CACHE / "targets" / (spec.replace("==", "-").replace("[", "_").replace("]", "").replace(",", "_") + ("" if not deps else "-deps"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", d]
    if not deps:
        cmd.append("--no-deps")
    return made_once(d, lambda d: _run(cmd + [spec], timeout=1800))


def pip_requirements(path: Path) -> Path:
    """``pip install --no-deps --target <cache>/<file>-<hash> -r path`` in one pip call (a pinned closure: every
    line ``name==version``); returns the folder."""
    text = Path(path).read_text()
    d = CACHE / "targets" / f"{Path(path).stem}-{_key(text)}"
    return made_once(d, lambda d: _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                         "--no-deps", "--target", d, "-r", path], timeout=1800))


def cuda_home() -> Path:
    """CUDA_HOME of the PyPI CUDA 13.1 toolkit (nvcc, cudart headers, CCCL, crt, nvvm)."""
    home = pip_target(CUDA_TOOLKIT_SPEC, deps=True) / "nvidia" / "cu13"
    lib64 = home / "lib64"
    if not lib64.exists():
        with contextlib.suppress(FileExistsError):   # another test process made it first
            lib64.symlink_to("lib")   # the wheels use lib/ where nvcc expects lib64/ (FACTS)
    return home


def cuobjdump() -> Path:
    """NVIDIA's cuobjdump from its PyPI wheel (13.2 on; not in the 13.1 set)."""
    d = CACHE / CUOBJDUMP_SPEC.replace("==", "-")
    exe = d / "bin" / "cuobjdump"
    if exe.is_file():
        return exe
    with cache_lock(d):
        if exe.is_file():
            return exe
        dl = CACHE / "dl"
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", dl, CUOBJDUMP_SPEC])
        whl = next(dl.glob(CUOBJDUMP_SPEC.replace("-", "_").split("==")[0] + "-*.whl"))
        with zipfile.ZipFile(whl) as z:
            member = next(n for n in z.namelist() if n.endswith("/bin/cuobjdump"))
            exe.parent.mkdir(parents=True, exist_ok=True)
            tmp = exe.with_suffix(".tmp")
            tmp.write_bytes(z.read(member))
            tmp.chmod(0o755)
            tmp.replace(exe)
    return exe


def clean_path(*first: Path) -> str:
    """PATH with ``first`` folders, then only the OS folders (no stray nvcc from the host)."""
    return os.pathsep.join([str(p) for p in first] + ["/usr/bin", "/bin"])


def suite_env(paths: list[Path], *, cuda: Path | None = None, extra: dict | None = None,
              path_first: list[Path] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FLASHINFER_", "NCCL_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SUITE)] + [str(p) for p in paths])
    env["PATH"] = clean_path(*(path_first or []))
    env["HOME"] = os.environ.get("HOME") or str(Path.home())   # the user's own home when HOME is unset (pwd entry)
    env["STACKPROBE_CACHE"] = str(CACHE / "stackprobe")
    if cuda is not None:
        env["CUDA_HOME"] = str(cuda)
    env.update(extra or {})
    return env


def run_suite(python: Path, paths: list[Path], args: list[str] = (), *, cuda: Path | None = None,
              extra_env: dict | None = None, path_first: list[Path] | None = None, check: bool = True):
    """Run ``python -m stackprobe --json - --quiet <args>``; returns (report dict, CompletedProcess)."""
    env = suite_env(paths, cuda=cuda, extra=extra_env, path_first=path_first)
    p = subprocess.run([str(python), "-m", "stackprobe", "--json", "-", "--quiet", *args], capture_output=True,
                       text=True, env=env, timeout=900)
    if check and p.returncode != 0:
        raise AssertionError(f"suite exit {p.returncode}: {p.stderr[-3000:]}")
    report = json.loads(p.stdout) if p.returncode == 0 else None
    return report, p


def verdict(report: dict, backend: str, scope: str | None = None) -> dict:
    """The first verdict for ``backend`` (of ``scope`` "library" / "engine" when given)."""
    return next(v for v in report["verdicts"] if v["backend"] == backend and (scope is None or v.get("scope") == scope))


def engine_copy(src: Path, dest: Path, edits: dict[str, tuple[str, str]]) -> Path:
    """A copy of an installed package folder (``src`` holds ``sglang/`` and its dist-info) where every file is a
    symlink to the original except those in ``edits`` (``{relative path: (old text, new text)}``), written edited.
    Raises AssertionError when an ``old text`` is not in its file (the edit would silently do nothing).
    Used for the future-release cases (a table that gains a key, a gate that moved)."""
    for p in sorted(Path(src).rglob("*")):
        rel = p.relative_to(src)
        if "__pycache__" in rel.parts or rel.name == ".ready":
            continue
        q = dest / rel
        if p.is_dir():
            q.mkdir(parents=True, exist_ok=True)
        elif rel.as_posix() not in edits:
            q.parent.mkdir(parents=True, exist_ok=True)
            q.symlink_to(p)
    for rel, (old, new) in edits.items():
        text = (Path(src) / rel).read_text()
        assert old in text, f"{rel} no longer contains {old!r}: the edited-copy case needs updating"
        (dest / rel).write_text(text.replace(old, new))
    return dest


def evidence(v: dict, what_startswith: str):
    for e in v["evidence"]:
        if e["what"].startswith(what_startswith):
            return e
    raise KeyError(f"{v['backend']} has no evidence {what_startswith!r}: {[e['what'] for e in v['evidence']]}")


def fake_nvcc(folder: Path, release: str, full: str) -> Path:
    """A stand-in ``nvcc`` answering ``--version`` like NVIDIA's for CUDA ``release`` (no real 12.x nvcc
    is on PyPI: nvidia-cuda-nvcc-cu12 ships only ptxas, FACTS)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvcc"
    exe.write_text("#!/bin/sh\n"
                   "echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                   f"echo 'Cuda compilation tools, release {release}, V{full}'\n"
                   f"echo 'Build cuda_{release}.r{release}/compiler.0_0'\n")
    exe.chmod(0o755)
    return exe


def build_fixture_wheel(out_dir: Path, name: str, libs: dict[str, list[str]], nvcc: Path) -> Path:
    """A wheel ``name-1.0`` whose package holds one shared object per ``libs`` entry, each compiled by
    the real ``nvcc`` with the given ``-gencode`` arguments. Returns the wheel path."""
    import base64

    build = out_dir / f"{name}-build"
    build.mkdir(parents=True, exist_ok=True)
    src = build / "k.cu"
    src.write_text("extern \"C\" __global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n"
                   "extern \"C\" int host_entry() { return 7; }\n")
    files: dict[str, bytes] = {f"{name}/__init__.py": b""}
    for lib, gencodes in libs.items():
        so = build / lib
        cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-cudart", "none", "-o", so, src]
        for g in gencodes:
            cmd += ["-gencode", g]
        _run(cmd, timeout=300)
        files[f"{name}/{lib}"] = so.read_bytes()
    dist = f"{name}-1.0.dist-info"
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: validate-tests\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    whl = out_dir / f"{name}-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return whl


def wheel_file(spec: str, platform: str = "manylinux_2_28_x86_64", python_version: str = "3.11") -> Path:
    """The wheel of ``spec`` ("torch==2.15.0") from PyPI, downloaded once into ``<cache>/dl`` (no install:
    big wheels are read member by member with :func:`wheel_members`)."""
    dl = CACHE / "dl"
    name, version = spec.split("==")
    stem = name.replace("-", "_")
    found = sorted(dl.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
          python_version, "--platform", platform, "--platform", "manylinux2014_x86_64", "-d", dl, spec], timeout=1800)
    return sorted(dl.glob(f"{stem}-{version}-*.whl"))[0]


def wheel_members(spec: str, prefix: str, suffix: str = "") -> dict[str, Path]:
    """Members of ``spec``'s wheel whose name starts with ``prefix`` (and contains ``suffix``), extracted
    once under ``<cache>/members/<wheel>/``: {member name: path}."""
    whl = wheel_file(spec)
    out_dir = CACHE / "members" / whl.stem
    out = {}
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if not info.filename.startswith(prefix) or suffix not in info.filename or info.is_dir():
                continue
            dest = out_dir / info.filename
            if not dest.is_file() or dest.stat().st_size != info.file_size:
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(dest.name + ".tmp")
                with z.open(info) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                tmp.replace(dest)
            out[info.filename] = dest
    return out


#: the CUDA wheels the 13.1 runtime lock once mixed in one site-packages root (case C25)
MIXED_CUDA_WHEELS = ["nvidia-cuda-nvcc==13.5.37", "nvidia-cuda-crt==13.5.37", "nvidia-nvvm==13.5.37",
                     "nvidia-cuda-cccl==13.3.5.0.6", "nvidia-cuda-runtime==13.0.96"]


def mixed_cuda_site() -> Path:
    """A ``--target`` folder holding :data:`MIXED_CUDA_WHEELS` (real PyPI wheels, no dependencies)."""
    d = CACHE / "targets" / ("c25-mixed-" + _key(MIXED_CUDA_WHEELS))
    if (d / ".ready").is_file():
        return d
    shutil.rmtree(d, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--target", d]
         + MIXED_CUDA_WHEELS, timeout=1800)
    (d / ".ready").write_text("ok")
    return d


def venv_without(dists: list[str]) -> Path:
    """A virtual environment holding everything :func:`suite_venv` holds except ``dists`` (their import
    packages and dist-info folders): each other entry of the suite venv's site-packages is linked into
    a folder its .pth file names. Returns its python."""
    base = suite_venv()
    d = CACHE / f"venv-without-{_key(str(base), sorted(dists))}"
    py = d / "bin" / "python"
    if (d / ".ready").is_file():
        return py
    shutil.rmtree(d, ignore_errors=True)
    _run([sys.executable, "-m", "venv", "--without-pip", d])
    site = next(base.parent.parent.glob("lib/python3*/site-packages"))
    own = next(d.glob("lib/python3*/site-packages"))
    farm = d / "linked-site"
    farm.mkdir()
    drop = set()
    for dist_info in site.glob("*.dist-info"):
        meta = (dist_info / "METADATA")
        name = next((ln.split(":", 1)[1].strip() for ln in meta.read_text(errors="replace").splitlines()
                     if ln.startswith("Name:")), "") if meta.is_file() else ""
        if name.lower().replace("_", "-") in {x.lower() for x in dists}:
            drop.add(dist_info.name)
            for line in (dist_info / "RECORD").read_text().splitlines():
                top = line.split(",")[0].split("/")[0]
                if top and not top.endswith(".dist-info") and top != "..":
                    drop.add(top)
    for entry in site.iterdir():
        if entry.name not in drop and entry.name != "__pycache__":
            (farm / entry.name).symlink_to(entry)
    (own / "linked-site.pth").write_text(str(farm) + "\n")
    (d / ".ready").write_text("ok")
    return py
