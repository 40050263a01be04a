"""The runtime tier: which allreduce backends and NCCL settings really work on the GPUs at hand, under CUDA
graphs, at the decode-sized messages a serving engine sends, measured in paired rounds against NCCL as the engine
runs it (``nccl-default``: NCCL_ALGO/NCCL_PROTO unset, ncclAllReduce on the current stream).

Entry points:

* ``python -m stackprobe.runtime run ...`` (its own CLI: :mod:`stackprobe.runtime.__main__`);
* ``python -m stackprobe --runtime`` (the static tier's CLI) calls :func:`run_runtime`, which adds the runtime
  verdicts (``tier="runtime"``) to the static report and writes the full runtime report beside it.

Modules: :mod:`.orchestrate` (process groups, timeouts, cleanup), :mod:`.guard` (kills a probe's processes
when the suite dies), :mod:`.worker` (one rank), :mod:`.probes` (the rows), :mod:`.ncclbind` (ctypes libnccl),
:mod:`.bench` (paired timing, correctness checks), :mod:`.stats` (bootstrap intervals, statuses),
:mod:`.verdicts` (rules), :mod:`.workload` (presets), :mod:`.report` (JSON/Markdown/plot), :mod:`.suite`.
"""
from __future__ import annotations

import sys
from pathlib import Path
from ..paths import PCIE_IPC
from ..verdict import CLOSED_STATUSES

# runtime backend -> the static tier's backend whose gate governs it
STATIC_NAME = {
    "nccl-default": "nccl-ring", "nccl-ring": "nccl-ring", "nccl-tree": "nccl-tree",
    "nccl-allreduce-tree": "nccl-tree",
    "torch-symm-mem-one-shot": "torch-symm-mem", "torch-symm-mem-two-shot": "torch-symm-mem",
    "sglang-custom-allreduce": "sglang-custom-allreduce", "flashinfer-allreduce-fusion": "flashinfer-allreduce-fusion",
    PCIE_IPC: PCIE_IPC, "ep-flashinfer-a2a": "ep-flashinfer-a2a",
    "mscclpp": "mscclpp", "b12x": "b12x",
}
# static gate kinds that mean "cannot run in this environment at all" (a topology gate is the runtime's to test)
_BLOCKING_GATES = ("not-installed", "toolchain", "compiled-binary", "python-table", "driver")


def static_skips(static_verdicts: list, target_arch: str, present_cc: str | None) -> dict[str, tuple[str, str]]:
    """Runtime backends to skip because the static tier found their gate closed here.

    A static verdict judges the *target* compute capability; it governs the runtime run only when the GPUs
    present have that compute capability (an SM90 host can run code an SM120 gate refuses). Returns
    ``{runtime backend: (gate kind, reason)}``.
    """
    from ..archs import parse_arch
    try:
        same = present_cc is not None and parse_arch(present_cc).cc == parse_arch(target_arch).cc
    except Exception:
        same = False
    if not same:
        return {}
    blocked = {v.backend: v for v in static_verdicts
               if getattr(v, "tier", "static") == "static" and v.status in CLOSED_STATUSES and v.gate in _BLOCKING_GATES}
    return {rt: (blocked[st].gate, f"static gate ({blocked[st].gate}): {blocked[st].cause}")
            for rt, st in STATIC_NAME.items() if st in blocked}


