"""FlashInfer allreduce fusion (``gen_trtllm_comm_module``): cases C4 and C9.

Gates, in order (FACTS, "The dead-end backends"):

1. the module's JIT arch list: ``supported_major_versions`` inside ``flashinfer.jit.comm.
   gen_trtllm_comm_module`` of the installed package ([9, 10] through 0.6.16, [9, 10, 12] from 0.6.17,
   upstream PR 3903): a Python list, lifted by a package upgrade, not by CUDA (C9);
2. FlashInfer's arch normalisation for the target on this nvcc (``CompilationContext.
   _normalize_cuda_arch``; 0.6.7-0.6.18 refuse SM 12.x below CUDA 12.9 and, with no explicit list, the
   error is swallowed and the effective list is empty: C4), or ``FLASHINFER_CUDA_ARCH_LIST``;
3. a compiler: the JIT needs nvcc (or a flashinfer-jit-cache built for the target);
4. optionally (``--jit-compile``) a compile-only build of the module's object files for the target,
   inspected for SASS (minutes; cached by content).
Topology (SGLang's workspace preflight asks for multicast granularity; gains reported only at TP2) is
left to the runtime tier.
"""
from __future__ import annotations

import os

from .. import source
from ..coverage import SASS_LEVELS
from ..env import effective_nvcc
from ..verdict import (BLOCKED, ERROR, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_TOOLCHAIN, LIFT_CUDA,
                       LIFT_NONE_NEEDED, LIFT_PACKAGE, LIFT_SETTING, LIFT_UNKNOWN, SKIPPED, Verdict)
from . import flashinfer_common as fi

BACKENDS = ("flashinfer-allreduce-fusion",)
MODULE_FN = "gen_trtllm_comm_module"


