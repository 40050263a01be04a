"""Environment report: Python, torch (its CUDA version and arch list), every nvcc in reach and its
version, NCCL, versions of the backend libraries, GPUs and their link topology.

Mismatches are *findings* (case C5): an nvcc on PATH that is not CUDA_HOME's and has another version
(FlashInfer and torch extensions pick different compilers then: flashinfer issue 2577), or an nvcc
whose CUDA major differs from torch's.

Toolkit coherence (case C25): every toolkit root in reach (PATH's, ``CUDA_HOME``'s, ``/usr/local/cuda``,
each ``site-packages/nvidia/cu*`` of the PyPI wheels, torch's) reports its nvcc release and the
``CUDART_VERSION`` of its ``include/cuda_runtime_api.h`` (13000 -> 13.0; NVIDIA's header defines it), and
for a wheel root the nvidia-cuda-* wheels that put files there. nvcc and the headers of one root differing
in major.minor is an error: CCCL refuses to compile ("CUDA compiler and CUDA toolkit headers are
incompatible", its ``cuda/std/__cccl/cuda_toolkit.h`` check), and the CUDA runtime's headers describe
another runtime than the one nvcc targets.

The driver line (:mod:`stackprobe.driver`): driver version and the CUDA version it supports, or
"no driver: static only".
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from .archs import cuda_wheel_release, version_tuple
from .driver import driver_info
from .isolate import run_task

# distributions reported when installed (PyPI names)
BACKEND_DISTS = (
    "torch", "triton", "flash-attn", "flash_attn_3", "sglang", "sglang-kernel", "sgl-kernel",
    "flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin", "mscclpp", "b12x",
    "nvidia-nccl-cu12", "nvidia-nccl-cu13", "deep-ep", "cuda-toolkit", "nvidia-cuda-nvcc",
    "nvidia-cuda-nvcc-cu12", "pyelftools",
    # NVIDIA's Python driver/runtime bindings (FlashInfer's comm/mnnvl.py imports cuda.bindings.driver): their
    # major carries its own driver floor (stackprobe.driver.BINDINGS_DRIVER_FLOOR, case C56)
    "cuda-bindings", "cuda-python",
)
ENV_VARS = ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST", "NCCL_ALGO",
            "NCCL_PROTO", "NCCL_P2P_DISABLE", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "PATH")

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+), V([\d.]+)")


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name`` or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nvcc_version(path: str) -> dict:
    """Run ``<path> --version``; returns {"path", "realpath", "release" ("12.8"), "version"
    ("12.8.93")} or {"path", "error"}."""
    info = {"path": path, "realpath": os.path.realpath(path)}
    try:
        txt = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        info["error"] = f"{type(e).__name__}: {e}"
        return info
    m = _NVCC_RELEASE.search(txt)
    if not m:
        info["error"] = f"unparsable --version output: {txt.strip()[:200]!r}"
    else:
        info["release"], info["version"] = m.group(1), m.group(2)
    return info


def pip_toolkit_roots() -> list[str]:
    """CUDA toolkits installed from PyPI wheels: ``site-packages/nvidia/cu13`` and the like (CUDA 13 layout) and
    ``site-packages/nvidia/cuda_nvcc`` (the older per-component layout), each only when its ``bin/nvcc`` exists
    (CUDA 12 wheels carry no nvcc: FACTS, measured with nvidia-cuda-nvcc-cu12 12.8.93)."""
    roots = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if not base.is_dir():
            continue
        for sub in sorted(base.glob("cu*")):
            if (sub / "bin" / "nvcc").is_file() and str(sub) not in roots:
                roots.append(str(sub))
    return roots


def all_nvccs(env: dict) -> list[dict]:
    """Every nvcc :func:`find_nvccs` saw (``env["nvcc"]``): CUDA_HOME's, each on PATH, each PyPI toolkit's, one
    entry per real file, each {"path", "found_by", "release"}. A "no nvcc" claim must rest on this list being empty."""
    n = env.get("nvcc", {}) or {}
    out: dict = {}
    cands = [("CUDA_HOME" if n.get("cuda_home_source") != "default /usr/local/cuda" else "/usr/local/cuda",
              n.get("cuda_home_nvcc"))]
    cands += [("PATH", i) for i in (n.get("on_path") or ([n["path"]] if n.get("path") else []))]
    cands += [("PyPI toolkit", i) for i in n.get("pip") or []]
    for label, info in cands:
        if not info or not info.get("path"):
            continue
        key = info.get("realpath") or info["path"]
        if key in out:
            out[key]["found_by"].append(label)
        else:
            out[key] = {"path": info["path"], "found_by": [label], "release": info.get("release")}
    return list(out.values())


def find_nvccs() -> dict:
    """Every nvcc in reach: ``path`` (first on PATH), ``on_path`` (every one on PATH, list), ``cuda_home``
    (CUDA_HOME/CUDA_PATH, else /usr/local/cuda), ``pip`` (PyPI toolkit roots: ``nvidia/cu*``, ``nvidia/cuda_nvcc``
    under each sys.path entry). Each value: :func:`nvcc_version` or None."""
    out: dict = {}
    on_path = shutil.which("nvcc")
    out["path"] = nvcc_version(on_path) if on_path else None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    out["cuda_home_source"] = "CUDA_HOME" if os.environ.get("CUDA_HOME") else ("CUDA_PATH" if home else "default /usr/local/cuda")
    home = home or "/usr/local/cuda"
    out["cuda_home"] = home
    cand = Path(home) / "bin" / "nvcc"
    out["cuda_home_nvcc"] = nvcc_version(str(cand)) if cand.is_file() else None
    out["pip"] = [nvcc_version(str(Path(r) / "bin" / "nvcc")) for r in pip_toolkit_roots()]
    seen, out["on_path"] = set(), []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cand = Path(d or ".") / "nvcc"
        if d and cand.is_file() and os.access(cand, os.X_OK) and os.path.realpath(cand) not in seen:
            seen.add(os.path.realpath(cand))
            out["on_path"].append(nvcc_version(str(cand)))
    return out


def nvcc_findings(nvccs: dict, torch_cuda: str | None) -> list[dict]:
    """Case C5: the nvcc on PATH, CUDA_HOME's nvcc and torch's CUDA version must agree.

    Returns findings ``{"case", "level" ("error"|"warning"|"info"), "message"}``.
    """
    found = []
    p, h = nvccs.get("path"), nvccs.get("cuda_home_nvcc")
    if p and h and p.get("realpath") != h.get("realpath") and p.get("release") != h.get("release"):
        found.append({"case": "C5", "level": "error", "message":
                      f"nvcc on PATH ({p['path']}, CUDA {p.get('release', '?')}) is not CUDA_HOME's nvcc "
                      f"({h['path']}, CUDA {h.get('release', '?')}): tools that search PATH (FlashInfer's JIT "
                      f"falls back to `which nvcc`, build scripts) and tools that use CUDA_HOME compile with "
                      f"different toolkits. Put {Path(h['path']).parent} first on PATH or fix CUDA_HOME."})
    elif p and not h and nvccs.get("cuda_home_source") != "default /usr/local/cuda":
        found.append({"case": "C5", "level": "warning", "message":
                      f"{nvccs['cuda_home_source']}={nvccs['cuda_home']} holds no bin/nvcc, but PATH has "
                      f"{p['path']} (CUDA {p.get('release', '?')})."})
    if torch_cuda:
        for label, info in (("PATH", p), ("CUDA_HOME", h)):
            if not info or "release" not in info:
                continue
            tv, nv = version_tuple(torch_cuda), version_tuple(info["release"])
            if tv[:1] != nv[:1]:
                found.append({"case": "C5", "level": "error", "message":
                              f"nvcc on {label} is CUDA {info['release']} but torch was built with CUDA {torch_cuda}: "
                              f"extensions compiled with it will not load with this torch (CUDA major differs)."})
            elif tv[:2] != nv[:2]:
                # same major works by minor-version compatibility; the f-suffix boundary (12.9) matters
                crosses = (min(tv[:2], nv[:2]) < (12, 9) <= max(tv[:2], nv[:2]))
                found.append({"case": "C5", "level": "warning" if crosses else "info", "message":
                              f"nvcc on {label} is CUDA {info['release']}, torch was built with CUDA {torch_cuda}: "
                              "same major, so extensions load by minor-version compatibility"
                              + ("; but only one of them knows family targets (sm_120f needs >= 12.9)." if crosses else ".")})
    if not p and not h and not nvccs.get("pip"):
        found.append({"case": "", "level": "info", "message":
                      "no nvcc in this environment: JIT backends (FlashInfer) cannot compile kernels here; "
                      "only prebuilt binaries (wheels, flashinfer-jit-cache/cubin) can serve the target."})
    return found


_CUDART_VERSION = re.compile(r"^\s*#\s*define\s+CUDART_VERSION\s+(\d+)", re.M)
#: PyPI wheels whose version names the CUDA release of the component they carry (13.0.88 -> 13.0;
#: nvidia-cuda-cccl 13.3.5.0.6 -> 13.5: :func:`stackprobe.archs.cuda_wheel_release`)
TOOLKIT_WHEEL_PREFIXES = ("nvidia-cuda-", "nvidia-nvvm")


def cudart_version(root: str | Path) -> str | None:
    """``CUDART_VERSION`` of ``<root>/include/cuda_runtime_api.h`` as "major.minor" (13000 -> "13.0"),
    or None without the header."""
    header = Path(root) / "include" / "cuda_runtime_api.h"
    try:
        m = _CUDART_VERSION.search(header.read_text(errors="replace"))
    except OSError:
        return None
    if not m:
        return None
    code = int(m.group(1))
    return f"{code // 1000}.{code % 1000 // 10}"


def root_wheels(root: str | Path) -> dict[str, str]:
    """{distribution: version} of the installed nvidia-cuda-* / nvidia-nvvm wheels with files under ``root``
    (a ``site-packages/nvidia/cu13`` folder); empty for a root no wheel owns."""
    root = Path(os.path.realpath(root))
    out = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if not name.startswith(TOOLKIT_WHEEL_PREFIXES):
            continue
        for f in dist.files or []:
            try:
                loc = Path(os.path.realpath(f.locate()))
            except (OSError, ValueError):
                continue
            if root == loc or root in loc.parents:
                out[name] = dist.version
                break
    return dict(sorted(out.items()))


def toolkit_roots(torch_cuda_home: str | None = None) -> list[dict]:
    """Every CUDA toolkit root in reach, once each (by real path): ``[{"root", "found_by": ["PATH",
    "CUDA_HOME", "torch", "site-packages", "/usr/local/cuda"], "nvcc": release | None, "nvcc_version",
    "cudart": CUDART_VERSION as "13.0" | None, "wheels": {dist: version}, "coherent": bool | None,
    "problem": str}]``. ``coherent`` is None when the root lacks nvcc or the header (nothing to compare).
    ``torch_cuda_home``: torch's ``torch.utils.cpp_extension.CUDA_HOME`` when known."""
    cands: list[tuple[str, str]] = []
    on_path = shutil.which("nvcc")
    if on_path:
        cands.append(("PATH", str(Path(on_path).resolve().parent.parent)))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append((var, os.environ[var]))
    if torch_cuda_home:
        cands.append(("torch", torch_cuda_home))
    cands.append(("/usr/local/cuda", "/usr/local/cuda"))
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            for sub in sorted(base.glob("cu[0-9]*")):
                cands.append(("site-packages", str(sub)))
    roots: dict[str, dict] = {}
    for label, root in cands:
        if not Path(root).is_dir():
            continue
        real = os.path.realpath(root)
        if real in roots:
            if label not in roots[real]["found_by"]:
                roots[real]["found_by"].append(label)
            continue
        nvcc = Path(root) / "bin" / "nvcc"
        info = nvcc_version(str(nvcc)) if nvcc.is_file() else {}
        r = {"root": root, "found_by": [label], "nvcc": info.get("release"), "nvcc_version": info.get("version"),
             "cudart": cudart_version(root), "wheels": root_wheels(root) if label == "site-packages" else {}}
        r["coherent"], r["problem"] = root_coherence(r)
        roots[real] = r
    return list(roots.values())


