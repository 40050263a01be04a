"""The runtime suite: every requested row at every world size, measured in paired process groups, aggregated
into rows with intervals, verdicts and a report dict.

Process groups at one world size:

* one per group of rows that can share a process (``nccl``: the baseline, torch.distributed and the
  communicator-scope NCCL settings; ``torch-symm-mem``: both variants; each FlashInfer probe): every such process
  also measures the baseline, and each candidate's ratio comes from that process's own paired rounds;
* for each process-scope setting (``NCCL_GRAPH_MIXING_SUPPORT=0``): ``rounds`` rounds of whole process groups,
  one with the baseline's environment and one with the setting's, in alternating order; the ratio's samples are
  the rounds.

At world size 1 only the baseline runs; every other row is ``skipped (no peers)``.

A row (one backend at one world size) merges its ranks: in every round the per-call time is the mean over ranks;
a check passes only when it passes on every rank.
"""
from __future__ import annotations

import datetime as _dt
import statistics
import sys

from .. import REPORT_SCHEMA_VERSION
from . import stats
from .bench import FLOOR, BenchConfig, bandwidths
from .gpus import _smi, gpu_count
from .orchestrate import MULTICAST_OFF, run_probe
from .probes import BASELINE_CPU, BASELINE_CUDA, SETTINGS, group_ref, registry
from .verdicts import DEFAULT_TOLERANCE, decide_all
from .worker import load_probe
from .workload import Workload


def topology() -> dict:
    """``nvidia-smi topo -m`` text and whether any GPU pair is linked by NVLink (``NV#`` entries)."""
    topo = _smi("topo", "-m")
    if not topo:
        return {}
    nvlink = any(tok.startswith("NV") and tok[2:].isdigit() for ln in topo.splitlines()[1:] for tok in ln.split())
    return {"nvidia_smi_topo": topo, "nvlink": nvlink}


def host_info(report: dict, env: dict | None, nccl_version: str | None) -> dict:
    """The ``host`` block: where the runtime verdicts were measured. ``compute_capability`` (``9.0``),
    ``gpu_name``, ``gpus``, ``topology`` (``nvlink`` when ``nvidia-smi topo -m`` shows an NV# link between GPUs,
    ``pcie`` when it shows GPUs and none, ``none`` on CPU), ``driver_version`` (``nvidia-smi``), ``torch``,
    ``torch_cuda``, ``nccl_version`` (the libnccl the baseline loaded; torch's build-time NCCL otherwise).
    Each run adds ``world_size``. A static report may let a runtime verdict stand for the target only when these
    match the target."""
    env = env or {}
    if report.get("device") != "cuda":
        return {"compute_capability": None, "gpu_name": None, "gpus": 0, "topology": "none",
                "driver_version": None, "torch": env.get("torch"), "torch_cuda": env.get("torch_cuda"),
                "nccl_version": None}
    q = _smi("--query-gpu=driver_version,compute_cap", "--format=csv,noheader").splitlines()
    driver = q[0].split(",")[0].strip() if q else None
    topo = report.get("topology") or {}
    return {"compute_capability": env.get("compute_capability") or (q[0].split(",")[1].strip() if q else None),
            "gpu_name": env.get("gpu_name"), "gpus": report.get("gpus"),
            "topology": "nvlink" if topo.get("nvlink") else ("pcie" if topo else "unknown"),
            "driver_version": driver, "torch": env.get("torch"), "torch_cuda": env.get("torch_cuda"),
            "nccl_version": nccl_version or env.get("torch_nccl_version")}


# --- merging ranks -----------------------------------------------------------------------------------
def _merge_unit(units: list[dict]) -> dict:
    """One unit over ranks: per-round mean of the samples; checks ANDed; first error kept."""
    out: dict = {}
    for key in ("eager_correct", "sequence_correct", "timed_correct"):
        if any(key in u for u in units):
            out[key] = all(u.get(key) for u in units)
    for key in ("graph", "error", "traceback"):
        v = next((u[key] for u in units if key in u and (key != "graph" or u[key] != "ok")), None)
        if v is None and key == "graph" and any("graph" in u for u in units):
            v = "ok"
        if v is not None:
            out[key] = v
    samples = [u.get("samples_us") for u in units]
    if all(samples):
        n = min(len(s) for s in samples)
        out["samples_us"] = [statistics.fmean(s[i] for s in samples) for i in range(n)]
        out["per_rank_samples_us"] = samples
    return out


