"""SGLang's PCIe IPC allreduce, the parts past the opt-in (read from the installed source with ``ast``):

* :func:`deterministic_gate` (case C38): ``GroupCoordinator`` builds the communicator only when
  ``eligible_group(..., deterministic=...)`` admits the group, and ``eligible_group`` returns False when
  deterministic collectives are on (sglang 0.5.23 ``pcie_ipc_ar.py:111``). What "deterministic" means is read
  from the function passed there (0.5.23 ``GroupCoordinator._deterministic_collectives_enabled``,
  ``parallel_state.py:1358``: ``SGLANG_USE_1STAGE_ALLREDUCE`` when it is set, else
  ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``, which SGLang writes from ``--enable-deterministic-inference`` on every
  start-up, ``srt/arg_groups/serving_hook.py:444``, so the variable given alone is not read). That mode also
  sets ``NCCL_ALGO=allreduce:tree`` for TP > 1
  (``srt/arg_groups/attention_hook.py:676``), which is where the tensor then goes;
* :func:`upstream_claims`: the figures upstream gives in the module docstring of ``pcie_ipc_ar.py`` (its RST
  tables, with the sentence before each), cited as upstream's claim with file and lines, never as a measurement.
"""
from __future__ import annotations

import ast
import re
from typing import Any

from .. import source
from ..paths import PCIE_IPC
from ..verdict import GATE_SETTING, LIFT_SETTING
from ..engines.sglang import engine as se
from ..engines.sglang.startup import also_on_holds, arg_trees
from ..engines.sglang.startup import env_write as _env_write
from ..engines.sglang.startup import flag_names as _flag_names
from ..engines.sglang.startup import reads_on as _reads_on
from ..engines.sglang.startup import startup_overwrites

STATE_FILE = "srt/distributed/parallel_state.py"
PCIE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
DET_FLAG = "--enable-deterministic-inference"


def _envs_read(fn: ast.AST) -> list[tuple[str, str, int]]:
    """(variable, "is_set" | "get", line) of every ``envs.NAME.is_set()`` / ``envs.NAME.get()`` in ``fn``, in order."""
    out = []
    for n in source.walk(fn):
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
    for path, tree in arg_trees(eng):
        for n in source.walk(tree):
            if pred(n):
                return f"{se.short(path)}:{n.lineno}"
    return ""


def _read_by_get(ctx, eng, var: str, line: int) -> tuple[bool, str]:
    """(deterministic, why) from the variable ``_deterministic_collectives_enabled`` reads with ``get()``: the user's
    value, unless SGLang overwrites it from a flag at start-up (:func:`startup_overwrites`); the flag given, or turned
    on by SGLang itself where one of its ``also_on`` conditions holds for the configuration
    (:func:`~stackprobe.engines.sglang.startup.also_on_holds`: ``cfg.rl_on_policy_target is not None``,
    ``attention_hook.py:588``). Raises :class:`~stackprobe.engines.sglang.engine.NotAssessed` when such a condition
    cannot be judged from the configuration (never taken as off)."""
    given = ctx.server_config.var(var)
    flag_sets = _arg_group_line(eng, lambda n, v=var: isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                and n.func.attr == "set" and getattr(n.func.value, "attr", "") == v
                                and "enable_deterministic_inference" in ast.unparse(n))
    over = startup_overwrites(eng).get(var)
    if given is not None and over is None:
        return se.env_truthy(given), f"{var}={given} (sglang/{STATE_FILE}:{line})"
    if se.configured(ctx, DET_FLAG):
        return True, f"{DET_FLAG} sets {var} ({flag_sets or 'srt/arg_groups'}; read at sglang/{STATE_FILE}:{line})"
    if over is not None and not se.configured(ctx, over["flag"]):
        held, said = also_on_holds(eng, ctx.server_config, over)
        if held is None:
            raise se.NotAssessed(f"not assessed: whether deterministic collectives keep SGLang {eng.version}'s PCIe IPC "
                                 f"off: {said}")
        if held:
            return True, (f"{DET_FLAG} is on: {said}; it sets {var} ({flag_sets or 'srt/arg_groups'}; read at "
                          f"sglang/{STATE_FILE}:{line})")
    if given is not None and over is not None:
        return False, (f"{var}={given} is not read: SGLang overwrites it from {over['flag']} at start-up "
                       f"({over['set_at']}, run at {over['runs_at']}), and {over['flag']} is not given")
    return False, "off"


