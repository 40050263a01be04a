"""Verdict rules of the runtime tier: a backend's measured row against NCCL Ring measured in the same run.

Rules, first match wins (the decode size is the sweep's first size):

1. skipped before running (library not installed, too few GPUs) -> ``skipped``;
2. the process group crashed or hung -> ``blocked`` (gate ``crash`` / ``hang``), with the last output lines;
3. a setting made a collective fail (``NCCL_ALGO=Tree``: all_gather / reduce_scatter have no Tree algorithm,
   ncclInvalidUsage) -> ``blocked`` (gate ``setting``), lifted by the per-collective form the probe names;
4. a wrong result at any size, eager or captured -> ``blocked`` (gate ``wrong-result``);
5. CUDA graph capture failed at the decode size -> ``blocked`` (gate ``cuda-graph``);
6. the call raised at the decode size -> ``blocked`` (gate ``crash``);
7. no usable baseline -> ``error``;
8. ratio = latency / baseline latency at the decode size, CUDA-graph figures (eager where the device has no
   graphs): ``unblocked`` when ratio <= 1 - tolerance *and* the backend's slowest repeat is faster than the
   baseline's fastest (the ranges of the repeats do not overlap: faster beyond the noise), else
   ``works-but-slower`` (the cause says: overlapping ranges, at parity within the tolerance, or slower).

The baseline row itself is reported ``unblocked`` with cause "baseline" (it works; its ratio is 1).
"""
from __future__ import annotations

from ..verdict import (BLOCKED, ERROR, GATE_CRASH, GATE_CUDA_GRAPH, GATE_HANG, GATE_NEEDS_RUNTIME,
                       GATE_NOT_INSTALLED, GATE_SETTING, GATE_TOPOLOGY, GATE_WRONG, LIFT_NONE_NEEDED,
                       LIFT_PACKAGE, LIFT_SETTING, LIFT_UNKNOWN, SKIPPED, UNBLOCKED, WORKS_SLOWER, Verdict)
from .workload import Workload, latency_at

DEFAULT_TOLERANCE = 0.05


def decode_latency(row: dict) -> tuple[float | None, str]:
    """(us, mode) at the decode size: the CUDA graph median when captured, else the eager median."""
    if not row.get("sweep"):
        return None, ""
    rec = row["sweep"][0]
    g = rec.get("graph") or {}
    if g.get("status") == "ok":
        return g["median_us"], "graph"
    if g.get("status") == "not-applicable" and rec.get("eager"):
        return rec["eager"]["median_us"], "eager"
    return None, ""


def curve(row: dict, mode: str) -> list[tuple[int, float]]:
    """``(bytes, us)`` points of one mode (``eager`` / ``graph``) over the sweep."""
    pts = []
    for rec in row.get("sweep", []):
        m = rec.get(mode) or {}
        if m.get("median_us") and (mode == "eager" or m.get("status") == "ok"):
            pts.append((rec["bytes"], m["median_us"]))
    return pts


def _measurements(row: dict, workload: Workload | None) -> dict:
    m: dict = {"world_size": row["world_size"]}
    if not row.get("sweep"):
        return m
    rec = row["sweep"][0]
    m["decode_bytes"] = rec["bytes"]
    e, g = rec.get("eager") or {}, rec.get("graph") or {}
    if e:
        m.update(eager_us=e.get("median_us"), eager_spread_pct=e.get("spread_pct"), eager_repeats=e.get("repeats"),
                 eager_calls_per_repeat=e.get("calls_per_repeat"))
    if g.get("status") == "ok":
        m.update(graph_us=g.get("median_us"), graph_spread_pct=g.get("spread_pct"), graph_repeats=g.get("repeats"),
                 graph_calls=g.get("calls_per_graph"), algbw_gbps=g.get("algbw_gbps"), busbw_gbps=g.get("busbw_gbps"))
    elif g:
        m["graph_status"] = g.get("status")
    m["sizes_measured"] = [r["bytes"] for r in row["sweep"] if "eager" in r]
    us, mode = decode_latency(row)
    if workload and us:
        pts = curve(row, mode)
        step = latency_at(pts, workload.message_bytes)
        if step is not None:
            m["step_us"] = step * workload.calls_per_step
            m["step_mode"] = mode
    return m