def merge_ranks(ranks: list[dict]) -> list[dict]:
    """The sweep of one process group over ranks: ``[{"bytes", "units": {name: merged unit}} | {"bytes",
    "error"}]``."""
    sweep = []
    for j, rec0 in enumerate(ranks[0]["sweep"]):
        recs = [rk["sweep"][j] for rk in ranks if j < len(rk["sweep"])]
        err = next((r for r in recs if "error" in r), None)
        if err is not None or len(recs) < len(ranks):
            sweep.append({"bytes": rec0["bytes"], "error": (err or {}).get("error", "missing on a rank"),
                          "traceback": (err or {}).get("traceback", "")})
            continue
        sweep.append({"bytes": rec0["bytes"],
                      "units": {name: _merge_unit([r["units"].get(name, {}) for r in recs])
                                for name in rec0["units"]}})
    return sweep


def _ci(values: list[float]) -> dict:
    m, lo, hi = stats.mean_ci(values)
    return {"mean": m, "low": lo, "high": hi}


def size_record(nbytes: int, unit: dict, floor: dict | None, base: dict | None, world_size: int,
                is_baseline: bool) -> dict:
    """One size of one row: checks, time and work per call with 95% intervals, the paired ratio to the
    baseline with its interval, bandwidths from the mean work."""
    rec = {"bytes": nbytes, **{k: unit[k] for k in ("eager_correct", "sequence_correct", "timed_correct", "graph",
                                                   "error") if k in unit}}
    s = unit.get("samples_us")
    f = (floor or {}).get("samples_us")
    if not s:
        return rec
    n = min(len(s), len(f)) if f else len(s)
    s, f = s[:n], (f[:n] if f else None)
    work = stats.net(s, f)
    rec.update(rounds=n, samples_us=s, floor_samples_us=f, time_us=_ci(s), work_us=_ci(work))
    if f:
        rec["floor_us"] = _ci(f)
        rec["no_gpu_work"] = stats.no_work(s, f)
    rec.update(bandwidths(nbytes, rec["work_us"]["mean"], world_size))
    if is_baseline:
        rec["ratio"] = {"value": 1.0, "low": 1.0, "high": 1.0}
    elif base and base.get("samples_us"):
        b = stats.net(base["samples_us"][:n], f)
        r, lo, hi = stats.ratio_ci(b, work)
        rec["ratio"] = {"value": r, "low": lo, "high": hi}
        rec["baseline_samples_us"] = base["samples_us"][:n]
    return rec


def _row_base(name: str, probe, ws: int) -> dict:
    row = {"backend": name, "label": probe.label, "kind": probe.kind, "world_size": ws, "group": probe.group}
    st = SETTINGS.get(name)
    if st:
        row["setting"] = {k: st[k] for k in ("env", "scope", "precondition", "source", "sglang")}
    return row


def rows_from_group(run, names: list[str], reg: dict, baseline: str, extra_probes: dict) -> list[dict]:
    """Rows of one in-process group run (a :class:`~stackprobe.runtime.orchestrate.ProbeRun`)."""
    base = {"outcome": run.status, "seconds": run.seconds, "leftover_pids": run.leftover_pids, "env": run.env,
            "pairing": "in-process"}
    rows = []
    if run.status != "ok":
        rc = run.returncodes[run.failed_rank] if run.failed_rank is not None and run.returncodes else None
        for n in names:
            p = reg.get(n) or extra_probes[n]
            rows.append(dict(_row_base(n, p, run.world_size), **base, tail=run.tail, failed_rank=run.failed_rank,
                             returncode=rc, sweep=[]))
        return rows
    sweep = merge_ranks(run.ranks)
    metas = {m["backend"]: m for m in run.ranks[0]["backends"]}
    base_name = run.ranks[0].get("baseline", baseline)
    for n in [m["backend"] for m in run.ranks[0]["backends"]]:
        if n not in names:
            continue
        p = reg.get(n) or extra_probes.get(n)
        row = dict(_row_base(n, p, run.world_size) if p else {"backend": n, "label": metas[n].get("label", ""),
                                                                  "kind": metas[n].get("kind", "backend"),
                                                                  "world_size": run.world_size}, **base)
        per_rank = [next((m for m in rk["backends"] if m["backend"] == n), {}) for rk in run.ranks]
        row.update(info=metas[n].get("info", {}), checks=metas[n].get("checks", {}),
                   checks_per_rank=[m.get("checks", {}) for m in per_rank],
                   failure=next((m.get("failure") for m in per_rank if m.get("failure")), None), tail=run.tail)
        recs = []
        for s in sweep:
            if "error" in s:
                recs.append({"bytes": s["bytes"], "error": s["error"], "traceback": s.get("traceback", "")})
                continue
            u = s["units"].get(n)
            if u is None:
                continue
            recs.append(size_record(s["bytes"], u, s["units"].get(FLOOR), s["units"].get(base_name),
                                    run.world_size, n == base_name))
        row["sweep"] = recs
        rows.append(row)
    return rows