def deterministic_gate(ctx, eng, eligible: ast.FunctionDef, pcie_tree: ast.Module) -> se.Gate | None:
    """The gate "deterministic collectives off" for the configuration asked about, or None when this release's
    ``eligible_group`` has no ``deterministic`` parameter (nothing to read). Raises GateNotFound when it has one
    but the call in ``parallel_state.py`` or the function deciding it cannot be read."""
    if "deterministic" not in [a.arg for a in eligible.args.args + eligible.args.kwonlyargs]:
        return None
    pcie = f"sglang/{PCIE_FILE}"
    off = next((n for n in source.walk(eligible) if isinstance(n, ast.If) and ast.unparse(n.test) == "deterministic"
                and any(isinstance(r, ast.Return) for r in n.body)), None)
    tree = eng.tree(STATE_FILE)
    call = next((n for n in source.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "eligible_group"),
                None)
    kw = next((k.value for k in (call.keywords if call else []) if k.arg == "deterministic"), None)
    name = kw.func.attr if isinstance(kw, ast.Call) and isinstance(kw.func, ast.Attribute) else None
    fn = next((n for n in source.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None) if name else None
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
        det, why = _read_by_get(ctx, eng, var, line)
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


# --- what else a user must leave unset beside the opt-in (issue 39 point 4) ---------------------------------------
class _Recording(dict):
    """A dict that records every key asked about (``in``, ``get``): the flags / variables a reader consulted."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: list[str] = []

    def __contains__(self, key):
        self.asked.append(key)
        return super().__contains__(key)

    def get(self, key, default=None):
        self.asked.append(key)
        return super().get(key, default)


def _branch_on(test: ast.AST, dest: str) -> bool:
    """Whether an ``if`` test is the flag itself or an ``and`` / ``or`` of it (``if cfg.<dest>:``, ``if "X" not in
    os.environ or cfg.<dest>:``): its body is the flag's branch. A test passing the flag to a call is not."""
    if isinstance(test, ast.BoolOp):
        return any(_branch_on(v, dest) for v in test.values)
    return (isinstance(test, ast.Attribute) and test.attr == dest) or (isinstance(test, ast.Name) and test.id == dest)


def _value_when_on(eng, value: ast.AST, dest: str, scope: ast.AST) -> str:
    """What ``value`` is with the flag on: a constant as written (``'allreduce:tree'``), the branch of an
    ``a if cfg.<dest> else b`` taken when on, a local name through its assignment in ``scope`` (sglang 0.5.23
    ``nchannels = str(envs.SGLANG_DETERMINISTIC_NCCL_NCHANNELS.get())``: the variable and its default from
    ``srt/environ.py``), else the expression as written."""
    if isinstance(value, ast.IfExp) and _reads_on(value.test, dest):
        value = value.body
    if isinstance(value, ast.Name):
        src = next((n.value for n in source.walk(scope) if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name) and n.targets[0].id == value.id
                    and n.lineno < value.lineno), None)
        if src is not None:
            value = src
    var = next((n.func.value.attr for n in source.walk(value) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and isinstance(n.func.value, ast.Attribute)
                and getattr(n.func.value.value, "id", "") == "envs"), None)
    if var:
        try:
            default, where = se.env_flag(eng, var)
            return f"{var} (default {default}, {where.split(' ', 1)[0]})"
        except se.GateNotFound:
            return var
    return ast.unparse(value)


def _inner_conditions(branches: list, dest: str) -> dict[int, list[str]]:
    """For each statement inside the flag's branch (``branches``: the statements of the ``if cfg.<dest>`` bodies), the
    tests of the ``if`` statements nested in that branch that it sits under and that do not read the flag
    (``"cfg.dcp_size > 1"``; ``"not (...)"`` for an ``else``): the flag alone does not make such a write. sglang
    0.5.23 ``engine.py:1918-1920``: NCCL_GRAPH_MIXING_SUPPORT is written under ``--enable-symm-mem`` only when
    ``cfg.dcp_size > 1``. Keyed by ``id(node)``."""
    out: dict[int, list[str]] = {}

    def visit(node: ast.AST, conds: list[str]) -> None:
        out[id(node)] = conds
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            on = _reads_on(node.test, dest)
            for b in node.body:
                visit(b, conds if on else conds + [test])
            for b in node.orelse:
                visit(b, conds if on else conds + [f"not ({test})"])
            return
        for child in ast.iter_child_nodes(node):
            visit(child, conds)

    for b in branches:
        visit(b, [])
    return out


