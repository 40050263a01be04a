"""Verdict rules of the runtime tier: a row's paired measurements against the baseline measured in the same
process group (or in alternated process groups), at the decode size (the sweep's first size).

Rules, first match wins:

1. skipped before running (library not installed, too few GPUs, world size 1: no peers) -> ``skipped``;
2. the process group crashed or hung -> ``blocked`` (gate ``crash`` / ``hang``), with the last output lines;
3. a setting made a collective fail (``NCCL_ALGO=Tree``: all_gather / reduce_scatter have no Tree algorithm,
   ncclInvalidUsage) -> ``blocked`` (gate ``setting``), lifted by the per-collective form the probe names;
4. the probe reported an error of its own (e.g. a setting that did not reach its communicator) -> ``error``;
5. a wrong result at any size (eager, the checked sequence, or the timed graph replayed with its output poisoned)
   -> ``blocked`` (gate ``wrong-result``);
6. CUDA graph capture failed at the decode size -> ``blocked`` (gate ``cuda-graph``);
7. the call raised at the decode size -> ``blocked`` (gate ``crash``);
8. the row's work per call is at or below the empty-graph floor measured in the same rounds -> ``error``
   ("no GPU work captured"), never a speed-up (case C22);
9. the baseline row -> ``baseline``;
10. no paired ratio -> ``error``;
11. the status read from the 95% interval of the paired ratio (:func:`stackprobe.runtime.stats.status`):
    ``faster``, ``parity``, ``slower`` or ``inconclusive``.

Every verdict carries the ``host`` block of its run (where it was measured) in ``measurements["host"]``.
"""
from __future__ import annotations

from ..verdict import (BASELINE, BLOCKED, ERROR, GATE_CRASH, GATE_CUDA_GRAPH, GATE_HANG, GATE_NEEDS_RUNTIME,
                       GATE_NOT_INSTALLED, GATE_SETTING, GATE_TOPOLOGY, GATE_WRONG, LIFT_NONE_NEEDED,
                       LIFT_PACKAGE, LIFT_SETTING, LIFT_UNKNOWN, SKIPPED, Verdict)
from . import stats
from .workload import Workload

# Default tolerance on the ratio: 5 %. At the Kimi-K2 decode step (122 allreduces of ~42 KB at ~6-18 us each)
# a 5 % difference per allreduce is 40-110 us per step, under 1 % of a ~10 ms decode step: smaller differences
# do not change what an engine should run. Paired rounds make intervals far narrower than the 15-20 % spread
# between runs (FACTS, "Run-to-run noise"), so 5 % can be resolved.
DEFAULT_TOLERANCE = 0.05


def decode_record(row: dict) -> dict:
    return (row.get("sweep") or [{}])[0]


def _measurements(row: dict, workload: Workload | None, host: dict | None) -> dict:
    m: dict = {"world_size": row["world_size"], "kind": row.get("kind", "backend")}
    if host:
        m["host"] = host
    if row.get("setting"):
        m["setting"] = row["setting"]
    if row.get("pairing"):
        m["pairing"] = row["pairing"]
    rec = decode_record(row)
    if not rec:
        return m
    m["decode_bytes"] = rec.get("bytes")
    for key in ("time_us", "work_us", "floor_us"):
        if key in rec:
            m[key] = rec[key]["mean"]
            m[key.replace("_us", "_low_us")] = rec[key]["low"]
            m[key.replace("_us", "_high_us")] = rec[key]["high"]
    if "ratio" in rec:
        m.update(ratio_to_baseline=rec["ratio"]["value"], ratio_low=rec["ratio"]["low"],
                 ratio_high=rec["ratio"]["high"])
    if "rounds" in rec:
        m["rounds"] = rec["rounds"]
    if "busbw_gbps" in rec:
        m.update(algbw_gbps=rec.get("algbw_gbps"), busbw_gbps=rec.get("busbw_gbps"))
    if workload and m.get("work_us") is not None and rec.get("bytes") == workload.message_bytes:
        m["step_us"] = m["work_us"] * workload.calls_per_step
    m["sizes_measured"] = [r["bytes"] for r in row.get("sweep", []) if "work_us" in r]
    return m


def _wrong(rec: dict) -> list[str]:
    return [k for k in ("eager_correct", "sequence_correct", "timed_correct") if rec.get(k) is False]


