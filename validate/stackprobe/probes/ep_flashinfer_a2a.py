"""Expert parallelism over FlashInfer all-to-all (SGLang ``--moe-a2a-backend flashinfer``).

Gates, read from the installed packages:

* the FlashInfer names SGLang's dispatcher imports (``from flashinfer.comm import MoeAlltoAll, ...``)
  must exist in the installed FlashInfer (checked in its source, no import);
* the JIT module behind them and its ``supported_major_versions``; the MNNVL module's list as context;
* SGLang's precondition (``_flashinfer_a2a_topology_is_supported`` where the installed sglang has it:
  called with its own code, compiled from the installed source): DP attention with dp size == tp size;
* topology: the MNNVL kernels expect an NVLink fabric (FACTS): nothing on PCIe lifts that.
"""
from __future__ import annotations

from .. import source
from ..env import dist_version
from ..verdict import (BLOCKED, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_TOPOLOGY, LIFT_NONE_NEEDED,
                       LIFT_NOTHING, LIFT_PACKAGE, SCOPE_ENGINE, SCOPE_LIBRARY, SKIPPED, Verdict)
from . import flashinfer_common as fi
from . import sglang_engine as se
from .sglang_custom_ar import sglang_root, short

BACKENDS = ("ep-flashinfer-a2a",)
RUNTIME = {"library": (), "engine": ()}
PRECONDITION = "_flashinfer_a2a_topology_is_supported"


def _flashinfer_has(module: str, name: str) -> bool | None:
    try:
        path = source.module_file(module)
    except source.SourceNotFound:
        return None
    return name in source.defined_names(path)


def engine_gate(ctx) -> list[Verdict]:
    """SGLang's dispatcher, its precondition and the FlashInfer names it imports, with the topology."""
    v = Verdict("ep-flashinfer-a2a", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_ENGINE)
    sg, fv = dist_version("sglang"), fi.version()
    root = sglang_root()
    if sg is None or root is None:
        return [se.not_installed("ep-flashinfer-a2a")]
    if fv is None:
        v.status, v.gate, v.cause, v.lift = SKIPPED, GATE_NOT_INSTALLED, "not installed: flashinfer-python", LIFT_PACKAGE
        return [v]
    eng = se.installed()
    if eng is not None and not eng.references("MoeAlltoAll", "moe_a2a_backend"):
        return [se.not_integrated("ep-flashinfer-a2a", eng, ("MoeAlltoAll", "moe_a2a_backend"), ctx)]
    v.add("versions", {"sglang": sg, "flashinfer-python": fv}, "distribution metadata")
    blocks: list[tuple[str, str, str, str]] = []  # (gate, cause, lift, detail)
    # 1. names SGLang imports from flashinfer for its a2a dispatcher
    needed = []
    for p in source.find_files_containing(root / "srt" / "layers" / "moe" if (root / "srt" / "layers" / "moe").is_dir() else root,
                                          "MoeAlltoAll"):
        needed += [(m, n, f"{short(p)}:{ln}") for m, n, ln in source.imports_from(p, "flashinfer")]
    missing = [(m, n, w) for m, n, w in needed if _flashinfer_has(m, n) is False]
    v.add("FlashInfer names SGLang's a2a dispatcher imports", sorted({f"{m}.{n}" for m, n, _ in needed}), "sglang source (ast)")
    if missing:
        names = sorted({f"{m}.{n}" for m, n, _ in missing})
        v.add("missing in the installed flashinfer", names, "; ".join(sorted({w for *_, w in missing})))
        blocks.append((GATE_PYTHON, f"SGLang {sg} imports {names} which FlashInfer {fv} does not export: its dispatcher "
                       "raises 'Flashinfer is not installed or does not support A2A'",
                       LIFT_PACKAGE, "an sglang / flashinfer-python pair whose APIs match"))
    # 2. the JIT modules' arch lists
    try:
        table = fi.all_module_majors()
        a2a = {k: val for k, val in table.items() if "alltoall" in k and ("moe" in k or "nvlink" in k)}
        mnnvl = {k: val for k, val in table.items() if "mnnvl" in k}
        v.add("a2a JIT modules' supported majors (None = unrestricted)", a2a, "flashinfer/jit/comm.py (ast)")
        v.add("MNNVL JIT modules' supported majors", mnnvl, "flashinfer/jit/comm.py (ast)")
        refused = [k for k, val in a2a.items() if val is not None and ctx.target.major not in val]
        if a2a and len(refused) == len(a2a):
            blocks.append((GATE_PYTHON, f"every a2a JIT module's arch list excludes major {ctx.target.major}: {refused}",
                           LIFT_PACKAGE, "a flashinfer-python release listing the target major"))
    except (source.SourceNotFound, SyntaxError) as e:
        v.add("flashinfer JIT modules", None, f"unreadable: {e}")
    # 3. SGLang's precondition, with its own code
    found = source.find_files_containing(root, f"def {PRECONDITION}")
    if found:
        fn, line = source.load_function(found[0], PRECONDITION)
        w = ctx.world_size
        plain = fn(architecture=None, tp_size=w, ep_size=w, attn_dp_size=1, attn_dp_enabled=False, enable_layernorm_sp=False)
        dpa = fn(architecture=None, tp_size=w, ep_size=w, attn_dp_size=w, attn_dp_enabled=True, enable_layernorm_sp=False)
        v.add(f"{PRECONDITION}(tp={w}, ep={w}) without / with DP attention (dp={w})", [plain, dpa],
              f"{short(found[0])}:{line} (installed function compiled from source)")
        if not plain:
            v.warnings.append(f"SGLang requires DP attention with dp_size == tp_size ({w}) for this backend"
                              + ("" if dpa else "; even that is refused"))
            if not dpa:
                blocks.append((GATE_PYTHON, f"{PRECONDITION} refuses tp={w}/ep={w} even with DP attention",
                               LIFT_PACKAGE, ""))
    else:
        v.add(PRECONDITION, None, "not in this sglang: precondition unread (older releases assert dp attention)")
    # 4. topology
    v.add("topology", f"{ctx.topology} ({ctx.topology_source})", "environment / CLI")
    if ctx.topology != "nvlink":
        blocks.insert(0, (GATE_TOPOLOGY, "FlashInfer's MoE all-to-all kernels are MNNVL/NVLink designs (NVLink fabric, "
                          f"multicast); this {ctx.topology} host has none; the workspace is also sized by chunked prefill "
                          "(GBs per rank)", LIFT_NOTHING, "not on PCIe"))
    if blocks:
        gate, cause, lift, detail = blocks[0]
        v.status, v.gate, v.cause, v.lift, v.lift_detail = BLOCKED, gate, cause, lift, detail
        v.warnings += [f"also: {c}" for _, c, _, _ in blocks[1:]]
        return [v]
    v.cause = "the installed packages admit the target; the runtime tier must measure it"
    return [v]


