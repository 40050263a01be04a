"""Runtime reports: JSON (the record), Markdown (the tables) and a plot (latency vs message size, log-log).

All three are written from the report dict alone, so a recorded JSON can be re-rendered anywhere
(``python -m stackprobe.runtime render report.json``). matplotlib is optional: without it the plot is skipped
and the Markdown says so.

Report dict (``tier: runtime``): ``schema``, ``created``, ``label``, ``target_arch``, ``device``, ``gpus``,
``environment`` (torch, CUDA, GPU name, compute capability, NCCL), ``topology``, ``config`` (sweep sizes in
bytes, repeats, graph calls), ``workload``, ``baseline``, ``tolerance``, ``multicast_off`` and ``runs``: one per
world size with ``rows`` (per backend, per size: eager/graph median us, per-rank medians, spread %, algbw/busbw
GB/s, correctness) and ``verdicts`` (:class:`stackprobe.verdict.Verdict` JSON, ``tier="runtime"``).
"""
from __future__ import annotations

import json
from pathlib import Path

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
            f"{env.get('torch_nccl_version', '?')}.")
    if not same:
        note += (f" This is NOT the target (compute capability {target}, SM{target.replace('.', '')}, PCIe): figures "
                 f"show that the code paths run and how they compare on this host, not what SM{target.replace('.', '')} "
                 f"over PCIe will do.")
    return note


def markdown(report: dict, plot_name: str | None = None) -> str:
    """The Markdown report: hardware note, settings, per world size the verdict table at the decode size,
    the workload step time, and the sweep table per backend."""
    cfg = report["config"]
    wl = report.get("workload") or {}
    lines = [f"# Runtime validation: {report.get('label', '')}", "", hardware_note(report), ""]
    lines += [f"- created {report.get('created')}; baseline **{report['baseline']}** measured in the same run; "
              f"tolerance {report['tolerance']:.0%} on the decode-size ratio (CUDA graph latency)",
              f"- sizes (bytes, decode size first): {', '.join(str(s) for s in cfg['sizes'])}; dtype {cfg['dtype']}",
              f"- eager: {cfg['repeats']} repeats x {cfg['iters']} calls; CUDA graph: {cfg['graph_calls']} calls "
              f"captured in one graph, {cfg['repeats']} repeats x {cfg['graph_replays']} replays; every captured "
              "call checked against the reference sum",
              "- time = mean over ranks of each rank's median per call; busbw = algbw * 2(n-1)/n (nccl-tests); "
              "eager = calls issued back to back from Python (CPU-bound for small messages), graph = replays",
              f"- multicast off in every probe process: "
              + ", ".join(f"{k}={v}" for k, v in (report.get("multicast_off") or {}).items())]
    if wl:
        lines.append(f"- workload {wl['name']}: hidden {wl['hidden']}, {wl['layers']} layers x "
                     f"{wl['allreduces_per_layer']} allreduces = {wl['calls_per_step']} per verify step, "
                     f"{wl['tokens']} tokens, {wl['dtype']} -> {wl['message_bytes']:,} B per allreduce")
    if report.get("nccl_tests"):
        lines += ["", "## nccl-tests in the same run", "", "```", report["nccl_tests"].strip(), "```"]
    for run in report["runs"]:
        ws = run["world_size"]
        lines += ["", f"## World size {ws}", "",
                  "| backend | eager us | graph us | ratio to baseline | busbw GB/s | spread % | step us | vs baseline us | verdict | cause |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for v in run["verdicts"]:
            m = v["measurements"]
            status = v["status"]
            if v.get("gate"):
                status += f" ({v['gate']})"
            cause = (v.get("cause") or "").replace("|", "/").replace("\n", " ")
            if v.get("lift_detail"):
                cause += f" Lift: {v['lift_detail']}."
            for w in v.get("warnings") or []:
                cause += f" Note: {w}."
            lines.append(
                f"| {v['backend']} | {_fmt(m.get('eager_us'))} | {_fmt(m.get('graph_us'))} | "
                f"{_fmt(m.get('ratio_to_baseline'), 2)} | {_fmt(m.get('busbw_gbps'), 2)} | "
                f"{_fmt(m.get('graph_spread_pct', m.get('eager_spread_pct')))} | {_fmt(m.get('step_us'))} | "
                f"{_fmt(m.get('step_diff_us'))} | {status} | {cause[:700]} |")
        for row in run["rows"]:
            if not row.get("sweep"):
                continue
            lines += ["", f"### {row['backend']} @ {ws}: {row.get('label', '')}", "",
                      "| size | eager us | graph us | graph algbw GB/s | graph busbw GB/s | spread % | correct (eager/graph) |",
                      "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
            for rec in row["sweep"]:
                if "error" in rec:
                    lines.append(f"| {_kb(rec['bytes'])} | error: {rec['error'][:200]} | | | | | |")
                    continue
                e, g = rec.get("eager") or {}, rec.get("graph") or {}
                gok = g.get("status") == "ok"
                lines.append(f"| {_kb(rec['bytes'])} | {_fmt(e.get('median_us'))} | "
                             f"{_fmt(g.get('median_us')) if gok else g.get('status', '-')} | "
                             f"{_fmt(g.get('algbw_gbps'), 2) if gok else '-'} | {_fmt(g.get('busbw_gbps'), 2) if gok else '-'} | "
                             f"{_fmt(g.get('spread_pct') if gok else e.get('spread_pct'))} | "
                             f"{rec.get('eager_correct')}/{rec.get('graph_correct', '-')} |")
            if row.get("checks"):
                lines += ["", "Collectives captured in CUDA graphs:", ""]
                for coll, r in row["checks"].items():
                    lines.append(f"- {coll}: eager {r.get('eager')}, graph {r.get('graph', '-')}"
                                 + (f" ({r.get('eager_error') or r.get('graph_error') or r.get('error')})"
                                    if r.get('eager_error') or r.get('graph_error') or r.get('error') else ""))
    if plot_name:
        lines += ["", f"![latency vs message size]({plot_name})"]
    elif plot_name is None:
        lines += ["", "(no plot: matplotlib is not installed)"]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> bool:
    """Latency (us per call, CUDA graph; eager where there are no graphs) vs message size, log-log, one panel
    per world size, one line per backend. Returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = report["runs"]
    fig, axes = plt.subplots(1, max(len(runs), 1), figsize=(6.5 * max(len(runs), 1), 4.8), squeeze=False)
    for ax, run in zip(axes[0], runs):
        for row in run["rows"]:
            for mode, style in (("graph", "-o"), ("eager", ":x")):
                pts = [(r["bytes"], (r.get(mode) or {}).get("median_us")) for r in row.get("sweep", [])
                       if (r.get(mode) or {}).get("status", "ok") == "ok" and (r.get(mode) or {}).get("median_us")]
                if mode == "eager" and any((r.get("graph") or {}).get("status") == "ok" for r in row.get("sweep", [])):
                    continue  # graph figures are the ones the engine sees; eager only where no graphs
                if pts:
                    pts.sort()
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, markersize=3,
                            label=f"{row['backend']} ({mode})")
        wl = report.get("workload") or {}
        if wl.get("message_bytes"):
            ax.axvline(wl["message_bytes"], color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("time per allreduce (us)")
        ax.set_title(f"{report.get('label', '')}, world size {run['world_size']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
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
