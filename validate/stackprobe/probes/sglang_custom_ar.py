"""SGLang custom allreduce.

Library gate (:func:`library_gate`): the kernels, in sgl-kernel / sglang-kernel's ``common_ops``, carry
SASS for the target (static coverage).

Engine gate (:func:`engine_gate`, read from the installed SGLang with ``ast``; FACTS):

1. on by default (``--disable-custom-all-reduce`` turns it off);
2. ``CustomAllreduce._SUPPORTED_WORLD_SIZES``;
3. the init rule ``if world_size > N and not full_nvlink`` (``custom_all_reduce_utils.py`` in 0.5.23):
   disabled on PCIe beyond N GPUs; SGLang's JIT "v2" path needs full NVLink outright;
4. the per-call check ``should_custom_ar`` (``world_size == 2 or full_nvlink``).
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
from . import sglang_engine as se

BACKENDS = ("sglang-custom-allreduce",)
RUNTIME = {"library": (), "engine": ("sglang-custom-allreduce",)}
KERNEL_DISTS = ("sglang-kernel", "sgl-kernel")
CA_FILE = "srt/distributed/device_communicators/custom_all_reduce.py"


def sglang_root() -> Path | None:
    return source.package_dir("sglang")


short = se.short


def find_pcie_world_size_rule(root: Path) -> tuple[int, str] | None:
    """(N, "file:line `test`") of the first ``world_size > N and not <...nvlink...>`` test under
    ``root/srt/distributed``, or None."""
    base = root / "srt" / "distributed"
    for p in source.find_files_containing(base if base.is_dir() else root, "nvlink"):
        try:
            tree = source.parse(p)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)):
                continue
            limit, nvl = None, False
            for val in node.test.values:
                if (isinstance(val, ast.Compare) and isinstance(val.left, ast.Name) and val.left.id == "world_size"
                        and isinstance(val.ops[0], ast.Gt) and isinstance(val.comparators[0], ast.Constant)):
                    limit = val.comparators[0].value
                if isinstance(val, ast.UnaryOp) and isinstance(val.op, ast.Not) and "nvlink" in ast.unparse(val.operand).lower():
                    nvl = True
            if limit is not None and nvl:
                return int(limit), f"{short(p)}:{node.lineno} `{ast.unparse(node.test)}`"
    return None


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
    v.cause = f"{dist}'s common_ops carries SASS for {ctx.target.cc}"
    return [v]


def engine_gate(ctx) -> list[Verdict]:
    return se.answer(BACKENDS[0], ctx, _engine)


def _engine(ctx, eng) -> Verdict:
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    path = eng.file(CA_FILE)
    ans.add(se.server_argument_gate(eng, ("--disable-custom-all-reduce",), on_when=False))
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
    fns = source.functions(eng.tree(CA_FILE))
    per_call = fns.get("should_custom_ar")
    if per_call is not None:
        txt = ast.unparse(per_call)
        ans.add(se.Gate("per-call check should_custom_ar", ok, f"{short(path)}:{per_call.lineno} should_custom_ar",
                        GATE_TOPOLOGY, "should_custom_ar sends nothing through it unless world_size == 2 or full NVLink",
                        LIFT_NOTHING, value="world_size == 2 or full_nvlink" if "full_nvlink" in txt else "read"))
    return ans.verdict(f"SGLang {eng.version} admits world size {ctx.world_size} on {ctx.topology} "
                       "(custom allreduce is on by default)")


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