def _set_by_flag(eng, dest: str, flag_of: dict[str, str] | None = None) -> list[str]:
    """What a flag (attribute ``dest``) sets beside itself, read from SGLang's launch code (``srt/entrypoints/engine.py``)
    and argument files: every environment variable written (``os.environ[...] =``, ``envs.X.set(...)``) in the body
    of an ``if`` whose test is ``cfg.<dest>`` (alone, or in an ``and`` / ``or``: :func:`_branch_on`), or anywhere with a value reading it, as
    ``"NAME=VALUE (sglang/FILE:LINE)"`` with the value taken when the flag is on; and every server field that branch
    declares to a constant (``declare_resolution(..., disable_custom_all_reduce=True)``), for a field of a flag in
    ``flag_of`` (dest -> flag) other than the flag itself, as ``"--flag on|off (sglang/FILE:LINE)"``: the paths it
    switches on or off. sglang 0.5.23 ``--enable-deterministic-inference``: SGLANG_ENABLE_DETERMINISTIC_INFERENCE
    (``serving_hook.py:444``), SGLANG_FLASHINFER_MOE_FUSED_FINALIZE (``:448``), NCCL_ALGO (``attention_hook.py:676``),
    NCCL_MIN/MAX_NCHANNELS (``:697-698``), --disable-custom-all-reduce on (``:683``), --enable-torch-symm-mem off
    (``:691``); ``--enable-symm-mem``: NCCL_CUMEM_ENABLE, NCCL_NVLS_ENABLE (``engine.py:1898-1915``), ...).
    In source order per file."""

    flag_of = flag_of or {}
    paths = [p for p in [eng.root / "srt" / "entrypoints" / "engine.py"] if p.is_file()] + se._arg_sources(eng)
    out = []
    for path in paths:
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        at = se.short(path)
        found: list[tuple[int, str]] = []
        fns = [n for n in source.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for fn in fns:
            branches = [b for n in source.walk(fn) if isinstance(n, ast.If) and _branch_on(n.test, dest) for b in n.body]
            inside = {id(x) for b in branches for x in source.walk(b)}
            extra = _inner_conditions(branches, dest)
            for n in source.walk(fn):
                w = _env_write(n)
                if w is not None and isinstance(n, ast.stmt) and (id(n) in inside or _reads_on(w[1], dest)):
                    when = f", only when {' and '.join(extra[id(n)])}" if extra.get(id(n)) else ""
                    found.append((n.lineno, f"{w[0]}={_value_when_on(eng, w[1], dest, fn)} ({at}:{n.lineno}{when})"))
                if id(n) in inside and isinstance(n, ast.Call) and "declare_resolution" in ast.unparse(n.func):
                    for k in n.keywords:
                        if (k.arg and k.arg != dest and k.arg in flag_of and isinstance(k.value, ast.Constant)
                                and isinstance(k.value.value, bool)):
                            found.append((k.lineno, f"{flag_of[k.arg]} {'on' if k.value.value else 'off'} "
                                                    f"({at}:{k.lineno})"))
        out += [t for _, t in sorted(found)]
    return list(dict.fromkeys(out))


def _nccl_then(also_sets: list[str]) -> dict:
    """What a "do not set with it" entry says when the dispatch falls to pynccl (the dispatch reader's ``nccl-ring``
    step, ``pynccl_comm.all_reduce``): ``{"then": "NCCL (pynccl)"}``, with the allreduce algorithm only where SGLang's
    own code that the setting reaches pins ``NCCL_ALGO`` (read by :func:`_set_by_flag`, given as ``also_sets``):
    sglang 0.5.23 ``--enable-deterministic-inference`` sets ``NCCL_ALGO='allreduce:tree'`` on CUDA at TP > 1
    (``srt/arg_groups/attention_hook.py:676``), so ``{"then": "NCCL (pynccl, allreduce algorithm tree)", "why": "it
    sets NCCL_ALGO=allreduce:tree", "where": "sglang/srt/arg_groups/attention_hook.py:676"}``: Tree, not Ring. The same
    wording as vLLM's (:func:`.vllm_engine._pcie_ipc_turned_off_by`). Without such a line nothing about the algorithm
    was read and none is named: NCCL picks it itself."""
    from ..engines.vllm.engine import _allreduce_algo

    for item in also_sets:
        m = re.fullmatch(r"NCCL_ALGO=(.+?) \((\S+:\d+)(?:, only when .+)?\)", item)   # a condition: _inner_conditions
        if m is None:
            continue
        try:
            spec = str(ast.literal_eval(m.group(1)))
        except (ValueError, SyntaxError):
            continue                    # a value computed at run time: no algorithm read
        return {"then": f"NCCL (pynccl, allreduce algorithm {_allreduce_algo(spec)})",
                "why": f"it sets NCCL_ALGO={spec}", "where": m.group(2)}
    return {"then": "NCCL (pynccl)"}


# --- where each "do not set with it" setting takes effect against PCIe IPC, read from the installed source ---------
def _env_reads_in(fn: ast.AST) -> dict[str, int]:
    """``{VARIABLE: first line}`` of every ``envs.VARIABLE`` read in ``fn``."""
    out: dict[str, int] = {}
    for n in source.walk(fn):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "envs":
            out[n.attr] = min(out.get(n.attr, n.lineno), n.lineno)
    return out


def _function_reading(eng, name: str, dest: str) -> str:
    """``sglang/FILE:LINE`` of the first ``.dest`` read inside a function named ``name`` under ``srt/distributed``
    (``is_symmetric_memory_enabled`` reads ``...comm.enable_symm_mem``, sglang 0.5.23 ``pynccl_allocator.py:236``),
    else ""."""

    for path in source.find_files_containing(eng.root / "srt" / "distributed", f"def {name}"):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        for fn in (n for n in source.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name):
            hit = next((n for n in source.walk(fn) if isinstance(n, ast.Attribute) and n.attr == dest), None)
            if hit is not None:
                return f"{se.short(path)}:{hit.lineno}"
    return ""


def _flag_sets_variable(eng, dest: str, variables) -> tuple[str, str]:
    """``(VARIABLE, "sglang/FILE:LINE")`` of an ``envs.VARIABLE.set(...)`` in SGLang's argument files whose argument
    reads ``cfg.<dest>`` (sglang 0.5.23 ``serving_hook.py:444``: ``envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.set("1" if
    cfg.enable_deterministic_inference else "0")``), for one of ``variables``; ("", "") when none is found."""
    for path, tree in arg_trees(eng):
        for n in source.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "set"
                    and isinstance(n.func.value, ast.Attribute) and n.func.value.attr in variables
                    and any(re.search(rf"\b{dest}\b", ast.unparse(a)) for a in n.args)):
                return n.func.value.attr, f"{se.short(path)}:{n.lineno}"
    return "", ""


