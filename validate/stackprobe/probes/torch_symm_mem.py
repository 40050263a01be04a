"""torch symmetric memory as SGLang uses it (cases C11, C14, C17, C18).

Library gate (:func:`library_gate`): torch's ``torch.ops.symm_mem`` one_shot_all_reduce /
two_shot_all_reduce_ exist in the installed torch.

Engine gate (:func:`engine_gate`, read from the installed SGLang; FACTS "SGLang 0.5.23's own gates"):

1. ``--enable-torch-symm-mem`` (default off);
2. ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES``, a dict keyed by compute-capability major, read with ``ast``
   wherever it lives. How SGLang looks it up decides the symptom: a subscript raises ``KeyError: 12``,
   ``.get`` disables the communicator with a warning; either way a Python table no CUDA upgrade lifts.
   The world size must be a key of the major's entry;
3. ``TorchSymmMemCommunicator.__init__`` disables itself when the rendezvous handle has no multicast
   pointer (``handle.multicast_ptr == 0``): PCIe-only GPUs have no multicast, so even a table with
   key 12 leaves it disabled there (C14).
A table that moved (into a class, another name) is an error naming sglang's version and the file (C17).
"""
from __future__ import annotations

import ast

from .. import source
from ..verdict import (BLOCKED, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_TOPOLOGY, LIFT_NONE_NEEDED,
                       LIFT_NOTHING, LIFT_PACKAGE, SCOPE_LIBRARY, SKIPPED, Verdict)
from ..engines.sglang import answer as sa
from ..engines.sglang import engine as se

BACKENDS = ("torch-symm-mem",)
RUNTIME = {"library": ("torch-symm-mem-one-shot", "torch-symm-mem-two-shot"), "engine": ("sglang-torch-symm-mem",)}
TABLE = "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
COMM_FILE = "srt/distributed/device_communicators/torch_symm_mem.py"


def lookup_style(root) -> tuple[str, str]:
    """("get" | "subscript" | "unknown", "file:line") of how sglang indexes the table."""
    for p in source.find_files_containing(root, TABLE):
        try:
            tree = source.parse(p)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == TABLE:
                return "subscript", f"{se.short(p)}:{node.lineno}"
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == TABLE):
                return "get", f"{se.short(p)}:{node.lineno}"
    return "unknown", ""


