"""An engine's own TP allreduce dispatch at world size N (SGLang's here; vLLM's through the same code, with
:class:`RuntimeEngine` ``VLLM`` and :class:`stackprobe.runtime.vllm_state.VllmDispatchProbe`): which path serves a
decode-shape tensor under the engine's graph capture with the user's server arguments, and whether it beats the same
group with only that path switched off. What follows names SGLang's steps; vLLM's are in
:mod:`stackprobe.runtime.vllm_state`.

:func:`run_dispatch` (``python -m stackprobe.runtime dispatch``; the ``--runtime`` tier of ``python -m stackprobe``,
which the cluster job runs with the user's ``--server-args`` / ``--env``):

1. **P2P first** (:mod:`stackprobe.runtime.p2p`): where P2P between any two GPUs of the group is off, or unknown
   while the host shows a risk, the paths that map peers' memory are not started: ``--disable-custom-all-reduce``
   is added to the server arguments and ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE`` set to ``0``, and each such path the
   configuration would have started is reported "skipped: no P2P between GPU i and j" with what to check.
2. **world_size rank processes** through :func:`stackprobe.runtime.orchestrate.run_probe` (own process group,
   parent-death signal, guard, subreaper, timeout: a hang in set-up is reported as a hang and no rank survives),
   the user's ``--env`` in every one of them, multicast off (``NCCL_NVLS_ENABLE=0``,
   ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``) unless ``--env`` says otherwise.
3. In each rank :func:`stackprobe.runtime.sglang_state.bring_up` (SGLang's parser, launch environment, its
   all-reduce switches, ``init_distributed_environment``, ``publish``, ``initialize_model_parallel``), then inside
   ONE ``tp.graph_capture()``: ``calls`` calls of ``tp.all_reduce`` on a bf16 ``[rows, hidden]`` tensor (rows =
   batch x draft tokens) captured as one CUDA graph with the serving path on, the same with only that path
   switched off (its ``disabled`` flag set, as SGLang itself switches a communicator off; the dispatch falls to
   the next step, normally pynccl), and an input-writes-only floor graph. Which method served every call of
   each graph is observed (:func:`stackprobe.runtime.sglang_state.observe`), not derived from the order.
4. Paired rounds (order rotating, a barrier before each trial), work = time - floor, merged over ranks round by
   round; the ratio ``work(on) / work(off)`` and its 95% bootstrap interval (:func:`stackprobe.runtime.stats.ratio_ci`)
   give ``faster`` / ``parity`` / ``slower`` / ``inconclusive`` (:func:`stackprobe.runtime.stats.status`). Each
   graph's output is poisoned and checked after a replay against the exact sum.

Faults that are never a ratio: the off-variant served by the same method as the on-variant (switching the path
off did not reach the dispatch), calls of one graph served by different methods, a wrong sum, a run that hung
or crashed. Every verdict carries the host it was measured on: a result from a host whose compute capability,
topology or world size differ from the target's is "measured here", never the target's verdict (case C20).

On a host without CUDA (gloo ranks) there are no CUDA graphs: the calls run eagerly inside the same
``graph_capture()`` context, and SGLang sends CPU tensors to gloo before asking any communicator
(``GroupCoordinator.all_reduce``: ``if input_.is_cpu``), so the CPU tests plant communicator stand-ins at that
edge (tests/sglang_dispatch_standins.py) and keep SGLang's own dispatch between them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import statistics
import time

from . import stats
from ..paths import PATHS, PCIE_IPC, communicator_rows
from .probes import Probe
from .verdicts import DEFAULT_TOLERANCE

PROBE_REF = "stackprobe.runtime.dispatch:SglangDispatchProbe"
_PCIE = {e: PATHS[PCIE_IPC].engines[e] for e in ("sglang", "vllm")}   # its switch and communicator
PCIE_OPT_IN = _PCIE["sglang"].switch   # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE
DISABLE_CA = "--disable-custom-all-reduce"
# GroupCoordinator attribute -> the runtime row name (stackprobe.runtime.engine's): each path's record
# (stackprobe.paths, EnginePath.communicator / .row), then torch.distributed, the last step, which is no path
TORCH_DISTRIBUTED = {"torch.distributed": "torch-distributed"}
ROW = {**communicator_rows("sglang"), **TORCH_DISTRIBUTED}
# the last steps of SGLang's dispatch: nothing behind them to fall to, so nothing to switch off
FALLBACKS = ("pynccl_comm", "torch.distributed")
ON, OFF, FLOOR = "on", "off", "floor"


@dataclasses.dataclass(frozen=True)
class RuntimeEngine:
    """What the dispatch probe needs to know of one engine: its ``name`` (``--engine``), ``title``, the rank-side
    probe (``probe_ref``, module:attr), the variable that opts into its PCIe IPC allreduce (set to 0 where P2P is
    off), ``rows`` (communicator attribute -> row name) and ``fallbacks`` (the dispatch's last steps: nothing
    behind them to switch to)."""

    name: str
    title: str
    probe_ref: str
    pcie_opt_in: str
    pcie_attr: str
    rows: dict
    fallbacks: tuple = FALLBACKS
    state: str = ""          # the module that brings the engine up (cited in the evidence)
    out_subdir: str | None = None   # where the runtime tier writes its dispatch report under its folder (None: name)
    ca_off_flag: str = DISABLE_CA   # the server flag that switches its custom allreduce (rows["ca_comm"]) off


SGLANG = RuntimeEngine("sglang", "SGLang", PROBE_REF, PCIE_OPT_IN, _PCIE["sglang"].communicator, ROW,
                       state="stackprobe.runtime.sglang_state.bring_up", out_subdir="")
# vLLM 0.33.0 CudaCommunicator attribute -> row (vllm/distributed/device_communicators/cuda_communicator.py)
# (the path records' vLLM communicators; AITER's custom allreduce, ROCm only, has no record)
VLLM_ROW = {**communicator_rows("vllm"), "aiter_ar_comm": "vllm-aiter-custom-allreduce", **TORCH_DISTRIBUTED}
VLLM = RuntimeEngine("vllm", "vLLM", "stackprobe.runtime.vllm_state:VllmDispatchProbe",
                     _PCIE["vllm"].switch, _PCIE["vllm"].communicator, VLLM_ROW,
                     state="stackprobe.runtime.vllm_state.bring_up")


def runtime_engines() -> dict[str, RuntimeEngine]:
    """Engine name -> :class:`RuntimeEngine` of every engine in :mod:`stackprobe.engines`' registry that has one
    (``ServingEngine.runtime``), in registration order."""
    from ..engines import registered
    out = {}
    for name, cls in registered().items():
        rt = cls().runtime
        if rt is not None:
            out[name] = rt
    return out


def engine_of(name: str) -> RuntimeEngine:
    """The :class:`RuntimeEngine` of registered engine ``name``; raises ``ValueError`` naming the choices."""
    engines = runtime_engines()
    if name not in engines:
        raise ValueError(f"--engine {name!r}: the dispatch probe knows {', '.join(engines)}")
    return engines[name]


def dispatch_plans(names: list[str], out: str) -> list[tuple[RuntimeEngine, str]]:
    """The runtime tier's plan of engine dispatch runs: for each registered engine with a :class:`RuntimeEngine`
    that ``names`` (the report's engines) lists, in registration order, ``(its record, the folder its
    dispatch.json / dispatch.md go to)``: ``out/<out_subdir>`` (``out`` itself where ``out_subdir`` is "")."""
    plans = []
    for name, rt in runtime_engines().items():
        if name in names:
            sub = rt.name if rt.out_subdir is None else rt.out_subdir
            plans.append((rt, f"{out}/{sub}" if sub else out))
    return plans


# --------------------------------------------------------------------------------------------- parent side
def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def parse_env(items: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` -> dict. Raises ``ValueError`` naming an item without ``=``."""
    env = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise ValueError(f"--env {kv!r}: write KEY=VALUE")
        env[k] = v
    return env