def _turned_off_at(eng, name: str, dest: str) -> dict | None:
    """Where ``name`` (a server flag with attribute ``dest``, or an ``SGLANG_`` variable) keeps the PCIe IPC communicator
    from being built: ``GroupCoordinator`` passes ``eligible_group`` a keyword computed by a function of
    ``parallel_state.py`` that reads the variable (for a flag: the variable the flag sets in the argument files), and
    ``eligible_group`` returns False under an ``if <that keyword>:``. sglang 0.5.23: ``deterministic=self.
    _deterministic_collectives_enabled()`` (``parallel_state.py:490``), which reads ``SGLANG_USE_1STAGE_ALLREDUCE``
    (``:1359``) and ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE`` (``:1361``); ``if deterministic: return False``
    (``pcie_ipc_ar.py:111``). ``{"why", "where", "read_at"}``, or None when any link is not found."""
    tree = eng.tree(STATE_FILE)
    eligible = next((n for n in source.walk(eng.tree(PCIE_FILE)) if isinstance(n, ast.FunctionDef)
                     and n.name == "eligible_group"), None)
    call = next((n for n in source.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "eligible_group"),
                None)
    if eligible is None or call is None:
        return None
    fns = {n.name: n for n in source.walk(tree) if isinstance(n, ast.FunctionDef)}
    for kw in call.keywords:
        if not (isinstance(kw.value, ast.Call) and isinstance(kw.value.func, ast.Attribute)
                and kw.value.func.attr in fns):
            continue
        fn = fns[kw.value.func.attr]
        reads = _env_reads_in(fn)
        if name.startswith("--"):
            var, sets_at = _flag_sets_variable(eng, dest, reads)
            if not var:
                continue
            how = f"it sets {var} ({sets_at}), read by {fn.name} (sglang/{STATE_FILE}:{reads[var]})"
        elif name in reads:
            var, how = name, f"read by {fn.name} (sglang/{STATE_FILE}:{reads[name]})"
        else:
            continue
        off = next((n for n in source.walk(eligible) if isinstance(n, ast.If) and kw.arg in
                    {x.id for x in source.walk(n.test) if isinstance(x, ast.Name)}
                    and any(isinstance(r, ast.Return) and isinstance(r.value, ast.Constant) and r.value.value is False
                            for r in n.body)), None)
        if off is None:
            continue
        out: dict[str, Any] = {"why": f"{how}, so eligible_group's `if {ast.unparse(off.test)}: return False` leaves PCIe IPC unbuilt",
               "where": f"sglang/{PCIE_FILE}:{off.lineno}", "read_at": f"sglang/{STATE_FILE}:{reads[var]}"}
        first = _decides_first(fn, var, reads[var]) if name.startswith("--") else None
        if first is not None:
            out["precedence"] = first
        return out
    return None


def _decides_first(fn: ast.FunctionDef, var: str, line: int) -> dict | None:
    """A variable ``fn`` reads before ``var`` (read at ``line``) that decides alone when set: ``if envs.Y.is_set():
    return ...`` (sglang 0.5.23 ``_deterministic_collectives_enabled``, ``parallel_state.py:1359-1360``:
    ``SGLANG_USE_1STAGE_ALLREDUCE``). ``{"variable", "test", "lines", "function"}``, or None."""
    for n in source.walk(fn):
        if (isinstance(n, ast.If) and n.lineno < line and isinstance(n.test, ast.Call)
                and isinstance(n.test.func, ast.Attribute) and n.test.func.attr == "is_set"
                and isinstance(n.test.func.value, ast.Attribute) and getattr(n.test.func.value.value, "id", "") == "envs"
                and n.test.func.value.attr != var and any(isinstance(b, ast.Return) for b in n.body)):
            return {"variable": n.test.func.value.attr, "test": ast.unparse(n.test), "function": fn.name,
                    "lines": f"sglang/{STATE_FILE}:{n.lineno}-{n.end_lineno}"}
    return None


def _test_of(eng, step) -> ast.AST | None:
    """The ``if`` test of a dispatch step (``step.where`` is ``sglang/parallel_state.py:<the test's line>``)."""
    line = int(step.where.rsplit(":", 1)[1])
    return next((n.test for n in source.walk(eng.tree(STATE_FILE)) if isinstance(n, ast.If) and n.test.lineno == line),
                None)