def run_runtime(report, args) -> dict:
    """Hook for ``python -m stackprobe --runtime``: run the runtime suite on the GPUs present and add its
    verdicts (largest world size, ``tier="runtime"``) to ``report`` (a :class:`stackprobe.report.Report`).

    World size: ``min(args.world_size, GPUs present)``. The full runtime report (JSON, Markdown, plot) goes
    to ``<--json path without suffix>-runtime/`` (``stackprobe-runtime/`` without ``--json``). Returns the
    runtime report dict.
    """
    from .bench import BenchConfig
    from .probes import registry
    from .report import write
    from .suite import gpu_count, run_suite
    from .workload import default_sizes, preset

    gpus = gpu_count()
    if gpus < 1:
        print("stackprobe: --runtime needs NVIDIA GPUs and none is visible here (nvidia-smi -L lists none). "
              "Run on a GPU host, or use `python -m stackprobe.runtime run --device cpu` to exercise the suite.",
              file=sys.stderr)
        raise SystemExit(3)
    ws = max(1, min(int(getattr(args, "world_size", gpus) or gpus), gpus))
    env_gpus = (report.environment or {}).get("gpus") or []
    present_cc = env_gpus[0].get("capability") if env_gpus else None
    skips = static_skips(report.verdicts, report.target_arch, present_cc)
    wanted = getattr(args, "backends", None)
    names = [n for n, p in registry().items() if p.device == "cuda"
             and (not wanted or n in wanted or STATIC_NAME.get(n) in wanted or n == "nccl-default")]
    workload = preset("kimi-k2")
    config = BenchConfig(sizes=default_sizes(workload))
    quiet = getattr(args, "quiet", False)
    progress = (lambda m: None) if quiet else (lambda m: print(f"[stackprobe runtime] {m}", file=sys.stderr, flush=True))
    rt = run_suite([n for n in names if n not in skips], [ws], config, workload=workload, gpus=gpus,
                   label=getattr(args, "label", "") or "", target_arch=report.target_arch, progress=progress)
    from ..verdict import SKIPPED, Verdict
    for v in rt["runs"][-1]["verdicts"]:
        report.add(Verdict.from_json(v))
    for name, (gate, why) in skips.items():
        report.add(Verdict(name, SKIPPED, tier="runtime", gate=gate, cause=f"not run: {why}",
                           measurements={"world_size": ws}))
    json_path = getattr(args, "json", None)
    out = Path(json_path).with_suffix("").as_posix() + "-runtime" if json_path and json_path != "-" else "stackprobe-runtime"
    paths = write(rt, out)
    report.options["runtime_report"] = {k: str(p) for k, p in paths.items()}
    from ..engines import DEFAULT
    from .dispatch import dispatch_plans
    for eng, eng_out in dispatch_plans([e.get("name") for e in report.engines] or [DEFAULT], out):
        report.options[f"{eng.name}_dispatch"] = run_engine_dispatch(report, args, ws, eng_out, progress,
                                                                     engine=eng.name)
    return rt


def run_engine_dispatch(report, args, ws: int, out: str, progress, engine: str = "sglang") -> dict | str:
    """The runtime tier's dispatch probe (:mod:`.dispatch`) for ``engine`` (each engine the report answered for
    that has a runtime record: :func:`stackprobe.runtime.dispatch.dispatch_plans`) with the user's ``--server-args`` / ``--env`` (the ones the static answer took; the cluster
    job passes both) at world size ``ws``; its verdicts go into ``report`` with the host they were measured on (a
    host that is not the target's reads "measured here": C20), ``dispatch.json`` / ``dispatch.md`` into ``out``.
    Returns what ``options.<engine>_dispatch`` records, or why it did not run (world size 1: the engine returns
    the input unchanged; the engine not importable)."""
    import importlib.util

    from ..verdict import Verdict
    from .dispatch import engine_of, parse_env, run_dispatch, write
    title = engine_of(engine).title
    if ws < 2:
        return f"not run: world size 1 ({title}'s all_reduce returns its input unchanged: no path to attribute)"
    if importlib.util.find_spec(engine) is None:
        return f"not run: {engine} is not importable here"
    try:
        res = run_dispatch(getattr(args, "server_args", "") or "", parse_env(getattr(args, "env", None) or []), ws,
                           target={"compute_capability": report.target_arch,
                                   "topology": report.options.get("topology"),
                                   "world_size": report.options.get("world_size")}, progress=progress,
                           engine=engine)
    except ValueError as exc:
        return f"not run: {exc}"
    for v in res["verdicts"]:
        report.add(Verdict.from_json(v))
    paths = write(res, out)
    return {"status": res["run"]["status"], "server_args": res["plan"]["server_args"],
            "measured_here": res["target_note"]["note"], **{k: str(p) for k, p in paths.items()}}
