"""Command line of the runtime tier.

``python -m stackprobe.runtime run [--world-size 1,2] [--probes nccl-default,...] [--out DIR]``: run the rows
(one process per GPU; rows that can share a process group are measured side by side with the baseline) and
write ``runtime.json``, ``runtime.md`` and ``runtime.png`` into ``DIR``.

Statistics flags and why their defaults are what they are:

* ``--repeats 30``: paired rounds at the decode size inside one process group. Measured on 2x H200 (five runs,
  ``results/2xH200-SM90-NVLink``): with 30 pairs the 95% interval of a ratio is +/-0.1-0.4 %, and the ratio moves
  by up to ~2 % between runs (the process's own level), both well inside the 5 % tolerance; a process group
  stays under ~25 s.
* ``--rounds 4``: alternated process-group rounds (baseline, setting, setting, baseline, ...) for settings NCCL
  reads once per process (``NCCL_GRAPH_MIXING_SUPPORT``). Each round costs two process starts (~7 s each on
  2x H200); four rounds gave intervals of +/-0.5 % there, and keep the whole suite at world size 2 at 85-97 s.
* ``--tolerance 0.05``: see :data:`stackprobe.runtime.verdicts.DEFAULT_TOLERANCE`.
* ``--sweep-repeats 3``: rounds at the sizes other than the decode size (the plot's curve and its error bars,
  not a verdict).
``python -m stackprobe.runtime dispatch [--engine sglang|vllm] --server-args "FLAGS" [--env K=V] [--world-size 2]
[--out DIR]``: the engine's own TP allreduce dispatch (SGLang's GroupCoordinator, or vLLM's CudaCommunicator)
with those server arguments in world-size rank processes: which path served a decode-shape call under the engine's
graph capture, timed paired against the same group with only that path off
(:mod:`stackprobe.runtime.dispatch`); writes ``dispatch.json`` / ``dispatch.md``. Exit 0 when it ran, 2 for bad
input, 9 (validation could not run) when the ranks hung or crashed.
``python -m stackprobe.runtime render REPORT.json [--out DIR]``: re-render Markdown and plot from a JSON.
``python -m stackprobe.runtime p2p [--device cuda|cpu] [--devices 0,1] [--bytes 256K] [--timeout 60] [--self-test]
[--out DIR]``:
the P2P check (:mod:`stackprobe.runtime.p2pcheck`): per GPU pair a peer copy and a kernel-side peer read/write, each
in a child process with a timeout, checked against known data; writes ``p2p-check.json`` / ``p2p-check.md``. Exit 0
only when every pair passed (or the one-device ``--self-test``), 1 when a pair hung, returned wrong data or
failed (or so did the self-test), or a child survived, 2 for bad input, 3 when a pair has no peer access (stop),
4 when there was nothing to pair (not judged: fewer than two GPUs visible).
``python -m stackprobe.runtime list``: the probes and the workload presets.

Exit status, the README's table (the same codes as ``invoke`` and ``python -m stackprobe``): 0 when the suite ran
(whatever the verdicts), 2 for bad input, 9 (validation could not run) when the baseline itself failed or the
dispatch ranks hung or crashed: no ratio can be formed against a baseline that did not run.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .bench import BenchConfig

#: Exit code when the measurement could not run (README "Exit codes": 9, validation could not run).
COULD_NOT_RUN = 9
from .probes import registry  # noqa: E402
from .report import load, write  # noqa: E402
from .suite import default_probes, gpu_count, run_suite  # noqa: E402
from .verdicts import DEFAULT_TOLERANCE  # noqa: E402
from .dispatch import parse_env  # noqa: E402
from .workload import PRESETS, default_sizes, preset  # noqa: E402

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


def parse_size(text: str) -> int:
    """``43008``, ``32K``, ``64KB``, ``16M`` -> bytes. Raises ``ValueError`` with the accepted forms."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?B?)\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size; write bytes (43008) or with K/M/G (32K, 16M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stackprobe.runtime", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the runtime probes and write the reports")
    r.add_argument("--world-size", default="", help="comma list of world sizes (default: the GPUs present; 2 on CPU)")
    r.add_argument("--probes", default="", help="comma list of probe names or module:attr (default: all for the device)")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    r.add_argument("--preset", default="kimi-k2", help=f"workload preset ({', '.join(PRESETS)})")
    r.add_argument("--tokens", type=int, default=None, help="tokens per verify step (decode size = tokens*hidden*2 B)")
    r.add_argument("--sizes", default="", help="explicit sizes, decode size first (e.g. 43008,32K,64K,16M)")
    r.add_argument("--max-size", default="16M")
    r.add_argument("--dtype", default="bfloat16")
    r.add_argument("--warmup", type=int, default=3, help="untimed trials of every unit before the rounds")
    r.add_argument("--repeats", type=int, default=30, help="paired rounds at the decode size in one process group")
    r.add_argument("--sweep-repeats", type=int, default=3, help="paired rounds at the other sizes")
    r.add_argument("--rounds", type=int, default=4,
                   help="alternated process-group rounds for process-wide settings (NCCL_GRAPH_MIXING_SUPPORT)")
    r.add_argument("--graph-calls", type=int, default=122, help="calls captured in one CUDA graph")
    r.add_argument("--graph-replays", type=int, default=10, help="graph replays per timed trial")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per probe process group")
    r.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="fraction, e.g. 0.05")
    r.add_argument("--baseline", default="", help="default: nccl-default on GPUs, torch-gloo on CPU")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set in every probe process, overriding the suite's defaults (multicast off, NCCL_ALGO)")
    r.add_argument("--label", default="", help="hardware label for the report (default derived: 2xH200-SM90-NVLink)")
    r.add_argument("--target-arch", default="12.0")
    r.add_argument("--nccl-tests-log", default="", help="all_reduce_perf output from the same run, to embed")
    r.add_argument("--out", default="stackprobe-runtime", help="folder for runtime.json/.md/.png")
    d = sub.add_parser("render", help="write Markdown and plot from a runtime JSON")
    d.add_argument("json")
    d.add_argument("--out", default="")
    d.add_argument("--recompute-verdicts", action="store_true",
                   help="decide the verdicts again from the recorded rows (after a change of rules or tolerance)")
    d.add_argument("--tolerance", type=float, default=None, help="with --recompute-verdicts: a new tolerance")
    sub.add_parser("list", help="list probes and presets")
    q = sub.add_parser("p2p", help="per GPU pair: a peer copy and a kernel-side peer read/write in child processes "
                                   "with a timeout (ok / hang / wrong-data / unsupported / error)")
    q.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the same children, timeout and data check on host memory (tests)")
    q.add_argument("--devices", default="", help="comma list of device indices (default: every visible GPU; 0,1 on cpu)")
    q.add_argument("--bytes", default="256K", help="bytes per transfer (default 256K)")
    q.add_argument("--timeout", type=float, default=60.0, help="seconds per step and pair (default 60)")
    q.add_argument("--repeats", type=int, default=20, help="timed copies per direction (default 20)")
    q.add_argument("--self-test", action="store_true",
                   help="with one device: run both steps from it to itself (the check's own machinery, not P2P)")
    q.add_argument("--out", default="", help="folder for p2p-check.json / p2p-check.md")
    g = sub.add_parser("dispatch", help="the engine's own allreduce dispatch (--engine sglang|vllm) with the "
                                        "user's server args, paired against the same group with the serving path off")
    g.add_argument("--server-args", default="", metavar="FLAGS", help="the engine's server flags, one shell-quoted string")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set in every rank (repeatable)")
    g.add_argument("--world-size", type=int, default=0, help="ranks (default: the GPUs present; 2 on CPU)")
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    g.add_argument("--preset", default="kimi-k2", help=f"workload preset ({', '.join(PRESETS)})")
    g.add_argument("--tokens", type=int, default=None, help="rows of the decode tensor: batch x draft tokens")
    g.add_argument("--calls", type=int, default=None, help="all_reduce calls per captured graph (default: the "
                                                           "workload's per step)")
    g.add_argument("--replays", type=int, default=10, help="graph replays per timed trial")
    g.add_argument("--rounds", type=int, default=30, help="paired rounds")
    g.add_argument("--warmup", type=int, default=3)
    g.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole rank group")
    g.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    g.add_argument("--p2p-report", default="", metavar="JSON",
                   help="a saved P2P report (python -m stackprobe.runtime.p2p --out) instead of this host's")
    g.add_argument("--target-arch", default="12.0")
    g.add_argument("--target-topology", default="pcie", choices=("pcie", "nvlink"))
    g.add_argument("--target-world-size", type=int, default=8)
    from ..engines import DEFAULT
    from .dispatch import runtime_engines
    g.add_argument("--engine", default=DEFAULT, choices=tuple(runtime_engines()),
                   help="whose dispatch: a registered engine with a runtime record (SGLang's GroupCoordinator, vLLM's "
                        f"CudaCommunicator; default {DEFAULT})")
    g.add_argument("--probe", default="", help=argparse.SUPPRESS)   # module:attr of a probe subclass (tests)
    g.add_argument("--out", default="stackprobe-dispatch")
    return p


