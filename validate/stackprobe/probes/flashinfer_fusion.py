"""FlashInfer allreduce fusion (``gen_trtllm_comm_module``): cases C4 and C9.

Gates, in order (FACTS, "The dead-end backends"):

1. the module's JIT arch list: ``supported_major_versions`` inside ``flashinfer.jit.comm.
   gen_trtllm_comm_module`` of the installed package ([9, 10] through 0.6.16, [9, 10, 12] from 0.6.17,
   upstream PR 3903): a Python list, lifted by a package upgrade, not by CUDA (C9);
2. FlashInfer's arch normalisation for the target on this nvcc (``CompilationContext.
   _normalize_cuda_arch``; 0.6.7-0.6.18 refuse SM 12.x below CUDA 12.9 and, with no explicit list, the
   error is swallowed and the effective list is empty: C4), or ``FLASHINFER_CUDA_ARCH_LIST``;
3. a compiler: the JIT needs nvcc, unless a flashinfer-jit-cache holds this module (``trtllm_comm``, its name
   read from the installed source) with SASS that runs on the target and a version FlashInfer accepts
   (:func:`flashinfer_common.aot_module`): then FlashInfer loads it and no JIT is needed;
4. optionally (``--jit-compile``) a compile-only build of the module's object files for the target,
   inspected for SASS (minutes; cached by content).
Those are the library's answer (:func:`library_gate`). The engine's answer (:func:`engine_gate`, read from
the installed SGLang, FACTS "SGLang 0.5.23's own gates"; case C13):

1. the server argument, read from the installed release (:func:`sglang_engine.server_argument`):
   ``--flashinfer-allreduce-fusion-backend`` (0.5.23, an arg-group field; auto-enabled only for listed models)
   or ``--enable-flashinfer-allreduce-fusion`` (0.5.9, ``srt/server_args.py:4107``). Both are off by default,
   so the flag is part of every lift (:func:`sglang_engine.server_argument_gate`); SGLang's own auto-enable
   (:func:`_auto_enable`: 0.5.9 ``srt/server_args.py:1680``, 0.5.23 ``srt/arg_groups/overrides.py:987``) admits
   listed models on SM90/SM100 only and is cited as evidence;
2. ``_resolve_backend`` in ``srt/layers/flashinfer_comm_fusion.py`` raises unless the GPU passes its
   platform predicates (0.5.23: ``is_sm90 or is_sm100``, majors 9 and 10, from ``srt/utils/common.py``);
   ``flashinfer_ar_fusion_applies`` repeats that per call;
3. SGLang's own workspace preflight (0.5.23 ``_flashinfer_trtllm_workspace_allocation_sizes``) asks the
   driver for multicast granularity (``cuMulticastGetGranularity``) and SGLang skips fusion when it fails;
   PCIe-only GPUs have no multicast. This is SGLang code, not FlashInfer's need: FlashInfer 0.7.2 builds its
   trtllm workspace with ``enable_multicast=False`` (``flashinfer/comm/trtllm_ar.py:514``), so the lift is
   an sglang release whose preflight does not require multicast (and whose ``_resolve_backend`` admits 12),
   not "nothing on this topology". When blocked, the lift also names what the library side needs here: a
   FlashInfer whose module admits the target and, without nvcc, a compiler or flashinfer-jit-cache.
"""
from __future__ import annotations

import os

from .. import source
from ..coverage import SASS_LEVELS
from ..env import all_nvccs, effective_nvcc
from ..verdict import (FALLS_BACK, OPT_IN, STARTUP_FAILURE, BLOCKED, ERROR, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_TOOLCHAIN,
                       GATE_TOPOLOGY, LIFT_CUDA,
                       LIFT_NONE_NEEDED, LIFT_NOTHING, LIFT_PACKAGE, LIFT_SETTING, LIFT_UNKNOWN, SCOPE_LIBRARY, SKIPPED, Verdict)
from . import flashinfer_common as fi
from ..engines.sglang import answer as sa
from ..engines.sglang import engine as se

BACKENDS = ("flashinfer-allreduce-fusion",)
# runtime runners: the library kernel (stackprobe.runtime.probes) and SGLang's own workspace (runtime.engine)
RUNTIME = {"library": ("flashinfer-allreduce-fusion",), "engine": ("sglang-flashinfer-fusion-workspace",)}
MODULE_FN = "gen_trtllm_comm_module"


