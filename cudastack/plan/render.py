"""The plan as text: the ``--dry-run`` listing (:func:`render_plan`) and a compact per-node summary for records
(:func:`plan_summary`). No Docker; a source node's cost lines may read its source tree or cached archive
(:func:`cudastack.plan.costs.cost_lines`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cudastack.plan import cache_estimates
from cudastack.plan import costs
from cudastack.plan import rules

if TYPE_CHECKING:                  # cudastack.plan.planner imports this module
    from cudastack.plan.planner import BuildPlan


ARG_LINES = 3       # a build arg longer than this many lines shows its first lines and a count


def _arg_text(name: str, value: str) -> str:
    """A build arg as the dry run shows it: whole when it has at most :data:`ARG_LINES` lines; else its first
    :data:`ARG_LINES` lines and how many more (a locked closure of hundreds of ``--hash`` pins; its full text is
    in the lockfile and goes into the node hash whole)."""
    if not value:
        return "(filled at build time)" if name == "WHEEL_NAMES" else value
    rows = value.splitlines()
    if len(rows) <= ARG_LINES:
        return value
    return "\n".join(rows[:ARG_LINES]) + f"\n            ... {len(rows) - ARG_LINES} more lines (the whole text is hashed)"


def render_plan(plan: BuildPlan, cached: dict[str, bool] | None = None, *, state_dir: str = ".stack",  # noqa: C901, PLR0912, PLR0915 - reason: one text block per node field, in the dry run's reading order
                export: set[str] | frozenset = frozenset(), remote: dict[str, str | None] | None = None,
                cache_prefix: str = "", basis: cache_estimates.Basis | None = None) -> str:
    """The ``--dry-run`` text of ``plan`` (a :class:`cudastack.plan.planner.BuildPlan`): header (toolchain, base, archs,
    builder, memory rule), then each node with its hash, its state (``cached here``, ``in the registry cache``
    with the digest ``remote`` gives for it, ``to export``, ``to build``; ``cached`` None: unknown, no daemon
    asked), tag, parents, build args and every knob with its value, source and why. ``remote``: {node: digest or
    None} read from the node cache at ``cache_prefix``. ``basis``: what the time each way rests on (past builds,
    manifest sizes, pull rate: :mod:`cudastack.plan.cache_estimates`); with it and a known state, a node to build or to
    pull gets ``expect`` lines and the text a closing "Expected time" line. Pure; returns the text."""
    lines = []
    res = plan.resources
    base_desc = plan.base_image
    if plan.base_kind == "pip":
        base_args = plan.nodes[0].build_args
        base_desc = f"{plan.base_image} (mmdebstrap {plan.os_suite}) + {base_args.get('CUDA_PIP_SPECS', '')}"
    lines.append(f"Plan for CUDA {plan.toolchain} (toolkit {plan.cuda_version}), base '{plan.base_kind}': {base_desc}")
    lines.append(f"Target archs: {', '.join(plan.target_archs)}   recipes: {plan.recipes_dir}")
    if res:
        lines.append(f"Builder: {res.cores} cores, {res.mem_gib:.1f} GiB usable memory ({res.origin})")
    lines.append(f"Memory rule (C8): jobs = max(1, min(cores, floor({rules.HEADROOM:g} x memory / recipe's GiB per "
                 "compile job))); threads = max(1, min(recipe's nvcc threads, cores // jobs)); "
                 "--max-jobs / --nvcc-threads override (source 'cli').")
    lines.append(f"Wheelhouse: {state_dir}/{plan.wheelhouse}")
    if plan.skipped:
        lines.append(f"Skipped by --skip: {', '.join(plan.skipped)}")
    for name, why in getattr(plan, "unavailable", {}).items():
        lines.append(f"Not built for CUDA {plan.toolchain}: {name}: {why}")
    for line in getattr(plan, "stacks", []):
        lines.append(f"Engine stacks: {line}")
    if cache_prefix:
        lines.append(f"Node cache: {cache_prefix}")
    remote = remote or {}
    todo = 0.0
    built: list = []
    pulled: list = []
    seen: set = set()
    pulled_bytes = 0
    for i, n in enumerate(plan.nodes, 1):
        state = "unknown" if cached is None else ("cached here" if cached.get(n.name) else "to build")
        if cached is not None and not cached.get(n.name) and remote.get(n.name):
            state = f"in the registry cache ({remote[n.name]}: the run pulls it)"
            todo += n.est_disk_gib
        elif cached is not None and not cached.get(n.name) and n.name in export:
            state = "to export (its image exists: the run exports its wheels again from the build cache, no compile)"
        elif cached is not None and not cached.get(n.name):
            todo += n.est_disk_gib
        method = f" ({n.method})" if n.method else ""
        lines.append("")
        lines.append(f"[{i}] {n.name}  kind {n.kind}{method}  {state}")
        cost, unit_s = costs.cost_estimate(n, res, state_dir) if n.name not in export else ([], None)
        if basis is not None and cached is not None and not cached.get(n.name) and n.name not in export:
            b_s, b_text = cache_estimates.build_expectation(n, basis.history, unit_s, basis.measured.get(n.name))
            if remote.get(n.name):
                p_s, nbytes, p_text = cache_estimates.pull_expectation(basis.blobs.get(n.name), seen, basis.rate)
                pulled.append((n.name, p_s))
                pulled_bytes += nbytes
                lines += [f"    expect  pull: {p_text}", f"    expect  build instead: {b_text}"]
            else:
                built.append((n.name, b_s))
                lines.append(f"    expect  build: {b_text}")
        lines.append(f"    hash    {n.hash}")
        lines.append(f"    tag     {n.tag}")
        lines.append(f"    needs   {', '.join(n.parents) or '-'}")
        lines.append(f"    file    {n.dockerfile}")
        if n.memory_gib_per_job:
            lines.append(f"    memory  {n.memory_gib_per_job:g} GiB per compile job (recipe)")
        for k, v in n.build_args.items():
            if k in ("BUILD_ENV",):
                continue
            lines.append(f"    arg     {k}={_arg_text(k, v)}")
        for knob in n.knobs:
            why = f"  -- {knob.why}" if knob.why else ""
            lines.append(f"    knob    {knob.name}={knob.value}  [{knob.source}]{why}")
        for note in n.notes:
            lines.append(f"    note    {note}")
        if not remote.get(n.name):
            lines += cost                                    # source nodes: arch flags, units, jobs, time
    lines.append("")
    if cached is not None:
        here = sum(1 for n in plan.nodes if cached.get(n.name))
        pulls = sum(1 for n in plan.nodes if not cached.get(n.name) and remote.get(n.name))
        lines.append(f"{here} of {len(plan.nodes)} nodes cached"
                     + (f" here, {pulls} in the registry cache" if cache_prefix else "")
                     + f"; about {todo:g} GiB of disk needed for the rest.")
        if basis is not None:
            lines.append(cache_estimates.summary(built, pulled, pulled_bytes))
    else:
        lines.append("Cached state unknown (no Docker daemon asked).")
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def plan_summary(plan: BuildPlan) -> list[dict]:
    """One dict per node (name, kind, hash, tag, parents): for records and tests."""
    return [{"name": n.name, "kind": n.kind, "hash": n.hash, "tag": n.tag, "parents": list(n.parents)}
            for n in plan.nodes]