def _taken_first_at(eng, name: str, dest: str, step) -> dict | None:
    """Where ``name`` makes the earlier dispatch ``step`` claim the tensor before PCIe IPC's: the part of the step's
    condition that reads the setting (``envs.NAME``, ``.<dest>``, or a call of a function under ``srt/distributed``
    that reads ``.<dest>``: sglang 0.5.23 ``self.is_symmetric_memory_enabled()`` at ``parallel_state.py:756``, which
    reads ``enable_symm_mem`` at ``pynccl_allocator.py:236``). ``{"why", "where", "read_at"}``, or None."""
    test = _test_of(eng, step)
    if test is None:
        return None
    fn_name = "GroupCoordinator.all_reduce"
    for n in source.walk(test):
        at = f"sglang/{STATE_FILE}:{getattr(n, 'lineno', 0)}"
        if isinstance(n, ast.Attribute) and ((not name.startswith("--") and n.attr == name) or (dest and n.attr == dest)):
            read = at
        elif dest and isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name)):
            called = n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
            read = _function_reading(eng, called, dest)
            if not read:
                continue
        else:
            continue
        return {"why": f"{fn_name} gives the tensor to {step.backend} before PCIe IPC's step when `{ast.unparse(n)}`, "
                       f"which reads {dest or name} ({read})" + _compile_bypass(eng, getattr(test, "lineno", 0)),
                "where": at, "read_at": read}
    return None


def _compile_bypass(eng, line: int) -> str:
    """The exception a reviewer named (sglang 0.5.23 ``parallel_state.py:716-744``): inside code torch.compile traces
    (``--enable-torch-compile``), ``GroupCoordinator.all_reduce`` returns from an ``if torch.compiler.is_compiling():``
    branch before the step at ``line`` and leaves the choice to ``outplace_all_reduce(..., "auto")``, whose
    ``_resolve_outplace_all_reduce_method`` tries PCIe IPC (``:970-975``); so the earlier step does not take PCIe
    IPC's place there. "" when the branch, its return or PCIe IPC in the run-time choice is not found."""
    tree = eng.tree(STATE_FILE)
    branch = next((n for n in source.walk(tree) if isinstance(n, ast.If) and n.lineno < line
                   and ast.unparse(n.test) == "torch.compiler.is_compiling()"
                   and any(isinstance(r, ast.Return) for r in n.body)), None)
    resolve = next((n for n in source.walk(tree) if isinstance(n, ast.FunctionDef)
                    and n.name == "_resolve_outplace_all_reduce_method"), None)
    if branch is None or resolve is None:
        return ""
    pcie = next((n for n in source.walk(resolve) if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant)
                 and n.value.value == "pcie_ipc"), None)
    if pcie is None:
        return ""
    end = max(getattr(n, "end_lineno", n.lineno) or n.lineno for n in branch.body)
    return (f"; except inside code torch.compile traces (--enable-torch-compile: decode batches up to "
            f"--torch-compile-max-bs): `torch.compiler.is_compiling()` returns before this step "
            f"(sglang/{STATE_FILE}:{branch.lineno}-{end}) and the run-time choice tries PCIe IPC "
            f"(sglang/{STATE_FILE}:{pcie.lineno} _resolve_outplace_all_reduce_method)")


def _excluded_at(eng, d, run_time) -> dict | None:
    """Where a path decided per call at run time (``run_time``: MSCCL++'s step, ``return "pymscclpp"``) takes the tensor
    from PCIe IPC: a name its step tests that PCIe IPC's step tests negated (sglang 0.5.23 ``not
    should_use_pymscclpp_allreduce``, ``parallel_state.py:972``), and the ``if`` that builds its communicator
    (``if use_mscclpp and self.world_size > 1``, ``:471``: ``read_at``). ``{"why", "where", "read_at"}``, or None."""
    mine, theirs = d.step(PCIE_IPC), _test_of(eng, run_time)
    mine_test = _test_of(eng, mine) if mine is not None else None
    if mine_test is None or theirs is None:
        return None
    names = {x.id for x in source.walk(theirs) if isinstance(x, ast.Name)}
    hit = next((n for n in source.walk(mine_test) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)
                and isinstance(n.operand, ast.Name) and n.operand.id in names), None)
    attrs = re.findall(r"self\.(\w+_comm)\b", ast.unparse(theirs))
    built = next((n for n in source.walk(eng.tree(STATE_FILE)) if isinstance(n, ast.If) and attrs and any(
        isinstance(a, ast.Assign) and ast.unparse(a.targets[0]) == f"self.{attrs[0]}" for a in n.body)), None)
    if hit is None or built is None:
        return None
    at = f"sglang/{STATE_FILE}:{built.test.lineno}"
    return {"why": f"self.{attrs[0]} is built when `{ast.unparse(built.test)}` ({at}); its step ({run_time.where}) "
                   "takes the tensor when its per-call check admits it, and PCIe IPC's step requires "
                   f"`{ast.unparse(hit)}`", "where": f"sglang/{STATE_FILE}:{hit.lineno}", "read_at": at}


def _cite(eng, name: str, dest: str, base, d, backend: str) -> dict | None:
    """``{"why", "where", "read_at"}`` for a setting after which ``backend`` no longer serves: PCIe IPC not built
    (:func:`_turned_off_at`) or an earlier step claims the tensor (:func:`_taken_first_at`); None when the reason is
    not located in the installed source (the entry is then not assessed)."""
    mine, was = d.step(backend), base.step(backend)
    if mine is not None and was is not None and was.built is True and mine.built is False:
        return _turned_off_at(eng, name, dest)
    first = d.step(d.serves) if d.serves else None
    if first is not None and (mine is None or d.steps.index(first) < d.steps.index(mine)):
        return _taken_first_at(eng, name, dest, first)
    return None


