"""MSCCL++, FlashInfer PCIe IPC allreduce and b12x: installed or not, and their gates where readable.

* FlashInfer PCIe IPC allreduce: ``flashinfer.comm.PcieIpcAllReduceWorkspace`` (present in 0.7.4, FACTS)
  and its JIT module ``gen_pcie_ipc_comm_module``'s arch list (none: plain loads/stores and CUDA IPC);
  built for hosts where every peer transfer crosses the CPU root complex. Needs nvcc for its JIT.
* b12x: a top-level ``b12x`` package (FlashInfer 0.7.4 ships one that aliases
  ``flashinfer.experimental.b12x``); imported in a child interpreter, so an import failure is a verdict.
* MSCCL++: SGLang's ``PyMscclppCommunicator`` (its supported world sizes, read with ``ast``) over the
  MSCCL++ ops in sgl-kernel's common_ops, or a standalone ``mscclpp`` distribution; its one-shot LL
  kernel writes to all peers and NVLS algorithms need multicast (FACTS): whether anything works on SM120
  over PCIe is for the runtime tier.
"""
from __future__ import annotations

from pathlib import Path

from .. import source
from ..coverage import SASS_LEVELS
from ..env import dist_version, effective_nvcc
from ..isolate import run_task
from ..verdict import (BLOCKED, ERROR, GATE_BINARY, GATE_NEEDS_RUNTIME, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON,
                       GATE_TOOLCHAIN, LIFT_CUDA, LIFT_NONE_NEEDED, LIFT_PACKAGE, LIFT_REBUILD, LIFT_UNKNOWN, SKIPPED,
                       Verdict)
from . import flashinfer_common as fi

BACKENDS = ("flashinfer-pcie-ipc-allreduce", "b12x", "mscclpp")


def _pcie_ipc(ctx) -> Verdict:
    v = Verdict("flashinfer-pcie-ipc-allreduce", GATE_PASSES, lift=LIFT_NONE_NEEDED)
    fv = fi.version()
    if fv is None:
        v.status, v.gate, v.cause, v.lift = SKIPPED, GATE_NOT_INSTALLED, "flashinfer-python is not installed", LIFT_PACKAGE
        return v
    v.add("flashinfer-python version", fv, "distribution metadata")
    exported = None
    try:
        exported = "PcieIpcAllReduceWorkspace" in source.defined_names(source.module_file("flashinfer.comm"))
    except (source.SourceNotFound, SyntaxError) as e:
        v.add("flashinfer.comm", None, f"unreadable: {e}")
    v.add("flashinfer.comm.PcieIpcAllReduceWorkspace", exported, "flashinfer/comm/__init__.py (ast)")
    if not exported:
        v.status, v.gate, v.lift = SKIPPED, GATE_NOT_INSTALLED, LIFT_PACKAGE
        v.cause = f"FlashInfer {fv} has no PCIe IPC allreduce (flashinfer.comm.PcieIpcAllReduceWorkspace)"
        v.lift_detail = "a flashinfer-python release with flashinfer.comm.PcieIpcAllReduceWorkspace (0.7.4 has it)"
        return v
    try:
        ws_path = next(iter(source.find_files_containing(source.module_file("flashinfer.comm").parent,
                                                         "class PcieIpcAllReduceWorkspace")), None)
        if ws_path is not None:
            sizes, line = source.module_assignment(ws_path, "_SUPPORTED_WORLD_SIZES")
            v.add("PcieIpcAllReduceWorkspace supported world sizes", sorted(sizes), f"flashinfer/comm/{ws_path.name}:{line} (ast)")
            if ctx.world_size not in sizes:
                v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
                v.cause = f"PcieIpcAllReduceWorkspace supports world sizes {sorted(sizes)}, not {ctx.world_size}"
                return v
    except (source.SourceNotFound, ValueError, SyntaxError, TypeError) as e:
        v.add("PcieIpcAllReduceWorkspace supported world sizes", None, f"unreadable: {e}")
    try:
        majors, where = fi.module_majors("gen_pcie_ipc_comm_module")
        v.add("gen_pcie_ipc_comm_module supported majors", majors if majors is not None else "unrestricted", where)
        if majors is not None and ctx.target.major not in majors:
            v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
            v.cause = f"gen_pcie_ipc_comm_module admits majors {majors} only"
            return v
    except source.SourceNotFound as e:
        v.add("gen_pcie_ipc_comm_module", None, str(e))
    if not effective_nvcc(ctx.env):
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_CUDA
        v.cause = "its kernels are JIT-compiled and this environment has no nvcc"
        v.lift_detail = "a CUDA toolkit with nvcc >= 12.8 in the image"
        return v
    v.cause = "present, no arch restriction, nvcc available: a PCIe-native candidate for the runtime tier"
    return v


