"""SGLang custom allreduce.

Library gate (:func:`library_gate`): the kernels, in sgl-kernel / sglang-kernel's ``common_ops``, carry
SASS for the target (static coverage).

Engine gate (:func:`engine_gate`, read from the installed SGLang with ``ast``; FACTS):

1. on by default (``--disable-custom-all-reduce`` turns it off);
2. ``CustomAllreduce._SUPPORTED_WORLD_SIZES``;
3. the init rule ``if world_size > N and not full_nvlink`` (``custom_all_reduce_utils.py`` in 0.5.23):
   disabled on PCIe beyond N GPUs; SGLang's JIT "v2" path needs full NVLink outright;
4. the per-call check ``should_custom_ar`` (``world_size == 2 or full_nvlink``);
5. SGLang 0.5.23's default CUDA path, ``CustomAllReduceV2`` (:func:`v2_path`): ``custom_all_reduce.py`` picks it
   while ``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2`` (``srt/environ.py``, default True) is on and
   ``can_use_custom_all_reduce_v2`` admits the group, which on one node needs full NVLink
   (``full_nvlink is True``); its kernels are built at run time by SGLang's ``load_jit`` (nvcc in the image),
   which the library answer reports beside the legacy kernels' SASS.
Its one-shot kernel writes to all peers at once, which is why it is disabled on PCIe beyond two GPUs:
nothing on this topology lifts it; PCIe-native designs (FlashInfer PCIe IPC allreduce, b12x) are the way
out. A rule that cannot be found (e.g. rewritten with ``self.world_size``) is an error (C17).
"""
from __future__ import annotations

import ast
from pathlib import Path

from .. import source
from ..coverage import SASS_LEVELS
from ..verdict import (BLOCKED, ERROR, GATE_BINARY, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_TOPOLOGY,
                       LIFT_NONE_NEEDED, LIFT_NOTHING, LIFT_PACKAGE, LIFT_REBUILD, SCOPE_LIBRARY, SKIPPED, Verdict)
from ..engines.sglang import answer as sa
from ..engines.sglang import engine as se
from ..engines.sglang.dispatch import UNKNOWN, custom_ar_per_call, find_pcie_world_size_rule

BACKENDS = ("sglang-custom-allreduce",)
RUNTIME = {"library": (), "engine": ("sglang-custom-allreduce",)}
KERNEL_DISTS = ("sglang-kernel", "sgl-kernel")
CA_FILE = "srt/distributed/device_communicators/custom_all_reduce.py"


def sglang_root() -> Path | None:
    return source.package_dir("sglang")


short = se.short


def kernel_coverage(ctx):
    """(dist name, PackageCoverage, [common_ops files with their levels]) of the installed sgl-kernel."""
    for d in KERNEL_DISTS:
        cov = ctx.coverage.get(d)
        if cov is not None:
            ops = [f for f in cov.files if "common_ops" in f.path]
            return d, cov, ops
    return None, None, []