def rows_from_rounds(name: str, probe, ws: int, runs: list[tuple[str, object]]) -> dict:
    """The row of a process-scope setting from alternated process groups: ``runs`` is ``[(which, ProbeRun)]``
    with ``which`` in ``base``/``cand``, in launch order. Round ``r`` pairs the r-th base run with the r-th
    candidate run; each run contributes the mean of its in-process rounds (work = time - floor)."""
    row = dict(_row_base(name, probe, ws), pairing="process-groups", env=runs[0][1].env if runs else {})
    bad = next((r for _, r in runs if r.status != "ok"), None)
    row["seconds"] = round(sum(r.seconds for _, r in runs), 2)
    row["leftover_pids"] = sorted({p for _, r in runs for p in r.leftover_pids})
    if bad is not None:
        rc = bad.returncodes[bad.failed_rank] if bad.failed_rank is not None and bad.returncodes else None
        row.update(outcome=bad.status, tail=bad.tail, failed_rank=bad.failed_rank, returncode=rc, sweep=[])
        return row
    per = {"base": [], "cand": []}
    checks_ok, nbytes, err = True, None, None
    for which, r in runs:
        sw = merge_ranks(r.ranks)
        s = sw[0]
        nbytes = s["bytes"]
        if "error" in s:
            err = s["error"]
            continue
        unit = next(u for k, u in s["units"].items() if k != FLOOR)
        fl = s["units"].get(FLOOR, {})
        if which == "cand":
            checks_ok = checks_ok and all(unit.get(k, True) for k in ("eager_correct", "sequence_correct",
                                                                      "timed_correct"))
            if unit.get("error"):
                err = unit["error"]
        if unit.get("samples_us") and fl.get("samples_us"):
            t = statistics.fmean(unit["samples_us"])
            fm = statistics.fmean(fl["samples_us"])
            per[which].append({"time": t, "floor": fm, "work": t - fm,
                               "no_work": stats.no_work(unit["samples_us"], fl["samples_us"])})
    row.update(outcome="ok", tail=runs[-1][1].tail, info=runs[-1][1].ranks[0]["backends"][0].get("info", {}),
               checks={}, failure=None, rounds_launch_order=[w for w, _ in runs])
    rec: dict = {"bytes": nbytes}
    if err:
        rec["error"] = err
    n = min(len(per["base"]), len(per["cand"]))
    rec.update(eager_correct=checks_ok, sequence_correct=checks_ok, timed_correct=checks_ok, graph="ok")
    if n:
        cand = [x["work"] for x in per["cand"][:n]]
        base = [x["work"] for x in per["base"][:n]]
        times = [x["time"] for x in per["cand"][:n]]
        floors = [x["floor"] for x in per["cand"][:n]]
        r, lo, hi = stats.ratio_ci(base, cand)
        rec.update(rounds=n, samples_us=times, floor_samples_us=floors, baseline_work_per_round_us=base,
                   work_per_round_us=cand, time_us=_ci(times), floor_us=_ci(floors), work_us=_ci(cand),
                   ratio={"value": r, "low": lo, "high": hi},
                   no_gpu_work=any(x["no_work"] for x in per["cand"][:n]))
        rec.update(bandwidths(nbytes, rec["work_us"]["mean"], ws))
    row["sweep"] = [rec]
    return row


def resolve(spec: str):
    """``(name, probe)`` for a registry name (``nccl-default``) or a ``module:attr`` reference (whose object
    leads its own group)."""
    if ":" in spec:
        p = load_probe(spec)
        return p.name, p
    reg = registry()
    if spec not in reg:
        raise ValueError(f"unknown probe {spec!r}; known: {', '.join(reg)} (or give module:attr)")
    return spec, reg[spec]