def _b12x_gating(ctx, roots) -> dict:
    """b12x's own capability gate (``is_b12x`` and ``has_cutlass_dsl`` in its vendored gating module,
    stdlib-only at import): its source is run in a fresh namespace with ``get_compute_capability``
    answering the target (no GPU here), then its functions are called."""
    for root in roots:
        for p in source.find_files_containing(root, "def is_b12x"):
            ns: dict = {"__name__": "b12x_gating_probe"}
            try:
                exec(compile(p.read_text(), str(p), "exec"), ns)  # noqa: S102 - the installed package's own module
            except Exception as e:  # noqa: BLE001
                return {"file": str(p), "error": f"{type(e).__name__}: {e}"}
            ns["get_compute_capability"] = lambda device=None: (ctx.target.major, ctx.target.minor)
            out = {"file": str(p), "is_b12x": bool(ns["is_b12x"]())}
            if "has_cutlass_dsl" in ns:
                out["min_cutlass_dsl"] = ns.get("MIN_CUTLASS_DSL")
                out["cutlass_dsl"] = ns["cutlass_dsl_version"]() if "cutlass_dsl_version" in ns else None
                out["has_cutlass_dsl"] = bool(ns["has_cutlass_dsl"]())
            return out
    return {}


def _b12x(ctx) -> Verdict:
    v = Verdict("b12x", GATE_PASSES, lift=LIFT_NONE_NEEDED)
    root = source.package_dir("b12x")
    dv = dist_version("b12x")
    if root is None:
        v.status, v.gate, v.cause, v.lift = SKIPPED, GATE_NOT_INSTALLED, "b12x is not installed", LIFT_PACKAGE
        v.lift_detail = "flashinfer-python[b12x] (0.7.4 ships the b12x package) or the b12x distribution"
        return v
    provider = f"b12x {dv}" if dv else f"a b12x package shipped by flashinfer-python {fi.version()}" if fi.version() else "unknown distribution"
    v.add("b12x package", str(root.name), provider)
    roots = [root]
    fdir = source.package_dir("flashinfer")
    if fdir is not None and (fdir / "experimental" / "b12x").is_dir():
        roots.append(fdir / "experimental" / "b12x")   # where FlashInfer's b12x alias package points
    gate = _b12x_gating(ctx, roots)
    if gate:
        parts = Path(gate["file"]).parts
        rel = "/".join(parts[parts.index("b12x") - (2 if "experimental" in parts else 0):]) if "b12x" in parts else gate["file"]
        v.add(f"is_b12x() for {ctx.target.cc}", gate.get("is_b12x", gate.get("error")), f"{rel} (its own code, capability answered)")
        if "has_cutlass_dsl" in gate:
            v.add("nvidia-cutlass-dsl (b12x's JIT compiler)", {"installed": gate["cutlass_dsl"], "minimum": gate["min_cutlass_dsl"]}, rel)
        if gate.get("is_b12x") is False:
            v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_UNKNOWN
            v.cause = f"b12x's own gate is_b12x() refuses compute capability {ctx.target.cc} (it targets SM120/SM121)"
            return v
        if gate.get("has_cutlass_dsl") is False:
            v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_PACKAGE
            v.cause = (f"b12x needs nvidia-cutlass-dsl >= {gate['min_cutlass_dsl']} (its kernels are CuTe DSL, JIT-compiled); "
                       f"installed: {gate['cutlass_dsl'] or 'none'}")
            v.lift_detail = f"pip install 'nvidia-cutlass-dsl>={gate['min_cutlass_dsl']}' (flashinfer-python[b12x])"
            return v
    else:
        v.add("b12x gating module", None, "no `def is_b12x` found in the installed source")
    o = run_task("import_module", {"module": "b12x"}, timeout=ctx.timeout)
    res = o.value if o.ok else {"imported": False, "error": o.error}
    v.add("import b12x", "ok" if res.get("imported") else res.get("error"), "child interpreter")
    if not res.get("imported"):
        v.status, v.cause, v.lift = ERROR, f"import b12x failed: {res.get('error')}", LIFT_PACKAGE
        v.lift_detail = "install its dependencies (flashinfer-python[b12x]: nvidia-cutlass-dsl, torch>=2.12)"
        return v
    v.status, v.gate, v.lift = GATE_PASSES, "", LIFT_NONE_NEEDED
    v.cause = "b12x admits the target and imports; a PCIe-native design whose speed only the runtime tier can tell"
    return v


