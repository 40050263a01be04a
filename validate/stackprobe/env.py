"""Environment report: Python, torch (its CUDA version and arch list), every nvcc in reach and its
version, NCCL, versions of the backend libraries, GPUs and their link topology.

Mismatches are *findings* (case C5): an nvcc on PATH that is not CUDA_HOME's and has another version
(FlashInfer and torch extensions pick different compilers then: flashinfer issue 2577), or an nvcc
whose CUDA major differs from torch's.
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

from .archs import version_tuple
from .isolate import run_task

# distributions reported when installed (PyPI names)
BACKEND_DISTS = (
    "torch", "triton", "flash-attn", "flash_attn_3", "sglang", "sglang-kernel", "sgl-kernel",
    "flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin", "mscclpp", "b12x",
    "nvidia-nccl-cu12", "nvidia-nccl-cu13", "deep-ep", "cuda-toolkit", "nvidia-cuda-nvcc",
    "nvidia-cuda-nvcc-cu12", "pyelftools",
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
    """CUDA toolkits installed from PyPI wheels (``site-packages/nvidia/cu13`` and the like, CUDA 13
    layout; CUDA 12 wheels carry no nvcc: FACTS, measured with nvidia-cuda-nvcc-cu12 12.8.93)."""
    roots = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if not base.is_dir():
            continue
        for sub in sorted(base.glob("cu*")):
            if (sub / "bin" / "nvcc").is_file():
                roots.append(str(sub))
    return roots


def find_nvccs() -> dict:
    """Every nvcc in reach: ``path`` (first on PATH), ``cuda_home`` (CUDA_HOME/CUDA_PATH, else
    /usr/local/cuda), ``pip`` (PyPI toolkit roots). Each value: :func:`nvcc_version` or None."""
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


def collect(timeout: float = 180.0) -> dict:
    """The environment report (plain JSON data). torch is inspected in a child interpreter so a
    broken CUDA install cannot take the suite down."""
    t = run_task("torch_info", timeout=timeout)
    torch = t.value if t.ok else {"import_error": t.error}
    nvccs = find_nvccs()
    packages = {d: v for d in BACKEND_DISTS if (v := dist_version(d))}
    nccl = {"torch": torch.get("nccl"), "wheel": packages.get("nvidia-nccl-cu13") or packages.get("nvidia-nccl-cu12")}
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
        "findings": nvcc_findings(nvccs, torch.get("cuda")),
    }


def effective_nvcc(env: dict) -> dict | None:
    """The nvcc a JIT build would use: CUDA_HOME's, else PATH's, else a PyPI toolkit's."""
    n = env.get("nvcc", {})
    return n.get("cuda_home_nvcc") or n.get("path") or (n.get("pip") or [None])[0]