def library_gate(ctx) -> list[Verdict]:
    v = Verdict("torch-symm-mem", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
    torch = ctx.env.get("torch", {})
    ops = torch.get("symm_mem_ops") or {}
    if torch.get("import_error"):
        v.status, v.gate, v.cause = SKIPPED, GATE_NOT_INSTALLED, f"not installed: torch ({torch['import_error']})"
        return [v]
    v.add("torch version", torch.get("version"), "torch.__version__")
    v.add("torch.ops.symm_mem ops", ops, "hasattr(torch.ops.symm_mem, ...)")
    missing_ops = [k for k in ("one_shot_all_reduce", "two_shot_all_reduce_") if not ops.get(k)]
    if missing_ops:
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = f"this torch lacks torch.ops.symm_mem {missing_ops}"
        v.lift_detail = "a torch build with symmetric memory (CUDA, distributed)"
        return [v]
    v.cause = ("torch has the symm-mem ops (one-shot needs multicast; two_shot_all_reduce_ needs only P2P): "
               "the library's answer, SGLang's table and multicast check are the engine answer")
    return [v]


def engine_gate(ctx) -> list[Verdict]:
    return sa.answer(BACKENDS[0], ctx, _engine)


def _engine(ctx, eng) -> Verdict:
    if not eng.references("TorchSymmMemCommunicator", "symm_mem"):
        return se.not_integrated(BACKENDS[0], eng, ("TorchSymmMemCommunicator",), ctx)
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    ans.add(se.server_argument_gate(eng, ("--enable-torch-symm-mem",), ctx=ctx))
    base = eng.root / "srt" if (eng.root / "srt").is_dir() else eng.root
    try:
        path, table, line = source.find_assignment(base, TABLE)
    except source.SourceNotFound as e:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/srt: no module-level {TABLE} "
                              f"(a literal table keyed by compute-capability major; {e})") from e
    if not isinstance(table, dict):
        raise se.GateNotFound(f"gate not readable in sglang {eng.version} at {se.short(path)}:{line}: {TABLE} is not a dict")
    keys = sorted(table)
    style, where = lookup_style(eng.root)
    where_t = f"{se.short(path)}:{line}"
    has_major = ctx.target.major in table
    symptom = (f"`KeyError: {ctx.target.major}`" if style == "subscript" else
               "the communicator disables itself with a warning (it looks the major up with .get())"
               if style == "get" else f"the `KeyError: {ctx.target.major}` class")
    g = ans.add(se.Gate(f"{TABLE} keys (compute-capability majors)", has_major,
                        f"{where_t} (ast); lookup {style} at {where}", GATE_PYTHON,
                        f"{TABLE} has keys {keys} only: no entry for major {ctx.target.major}, so {symptom}; "
                        "no CUDA upgrade lifts a Python table", LIFT_PACKAGE,
                        f"an sglang release whose {TABLE} has key {ctx.target.major}", value=keys))
    _table_consequence(eng, g, style, ctx.target.major)
    if has_major:
        sizes = table[ctx.target.major]
        sizes_list = sorted(sizes) if isinstance(sizes, dict) else sizes
        ok = not isinstance(sizes, dict) or ctx.world_size in sizes
        ans.add(se.Gate(f"{TABLE}[{ctx.target.major}] world sizes", ok, where_t, GATE_PYTHON,
                        f"{TABLE}[{ctx.target.major}] has no entry for world size {ctx.world_size} (has {sizes_list})",
                        LIFT_PACKAGE, f"an sglang release whose table admits world size {ctx.world_size}", value=sizes_list))
    # the multicast check in the communicator's constructor
    tree = eng.tree(COMM_FILE)
    mc = None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "multicast_ptr"
                and isinstance(node.ops[0], ast.Eq)):
            mc = node
            break
    if mc is None:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{COMM_FILE}: no `multicast_ptr == 0` "
                              "check in TorchSymmMemCommunicator")
    multicast = ctx.topology == "nvlink"
    ans.add(se.Gate("multicast pointer check", multicast, f"sglang/{COMM_FILE}:{mc.lineno} `{ast.unparse(mc)}`",
                    GATE_TOPOLOGY, f"the communicator disables itself when the symmetric-memory handle has no multicast "
                    f"pointer, before choosing a kernel; {ctx.topology} GPUs have no multicast", LIFT_NOTHING,
                    f"nothing on {ctx.topology}: past SGLang's {TABLE} table the communicator needs multicast "
                    "(an NVSwitch/NVLink system); outside SGLang, torch's two_shot_all_reduce_ needs only P2P",
                    value=f"topology {ctx.topology} ({ctx.topology_source})", on_fail="decline"))
    return ans.verdict(f"SGLang {eng.version}'s table admits major {ctx.target.major} at world size {ctx.world_size} "
                       "and the host has multicast; enable it with --enable-torch-symm-mem")


def _table_consequence(eng, gate, style: str, major: int) -> None:
    """Case C36: what SGLang does when the table has no entry for the target's major. A subscript (0.5.9
    ``torch_symm_mem.py:83``) raises ``KeyError`` inside ``TorchSymmMemCommunicator.__init__``; when
    ``GroupCoordinator`` constructs it outside a ``try`` that catches KeyError (0.5.9 ``parallel_state.py:384``),
    that is a start-up failure (``on_fail="raise"``). A ``.get`` whose ``None`` is checked (0.5.23
    ``torch_symm_mem.py:80-83``) leaves the communicator disabled: a decline naming that check."""
    from ..engines.sglang import raises as sp

    comm = eng.file(COMM_FILE)
    tree = eng.tree(COMM_FILE)
    if style == "get":
        var = next((n.targets[0].id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Call)
                    and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "get"
                    and getattr(n.value.func.value, "id", "") == TABLE), None)
        check = next((n for n in ast.walk(tree) if var and isinstance(n, ast.If)
                      and ast.unparse(n.test) == f"{var} is None"), None)
        if check is not None:
            gate.on_fail = "decline"
            gate.cause += (f"; the communicator then stays disabled at {se.short(comm)}:{check.lineno} "
                           f"`if {ast.unparse(check.test)}: ... return`")
        return
    if style != "subscript":
        return
    sub = next((n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and getattr(n.value, "id", "") == TABLE), None)
    if sub is None:
        return
    state = eng.root / "srt" / "distributed" / "parallel_state.py"
    site = sp.guarded_call(state, "TorchSymmMemCommunicator", "KeyError", se.short) if state.is_file() else None
    if site is None:
        return
    call_at, caught = site
    if caught:
        gate.on_fail = "decline"
        gate.cause += f"; the KeyError is caught at {caught}"
        return
    gate.on_fail = "raise"
    gate.raises = (f"`KeyError: {major}` from `{ast.unparse(sub)}` at {se.short(comm)}:{sub.lineno} in "
                   f"TorchSymmMemCommunicator.__init__, constructed at {call_at} outside any try that catches it")


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
