"""The CUDA driver: its version (NVML, else ``nvidia-smi``), the CUDA version it supports, the floor a
CUDA major needs, and which PTX ISA versions it can JIT (stdlib only).

Facts used here, each from NVIDIA's documentation:

* Minor version compatibility (CUDA Compatibility guide, "Minor Version Compatibility" table): an
  application built with any CUDA 12.x toolkit runs on a driver >= 525.60.13, any 13.x on a driver
  >= 580 (R580), 11.x on >= 450.80.02. Below the floor of its major, a CUDA runtime fails at its first
  call (``cudaErrorInsufficientDriver``), whatever the backend: every verdict is ``blocked (driver)``.
* PTX is not covered by minor version compatibility (same guide, "Limitations"): the driver JIT-compiles
  PTX only up to the PTX ISA of the CUDA version it supports; newer PTX fails with
  ``cudaErrorUnsupportedPtxVersion`` ("the provided PTX was compiled with an unsupported toolchain").
* PTX ISA version per CUDA release (PTX ISA reference, "Release Notes" / "PTX ISA Version" table):
  :data:`PTX_ISA_CUDA`; in the 13.x line PTX ISA 9.N comes with CUDA 13.N (measured here: nvcc 13.1
  writes PTX ISA 9.1, nvcc 13.5 writes 9.5).
* The driver each toolkit release ships with (CUDA Toolkit release notes, Table 3 "CUDA Toolkit and
  Corresponding Driver Versions", Linux x86_64, GA releases): :data:`TOOLKIT_DRIVER`.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from importlib import util
from pathlib import Path

from .archs import version_tuple

#: lowest driver each CUDA major runs on (minor version compatibility); CUDA Compatibility guide
MAJOR_DRIVER_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580"}

#: PTX ISA version -> the CUDA release that introduced it (PTX ISA reference, release notes table)
PTX_ISA_CUDA = {
    "7.0": "11.0", "7.1": "11.1", "7.2": "11.2", "7.3": "11.3", "7.4": "11.4", "7.5": "11.5", "7.6": "11.6",
    "7.7": "11.7", "7.8": "11.8", "8.0": "12.0", "8.1": "12.1", "8.2": "12.2", "8.3": "12.3", "8.4": "12.4",
    "8.5": "12.5", "8.6": "12.7", "8.7": "12.8", "8.8": "12.9", "9.0": "13.0", "9.1": "13.1",
}

#: toolkit release -> the Linux x86_64 driver its GA release requires (CUDA Toolkit release notes, Table 3)
TOOLKIT_DRIVER = {
    "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06", "12.4": "550.54.14",
    "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
    "13.1": "590.44.01",
}

NO_DRIVER = "no driver: static only"


def ptx_isa_cuda(isa: str) -> str | None:
    """The CUDA release that introduced PTX ISA ``isa`` ("9.1" -> "13.1"); 9.N -> 13.N beyond the table
    (the 13.x numbering); None when unknown."""
    if isa in PTX_ISA_CUDA:
        return PTX_ISA_CUDA[isa]
    v = version_tuple(isa)
    if len(v) >= 2 and v[0] == 9:
        return f"13.{v[1]}"
    return None


def ptx_requirement(isa: str) -> str:
    """One line naming what a driver needs to JIT PTX ISA ``isa``, e.g. ``"PTX ISA 9.1: a driver for
    CUDA >= 13.1 (>= 590.44.01)"``."""
    cuda = ptx_isa_cuda(isa)
    if cuda is None:
        return f"PTX ISA {isa}: unknown to this suite (newer than its table)"
    drv = TOOLKIT_DRIVER.get(cuda)
    return f"PTX ISA {isa}: a driver for CUDA >= {cuda}" + (f" (>= {drv})" if drv else "")