def do_not_set(eng, ctx, backend: str = PCIE_IPC) -> list[dict]:
    """The settings that take ``backend`` away once its opt-in is on, found by SGLang's own dispatch rather than from a
    list: the dispatch of a decode-step allreduce (:func:`.sglang_dispatch.read_dispatch`) is read with the
    opt-in set; every server flag and variable that read consulted (recorded as it asks) is then set alone beside it,
    and each one after which ``backend`` no longer serves is returned, with what serves instead and the NCCL
    variables SGLang writes for it (:func:`_set_by_flag`). For sglang 0.5.23: ``--enable-deterministic-inference``
    (turns PCIe IPC off, ``pcie_ipc_ar.py:111``, and that mode sets ``NCCL_ALGO='allreduce:tree'``,
    ``arg_groups/attention_hook.py:676``) and ``--enable-symm-mem`` (NCCL
    symmetric memory is tried first, and SGLang sets ``NCCL_CUMEM_ENABLE=1``, ``NCCL_NVLS_ENABLE=1``,
    ``entrypoints/engine.py:1898-1915``); ``--enable-mscclpp`` only where the mscclpp package is importable in the
    environment read (:func:`.sglang_dispatch.mscclpp_package`): then graph capture enables MSCCL++
    (``parallel_state.py:669``), ``should_mscclpp_allreduce`` excludes PCIe IPC (``:966-973``) and ``:983`` returns
    "pymscclpp"; without it the communicator stays disabled (``pymscclpp.py:1029,1048-1056``) and the flag is not
    listed. Returns ``[{"setting", "then", "also_sets"}]`` (plus ``"note"``, and ``"needs"``: the package, where the
    path that takes over decides per call at run time); where pynccl serves instead ``then`` reads ``NCCL (pynccl)``,
    naming the allreduce algorithm (with ``"why"`` and ``"where"``) only where the setting's own code pins
    ``NCCL_ALGO`` (:func:`_nccl_then`). Every entry that claims a path cites, read from the installed source
    (:func:`_cite`, :func:`_excluded_at`), ``"where"``: the line where the setting takes effect against ``backend`` (the
    condition that leaves it unbuilt, or the earlier dispatch step that takes the tensor), ``"read_at"``: where SGLang
    reads the setting, ``"why"``: both in words (with the ``NCCL_ALGO`` pin), and a ``"note"`` the cause prints
    (``THEN serves instead: WHY, WHERE``). A setting after which the dispatch is undecided and no step read takes the
    tensor, whose dispatch read raises, or whose effect the dispatch read gives but no line of SGLang's source is found
    for, is kept with ``"then": ""`` and a ``"note"`` starting ``not assessed:`` (never dropped, never an uncited
    claim); [] when the opt-in alone does not make ``backend`` serve (nothing to protect: sglang 0.5.9, which has no
    ``pcie_ipc_ar.py``).

    A variable SGLang itself writes from a flag on every start-up (:func:`startup_overwrites`: sglang 0.5.23
    SGLANG_ENABLE_DETERMINISTIC_INFERENCE, ``serving_hook.py:444``, run from ``pipeline.py:332``) is not a setting of
    its own and is not listed: the flag's entry says so in ``why`` and ``note`` and keeps it under ``"overwrites"``. A
    flag's ``also_sets`` is everything its branch writes or switches (:func:`_set_by_flag`), and a flag whose variable
    another one overrides when set (:func:`_decides_first`) carries that as ``"caveat"`` (in ``why`` and ``note``) where
    the dispatch read with that variable at 0 beside the flag gives ``backend`` again."""
    from ..serverconfig import ServerConfig
    from ..engines.sglang import dispatch as dw
    from ..engines.sglang import flags as sf

    sc = ctx.server_config
    args, env = _Recording(sc.args), _Recording({**sc.env, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})
    base = dw.read_dispatch(eng, ctx, config=ServerConfig(args=args, env=env, source=sc.source))
    if base.serves != backend:
        return []
    flags = sf.server_flags(eng)
    asked = list(dict.fromkeys(args.asked + env.asked))
    overwritten = {v: o for v, o in startup_overwrites(eng).items() if v in asked}
    out = []
    for name in asked:
        if name in sc.args or name in sc.env or name == "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" or name in overwritten:
            continue                    # given already, the opt-in, or a variable SGLang writes itself at start-up
        if name.startswith("--"):
            spec = flags.get(name)
            if spec is None or spec.default is not False or name.startswith(("--no-", "--disable")):
                continue                # a switch that is off by default: what a user might add

            cfg = ServerConfig(args={**sc.args, name: True}, env=dict(env))
        elif name.startswith("SGLANG_"):
            try:
                default = se.env_flag(eng, name)[0]
            except se.GateNotFound:
                continue
            if default is not False:
                continue                # a switch variable that is off by default, not a number or a path
            cfg = ServerConfig(args=dict(sc.args), env={**env, name: "1"})
        else:
            continue
        setting = name if name.startswith("--") else f"{name}=1"
        try:
            d = dw.read_dispatch(eng, ctx, config=cfg)
        except Exception as e:  # noqa: BLE001 - a combination the reader cannot evaluate: not assessed, said so
            out.append({"setting": setting, "then": "", "also_sets": [],
                        "note": f"not assessed: the dispatch read with it set raised {type(e).__name__}: {e}"})
            continue
        if d.serves != backend:
            dest = getattr(flags.get(name), "dest", "") if name.startswith("--") else ""
            mine = [o for o in overwritten.values() if o["flag"] == name]
            out.append(_entry(eng, (ctx, cfg), name, setting, dest, base, d, backend, mine))
    return out