def dispatch_main(args) -> int:
    import json

    from . import dispatch
    try:
        env = parse_env(args.env)
        workload = preset(args.preset, args.tokens)
        report = json.loads(Path(args.p2p_report).read_text()) if args.p2p_report else None
        if report is not None and not all(k in report for k in ("peers", "iommu", "acs", "env")):
            raise ValueError(f"--p2p-report {args.p2p_report}: not a P2P report (needs peers, iommu, acs, env: "
                             "write one with python -m stackprobe.runtime.p2p --out DIR)")
        ws = args.world_size or (gpu_count() if args.device == "cuda" else 2)
        res = dispatch.run_dispatch(
            args.server_args, env, ws, device=args.device, rows=workload.tokens, hidden=workload.hidden,
            calls=args.calls or workload.calls_per_step, replays=args.replays, rounds=args.rounds,
            warmup=args.warmup, timeout=args.timeout, p2p_report=report, tolerance=args.tolerance,
            target={"compute_capability": args.target_arch, "topology": args.target_topology,
                    "world_size": args.target_world_size},
            probe_ref=args.probe, engine=args.engine,
            progress=lambda m: print(f"[dispatch] {m}", file=sys.stderr, flush=True))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = dispatch.write(res, args.out)
    sys.stdout.write(dispatch.markdown(res))
    print("\n".join(str(p) for p in paths.values()))
    return 0 if res["run"]["status"] == "ok" else COULD_NOT_RUN