def probe(ctx) -> list[Verdict]:
    v = Verdict("flashinfer-allreduce-fusion", GATE_PASSES, lift=LIFT_NONE_NEEDED)
    ver = fi.version()
    if ver is None:
        v.status, v.gate, v.cause = SKIPPED, GATE_NOT_INSTALLED, "flashinfer-python is not installed"
        v.lift, v.lift_detail = LIFT_PACKAGE, "pip install flashinfer-python"
        return [v]
    v.add("flashinfer-python version", ver, "distribution metadata")
    target = ctx.target
    try:
        majors, where = fi.module_majors(MODULE_FN)
    except (source.SourceNotFound, SyntaxError) as e:
        v.status, v.cause = ERROR, f"cannot read {MODULE_FN} from the installed flashinfer: {e}"
        return [v]
    v.add(f"{MODULE_FN} supported majors", majors, where)
    if not effective_nvcc(ctx.env):
        v.warnings.append("no nvcc in this environment: FlashInfer JIT-compiles this module at first use, so even "
                          "with its gates open it cannot build here; only prebuilt kernels (flashinfer-jit-cache, "
                          "flashinfer-cubin) can serve the target")
    # 1. the module's Python arch list (C9)
    if majors is not None and target.major not in majors:
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = (f"FlashInfer's own JIT arch list for the allreduce-fusion module admits compute-capability majors "
                   f"{majors}; the target {target.cc} (major {target.major}) is not among them, so the module never "
                   f"compiles for it whatever the CUDA version")
        v.lift_detail = (f"a flashinfer-python release whose {MODULE_FN} lists major {target.major} "
                         f"(upstream PR 3903 added 12, released in 0.6.17)")
    # 2. normalisation and the effective list (C4), with FlashInfer's own code
    g = fi.gate(ctx, MODULE_FN)
    if "worker_error" in g:
        v.add("FlashInfer gate call", g["worker_error"], "child interpreter")
        if v.status == GATE_PASSES:
            v.status, v.cause = ERROR, f"could not run FlashInfer's gate code: {g['worker_error']}"
        return [v]
    if g.get("import_error"):
        v.add("import flashinfer", g["import_error"], f"package __init__ failed; gate read with {g.get('import_mode')}")
    v.add("CUDA version FlashInfer detects", g.get("cuda_version_seen") or g.get("cuda_version_error"),
          "flashinfer.jit.cpp_ext.get_cuda_version()")
    v.add(f"normalisation of {target.cc}", g.get("normalised") or g.get("normalise_error"),
          "flashinfer.compilation_context.CompilationContext._normalize_cuda_arch")
    v.add("FLASHINFER_CUDA_ARCH_LIST", os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "(unset)"), "environment")
    v.add("effective target arch list", g.get("effective_archs"), g.get("arch_list_source", ""))
    if g.get("swallowed"):
        v.add("FlashInfer swallowed", g["swallowed"], "flashinfer logger, CompilationContext.__init__")
    if g.get("gate_flags") is not None:
        v.add(f"{MODULE_FN} gencode flags", g.get("gate_flags"), f"flashinfer.jit.comm.{MODULE_FN}() called")
    if g.get("gate_error"):
        v.add(f"{MODULE_FN}() raised", g["gate_error"], f"flashinfer.jit.comm.{MODULE_FN}() called")
    eff = [a for a in g.get("effective_archs") or [] if int(a.split(".")[0]) == target.major]
    if not eff:
        msg = ("FlashInfer's effective target list for "
               f"{target.cc} is empty (case C4)")
        if v.status == GATE_PASSES:
            v.status, v.gate = BLOCKED, GATE_TOOLCHAIN
            why = ((g.get("swallowed") or [None])[0] or g.get("context_error")
                   or (g.get("normalise_error") if g.get("normalised") is None and "requires" in g.get("normalise_error", "") else None)
                   or ("FLASHINFER_CUDA_ARCH_LIST has no entry for the target" if os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
                       else "FlashInfer kept no entry for the target"))
            v.cause = f"{msg}: {why}"
            v.lift = LIFT_SETTING
            v.lift_detail = (f"FLASHINFER_CUDA_ARCH_LIST={target.cc}a (an explicit suffixed entry is used verbatim; "
                             f"{target.cc}f needs nvcc >= 12.9), or a CUDA >= 12.9 toolkit")
            if g.get("normalise_error") and "CUDA" in g.get("normalise_error", ""):
                v.lift = LIFT_CUDA
        else:
            v.warnings.append(msg + ": " + (g.get("normalise_error") or "no entry for the target"))
    if v.status != GATE_PASSES:
        return [v]
    if g.get("gate_passed") is False:
        v.status, v.gate, v.cause = BLOCKED, GATE_PYTHON, f"{MODULE_FN}() refused the target: {g.get('gate_error')}"
        v.lift = LIFT_PACKAGE
        return [v]
    # 3. a compiler for the JIT (or a jit-cache)
    nvcc = effective_nvcc(ctx.env)
    jit_cache = ctx.coverage.get("flashinfer-jit-cache")
    v.add("nvcc for the JIT", (nvcc or {}).get("path") and f"{nvcc['path']} (CUDA {nvcc.get('release')})", "environment")
    if jit_cache is not None:
        v.add("flashinfer-jit-cache coverage", jit_cache.level, "static coverage")
    if not nvcc and (jit_cache is None or jit_cache.level in ("none", "no-cuda-code")):
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_CUDA
        v.cause = ("the gate admits the target, but this environment has no nvcc to JIT-compile the module and no "
                   "flashinfer-jit-cache built for the target")
        v.lift_detail = "a CUDA toolkit with nvcc (>= 12.8 for sm_120a, >= 12.9 for sm_120f) or flashinfer-jit-cache for the target"
        return [v]
    # 4. compile-only build
    if not nvcc:
        v.add("compile-only JIT build", "not run: no nvcc", "")
    elif not ctx.jit_compile:
        v.add("compile-only JIT build", "not run (enable with --jit-compile; minutes, cached by content)", "")
    else:
        res = fi.jit_compile(ctx, MODULE_FN, " ".join(eff))
        summary = {k: res.get(k) for k in ("ran", "cached", "built", "objects", "seconds", "key", "error")}
        v.add("compile-only JIT build", summary, f"ninja over FlashInfer's own build file for {MODULE_FN}, objects only")
        if not res.get("built"):
            v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_UNKNOWN
            v.cause = f"the module did not compile for {' '.join(eff)}: {res.get('error') or res.get('log', '')[-300:]}"
            return [v]
        bad = [o["path"] for o in res.get("objects", []) if o["level"] not in SASS_LEVELS]
        if bad:
            v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_UNKNOWN
            v.cause = f"compiled objects lack SASS for {target.cc}: {bad}"
            return [v]
    _sglang_multicast_preflight(v, ctx)
    v.cause = (f"FlashInfer admits major {target.major} for the allreduce-fusion module and targets {' '.join(eff)} "
               f"here; the runtime tier must still measure it (multicast workspace preflight, PCIe)")
    return [v]


def _sglang_multicast_preflight(v: Verdict, ctx) -> None:
    """Where the installed sglang's fusion workspace preflight asks the driver for multicast
    granularity (``cuMulticastGetGranularity``): on a host without multicast (PCIe) that call fails and
    SGLang does not create the fusion workspace (FACTS). Adds evidence and, off NVLink, a warning."""
    import ast

    root = source.package_dir("sglang")
    if root is None:
        return
    layers = root / "srt" / "layers"
    hits = []
    for p in source.find_files_containing(layers if layers.is_dir() else root, "cuMulticastGetGranularity"):
        if "flashinfer" not in p.name:
            continue
        try:
            tree = source.parse(p)
        except SyntaxError:
            continue
        fns = source.functions(tree)
        for name, fn in fns.items():
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr == "cuMulticastGetGranularity":
                    parts = p.parts
                    rel = "/".join(parts[parts.index("sglang"):]) if "sglang" in parts else str(p)
                    hits.append(f"{rel}:{node.lineno} {name}")
                    break
    if hits:
        v.add("SGLang fusion workspace preflight queries multicast granularity", hits, "sglang source (ast)")
        if ctx.topology != "nvlink":
            v.warnings.append("SGLang's fusion workspace preflight asks the driver for multicast granularity "
                              f"({hits[0]}); on a {ctx.topology} host without multicast it fails and SGLang skips "
                              "the fusion: the runtime tier decides")