def library_gate(ctx) -> list[Verdict]:  # noqa: C901, PLR0912, PLR0915 - reason: one gate per FlashInfer fusion precondition, in order
    v = Verdict("flashinfer-allreduce-fusion", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
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
    if not effective_nvcc(ctx.env) and not fi.aot_module(MODULE_FN, target)["covers"]:
        v.warnings.append("no nvcc in this environment: FlashInfer JIT-compiles this module at first use, so even "
                          "with its gates open it cannot build here; only prebuilt kernels (flashinfer-jit-cache, "
                          "flashinfer-cubin) can serve the target")
    # 1. the module's Python arch list (C9)
    if majors is not None and target.major not in majors:
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = (f"FlashInfer's own JIT arch list for the allreduce-fusion module admits compute-capability majors "
                   f"{majors}; the target {target.cc} (major {target.major}) is not among them, so the module never "
                   f"compiles for it whatever the CUDA version")
        v.lift_detail = (f"a flashinfer-python release whose {MODULE_FN} lists major {target.major} (the installed "
                         f"{ver} lists {majors} at {where})")
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
    # 3. a compiler for the JIT, or this module compiled ahead of time for the target (flashinfer-jit-cache)
    nvcc = effective_nvcc(ctx.env)
    jit_cache = ctx.coverage.get("flashinfer-jit-cache")
    v.add("nvcc for the JIT", (nvcc or {}).get("path") and f"{nvcc['path']} (CUDA {nvcc.get('release')})", "environment")
    v.add("every nvcc in reach", all_nvccs(ctx.env) or "none (PATH, CUDA_HOME, /usr/local/cuda, PyPI toolkit folders)",
          "environment")
    if jit_cache is not None:
        v.add("flashinfer-jit-cache coverage", jit_cache.level, "static coverage")
    aot, order, order_where = fi.add_aot_evidence(v, MODULE_FN, target)
    if not nvcc and not aot["covers"]:
        # a missing package, not the CUDA release: nvcc (a devel base) or the module ahead of time (see ep-flashinfer-a2a)
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_PACKAGE
        v.cause = ("the gate admits the target, but this environment has no nvcc in reach (PATH, CUDA_HOME, the PyPI "
                   "toolkit folders) to JIT-compile the module and no "
                   f"ahead-of-time build of it for the target ({aot['cause']})")
        v.lift_detail = ("install nvcc (a CUDA devel base image; >= 12.8 for sm_120a, >= 12.9 for sm_120f), or a flashinfer-jit-cache "
                         f"holding {aot['module'] or 'the module'} with SASS for {target.cc} (the flashinfer node's "
                         "method aot)")
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
    v.cause = (f"FlashInfer admits major {target.major} for the allreduce-fusion module and targets {' '.join(eff)} "
               + (f"here; its module is compiled ahead of time ({aot['cause']}) and "
                  + (f"{order} ({order_where}), whatever nvcc is in reach: no JIT needed " if order else "no JIT is needed ")
                  if aot["covers"] else "here ")
               + "(the library's answer; SGLang's own gates are the engine answer)")
    return [v]


FUSION_FILE = "srt/layers/flashinfer_comm_fusion.py"
# the server argument, newest name first (0.5.23 arg-group field; 0.5.9 server_args.py:4107)
FUSION_FLAGS = ("--flashinfer-allreduce-fusion-backend", "--enable-flashinfer-allreduce-fusion")
PER_CALL_CHECKS = ("flashinfer_ar_fusion_applies", "apply_flashinfer_allreduce_fusion")
UNFUSED = "the unfused allreduce (SGLang's TP allreduce dispatch) and a separate RMSNorm"


def _start_up_consequence(eng, gate, check, value: str = "auto") -> None:
    """Case C35: what SGLang does when ``_resolve_backend``'s platform check (``check``, an ``if not (...): raise``)
    refuses the target. Reads the raise (exception and message) and the call path from a start-up root
    (``warmup``) to ``_resolve_backend`` (:func:`sglang_raises.call_path`): uncaught, the gate is a start-up
    failure (``on_fail="raise"``); caught on the way, a decline; no path found, left as it is (blocked). The path is
    the one the backend ``value`` takes (the configured one, else ``auto``), and the value records the path of every
    value of the flag (:func:`_site_filter`): sglang 0.5.23 reaches the raise through the workspace
    (``base_runner.py:329`` -> ``ensure_workspace_initialized`` -> ``flashinfer_comm_fusion.py:100`` -> ``:48``) for
    ``auto`` / ``trtllm`` / ``mnnvl``, and through ``base_runner.py:317`` only for ``cutedsl``."""
    import ast

    from ..engines.sglang import raises as sp

    r = next((n for n in check.body if isinstance(n, ast.Raise)), None)
    exc = r.exc.func.id if r is not None and isinstance(r.exc, ast.Call) and isinstance(r.exc.func, ast.Name) else ""
    msg = next((a.value for a in getattr(r.exc, "args", []) if isinstance(a, ast.Constant)), "") if r is not None else ""
    if not exc:
        return
    values = _backend_values(eng, value)
    paths = {v: sp.call_path(eng.root / "srt", "_resolve_backend", exc, se.short, roots=("warmup",),
                             admits=_site_filter(eng, v)) for v in values}
    cp = paths.get(value) or sp.call_path(eng.root / "srt", "_resolve_backend", exc, se.short, roots=("warmup",))
    per_value: dict[str, list[str]] = {}
    for v, path in paths.items():
        per_value.setdefault(path.describe(), []).append(v)
    gate.value = {"majors": gate.value, "raises": f"{exc}({msg!r})", "call path": cp.describe(),
                  "call path per value": {"/".join(vs): d for d, vs in per_value.items()},
                  "raises for": [v for v, path in paths.items() if path.found and not path.caught_at]}
    if not cp.found:
        return
    raise_at = f"sglang/{FUSION_FILE}:{r.lineno}-{r.end_lineno}"
    if cp.caught_at:
        gate.on_fail, gate.falls_to = "decline", f"{UNFUSED} (the {exc} is caught at {cp.caught_at})"
        return
    gate.on_fail = "raise"
    gate.raises = (f"_resolve_backend raises {exc}({msg!r}) at {raise_at}, reached at start-up and not caught: "
                   + ("; ".join(f"for {'/'.join(vs)}: {d}" for d, vs in per_value.items()) if len(per_value) > 1
                      else cp.describe()))


def _backend_values(eng, value: str) -> list[str]:
    """The values of the fusion backend flag (its ``choices`` in the installed SGLang; sglang 0.5.23 ``auto``,
    ``trtllm``, ``mnnvl``, ``cutedsl``), ``value`` first; ``[value]`` where the flag has no choices (0.5.9's switch)."""
    from ..engines.sglang import flags as sf

    spec = next((sf.server_flags(eng).get(f) for f in FUSION_FLAGS if f in sf.server_flags(eng)), None)
    choices = [str(c) for c in (spec.choices or ())] if spec is not None else []
    return list(dict.fromkeys([value] + choices)) if choices else [value]


def _choices_unread(eng) -> str:
    """Why the fusion flag's values could not be read ("" when they were): the flag is not among the installed
    SGLang's server arguments, or it takes a value whose ``choices`` this reader did not find (a switch, 0.5.9's
    ``--enable-flashinfer-allreduce-fusion``, has none to read)."""
    from ..engines.sglang import flags as sf

    flags = sf.server_flags(eng)
    spec = next((flags.get(f) for f in FUSION_FLAGS if f in flags), None)
    if spec is None:
        return f"none of {', '.join(FUSION_FLAGS)} is among sglang {eng.version}'s server arguments"
    if not spec.switch and not spec.choices:
        return f"{spec.flag} takes a value but its choices are not read here ({spec.where})"
    return ""


def _site_filter(eng, value: str):
    """``f(site) -> bool`` for :func:`.sglang_raises.call_path`: whether a call site's conditions hold when the fusion
    backend is ``value``. A condition is judged when it calls a predicate of ``flashinfer_comm_fusion.py`` whose body
    returns ``<...>.flashinfer_allreduce_fusion_backend == "<v>"`` (0.5.23 ``uses_cutedsl_ar_fusion``), or tests
    that backend ``is None`` (false: the backend is set); any other condition is kept (not judged)."""
    import ast
    import re

    preds = {}
    try:
        for fn in source.functions(eng.tree(FUSION_FILE)).values():
            ret = fn.body[-1] if fn.body else None
            if (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Compare)
                    and ast.unparse(ret.value.left).endswith("fusion_backend") and isinstance(ret.value.ops[0], ast.Eq)
                    and isinstance(ret.value.comparators[0], ast.Constant)):
                preds[fn.name] = str(ret.value.comparators[0].value)
    except se.GateNotFound:
        pass

    def holds(cond: str) -> bool:
        neg = re.fullmatch(r"not \((.*)\)", cond)
        if neg:
            inner = holds_or_none(neg.group(1))
            return True if inner is None else not inner
        got = holds_or_none(cond)
        return True if got is None else got

    def holds_or_none(cond: str):
        m = re.fullmatch(r"(\w+)\(\)", cond.strip())
        if m and m.group(1) in preds:
            return value == preds[m.group(1)]
        if re.fullmatch(r".*fusion_backend is None", cond.strip()):
            return False
        return None

    return lambda site: all(holds(c) for c in site.under)