def plan(server_args: str, env: dict[str, str], world_size: int, p2p_report: dict,
         engine: RuntimeEngine = SGLANG) -> dict:
    """What the ranks start with: ``{"server_args", "env", "p2p_reason", "skipped": [{"backend", "reason"}]}``.

    ``p2p_report``: :func:`stackprobe.runtime.p2p.host_report` (or a saved one). Where
    :func:`stackprobe.runtime.p2p.skip_reason` refuses the group's GPUs ``0..world_size-1``, custom allreduce is
    switched off by SGLang's own flag and the PCIe IPC opt-in set to 0; a path the configuration would have
    started is listed as skipped with the reason. Raises ``ValueError`` for server arguments that are not one
    shell-quoted string."""
    from . import p2p
    try:
        argv = shlex.split(server_args or "")
    except ValueError as exc:
        raise ValueError(f"--server-args {server_args!r} is not one shell-quoted string of {engine.title} flags "
                         f"({exc}); write it as after the engine's server command, e.g. "
                         "\"--disable-custom-all-reduce\"") \
            from None
    env = dict(env)
    reason = p2p.skip_reason(p2p_report, list(range(world_size))) if world_size > 1 else None
    skipped = []
    if reason:
        if engine.ca_off_flag not in argv:
            argv.append(engine.ca_off_flag)
            skipped.append({"backend": engine.rows["ca_comm"], "reason": reason})
        if _truthy(env.get(engine.pcie_opt_in)):
            skipped.append({"backend": engine.rows[engine.pcie_attr], "reason": reason})
        env[engine.pcie_opt_in] = "0"
    return {"server_args": shlex.join(argv), "env": env, "p2p_reason": reason, "skipped": skipped}