def default_probes(device: str) -> list[str]:
    return [n for n, p in registry().items() if p.device == device]


def run_suite(probes: list[str], world_sizes: list[int], config: BenchConfig, *, device: str = "cuda",
              timeout: float = 300.0, tolerance: float = DEFAULT_TOLERANCE, workload: Workload | None = None,
              baseline: str | None = None, env_overrides: dict[str, str] | None = None, gpus: int | None = None,
              label: str = "", target_arch: str = "12.0", progress=None, rounds: int = 4,
              p2p_check: dict | None = None, p2p_timeout: float = 60.0, peer_paths=None) -> dict:
    """Run the rows ``probes`` (names or ``module:attr``) at each world size and return the report dict (see
    :mod:`stackprobe.runtime.report`). ``rounds``: alternated process-group rounds for process-scope settings.
    The baseline (``nccl-default`` on GPUs, ``torch-gloo`` on CPU) is always run. ``progress(str)`` is told
    about each process group as it ends.

    First step on GPUs: the P2P check (:func:`stackprobe.runtime.p2pcheck.run_check`, ``p2p_timeout`` seconds per
    step and pair) over GPUs ``0..max(world_sizes)-1``, kept in ``report["p2p_check"]``; ``p2p_check`` given (a
    saved or CPU report) is used instead. A peer-memory row (``peer_paths``, default
    :func:`~stackprobe.runtime.p2pcheck.peer_memory_paths`) starts at a world size only when every pair of its
    GPUs passed; otherwise it is skipped with :func:`~stackprobe.runtime.p2pcheck.gate_reason`'s text. The
    baseline's NCCL process group runs with :data:`stackprobe.runtime.nccl_transport.DEBUG_ENV` and its row and
    run carry ``nccl_transport`` (what NCCL printed it connected over).

    Phases: check the arguments, resolve the rows, start the report, the P2P check, then per world size plan the
    process groups, run the shared groups and the process-scope settings' rounds; last, the host and the verdicts."""
    from . import p2pcheck
    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    _check_suite_args(config, rounds)
    baseline = baseline or (BASELINE_CUDA if device == "cuda" else BASELINE_CPU)
    reg = registry()
    resolved, extra = _resolve_rows(probes, baseline, reg)
    gpus = gpu_count() if gpus is None else gpus
    report = _new_report(label, target_arch, device, gpus, baseline, tolerance, config, rounds, workload, timeout,
                         env_overrides)
    peer_paths = p2pcheck.peer_memory_paths() if peer_paths is None else frozenset(peer_paths)
    p2p_check = report["p2p_check"] = _p2p_first(p2p_check, device, gpus, world_sizes, p2p_timeout, progress)
    env_seen, nccl_version = None, None
    base_group = reg[baseline].group if baseline in reg else "gloo"
    launch = {"device": device, "timeout": timeout, "env_overrides": env_overrides, "progress": progress}
    for ws in world_sizes:
        rows, groups, process_scope = _plan_world_size(ws, resolved, baseline, extra, gpus, peer_paths, p2p_check,
                                                       progress)
        new, env_ws, nccl_ws = _run_groups(groups, base_group, probes, ws, config, baseline, reg, extra, launch)
        rows += new
        env_seen, nccl_version = env_seen or env_ws, nccl_version or nccl_ws
        rows += [_run_setting_rounds(name, reg[name], ws, config, baseline, rounds, launch) for name in process_scope]
        rows.sort(key=lambda r: [n for n, _ in resolved].index(r["backend"])
                  if r["backend"] in [n for n, _ in resolved] else 999)
        base_row = next((r for r in rows if r["backend"] == baseline), {})
        report["runs"].append({"world_size": ws, "rows": rows, "nccl_transport": base_row.get("nccl_transport")})
    _decide_runs(report, env_seen, nccl_version, tolerance, workload, baseline)
    if not label:
        report["label"] = hardware_label(report)
    return report


def _check_suite_args(config: BenchConfig, rounds: int) -> None:
    """Refuse a non-positive first message size and fewer than two process-group rounds."""
    if config.sizes[0] <= 0:
        raise ValueError("message sizes must be positive")
    if rounds < 2:
        raise ValueError(f"--rounds {rounds}: at least 2 alternated process-group rounds are needed for an interval")