def _entry(eng, read, name: str, setting: str, dest: str, base, d, backend: str,
           overwrites: list[dict] | None = None) -> dict:
    """One "do not set with it" entry for ``name`` (``setting`` as printed), whose dispatch read ``d`` no longer
    serves ``backend`` (``base``: the read with the opt-in alone; ``read``: ``(ctx, config)`` of ``d``): cited
    (:func:`_cited`), or not assessed. ``overwrites``: the variables SGLang writes from this flag on every start-up
    (:func:`_startup_overwrites`), which are not listed themselves: said here instead."""
    from ..engines.sglang import dispatch as dw

    also = _set_by_flag(eng, dest, _flag_names(eng)) if dest else []
    entry = {"setting": setting, "then": d.serves, "also_sets": also}
    if d.serves:
        cite = _cite(eng, name, dest, base, d, backend)
        if cite is None:        # the dispatch read says it, but no line of SGLang's shows why: no claim
            entry.update(then="", note=f"not assessed: with it set the dispatch read gives {d.serves}, but where "
                         f"SGLang reads it and turns {backend} off or takes the tensor first was not found in its "
                         "source")
            return entry
        if d.serves == "nccl-ring":     # pynccl, NCCL's own algorithm choice unless the setting pins one
            algo = _nccl_then(also)
            entry["then"] = algo["then"]
            if algo.get("why"):
                cite = {**cite, "nccl_algo": f"{algo['why']} ({algo['where']})"}
        extra = [_overwrite_words(o) for o in overwrites or []]
        if overwrites:
            entry["overwrites"] = overwrites
        caveat = _precedence_caveat(eng, read, name, cite.get("precedence"), backend)
        if caveat:
            entry["caveat"] = caveat
            extra.append(caveat)
        _cited(entry, {**cite, "extra": extra})
        return entry
    # undecided: what takes it is a path whose own per-call check runs at run time
    run_time = next((s for s in d.steps if s.built is True and s.admits == "unknown" and s.backend != backend), None)
    if run_time is None:    # nothing read takes it: not claimed either way, and said so
        why = d.undecided or "no step claims the decode tensor"
        entry["note"] = (f"not assessed: with it set the dispatch is undecided ({why}) and no step read here takes "
                         "the tensor instead")
        return entry
    cite = _excluded_at(eng, d, run_time)
    if cite is None:
        entry["note"] = (f"not assessed: with it set {run_time.backend} ({run_time.where}) is decided at run time, "
                         f"and where it takes the tensor from {backend} was not found in SGLang's source")
        return entry
    entry["then"] = run_time.backend
    _cited(entry, cite)
    entry["note"] = f"decided at run time: {run_time.why}; {cite['why']}, {cite['where']}"
    if run_time.backend == "mscclpp":
        pkg = dw.mscclpp_package(eng)
        entry["needs"] = pkg["package"]
        entry["note"] = (f"MSCCL++ serves captured decode instead: {pkg['why']}, and should_mscclpp_allreduce then "
                         f"excludes PCIe IPC ({cite['where']}); without the {pkg['package']} package --enable-mscclpp "
                         "has no effect")
    return entry


def _overwrite_words(o: dict) -> str:
    """What a user reads for a variable SGLang writes from a flag on every start-up (:func:`_startup_overwrites`)."""
    on = f" (SGLang also turns {o['flag']} on itself when {', '.join(o['also_on'])})" if o.get("also_on") else ""
    return (f"{o['variable']} set alone has no effect: SGLang overwrites it from {o['flag']} at start-up "
            f"({o['set_at']}, in {o['function']}, which {o['caller']} runs on every launch, {o['runs_at']}), so only "
            f"{o['flag']} turns it on{on}")


def _precedence_caveat(eng, read, name: str, first: dict | None, backend: str) -> str:
    """The caveat for a flag whose variable is read only when another variable is unset (:func:`_decides_first`),
    kept only where the dispatch read with the flag and that variable set to 0 still gives ``backend``; else ""."""
    from ..serverconfig import ServerConfig
    from ..engines.sglang import dispatch as dw

    if not first:
        return ""
    ctx, cfg = read
    var = first["variable"]
    try:
        d = dw.read_dispatch(eng, ctx, config=ServerConfig(args=dict(cfg.args), env={**cfg.env, var: "0"},
                                                           source=cfg.source))
    except Exception:  # noqa: BLE001 - not read: no caveat claimed
        return ""
    if d.serves != backend:
        return ""
    return (f"unless {var} is set: {first['function']} returns it first (`{first['test']}`, {first['lines']}), so "
            f"{var}=0 beside {name} keeps {backend} built (the dispatch read with both gives {backend}); a loophole, "
            f"not advice: the collectives are then not the deterministic ones {name} is set for")