def merge(ranks: list[dict]) -> dict:
    """The ranks' ``after`` records merged: ``{"rounds", "samples_us": {unit: [per-round mean over ranks]},
    "paths": rank 0's, "paths_per_rank", "checks": {unit: all ranks' AND (None where unchecked)}}``."""
    recs = [(r.get("bring_up") or {}).get("after") or {} for r in ranks]
    out: dict = {"paths_per_rank": [r.get("paths") for r in recs], "paths": recs[0].get("paths") if recs else None}
    units = [u for u in (ON, OFF, FLOOR) if all(u in (r.get("samples_us") or {}) for r in recs)]
    out["samples_us"] = {}
    for u in units:
        per = [r["samples_us"][u] for r in recs]
        n = min(len(p) for p in per)
        out["samples_us"][u] = [statistics.fmean(p[i] for p in per) for i in range(n)]
    checks: dict = {}
    for u in (ON, OFF):
        vals = [(r.get("checks") or {}).get(u) for r in recs]
        checks[u] = False if False in vals else (True if vals and all(v is True for v in vals) else None)
    out["checks"] = checks
    out["rounds"] = min((len(v) for v in out["samples_us"].values()), default=0)
    return out


def _ci(vals: list[float]) -> dict:
    m, lo, hi = stats.mean_ci(vals)
    return {"mean": m, "low": lo, "high": hi}


def paired(merged: dict) -> dict:
    """``{"work_us": {on, off}, "ratio": {"value", "low", "high"}, "rounds"}`` from :func:`merge`'s samples:
    work = time - floor round by round, ratio = mean work(on) / mean work(off) with its 95% bootstrap interval.
    Raises ``ValueError`` when a unit has no samples."""
    s = merged["samples_us"]
    if not all(s.get(u) for u in (ON, OFF, FLOOR)):
        raise ValueError(f"no paired samples for {[u for u in (ON, OFF, FLOOR) if not s.get(u)]}")
    n = min(len(s[u]) for u in (ON, OFF, FLOOR))
    on, off = stats.net(s[ON][:n], s[FLOOR][:n]), stats.net(s[OFF][:n], s[FLOOR][:n])
    r, lo, hi = stats.ratio_ci(off, on)
    return {"rounds": n, "work_us": {ON: _ci(on), OFF: _ci(off)}, "time_us": {u: _ci(s[u][:n]) for u in s},
            "ratio": {"value": r, "low": lo, "high": hi}}


def target_note(host: dict, target: dict | None) -> dict:
    """``{"for_target": bool, "note": "..."}``: whether ``host`` (compute_capability, topology, world_size) is the
    ``target``'s; otherwise the result is "measured here (SMxx, topology, ws N)", not the target's verdict (C20)."""
    from ..report import host_label
    here = f"measured here ({host_label(host)})"
    if not target:
        return {"for_target": False, "note": f"{here}; no target given, so no verdict for one"}
    same = all(host.get(k) is not None and str(host.get(k)).rstrip("af") == str(target.get(k)).rstrip("af")
               for k in ("compute_capability", "topology", "world_size") if target.get(k) is not None)
    if same and host.get("compute_capability") is not None:
        return {"for_target": True, "note": f"{here}, which is the target"}
    return {"for_target": False, "note": f"{here}; the target is {host_label(target)}: not a verdict for the target"}


