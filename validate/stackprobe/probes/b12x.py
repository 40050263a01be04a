"""b12x: a PCIe-native allreduce / MoE kernel set for SM120/SM121.

Library gate: a top-level ``b12x`` package (the flashinfer-python 0.7.2 and 0.7.4 wheels ship one, with the
``[b12x]`` extra for its dependencies, that aliases ``flashinfer.experimental.b12x``), its own capability gate ``is_b12x`` (run from its source with the
capability answered), its CuTe DSL compiler, and an import in a child interpreter.

Engine gate: SGLang 0.5.23 does not reference b12x at all (FACTS): not integrated in that engine
version, whatever the library admits.
"""
from __future__ import annotations

from pathlib import Path

from .. import source
from ..env import dist_version
from ..isolate import run_task
from ..verdict import (BLOCKED, ERROR, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON,
                       GATE_TOOLCHAIN, LIFT_NONE_NEEDED, LIFT_PACKAGE, LIFT_UNKNOWN, SCOPE_ENGINE, SCOPE_LIBRARY,
                       NOT_ASSESSED, SKIPPED, Verdict)
from . import flashinfer_common as fi
from ..engines.sglang import engine as se


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


def _library(ctx) -> Verdict:
    v = Verdict("b12x", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
    root = source.package_dir("b12x")
    dv = dist_version("b12x")
    if root is None:
        v.status, v.gate, v.cause, v.lift = SKIPPED, GATE_NOT_INSTALLED, "b12x is not installed", LIFT_PACKAGE
        fv = fi.version()
        v.lift_detail = ("a flashinfer-python release that ships the top-level b12x package, installed with its [b12x] "
                         "extra (the installed flashinfer-python " + (f"{fv} has none" if fv else "is absent")
                         + "), or the b12x distribution")
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
    v.cause = "b12x admits the target and imports (the library's answer); its speed is for the runtime tier"
    return v


BACKENDS = ("b12x",)
RUNTIME = {"library": (), "engine": ()}


def library_gate(ctx) -> list[Verdict]:
    return [_library(ctx)]


def engine_gate(ctx) -> list[Verdict]:
    eng = se.installed()
    if eng is None:
        return [se.not_installed(BACKENDS[0])]
    refs = eng.references("b12x")
    if not refs:
        return [se.not_integrated(BACKENDS[0], eng, ("b12x",), ctx)]
    v = Verdict(BACKENDS[0], NOT_ASSESSED, scope=SCOPE_ENGINE, lift=LIFT_UNKNOWN, host=se.target_host(ctx),
                cause=f"not assessed: sglang {eng.version} references b12x ({refs[0]}), but this suite does not read "
                      "its gates yet")
    v.add("sglang references", refs, "sglang/**/*.py")
    return [v]


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