def library_gate(ctx) -> list[Verdict]:
    """FlashInfer's side: its all-to-all JIT modules' arch lists and the MNNVL (NVLink fabric) design."""
    v = Verdict("ep-flashinfer-a2a", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
    fv = fi.version()
    if fv is None:
        v.status, v.gate, v.cause, v.lift = SKIPPED, GATE_NOT_INSTALLED, "not installed: flashinfer-python", LIFT_PACKAGE
        return [v]
    v.add("flashinfer-python version", fv, "distribution metadata")
    try:
        table = fi.all_module_majors()
    except (source.SourceNotFound, SyntaxError) as e:
        v.status, v.cause = "error", f"cannot read flashinfer/jit/comm.py of flashinfer-python {fv}: {e}"
        return [v]
    a2a = {k: val for k, val in table.items() if "alltoall" in k and ("moe" in k or "nvlink" in k)}
    v.add("a2a JIT modules' supported majors (None = unrestricted)", a2a, "flashinfer/jit/comm.py (ast)")
    refused = [k for k, val in a2a.items() if val is not None and ctx.target.major not in val]
    if a2a and len(refused) == len(a2a):
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = f"every a2a JIT module's arch list excludes major {ctx.target.major}: {refused}"
        return [v]
    if ctx.topology != "nvlink":
        v.status, v.gate, v.lift = BLOCKED, GATE_TOPOLOGY, LIFT_NOTHING
        v.cause = f"FlashInfer's MoE all-to-all kernels are MNNVL/NVLink designs; this {ctx.topology} host has none"
        v.lift_detail = "not on PCIe"
        return [v]
    v.cause = "FlashInfer's a2a modules admit the target on NVLink"
    return [v]


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
