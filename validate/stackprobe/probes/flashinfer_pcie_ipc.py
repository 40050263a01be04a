"""FlashInfer PCIe IPC allreduce (``flashinfer.comm.PcieIpcAllReduceWorkspace``; case C16).

Library gate: the class exists in the installed FlashInfer (0.7.x), its supported world sizes, its JIT
module ``gen_pcie_ipc_comm_module``'s arch list (none: plain loads/stores and CUDA IPC), and an nvcc for
its JIT. Built for hosts where every peer transfer crosses the CPU root complex.

Engine gate (SGLang 0.5.23, ``srt/distributed/device_communicators/pcie_ipc_ar.py``): the group
coordinator builds ``PcieIpcCommunicator`` only when ``eligible_group`` admits the group, which needs the
opt-in environment variable ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE`` (declared in ``srt/environ.py``,
default False), world size > 1 and the "tp" group, and deterministic collectives off (C38:
``--enable-deterministic-inference`` or ``SGLANG_USE_1STAGE_ALLREDUCE=1``, :mod:`.pcie_ipc_engine`). With no flags
the answer is ``opt-in`` naming the variable (C34); with it set in ``ctx.server_config``, ``on-as-configured``;
a later check that declines makes it ``falls-back-if-set`` (the tensor stays on NCCL). Upstream's own figures,
read from the module docstring of ``pcie_ipc_ar.py``, are evidence labelled "upstream's claim".
"""
from __future__ import annotations

import re

from .. import source
from ..env import all_nvccs, effective_nvcc
from ..paths import PCIE_IPC
from ..verdict import (BLOCKED, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_SETTING, GATE_TOOLCHAIN,
                       LIFT_NONE_NEEDED, LIFT_PACKAGE, LIFT_SETTING, SCOPE_LIBRARY, SKIPPED, Verdict, unassessed_entry)
from . import flashinfer_common as fi
from . import pcie_ipc_engine as pcie_det
from ..engines.sglang import answer as sa
from ..engines.sglang import engine as se
from ..engines.sglang import pcie_ipc as sglang_pcie_ipc