def library_gate(ctx) -> list[Verdict]:
    v = Verdict(BACKENDS[0], GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
    dist, cov, ops = kernel_coverage(ctx)
    if cov is None:
        v.status, v.gate, v.lift = SKIPPED, GATE_NOT_INSTALLED, LIFT_PACKAGE
        v.cause = "not installed: sglang-kernel (the custom allreduce kernels)"
        v.lift_detail = "pip install sglang-kernel"
        return [v]
    v.add(f"{dist} common_ops coverage", [(f.path, f.level, f.sass) for f in ops] or cov.level, "static coverage (fatbin)")
    if not ops:
        v.status, v.cause = ERROR, f"{dist} has no common_ops library; cannot tell where the allreduce kernels live"
        return [v]
    if not any(f.level in SASS_LEVELS for f in ops):
        v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_REBUILD
        v.cause = f"{dist}'s common_ops carries no SASS for {ctx.target.cc}: {[f.path for f in ops]}"
        return [v]
    sass = sorted({a for f in ops if f.level in SASS_LEVELS for a in (f.sass or [])})
    v.cause = f"{dist}'s common_ops (the legacy CustomAllreduce kernels) carries SASS for {ctx.target.cc} ({', '.join(sass)})"
    eng = se.installed()
    if eng is not None:
        try:
            v2 = v2_path(eng)
        except se.GateNotFound as e:
            v.status, v.cause = ERROR, str(e)
            return [v]
        if v2 is not None:
            from ..env import effective_nvcc
            nvcc = effective_nvcc(ctx.env)
            v.add("CustomAllReduceV2 kernels", f"built at run time by load_jit (default {v2['default']})", v2["jit"])
            v.add("nvcc for SGLang's JIT", (nvcc or {}).get("path") or "none found", "environment")
            v.cause += (f"; SGLang {eng.version}'s default CUDA path is CustomAllReduceV2, JIT-built at first use "
                        f"({v2['jit']}; {v2['dispatch']}; {v2['env']}): it needs nvcc in the image ("
                        + (f"here: {nvcc['path']}, CUDA {nvcc.get('release')}" if nvcc else "none found here") + ")")
            if not nvcc:
                v.warnings.append("no nvcc in reach: where SGLang selects CustomAllReduceV2 (full NVLink) its JIT build "
                                  "fails; on PCIe it is not selected and the legacy kernels apply")
    return [v]


def v2_path(eng) -> dict | None:
    """SGLang's JIT custom allreduce (0.5.23 ``CustomAllReduceV2``), read from its source, or None when the release
    has none (0.5.9). Returns {"dispatch": "sglang/...custom_all_reduce.py:L1-L2" (the ``if`` on
    ``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2`` that returns it), "env": declaration, "default": its EnvBool default,
    "rule": "sglang/...custom_all_reduce_v2.py:L1-L2 ..." (``can_use_custom_all_reduce_v2``'s single-node NVLink rule:
    ``full_nvlink = can_use_custom_all_reduce_with_nvlink(...)`` ... ``return full_nvlink is True``), "jit":
    "sglang/...:L load_jit" (where its kernels are compiled)}. Raises GateNotFound when the dispatcher names V2
    but its rule or its kernel loader cannot be found."""
    name = "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2"
    path = eng.file(CA_FILE)
    disp = next((n for n in ast.walk(eng.tree(CA_FILE)) if isinstance(n, ast.If) and name in ast.unparse(n.test)), None)
    if disp is None:
        return None
    default, env_where = se.env_flag(eng, name)
    v2_rel = CA_FILE.replace("custom_all_reduce.py", "custom_all_reduce_v2.py")
    fn = eng.function(v2_rel, "can_use_custom_all_reduce_v2")
    assign = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign) and "nvlink" in ast.unparse(n.targets[0])
                   and isinstance(n.value, ast.Call) and "nvlink" in ast.unparse(n.value.func)), None)
    ret = next((n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None and assign is not None
                and ast.unparse(assign.targets[0]) in ast.unparse(n.value)), None)
    if assign is None or ret is None:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{v2_rel}: can_use_custom_all_reduce_v2 "
                              "has no `full_nvlink = can_use_custom_all_reduce_with_nvlink(...)` ... `return full_nvlink ...`")
    jit = None
    for imp in (n for n in ast.walk(eng.tree(v2_rel)) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.")):
        try:
            mod = eng.root.joinpath(*imp.module.split(".")[1:]).with_suffix(".py")
        except ValueError:
            continue
        if not mod.is_file():
            continue
        call = next((c for c in ast.walk(source.parse(mod)) if isinstance(c, ast.Call)
                     and getattr(c.func, "id", getattr(c.func, "attr", "")) == "load_jit"), None)
        if call is not None:
            jit = f"{short(mod)}:{call.lineno} load_jit"
            break
    if jit is None:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{v2_rel}: no module it imports from "
                              "calls load_jit (where CustomAllReduceV2's kernels are built)")
    return {"dispatch": f"{short(path)}:{disp.lineno}-{disp.end_lineno}", "env": env_where, "default": default,
            "rule": f"{short(eng.file(v2_rel))}:{assign.lineno}-{ret.lineno} `{ast.unparse(ret)}`", "jit": jit}