def _cited(entry: dict, cite: dict) -> None:
    """Put :func:`_cite`'s answer on a "do not set with it" entry: ``why`` (with the ``NCCL_ALGO`` pin, where the
    setting's code sets one: the same shape as vLLM's entries), ``where`` (the condition or step against PCIe IPC),
    ``read_at`` (where SGLang reads the setting) and a ``note`` the cause prints:
    ``THEN serves instead: WHY, WHERE`` (the pin is in ``also_sets`` there)."""
    extra = "".join(f"; {x}" for x in cite.get("extra") or [])
    entry["why"] = cite["why"] + extra + (f"; {cite['nccl_algo']}" if cite.get("nccl_algo") else "")
    entry["where"], entry["read_at"] = cite["where"], cite["read_at"]
    entry["note"] = f"{entry['then']} serves instead: {cite['why']}{extra}, {cite['where']}"


# --- what happens when its set-up fails, and how a user confirms it served (issue 39 point 3) ---------------------
def _log_text(call: ast.AST) -> str:
    """The format string of a ``logger.<level>(...)`` call (implicitly joined literals, an f-string's text)."""
    if not isinstance(call, ast.Call) or not call.args:
        return ""
    a = call.args[0]
    if isinstance(a, ast.Constant):
        return str(a.value)
    if isinstance(a, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{" + ast.unparse(getattr(v, "value", v)) + "}"
                       for v in a.values)
    return ast.unparse(a)


def _is_log(n: ast.AST, level: str) -> bool:
    return (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == level
            and "log" in ast.unparse(n.func.value).lower())


def setup_fallback(eng) -> dict:
    """How SGLang handles a failed PCIe IPC set-up, and what a user reads in the log when it served, from the installed
    source (``ast``): ``{"caught": [{"where", "guards", "warning"}], "confirm": [{"where", "line"}],
    "autotune_flag": {"flag", "where"} | None}``.

    * ``caught``: every ``try`` around the communicator's construction in ``srt/distributed/parallel_state.py`` (sglang
      0.5.23 ``:492-501``) and around the workspace / tune calls in ``pcie_ipc_ar.py`` (``:286-295``) whose handler
      logs a warning: a failure there leaves the server on NCCL with that one warning, no start-up failure;
    * ``confirm``: the first ``logger.info`` after each such ``try`` in the same function: the line that appears only
      when the step worked ("FlashInfer PCIe-IPC workspace built ...", "... autotuned %d shape(s) ...");
    * ``autotune_flag``: the server flag the module's autotune check reads (``--disable-flashinfer-autotune``, which
      skips the per-shape tuning FlashInfer expects once per machine), when the release defines it.

    Raises GateNotFound when the module or the construction site is missing."""
    from ..engines.sglang import flags as sf

    ps = "srt/distributed/parallel_state.py"
    caught, confirm = [], []

    def scan(rel: str, tree: ast.Module, want) -> None:
        for fn in (n for n in source.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for stmts in (getattr(x, "body", None) for x in source.walk(fn)):
                if not isinstance(stmts, list):
                    continue
                for i, t in enumerate(stmts):
                    if not (isinstance(t, ast.Try) and any(want(c) for b in t.body for c in source.walk(b))):
                        continue
                    warn = next((c for h in t.handlers for c in source.walk(h) if _is_log(c, "warning")), None)
                    if warn is None:
                        continue
                    guards = sorted({ast.unparse(c.func) for b in t.body for c in source.walk(b)
                                     if isinstance(c, ast.Call) and want(c)})
                    caught.append({"where": f"sglang/{rel}:{t.lineno}-{t.handlers[-1].end_lineno} ({fn.name})",
                                   "guards": guards, "warning": _log_text(warn)})
                    info = next((c for s in stmts[i + 1:] for c in source.walk(s) if _is_log(c, "info")), None)
                    if info is not None:
                        confirm.append({"where": f"sglang/{rel}:{getattr(info, 'lineno', '?')}",
                                        "line": _log_text(info)})

    scan(ps, eng.tree(ps), lambda c: isinstance(c, ast.Call) and ast.unparse(c.func).endswith("PcieIpcCommunicator"))
    if not caught:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{ps}: no try/except with a warning "
                              "around PcieIpcCommunicator(...)")
    scan(PCIE_FILE, eng.tree(PCIE_FILE), lambda c: isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
         and c.func.attr in ("tune", "create", "allocate") or isinstance(c, ast.Call)
         and "workspace" in ast.unparse(c.func).lower())
    flag = None
    attr = next((n.attr for n in source.walk(eng.tree(PCIE_FILE)) if isinstance(n, ast.Attribute)
                 and "autotune" in n.attr and n.attr.startswith("disable")), None)
    if attr:
        f = "--" + attr.replace("_", "-")
        spec = sf.server_flags(eng).get(f)
        if spec is not None:
            flag = {"flag": f, "where": spec.where}
    return {"caught": caught, "confirm": list({c["where"]: c for c in confirm}.values()), "autotune_flag": flag}