def _library(ctx) -> Verdict:
    v = Verdict(PCIE_IPC, GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
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
        v.lift_detail = (f"a flashinfer-python release exporting flashinfer.comm.PcieIpcAllReduceWorkspace (the installed "
                         f"{fv} does not; first in 0.7.0, per a scan of the released files)")
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
    aot, order, order_where = fi.add_aot_evidence(v, "gen_pcie_ipc_comm_module", ctx.target)
    v.add("every nvcc in reach", all_nvccs(ctx.env) or "none (PATH, CUDA_HOME, /usr/local/cuda, PyPI toolkit folders)",
          "environment")
    if not effective_nvcc(ctx.env) and not aot["covers"]:
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_PACKAGE
        v.cause = (f"its kernels are JIT-compiled and this environment has no nvcc in reach (PATH, CUDA_HOME, the PyPI "
                   f"toolkit folders) and no ahead-of-time build ({aot['cause']})")
        v.lift_detail = (f"install nvcc (a CUDA devel base image, CUDA >= 12.8), or a flashinfer-jit-cache holding "
                         f"{aot['module'] or 'the module'} with SASS for {ctx.target.cc} (the flashinfer node's method aot)")
        return v
    if aot["covers"]:
        v.cause = (f"FlashInfer has it, no arch restriction, compiled ahead of time ({aot['cause']})"
                   + (f"; {order} ({order_where}), whatever nvcc is in reach" if order else "")
                   + ": no JIT needed; a PCIe-native candidate (the library's answer)")
    else:
        v.cause = "FlashInfer has it, no arch restriction, nvcc available: a PCIe-native candidate (the library's answer)"
    return v


BACKENDS = (PCIE_IPC,)
RUNTIME = {"library": (PCIE_IPC,), "engine": ("sglang-pcie-ipc",)}
PCIE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
OPT_IN = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"


def library_gate(ctx) -> list[Verdict]:
    return [_library(ctx)]


def engine_gate(ctx) -> list[Verdict]:
    return sa.answer(BACKENDS[0], ctx, _engine)


def _engine(ctx, eng) -> Verdict:
    import ast
    import os

    if not eng.references("PcieIpc", "pcie_ipc"):
        return se.not_integrated(BACKENDS[0], eng, ("PcieIpc", "pcie_ipc"), ctx)
    fn = eng.function(PCIE_FILE, "eligible_group")
    if OPT_IN not in ast.unparse(fn):
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{PCIE_FILE}: eligible_group no longer "
                              f"reads {OPT_IN}")
    default, where_env = se.env_flag(eng, OPT_IN)
    given = ctx.server_config.var(OPT_IN)
    on = se.env_truthy(given) if given is not None else bool(default)
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    ans.add(se.Gate(f"opt-in {OPT_IN}", on, f"sglang/{PCIE_FILE}:{fn.lineno} eligible_group; {where_env}", GATE_SETTING,
                    f"SGLang builds the PCIe IPC communicator only when {OPT_IN} is set (default {default}; "
                    f"in the configuration asked about: {given if given is not None else 'unset'})", LIFT_SETTING,
                    f"{OPT_IN}=1 in the server's environment", value={"default": default, "configured": given},
                    flag=OPT_IN, opt_in=not bool(default), configured=on))
    if os.environ.get(OPT_IN) is not None and given is None:
        ans.gates[-1].value["this process"] = os.environ[OPT_IN]
    ans.add(se.Gate("world size > 1", ctx.world_size > 1, f"sglang/{PCIE_FILE}:{fn.lineno} eligible_group", GATE_PYTHON,
                    "a single GPU has no peers", LIFT_NONE_NEEDED, value=ctx.world_size, on_fail="decline"))
    tree = eng.tree(PCIE_FILE)
    short = f"sglang/{PCIE_FILE}"
    sizes, line, why = sglang_pcie_ipc.supported_sizes(tree)
    if sizes is None and not line:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at {short}: {why}")
    if sizes is None:      # computed where SGLang imports it: never the numbers that happen to be in its expression
        raise se.NotAssessed(f"not assessed: sglang {eng.version} {short}:{line}: {why}")
    ans.add(se.Gate("supported world sizes", ctx.world_size in sizes, f"{short}:{line} _SUPPORTED_WORLD_SIZES",
                    GATE_PYTHON, f"the PCIe IPC communicator supports world sizes {sorted(sizes)}, not {ctx.world_size}",
                    LIFT_PACKAGE, value=sorted(sizes), on_fail="decline"))
    det = pcie_det.deterministic_gate(ctx, eng, fn, tree)
    if det is not None:
        ans.add(det)
    v = ans.verdict(f"SGLang {eng.version} builds FlashInfer's PCIe IPC allreduce for the tp group")
    for what, value, where in _conditions(ctx, tree, fn, short):
        v.add(what, value, where)
        v.warnings.append(f"{what}: {value} ({where})")
        if what == "message-size cap" and v.is_open:
            v.cause += f"; once on, {value} ({where})"
    from ..engines.sglang.dispatch import DecodeTensor
    hidden = DecodeTensor.from_workload().hidden
    for claim in pcie_det.upstream_claims(eng.file(PCIE_FILE), tree):
        measured = re.search(r"hidden\s+(\d+)", claim["context"])
        v.add(f"upstream's claim: {claim['context'][:90]}", {**{k: claim[k] for k in ("header", "rows", "context")},
                                                            "hidden": int(measured.group(1)) if measured else None,
                                                            "workload_hidden": hidden},
              f"{short}:{claim['lines']} (module docstring; upstream's claim, not measured by this suite)")
    _setup_and_settings(ctx, eng, v)
    return v