def decide(row: dict, baseline: dict | None, tolerance: float = DEFAULT_TOLERANCE,
           workload: Workload | None = None, baseline_name: str = "nccl-ring") -> Verdict:
    """The runtime :class:`~stackprobe.verdict.Verdict` of one row (see module doc for the rules).

    ``row``/``baseline``: aggregated rows (``backend``, ``world_size``, ``outcome``, ``sweep``, ``failure``,
    ``tail``, ``skip_reason``). ``tolerance``: fraction (0.05 = 5 %)."""
    name = row["backend"]
    v = Verdict(backend=name, status=UNBLOCKED, tier="runtime", measurements=_measurements(row, workload))
    v.measurements["tolerance"] = tolerance
    if row.get("world_size") == 1 and row.get("outcome") == "ok":
        v.warnings.append("world size 1: no data crosses between GPUs, so latencies and ratios measure call and "
                          "kernel overhead only")
    gus = v.measurements.get("graph_us")
    if gus is not None and gus < 0.2:
        v.warnings.append(f"the CUDA graph holds next to no GPU work per call ({gus:.3f} us): the backend "
                          "short-circuits this call, so its ratio is no evidence of speed")
    outcome = row.get("outcome")
    if outcome == "skipped":
        reason = row.get("skip_reason", "")
        v.status, v.cause = SKIPPED, reason
        if reason.startswith("not installed"):
            v.gate, v.lift, v.lift_detail = GATE_NOT_INSTALLED, LIFT_PACKAGE, "install the backend's package"
        elif reason.startswith("installed, but"):
            v.gate, v.lift = GATE_NEEDS_RUNTIME, LIFT_UNKNOWN
        else:
            v.gate, v.lift = GATE_TOPOLOGY, LIFT_UNKNOWN
        return v
    if outcome in ("crash", "hang"):
        tail = row.get("tail") or []
        last = next((ln for ln in reversed(tail) if ln.strip()), "")
        v.status, v.gate = BLOCKED, (GATE_CRASH if outcome == "crash" else GATE_HANG)
        what = (f"rank {row.get('failed_rank')} exited with {row.get('returncode')}" if outcome == "crash"
                else f"no result within {row.get('timeout_s')} s; the process group was killed")
        v.cause = f"{outcome}: {what}; last line: {last}"
        v.lift = LIFT_UNKNOWN
        v.add("last lines of output", tail, "probe process log")
        return v
    failure = row.get("failure")
    if failure and failure.get("kind") == "setting":
        v.status, v.gate, v.lift = BLOCKED, GATE_SETTING, LIFT_SETTING
        v.lift_detail = failure.get("lift_detail", "")
        v.cause = (failure["message"] + ". The setting, not CUDA graphs, is what fails"
                   + (f"; {v.lift_detail} runs every collective" if v.lift_detail else ""))
        v.add("collective checks", row.get("checks"), "NCCL called directly, eager and CUDA graph capture")
        _compare(v, row, baseline, tolerance, baseline_name, set_status=False)
        return v
    wrong = [r["bytes"] for r in row.get("sweep", []) if r.get("eager_correct") is False or r.get("graph_correct") is False]
    if wrong or (failure and failure.get("kind") == "wrong-result"):
        v.status, v.gate, v.lift = BLOCKED, GATE_WRONG, LIFT_UNKNOWN
        v.cause = f"wrong result against the reference sum at {wrong or 'a collective check'} bytes"
        return v
    sweep = row.get("sweep") or []
    first = sweep[0] if sweep else {}
    if failure and failure.get("kind") == "cuda-graph":
        v.status, v.gate, v.lift, v.cause = BLOCKED, GATE_CUDA_GRAPH, LIFT_UNKNOWN, failure["message"]
        return v
    if (first.get("graph") or {}).get("status") == "capture-failed":
        v.status, v.gate, v.lift = BLOCKED, GATE_CUDA_GRAPH, LIFT_UNKNOWN
        v.cause = f"CUDA graph capture failed at {first['bytes']} B: {first['graph'].get('error', '')}"
        return v
    if not sweep or "error" in first or (failure and failure.get("kind") == "error"):
        v.status, v.gate, v.lift = BLOCKED, GATE_CRASH, LIFT_UNKNOWN
        v.cause = f"the call raised: {first.get('error') or (failure or {}).get('message') or 'no measurement'}"
        return v
    for r in sweep[1:]:
        if "error" in r:
            v.warnings.append(f"{r['bytes']} B raised: {r['error']}; the sweep stopped there")
        elif (r.get("graph") or {}).get("status") == "capture-failed":
            v.warnings.append(f"{r['bytes']} B: CUDA graph capture failed: {r['graph'].get('error', '')}")
    if row["backend"] == baseline_name:
        v.status, v.lift = UNBLOCKED, LIFT_NONE_NEEDED
        v.cause = "baseline: works and is correct; the ratio is 1 by definition"
        v.measurements["ratio_to_baseline"] = 1.0
        v.measurements["baseline"] = baseline_name
        return v
    _compare(v, row, baseline, tolerance, baseline_name, set_status=True)
    return v