def p2p_main(args) -> int:
    from . import p2pcheck
    try:
        devices = _ints(args.devices) if args.devices else None
        rep = p2pcheck.run_check(devices, device=args.device, nbytes=parse_size(args.bytes), timeout=args.timeout,
                                 repeats=args.repeats, self_test=args.self_test,
                                 progress=lambda m: print(f"[p2p] {m}", file=sys.stderr, flush=True))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(p2pcheck.markdown(rep))
    if args.out:
        print("\n".join(str(p) for p in p2pcheck.write(rep, args.out).values()))
    return p2p_exit(rep)


def p2p_exit(rep: dict) -> int:
    """The P2P check's exit status, for a script that gates on it (the README: only "ok" everywhere is a go): 1 when
    a pair (or the one-device self-test) hung, returned wrong data or failed, or a child survived; 3 (stop, a risk, as
    the host stage's 3) when CUDA reports no peer access for a pair (a peer-memory path must stay off there: PCIe IPC
    does not check P2P before it maps a peer's memory); 4 (not judged, as the host stage's 4) when there was nothing
    to pair and no self-test passed; 0 only when every pair (or the self-test) is ok."""
    checked = rep["pairs"] + ([rep["self_test"]] if rep.get("self_test") else [])
    if rep["leftover_pids"] or any(p["status"] in ("hang", "wrong-data", "error") for p in checked):
        return 1
    if any(p["status"] == "unsupported" for p in checked):
        return 3
    return 0 if checked and all(p["status"] == "ok" for p in checked) else 4