def _resolve_rows(probes: list[str], baseline: str, reg: dict) -> tuple[list, dict]:
    """The ``(name, probe)`` rows, the baseline first when not asked for, and those not in the registry."""
    resolved = [resolve(p) for p in probes]
    if baseline not in [n for n, _ in resolved]:
        resolved.insert(0, resolve(baseline))
    extra = {n: p for n, p in resolved if n not in reg}
    return resolved, extra


def _new_report(label: str, target_arch: str, device: str, gpus: int, baseline: str, tolerance: float,
                config: BenchConfig, rounds: int, workload: Workload | None, timeout: float,
                env_overrides: dict[str, str] | None) -> dict:
    """The report dict before any run: its settings, the multicast-off variables and the topology."""
    return {
        "schema": REPORT_SCHEMA_VERSION, "tier": "runtime",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "label": label, "target_arch": target_arch, "device": device, "gpus": gpus,
        "baseline": baseline, "tolerance": tolerance, "config": config.to_json(), "process_rounds": rounds,
        "workload": workload.to_json() if workload else None, "timeout_s": timeout,
        "multicast_off": {k: (env_overrides or {}).get(k, v) for k, v in MULTICAST_OFF.items()},
        "topology": topology() if device == "cuda" else {}, "runs": [],
    }


def _skip_reason(name: str, probe, ws: int, baseline: str, gpus: int, peer_paths, p2p_check: dict | None) -> str | None:
    """Why a row does not run at this world size (failed P2P pairs, the probe's own reason, no peers, too few GPUs)."""
    from . import p2pcheck
    dev_gpus = gpus if probe.device == "cuda" else ws
    reason = None
    if name in peer_paths and name != baseline and 1 < ws <= dev_gpus:   # too few GPUs: said below
        reason = p2pcheck.gate_reason(p2p_check, list(range(ws)))
    reason = reason or (None if name == baseline else probe.skip_reason(ws, dev_gpus))
    if reason is None and name != baseline and ws == 1:
        reason = "no peers: world size 1 moves no data between GPUs"
    if name == baseline and probe.device == "cuda" and gpus < ws:
        reason = f"needs {ws} GPUs, {gpus} present"
    return reason


def _plan_world_size(ws: int, resolved: list, baseline: str, extra: dict, gpus: int, peer_paths,
                     p2p_check: dict | None, progress) -> tuple[list[dict], dict[str, list[str]], list[str]]:
    """The skipped rows, the shared process groups and the process-scope settings of one world size (none to run
    when the baseline is skipped)."""
    rows: list[dict] = []
    groups: dict[str, list[str]] = {}
    process_scope: list[str] = []
    for name, probe in resolved:
        reason = _skip_reason(name, probe, ws, baseline, gpus, peer_paths, p2p_check)
        if reason:
            progress(f"{name} @ world size {ws}: skipped ({reason})")
            rows.append(dict(_row_base(name, probe, ws), outcome="skipped", skip_reason=reason, sweep=[]))
            continue
        if name in extra:
            groups.setdefault(f"extra:{name}", []).append(name)
        elif probe.scope == "process" and probe.env:
            process_scope.append(name)
        else:
            groups.setdefault(probe.group, []).append(name)
    if any(r["backend"] == baseline and r["outcome"] == "skipped" for r in rows):
        groups, process_scope = {}, []
    return rows, groups, process_scope


def _run_groups(groups: dict[str, list[str]], base_group: str, probes: list[str], ws: int, config: BenchConfig,
                baseline: str, reg: dict, extra: dict, launch: dict) -> tuple[list[dict], dict | None, str | None]:
    """Run each shared process group (the baseline's first) into rows; returns them with the first environment
    and baseline NCCL version seen."""
    from . import nccl_transport
    rows: list[dict] = []
    env_seen, nccl_version = None, None
    for g in sorted(groups, key=lambda g: g != base_group):
        names = groups[g]
        ref = _extra_ref(probes, names[0]) if g.startswith("extra:") else group_ref(g)
        launch["progress"](f"{g} @ world size {ws}: running ({', '.join(names)})")
        penv = dict(nccl_transport.DEBUG_ENV) if g == base_group and base_group == "nccl" else {}
        run = run_probe(ref, ws, config.to_json(), device=launch["device"], timeout=launch["timeout"], probe_env=penv,
                        env_overrides=launch["env_overrides"], name=g, progress=launch["progress"],
                        extra={"backends": [n for n in names if n != baseline]})
        new = rows_from_group(run, names, reg, baseline, extra)
        _label_transport(run, new, baseline, launch["progress"])
        for r in new:
            if r["outcome"] == "hang":
                r["timeout_s"] = launch["timeout"]
        rows += new
        if run.status == "ok":
            env_seen = env_seen or run.ranks[0].get("env")
            bm = next((m for m in run.ranks[0]["backends"] if m["backend"] == baseline), None)
            nccl_version = nccl_version or ((bm or {}).get("info") or {}).get("nccl_version")
    return rows, env_seen, nccl_version


