"""PCIe IPC allreduce in the installed SGLang (0.5.23 ``srt/distributed/device_communicators/pcie_ipc_ar.py``):
every condition between the opt-in and a decode tensor served, read from its code, as data for the verdict.

:func:`row_bound` is the workspace bound (``_ensure_workspace``): ``SGLANG_PCIE_IPC_MAX_NUMEL`` when set, else
the runner's widest decode (``prepare(max_rows=...)`` from ``_widest_decode_rows``: largest captured batch x
tokens per request, draft tokens for EAGLE-3), else ``_FALLBACK_DECODE_WIDTH`` rows (64 in 0.5.23) when no CUDA
graph is captured; elements = rows x hidden. :func:`pcie_ipc_admission` lists the rest as evidence.
"""
from __future__ import annotations

import ast

from ... import source
from ...verdict import Evidence
from . import engine as se
from . import flags as sf

PCIE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
RUNNER_FILE = "srt/model_executor/runner/base_runner.py"
OPT_IN = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
MAX_NUMEL = "SGLANG_PCIE_IPC_MAX_NUMEL"


def _module_constant(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value), node.lineno
            except ValueError:
                vals = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)]
                return tuple(vals), node.lineno
    return None, 0


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


def tokens_per_request(engine: se.Engine, config, tensor) -> tuple[int, str]:
    """Rows per request in a decode step: ``--speculative-num-draft-tokens`` when a speculative algorithm is given
    (``_decode_width``: ``speculative_num_draft_tokens or 1`` if ``speculative_algorithm``), else the workload's
    tokens per verify step (the seed workload assumes EAGLE-3 with that many draft tokens)."""
    algo, _ = sf.config_value(engine, config, "--speculative-algorithm")
    if algo:
        n, where = sf.config_value(engine, config, "--speculative-num-draft-tokens")
        return int(n or 1), where
    return tensor.tokens, f"the workload's {tensor.tokens} tokens per verify step (no --speculative-algorithm given)"


def row_bound(engine: se.Engine, config, tensor) -> dict:
    """The PCIe IPC workspace bound for ``config`` and the decode ``tensor`` (a :class:`DecodeTensor`):
    ``{"max_numel": int | None (None: fixed at start-up from the captured batch sizes), "rows": int | None,
    "source": what sets it, "where": file:line, "admits": bool (the tensor's numel fits), "why": one sentence}``.
    Raises GateNotFound when ``_ensure_workspace`` or the fallback width is not found."""
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
    numel = tensor.rows * tensor.hidden
    override = config.var(MAX_NUMEL)
    if override:
        try:
            mx = int(override)
        except ValueError:
            mx = 0
        return {"max_numel": mx, "rows": mx // tensor.hidden, "source": f"{MAX_NUMEL}={override}",
                "where": f"{here}:{ensure.lineno} _ensure_workspace", "admits": numel <= mx,
                "why": f"{MAX_NUMEL}={override} sets the bound to {mx} elements ({mx // tensor.hidden} rows of "
                       f"{tensor.hidden}); the decode tensor has {numel}"}
    graphs, gwhere = cuda_graphs(engine, config)
    per_req, pwhere = tokens_per_request(engine, config, tensor)
    if not graphs:
        mx = fallback * tensor.hidden
        return {"max_numel": mx, "rows": fallback, "source": f"no CUDA graph ({gwhere}): _FALLBACK_DECODE_WIDTH",
                "where": f"{here}:{fline} _FALLBACK_DECODE_WIDTH", "admits": numel <= mx,
                "why": f"without CUDA graphs the workspace is sized from the fixed width {fallback} rows "
                       f"({here}:{fline}): a [{tensor.rows}, {tensor.hidden}] tensor "
                       + ("fits" if numel <= mx else "does not fit and stays on NCCL")}
    mbs_flags = [f for f in ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs") if f in sf.server_flags(engine)]
    mbs, mwhere = sf.config_value(engine, config, *mbs_flags) if mbs_flags else (None, "")
    runner = engine.file(RUNNER_FILE) if (engine.root / RUNNER_FILE).is_file() else None
    rwhere = f"{se.short(runner)} _widest_decode_rows" if runner else f"{here} _decode_width"
    if mbs:
        rows = int(mbs) * per_req
        return {"max_numel": rows * tensor.hidden, "rows": rows, "source": f"largest captured batch {mbs} ({mwhere}) "
                f"x {per_req} tokens per request ({pwhere})", "where": rwhere, "admits": tensor.batch <= int(mbs)
                and tensor.rows <= rows, "why": f"the bound is {mbs} x {per_req} = {rows} rows; the decode tensor has "
                f"{tensor.rows}"}
    return {"max_numel": None, "rows": None, "source": f"largest captured batch (chosen at start-up; {mwhere}) x "
            f"{per_req} tokens per request ({pwhere})", "where": rwhere, "admits": True,
            "why": f"the bound is the largest captured decode batch x {per_req} rows, so every decode batch that runs "
                   f"in a captured graph fits (batch {tensor.batch} x {per_req} = {tensor.rows} rows); a larger batch "
                   "runs without a graph and its tensor exceeds the bound"}


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
    sizes, sl = _module_constant(tree, "_SUPPORTED_WORLD_SIZES")
    out.append(Evidence("world sizes", {"supported": list(sizes or ()), "here": world_size,
                                        "admits": world_size in (sizes or ())}, f"{here}:{sl} _SUPPORTED_WORLD_SIZES"))
    det = _deterministic(engine, config)
    out.append(Evidence("deterministic inference turns it off", det, det.pop("where")))
    should = fns.get("should_pcie_ipc_ar")
    if should is None:
        raise se.GateNotFound(f"gate not found in sglang {engine.version} at {here}: no should_pcie_ipc_ar")
    checks = [ast.unparse(n.test) for n in ast.walk(should) if isinstance(n, ast.If)]
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
    """``_deterministic_collectives_enabled`` (parallel_state.py): SGLANG_USE_1STAGE_ALLREDUCE when set, else
    SGLANG_ENABLE_DETERMINISTIC_INFERENCE, which SGLang itself writes from --enable-deterministic-inference on every
    start-up (:func:`.startup.startup_overwrites`; sglang 0.5.23 ``serving_hook.py:444``): a value the user
    gives for it alone is then not read."""
    rel = "srt/distributed/parallel_state.py"
    fn = next((n for n in ast.walk(engine.tree(rel)) if isinstance(n, ast.FunctionDef)
               and n.name == "_deterministic_collectives_enabled"), None)
    where = f"sglang/{rel}:{fn.lineno} _deterministic_collectives_enabled" if fn else f"sglang/{rel} (not found)"
    one = config.var("SGLANG_USE_1STAGE_ALLREDUCE")
    flag, fwhere = sf.config_value(engine, config, "--enable-deterministic-inference")
    det_env = config.var("SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    from .startup import startup_overwrites

    over = startup_overwrites(engine).get("SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    if over is not None:        # SGLang writes it from the flag on every start-up: the user's value never reaches here
        det_env = None
    on = se.env_truthy(one) if one is not None else (bool(flag) or se.env_truthy(det_env))
    out = {"on": on, "SGLANG_USE_1STAGE_ALLREDUCE": one, "--enable-deterministic-inference": f"{flag} ({fwhere})",
           "where": where}
    if over is not None:
        out["SGLANG_ENABLE_DETERMINISTIC_INFERENCE"] = (f"overwritten from {over['flag']} at start-up ({over['set_at']}, "
                                                        f"run at {over['runs_at']})")
    return out
