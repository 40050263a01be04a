"""PCIe IPC allreduce in the installed SGLang (0.5.23 ``srt/distributed/device_communicators/pcie_ipc_ar.py``):
every condition between the opt-in and a decode tensor served, read from its code, as data for the verdict.

:func:`row_bound` is the workspace bound (``_ensure_workspace``): ``SGLANG_PCIE_IPC_MAX_NUMEL`` when set, else
the runner's widest decode (``prepare(max_rows=...)`` from ``_widest_decode_rows``: largest captured batch x
tokens per request, draft tokens for EAGLE-3), else ``_FALLBACK_DECODE_WIDTH`` rows (64 in 0.5.23) when no CUDA
graph is captured; elements = rows x hidden. :func:`pcie_ipc_admission` lists the rest as evidence.
"""
from __future__ import annotations

import ast
import re

from ... import source
from ...verdict import Evidence
from . import engine as se
from . import flags as sf
from .pyeval import UNKNOWN, Evaluator, Unbound

PCIE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
RUNNER_FILE = "srt/model_executor/runner/base_runner.py"
OPT_IN = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
MAX_NUMEL = "SGLANG_PCIE_IPC_MAX_NUMEL"


def _module_constant(tree: ast.Module, name: str):
    """``(value, line)`` of the module-level ``name = ...`` in ``tree``: a literal, a ``frozenset`` / ``set`` /
    ``tuple`` / ``list`` of one, or an expression the safe evaluator (:mod:`.pyeval`) computes from literals and the
    module's other such constants (``(2, 4) + (8,)``). ``(None, line)`` when it is assigned but none of these (a
    comprehension, a call: its value is decided at import time and is not guessed); ``(None, 0)`` when absent."""
    return _constant(tree, name, depth=0)


_WRAPPERS = {"frozenset": frozenset, "set": set, "tuple": tuple, "list": list}


def _constant(tree: ast.Module, name: str, depth: int):
    node = next((n for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)), None)
    if node is None:
        return None, 0
    value = node.value
    try:
        return ast.literal_eval(value), node.lineno
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _WRAPPERS
            and len(value.args) == 1 and not value.keywords):
        try:
            return _WRAPPERS[value.func.id](ast.literal_eval(value.args[0])), node.lineno
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass

    def resolve(text: str):
        if depth < 8 and re.fullmatch(r"[A-Za-z_]\w*", text) and text != name:
            got, line = _constant(tree, text, depth + 1)
            if line and got is not None:
                return got
        raise Unbound(text)

    try:
        got = Evaluator(resolve).value(value)
    except (Unbound, TypeError, ValueError, ArithmeticError):
        return None, node.lineno
    return (None if got is UNKNOWN else got), node.lineno


