"""SGLang custom allreduce: the installed sglang's world-size / full-NVLink heuristic and the arch
coverage of its kernels (sgl-kernel / sglang-kernel ``common_ops``).

The heuristic is read from the installed source (``ast``): the ``if world_size > N and not
full_nvlink`` test that disables custom allreduce on PCIe beyond N GPUs, and ``CustomAllreduce.
_SUPPORTED_WORLD_SIZES``. Its one-shot kernel writes to all peers at once, which is why it is disabled
on PCIe beyond two GPUs (FACTS): nothing on this topology lifts it; PCIe-native designs (FlashInfer
PCIe IPC allreduce, b12x) are the way out.
"""
from __future__ import annotations

import ast
from pathlib import Path

from .. import source
from ..coverage import SASS_LEVELS
from ..env import dist_version
from ..verdict import (BLOCKED, ERROR, GATE_BINARY, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_TOPOLOGY,
                       LIFT_NONE_NEEDED, LIFT_NOTHING, LIFT_PACKAGE, LIFT_REBUILD, SKIPPED, Verdict)

BACKENDS = ("sglang-custom-allreduce",)
KERNEL_DISTS = ("sglang-kernel", "sgl-kernel")


def sglang_root() -> Path | None:
    return source.package_dir("sglang")


def short(path: Path) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("sglang"):]) if "sglang" in parts else str(path)


def find_pcie_world_size_rule(root: Path) -> tuple[int, str] | None:
    """(N, "file:line") of the first ``world_size > N and not <...nvlink...>`` test under
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


def probe(ctx) -> list[Verdict]:
    v = Verdict("sglang-custom-allreduce", GATE_PASSES, lift=LIFT_NONE_NEEDED)
    ver = dist_version("sglang")
    root = sglang_root()
    if ver is None or root is None:
        v.status, v.gate, v.cause = SKIPPED, GATE_NOT_INSTALLED, "sglang is not installed"
        v.lift, v.lift_detail = LIFT_PACKAGE, "pip install sglang"
        return [v]
    v.add("sglang version", ver, "distribution metadata")
    rule = find_pcie_world_size_rule(root)
    sizes = None
    try:
        path = source.module_file("sglang.srt.distributed.device_communicators.custom_all_reduce")
        sizes, line = source.class_attribute(path, "CustomAllreduce", "_SUPPORTED_WORLD_SIZES")
        v.add("CustomAllreduce._SUPPORTED_WORLD_SIZES", sizes, f"{short(path)}:{line} (ast)")
    except (source.SourceNotFound, ValueError, SyntaxError) as e:
        v.add("CustomAllreduce._SUPPORTED_WORLD_SIZES", None, f"not found: {e}")
    if rule is None:
        v.add("PCIe world-size rule", None, "no `world_size > N and not full_nvlink` test found in sglang/srt/distributed")
    else:
        v.add("PCIe world-size rule", f"disabled when world_size > {rule[0]} without full NVLink", rule[1] + " (ast)")
    v.add("topology", f"{ctx.topology} ({ctx.topology_source}), world size {ctx.world_size}", "environment / CLI")
    dist, cov, ops = kernel_coverage(ctx)
    if cov is not None:
        v.add(f"{dist} common_ops coverage", [(f.path, f.level, f.sass) for f in ops] or cov.level, "static coverage (fatbin)")
    else:
        v.warnings.append("no sgl-kernel / sglang-kernel installed: the custom allreduce kernels are missing")
    if sizes is not None and ctx.world_size not in sizes:
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = f"world size {ctx.world_size} is not in CustomAllreduce._SUPPORTED_WORLD_SIZES {sizes}"
        return [v]
    if rule is not None and ctx.world_size > rule[0] and ctx.topology != "nvlink":
        v.status, v.gate, v.lift = BLOCKED, GATE_TOPOLOGY, LIFT_NOTHING
        v.cause = (f"SGLang disables custom allreduce on more than {rule[0]} GPUs without full NVLink; at world size "
                   f"{ctx.world_size} on {ctx.topology} its one-shot kernel would write to every peer across PCIe")
        v.lift_detail = f"nothing on PCIe beyond {rule[0]} GPUs: use a PCIe-native design (FlashInfer PCIe IPC allreduce, b12x) or TP<={rule[0]}"
        return [v]
    if cov is None:
        v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_PACKAGE
        v.cause = "sgl-kernel / sglang-kernel (the custom allreduce kernels) is not installed"
        return [v]
    if ops and not any(f.level in SASS_LEVELS for f in ops):
        v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_REBUILD
        v.cause = f"{dist}'s common_ops carries no SASS for {ctx.target.cc}: {[f.path for f in ops]}"
        return [v]
    if not ops:
        v.status, v.cause = ERROR, f"{dist} has no common_ops library; cannot tell where the allreduce kernels live"
        return [v]
    v.cause = f"heuristic admits world size {ctx.world_size} on {ctx.topology}; common_ops carries SASS for the target"
    return [v]
