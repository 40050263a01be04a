"""torch symmetric memory as SGLang uses it (case C11).

SGLang's ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES`` is a dict keyed by compute-capability major; it is read
from the installed sglang with ``ast`` (wherever it lives) and the target's major looked up. How sglang
looks it up decides the symptom: a subscript raises ``KeyError: 12``, ``.get`` disables the
communicator with a warning; either way it is a Python-table gate that no CUDA upgrade lifts (FACTS).
Past it, ``multicast_ptr == 0`` on PCIe (topology); ``two_shot_all_reduce_`` needs only P2P.
torch's side: ``torch.ops.symm_mem`` one_shot_all_reduce / two_shot_all_reduce_.
"""
from __future__ import annotations

import ast

from .. import source
from ..env import dist_version
from ..verdict import (BLOCKED, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, LIFT_NONE_NEEDED, LIFT_PACKAGE,
                       SKIPPED, Verdict)
from .sglang_custom_ar import sglang_root, short

BACKENDS = ("torch-symm-mem",)
TABLE = "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"


def lookup_style(root) -> tuple[str, str]:
    """("get" | "subscript" | "unknown", "file:line") of how sglang indexes the table."""
    for p in source.find_files_containing(root, TABLE):
        try:
            tree = source.parse(p)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == TABLE:
                return "subscript", f"{short(p)}:{node.lineno}"
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == TABLE):
                return "get", f"{short(p)}:{node.lineno}"
    return "unknown", ""


def probe(ctx) -> list[Verdict]:
    v = Verdict("torch-symm-mem", GATE_PASSES, lift=LIFT_NONE_NEEDED)
    torch = ctx.env.get("torch", {})
    ops = torch.get("symm_mem_ops") or {}
    if torch.get("import_error"):
        v.status, v.gate, v.cause = SKIPPED, GATE_NOT_INSTALLED, f"torch does not import: {torch['import_error']}"
        return [v]
    v.add("torch version", torch.get("version"), "torch.__version__")
    v.add("torch.ops.symm_mem ops", ops, "hasattr(torch.ops.symm_mem, ...)")
    missing_ops = [k for k in ("one_shot_all_reduce", "two_shot_all_reduce_") if not ops.get(k)]
    root = sglang_root()
    table_read = False
    if dist_version("sglang") is None or root is None:
        v.add("sglang", "not installed: only torch's ops were checked", "")
    else:
        v.add("sglang version", dist_version("sglang"), "distribution metadata")
        try:
            path, table, line = source.find_assignment(root / "srt" if (root / "srt").is_dir() else root, TABLE)
        except source.SourceNotFound as e:
            v.add(TABLE, None, f"not found in the installed sglang: {e}")
            table = None
        if table is not None:
            table_read = True
            keys = sorted(table)
            style, where = lookup_style(root)
            v.add(f"{TABLE} keys (compute-capability majors)", keys, f"{short(path)}:{line} (ast)")
            v.add("lookup", style, where)
            if ctx.target.major not in table:
                symptom = (f"`KeyError: {ctx.target.major}`" if style == "subscript" else
                           "the communicator disables itself with a warning (it looks the major up with .get())"
                           if style == "get" else f"the `KeyError: {ctx.target.major}` class")
                v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
                v.cause = (f"SGLang's {TABLE} ({short(path)}:{line}) has keys {keys} only: no entry for major "
                           f"{ctx.target.major}, so {symptom}; no CUDA upgrade lifts a Python table")
                v.lift_detail = (f"an sglang release whose table has key {ctx.target.major}; beyond it, multicast_ptr == 0 on "
                                 "PCIe (topology); torch's two_shot_all_reduce_ needs only P2P")
                return [v]
            sizes = table[ctx.target.major]
            v.add(f"{TABLE}[{ctx.target.major}] world sizes", sorted(sizes) if isinstance(sizes, dict) else sizes, f"{short(path)}:{line}")
            if isinstance(sizes, dict) and ctx.world_size not in sizes:
                v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
                v.cause = f"{TABLE}[{ctx.target.major}] has no entry for world size {ctx.world_size}"
                return [v]
    if missing_ops:
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = f"this torch lacks torch.ops.symm_mem {missing_ops}"
        v.lift_detail = "a torch build with symmetric memory (CUDA, distributed)"
        return [v]
    checked = "SGLang's table admits the target and " if table_read else "sglang is not installed (its table unchecked); "
    v.cause = checked + "torch has the symm-mem ops; multicast on PCIe is for the runtime tier"
    return [v]
