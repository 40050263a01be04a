"""SGLang's PCIe IPC allreduce, the parts past the opt-in (read from the installed source with ``ast``):

* :func:`deterministic_gate` (case C38): ``GroupCoordinator`` builds the communicator only when
  ``eligible_group(..., deterministic=...)`` admits the group, and ``eligible_group`` returns False when
  deterministic collectives are on (sglang 0.5.23 ``pcie_ipc_ar.py:110``). What "deterministic" means is read
  from the function passed there (0.5.23 ``GroupCoordinator._deterministic_collectives_enabled``,
  ``parallel_state.py:1358``: ``SGLANG_USE_1STAGE_ALLREDUCE`` when it is set, else
  ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``, which ``--enable-deterministic-inference`` sets,
  ``srt/arg_groups/serving_hook.py:444``). That mode also sets ``NCCL_ALGO=allreduce:tree`` for TP > 1
  (``srt/arg_groups/attention_hook.py:676``), which is where the tensor then goes;
* :func:`upstream_claims`: the figures upstream gives in the module docstring of ``pcie_ipc_ar.py`` (its RST
  tables, with the sentence before each), cited as upstream's claim with file and lines, never as a measurement.
"""
from __future__ import annotations

import ast
import re

from ..verdict import GATE_SETTING, LIFT_SETTING
from . import sglang_engine as se

STATE_FILE = "srt/distributed/parallel_state.py"
PCIE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
DET_FLAG = "--enable-deterministic-inference"


def _envs_read(fn: ast.AST) -> list[tuple[str, str, int]]:
    """(variable, "is_set" | "get", line) of every ``envs.NAME.is_set()`` / ``envs.NAME.get()`` in ``fn``, in order."""
    out = []
    for n in ast.walk(fn):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("is_set", "get")
                and isinstance(n.func.value, ast.Attribute) and getattr(n.func.value.value, "id", "") == "envs"):
            out.append((n.func.value.attr, n.func.attr, n.lineno))
    out.sort(key=lambda t: t[2])
    seen: dict[str, tuple[str, str, int]] = {}
    for var, how, line in out:      # one entry per variable: is_set() wins (its get() is the same variable's value)
        if var not in seen or how == "is_set":
            seen[var] = (var, how, seen[var][2] if var in seen else line)
    return sorted(seen.values(), key=lambda t: t[2])


def _arg_group_line(eng, pred) -> str:
    """``sglang/FILE:LINE`` of the first node under SGLang's argument files satisfying ``pred``, else ""."""
    from .. import source

    for path in se._arg_sources(eng):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        for n in ast.walk(tree):
            if pred(n):
                return f"{se.short(path)}:{n.lineno}"
    return ""


