"""Runtime reports: JSON (the record), Markdown (the tables) and a plot (latency vs message size, log-log).

All three are written from the report dict alone, so a recorded JSON can be re-rendered anywhere
(``python -m stackprobe.runtime render report.json``). matplotlib is optional: without it the plot is skipped
and the Markdown says so.

Report dict (``tier: runtime``): ``schema``, ``created``, ``label``, ``target_arch``, ``device``, ``gpus``,
``environment`` (rank 0's torch, CUDA, GPU name, compute capability, NCCL), ``host`` (where it was measured:
compute capability, topology nvlink/pcie, driver, torch, NCCL; see :func:`stackprobe.runtime.suite.host_info`),
``topology``, ``config`` (sizes in bytes, rounds, graph calls), ``process_rounds``, ``workload``, ``baseline``,
``tolerance``, ``multicast_off`` and ``runs``: one per world size with ``host`` (plus ``world_size``), ``rows``
(per row, per size: per-round samples, time/work/floor per call with 95% intervals, the paired ratio with its
interval, busbw, the three correctness checks) and ``verdicts`` (:class:`stackprobe.verdict.Verdict` JSON,
``tier="runtime"``, status baseline / faster / parity / slower / inconclusive / blocked / skipped / error).
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import mdtable
from ..archs import parse_arch
from ..atomic import atomic_path, write_atomic
from ..verdict import Verdict


def load(path: str | Path) -> dict:
    """Read a runtime report JSON; raises ``ValueError`` when it is not one."""
    d = json.loads(Path(path).read_text())
    if d.get("tier") != "runtime" or "runs" not in d:
        raise ValueError(f"{path} is not a runtime report (no tier=runtime / runs)")
    return d


def verdicts(report: dict, world_size: int | None = None) -> list[Verdict]:
    """The :class:`Verdict` objects of one world size (the largest when ``None``)."""
    runs = report["runs"]
    if not runs:
        return []
    run = max(runs, key=lambda r: r["world_size"]) if world_size is None else next(
        r for r in runs if r["world_size"] == world_size)
    return [Verdict.from_json(v) for v in run["verdicts"]]


def _fmt(x, nd=1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _kb(b: int) -> str:
    if b >= 2**20 and b % 2**20 == 0:
        return f"{b // 2**20} MB"
    if b % 1024 == 0:
        return f"{b // 1024} KB"
    return f"{b:,} B (~{b / 1024:.0f} KB)"


def hardware_note(report: dict) -> str:
    """One sentence on what hardware this is and whether it is the target (an SM90 NVLink host is not the
    SM120 PCIe target: NVLink and P2P make custom/one-shot kernels look far better than they do over PCIe)."""
    env = report.get("environment") or {}
    if report.get("device") != "cuda":
        return "CPU run (gloo): no GPU figures; this exercises the suite, not a backend."
    cc = env.get("compute_capability", "?")
    link = "NVLink" if (report.get("topology") or {}).get("nvlink") else "no NVLink seen (PCIe)"
    target = report.get("target_arch", "12.0")
    try:
        same = parse_arch(cc).cc == parse_arch(target).cc
    except Exception:
        same = False
    note = (f"Measured on {report.get('gpus')}x {env.get('gpu_name', '?')} (compute capability {cc}, SM{cc.replace('.', '')}), "
            f"{link}; torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}), NCCL "
            f"{(report.get('host') or {}).get('nccl_version') or env.get('torch_nccl_version', '?')}; driver "
            f"{(report.get('host') or {}).get('driver_version', '?')}.")
    if not same:
        note += (f" This is NOT the target (compute capability {target}, SM{target.replace('.', '')}, PCIe): figures "
                 f"show that the code paths run and how they compare on this host, not what SM{target.replace('.', '')} "
                 f"over PCIe will do.")
    return note


def _ci_text(d: dict | None, nd: int = 2) -> str:
    if not d or d.get("mean", d.get("value")) is None:
        return "-"
    return f"{d.get('mean', d.get('value')):.{nd}f} [{d['low']:.{nd}f}, {d['high']:.{nd}f}]"


def _ratio_text(m: dict) -> str:
    if m.get("ratio_to_baseline") is None:
        return "-"
    return f"{m['ratio_to_baseline']:.3f} [{m['ratio_low']:.3f}, {m['ratio_high']:.3f}]"


def _work_text(m: dict) -> str:
    if m.get("work_us") is None:
        return "-"
    return f"{m['work_us']:.2f} [{m['work_low_us']:.2f}, {m['work_high_us']:.2f}]"


def _rank_key(v: dict):
    r = v["measurements"].get("ratio_to_baseline")
    return (v["status"] != "baseline", r is None, r if r is not None else 0.0)


def host_table(host: dict | None) -> list[str]:
    if not host:
        return []
    keys = ("compute_capability", "gpu_name", "gpus", "topology", "driver_version", "torch", "torch_cuda",
            "nccl_version")
    return mdtable.table(("host", *keys), [("measured on", *(host.get(k, "-") for k in keys))])


def markdown(report: dict, plot_name: str | None = None) -> str:
    """The Markdown report: hardware note and host block, settings, then per world size the backends and the
    NCCL settings ranked apart (each by its paired ratio to the baseline, with the 95% interval and status),
    the rows that did not run, and the sweep of every row."""
    lines = _md_head(report) + _md_settings(report) + _md_p2p_check(report) + _md_workload(report)
    lines += _md_nccl_tests(report)
    for run in report["runs"]:
        lines += _md_world_size(run)
    return "\n".join(lines + _md_plot(plot_name)) + "\n"


def _md_head(report: dict) -> list[str]:
    """The title, the hardware note and the host block."""
    lines = [f"# Runtime validation: {report.get('label', '')}", "", hardware_note(report), ""]
    return lines + host_table(report.get("host")) + [""]


def _md_settings(report: dict) -> list[str]:
    """The settings bullets: baseline and status rule, sizes, the timed unit, work and busbw, correctness, multicast."""
    cfg = report["config"]
    tol = report["tolerance"]
    return [f"- created {report.get('created')}; baseline **{report['baseline']}** measured beside every row "
            f"(paired rounds); status from the 95% bootstrap interval of the ratio: faster (upper bound < "
            f"{1 - tol:.2f}), slower (lower bound > {1 + tol:.2f}), parity (inside [{1 - tol:.2f}, {1 + tol:.2f}]), "
            f"else inconclusive",
            f"- sizes (bytes, decode size first): {', '.join(str(s) for s in cfg['sizes'])}; dtype {cfg['dtype']}",
            f"- one unit = {cfg['graph_calls']} calls in one CUDA graph (eager sequence on CPU), each call with its "
            f"own input; {cfg['graph_replays']} replays per trial; {cfg['rounds']} paired rounds at the decode size, "
            f"{cfg.get('sweep_rounds', '-')} elsewhere; settings NCCL reads once per process: "
            f"{report.get('process_rounds', '-')} alternated process-group rounds",
            "- work = time per call - the empty-graph floor (the per-call input writes alone) measured in the same "
            "rounds; busbw = algbw * 2(n-1)/n (nccl-tests)",
            "- correctness: output poisoned before each check; eager call, the accumulated sequence (arithmetic "
            "series) and the timed graph itself",
            f"- multicast off in every probe process: "
            + ", ".join(f"{k}={v}" for k, v in (report.get("multicast_off") or {}).items())]


def _md_p2p_check(report: dict) -> list[str]:
    """The P2P check's summary bullet and, on GPUs, what each world size's baseline connected over."""
    if "p2p_check" not in report:
        return []
    from .nccl_transport import label as transport_label
    from .p2pcheck import summary_line
    lines = [f"- {summary_line(report['p2p_check'], report.get('device'))}"]
    return lines + [f"- world size {r['world_size']}: baseline {report['baseline']} "
                    f"{transport_label(r.get('nccl_transport'))}" for r in report["runs"] if "nccl_transport" in r
                    and report.get("device") == "cuda"]


def _md_workload(report: dict) -> list[str]:
    """The workload bullet (hidden size, layers, allreduces per verify step, bytes per allreduce), when one is set."""
    wl = report.get("workload") or {}
    if not wl:
        return []
    return [f"- workload {wl['name']}: hidden {wl['hidden']}, {wl['layers']} layers x "
            f"{wl['allreduces_per_layer']} allreduces = {wl['calls_per_step']} per verify step, "
            f"{wl['tokens']} tokens, {wl['dtype']} -> {wl['message_bytes']:,} B per allreduce"]


def _md_nccl_tests(report: dict) -> list[str]:
    """The nccl-tests output of the same run, verbatim, when there is one."""
    if not report.get("nccl_tests"):
        return []
    return ["", "## nccl-tests in the same run", "", "```", report["nccl_tests"].strip(), "```"]


def _md_world_size(run: dict) -> list[str]:
    """One world size: the ranked tables, the rows not measured, the rows in full, then each row's sweep."""
    ws = run["world_size"]
    verdicts = run.get("verdicts") or []
    measured = [v for v in verdicts if v["status"] in ("baseline", "faster", "parity", "slower", "inconclusive")]
    rest = [v for v in verdicts if v not in measured]
    spill = mdtable.Spill()   # causes and preconditions too long for a cell, under the row's heading below
    lines = ["", f"## World size {ws}", "", f"{len(measured)} rows measured; {len(rest)} not measured, blocked or in "
             "error.", ""]
    for kind, title in (("backend", "Backends"), ("setting", "NCCL settings (ranked apart: each needs its "
                                                              "precondition)")):
        lines += _md_ranked(measured, kind, title, spill)
    lines += _md_not_measured(rest, spill)
    lines += spill.markdown(f"Rows in full (world size {ws})", "One heading per row whose cells above were cut: "
                            "its cause, precondition or note whole.", level=3)
    for row in run["rows"]:
        lines += _md_sweep(row, ws)
    return lines