def engine_gate(ctx) -> list[Verdict]:
    return sa.answer(BACKENDS[0], ctx, _engine)


def _engine(ctx, eng) -> Verdict:
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    path = eng.file(CA_FILE)
    ans.add(se.server_argument_gate(eng, ("--disable-custom-all-reduce",), ctx=ctx, on_when=False))
    try:
        sizes, line = source.class_attribute(path, "CustomAllreduce", "_SUPPORTED_WORLD_SIZES")
    except (source.SourceNotFound, ValueError, SyntaxError) as e:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{CA_FILE}: "
                              f"CustomAllreduce._SUPPORTED_WORLD_SIZES ({e})") from e
    ans.add(se.Gate("CustomAllreduce._SUPPORTED_WORLD_SIZES", ctx.world_size in sizes, f"{short(path)}:{line} (ast)",
                    GATE_PYTHON, f"world size {ctx.world_size} is not in CustomAllreduce._SUPPORTED_WORLD_SIZES {sizes}",
                    LIFT_PACKAGE, value=sorted(sizes)))
    rule = find_pcie_world_size_rule(eng.root)
    if rule is None:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/srt/distributed: no "
                              "`world_size > N and not full_nvlink` rule (custom allreduce's PCIe heuristic moved)")
    n, where = rule
    ok = not (ctx.world_size > n and ctx.topology != "nvlink")
    ans.add(se.Gate("PCIe world-size rule", ok, where + " (ast)", GATE_TOPOLOGY,
                    f"custom allreduce is disabled on more than {n} GPUs without full NVLink; at world size "
                    f"{ctx.world_size} on {ctx.topology} its one-shot kernel would write to every peer across PCIe",
                    LIFT_NOTHING, f"nothing on PCIe beyond {n} GPUs: use a PCIe-native design (FlashInfer PCIe IPC "
                    f"allreduce, b12x) or TP<={n}", value=f"disabled when world_size > {n} without full NVLink"))
    # C48: the per-call check answers from its own code, never from the init rule above
    admits, why = custom_ar_per_call(eng, ctx)
    ans.add(se.Gate("per-call check should_custom_ar", admits is True, why, GATE_TOPOLOGY,
                    ("should_custom_ar's outcome for the decode tensor is decided at run time" if admits is UNKNOWN else
                     f"should_custom_ar {'admits' if admits else 'declines'} the decode tensor at world size "
                     f"{ctx.world_size} on {ctx.topology}"), LIFT_NOTHING,
                    value="unknown (decided at run time)" if admits is UNKNOWN else bool(admits)))
    v2 = v2_path(eng)
    v = ans.verdict(f"SGLang {eng.version} admits world size {ctx.world_size} on {ctx.topology} "
                    "(custom allreduce is on by default)")
    if v2 is not None:
        import os
        val = os.environ.get("SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2")
        on = se.env_truthy(val) if val is not None else bool(v2["default"])
        if on:
            # not a gate of its own: when can_use_custom_all_reduce_v2 refuses, SGLang falls back to the legacy
            # CustomAllreduce, whose gates are the ones above
            nvl = ctx.topology == "nvlink"
            where = f"{v2['rule']}; chosen at {v2['dispatch']} ({v2['env']})"
            v.add("CustomAllReduceV2 NVLink rule", {"admits": nvl, "value": "full NVLink required on one node; "
                  "otherwise SGLang falls back to the legacy CustomAllreduce"}, where)
            v.cause += (f"; its default CUDA path, CustomAllReduceV2 (JIT-built), is admitted on one node only with full "
                        f"NVLink ({where}), " + ("so it runs here" if nvl else
                                                 f"so on {ctx.topology} SGLang uses the legacy CustomAllreduce and its rules"))
    return v


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