def deterministic_gate(ctx, eng, eligible: ast.FunctionDef, pcie_tree: ast.Module) -> se.Gate | None:
    """The gate "deterministic collectives off" for the configuration asked about, or None when this release's
    ``eligible_group`` has no ``deterministic`` parameter (nothing to read). Raises GateNotFound when it has one
    but the call in ``parallel_state.py`` or the function deciding it cannot be read."""
    if "deterministic" not in [a.arg for a in eligible.args.args + eligible.args.kwonlyargs]:
        return None
    pcie = f"sglang/{PCIE_FILE}"
    off = next((n for n in ast.walk(eligible) if isinstance(n, ast.If) and ast.unparse(n.test) == "deterministic"
                and any(isinstance(r, ast.Return) for r in n.body)), None)
    tree = eng.tree(STATE_FILE)
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "eligible_group"),
                None)
    kw = next((k.value for k in (call.keywords if call else []) if k.arg == "deterministic"), None)
    name = kw.func.attr if isinstance(kw, ast.Call) and isinstance(kw.func, ast.Attribute) else None
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None) if name else None
    reads = _envs_read(fn) if fn is not None else []
    if off is None or fn is None or not reads:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{STATE_FILE}: eligible_group takes "
                              "`deterministic` but the call passing it, the function deciding it, or the variables it "
                              "reads were not found")
    sc = ctx.server_config
    det, why = False, "off"
    # variables in the order the function reads them: one checked with is_set() decides alone when given
    for var, how, line in reads:
        given = sc.var(var)
        if how == "is_set":
            if given is not None:
                det, why = se.env_truthy(given), f"{var}={given} is set, so it decides (sglang/{STATE_FILE}:{line})"
                break
            continue
        flag_sets = _arg_group_line(eng, lambda n, v=var: isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                    and n.func.attr == "set" and getattr(n.func.value, "attr", "") == v
                                    and "enable_deterministic_inference" in ast.unparse(n))
        if given is not None:
            det, why = se.env_truthy(given), f"{var}={given} (sglang/{STATE_FILE}:{line})"
        elif se.configured(ctx, DET_FLAG):
            det, why = True, f"{DET_FLAG} sets {var} ({flag_sets or 'srt/arg_groups'}; read at sglang/{STATE_FILE}:{line})"
        break
    tree_at = _arg_group_line(eng, lambda n: isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript)
                              and "os.environ" in ast.unparse(n.targets[0].value) and "NCCL_ALGO" in ast.unparse(n.targets[0])
                              and isinstance(n.value, ast.Constant))
    falls_to = se.NCCL_FALLBACK
    if det and tree_at and why.startswith(DET_FLAG):
        falls_to += f", which that mode runs with NCCL_ALGO=allreduce:tree ({tree_at})"
    where = (f"{pcie}:{off.lineno} `if deterministic: return False` in eligible_group; sglang/{STATE_FILE}:{call.lineno} "
             f"eligible_group(deterministic={ast.unparse(kw)}); sglang/{STATE_FILE}:{fn.lineno} {name}")
    return se.Gate("deterministic collectives off", not det, where, GATE_SETTING,
                   f"deterministic collectives are on ({why}): eligible_group returns False and the PCIe IPC "
                   "communicator is not built", LIFT_SETTING,
                   f"leave {DET_FLAG} and {' / '.join(v for v, _, _ in reads if v != 'SGLANG_ENABLE_DETERMINISTIC_INFERENCE')}=1 "
                   "unset (deterministic inference keeps PCIe IPC off)",
                   value={"deterministic": det, "decided by": why, "variables read": [v for v, _, _ in reads],
                          "NCCL_ALGO set by that mode": tree_at or "not found"},
                   on_fail="decline", falls_to=falls_to)


_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")


def upstream_claims(path, tree: ast.Module) -> list[dict]:
    """The RST simple tables of the module docstring of ``path`` (``tree`` parsed from it): ``[{"context": the
    paragraph before the table, "header": [...], "rows": [[...], ...], "lines": "L1-L2"}]`` with file lines.
    [] when the module has no docstring or no table."""
    if not (tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant)
            and isinstance(tree.body[0].value.value, str)):
        return []
    node = tree.body[0]
    first = node.lineno          # the line holding the opening quotes and the docstring's first line
    lines = node.value.value.splitlines()
    out, i = [], 0
    while i < len(lines):
        if not _BORDER.match(lines[i]):
            i += 1
            continue
        start, borders, rows = i, [i], []
        j = i + 1
        while j < len(lines) and lines[j].strip() and len(borders) < 3:
            if _BORDER.match(lines[j]):
                borders.append(j)
            else:
                rows.append(re.split(r"\s{2,}", lines[j].strip()))
            j += 1
        if len(borders) < 3 or not rows:
            i = j
            continue
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        para = []
        while k >= 0 and lines[k].strip() and not _BORDER.match(lines[k]) and not set(lines[k].strip()) <= set("-="):
            para.insert(0, lines[k].strip())
            k -= 1
        sentences = re.split(r"(?<=[.!?])\s+", " ".join(para))
        context = next((x for x in reversed(sentences) if "easured" in x), sentences[-1] if sentences else "")
        out.append({"context": context, "header": rows[0], "rows": rows[1:],
                    "lines": f"{first + start}-{first + borders[-1]}"})
        i = j
    return out