def _run_setting_rounds(name: str, probe, ws: int, config: BenchConfig, baseline: str, rounds: int,
                        launch: dict) -> dict:
    """A process-scope setting's row: ``rounds`` alternated baseline/setting process groups, stopped at a failure."""
    runs = []
    for r in range(rounds):
        pair = [("base", {}), ("cand", probe.env)]
        for which, penv in (pair if r % 2 == 0 else pair[::-1]):
            run = run_probe(group_ref(probe.group), ws, config.to_json(), device=launch["device"],
                            timeout=launch["timeout"], probe_env=penv, env_overrides=launch["env_overrides"],
                            name=f"{name} round {r + 1} ({'setting' if which == 'cand' else 'baseline'})",
                            progress=launch["progress"], extra={"unit_name": baseline if which == "base" else name})
            runs.append((which, run))
            if run.status != "ok":
                break
        if runs and runs[-1][1].status != "ok":
            break
    row = rows_from_rounds(name, probe, ws, runs)
    if row.get("outcome") == "hang":
        row["timeout_s"] = launch["timeout"]
    return row


def _decide_runs(report: dict, env_seen: dict | None, nccl_version: str | None, tolerance: float,
                 workload: Workload | None, baseline: str) -> None:
    """Record the environment and host, then each run's host and verdicts."""
    report["environment"] = env_seen or {}
    report["host"] = host_info(report, env_seen, nccl_version)
    for run in report["runs"]:
        run["host"] = dict(report["host"], world_size=run["world_size"])
        run["verdicts"] = [v.to_json() for v in decide_all(run["rows"], tolerance, workload, baseline,
                                                           host=run["host"])]


def _p2p_first(check: dict | None, device: str, gpus: int, world_sizes: list[int], timeout: float,
               progress) -> dict | None:
    """``check`` when given; else on GPUs the P2P check over the largest group's GPUs (with fewer than two it
    starts no child and says there is nothing to pair)."""
    from . import p2pcheck
    n = min(gpus, max(world_sizes) if world_sizes else 0)
    if check is None and device == "cuda":
        progress(f"p2p check over GPUs {list(range(n))}: running (before any peer-memory path)")
        check = p2pcheck.run_check(list(range(n)), device="cuda", timeout=timeout, progress=progress)
    return check


def _label_transport(run, rows: list[dict], baseline: str, progress) -> None:
    """The baseline's row gets ``nccl_transport`` (the summary, connections counted) and ``transport`` (a
    phrase) from what NCCL printed in that process group."""
    from . import nccl_transport
    if run.nccl_transport is None:
        return
    transport = {k: v for k, v in run.nccl_transport.items() if k != "connections"}
    transport["connections"] = len(run.nccl_transport["connections"])
    for r in rows:
        if r["backend"] == baseline:
            r["nccl_transport"] = transport
            r["transport"] = nccl_transport.label(run.nccl_transport)
            progress(f"{baseline} @ world size {run.world_size}: {r['transport']}")


def _extra_ref(probes: list[str], name: str) -> str:
    for s in probes:
        if ":" in s and load_probe(s).name == name:
            return s
    raise ValueError(f"no module:attr reference for {name}")


def hardware_label(report: dict) -> str:
    """``2xH200-SM90-NVLink`` style label from the measured environment (``cpu`` without GPUs)."""
    env = report.get("environment") or {}
    if report.get("device") != "cuda" or not env.get("gpu_name"):
        return "cpu"
    name = env["gpu_name"].replace("NVIDIA ", "").split()[0]
    cc = env.get("compute_capability", "").replace(".", "")
    link = "NVLink" if (report.get("topology") or {}).get("nvlink") else "PCIe"
    return f"{report.get('gpus')}x{name}-SM{cc}-{link}"
