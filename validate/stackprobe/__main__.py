"""Command line: ``python -m stackprobe [--arch 12.0] [--json PATH] [--markdown PATH]`` (``--target-arch``,
the old spelling of ``--arch``, is still accepted with a note).

Other forms::

    python -m stackprobe --arch 12.0 --jit-compile                 # also compile FlashInfer's fusion module
    python -m stackprobe --compare before.json after.json          # what changed per backend, and why
    python -m stackprobe --runtime ...                              # add the runtime tier (GPU host)
    python -m stackprobe --engine vllm                              # vLLM's answers (sglang, vllm, auto: both)

Exit codes (the README's table): 0 report written; 2 bad input (unknown target arch, unreadable report, bad
flag); 10 with ``--strict``: the environment health stage found an error (report written); 9 validation could not run: ``--runtime`` was asked for but the runtime tier cannot run here (no GPU
visible, or the tier's code is missing). The static report is still written (``--json``/``--markdown``), with
``options.runtime`` saying why the runtime tier did not run.
The runtime tier plugs in through ``stackprobe.runtime.run_runtime(report, args)`` (it adds verdicts
with ``tier="runtime"`` to the Report :func:`stackprobe.static.run_static` made).
"""
from __future__ import annotations

import argparse
import json
import sys

from .report import Report, ReportError, comparison_markdown
from .static import KNOWN_COMPUTE_CAPABILITIES, TargetArchError, run_static

EXIT_OK, EXIT_USAGE, EXIT_NO_RUNTIME = 0, 2, 9


