"""Benchmark (prints figures; not a test): what the content-hash cache saves, on the real engine.

For each toolchain asked for (default: 13.1 and 12.8, each with its default base):

1. **No-op rebuild** of the plan: ``run_build`` when every node is cached (it must issue no docker build),
   timed over ``--repeat`` runs (median).
2. **Fully cached plain ``docker build``** of the same Dockerfiles with the same build args, contexts and
   secrets, one after another, as a user without the planner would run them (every step a BuildKit cache
   hit), timed the same way. The ratio plain / no-op is what skipping by tag buys.
3. **Rebuild after one component recipe changes**: for each non-base component, a copy of the recipes with
   one knob added to that component's entry is planned and checked against the engine and the wheelhouse;
   the nodes that would build are counted (expected: that component and the runtime image).

A toolchain whose plan is not fully built (e.g. the nvidia base cannot be pulled, or flash-attn is still
compiling) is reported with its uncached nodes and measured for steps 1-2 on nothing; build it first with
``invoke build`` (the same flags).

Usage: ``python benchmarks/build_cache.py [--cuda 13.1 --cuda 12.8] [--base pip] [--skip flash-attn]
[--state-dir .stack] [--repeat 3] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudastack.build.executor import Wheelhouse, _make_context, _abs_dockerfile, cached_map, run_build  # noqa: E402
from cudastack.build.engine import Engine, resolve_ca_bundle  # noqa: E402
from cudastack.plan.planner import make_plan  # noqa: E402
from cudastack.recipes.load import DEFAULT_RECIPES_DIR  # noqa: E402


def plain_builds(engine: Engine, plan, state: Path, bundle: str | None) -> tuple[float, int]:
    """Run every node's docker build with no planner in front (no tag; BuildKit cache only). Returns
    (seconds, builds)."""
    wh = Wheelhouse(state / plan.wheelhouse)
    ctx_root = Path(tempfile.mkdtemp(prefix="bench-ctx-"))
    secrets = {"cabundle": bundle} if bundle else {}
    t0 = time.monotonic()
    n = 0
    try:
        for node in plan.nodes:
            ctx, extra = _make_context(ctx_root, node, wh, plan)
            args = {**node.build_args, **extra}
            if node.kind != "runtime":
                args.pop("WHEEL_NAMES", None)
            engine.build(name=f"plain {node.name}", log_path=ctx_root / "plain.log", say=lambda s: None,
                         context=str(ctx), dockerfile=str(_abs_dockerfile(node)), build_args=args, secrets=secrets,
                         target="builder" if node.kind == "wheels" else None)
            n += 1
    finally:
        shutil.rmtree(ctx_root, ignore_errors=True)
    return time.monotonic() - t0, n


def rebuild_counts(engine: Engine, state: Path, cuda: str, base: str | None, skip: list[str]) -> list[dict]:
    out = []
    base_plan = make_plan(DEFAULT_RECIPES_DIR, cuda, base=base, skip=skip, resources=engine.resources())
    for node in base_plan.nodes:
        if node.kind.startswith("base"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rdir = Path(tmp) / "recipes"
            shutil.copytree(DEFAULT_RECIPES_DIR, rdir)
            comp = next(p for p in rdir.glob("*.yaml")
                        if p.name != "toolchains.yaml" and (yaml.safe_load(p.read_text()).get("node", p.stem) == node.name))
            data = yaml.safe_load(comp.read_text())
            entry = data["toolchains"][cuda]
            entry.setdefault("knobs", {})["CUDASTACK_BENCH_CHANGE"] = "1"
            comp.write_text(yaml.safe_dump(data, sort_keys=False))
            changed = make_plan(rdir, cuda, base=base, skip=skip, resources=base_plan.resources)
            cached = cached_map(engine, Wheelhouse(state / changed.wheelhouse), changed)
            rebuild = [n.name for n in changed.nodes if n.hash != base_plan.node(n.name).hash]
            would_build = [n.name for n in changed.nodes if not cached[n.name]]
            out.append({"changed": comp.name, "rebuild": rebuild, "count": len(rebuild), "would_build_now": would_build})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", action="append", help="toolchain(s) (repeatable; default 13.1 and 12.8)")
    ap.add_argument("--base", help="pip | nvidia (default: each toolchain's default)")
    ap.add_argument("--skip", action="append", default=[], help="components to leave out (repeatable)")
    ap.add_argument("--state-dir", default=str(ROOT / ".stack"))
    ap.add_argument("--ca-bundle")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--build", action="store_true",
                    help="first build whatever of each plan is not cached (so the no-op figures can be taken)")
    a = ap.parse_args(argv)
    engine = Engine.connect()
    bundle = resolve_ca_bundle(a.ca_bundle)
    state = Path(a.state_dir).resolve()
    figures = []
    for cuda in a.cuda or ["13.1", "12.8"]:
        plan = make_plan(DEFAULT_RECIPES_DIR, cuda, base=a.base, skip=a.skip, resources=engine.resources())
        cached = cached_map(engine, Wheelhouse(state / plan.wheelhouse), plan)
        if a.build and not all(cached.values()):
            rec = run_build(plan, state_dir=state, engine=engine, ca_bundle=bundle, say=lambda s: None)
            print(f"   built first: {', '.join(n['name'] for n in rec['nodes'] if n['status'] == 'built')} "
                  f"in {rec['duration_s']:.0f} s")
            cached = cached_map(engine, Wheelhouse(state / plan.wheelhouse), plan)
        row = {"cuda": cuda, "base": plan.base_kind, "nodes": len(plan.nodes),
               "uncached": [n for n, c in cached.items() if not c]}
        print(f"== CUDA {cuda}, base {plan.base_kind}, {len(plan.nodes)} nodes"
              + (f" (skipped: {', '.join(plan.skipped)})" if plan.skipped else ""))
        if row["uncached"]:
            print(f"   not fully built: {', '.join(row['uncached'])} uncached -> no-op timing skipped "
                  f"(run `invoke build --cuda {cuda}` with the same flags first)")
        else:
            noop, builds = [], 0
            for _ in range(a.repeat):
                t0 = time.monotonic()
                rec = run_build(plan, state_dir=state, engine=engine, say=lambda s: None)
                noop.append(time.monotonic() - t0)
                builds += rec["docker_builds"]
            plain = [plain_builds(engine, plan, state, bundle)[0] for _ in range(a.repeat)]
            row.update(noop_s=round(statistics.median(noop), 3), noop_docker_builds=builds,
                       plain_cached_s=round(statistics.median(plain), 2),
                       ratio=round(statistics.median(plain) / max(statistics.median(noop), 1e-6), 1))
            print(f"   no-op rebuild (planner, skip by tag): {row['noop_s']:.3f} s median of {a.repeat}, "
                  f"{builds} docker builds issued")
            print(f"   plain docker build, fully cached:     {row['plain_cached_s']:.2f} s median of {a.repeat} "
                  f"({len(plan.nodes)} builds each)")
            print(f"   ratio plain / no-op:                  {row['ratio']}x")
        row["recipe_change"] = rebuild_counts(engine, state, cuda, a.base, a.skip)
        for rc in row["recipe_change"]:
            extra = sorted(set(rc["would_build_now"]) - set(rc["rebuild"]))
            print(f"   change {rc['changed']:<16} -> {rc['count']} nodes get a new hash and rebuild: "
                  f"{', '.join(rc['rebuild'])}" + (f" (uncached anyway: {', '.join(extra)})" if extra else ""))
        figures.append(row)
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