MSCCLPP_MODULE = "sglang.srt.distributed.device_communicators.pymscclpp"


def _mscclpp(ctx) -> Verdict:
    """MSCCL++ as SGLang uses it: ``PyMscclppCommunicator`` (sglang/.../pymscclpp.py) over the MSCCL++
    kernels compiled into sgl-kernel's common_ops (or a standalone ``mscclpp`` distribution)."""
    from .sglang_custom_ar import kernel_coverage, short

    v = Verdict("mscclpp", SKIPPED, gate=GATE_NOT_INSTALLED, lift=LIFT_PACKAGE, cause="mscclpp is not installed")
    dv = dist_version("mscclpp")
    sizes, where = None, ""
    try:
        path = source.module_file(MSCCLPP_MODULE)
        try:
            sizes, line = source.module_assignment(path, "_SUPPORTED_WORLD_SIZES")
        except source.SourceNotFound:
            sizes, line = source.class_attribute(path, "PyMscclppCommunicator", "_SUPPORTED_WORLD_SIZES")
        where = f"{short(path)}:{line} (ast)"
    except (source.SourceNotFound, ValueError, SyntaxError):
        path = None
    dist, cov, ops = kernel_coverage(ctx)
    bundled = [f for c in ctx.coverage.values() for f in c.files if "mscclpp" in f.path]
    if dv is None and path is None and not bundled:
        return v
    if dv:
        v.add("mscclpp version", dv, "distribution metadata")
        o = run_task("import_module", {"module": "mscclpp"}, timeout=ctx.timeout)
        res = o.value if o.ok else {"imported": False, "error": o.error}
        v.add("import mscclpp", "ok" if res.get("imported") else res.get("error"), "child interpreter")
    if path is not None:
        v.add("SGLang PyMscclppCommunicator supported world sizes", sorted(sizes) if sizes else sizes, where)
    if bundled:
        v.add("MSCCL++ libraries bundled in installed wheels", [(f.path, f.level) for f in bundled], "static coverage (fatbin)")
        weak = [f.path for f in bundled if f.level in ("ptx-only", "none")]
        if weak:
            v.warnings.append(f"bundled MSCCL++ libraries without SASS for {ctx.target.cc} (PTX JIT at load or no "
                              f"kernel image): {weak}")
    if ops:
        v.add(f"{dist} common_ops (SGLang's mscclpp ops) coverage", [(f.path, f.level) for f in ops], "static coverage (fatbin)")
    if sizes is not None and ctx.world_size not in sizes:
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = f"SGLang's PyMscclppCommunicator supports world sizes {sorted(sizes)}, not {ctx.world_size}"
        return v
    if path is not None and ops and not any(f.level in SASS_LEVELS for f in ops):
        v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_REBUILD
        v.cause = f"{dist}'s common_ops (which holds SGLang's mscclpp ops) has no SASS for {ctx.target.cc}"
        return v
    if path is None:   # a standalone mscclpp with no SGLang integration to read gates from
        v.status, v.gate, v.lift = SKIPPED, GATE_NEEDS_RUNTIME, LIFT_UNKNOWN
    else:
        v.status, v.gate, v.lift = GATE_PASSES, "", LIFT_NONE_NEEDED
    v.cause = ("SGLang admits the world size and the kernels carry the target; but its single-node one-shot LL kernel "
               f"writes to all peers and NVLS algorithms need multicast: on {ctx.topology} at world size "
               f"{ctx.world_size} only the runtime tier can tell" if path is not None else
               "installed without SGLang's integration; whether it works on the target is for the runtime tier")
    return v


def probe(ctx) -> list[Verdict]:
    return [_pcie_ipc(ctx), _b12x(ctx), _mscclpp(ctx)]