def _md_ranked(measured: list[dict], kind: str, title: str, spill: mdtable.Spill) -> list[str]:
    """One ranked table (backends or NCCL settings), sorted by the paired ratio to the baseline; [] when empty."""
    vs = sorted([v for v in measured if v["measurements"].get("kind") in (kind, "baseline")], key=_rank_key)
    if kind == "setting":
        vs = [v for v in vs if v["measurements"].get("kind") == "setting"]
    if not vs:
        return []
    lines = [f"### {title}", ""]
    if kind == "backend":
        lines += mdtable.header(("rank", "row", "status", "ratio to baseline [95% CI]",
                                 "work us/call [95% CI]", "floor us", "rounds", "step us", "cause"),
                                right=(0, 5, 6, 7))
    else:
        lines += mdtable.header(("rank", "setting", "status", "ratio to baseline [95% CI]",
                                 "work us/call [95% CI]", "rounds", "precondition (source)",
                                 "SGLang as shipped meets it"), right=(0, 5))
    for i, v in enumerate(vs, 1):
        lines.append(_md_backend_row(i, v, spill) if kind == "backend" else _md_setting_row(i, v, spill))
    return lines + [""]


def _md_backend_row(i: int, v: dict, spill: mdtable.Spill) -> str:
    """A backend's ranked row: status, ratio, work, floor, rounds, step time and its cause with the notes."""
    m = v["measurements"]
    cause = v.get("cause") or ""
    for w in v.get("warnings") or []:
        if "not met by SGLang" not in w:
            cause += f" Note: {w}."
    return mdtable.row((i, v["backend"], f"**{v['status']}**", _ratio_text(m), _work_text(m),
                        _fmt(m.get("floor_us"), 2), m.get("rounds", "-"),
                        _fmt(m.get("step_us")), spill.cell(v["backend"], cause, "cause")))