def engine_gate(ctx) -> list[Verdict]:
    """Will the installed SGLang enable FlashInfer allreduce fusion on the target host (C13)?"""
    return sa.answer(BACKENDS[0], ctx, _engine)


def _engine(ctx, eng) -> Verdict:  # noqa: C901, PLR0912 - reason: one gate per SGLang fusion-backend rule, each with its FILE:LINE
    import ast

    refs = eng.references("allreduce_fusion")
    if not refs:
        return se.not_integrated(BACKENDS[0], eng, ("allreduce_fusion",), ctx)
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    # 1. the server argument, read from the installed release (0.5.23: the arg-group field
    #    flashinfer_allreduce_fusion_backend; 0.5.9: add_argument("--enable-flashinfer-allreduce-fusion"))
    arg = se.server_argument(eng, FUSION_FLAGS)
    opt = ans.add(se.server_argument_gate(eng, FUSION_FLAGS, ctx=ctx, set_to="auto" if arg["flag"].endswith("-backend") else ""))
    auto = _auto_enable(eng, arg["dest"])
    if auto is not None and opt.opt_in:
        opt.cause += (f"; SGLang's auto-enable turns it on only for listed models on compute-capability majors "
                      f"{auto['majors']} ({' or '.join(auto['predicates'])}), not {ctx.target.cc} ({auto['where']})")
    # 2. the platform checks: the one that raises at start-up (0.5.23: _resolve_backend) and the per-call one
    #    (0.5.23: flashinfer_ar_fusion_applies; 0.5.9: apply_flashinfer_allreduce_fusion); at least one must be found
    table = se.platform_majors(eng)
    found = 0
    try:
        fn = eng.function(FUSION_FILE, "_resolve_backend")
    except se.GateNotFound:
        fn = None
    check = se.raising_arch_check(fn) if fn is not None else None
    if check is not None:
        names, majors = se.predicate_majors(check.test, table)
        where = f"sglang/{FUSION_FILE}:{check.lineno} _resolve_backend `{ast.unparse(check.test)}`"
        g = ans.add(se.Gate("platform check", ctx.target.major in majors, where, GATE_PYTHON,
                            f"fusion requires compute-capability majors {majors} ({' or '.join(names)}); the target "
                            f"{ctx.target.cc} is refused (ValueError)", se.LIFT_PACKAGE,
                            f"an sglang release whose _resolve_backend admits major {ctx.target.major}", value=majors))
        given = ctx.server_config.flag(arg["flag"]) if getattr(ctx, "server_config", None) is not None else None
        _start_up_consequence(eng, g, check, str(given) if isinstance(given, str) else "auto")
        found += 1
    layers = eng.root / "srt" / "layers"
    for name in PER_CALL_CHECKS:
        for path in source.find_files_containing(layers, f"def {name}("):
            afn = source.functions(source.parse(path)).get(name)
            if afn is None:
                continue
            a_names, a_majors = se.predicate_majors(afn, table)
            if not a_majors:
                continue
            ans.add(se.Gate("per-call check", ctx.target.major in a_majors, f"{se.short(path)}:{afn.lineno} {name}",
                            GATE_PYTHON, f"the per-call check {name} admits majors {a_majors} only "
                            f"({' or '.join(dict.fromkeys(a_names))})", se.LIFT_PACKAGE,
                            f"an sglang release whose {name} admits major {ctx.target.major}", value=a_majors,
                            on_fail="decline", falls_to=UNFUSED))
            found += 1
            break
    if not found:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{FUSION_FILE}: neither a platform check "
                              f"in _resolve_backend nor a per-call check ({' / '.join(PER_CALL_CHECKS)}) under sglang/srt/layers")
    # 3. the multicast preflight: wherever SGLang asks the driver for multicast granularity. Required when SGLang
    #    builds FlashInfer's unified workspace (its trtllm SymmDeviceMemory is multicast); releases on the older
    #    CUDA-IPC workspace (0.5.9) have none.
    pre = None
    srt = eng.root / "srt"
    for path in source.find_files_containing(srt, "cuMulticastGetGranularity"):
        for name, node in source.functions(source.parse(path)).items():
            if any(isinstance(n, ast.Attribute) and n.attr == "cuMulticastGetGranularity" for n in ast.walk(node)):
                pre = (se.short(path), name, next(n.lineno for n in ast.walk(node) if isinstance(n, ast.Attribute)
                                                  and n.attr == "cuMulticastGetGranularity"))
                break
        if pre:
            break
    unified = "create_allreduce_fusion_workspace" in eng.file(FUSION_FILE).read_text(encoding="utf-8", errors="replace")
    if pre is None and unified:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{FUSION_FILE}: it builds FlashInfer's "
                              "unified (multicast) workspace but no workspace preflight calling cuMulticastGetGranularity "
                              "was found under sglang/srt")
    if pre is None:
        ans.add(se.Gate("workspace preflight (multicast)", True, f"sglang/{FUSION_FILE}",
                        value="none in this release: it builds the older CUDA-IPC workspace"))
    else:
        mc = ctx.topology == "nvlink"
        ans.add(se.Gate("workspace preflight (multicast)", mc, f"{pre[0]}:{pre[2]} {pre[1]}", GATE_TOPOLOGY,
                        f"SGLang's own fusion workspace preflight asks the driver for multicast granularity "
                        f"(cuMulticastGetGranularity) and skips fusion when it fails; {ctx.topology} GPUs report "
                        "CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0 (multicast needs NVSwitch)", LIFT_PACKAGE,
                        "an sglang release whose fusion workspace preflight does not require multicast"
                        + _trtllm_without_multicast(), value=f"topology {ctx.topology} ({ctx.topology_source})",
                        on_fail="decline", falls_to=UNFUSED))
    v = ans.verdict(f"SGLang {eng.version} admits compute capability {ctx.target.cc} and the {ctx.topology} host "
                    f"passes its workspace preflight; enable it with {ans.gates[0].flag}")
    if auto is not None:
        v.add("auto-enable (listed models only)", {"majors": auto["majors"], "predicates": auto["predicates"],
                                                   "admits target": ctx.target.major in auto["majors"]}, auto["where"])
    if v.status == STARTUP_FAILURE:
        _do_not_set(v, eng, ans.gates[0].flag, arg["dest"], check_gate=next(
            (g for g in ans.gates if isinstance(g.value, dict) and "raises for" in g.value), None))
    if v.status in (BLOCKED, OPT_IN, FALLS_BACK, STARTUP_FAILURE):
        extra = _library_lifts(ctx)
        if extra:
            v.lift_detail = "; ".join([v.lift_detail] + extra) if v.lift_detail else "; ".join(extra)
    return v