def _setup_and_settings(ctx, eng, v: Verdict) -> None:
    """What a user needs beside the opt-in (issue 39 points 3 and 4), from :func:`.pcie_ipc_engine.setup_fallback`
    and :func:`.pcie_ipc_engine.do_not_set`: a failed set-up is caught (the server starts on NCCL with one warning),
    the log lines that confirm the path served, the flag that skips FlashInfer's tuning, and the settings that take
    the path away once it is on. Added to the cause of an open answer; evidence always."""
    fb = pcie_det.setup_fallback(eng)
    v.add("set-up failure: caught, the server stays on NCCL with one warning", fb["caught"],
          "; ".join(c["where"] for c in fb["caught"]))
    v.add("how to confirm it served: log lines printed only when the step worked", fb["confirm"],
          "; ".join(c["where"] for c in fb["confirm"]))
    if fb["autotune_flag"]:
        v.add("autotune switch", fb["autotune_flag"]["flag"], fb["autotune_flag"]["where"])
    try:
        avoid = pcie_det.do_not_set(eng, ctx)
    except (se.GateNotFound, LookupError) as e:
        avoid = [{"setting": "not assessed", "then": str(e), "also_sets": []}]
    v.add("do not set with it", avoid, "SGLang's dispatch read with the opt-in and each setting it consults added "
          "(stackprobe.probes.pcie_ipc_engine.do_not_set)")
    if not v.is_open:
        return
    first = fb["caught"][0]
    lines = "; ".join(f"'{c['line']}' ({c['where']})" for c in fb["confirm"])
    v.cause += (f"; if its set-up fails SGLang catches it ({', '.join(c['where'] for c in fb['caught'])}) and the "
                f"server starts on NCCL with one warning ('{first['warning']}'): confirm it served by the log lines "
                f"{lines}")
    if fb["autotune_flag"]:
        v.cause += (f"; {fb['autotune_flag']['flag']} ({fb['autotune_flag']['where']}) skips the per-shape tuning "
                    "FlashInfer expects once per machine (the kernels then keep its seed policy)")
    claimed = [a for a in avoid if not unassessed_entry(a)]
    if claimed:
        v.cause += "; do not set with it: " + "; ".join(
            f"{a['setting']} ({a.get('note') or a['then'] + ' serves instead'}"
            + (f"; it also sets {', '.join(a['also_sets'])}" if a.get("also_sets") else "") + ")" for a in claimed)
    unread = [a for a in avoid if unassessed_entry(a)]
    if unread:      # their effect was not read: never advice
        v.cause += "; not assessed with it: " + "; ".join(f"{a['setting']} ({a.get('note') or a.get('then')})"
                                                            for a in unread)


def _module_literal_strings_or_ints(tree, name: str):
    """``(values, line)`` of a module-level ``name = <literal tuple/list/set>`` or ``frozenset(<literal>)`` /
    ``set(...)`` / ``tuple(...)`` / ``list(...)`` of one, else None; a computed value gives ``(None, line)`` (never
    the constants that happen to appear in its expression)."""
    import ast

    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(tg, ast.Name) and tg.id == name for tg in node.targets):
            expr = node.value
            if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
                    and expr.func.id in ("frozenset", "set", "tuple", "list") and len(expr.args) == 1 and not expr.keywords):
                expr = expr.args[0]
            try:
                vals = ast.literal_eval(expr)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None, node.lineno
            if not isinstance(vals, (tuple, list, set, frozenset)):
                return None, node.lineno
            return list(vals), node.lineno
    return None