def verdicts(result: dict, tolerance: float = DEFAULT_TOLERANCE) -> list:
    """Runtime verdicts (scope ``engine``) of one :func:`run_dispatch` result (see the module docstring)."""
    from ..verdict import (BASELINE, BLOCKED, ERROR, GATE_CRASH, GATE_HANG, GATE_TOPOLOGY, GATE_WRONG,
                           LIFT_NONE_NEEDED, LIFT_UNKNOWN, SCOPE_ENGINE, SKIPPED, Verdict)
    host, where = dict(result["host"]), result["target_note"]
    ws = host.get("world_size")
    eng = engine_of(result.get("engine", "sglang"))
    whole, title = f"{eng.name}-dispatch", eng.title

    def verdict(name, status, **kw) -> Verdict:
        v = Verdict(name, status, tier="runtime", scope=SCOPE_ENGINE, host=dict(host),
                    measurements={"world_size": ws, "measured_here": where["note"], "for_target": where["for_target"],
                                  "server_args": result["plan"]["server_args"]}, **kw)
        return v
    out = [verdict(s["backend"], SKIPPED, gate=GATE_TOPOLOGY, lift=LIFT_UNKNOWN, cause=s["reason"])
           for s in result["plan"]["skipped"]]
    run = result["run"]
    if run["status"] != "ok":
        gate = GATE_HANG if run["status"] == "hang" else GATE_CRASH
        last = next((ln for ln in reversed(run.get("tail") or []) if ln.strip()), "")
        what = (f"no result within {result['timeout_s']} s; every rank was killed (left alive: "
                f"{run.get('leftover_pids') or 'none'})" if run["status"] == "hang"
                else f"rank {run.get('failed_rank')} exited with "
                     f"{(run.get('returncodes') or [None])[run.get('failed_rank') or 0]}")
        v = verdict(whole, BLOCKED, gate=gate, lift=LIFT_UNKNOWN,
                    cause=f"{run['status']} while bringing {title} up or timing it: {what}; last line: {last}")
        v.add("last lines of output", run.get("tail") or [], "rank process log")
        return out + [v]
    bu = [r.get("bring_up") or {} for r in run["ranks"]]
    err = next((b["error"] for b in bu if b.get("error")), None)
    if err:
        v = verdict(whole, ERROR, gate=GATE_CRASH, lift=LIFT_UNKNOWN,
                    cause=f"{title}'s bring-up failed at step {len(bu[0].get('steps', []))}: {err}")
        v.add("bring-up steps (rank 0)", bu[0].get("steps"), eng.state)
        return out + [v]
    m = result["merged"]
    paths = m["paths"] or {}
    aft = bu[0].get("after") or {}
    where_run = (f"under {title}'s graph capture" if aft.get("graph") == "cuda" and not aft.get("graph_capture")
                 else f"in eager calls inside {title}'s graph_capture() context (no CUDA graph on this host: "
                      f"{aft.get('graph_capture') or aft.get('graph') or 'not recorded'})")
    on = paths.get(ON)
    name = eng.rows.get((on or "").split(".")[0] if on and not on.startswith("torch.distributed")
                        else "torch.distributed", on or whole)
    ev = {"paths (rank 0)": paths, "paths per rank": m["paths_per_rank"],
          "server args as parsed (rank 0)": bu[0].get("server_args"),
          "all-reduce switches (rank 0)": bu[0].get("all_reduce_flags"),
          "communicators (rank 0)": bu[0].get("communicators")}

    def evidence(v):
        for k, val in ev.items():
            v.add(k, val, f"{title}'s own GroupCoordinator, observed")
        return v
    if any(p != m["paths_per_rank"][0] for p in m["paths_per_rank"]):
        return out + [evidence(verdict(name, ERROR, gate=GATE_CRASH, lift=LIFT_UNKNOWN,
                                       cause="the ranks were served by different paths: "
                                             f"{m['paths_per_rank']}; no comparison"))]
    for unit in (ON, OFF):
        mixed = paths.get(f"{unit}_mixed")
        if mixed:
            return out + [evidence(verdict(name, ERROR, gate=GATE_CRASH, lift=LIFT_UNKNOWN,
                                           cause=f"the calls of the {unit} graph were served by different methods "
                                                 f"({mixed}); no comparison"))]
    if not on:
        return out + [evidence(verdict(name, ERROR, lift=LIFT_UNKNOWN,
                                       cause="no observed method served the call (a path the observation does "
                                             "not list); attribution unknown, not guessed"))]
    attr = on.split(".")[0]
    if attr in eng.fallbacks or on.startswith("torch.distributed"):
        return out + [evidence(verdict(name, BASELINE, lift=LIFT_NONE_NEEDED,
                                       cause=f"served by {on} {where_run}: the dispatch's NCCL step (behind it "
                                             "only torch.distributed on the same group), so nothing to compare it "
                                             "with; it is the baseline here"))]
    off = paths.get(OFF)
    if off == on:
        return out + [evidence(verdict(name, ERROR, gate=GATE_CRASH, lift=LIFT_UNKNOWN,
                                       cause=f"fault: with {attr} switched off the calls were still served by {on}; "
                                             "switching the path off did not reach the dispatch, so no ratio is "
                                             "reported"))]
    wrong = [u for u in (ON, OFF) if m["checks"].get(u) is False]
    if wrong:
        return out + [evidence(verdict(name, BLOCKED, gate=GATE_WRONG, lift=LIFT_UNKNOWN,
                                       cause=f"wrong sum after a replay with the output poisoned: {', '.join(wrong)} "
                                             f"({on} / {off})"))]
    try:
        p = paired(m)
    except ValueError as exc:
        return out + [evidence(verdict(name, ERROR, lift=LIFT_UNKNOWN, cause=f"no paired timing: {exc}"))]
    r = p["ratio"]
    st = stats.status(r["low"], r["high"], tolerance, p["rounds"])
    v = evidence(verdict(name, st, lift=LIFT_NONE_NEEDED if st == stats.FASTER else LIFT_UNKNOWN,
                         cause=(f"served by {on} {where_run}; ratio of work per call to the same "
                                f"group with {attr} switched off (served by {off}) {r['value']:.3f}, 95% interval "
                                f"[{r['low']:.3f}, {r['high']:.3f}] over {p['rounds']} paired rounds (tolerance "
                                f"{tolerance:.0%}); {p['work_us'][ON]['mean']:.2f} vs {p['work_us'][OFF]['mean']:.2f} "
                                f"us; {where['note']}")))
    unchecked = [u for u in (ON, OFF) if m["checks"].get(u) is None]
    if unchecked:
        v.warnings.append(f"output not checked for {', '.join(unchecked)} (no values: a meta tensor)")
    v.measurements.update(ratio_to_baseline=r["value"], ratio_low=r["low"], ratio_high=r["high"],
                          rounds=p["rounds"], work_us=p["work_us"][ON]["mean"],
                          work_low_us=p["work_us"][ON]["low"], work_high_us=p["work_us"][ON]["high"],
                          baseline_work_us=p["work_us"][OFF]["mean"], baseline_path=off, path=on)
    return out + [v]