class _OldSpelling(argparse.Action):
    """``--target-arch``: the old spelling of ``--arch``, still accepted (images built before the rename run
    their own copy of this suite with it); says so on stderr unless ``--quiet`` comes anywhere."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        if "--quiet" not in sys.argv[1:] and not getattr(namespace, "quiet", False):
            print("stackprobe: note: --target-arch is the old spelling of --arch (as every invoke task spells it); "
                  "it still works.", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stackprobe", description=(
        "Which allreduce backends can work in this environment for a target GPU architecture, which cannot, "
        "why, and what would lift each gate. The static tier needs no GPU."))
    target = p.add_argument_group("what the verdicts are for (the target, as every invoke task spells it)")
    output = p.add_argument_group("reports")
    tiers = p.add_argument_group("tiers and comparisons")
    readers = p.add_argument_group("readers and limits")
    target.add_argument("--arch", dest="target_arch", default="12.0", metavar="CC",
                        help=f"target compute capability (default 12.0); one of {', '.join(KNOWN_COMPUTE_CAPABILITIES)} "
                        "(the same spelling as every invoke task's --arch)")
    target.add_argument("--target-arch", dest="target_arch", action=_OldSpelling, help=argparse.SUPPRESS)
    output.add_argument("--json", metavar="PATH", help="write the JSON report here ('-' for stdout)")
    output.add_argument("--markdown", metavar="PATH", help="write the Markdown matrix here ('-' for stdout)")
    output.add_argument("--label", default="", help="a name for this environment in reports and comparisons")
    tiers.add_argument("--jit-compile", action="store_true",
                       help="compile FlashInfer's allreduce-fusion module for the target (minutes; cached by content)")
    readers.add_argument("--cache-dir", help="cache for compile results (default $STACKPROBE_CACHE or ~/.cache/stackprobe)")
    readers.add_argument("--coverage-reader", choices=("auto", "elf", "cuobjdump"), default="auto",
                         help="fatbin reader: pyelftools (keeps the f suffix) or NVIDIA's cuobjdump")
    readers.add_argument("--scan-dist", action="append", default=[], metavar="DIST",
                         help="also report arch coverage of this installed distribution (repeatable)")
    target.add_argument("--world-size", type=int, default=8, help="tensor-parallel size the verdicts are for (default 8)")
    target.add_argument("--topology", choices=("auto", "pcie", "nvlink"), default="auto",
                        help="GPU interconnect of the target host (auto: detected with GPUs, else PCIe assumed)")
    target.add_argument("--backend", action="append", dest="backends", metavar="NAME", help="only this backend (repeatable)")
    readers.add_argument("--timeout", type=float, default=180.0, help="seconds per child interpreter (imports, gates)")
    tiers.add_argument("--runtime", action="store_true", help="also run the runtime tier (GPUs needed)")
    tiers.add_argument("--merge-runtime", action="append", default=[], metavar="JSON",
                       help="add the runtime verdicts of this file (a runtime or engine-runner JSON with 'verdicts') to the "
                        "report; each keeps the host it was measured on and replaces the target's verdict only when that "
                        "host matches the target (repeatable)")
    tiers.add_argument("--compare", nargs="+", metavar="REPORT", help="compare JSON reports (first = before) and exit")
    target.add_argument("--server-args", default="", metavar="FLAGS",
                        help="the SGLang server flags the verdicts are for, one shell-quoted string (default: none), "
                        "checked against the installed SGLang's own flags")
    target.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the SGLang server the verdicts are for (repeatable)")
    target.add_argument("--engine", default="auto", metavar="ENGINE",
                        help="the serving engine whose answers the report gives: sglang, vllm or auto (default: whichever "
                        "is installed, both when both are; SGLang's answers head the report then)")
    output.add_argument("--quiet", action="store_true", help="no progress on stderr")
    output.add_argument("--strict", action="store_true",
                        help="exit 10 (after writing the report) when the environment health stage found an error (for CI)")
    return p


def _emit(text: str, dest: str) -> None:
    if dest == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        from .atomic import write_atomic
        write_atomic(dest, text)


def merge_runtime(report: Report, path: str) -> int:
    """Add the runtime verdicts in ``path`` (``{"verdicts": [...]}`` or ``{"runs": [{"verdicts": [...]}]}``)
    to ``report``; returns how many. Raises ValueError for a file without verdicts."""
    from .verdict import Verdict

    d = json.loads(open(path).read())
    vs = d.get("verdicts") or ((d.get("runs") or [{}])[-1].get("verdicts") if isinstance(d, dict) else None)
    if not vs:
        raise ValueError("no 'verdicts' in it")
    n = 0
    for v in vs:
        v = Verdict.from_json(v)
        v.tier = "runtime"
        report.add(v)
        n += 1
    return n


def _glue_server_args(argv: list[str]) -> list[str]:
    """``--server-args "--enable-symm-mem"`` as ``--server-args=--enable-symm-mem``: argparse would read a value that
    starts with ``--`` as a flag of its own."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--server-args" and i + 1 < len(argv):
            out.append(f"--server-args={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - reason: the CLI's modes and their exit codes, decided in one place
    args = build_parser().parse_args(_glue_server_args(list(sys.argv[1:] if argv is None else argv)))
    if args.compare:
        try:
            reports = [Report.load(p) for p in args.compare]
        except (ReportError, OSError) as e:
            print(f"stackprobe: cannot compare: {e}", file=sys.stderr)
            return EXIT_USAGE
        labels = [r.label or p for r, p in zip(reports, args.compare)]
        sys.stdout.write(comparison_markdown(reports, labels))
        return EXIT_OK
    if args.world_size < 1:
        print("stackprobe: --world-size must be at least 1 (the number of GPUs one tensor-parallel group spans).", file=sys.stderr)
        return EXIT_USAGE
    from .engines import EngineChoiceError, select
    from .engines.sglang import engine as sglang_engine
    from .engines.sglang.flags import ConfigError
    try:
        engines = select(args.engine)
        configs = {e.name: e.parse_config(args.server_args, args.env) for e in engines}
    except (EngineChoiceError, ConfigError, sglang_engine.GateNotFound) as e:
        print(f"stackprobe: {e}", file=sys.stderr)
        return EXIT_USAGE
    config = configs[engines[0].name]
    try:
        report = run_static(args.target_arch, jit_compile=args.jit_compile, cache_dir=args.cache_dir,
                            coverage_reader=args.coverage_reader, world_size=args.world_size, topology=args.topology,
                            backends=args.backends, label=args.label, timeout=args.timeout,
                            scan_dists=args.scan_dist, quiet=args.quiet, server_config=config, engines=engines,
                            engine_configs=configs)
    except TargetArchError as e:
        print(f"stackprobe: {e}", file=sys.stderr)
        return EXIT_USAGE
    for path in args.merge_runtime:
        try:
            merge_runtime(report, path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"stackprobe: cannot merge runtime verdicts from {path}: {e}", file=sys.stderr)
            return EXIT_USAGE
    rc = EXIT_OK
    if args.runtime:
        try:
            from .runtime import run_runtime  # provided by the runtime tier
        except ImportError as e:
            print(f"stackprobe: --runtime asked for, but the runtime tier is not available here ({e}). "
                  "The static report is written; run without --runtime for the static tier only.", file=sys.stderr)
            report.options["runtime"] = f"not run: the runtime tier is not available here ({e})"
            rc = EXIT_NO_RUNTIME
        else:
            try:
                run_runtime(report, args)
            except SystemExit as e:   # the tier refused to start (no GPU visible); it printed why
                if e.code in (0, None):
                    raise
                report.options["runtime"] = "not run: no NVIDIA GPU visible on this host"
                print("stackprobe: the static report is written; the runtime tier did not run.", file=sys.stderr)
                rc = EXIT_NO_RUNTIME
    if args.json:
        _emit(json.dumps(report.to_json(), indent=2, default=str) + "\n", args.json)
    if args.markdown:
        _emit(report.to_markdown(), args.markdown)
    if not args.json and not args.markdown:
        sys.stdout.write(report.to_markdown() + "\n")
    return strict_exit(report, args.strict, rc)


def strict_exit(report: Report, strict: bool, rc: int) -> int:
    """``--strict``: :data:`stackprobe.health_report.EXIT_UNHEALTHY` when the environment health stage found an
    error (the errors are printed on stderr), unless ``rc`` already says something worse."""
    from .health_report import EXIT_UNHEALTHY
    from .health_stage import errors

    errs = errors(report.environment.get("health"))
    if not strict or not errs or rc != EXIT_OK:
        return rc
    print(f"stackprobe: --strict: the environment health stage found {len(errs)} error(s); the report is written. "
          "First: " + errs[0]["message"], file=sys.stderr)
    return EXIT_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
