"""The plan as text: the ``--dry-run`` listing (:func:`render_plan`) and a compact per-node summary for records
(:func:`plan_summary`). No Docker; a source node's cost lines may read its source tree or cached archive
(:func:`cudastack.costs.cost_lines`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cudastack import costs, rules

if TYPE_CHECKING:                  # cudastack.plan imports this module
    from cudastack.plan import BuildPlan


def render_plan(plan: BuildPlan, cached: dict[str, bool] | None = None, *, state_dir: str = ".stack",
                export: set[str] | frozenset = frozenset(), remote: dict[str, str | None] | None = None,
                cache_prefix: str = "") -> str:
    """The ``--dry-run`` text of ``plan`` (a :class:`cudastack.plan.BuildPlan`): header (toolchain, base, archs,
    builder, memory rule), then each node with its hash, its state (``cached here``, ``in the registry cache``
    with the digest ``remote`` gives for it, ``to export``, ``to build``; ``cached`` None: unknown, no daemon
    asked), tag, parents, build args and every knob with its value, source and why. ``remote``: {node: digest or
    None} read from the node cache at ``cache_prefix``. Pure; returns the text."""
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
        lines.append(f"    hash    {n.hash}")
        lines.append(f"    tag     {n.tag}")
        lines.append(f"    needs   {', '.join(n.parents) or '-'}")
        lines.append(f"    file    {n.dockerfile}")
        if n.memory_gib_per_job:
            lines.append(f"    memory  {n.memory_gib_per_job:g} GiB per compile job (recipe)")
        for k, v in n.build_args.items():
            if k in ("BUILD_ENV",):
                continue
            lines.append(f"    arg     {k}={v if v else '(filled at build time)' if k == 'WHEEL_NAMES' else v}")
        for knob in n.knobs:
            why = f"  -- {knob.why}" if knob.why else ""
            lines.append(f"    knob    {knob.name}={knob.value}  [{knob.source}]{why}")
        for note in n.notes:
            lines.append(f"    note    {note}")
        if n.name not in export and not remote.get(n.name):
            lines += costs.cost_lines(n, res, state_dir)     # source nodes: arch flags, units, jobs, time
    lines.append("")
    if cached is not None:
        here = sum(1 for n in plan.nodes if cached.get(n.name))
        pulls = sum(1 for n in plan.nodes if not cached.get(n.name) and remote.get(n.name))
        lines.append(f"{here} of {len(plan.nodes)} nodes cached"
                     + (f" here, {pulls} in the registry cache" if cache_prefix else "")
                     + f"; about {todo:g} GiB of disk needed for the rest.")
    else:
        lines.append("Cached state unknown (no Docker daemon asked).")
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def plan_summary(plan: BuildPlan) -> list[dict]:
    """One dict per node (name, kind, hash, tag, parents): for records and tests."""
    return [{"name": n.name, "kind": n.kind, "hash": n.hash, "tag": n.tag, "parents": list(n.parents)}
            for n in plan.nodes]