def host_of(run, world_size: int, device: str) -> dict:
    """The host block of a run: compute capability, topology (``nvlink`` / ``pcie`` / ``none`` on CPU), world size."""
    env = (run.ranks[0].get("env") if run.ranks else {}) or {}
    if device != "cuda":
        return {"compute_capability": None, "topology": "none", "world_size": world_size, "torch": env.get("torch")}
    from .suite import topology
    topo = topology()
    return {"compute_capability": env.get("compute_capability"), "gpu": env.get("gpu_name"),
            "topology": ("nvlink" if topo.get("nvlink") else "pcie") if topo else None, "world_size": world_size,
            "torch": env.get("torch"), "nccl": env.get("torch_nccl_version")}


def run_dispatch(server_args: str = "", env: dict[str, str] | None = None, world_size: int = 2, *,
                 device: str = "cuda", rows: int = 12, hidden: int = 7168, calls: int = 122, replays: int = 10,
                 rounds: int = 30, warmup: int = 3, timeout: float = 300.0, p2p_report: dict | None = None,
                 target: dict | None = None, tolerance: float = DEFAULT_TOLERANCE, probe_ref: str = "",
                 progress=None, engine: str = "sglang") -> dict:
    """Run the probe (module docstring) and return ``{"plan", "p2p", "host", "target_note", "config", "run",
    "merged", "timeout_s", "verdicts"}``.

    ``env``: the user's ``--env`` (set in every rank, over the suite's defaults). ``p2p_report``: a saved
    :func:`stackprobe.runtime.p2p.host_report` (default: this host's, read before any rank starts, with ``env``
    over the process environment). ``target``: ``{"compute_capability", "topology", "world_size"}`` the verdicts
    are for (C20). ``rows`` x ``hidden``: the decode tensor (bf16); ``calls``: all_reduce calls per captured graph;
    ``replays``: graph replays per timed trial; ``rounds``: paired rounds. ``engine``: a registered engine's name
    (:func:`runtime_engines`); ``probe_ref`` (module:attr) replaces its rank-side probe. Raises ``ValueError`` for bad input,
    before any rank starts."""
    from . import p2p
    from .orchestrate import run_probe
    env = dict(env or {})
    eng = engine_of(engine)
    if world_size < 1 or rows < 1 or hidden < 1 or calls < 1 or replays < 1:
        raise ValueError(f"world size {world_size}, rows {rows}, hidden {hidden}, calls {calls}, replays {replays}: "
                         "each must be at least 1")
    if rounds < 2:
        raise ValueError(f"--rounds {rounds}: an interval needs at least 2 paired rounds")
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance {tolerance}: write a fraction between 0 and 1 (0.05 = 5 %)")
    top = world_size * 6 + world_size * (world_size - 1) // 2
    if top > 256:
        raise ValueError(f"world size {world_size}: checked sums up to {top} are not exact in bf16 (256)")
    report = p2p_report if p2p_report is not None else p2p.host_report(env={**os.environ, **env})
    pl = plan(server_args, env, world_size, report, eng)
    config = {"rows": rows, "hidden": hidden, "calls": calls, "replays": replays, "rounds": rounds, "warmup": warmup}
    run = run_probe(probe_ref or eng.probe_ref, world_size, {"sizes": [rows * hidden * 2]}, device=device,
                    timeout=timeout, env_overrides=pl["env"], name=f"{eng.name}-dispatch", progress=progress,
                    extra={"server_args": pl["server_args"], "dispatch": config})
    host = host_of(run, world_size, device)
    result = {"engine": eng.name, "plan": pl, "p2p": report, "host": host, "target_note": target_note(host, target), "config": config,
              "tolerance": tolerance, "timeout_s": timeout, "run": run.to_json(),
              "merged": merge(run.ranks) if run.status == "ok" else None}
    result["verdicts"] = [v.to_json() for v in verdicts(result, tolerance)]
    return result