def decide(row: dict, tolerance: float = DEFAULT_TOLERANCE, workload: Workload | None = None,  # noqa: C901, PLR0912, PLR0915 - reason: the module doc's verdict rules in order, one return each
           baseline_name: str = "nccl-default", host: dict | None = None) -> Verdict:
    """The runtime :class:`~stackprobe.verdict.Verdict` of one row (see module doc for the rules).

    ``row``: an aggregated row (``backend``, ``world_size``, ``kind``, ``outcome``, ``sweep`` with ``ratio``
    intervals, ``failure``, ``tail``, ``skip_reason``). ``tolerance``: fraction (0.05 = 5 %)."""
    name = row["backend"]
    v = Verdict(backend=name, status=ERROR, tier="runtime", measurements=_measurements(row, workload, host))
    v.measurements["tolerance"] = tolerance
    st = row.get("setting")
    if st and st.get("sglang") and not st["sglang"].get("meets"):
        v.warnings.append(f"precondition ({st['precondition']}; {st['source']}) not met by SGLang as shipped: "
                          f"{st['sglang']['note']}")
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
    rec = decode_record(row)
    if failure and failure.get("kind") == "setting":
        v.status, v.gate, v.lift = BLOCKED, GATE_SETTING, LIFT_SETTING
        v.lift_detail = failure.get("lift_detail", "")
        v.cause = (failure["message"] + ". The setting, not CUDA graphs, is what fails"
                   + (f"; {v.lift_detail} runs every collective" if v.lift_detail else ""))
        if "ratio" in rec:
            v.cause += (f". allreduce alone: ratio {rec['ratio']['value']:.3f} "
                        f"[{rec['ratio']['low']:.3f}, {rec['ratio']['high']:.3f}]")
        v.add("collective checks", row.get("checks"), "NCCL called directly, eager and CUDA graph capture")
        return v
    if failure and failure.get("kind") == "error":
        v.status, v.lift, v.cause = ERROR, LIFT_UNKNOWN, failure.get("message", "probe error")
        return v
    wrong = [(r["bytes"], _wrong(r)) for r in row.get("sweep", []) if _wrong(r)]
    if wrong or (failure and failure.get("kind") == "wrong-result"):
        v.status, v.gate, v.lift = BLOCKED, GATE_WRONG, LIFT_UNKNOWN
        where = "; ".join(f"{b} B: {', '.join(k.replace('_correct', '') for k in ks)}" for b, ks in wrong)
        v.cause = ("wrong result against the reference sum (output poisoned before each check; each captured "
                   f"call a different input): {where or (failure or {}).get('message', 'a collective check')}")
        return v
    if failure and failure.get("kind") == "cuda-graph":
        v.status, v.gate, v.lift, v.cause = BLOCKED, GATE_CUDA_GRAPH, LIFT_UNKNOWN, failure["message"]
        return v
    if rec.get("graph") == "capture-failed":
        v.status, v.gate, v.lift = BLOCKED, GATE_CUDA_GRAPH, LIFT_UNKNOWN
        v.cause = f"CUDA graph capture failed at {rec['bytes']} B: {rec.get('error', '')}"
        return v
    if not rec or "error" in rec or "work_us" not in rec:
        v.status, v.gate, v.lift = BLOCKED, GATE_CRASH, LIFT_UNKNOWN
        v.cause = f"the call raised: {rec.get('error') or 'no measurement at the decode size'}"
        return v
    for r in row["sweep"][1:]:
        if "error" in r:
            v.warnings.append(f"{r['bytes']} B raised: {r['error']}; the sweep stopped there")
    if rec.get("no_gpu_work"):
        v.status, v.lift = ERROR, LIFT_UNKNOWN
        v.cause = (f"no GPU work captured: {rec['time_us']['mean']:.3f} us per call against an empty-graph floor of "
                   f"{rec['floor_us']['mean']:.3f} us measured in the same rounds; no speed can be claimed")
        return v
    if name == baseline_name:
        v.status, v.lift = BASELINE, LIFT_NONE_NEEDED
        w = rec["work_us"]
        v.cause = (f"baseline: correct; {w['mean']:.2f} us of work per call [{w['low']:.2f}, {w['high']:.2f}] "
                   f"over {rec.get('rounds')} rounds; ratio 1 by definition")
        return v
    if "ratio" not in rec:
        v.status, v.lift = ERROR, LIFT_UNKNOWN
        v.cause = f"no {baseline_name} baseline measured beside it at the decode size; no comparison"
        return v
    r = rec["ratio"]
    n = rec.get("rounds")
    v.status = stats.status(r["low"], r["high"], tolerance, n if isinstance(n, int) else None)
    if isinstance(n, int) and n < stats.MIN_PAIRS:
        v.warnings.append(f"only {n} paired rounds: a status needs at least {stats.MIN_PAIRS} (a bootstrap interval "
                          f"on fewer under-covers); re-run with --rounds {stats.MIN_PAIRS} or more")
    v.lift = LIFT_NONE_NEEDED if v.status == stats.FASTER else LIFT_UNKNOWN
    pairing = ("paired rounds in one process group" if row.get("pairing") == "in-process"
               else "alternated process groups")
    v.cause = (f"correct; ratio to {baseline_name} {r['value']:.3f}, 95% interval [{r['low']:.3f}, {r['high']:.3f}] "
               f"({rec.get('rounds')} {pairing}; tolerance {tolerance:.0%}) at {rec['bytes']} B: "
               f"{rec['work_us']['mean']:.2f} us of work per call")
    return v


def decide_all(rows: list[dict], tolerance: float = DEFAULT_TOLERANCE, workload: Workload | None = None,
               baseline_name: str = "nccl-default", host: dict | None = None) -> list[Verdict]:
    """Verdicts for every row of one world size."""
    return [decide(r, tolerance, workload, baseline_name, host) for r in rows]