def _conditions(ctx, tree, eligible, short: str) -> list[tuple[str, str, str]]:
    """The conditions past the opt-in that SGLang 0.5.23 applies, read from ``pcie_ipc_ar.py`` where found:
    the eligible group names, deterministic inference turning it off, bf16 only per call, and the silent NCCL
    fallback when FlashInfer's workspace (whose kernels JIT-build at first use) fails."""
    import ast

    out = []
    groups = _module_literal_strings_or_ints(tree, "_ELIGIBLE_GROUP_NAMES")
    if groups is not None and groups[0] is None:
        out.append(("eligible process groups", "not assessed: _ELIGIBLE_GROUP_NAMES is computed where SGLang imports "
                    "it, not a literal; which groups PCIe IPC serves is not read", f"{short}:{groups[1]} _ELIGIBLE_GROUP_NAMES"))
    elif groups is not None:
        out.append(("eligible process groups", f"only {sorted(groups[0])} (other groups stay on NCCL)",
                    f"{short}:{groups[1]} _ELIGIBLE_GROUP_NAMES"))
    det = next((n for n in ast.walk(eligible) if isinstance(n, ast.If) and ast.unparse(n.test) == "deterministic"
                and any(isinstance(r, ast.Return) for r in n.body)), None)
    if det is not None:
        out.append(("deterministic inference", "--enable-deterministic-inference turns it off", f"{short}:{det.lineno}"))
    fns = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    should = fns.get("should_pcie_ipc_ar")
    if should is not None:
        bf16 = next((n for n in ast.walk(should) if isinstance(n, ast.Compare) and "torch.bfloat16" in ast.unparse(n)), None)
        if bf16 is not None:
            out.append(("dtype", "bf16 only: other dtypes stay on NCCL", f"{short}:{bf16.lineno} should_pcie_ipc_ar"))
    ensure = fns.get("_ensure_workspace")
    cap = _size_cap(ensure, should)
    if cap is not None:
        out.append(("message-size cap", cap[0], f"{short}:{cap[1]}"))
    if ensure is not None:
        h = next((h for n in ast.walk(ensure) if isinstance(n, ast.Try) for h in n.handlers
                  if "self.disabled = True" in ast.unparse(h)), None)
        if h is not None:
            aot = fi.aot_module("gen_pcie_ipc_comm_module", ctx.target)
            if aot["covers"]:
                how = (f"its module is provided ahead of time ({aot['file']} in {fi.JIT_CACHE_DIST} "
                       f"{aot['dist_version']}), so no JIT build is involved")
            else:
                how = ("its kernels JIT-build at first use: nvcc or a flashinfer-jit-cache needed"
                       + ("" if effective_nvcc(ctx.env) else "; this environment has no nvcc"))
            out.append(("workspace build failure", f"a failed FlashInfer workspace disables it and reductions silently "
                        f"stay on NCCL ({how})", f"{short}:{h.lineno} _ensure_workspace"))
    return out


def _size_cap(ensure, should) -> tuple[str, str] | None:
    """(text, "L1-L2, :L3") of the decode-width cap, read from SGLang 0.5.23's ``_ensure_workspace`` (the
    workspace is sized ``max_numel = width * hidden`` from the decode width, or the environment override
    ``SGLANG_PCIE_IPC_MAX_NUMEL``) and ``should_pcie_ipc_ar`` (``inp.numel() > self.max_numel`` returns False):
    reductions larger than that (prefill) stay on NCCL. None when either part is not found."""
    import ast

    if ensure is None or should is None:
        return None
    env = next((n for n in ast.walk(ensure) if isinstance(n, ast.Attribute) and n.attr.endswith("_MAX_NUMEL")), None)
    width = next((n for n in ast.walk(ensure) if isinstance(n, ast.Assign) and "max_numel" in ast.unparse(n.targets[0])
                  and "hidden" in ast.unparse(n.value)), None)
    cmp = next((n for n in ast.walk(should) if isinstance(n, ast.Compare) and "numel()" in ast.unparse(n.left)
                and "max_numel" in ast.unparse(n.comparators[0])), None)
    if env is None or width is None or cmp is None:
        return None
    return (f"only reductions up to the decode width x hidden elements use it (`{ast.unparse(width)}`; "
            f"{env.attr} overrides); larger ones, prefill's, stay on NCCL",
            f"{env.lineno}-{width.lineno} _ensure_workspace, :{cmp.lineno} should_pcie_ipc_ar `{ast.unparse(cmp)}`")


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