def markdown(result: dict) -> str:
    """A short Markdown page of one :func:`run_dispatch` result."""
    from .. import mdtable
    h, pl = result["host"], result["plan"]
    lines = [f"# {engine_of(result.get('engine', 'sglang')).title}'s allreduce dispatch, measured", "",
             f"Server args as run: `{pl['server_args'] or '(none)'}`; env {pl['env'] or '{}'}; world size "
             f"{h.get('world_size')}; {result['target_note']['note']}.", "",
             f"P2P: {pl['p2p_reason'] or 'no reason to skip a peer-memory path'}", "",
             f"Run: {result['run']['status']} in {result['run']['seconds']} s.", "",
             *mdtable.header(("path", "status", "gate", "ratio to path off [95%]", "why"))]
    for v in result["verdicts"]:
        m = v.get("measurements") or {}
        ratio = (f"{m['ratio_to_baseline']:.3f} [{m['ratio_low']:.3f}, {m['ratio_high']:.3f}]"
                 if m.get("ratio_to_baseline") is not None else "-")
        lines.append(mdtable.row((v["backend"], v["status"], v.get("gate") or "-", ratio, v["cause"])))
    return "\n".join(lines) + "\n"


def write(result: dict, out_dir) -> dict:
    """``dispatch.json`` and ``dispatch.md`` in ``out_dir`` (atomically); returns their paths."""
    import json
    from pathlib import Path

    from ..atomic import write_atomic
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "dispatch.json", "markdown": out / "dispatch.md"}
    write_atomic(paths["json"], json.dumps(result, indent=2, default=str) + "\n")
    write_atomic(paths["markdown"], markdown(result))
    return paths


# ----------------------------------------------------------------------------------------------- rank side
@contextlib.contextmanager
def switched_off(holder, attr: str):
    """Inside, the communicator ``holder.<attr>`` is off for the engine's dispatch: its ``disabled`` flag set (how
    both engines switch a communicator off: SGLang's ``GroupCoordinator`` holds them, vLLM's ``CudaCommunicator``
    does), or the attribute set to None where the communicator has no such flag."""
    comm = getattr(holder, attr)
    if hasattr(comm, "disabled"):
        old = comm.disabled
        comm.disabled = True
        try:
            yield
        finally:
            comm.disabled = old
    else:
        setattr(holder, attr, None)
        try:
            yield
        finally:
            setattr(holder, attr, comm)