def deprecated_aliases(eng, dest: str) -> list[dict]:
    """The deprecated flags SGLang maps onto the fusion field ``dest``, read from its argument files: an ``if``
    whose test reads another field and ``<dest> is None`` and whose body passes ``<dest>=<constant>`` (sglang 0.5.23
    ``srt/arg_groups/serving_hook.py:284-296``: ``--enable-flashinfer-allreduce-fusion`` becomes
    ``flashinfer_allreduce_fusion_backend="auto"``, with a deprecation warning). Returns
    [{"flag": "--enable-...", "value": "auto", "where": "sglang/FILE:L1-L2"}]; [] where there is none (0.5.9, whose
    ``--enable-flashinfer-allreduce-fusion`` is the switch itself)."""
    import ast

    out = []
    for path, node in se.arg_ifs(eng):
        reads = [n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)]
        unset = any(isinstance(c, ast.Compare) and isinstance(c.ops[0], ast.Is) and isinstance(c.left, ast.Attribute)
                    and c.left.attr == dest and isinstance(c.comparators[0], ast.Constant)
                    and c.comparators[0].value is None for c in ast.walk(node.test))
        old = [a for a in reads if a != dest]
        if not unset or len(old) != 1:
            continue
        for stmt in node.body:
            for kw in (k for k in ast.walk(stmt) if isinstance(k, ast.keyword)):
                if kw.arg == dest and isinstance(kw.value, ast.Constant):
                    out.append({"flag": "--" + old[0].replace("_", "-"), "value": kw.value.value,
                                "where": f"{se.short(path)}:{node.lineno}-{node.end_lineno}"})
    return out


