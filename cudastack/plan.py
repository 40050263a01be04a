"""Recipes -> Plan: the build DAG of one toolchain, each node named by a content hash of its inputs.

Pure functions (no Docker): :func:`make_plan` builds the DAG from the recipes' ``kind`` and ``needs``,
resolves every knob with its source (recipe, toolchain, cli, memory-rule, default), fills the build args
of the Dockerfile contract (:mod:`cudastack.model`) and hashes each node; :func:`render_plan` prints it
(``--dry-run``). The executor (:mod:`cudastack.build`) only consumes the Plan.

Hash: sha256 over the canonical JSON (sorted keys, no spaces) of the node's inputs: the component's
recipe fields for this toolchain, the toolchain and base choice, the output-affecting knobs, the build
args, the Dockerfile's text, a digest of any local files sent in the build context (a ``path`` source,
the validation suite for the runtime image) and the parents' hashes. Parallelism knobs (MAX_JOBS,
NVCC_THREADS, ...) are shown and passed but not hashed: they change how fast a node builds, not what it
contains, so the same plan on a builder with other free memory stays cached. Recipe comments,
``description`` and ``est_disk_gib`` are not hashed either.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cudastack.credentials import scrub, split_userinfo
from cudastack.errors import UsageError
from cudastack.model import Knob, Node, Plan
from cudastack.recipes import Component, RecipeSet, Toolchain, load_recipes
from cudastack import costs, rules
from cudastack.sources import cmake_args_knob
from cudastack.rules import Resources

PROJECT_ROOT = Path(__file__).resolve().parents[1]
HASH_FORMAT = 1
DEFAULT_ARCH = "12.0"
DEFAULT_PREFIX = "cudastack"
STACKPROBE_DIR = PROJECT_ROOT / "validate" / "stackprobe"
# build-context folders that travel with a node but are not part of its content hash (see plan_build)
UNHASHED_CONTEXT = ("stackprobe",)
_SKIP_PARTS = {"__pycache__", ".pytest_cache", "build", "dist", ".git"}


@dataclass
class PlannedNode(Node):
    """A :class:`cudastack.model.Node` plus what the executor needs and the hash must not see:
    ``context``: build-context subfolder -> host path (``src`` for a local source, ``stackprobe``);
    ``env_knobs``: knobs this node contributes to the runtime image's environment;
    ``notes``: lines for the dry-run (arch mapping notes, C10 coverage)."""

    context: dict[str, str] = field(default_factory=dict)
    env_knobs: list[Knob] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parallel_knobs: list[str] = field(default_factory=list)
    wheel_packages: list[str] = field(default_factory=list)
    sdist: dict = field(default_factory=dict)   # {"package", "version", "index", "patches"} to fetch + patch
    # a source the executor fetches or copies, then patches, into the context's src/ (cudastack.sources):
    # {"kind": "url" | "git" | "path", "url", "sha256", "commit", "ref", "path", "subdir", "patches"}
    fetch: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)     # source nodes: what cudastack.costs needs for the dry run
    index_secret: str = ""   # the recipe's index URL when it carries a login: BuildKit secret 'pipindex', never an arg


@dataclass
class BuildPlan(Plan):
    """A :class:`cudastack.model.Plan` plus the builder resources and rule the knobs came from."""

    resources: Resources | None = None
    recipes_dir: str = ""
    prefix: str = DEFAULT_PREFIX
    skipped: list[str] = field(default_factory=list)
    base_image: str = ""           # OS image (pip base) or NVIDIA image (nvidia base)
    os_suite: str = ""
    locked: bool = False           # set by cudastack.lock.apply_lock: locked build args, hashes and tags


# ------------------------------------------------------------------------------------ host facts
def _cgroup_value(*paths: str) -> str | None:
    for p in paths:
        try:
            return Path(p).read_text().strip()
        except OSError:
            continue
    return None


def host_resources() -> Resources:
    """This host's usable cores (affinity and cgroup CPU quota) and memory (the smaller of MemTotal and the
    cgroup limit), from /proc and /sys/fs/cgroup. Units: cores, GiB. MemAvailable is not an input: it moves
    with the load (a running compile), and a dry run must print the MAX_JOBS the build will use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_value("/sys/fs/cgroup/cpu.max")
    if quota and not quota.startswith("max"):
        q, period = quota.split()[:2]
        cores = max(1, min(cores, int(int(q) // int(period))))
    mem = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            mem[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    total = mem.get("MemTotal", 0)
    limit = _cgroup_value("/sys/fs/cgroup/memory.max")
    candidates = [total] if total else []
    if limit and limit.isdigit():
        candidates.append(int(limit))
    gib = min(candidates) / 2**30 if candidates else 1.0
    cg = f", cgroup limit {int(limit) / 2**30:.1f} GiB" if limit and limit.isdigit() else ""
    return Resources(cores, round(gib, 1), f"host: {cores} cores, MemTotal {total / 2**30:.1f} GiB{cg}")


# ---------------------------------------------------------------------------------------- hashing
def canonical_json(obj) -> str:
    """The canonical form that is hashed: JSON, sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(inputs: dict) -> str:
    """sha256 hex of :func:`canonical_json` of ``inputs``."""
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def dir_digest(path: str | Path) -> str:
    """sha256 over every file under ``path`` (relative path, mode bit x, content), in sorted order,
    skipping caches (``__pycache__``, build outputs, ``.git``). Used for local build-context folders."""
    root = Path(path)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in _SKIP_PARTS or part.endswith(".egg-info") for part in rel.parts) or p.suffix == ".pyc":
            continue
        if p.is_file() and not p.is_symlink():
            h.update(f"{rel.as_posix()}\0{os.access(p, os.X_OK):d}\0".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
        elif p.is_symlink():
            h.update(f"{rel.as_posix()}\0->{os.readlink(p)}\0".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------- planning
def _topo(components: dict[str, Component], tc_name: str) -> list[Component]:
    """Parents before children; among the nodes ready at each step, wheel/image nodes before source
    builds (a slow compile such as flash-attn goes last, so a failure or a long build there leaves every
    other node built), then file order."""
    order = list(components)
    pending = dict.fromkeys(order)
    done: list[str] = []
    while pending:
        ready = [n for n in pending if all(p in done for p in components[n].needs)]
        ready.sort(key=lambda n: (components[n].kind == "runtime",
                                  components[n].toolchains[tc_name].method == "source", order.index(n)))
        done.append(ready[0])
        del pending[ready[0]]
    return [components[n] for n in done]


def _node_kind(c: Component, base_kind: str) -> str:
    return f"base-{base_kind}" if c.kind == "base" else c.kind


def _source_spec(c: Component, tc: Toolchain) -> tuple[list[str], dict[str, str]]:
    """PIP_SPECS words and build-context folders of a component's entry for ``tc``."""
    e = c.toolchains[tc.name]
    if e.method == "wheel":
        return list(e.packages), {}
    if e.url or (e.git and (e.patches or e.subdir or c.kind == "image")):
        return [], {"src": ""}      # the executor downloads / clones, checks and patches it into src/
    if e.path and (e.patches or e.subdir):
        return [], {"src": str(e.path)}   # hashed by content; copied and patched by the executor
    if e.sdist and e.patches:
        return [], {"src": ""}      # the executor fetches the sdist, unpacks and patches it into src/
    if e.sdist:
        return [f"{e.sdist['package']}=={e.sdist['version']}"], {}
    if e.git:
        name = c.stem
        return [f"{name} @ git+{e.git['url']}@{e.git['commit']}"], {}
    return [], {"src": str(e.path)}


def _fetch_spec(e) -> dict:
    """What the executor materialises into the context's src/ for a url, git or patched path source."""
    base = {"subdir": e.subdir, "patches": [dict(p) for p in e.patches]}
    if e.url:
        return {"kind": "url", **e.url, **base}
    if e.git:
        return {"kind": "git", **e.git, **base}
    if e.path and (e.patches or e.subdir):
        return {"kind": "path", "path": str(e.path), **base}
    return {}


def _build_env(knobs: list[Knob]) -> str:
    """``BUILD_ENV``: space separated ``K=V``, each value shell-quoted (the Dockerfiles run
    ``eval "export $BUILD_ENV"``), so values with spaces survive."""
    return " ".join(f"{k.name}={shlex.quote(k.value)}" for k in knobs)


def _arch_tag(archs) -> str:
    return "-".join(f"sm{a.number}{a.suffix}" for a in archs)


def _recipe_view(c: Component, tc: Toolchain) -> dict:
    view = {k: v for k, v in c.raw.items() if k not in ("description", "est_disk_gib", "parallelism", "toolchains")}
    entry = c.toolchains[tc.name]
    raw = {k: v for k, v in entry.raw.items()
           if not (k == "source" and entry.method == "wheel") and k not in ("unit_cost", "units_from")}
    # none of these changes the output
    view["toolchain_entry"] = scrub(raw)     # an index login is no input of the image; a wheel entry's unused
    #                                          source block is none either
    if c.parallelism and (entry.method == "source" or c.kind != "image"):
        # which knobs receive the job counts is part of what is built; the budget numbers are not (an image
        # node installing a wheel compiles nothing: its parallelism block is for its source build)
        view["parallelism_knobs"] = [list(c.parallelism.jobs_knobs), list(c.parallelism.threads_knobs)]
    return view


def resolve_skips(recipes: RecipeSet, skip: Iterable[str]) -> set[str]:
    """Node names to leave out for ``--skip`` values (node names or file stems). UsageError for an
    unknown component or one that cannot be left out (the base; a node another kept node builds FROM)."""
    out = set()
    for s in skip:
        c = recipes.component(s)
        if c.kind == "base":
            raise UsageError(f"Cannot skip '{s}': it is the base every other node builds on.")
        out.add(c.name)
    for c in recipes.components.values():
        if c.name in out:
            continue
        for n in c.needs:
            if n in out and not (c.kind == "runtime" and recipes.components[n].kind == "wheels"):
                raise UsageError(f"Cannot skip '{n}': '{c.name}' needs it. Skip '{c.name}' too "
                                 f"(--skip {n} --skip {c.name}) or keep {n}.")
    return out


def make_plan(
    recipes: RecipeSet | str | Path | None,
    cuda: str,
    *,
    archs: str | list[str] | None = None,
    base: str | None = None,
    skip: Iterable[str] = (),
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    resources: Resources | None = None,
    prefix: str = DEFAULT_PREFIX,
    images_dir: str | Path | None = None,
    stackprobe_dir: str | Path | None = None,
) -> BuildPlan:
    """Make the plan of toolchain ``cuda`` ("13.1") for target ``archs`` (default "12.0").

    ``base``: "pip" | "nvidia" (default: the toolchain's ``default_base``). ``skip``: components to
    leave out (the runtime node drops their wheels). ``max_jobs`` / ``nvcc_threads``: override the
    memory rule. ``resources``: the builder's cores and memory (default: this host). ``prefix``: image
    repository prefix of the tags. Everything is checked before anything is built: UsageError (unknown
    CUDA version, component, base), ArchError (C1-C3), RecipeError (bad recipes).
    """
    if not isinstance(recipes, RecipeSet):
        recipes = load_recipes(recipes)
    tc = recipes.toolchain(cuda)
    arch_from_cli = archs is not None
    target = rules.parse_target_archs(archs if archs is not None else DEFAULT_ARCH)
    rules.check_archs(recipes, tc, target)
    base_kind = base or tc.default_base
    if base_kind not in tc.bases:
        raise UsageError(f"Unknown base '{base_kind}' for toolchain {tc.name}: use one of {', '.join(tc.bases)}.")
    skipped = resolve_skips(recipes, skip)
    comps = [c for c in _topo(recipes.components, tc.name) if c.name not in skipped]
    sources = [c for c in comps if c.toolchains[tc.name].method == "source"]
    rules.check_base(tc, base_kind, sources)
    res = resources or host_resources()
    images = Path(images_dir) if images_dir else PROJECT_ROOT / "images"
    probe_dir = Path(stackprobe_dir) if stackprobe_dir else STACKPROBE_DIR
    bc = tc.bases[base_kind]
    arch_src = "cli" if arch_from_cli else "default"
    warnings: list[str] = []
    nodes: list[PlannedNode] = []
    by_name: dict[str, PlannedNode] = {}
    arch_dependent: dict[str, bool] = {}

    for c in comps:
        e = c.toolchains[tc.name]
        kind = _node_kind(c, base_kind)
        parents = [n for n in c.needs if n not in skipped]
        image_parent = next(p for p in parents if recipes.components[p].kind in ("base", "image")) if parents else ""
        parents = ([image_parent] + [p for p in parents if p != image_parent]) if image_parent else []
        knobs: list[Knob] = []
        env_knobs: list[Knob] = []
        notes: list[str] = []
        parallel: list[str] = []
        index_secret = ""
        args: dict[str, str] = {}
        context: dict[str, str] = {}
        specs: list[str] = []

        if c.kind == "base":
            if bc.kind == "pip":
                args = {"OS_IMAGE": bc.os_image, "CUDA_PIP_SPECS": " ".join(bc.pip_specs),
                        "CUDA_VERSION": tc.cuda_version, "CUDA_WHEEL_ROOT": bc.wheel_root}
            else:
                args = {"BASE_IMAGE": bc.image, "CUDA_VERSION": tc.cuda_version}
            for k, v in args.items():
                knobs.append(Knob(k, v, "toolchain", f"toolchains.yaml {tc.name} bases.{base_kind}"))
        else:
            specs, context = _source_spec(c, tc)
            builds = e.method == "source" or c.kind == "image"
            for k, v in c.knobs.items():
                if builds:
                    knobs.append(Knob(k, v, "recipe", c.file.name))
                else:
                    notes.append(f"{k}={v} applies only to a source build (this toolchain uses a {e.method})")
            if c.arch_knob:
                m = rules.map_archs(recipes, tc, c.arch_knob, target)
                if m.knob:
                    src = arch_src
                    if c.arch_knob.style == "suffixed" and any(not a.suffix for a in target):
                        src = "toolchain"
                    k = Knob(m.knob, m.value, src, m.note)
                    scope_env = c.arch_knob.scope == "env"
                    if scope_env:
                        env_knobs.append(k)
                    if not scope_env or e.method == "source":
                        knobs.append(k)
                    else:
                        notes.append(f"{m.knob}={m.value} goes into the runtime image's environment ({m.note})")
                else:
                    notes.append(f"arch list: {m.note} (case C10: no arch knob to set)")
                    if m.uncovered:
                        warnings.append(f"{c.name}: its build hard-codes its archs and none covers "
                                        f"{', '.join(m.uncovered)} on CUDA {tc.cuda_version}")
            for k, v in e.knobs.items():
                knobs = [kn for kn in knobs if kn.name != k] + [Knob(k, v, "recipe", f"{c.file.name} toolchains.{tc.name}")]
            if e.method == "source":
                assert c.parallelism is not None  # enforced by the loader
                pk = rules.memory_rule(c.parallelism, res, max_jobs, nvcc_threads)
                parallel = [k.name for k in pk]
                knobs = [kn for kn in knobs if kn.name not in parallel] + pk
                knobs, cm_parallel = cmake_args_knob(c, e, knobs, pk)
                parallel += cm_parallel
            build_env = _build_env(knobs)
            args["PARENT_IMAGE"] = by_name[image_parent].tag
            if e.index:
                # the login stays out of the build args (they persist in the image history): see credentials.py
                args["PIP_INDEX_URL"], has_login = split_userinfo(e.index)
                if has_login:
                    index_secret = e.index
            if c.kind == "image" and e.method == "source":
                args.update({"SOURCE_DIR": "src", "BUILD_ENV": build_env, "BUILD_DEPS": " ".join(e.build_deps)})
            elif c.kind == "image":
                args.update({"PIP_SPECS": " ".join(specs), "BUILD_ENV": build_env})
            elif c.kind == "wheels":
                args.update({"METHOD": e.method, "PIP_SPECS": " ".join(specs), "BUILD_ENV": build_env})
                if e.build_deps:
                    args["BUILD_DEPS"] = " ".join(e.build_deps)
                if "src" in context:
                    args["SOURCE_DIR"] = "src"   # the local folder (or patched sdist) in the build context
                if e.patches:
                    for pt in e.patches:
                        notes.append(f"patch {pt['file']}: '{pt['replace']}' -> '{pt['with']}'"
                                     + (f" ({pt['why']})" if pt.get("why") else ""))
            else:  # runtime
                args.update({"PIP_SPECS": " ".join(specs), "WHEEL_NAMES": ""})
                collected: dict[str, Knob] = {}
                for p in nodes:
                    for k in p.env_knobs:
                        collected[k.name] = k
                for k in env_knobs:
                    collected[k.name] = k
                env_knobs = list(collected.values())
                for k in env_knobs:
                    args[k.name] = k.value
                    if k not in knobs:
                        knobs.append(Knob(k.name, k.value, k.source, k.why + " (runtime environment)"))
                context["stackprobe"] = str(probe_dir)
                context["wheelhouse"] = ""   # filled by the executor from the wheel nodes

        # an image node built from source (torch) has its own Dockerfile, so the wheel one's hash stays
        dockerfile = images / (f"{kind}-source.Dockerfile" if (c.kind == "image" and e.method == "source")
                               else f"{kind}.Dockerfile")
        try:
            df_text = dockerfile.read_text()
        except OSError:
            df_text = ""
            warnings.append(f"{c.name}: {dockerfile} does not exist yet (the hash will change once it does)")
        hashed_args = dict(args)
        hashed_args.pop("WHEEL_NAMES", None)
        if "BUILD_ENV" in hashed_args:
            hashed_args["BUILD_ENV"] = _build_env([k for k in knobs if k.name not in parallel])
        if "PARENT_IMAGE" in hashed_args:
            hashed_args["PARENT_IMAGE"] = image_parent   # the parent's hash is hashed below
        # The validation suite's folder is copied into the runtime image (so `python -m stackprobe` works where
        # the checkout is absent, e.g. cluster jobs) but is not an input of the hash: a probe change leaves the
        # stack's tag, lock and push as they are. Reports name the suite that ran by its own digest
        # (stackprobe.report.suite_digest), and `invoke validate` mounts this checkout's suite by default.
        ctx_digest = {k: dir_digest(v) for k, v in context.items() if v and k not in UNHASHED_CONTEXT}
        inputs = {
            "format": HASH_FORMAT,
            "node": c.name,
            "kind": kind,
            "recipe": _recipe_view(c, tc),
            "toolchain": {"name": tc.name, "cuda_version": tc.cuda_version, "base": base_kind,
                          "base_choice": dataclasses.asdict(bc)},
            "knobs": {k.name: k.value for k in knobs if k.name not in parallel},
            "build_args": hashed_args,
            "dockerfile": df_text,
            "context": ctx_digest,
            "parents": {p: by_name[p].hash for p in parents},
        }
        h = content_hash(inputs)
        dep = any(k.name == c.arch_knob.knob for k in knobs) if c.arch_knob else False
        dep = dep or c.kind == "runtime" \
            or any(arch_dependent.get(p) for p in parents)
        arch_dependent[c.name] = dep
        repo = f"{prefix}/cu{tc.name}-{base_kind}{'-' + _arch_tag(target) if dep else ''}-{c.name}"
        method = "" if c.kind in ("base", "runtime") else e.method
        wheel_pkgs = [re.split(r"[\[=<>!~ ]", s)[0] for s in specs] if c.kind == "wheels" else []
        node = PlannedNode(
            name=c.name, kind=kind, dockerfile=str(dockerfile.relative_to(PROJECT_ROOT))
            if dockerfile.is_relative_to(PROJECT_ROOT) else str(dockerfile),
            parents=parents, build_args=args, knobs=knobs, hash=h, tag=f"{repo}:{h[:16]}", method=method,
            memory_gib_per_job=c.parallelism.memory_gib_per_job if (c.parallelism and method == "source") else 0.0,
            est_disk_gib=c.est_disk_gib, inputs=inputs, context=context, env_knobs=env_knobs, notes=notes,
            parallel_knobs=parallel, wheel_packages=wheel_pkgs, index_secret=index_secret,
            sdist=({**e.sdist, "index": e.index, "patches": [dict(p) for p in e.patches]}
                   if (e.sdist and e.patches and c.kind != "base") else {}),
            fetch=_fetch_spec(e) if "src" in context and not (e.sdist and e.patches) else {},
            cost=costs.cost_input(c, e, knobs, tc) if (e.method == "source" and c.kind != "base") else {})
        nodes.append(node)
        by_name[c.name] = node

    return BuildPlan(
        toolchain=tc.name, cuda_version=tc.cuda_version, target_archs=[str(a) for a in target],
        base_kind=base_kind, nodes=nodes, wheelhouse=f"wheelhouse/cu{tc.name}", warnings=warnings,
        resources=res, recipes_dir=str(recipes.dir), prefix=prefix, skipped=sorted(skipped),
        base_image=bc.os_image if bc.kind == "pip" else bc.image, os_suite=bc.os_suite)


# -------------------------------------------------------------------------------------- rendering
def render_plan(plan: BuildPlan, cached: dict[str, bool] | None = None, *, state_dir: str = ".stack") -> str:
    """The ``--dry-run`` text: header (toolchain, base, archs, builder, memory rule), then each node with
    its hash, cached or not (``cached`` None: unknown, no daemon asked), tag, parents, build args and
    every knob with its value, source and why. Pure; returns the text."""
    lines = []
    res = plan.resources
    base_desc = plan.base_image
    if plan.base_kind == "pip":
        base_args = plan.nodes[0].build_args
        base_desc = f"{plan.base_image} (debootstrap {plan.os_suite}) + {base_args.get('CUDA_PIP_SPECS', '')}"
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
    todo = 0.0
    for i, n in enumerate(plan.nodes, 1):
        state = "unknown" if cached is None else ("cached" if cached.get(n.name) else "to build")
        if cached is not None and not cached.get(n.name):
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
        for k in n.knobs:
            why = f"  -- {k.why}" if k.why else ""
            lines.append(f"    knob    {k.name}={k.value}  [{k.source}]{why}")
        for note in n.notes:
            lines.append(f"    note    {note}")
        lines += costs.cost_lines(n, res, state_dir)     # source nodes: arch flags, units, jobs, time
    lines.append("")
    if cached is not None:
        lines.append(f"{sum(1 for n in plan.nodes if cached.get(n.name))} of {len(plan.nodes)} nodes cached; "
                     f"about {todo:g} GiB of disk needed for the rest.")
    else:
        lines.append("Cached state unknown (no Docker daemon asked).")
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def plan_summary(plan: Plan) -> list[dict]:
    """One dict per node (name, kind, hash, tag, parents): for records and tests."""
    return [{"name": n.name, "kind": n.kind, "hash": n.hash, "tag": n.tag, "parents": list(n.parents)}
            for n in plan.nodes]


def exists_fn_for_tags(tags: set[str]) -> Callable[[Node], bool]:
    return lambda n: n.tag in tags