def _md_setting_row(i: int, v: dict, spill: mdtable.Spill) -> str:
    """An NCCL setting's ranked row: its variables and scope, status, ratio, work, precondition and SGLang's answer."""
    m = v["measurements"]
    st = m.get("setting") or {}
    sg = st.get("sglang") or {}
    env = ", ".join(f"{k}={val}" for k, val in (st.get("env") or {}).items())
    return mdtable.row((i, f"{v['backend']} (`{env}`, {st.get('scope', '')} scope)",
                        f"**{v['status']}**", _ratio_text(m), _work_text(m),
                        m.get("rounds", "-"),
                        spill.cell(v["backend"], st.get("precondition", ""), "precondition",
                                   limit=max(80, 190 - len(str(st.get("source", "")))))
                        + f" ({st.get('source', '')})",
                        spill.cell(v["backend"], f"{'yes' if sg.get('meets') else 'no'}: "
                                   f"{sg.get('note', '')}", "SGLang as shipped meets it")))


def _md_not_measured(rest: list[dict], spill: mdtable.Spill) -> list[str]:
    """The table of rows not measured, blocked or in error, each with its gate, cause, lift and any ratio."""
    if not rest:
        return []
    lines = ["### Not measured, blocked or in error", "", *mdtable.header(("row", "kind", "status", "gate", "cause"))]
    for v in rest:
        cause = v.get("cause") or ""
        if v.get("lift_detail"):
            cause += f" Lift: {v['lift_detail']}."
        if "ratio_to_baseline" in v["measurements"]:
            cause += f" Ratio {_ratio_text(v['measurements'])}."
        lines.append(mdtable.row((v["backend"], v["measurements"].get("kind", ""), v["status"],
                                  v.get("gate", ""), spill.cell(v["backend"], cause, "cause"))))
    return lines


