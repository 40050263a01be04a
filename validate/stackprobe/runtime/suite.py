"""The runtime suite: every probe at every world size, aggregated into rows, verdicts and a report dict.

A *row* is one backend at one world size, merged over ranks: per size and mode (eager / graph) the time is the
mean over ranks of each rank's median (``per_rank_median_us`` keeps them all), the spread is the largest rank's,
a result is correct only when it is on every rank.
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import statistics
import subprocess
import sys

from .. import REPORT_SCHEMA_VERSION
from .bench import BenchConfig, bandwidths
from .orchestrate import MULTICAST_OFF, run_probe
from .probes import probe_ref, registry
from .verdicts import DEFAULT_TOLERANCE, decide_all
from .worker import load_probe
from .workload import Workload


def gpu_count() -> int:
    """GPUs visible to this host, without creating a CUDA context here (``nvidia-smi -L``, else torch)."""
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
            n = sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            if vis is not None:
                n = min(n, len([v for v in vis.split(",") if v.strip()]))
            return n
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def topology() -> dict:
    """``nvidia-smi topo -m`` text and whether any GPU pair is linked by NVLink (``NV#`` entries)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        topo = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    nvlink = any(tok.startswith("NV") and tok[2:].isdigit() for ln in topo.splitlines()[1:] for tok in ln.split())
    return {"nvidia_smi_topo": topo, "nvlink": nvlink}


def _merge_mode(recs: list[dict], mode: str, nbytes: int, world_size: int) -> dict | None:
    ms = [r.get(mode) for r in recs]
    if not ms or ms[0] is None:
        return None
    bad = next((m for m in ms if m is None or m.get("status", "ok") != "ok"), None)
    if bad is not None:
        return dict(bad or {"status": "missing"})
    meds = [m["median_us"] for m in ms]
    out = {k: ms[0][k] for k in ("repeats", "calls_per_repeat", "calls_per_graph") if k in ms[0]}
    out.update(median_us=statistics.fmean(meds), per_rank_median_us=meds,
               min_us=min(m["min_us"] for m in ms), max_us=max(m["max_us"] for m in ms),
               spread_pct=max(m["spread_pct"] for m in ms), status="ok",
               samples_us_rank0=ms[0].get("samples_us"))
    out.update(bandwidths(nbytes, out["median_us"], world_size))
    return out


def aggregate(run, backend_names: tuple[str, ...], probe_label: str = "") -> list[dict]:
    """Rows (one per backend) from a :class:`~stackprobe.runtime.orchestrate.ProbeRun`."""
    base = {"world_size": run.world_size, "probe": run.probe, "outcome": run.status, "seconds": run.seconds,
            "leftover_pids": run.leftover_pids, "env": run.env}
    if run.status != "ok":
        rc = run.returncodes[run.failed_rank] if run.failed_rank is not None and run.returncodes else None
        return [dict(base, backend=b, label=probe_label, tail=run.tail, failed_rank=run.failed_rank,
                     returncode=rc, timeout_s=None, sweep=[]) for b in backend_names]
    rows = []
    for i, first in enumerate(run.ranks[0]["backends"]):
        per_rank = [rk["backends"][i] for rk in run.ranks]
        sweep = []
        for j, rec0 in enumerate(first["sweep"]):
            recs = [pr["sweep"][j] for pr in per_rank if j < len(pr["sweep"])]
            err = next((r for r in recs if "error" in r), None)
            if err is not None or len(recs) < len(per_rank):
                sweep.append({"bytes": rec0["bytes"], "error": (err or {}).get("error", "missing on a rank"),
                              "traceback": (err or {}).get("traceback", "")})
                continue
            rec = {"bytes": rec0["bytes"], "eager_correct": all(r.get("eager_correct") for r in recs),
                   "eager_max_abs_err": max(r.get("eager_max_abs_err", 0.0) for r in recs)}
            if any("graph_correct" in r for r in recs):
                rec["graph_correct"] = all(r.get("graph_correct") for r in recs)
                errs = [r["graph_check_error"] for r in recs if "graph_check_error" in r]
                if errs:
                    rec["graph_check_error"] = errs[0]
            for mode in ("eager", "graph"):
                m = _merge_mode(recs, mode, rec0["bytes"], run.world_size)
                if m is not None:
                    rec[mode] = m
            sweep.append(rec)
        failure = next((pr.get("failure") for pr in per_rank if pr.get("failure")), None)
        rows.append(dict(base, backend=first["backend"], label=first.get("label", probe_label),
                         info=first.get("info", {}), checks=first.get("checks", {}),
                         checks_per_rank=[pr.get("checks", {}) for pr in per_rank], failure=failure,
                         sweep=sweep, tail=run.tail))
    return rows


def resolve(spec: str):
    """``(ref, probe)`` for a registry name (``nccl-ring``) or a ``module:attr`` reference."""
    if ":" in spec:
        return spec, load_probe(spec)
    reg = registry()
    if spec not in reg:
        raise ValueError(f"unknown probe {spec!r}; known: {', '.join(reg)} (or give module:attr)")
    return probe_ref(spec), reg[spec]


def default_probes(device: str) -> list[str]:
    return [n for n, p in registry().items() if (p.device == device or (device == "cuda" and p.device != "cpu"))]


def run_suite(probes: list[str], world_sizes: list[int], config: BenchConfig, *, device: str = "cuda",
              timeout: float = 300.0, tolerance: float = DEFAULT_TOLERANCE, workload: Workload | None = None,
              baseline: str = "nccl-ring", env_overrides: dict[str, str] | None = None, gpus: int | None = None,
              label: str = "", target_arch: str = "12.0", progress=None) -> dict:
    """Run ``probes`` (names or ``module:attr``) at each world size and return the report dict
    (see :mod:`stackprobe.runtime.report`). ``progress(str)`` is told about each probe as it ends."""
    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if config.sizes[0] <= 0:
        raise ValueError("message sizes must be positive")
    resolved = [resolve(p) for p in probes]
    gpus = gpu_count() if gpus is None else gpus
    report: dict = {
        "schema": REPORT_SCHEMA_VERSION, "tier": "runtime",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "label": label, "target_arch": target_arch, "device": device, "gpus": gpus,
        "baseline": baseline, "tolerance": tolerance, "config": config.to_json(),
        "workload": workload.to_json() if workload else None, "timeout_s": timeout,
        "multicast_off": {k: (env_overrides or {}).get(k, v) for k, v in MULTICAST_OFF.items()},
        "topology": topology() if device == "cuda" else {}, "runs": [],
    }
    env_seen = None
    for ws in world_sizes:
        rows = []
        for ref, probe in resolved:
            names = probe.backend_names()
            reason = probe.skip_reason(ws, gpus if probe.device == "cuda" else ws)
            if reason:
                progress(f"{probe.name} @ world size {ws}: skipped ({reason})")
                rows += [{"backend": b, "label": probe.label, "world_size": ws, "probe": probe.name,
                          "outcome": "skipped", "skip_reason": reason, "sweep": []} for b in names]
                continue
            progress(f"{probe.name} @ world size {ws}: running ({', '.join(names)})")
            run = run_probe(ref, ws, config.to_json(), device=probe.device,
                            timeout=timeout, probe_env=probe.env, env_overrides=env_overrides,
                            name=probe.name, progress=progress)
            new = aggregate(run, names, probe.label)
            for r in new:
                if r["outcome"] == "hang":
                    r["timeout_s"] = timeout
            rows += new
            if run.status == "ok" and env_seen is None:
                env_seen = run.ranks[0].get("env")
        verdicts = decide_all(rows, tolerance, workload, baseline)
        report["runs"].append({"world_size": ws, "rows": rows, "verdicts": [v.to_json() for v in verdicts]})
    report["environment"] = env_seen or {}
    if not label:
        report["label"] = hardware_label(report)
    return report


def hardware_label(report: dict) -> str:
    """``2xH200-SM90-NVLink`` style label from the measured environment (``cpu`` without GPUs)."""
    env = report.get("environment") or {}
    if report.get("device") != "cuda" or not env.get("gpu_name"):
        return "cpu"
    name = env["gpu_name"].replace("NVIDIA ", "").split()[0]
    cc = env.get("compute_capability", "").replace(".", "")
    link = "NVLink" if (report.get("topology") or {}).get("nvlink") else "PCIe"
    return f"{report.get('gpus')}x{name}-SM{cc}-{link}"