def _do_not_set(v: Verdict, eng, flag: str, dest: str, check_gate) -> None:
    """The setting a user must not pass, as one phrase for the summary's "do not set" line (evidence
    ``user setting``): the flag with every value whose path reaches the uncaught raise (all of them: "any value"),
    and each deprecated alias that sets the flag (:func:`deprecated_aliases`). Where the flag's values are not read
    (:func:`_choices_unread`), or no value's path to the raise is, it says so (not assessed) instead of naming
    ``auto`` as if it were the one value read."""
    values = list(check_gate.value.get("raises for") or []) if check_gate is not None else []
    choices = _backend_values(eng, values[0]) if values else []
    unread = _choices_unread(eng)
    if values and choices and set(choices) <= set(values) and len(choices) > 1:
        setting = f"{flag} (any value: {', '.join(choices)})"
    elif values and unread:
        setting = (f"{flag} {'/'.join(values)} (read for {'/'.join(values)} only; its other values not assessed: "
                   f"{unread})")
    elif values:
        setting = f"{flag} {'/'.join(values)}"
    else:
        setting = (f"{flag} (not assessed: which of its values reach the uncaught raise is not read"
                   + (f"; {unread}" if unread else "") + ")")
    aliases = [a for a in deprecated_aliases(eng, dest) if not values or a["value"] in values]
    for a in aliases:
        setting += f", or the deprecated {a['flag']} (it sets {a['value']}, {a['where']})"
    have = next((e for e in v.evidence if e.what == "user setting"), None)
    if have is None:
        v.add("user setting", setting, f"sglang {eng.version} server arguments")
    else:
        have.value = setting
    if aliases:
        v.add("deprecated alias", aliases, aliases[0]["where"])


