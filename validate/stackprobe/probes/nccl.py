"""NCCL Ring (the baseline) and NCCL Tree: static part.

What a static tier can say about Tree (case C12; FACTS, measured on NCCL 2.28.9): ``NCCL_ALGO=Tree``
is process-wide, and AllGather / ReduceScatter have no Tree algorithm, so a serving engine that captures
all three collectives in CUDA graphs fails with ncclInvalidUsage ("no algorithm/protocol available for
function AllGather ... NCCL_ALGO was set to Tree"); the per-collective form ``NCCL_ALGO=allreduce:tree``
leaves the others alone. On one node NCCL's "tree" is a chain, so whether it beats Ring is a
measurement: the runtime tier decides.
"""
from __future__ import annotations

import os

from .. import gates
from ..verdict import (BLOCKED, GATE_NEEDS_RUNTIME, GATE_NOT_INSTALLED, GATE_PASSES, GATE_SETTING, LIFT_NONE_NEEDED,
                       LIFT_SETTING, LIFT_UNKNOWN, SCOPE_LIBRARY, SKIPPED, Verdict)

BACKENDS = ("nccl-ring", "nccl-tree")
RUNTIME = {"library": ("nccl-ring", "nccl-tree", "nccl-allreduce-tree"), "engine": ("sglang-pynccl",)}


def _nccl_version(env: dict) -> tuple[str | None, str]:
    n = env.get("nccl", {})
    if n.get("torch"):
        return n["torch"], "torch.cuda.nccl.version()"
    if n.get("library"):
        return n["library"], f"ncclGetVersion() of {n.get('library_path')}"
    if n.get("wheel"):
        return n["wheel"], "nvidia-nccl wheel metadata"
    return None, ""


def _process_wide_tree(value: str) -> bool:
    """True when NCCL_ALGO selects Tree for every collective (no ``coll:algo`` form)."""
    v = value.strip().lower()
    if not v or ":" in v:
        return False
    algos = {a.strip() for a in v.lstrip("^").split(",")}
    return not v.startswith("^") and algos == {"tree"}


def library_gate(ctx) -> list[Verdict]:
    version, source = _nccl_version(ctx.env)
    algo = os.environ.get("NCCL_ALGO", "")
    out = []
    ring = Verdict("nccl-ring", GATE_PASSES, lift=LIFT_NONE_NEEDED,
                   cause="NCCL is present; Ring is the baseline every other backend is measured against.")
    # Tree is switched on by a setting; whether it is worth it is the runtime tier's measurement
    tree = Verdict("nccl-tree", SKIPPED, gate=GATE_NEEDS_RUNTIME, lift=LIFT_SETTING,
                   cause="Tree's speed on one node (a chain, not a tree) is a measurement; "
                         "the static tier only checks the setting's form.",
                   lift_detail="NCCL_ALGO=allreduce:tree in the server's environment (the per-collective form leaves "
                               "AllGather/ReduceScatter on their own algorithms), then measure it against Ring")
    sg = _sglang_sets_tree()
    if sg is not None:
        tree.add("SGLang sets NCCL_ALGO itself", "--enable-deterministic-inference with TP > 1 sets "
                 "NCCL_ALGO=allreduce:tree in the server process", sg)
        tree.lift_detail += f"; or --enable-deterministic-inference, which sets it ({sg})"
    if version is None:
        err = ctx.env.get("torch", {}).get("nccl_error") or ctx.env.get("torch", {}).get("import_error", "")
        for v in (ring, tree):
            v.scope = SCOPE_LIBRARY
            v.status, v.gate, v.lift = SKIPPED, GATE_NOT_INSTALLED, LIFT_UNKNOWN
            v.cause = "no NCCL in this environment (torch without NCCL and no nvidia-nccl wheel)"
            v.add("torch NCCL query", err, "torch.cuda.nccl.version()")
        return [ring, tree]
    for v in (ring, tree):
        v.add("NCCL version", version, source)
        v.add("NCCL_ALGO", algo or "(unset)", "environment")
    if algo and _process_wide_tree(algo):
        tree.status, tree.gate, tree.lift = BLOCKED, GATE_SETTING, LIFT_SETTING
        tree.cause = (f"NCCL_ALGO={algo} is process-wide: AllGather and ReduceScatter have no Tree algorithm, so "
                      "capturing them in CUDA graphs fails with ncclInvalidUsage (case C12)")
        ring.warnings.append(f"NCCL_ALGO={algo} in the environment also forces Tree on this baseline's process")
    elif algo:
        tree.add("NCCL_ALGO form", "per-collective or exclusion list: other collectives keep their algorithms", "environment")
    gates.nccl_library_gate(ctx, [ring, tree], version)   # libnccl coverage + known-bad data (C26)
    out += [ring, tree]
    for v in out:
        v.scope = SCOPE_LIBRARY
    return out


def _sglang_sets_tree() -> str | None:
    """``sglang/FILE:LINE`` where the installed SGLang assigns ``os.environ["NCCL_ALGO"] = "allreduce:tree"``
    (0.5.9 ``srt/server_args.py:2791``, 0.5.23 ``srt/arg_groups/attention_hook.py:676``, under deterministic
    inference), or None (no SGLang, or no such assignment)."""
    import ast

    from ..engines.sglang import engine as se

    eng = se.installed()
    if eng is None:
        return None
    for path in sorted((eng.root / "srt").rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
            if "allreduce:tree" not in text:
                continue
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            continue
        for n in ast.walk(tree):
            if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value == "allreduce:tree"
                    and any(isinstance(tg, ast.Subscript) and "NCCL_ALGO" in ast.unparse(tg) for tg in n.targets)):
                return f"{se.short(path)}:{n.lineno}"
    return None


def engine_gate(ctx) -> list[Verdict]:
    """NCCL is SGLang's fallback for every allreduce (pynccl): no engine gate of its own is read here."""
    return []


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