def _mm(version: str | None) -> tuple:
    return version_tuple(version or "")[:2]


def root_coherence(root: dict) -> tuple[bool | None, str]:
    """(coherent, problem) of one :func:`toolkit_roots` entry: nvcc's release and ``CUDART_VERSION`` must
    agree in major.minor, and so must the compiler-side wheels (nvcc, crt, nvvm, cccl, runtime) of a wheel
    root. None when there is nothing to compare."""
    problems = []
    if root.get("nvcc") and root.get("cudart") and _mm(root["nvcc"]) != _mm(root["cudart"]):
        problems.append(f"nvcc is CUDA {root['nvcc']} but include/cuda_runtime_api.h has CUDART_VERSION "
                        f"{root['cudart']}")
    compile_side = {d: v for d, v in (root.get("wheels") or {}).items()
                    if d in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl",
                             "nvidia-cuda-runtime")}
    if root.get("nvcc") and len({cuda_wheel_release(d, v) for d, v in compile_side.items()}) > 1:
        problems.append("its wheels mix CUDA releases: " + ", ".join(f"{d} {v}" for d, v in compile_side.items()))
    if problems:
        return False, "; ".join(problems)
    if not (root.get("nvcc") and root.get("cudart")):
        return None, ""
    return True, ""


def toolkit_findings(roots: list[dict]) -> list[dict]:
    """Case C25: one error finding per incoherent toolkit root, naming what to change."""
    out = []
    for r in roots:
        if r.get("coherent") is False:
            out.append({"case": "C25", "level": "error", "message":
                        f"toolkit root {r['root']} (found by {', '.join(r['found_by'])}) is incoherent: {r['problem']}. "
                        "Compiling any source that includes CCCL (thrust, cub, cuda/std) with this root fails "
                        "(\"CUDA compiler and CUDA toolkit headers are incompatible\"); install the nvidia-cuda-* "
                        "wheels of one CUDA release (e.g. cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==<release>), or point "
                        "CUDA_HOME and PATH at a coherent toolkit."})
    return out