def _auto_enable(eng, dest: str) -> dict | None:
    """SGLang's own auto-enable of fusion, read from its argument files: the first ``if`` whose test reads the
    fusion field ``dest`` and calls platform predicates (0.5.9 ``srt/server_args.py``: ``not
    self.enable_flashinfer_allreduce_fusion and model_arch in [...] and (is_sm90_supported() or
    is_sm100_supported())``; 0.5.23 ``srt/arg_groups/overrides.py``: ``view.flashinfer_allreduce_fusion_backend is
    None and ... (get_platform().is_sm90 or get_platform().is_sm100)``). Returns {"majors", "predicates",
    "where": "sglang/FILE:L1-L2"} or None when no such ``if`` exists (evidence only: the flag is the lift)."""
    import ast

    table = se.platform_majors(eng)
    for path, node in se.arg_ifs(eng):
        if not any(isinstance(n, ast.Attribute) and n.attr == dest for n in ast.walk(node.test)):
            continue
        names, majors = se.predicate_majors(node.test, table)
        if names:
            return {"majors": majors, "predicates": list(dict.fromkeys(names)),
                    "where": f"{se.short(path)}:{node.lineno}-{node.test.end_lineno}"}
    return None


def _trtllm_without_multicast() -> str:
    """`` (FlashInfer X's trtllm workspace ... file:line)`` when the installed FlashInfer builds its trtllm
    fusion workspace with ``enable_multicast=False`` (0.7.2: flashinfer/comm/trtllm_ar.py:514), else ''."""
    import ast

    try:
        path = source.module_file("flashinfer.comm.trtllm_ar")
        tree = source.parse(path)
    except (source.SourceNotFound, SyntaxError, ValueError, OSError):
        return ""
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and n.arg == "enable_multicast" and isinstance(n.value, ast.Constant) \
                and n.value.value is False:
            return (f" (FlashInfer {fi.version()}'s trtllm workspace itself does not need multicast: "
                    f"enable_multicast=False at {fi._short(path)}:{n.value.lineno})")
    return ""


def _library_lifts(ctx) -> list[str]:
    """What the engine lift also needs from the library side: a FlashInfer whose fusion module admits the
    target's major (read from the installed flashinfer/jit/comm.py) and, with no nvcc, a compiler or a
    flashinfer-jit-cache for the JIT build."""
    out = []
    try:
        majors, where = fi.module_majors(MODULE_FN)
    except (source.SourceNotFound, SyntaxError, ValueError):
        majors, where = None, ""
    if majors is not None and ctx.target.major not in majors:
        out.append(f"and a flashinfer-python release whose {MODULE_FN} admits major {ctx.target.major} "
                   f"(flashinfer-python {fi.version()} admits {majors} at {where})")
    if not effective_nvcc(ctx.env) and not fi.aot_module(MODULE_FN, ctx.target)["covers"]:
        out.append("and nvcc (a CUDA toolkit) or a flashinfer-jit-cache built for the target: FlashInfer JIT-compiles "
                   "the fusion module at first use and this environment has neither")
    return out

def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