def main(argv: list[str] | None = None) -> int:  # noqa: C901, PLR0912 - reason: one branch per subcommand (run, p2p, dispatch) and its options
    argv = list(sys.argv[1:] if argv is None else argv)
    # "--server-args --flag": argparse would read a value starting with -- as a flag of its own
    for i in range(len(argv) - 1):
        if argv[i] == "--server-args":
            argv[i:i + 2] = [f"--server-args={argv[i + 1]}"]
            break
    args = build_parser().parse_args(argv)
    if args.cmd == "list":
        from .probes import NotRunnableProbe
        for name, pr in registry().items():
            runner = "no runner yet" if isinstance(pr, NotRunnableProbe) else "runner"
            print(f"{name:32s} {pr.device:5s} {runner:13s} {pr.label}")
        for name, w in PRESETS.items():
            print(f"preset {name}: {w.to_json()}")
        return 0
    if args.cmd == "dispatch":
        return dispatch_main(args)
    if args.cmd == "p2p":
        return p2p_main(args)
    if args.cmd == "render":
        report = load(args.json)
        if args.recompute_verdicts:
            from .verdicts import decide_all
            from .workload import Workload
            if args.tolerance is not None:
                report["tolerance"] = args.tolerance
            wl = report.get("workload")
            workload = Workload(**{k: wl[k] for k in ("name", "hidden", "layers", "allreduces_per_layer", "tokens",
                                                      "dtype")}) if wl else None
            for run in report["runs"]:
                run["verdicts"] = [v.to_json() for v in
                                   decide_all(run["rows"], report["tolerance"], workload, report["baseline"],
                                              host=run.get("host"))]
        paths = write(report, args.out or Path(args.json).parent, Path(args.json).stem)
        print("\n".join(str(p) for p in paths.values()))
        return 0
    try:
        workload = preset(args.preset, args.tokens)
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()] if args.sizes else \
            default_sizes(workload, largest=parse_size(args.max_size))
        env = parse_env(args.env)
        gpus = gpu_count()
        world_sizes = _ints(args.world_size) if args.world_size else [gpus if args.device == "cuda" else 2]
        if any(w < 1 for w in world_sizes):
            raise ValueError(f"world sizes must be >= 1 (got {world_sizes}); no GPUs found?" if args.device == "cuda"
                             else f"world sizes must be >= 1 (got {world_sizes})")
        probes = [p for p in args.probes.split(",") if p.strip()] or default_probes(args.device)
        if args.repeats < 2 or args.sweep_repeats < 1:
            raise ValueError(f"--repeats {args.repeats} / --sweep-repeats {args.sweep_repeats}: an interval needs "
                             "at least 2 paired rounds at the decode size and 1 elsewhere")
        if not 0 < args.tolerance < 1:
            raise ValueError(f"--tolerance {args.tolerance}: write a fraction between 0 and 1 (0.05 = 5 %)")
        if args.rounds < 2:
            raise ValueError(f"--rounds {args.rounds}: at least 2 alternated process-group rounds are needed")
        from .bench import check_exact_range
        for ws in world_sizes:
            check_exact_range(args.dtype, ws, args.graph_calls)
        for name in probes:
            if ":" not in name and name not in registry():
                raise ValueError(f"unknown probe {name!r}; known: {', '.join(registry())} (or give module:attr)")
        config = BenchConfig(sizes=sizes, dtype=args.dtype, warmup=args.warmup, rounds=args.repeats,
                             sweep_rounds=args.sweep_repeats, graph_calls=args.graph_calls,
                             graph_replays=args.graph_replays)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import signal

    def on_term(signum, frame):  # SIGTERM ends the suite through its cleanup (finally blocks), like Ctrl-C
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    report = run_suite(probes, world_sizes, config, device=args.device, timeout=args.timeout,
                       tolerance=args.tolerance, workload=workload, baseline=args.baseline or None, env_overrides=env,
                       gpus=gpus, label=args.label, target_arch=args.target_arch, rounds=args.rounds)
    if args.nccl_tests_log and Path(args.nccl_tests_log).is_file():
        report["nccl_tests"] = Path(args.nccl_tests_log).read_text(errors="replace")[-6000:]
    paths = write(report, args.out)
    for run in report["runs"]:
        print(f"world size {run['world_size']}:")
        for v in run["verdicts"]:
            m = v["measurements"]
            ci = (f"ratio {m['ratio_to_baseline']:.3f} [{m['ratio_low']:.3f}, {m['ratio_high']:.3f}]"
                  if m.get("ratio_to_baseline") is not None else "")
            work = f"work {m['work_us']:.2f} us" if m.get("work_us") is not None else ""
            print(f"  {v['backend']:28s} {m.get('kind', ''):8s} {v['status']:13s} {work:16s} {ci}  {v.get('gate', '')}")
    print("\n".join(str(p) for p in paths.values()))
    base_ok = all(any(v["backend"] == report["baseline"] and v["status"] == "baseline" for v in run["verdicts"])
                  for run in report["runs"])
    return 0 if base_ok else COULD_NOT_RUN


if __name__ == "__main__":
    sys.exit(main())