def _cuda_text(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"


def query_nvml() -> dict:
    """Driver version and supported CUDA version from NVML (``libnvidia-ml.so.1`` through ctypes:
    ``nvmlSystemGetDriverVersion``, ``nvmlSystemGetCudaDriverVersion_v2``, code 13000 -> "13.0").
    ``{}`` when NVML is absent or fails."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return {}
    try:
        if nvml.nvmlInit_v2() != 0:
            return {}
        buf = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buf, 96) != 0:
            return {}
        out = {"version": buf.value.decode(), "source": "NVML nvmlSystemGetDriverVersion"}
        code = ctypes.c_int()
        fn = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or nvml.nvmlSystemGetCudaDriverVersion
        if fn(ctypes.byref(code)) == 0 and code.value:
            out["cuda"] = _cuda_text(code.value)
        return out
    except (AttributeError, OSError):
        return {}
    finally:
        try:
            nvml.nvmlShutdown()
        except (AttributeError, OSError):
            pass


def parse_nvidia_smi(txt: str) -> dict:
    """``{"version", "cuda"}`` from ``nvidia-smi``'s banner ("Driver Version: 580.95.05  CUDA Version: 13.0")."""
    out = {}
    m = re.search(r"Driver Version:\s*([\d.]+)", txt)
    if m:
        out["version"] = m.group(1)
    m = re.search(r"CUDA Version:\s*([\d.]+)", txt)
    if m:
        out["cuda"] = m.group(1)
    return out


def query_nvidia_smi() -> dict:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        txt = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = parse_nvidia_smi(txt)
    if out:
        out["source"] = "nvidia-smi"
    return out


def driver_info() -> dict:
    """The host's driver: ``{"version": "580.95.05", "cuda": "13.0", "source": ...}``, or
    ``{"none": "no driver: static only"}`` when neither NVML nor nvidia-smi answers."""
    info = query_nvml() or query_nvidia_smi()
    return info if info.get("version") else {"none": NO_DRIVER}


def driver_floor(stack_cuda: str | None, driver: dict) -> dict | None:
    """The floor check: ``None`` when there is no driver (static only), no stack CUDA version, or the
    driver meets the floor of the stack's CUDA major; else ``{"needs", "have", "cuda", "lift", "cause"}``.

    ``stack_cuda``: the CUDA version the stack was built with (torch's ``torch.version.cuda``, "13.0").
    The floor is :data:`MAJOR_DRIVER_FLOOR` of its major; a driver whose supported CUDA major is lower
    fails too (the same condition seen from NVML's side)."""
    if not stack_cuda or not driver.get("version"):
        return None
    major = version_tuple(stack_cuda)[:1]
    if not major or major[0] not in MAJOR_DRIVER_FLOOR:
        return None
    floor = MAJOR_DRIVER_FLOOR[major[0]]
    have = driver["version"]
    low = version_tuple(have) < version_tuple(floor)
    if not low and driver.get("cuda"):
        low = version_tuple(driver["cuda"])[:1] < major
    if not low:
        return None
    branch = floor.split(".")[0]
    return {"needs": floor, "have": have, "cuda": stack_cuda, "lift": f"driver >= {branch}",
            "cause": (f"the stack is built for CUDA {stack_cuda}, which needs a driver >= {floor} (CUDA "
                      f"{major[0]}.x minor version compatibility), but this host's driver is {have}"
                      + (f" (supports CUDA {driver['cuda']})" if driver.get("cuda") else "")
                      + ": the CUDA runtime fails at its first call, whatever the backend")}


def ptx_too_new(coverage: list, driver: dict) -> list[dict]:
    """PTX-only files whose PTX ISA is newer than the driver can JIT (``cudaErrorUnsupportedPtxVersion``).
    ``coverage``: PackageCoverage objects or their JSON. Returns ``[{"package", "path", "ptx_isa",
    "needs_cuda", "driver_cuda"}]``; empty without a driver or its CUDA version."""
    have = driver.get("cuda")
    if not have:
        return []
    out = []
    for c in coverage:
        c = c if isinstance(c, dict) else c.to_json()
        for f in c.get("files", []):
            if f.get("level") != "ptx-only":
                continue
            for isa in f.get("ptx_isa") or []:
                need = ptx_isa_cuda(isa)
                if need and version_tuple(need) > version_tuple(have):
                    out.append({"package": c.get("package"), "path": f.get("path"), "ptx_isa": isa,
                                "needs_cuda": need, "driver_cuda": have})
    return out


def apply_driver_floor(verdicts: list, floor: dict | None) -> list:
    """Post-pass over the static (or runtime) verdicts: with a driver below the floor (:func:`driver_floor`
    not None) every verdict becomes ``blocked``, gate ``driver``, lift ``driver-upgrade`` with the detail
    ``"driver >= 580"``; the backend's own answer is kept as evidence. Returns the same list."""
    from .verdict import BLOCKED, GATE_DRIVER, LIFT_DRIVER

    if not floor:
        return verdicts
    for v in verdicts:
        v.add("verdict without the driver floor", f"{v.status} ({v.gate or '-'}): {v.cause}", "backend probe")
        v.add("CUDA driver", f"{floor['have']} (needs >= {floor['needs']} for CUDA {floor['cuda']})",
              "NVML / nvidia-smi")
        v.status, v.gate, v.cause = BLOCKED, GATE_DRIVER, floor["cause"]
        v.lift, v.lift_detail = LIFT_DRIVER, floor["lift"]
    return verdicts


def stack_cuda(environment: dict) -> tuple[str | None, str]:
    """torch's CUDA version and where it was read: ``torch.version.cuda`` from the environment report, else
    the installed ``torch/version.py`` read as text (a torch that does not import still names its CUDA)."""
    t = (environment or {}).get("torch") or {}
    if t.get("cuda"):
        return str(t["cuda"]), "torch.version.cuda"
    if "torch" in sys.modules and getattr(getattr(sys.modules["torch"], "version", None), "cuda", None):
        return str(sys.modules["torch"].version.cuda), "torch.version.cuda"
    try:
        spec = util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec else []
    for r in roots:
        p = Path(r) / "version.py"
        if p.is_file():
            m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([\d.]+)['\"]", p.read_text(errors="replace"), re.M)
            if m:
                return m.group(1), f"{p} (read as text)"
    return None, ""


def stack_cuda_version(environment: dict) -> tuple[str | None, str]:
    """(CUDA version the stack runs, where it was read): torch's ``torch.version.cuda`` (or, where ``import torch``
    fails, the ``cuda`` its installed ``torch/version.py`` names: a broken torch is still the stack), else the
    ``CUDART_VERSION`` of the toolkit root ``CUDA_HOME`` names, else of the first root that has one."""
    t, where = stack_cuda(environment)   # torch's own, also when `import torch` fails (its version.py as text)
    if t:
        return t, where
    roots = environment.get("toolkit_roots") or []
    for r in sorted(roots, key=lambda r: "CUDA_HOME" not in r.get("found_by", [])):
        if r.get("cudart"):
            return r["cudart"], f"CUDART_VERSION of {r['root']}/include/cuda_runtime_api.h"
    return None, ""


def apply_ptx_driver(verdicts: list, too_new: list[dict]) -> list:
    """Post-pass for case C27: a verdict whose evidence names a package with PTX-only code the driver cannot
    JIT (:func:`ptx_too_new`) is ``blocked (driver)`` when it was still open (gate passes or waiting for the
    runtime), with the class of error it would meet (``cudaErrorUnsupportedPtxVersion``) and the driver that
    lifts it; otherwise it gets a warning. Returns ``verdicts``."""
    from .verdict import BLOCKED, GATE_DRIVER, LIFT_DRIVER

    for v in verdicts:
        for p in too_new:
            pkg = p.get("package") or ""
            if not pkg or not any(pkg in e.what or pkg in e.source for e in v.evidence):
                continue
            msg = (f"{pkg}: {p['path']} is PTX-only with PTX ISA {p['ptx_isa']} (CUDA {p['needs_cuda']}); this driver "
                   f"JITs up to CUDA {p['driver_cuda']}: loading it fails with cudaErrorUnsupportedPtxVersion")
            if v.is_open:
                v.status, v.gate, v.cause, v.lift = BLOCKED, GATE_DRIVER, msg, LIFT_DRIVER
                v.lift_detail = ptx_requirement(p["ptx_isa"]).split(": ", 1)[1]
            else:
                v.warnings.append(msg)
    return verdicts