def _md_sweep(row: dict, ws: int) -> list[str]:
    """One row's sweep over the message sizes, then the collectives it captured in CUDA graphs; [] without a sweep."""
    if not row.get("sweep"):
        return []
    lines = ["", f"#### {row['backend']} @ {ws}: {row.get('label', '')}", "",
             *mdtable.header(("size", "time us/call [95% CI]", "work us/call [95% CI]", "ratio [95% CI]",
                              "busbw GB/s", "rounds", "correct (eager/sequence/timed graph)"), right=(4, 5))]
    for rec in row["sweep"]:
        if "error" in rec and "work_us" not in rec:
            lines.append(mdtable.row((_kb(rec["bytes"]), mdtable.short(f"error: {rec['error']}", 200,
                                                                       " ... (the JSON has it whole)"), "", "", "", "",
                                      "")))
            continue
        lines.append(mdtable.row((_kb(rec["bytes"]), _ci_text(rec.get("time_us")), _ci_text(rec.get("work_us")),
                                  _ci_text(rec.get("ratio"), 3), _fmt(rec.get("busbw_gbps"), 2),
                                  rec.get("rounds", "-"), f"{rec.get('eager_correct', '-')}/"
                                  f"{rec.get('sequence_correct', '-')}/{rec.get('timed_correct', '-')}")))
    if row.get("checks"):
        lines += ["", "Collectives captured in CUDA graphs:", ""]
        for coll, r in row["checks"].items():
            lines.append(f"- {coll}: eager {r.get('eager')}, graph {r.get('graph', '-')}"
                         + (f" ({r.get('eager_error') or r.get('graph_error') or r.get('error')})"
                            if r.get('eager_error') or r.get('graph_error') or r.get('error') else ""))
    return lines


def _md_plot(plot_name: str | None) -> list[str]:
    """The plot's image link, or the line saying matplotlib is missing (None); nothing for an empty name."""
    if plot_name:
        return ["", f"![work per call vs message size, and the paired ratios with 95% intervals]({plot_name})"]
    if plot_name is None:
        return ["", "(no plot: matplotlib is not installed)"]
    return []


def plot(report: dict, path: Path) -> bool:
    """Per world size, two panels: work per call (us, mean with its 95% interval as error bars) vs message
    size, log-log, one line per measured row; and the decode-size ratio to the baseline of every measured row
    with its 95% interval (horizontal error bars) and the tolerance band. Returns False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = report["runs"]
    tol = report.get("tolerance", 0.05)
    fig, axes = plt.subplots(max(len(runs), 1), 2, figsize=(14, 4.8 * max(len(runs), 1)), squeeze=False)
    for (ax, axr), run in zip(axes, runs):
        for row in run["rows"]:
            pts = [(r["bytes"], r["work_us"]) for r in row.get("sweep", []) if r.get("work_us")]
            pts = [(b, w) for b, w in pts if w["mean"] > 0]
            if not pts:
                continue
            pts.sort(key=lambda p: p[0])
            xs = [p[0] for p in pts]
            ys = [p[1]["mean"] for p in pts]
            lo = [max(p[1]["mean"] - p[1]["low"], 0) for p in pts]
            hi = [max(p[1]["high"] - p[1]["mean"], 0) for p in pts]
            style = "--" if row.get("kind") == "setting" else "-"
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style + "o", markersize=3, capsize=2,
                        label=f"{row['backend']} ({row.get('kind', '')})")
        wl = report.get("workload") or {}
        if wl.get("message_bytes"):
            ax.axvline(wl["message_bytes"], color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("work per allreduce (us), 95% CI")
        ax.set_title(f"{report.get('label', '')}, world size {run['world_size']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        vs = [v for v in run.get("verdicts") or [] if v["measurements"].get("ratio_to_baseline") is not None]
        vs.sort(key=lambda v: (v["measurements"].get("kind") == "setting", v["measurements"]["ratio_to_baseline"]))
        for i, v in enumerate(vs):
            m = v["measurements"]
            color = "tab:orange" if m.get("kind") == "setting" else "tab:blue"
            axr.errorbar([m["ratio_to_baseline"]], [i], xerr=[[m["ratio_to_baseline"] - m["ratio_low"]],
                                                             [m["ratio_high"] - m["ratio_to_baseline"]]],
                         fmt="o", color=color, capsize=3)
        axr.set_yticks(range(len(vs)))
        axr.set_yticklabels([f"{v['backend']} ({v['status']})" for v in vs], fontsize=7)
        axr.axvspan(1 - tol, 1 + tol, color="grey", alpha=0.2, label=f"parity band +/-{tol:.0%}")
        axr.axvline(1.0, color="black", linewidth=0.8)
        axr.set_xlabel(f"work per call / {report.get('baseline')}, decode size, 95% CI "
                       "(blue: backends, orange: settings)")
        axr.set_xscale("log")
        axr.grid(True, which="both", alpha=0.3)
        axr.legend(fontsize=7)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return True


def write(report: dict, out_dir: str | Path, stem: str = "runtime") -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (when matplotlib is there) into ``out_dir``.
    Returns the paths written."""
    out = Path(out_dir)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
    write_atomic(paths["json"], json.dumps(report, indent=1, default=str) + "\n")
    png = out / f"{stem}.png"
    has_plot = plot(report, png)
    if has_plot:
        paths["png"] = png
    write_atomic(paths["md"], markdown(report, png.name if has_plot else None))
    return paths