def expected(numel: int, world_size: int, device):
    """The exact sum every rank's output must hold: ``n * (i % 7) + n(n-1)/2`` (fp32), for inputs
    ``(i % 7) + rank`` (:func:`fill`)."""
    import torch
    idx = torch.arange(numel, device=device) % 7
    return (world_size * idx + world_size * (world_size - 1) // 2).to(torch.float32)


def fill(t, rank: int) -> None:
    """``t = (i % 7) + rank`` over its flattened elements (nothing for a meta tensor)."""
    import torch
    if t.is_meta:
        return
    idx = torch.arange(t.numel(), device=t.device) % 7
    t.copy_((idx + rank).to(t.dtype).view(t.shape))


class SglangDispatchProbe(Probe):
    """The rank side: :meth:`run` brings the engine up (SGLang here: :func:`stackprobe.runtime.sglang_state.bring_up`)
    and times its dispatch in the ``after`` hook. Subclasses (the CPU tests') override :meth:`before` and
    :meth:`tensor`; another engine's probe (:class:`stackprobe.runtime.vllm_state.VllmDispatchProbe`) overrides
    ``engine``, :meth:`bring_up`, :meth:`observe` and :meth:`switched_off`."""

    name = "sglang-dispatch"
    label = "SGLang's own TP all_reduce dispatch"
    requires = ("torch", "sglang")
    group = "sglang-dispatch"
    engine = SGLANG

    def before(self, ctx) -> None:
        """Called in the rank before the bring-up (nothing here)."""

    def tensor(self, tp, rows: int, hidden: int, ctx):
        """The decode tensor: bf16 ``[rows, hidden]`` on the group's device."""
        import torch
        return torch.empty(rows, hidden, dtype=torch.bfloat16, device=tp.device)

    def bring_up(self, server_args: str, ctx, cfg: dict, cuda: bool, after) -> dict:
        """The engine's bring-up in this rank; ``after(tp, rep)`` is called with its TP group. Returns its report."""
        from . import sglang_state
        return sglang_state.bring_up(server_args, ctx.world_size, ctx.rank, backend="nccl" if cuda else "gloo",
                                     rows=cfg["rows"], hidden=cfg["hidden"], before=lambda: self.before(ctx),
                                     after=after)

    def observe(self, tp, calls: list):
        """A context manager: inside, every serving method of the group appends its label to ``calls``."""
        from .sglang_state import observe
        return observe(tp, calls)

    def switched_off(self, tp, attr: str):
        """A context manager: inside, the path ``attr`` is off for the engine's dispatch."""
        return switched_off(tp, attr)

    def switchable(self, tp, attr: str) -> bool:
        """Whether the path ``attr`` exists in this group and can be switched off."""
        return getattr(tp, attr, None) is not None

    def run(self, ctx) -> dict:
        spec = ctx.spec
        cfg = spec["dispatch"]
        cuda = ctx.device.startswith("cuda")
        rep = self.bring_up(spec.get("server_args", ""), ctx, cfg, cuda,
                            after=lambda tp, rep: self.measure(tp, ctx, cfg, cuda))
        ctx.log(f"bring-up steps {rep.get('steps')}; error {rep.get('error')}")
        return {"bring_up": rep}

    def measure(self, tp, ctx, cfg: dict, cuda: bool) -> dict:
        """In the rank: the on / off / floor units inside one ``tp.graph_capture()`` (:meth:`build_units`), their
        observed paths, checks (:meth:`check_units`) and paired samples (:meth:`paired_timing`, us per call)."""
        import torch
        x = self.tensor(tp, cfg["rows"], cfg["hidden"], ctx)
        src = torch.empty_like(x)
        fill(src, ctx.rank)
        out: dict = {"paths": {}, "checks": {}, "samples_us": {}, "graph": "cuda" if cuda else "eager (no CUDA)"}
        units = self.build_units(_Units(self, tp, x, src, cfg["calls"], cuda, out["paths"]), out)
        if OFF not in units:
            return out
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        self.check_units(units, ctx.world_size, sync, out["checks"])
        samples = self.paired_timing(units, ctx, cfg, sync)
        out["samples_us"] = samples
        out["finite"] = all(math.isfinite(v) for s in samples.values() for v in s)
        return out

    def build_units(self, b: _Units, out: dict) -> dict:
        """Phase 1: inside one ``tp.graph_capture()`` (or eager where it cannot be entered, the reason in
        ``out["graph_capture"]``), the on unit, the off unit with the path that served on switched off (only where
        :meth:`off_path` names one) and the floor unit (copies, no all_reduce); the capture is left also when a
        unit fails. Returns the units by name."""
        ctx_gc, gc = _enter_capture(b.tp, out)
        try:
            stream = gc.stream if gc is not None else None
            b.build(ON, stream)
            attr = self.off_path(b.tp, b.paths.get(ON))
            if attr:
                b.off_attr = attr
                with self.switched_off(b.tp, attr):
                    b.build(OFF, stream)
            b.build(FLOOR, stream)
        finally:
            if ctx_gc is not None:
                ctx_gc.__exit__(None, None, None)
        return b.units

    def off_path(self, tp, served: str | None) -> str | None:
        """The communicator attribute behind the path that served the on unit (``served``, ``attr.method``) where
        the off unit can switch it: a row of the engine, not one of its fallbacks, switchable in ``tp``; else None."""
        attr = (served or "").split(".")[0]
        eng = self.engine
        if attr and attr in eng.rows and attr not in eng.fallbacks and self.switchable(tp, attr):
            return attr
        return None

    @staticmethod
    def check_units(units: dict, world_size: int, sync, checks: dict) -> None:
        """Phase 2: the on and off units' results against the exact sum (:func:`_check_unit`), into ``checks``."""
        want = None
        for u in (ON, OFF):
            checks[u], want = _check_unit(units[u], world_size, sync, want)

    @staticmethod
    def paired_timing(units: dict, ctx, cfg: dict, sync) -> dict:
        """Phase 3: ``cfg["warmup"]`` replays of every unit, then ``cfg["rounds"]`` rounds of each unit's
        ``cfg["replays"]`` replays, the units' order rotating by one each round, after a barrier each. Returns the
        samples per unit (us per call)."""
        live = [u for u in (ON, OFF, FLOOR) if u in units]
        for _ in range(cfg["warmup"]):
            for u in live:
                units[u]["replay"]()
        sync()
        samples: dict = {u: [] for u in live}
        per = cfg["calls"] * cfg["replays"]
        for r in range(cfg["rounds"]):
            order = live[r % len(live):] + live[:r % len(live)]
            for u in order:
                sync()
                ctx.barrier()
                t0 = time.perf_counter()
                for _ in range(cfg["replays"]):
                    units[u]["replay"]()
                sync()
                samples[u].append((time.perf_counter() - t0) * 1e6 / per)
        return samples


def _enter_capture(tp, out: dict):
    """``(context, its value)`` of ``tp.graph_capture()`` entered, or ``(None, None)`` where it cannot be (CPU: no
    device stream), the reason recorded in ``out["graph_capture"]``."""
    try:
        ctx_gc = tp.graph_capture()
        return ctx_gc, ctx_gc.__enter__()
    except Exception as exc:  # noqa: BLE001 - CPU: no device stream; recorded, eager calls instead
        out["graph_capture"] = f"not entered: {type(exc).__name__}: {str(exc)[:200]}"
        return None, None


def _check_unit(unit: dict, world_size: int, sync, want):
    """One unit's check: replayed, its result (``None`` where the path returns none or a meta tensor) poisoned with
    NaN and replayed again, then compared with the exact sum ``want`` (:func:`expected`, made from the first result
    where ``want`` is None; an integer result is False). Returns ``(True | False | None, want)``."""
    import torch
    unit["replay"]()
    sync()
    got = unit["holder"][0]
    if got is None or getattr(got, "is_meta", False):
        return None, want
    if want is None:
        want = expected(got.numel(), world_size, got.device)
    if not got.dtype.is_floating_point:
        return False, want
    got.fill_(float("nan"))
    unit["replay"]()
    sync()
    return bool(torch.equal(unit["holder"][0].float().flatten(), want)), want


class _Units:
    """The units of one :meth:`SglangDispatchProbe.measure`: :meth:`build` records one (``ON``, ``OFF``,
    ``FLOOR``) into ``units`` (``{"replay", "holder"}``, plus ``"graph"`` on CUDA) and the path that served it into
    ``paths``. Each unit is ``calls`` all_reduce calls of ``x`` (refilled from ``src`` before each; the floor unit:
    the refills alone)."""

    def __init__(self, probe, tp, x, src, calls: int, cuda: bool, paths: dict):
        self.probe, self.tp, self.x, self.src, self.n, self.cuda, self.paths = probe, tp, x, src, calls, cuda, paths
        self.units: dict = {}
        self.off_attr: str | None = None      # the path the off unit runs with switched off (set before it is built)

    def body(self, unit: str, holder: list, calls: list | None = None, served: list | None = None):
        """The unit's calls; each result into ``holder[0]``, the label of the method that served it into ``served``
        (the first one ``calls`` gained during the call)."""
        x, src, tp = self.x, self.src, self.tp

        def run_calls():
            for _ in range(self.n):
                x.copy_(src)
                if unit != FLOOR:
                    start = len(calls) if calls is not None else 0
                    holder[0] = tp.all_reduce(x)
                    if served is not None:      # the first method this call reached: the one that served it
                        served.append(calls[start] if calls is not None and len(calls) > start else None)
        return run_calls

    def build(self, unit: str, stream) -> None:
        """The unit run once under the probe's observation: captured into a CUDA graph (on ``stream``) or, eager,
        run; then its replay, and the path that served it."""
        holder: list = [None]
        calls: list = []
        served: list = []
        fn = self.body(unit, holder, calls, served)
        with self.probe.observe(self.tp, calls):
            replay = self._record(unit, fn, holder, stream)
        if unit != FLOOR:
            labels = sorted(set(served), key=str)
            self.paths[unit] = served[0] if served else None
            if len(labels) > 1:
                self.paths[f"{unit}_mixed"] = {str(lb): served.count(lb) for lb in labels}
        self.units.setdefault(unit, {}).update(replay=replay, holder=holder)

    def _record(self, unit: str, fn, holder: list, stream):
        """``fn`` captured into a CUDA graph (its replay), or, eager, run once; then the unit's replay: the calls
        without the observation, dispatched anew each time, so the off unit's replays run with its path off again."""
        import torch
        if self.cuda:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                fn()
            self.units[unit] = {"graph": g}
            return g.replay
        fn()
        plain = self.body(unit, holder)
        if unit != OFF:
            return plain
        probe, tp, attr = self.probe, self.tp, self.off_attr

        def replay():
            with probe.switched_off(tp, attr):
                plain()
        return replay