def _compare(v: Verdict, row: dict, baseline: dict | None, tolerance: float, baseline_name: str,
             set_status: bool) -> None:
    us, mode = decode_latency(row)
    base_us, base_mode = decode_latency(baseline) if baseline and baseline.get("outcome") == "ok" else (None, "")
    v.measurements["baseline"] = baseline_name
    if base_us is None or us is None:
        if set_status:
            v.status, v.lift = ERROR, LIFT_UNKNOWN
            v.cause = f"no {baseline_name} baseline measured in this run at the decode size; no comparison"
        return
    if mode != base_mode:
        us = (row["sweep"][0].get(base_mode) or {}).get("median_us")
        mode = base_mode
        if us is None:
            return
    ratio = us / base_us
    v.measurements.update(ratio_to_baseline=ratio, baseline_us=base_us, compared_mode=mode)
    bstep = (baseline.get("_verdict_step_us") if baseline else None)
    if bstep is not None and v.measurements.get("step_us") is not None:
        v.measurements["step_diff_us"] = v.measurements["step_us"] - bstep
    if not set_status:
        return
    nbytes = row["sweep"][0]["bytes"]
    own = (row["sweep"][0].get(mode) or {})
    base = (baseline["sweep"][0].get(mode) or {})
    separated = own.get("max_us") is not None and base.get("min_us") is not None and own["max_us"] < base["min_us"]
    v.measurements["ranges_separated"] = separated
    if ratio <= 1.0 - tolerance and not separated:
        v.status, v.lift = WORKS_SLOWER, LIFT_UNKNOWN
        v.cause = (f"correct; faster than {baseline_name} by median at {nbytes} B ({mode}): {us:.1f} vs {base_us:.1f} us, "
                   f"ratio {ratio:.2f}, but the repeat ranges overlap ({own.get('min_us', 0):.1f}-{own.get('max_us', 0):.1f} "
                   f"vs {base.get('min_us', 0):.1f}-{base.get('max_us', 0):.1f} us): not faster beyond the noise")
        return
    if ratio <= 1.0 - tolerance:
        v.status, v.lift = UNBLOCKED, LIFT_NONE_NEEDED
        v.cause = (f"correct and faster than {baseline_name} at {nbytes} B ({mode}): {us:.1f} vs {base_us:.1f} us, "
                   f"ratio {ratio:.2f} (tolerance {tolerance:.0%})")
    else:
        v.status, v.lift = WORKS_SLOWER, LIFT_UNKNOWN
        where = "at parity within" if ratio < 1.0 + tolerance else "slower beyond"
        v.cause = (f"correct but not faster than {baseline_name} at {nbytes} B ({mode}): {us:.1f} vs "
                   f"{base_us:.1f} us, ratio {ratio:.2f}, {where} the {tolerance:.0%} tolerance")


def decide_all(rows: list[dict], tolerance: float = DEFAULT_TOLERANCE, workload: Workload | None = None,
               baseline_name: str = "nccl-ring") -> list[Verdict]:
    """Verdicts for every row of one world size, against the row named ``baseline_name``."""
    baseline = next((r for r in rows if r["backend"] == baseline_name), None)
    if baseline is not None:
        bm = _measurements(baseline, workload)
        baseline = dict(baseline, _verdict_step_us=bm.get("step_us"))
    out = []
    for r in rows:
        v = decide(r, baseline, tolerance, workload, baseline_name)
        if r["backend"] == baseline_name and v.measurements.get("step_us") is not None:
            v.measurements["step_diff_us"] = 0.0
        out.append(v)
    return out