def supported_sizes(tree: ast.Module, name: str = "_SUPPORTED_WORLD_SIZES") -> tuple[tuple | None, int, str]:
    """``(sizes, line, why)`` of a supported-sizes constant: ``sizes`` a tuple of whole numbers read by
    :func:`_module_constant`, else None with ``why`` saying what was missing (absent, or not a literal and not
    evaluable to numbers, so not assessed: never the numbers that happen to appear in its expression)."""
    value, line = _module_constant(tree, name)
    if not line:
        return None, 0, f"no module-level {name}"
    if isinstance(value, (tuple, list, set, frozenset)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(sorted(value)), line, ""
    return None, line, (f"{name} at line {line} is not a literal and does not evaluate to numbers here "
                        "(it is computed when SGLang imports the module), so the sizes it admits are not read")


def cuda_graphs(engine: se.Engine, config) -> tuple[bool, str]:
    """(decode runs under CUDA graph capture, where decided): off with ``--disable-cuda-graph`` or (0.5.23)
    ``--cuda-graph-backend-decode disabled``."""
    v, where = sf.config_value(engine, config, "--disable-cuda-graph")
    if v is True:
        return False, where
    flags = sf.server_flags(engine)
    if "--cuda-graph-backend-decode" in flags:
        b, w = sf.config_value(engine, config, "--cuda-graph-backend-decode")
        if b == "disabled":
            return False, w
    return True, where


def tokens_per_request(engine: se.Engine, config, tensor) -> tuple[int | None, str]:
    """Rows per request in a decode step: ``--speculative-num-draft-tokens`` when a speculative algorithm is given
    (``_decode_width``: ``speculative_num_draft_tokens or 1`` if ``speculative_algorithm``), else the workload's
    tokens per verify step (the seed workload assumes EAGLE-3 with that many draft tokens). ``(None, why)`` when the
    value given is not a whole number (not read, never guessed)."""
    algo, _ = sf.config_value(engine, config, "--speculative-algorithm")
    if algo:
        n, where = sf.config_value(engine, config, "--speculative-num-draft-tokens")
        got = _whole(n or 1)
        return (got, where) if got is not None else (None, f"{where} is not a whole number")
    return tensor.tokens, f"the workload's {tensor.tokens} tokens per verify step (no --speculative-algorithm given)"


def _whole(v) -> int | None:
    """``v`` as an int when it is one (or its decimal text), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    try:
        return int(str(v).strip())
    except ValueError:
        return None


def _not_assessed(why: str, source_: str, where: str) -> dict:
    """A row bound that cannot be computed: ``admits`` None (never True), ``not_assessed`` the reason."""
    return {"max_numel": None, "rows": None, "source": source_, "where": where, "admits": None,
            "not_assessed": why, "why": f"not assessed: {why}"}


def row_bound(engine: se.Engine, config, tensor) -> dict:
    """The PCIe IPC workspace bound for ``config`` and the decode ``tensor`` (a :class:`DecodeTensor`):
    ``{"max_numel": int | None (None: fixed at start-up from the captured batch sizes), "rows": int | None,
    "source": what sets it, "where": file:line, "admits": bool | None (the tensor's numel fits; None: not assessed),
    "why": one sentence}``, plus ``"not_assessed"`` (the reason) where the bound cannot be computed: the release
    defines no max-batch-size flag, or a value it needs is not a whole number. Raises GateNotFound when
    ``_ensure_workspace`` or the fallback width is not found."""
    tree = engine.tree(PCIE_FILE)
    fns = source.functions(tree)
    ensure = fns.get("_ensure_workspace")
    if ensure is None or MAX_NUMEL not in ast.unparse(ensure):
        raise se.GateNotFound(f"gate not found in sglang {engine.version} at sglang/{PCIE_FILE}: _ensure_workspace "
                              f"no longer reads {MAX_NUMEL}")
    fallback, fline = _module_constant(tree, "_FALLBACK_DECODE_WIDTH")
    if not isinstance(fallback, int):
        raise se.GateNotFound(f"gate not found in sglang {engine.version} at sglang/{PCIE_FILE}: no _FALLBACK_DECODE_WIDTH")
    here = f"sglang/{PCIE_FILE}"
    override = config.var(MAX_NUMEL)
    if override:
        return _override_bound(override, tensor, f"{here}:{ensure.lineno} _ensure_workspace")
    graphs, gwhere = cuda_graphs(engine, config)
    if not graphs:
        numel, mx = tensor.rows * tensor.hidden, fallback * tensor.hidden
        return {"max_numel": mx, "rows": fallback, "source": f"no CUDA graph ({gwhere}): _FALLBACK_DECODE_WIDTH",
                "where": f"{here}:{fline} _FALLBACK_DECODE_WIDTH", "admits": numel <= mx,
                "why": f"without CUDA graphs the workspace is sized from the fixed width {fallback} rows "
                       f"({here}:{fline}): a [{tensor.rows}, {tensor.hidden}] tensor "
                       + ("fits" if numel <= mx else "does not fit and stays on NCCL")}
    return _graph_bound(engine, config, tensor, here)


MBS_FLAGS = ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs")


def _override_bound(override: str, tensor, where: str) -> dict:
    """The bound ``SGLANG_PCIE_IPC_MAX_NUMEL`` sets; not assessed when its value is not a whole number."""
    mx = _whole(override)
    if mx is None:
        return _not_assessed(f"{MAX_NUMEL}={override!r} is not a whole number, so the bound it sets is not read",
                             f"{MAX_NUMEL}={override}", where)
    numel = tensor.rows * tensor.hidden
    return {"max_numel": mx, "rows": mx // tensor.hidden, "source": f"{MAX_NUMEL}={override}", "where": where,
            "admits": numel <= mx, "why": f"{MAX_NUMEL}={override} sets the bound to {mx} elements "
            f"({mx // tensor.hidden} rows of {tensor.hidden}); the decode tensor has {numel}"}


def _graph_bound(engine: se.Engine, config, tensor, here: str) -> dict:
    """The bound under CUDA graphs: the largest captured decode batch (``--cuda-graph-max-bs-decode``, 0.5.9
    ``--cuda-graph-max-bs``) x tokens per request. Not assessed when the release defines neither flag (the largest
    captured batch is then not read from any flag) or a value is not a whole number."""
    per_req, pwhere = tokens_per_request(engine, config, tensor)
    runner = engine.file(RUNNER_FILE) if (engine.root / RUNNER_FILE).is_file() else None
    rwhere = f"{se.short(runner)} _widest_decode_rows" if runner else f"{here} _decode_width"
    mbs_flags = [f for f in MBS_FLAGS if f in sf.server_flags(engine)]
    if not mbs_flags:
        return _not_assessed(f"sglang {engine.version} defines no max-batch-size flag ({' / '.join(MBS_FLAGS)} "
                             f"searched in {', '.join('sglang/' + r for r in se.ARG_FILES)}), so the largest captured "
                             "decode batch that sizes the PCIe IPC workspace is not read", "largest captured batch "
                             "(no max-batch-size flag found)", rwhere)
    if per_req is None:
        return _not_assessed(f"tokens per request: {pwhere}", "largest captured batch x tokens per request", rwhere)
    mbs, mwhere = sf.config_value(engine, config, *mbs_flags)
    if mbs is None:
        return {"max_numel": None, "rows": None, "source": f"largest captured batch (chosen at start-up; {mwhere}) x "
                f"{per_req} tokens per request ({pwhere})", "where": rwhere, "admits": True,
                "why": f"the bound is the largest captured decode batch x {per_req} rows, so every decode batch that "
                       f"runs in a captured graph fits (batch {tensor.batch} x {per_req} = {tensor.rows} rows); a "
                       "larger batch runs without a graph and its tensor exceeds the bound"}
    n = _whole(mbs)
    if n is None:
        return _not_assessed(f"{mwhere} is not a whole number, so the largest captured decode batch is not read",
                             f"largest captured batch ({mwhere})", rwhere)
    rows = n * per_req
    return {"max_numel": rows * tensor.hidden, "rows": rows, "source": f"largest captured batch {mbs} ({mwhere}) "
            f"x {per_req} tokens per request ({pwhere})", "where": rwhere, "admits": tensor.batch <= n
            and tensor.rows <= rows, "why": f"the bound is {mbs} x {per_req} = {rows} rows; the decode tensor has "
            f"{tensor.rows}"}


def pcie_ipc_admission(engine: se.Engine, config, tensor, world_size: int = 8) -> list[Evidence]:
    """Every condition of SGLang's PCIe IPC path for ``config`` and ``tensor``, each an
    :class:`~stackprobe.verdict.Evidence` (what, value, ``sglang/FILE:LINE``), in path order: opt-in, group and
    world sizes, deterministic mode, per-call shape/dtype checks, the row bound (:func:`row_bound`), narrow
    prefill chunks, what preempts it (read by :mod:`.sglang_dispatch`), no P2P check, autotune at warmup.
    [] when the release has no ``pcie_ipc_ar.py``. Raises GateNotFound for a moved part."""
    if not (engine.root / PCIE_FILE).is_file():
        return []
    tree = engine.tree(PCIE_FILE)
    here = f"sglang/{PCIE_FILE}"
    fns = source.functions(tree)
    out: list[Evidence] = []
    elig = fns.get("eligible_group")
    default, env_where = se.env_flag(engine, OPT_IN)
    val = config.var(OPT_IN)
    out.append(Evidence("opt-in", {"variable": OPT_IN, "default": default, "given": val,
                                   "on": se.env_truthy(val) if val is not None else bool(default)},
                        f"{here}:{elig.lineno if elig else '?'} eligible_group; {env_where}"))
    groups, gl = _module_constant(tree, "_ELIGIBLE_GROUP_NAMES")
    out.append(Evidence("process groups", sorted(groups) if groups else groups, f"{here}:{gl} _ELIGIBLE_GROUP_NAMES"))
    sizes, sl, swhy = supported_sizes(tree)
    out.append(Evidence("world sizes", {"supported": list(sizes), "here": world_size, "admits": world_size in sizes}
                        if sizes is not None else {"supported": None, "here": world_size, "admits": None,
                                                   "not_assessed": swhy}, f"{here}:{sl} _SUPPORTED_WORLD_SIZES"))
    det = _deterministic(engine, config)
    out.append(Evidence("deterministic inference turns it off", det, det.pop("where")))
    should = fns.get("should_pcie_ipc_ar")
    if should is None:
        raise se.GateNotFound(f"gate not found in sglang {engine.version} at {here}: no should_pcie_ipc_ar")
    checks = [ast.unparse(n.test) for n in source.walk(should) if isinstance(n, ast.If)]
    out.append(Evidence("per-call checks (should_pcie_ipc_ar)", checks, f"{here}:{should.lineno} should_pcie_ipc_ar"))
    b = row_bound(engine, config, tensor)
    out.append(Evidence("row bound", b, b["where"]))
    out.append(Evidence("prefill chunks", "admitted when rows x hidden <= the bound (the bound is a row count, not a "
                        "phase split); full-width prefill stays on NCCL", f"{here}:{ensure_line(fns)} _ensure_workspace"))
    out.append(Evidence("peer-to-peer check", "none: neither SGLang's communicator nor FlashInfer's workspace checks "
                        "P2P access before the IPC set-up; a failure inside the shared-buffer set-up can leave the group "
                        "hung", f"{here}:{fns['PcieIpcCommunicator'].lineno if 'PcieIpcCommunicator' in fns else '?'} "
                        "PcieIpcCommunicator (no can_device_access_peer call)"))
    tune = fns.get("_tune")
    autotune_off, awhere = sf.config_value(engine, config, "--disable-flashinfer-autotune")
    out.append(Evidence("autotune at warmup", {"runs": not autotune_off, "set_by": awhere},
                        f"{here}:{tune.lineno if tune else '?'} _tune (prepare() from the runner's warmup)"))
    return out


def ensure_line(fns: dict) -> int | str:
    f = fns.get("_ensure_workspace")
    return f.lineno if f else "?"


def _deterministic(engine: se.Engine, config) -> dict:
    """``_deterministic_collectives_enabled`` (parallel_state.py), run from its own code (:mod:`.pyeval`) for
    ``config``: sglang 0.5.23 returns SGLANG_USE_1STAGE_ALLREDUCE when set, else SGLANG_ENABLE_DETERMINISTIC_INFERENCE,
    which SGLang itself writes from --enable-deterministic-inference on every start-up
    (:func:`.startup.startup_overwrites`; ``serving_hook.py:444``): a value the user gives for it alone is then not
    read, and the flag counts as on where SGLang turns it on itself (its ``also_on`` conditions,
    :func:`.startup.also_on_holds`). ``{"on": bool | None, "where", ...}``; ``on`` None with ``"not_assessed"`` (the
    reason) when the function is not found, reads what this reader cannot evaluate, or an ``also_on`` condition cannot
    be judged from the configuration: never taken as off."""
    from .pyeval import run_function
    from .startup import startup_overwrites

    rel = "srt/distributed/parallel_state.py"
    fn = next((n for n in source.walk(engine.tree(rel)) if isinstance(n, ast.FunctionDef)
               and n.name == "_deterministic_collectives_enabled"), None)
    if fn is None:
        return {"on": None, "where": f"sglang/{rel} (not found)",
                "not_assessed": f"sglang {engine.version} has no _deterministic_collectives_enabled in sglang/{rel}, so "
                                "whether deterministic collectives keep PCIe IPC off is not read"}
    where = f"sglang/{rel}:{fn.lineno} _deterministic_collectives_enabled"
    one = config.var("SGLANG_USE_1STAGE_ALLREDUCE")
    flag, fwhere = sf.config_value(engine, config, "--enable-deterministic-inference")
    overs = startup_overwrites(engine)
    out: dict = {"on": None, "SGLANG_USE_1STAGE_ALLREDUCE": one,
                 "--enable-deterministic-inference": f"{flag} ({fwhere})", "where": where}
    over = overs.get("SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    if over is not None:
        out["SGLANG_ENABLE_DETERMINISTIC_INFERENCE"] = (f"overwritten from {over['flag']} at start-up ({over['set_at']}, "
                                                        f"run at {over['runs_at']})")
    unjudged: list[str] = []
    resolve = _det_resolver(engine, config, overs, out, unjudged)
    try:
        res = run_function(fn, resolve)
    except Unbound as e:
        out["not_assessed"] = (f"{where} reads `{e.text}`, which this reader cannot evaluate, so whether deterministic "
                               "collectives keep PCIe IPC off is not read")
        return out
    if res.value is UNKNOWN:
        out["not_assessed"] = "; ".join(unjudged) or f"{where} is decided at run time"
        return out
    out["on"] = bool(res.value)
    return out


def _det_resolver(engine: se.Engine, config, overs: dict, out: dict, unjudged: list[str]):
    """``resolve`` for running ``_deterministic_collectives_enabled`` (:func:`_deterministic`): ``envs.X.is_set()`` /
    ``envs.X.get()`` for ``config``, where a variable SGLang overwrites from a flag on every start-up reads that flag
    (or its ``also_on`` conditions), one it writes under a condition reads that write where the condition holds, and
    any other the user's value, else its default. What cannot be judged is UNKNOWN, its reason in ``unjudged``; what
    SGLang sets itself is noted in ``out``."""
    from .startup import also_on_holds, conditional_write

    def resolve(text: str):
        m = re.fullmatch(r"envs\.(\w+)\.(get|is_set)\(\)", text)
        if not m:
            raise Unbound(text)
        var, how = m.groups()
        given = config.var(var)     # read even where overwritten: do_not_set lists what the reading consulted
        o = overs.get(var)
        if o is not None:       # SGLang writes it from the flag on every start-up: the user's value never reaches here
            if how == "is_set":
                return True
            on = bool(sf.config_value(engine, config, o["flag"])[0])
            held, why = (False, "") if on else also_on_holds(engine, config, o)
            if held:
                out[f"{o['flag']} (set by SGLang)"] = why
            elif held is None:
                unjudged.append(why)
                return UNKNOWN
            return on or bool(held)
        wrote, wwhy = conditional_write(engine, config, var)
        if wwhy.startswith("not assessed"):
            unjudged.append(wwhy)
            return UNKNOWN
        written = True if how == "is_set" else se.env_truthy(wrote) if isinstance(wrote, str) else bool(wrote)
        if wwhy and not wwhy.startswith("maybe: "):     # written at start-up under a condition that holds here
            out[f"{var} (set by SGLang)"] = wwhy
            return written
        mine = _user_value(engine, var, how, given, text)
        if wwhy and bool(mine) != bool(written):        # depends on whether a function not seen to run runs
            unjudged.append(f"not assessed: {wwhy.removeprefix('maybe: ')} would make it {written}, else it is {mine}")
            return UNKNOWN
        return mine
    return resolve


def _user_value(engine: se.Engine, var: str, how: str, given, text: str):
    """``envs.VAR.is_set()`` / ``.get()`` from the user's value ``given``, else the installed default."""
    if how == "is_set":
        return given is not None
    if given is not None:
        return se.env_truthy(given)
    try:
        return se.env_flag(engine, var)[0]
    except se.GateNotFound:
        raise Unbound(text) from None