def parse_topology(txt: str) -> dict:
    """Parse ``nvidia-smi topo -m`` text: ``{"matrix", "pairs", "nvlink_pairs", "full_nvlink"}``.
    A GPU pair is NVLink when its cell reads ``NV#`` (a bonded set of # NVLinks, nvidia-smi's legend);
    PIX/PXB/PHB/NODE/SYS cross PCIe."""
    txt = re.sub(r"\x1b\[[0-9;]*m", "", txt)   # nvidia-smi underlines the header with ANSI escapes
    rows = [ln.split() for ln in txt.splitlines() if re.match(r"^\s*GPU\d+\s", ln)]
    rows = [r for r in rows if "X" in r]        # the matrix rows (the header row lists GPU names only)
    pairs, nv = 0, 0
    for r in rows:
        for cell in r[1:1 + len(rows)]:
            if cell == "X":
                continue
            pairs += 1
            nv += cell.startswith("NV")
    return {"matrix": txt.strip(), "pairs": pairs, "nvlink_pairs": nv, "full_nvlink": bool(pairs) and nv == pairs}


def topology() -> dict:
    """GPU link matrix from ``nvidia-smi topo -m`` when available (:func:`parse_topology`); ``{}``
    without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        txt = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    return parse_topology(txt)


def libnccl_version() -> dict:
    """NCCL version from a ``libnccl.so.2`` the dynamic loader finds (``ncclGetVersion``; code
    major*10000 + minor*100 + patch since NCCL 2.9, NCCL's nccl.h). ``{}`` when there is none."""
    import ctypes
    import ctypes.util

    names = [n for n in (ctypes.util.find_library("nccl"), "libnccl.so.2") if n]
    for entry in sys.path:   # the nvidia-nccl-cu12/cu13 wheels' lib folders
        names += [str(p) for p in Path(entry).glob("nvidia/nccl/lib/libnccl.so*")]
        names += [str(p) for p in Path(entry).glob("nvidia/cu*/lib/libnccl.so*")]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            code = ctypes.c_int()
            if lib.ncclGetVersion(ctypes.byref(code)) == 0:
                c = code.value
                ver = f"{c // 10000}.{c % 10000 // 100}.{c % 100}" if c >= 20900 else f"{c // 1000}.{c % 1000 // 100}.{c % 100}"
                return {"version": ver, "library": name}
        except (OSError, AttributeError):
            continue
    return {}


def nccl_text(env: dict) -> str:
    """The NCCL the report names: the library that loads (the health stage's ``nccl.loaded``, read from the file
    ``import torch`` mapped, else torch's own answer), beside the wheel's metadata where the two differ
    ("2.26.2 loaded (wheel metadata nvidia-nccl-cu13 2.30.7)", case C55); the wheel's alone when nothing loaded."""
    n = env.get("nccl") or {}
    loaded = n.get("loaded") or n.get("torch")
    wheel = n.get("wheel")
    if loaded and wheel and str(loaded).split("+")[0] != str(wheel).split("+")[0]:
        return f"{loaded} loaded (wheel metadata {n.get('wheel_dist') or 'nvidia-nccl'} {wheel})"
    return str(loaded or wheel or n.get("library") or "-")


def collect(timeout: float = 180.0) -> dict:
    """The environment report (plain JSON data). torch is inspected in a child interpreter so a
    broken CUDA install cannot take the suite down."""
    t = run_task("torch_info", timeout=timeout)
    torch = t.value if t.ok else {"import_error": t.error}
    nvccs = find_nvccs()
    roots = toolkit_roots(torch.get("cuda_home"))
    driver = driver_info()
    packages = {d: v for d in BACKEND_DISTS if (v := dist_version(d))}
    wheel_dist = next((d for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12") if packages.get(d)), None)
    nccl = {"torch": torch.get("nccl"), "wheel": packages.get(wheel_dist) if wheel_dist else None, "wheel_dist": wheel_dist}
    if not nccl["torch"]:
        lib = libnccl_version()
        nccl["library"] = lib.get("version")
        nccl["library_path"] = lib.get("library")
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()},
        "torch": torch,
        "nvcc": nvccs,
        "nccl": nccl,
        "packages": packages,
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "gpus": torch.get("gpus", []),
        "p2p": torch.get("p2p", {}),
        "topology": topology(),
        "driver": driver,
        "toolkit_roots": roots,
        "findings": nvcc_findings(nvccs, torch.get("cuda")) + toolkit_findings(roots),
    }


def effective_nvcc(env: dict) -> dict | None:
    """The nvcc a JIT build would use: CUDA_HOME's, else PATH's, else a PyPI toolkit's."""
    n = env.get("nvcc", {})
    return n.get("cuda_home_nvcc") or n.get("path") or (n.get("pip") or [None])[0]
