"""Recipes -> Plan: the build DAG of one toolchain, each node named by a content hash of its inputs.

Pure functions (no Docker): :func:`make_plan` builds the DAG from the recipes' ``kind`` and ``needs``,
resolves every knob with its source (recipe, toolchain, cli, memory-rule, default), fills the build args
of the Dockerfile contract (:mod:`cudastack.plan.model`) and hashes each node; :func:`render_plan` prints it
(``--dry-run``). The executor (:mod:`cudastack.build.executor`) only consumes the Plan.

Where each part lives:

* :mod:`cudastack.plan.graph`: order, node kinds, parents, ``--skip``, arch-dependent image names;
* :mod:`cudastack.plan.hash`: what a node's hash covers (and what it leaves out), ``content_hash``,
  ``dir_digest``, ``canonical_json``;
* :mod:`cudastack.plan.render`: the ``--dry-run`` text and the per-node summary;
* here: the plan's types, the builder's resources, and per node its knobs (with their sources) and build args.

The names of those modules that callers use are importable from here too (``from cudastack.plan.planner import
content_hash, render_plan``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cudastack.core.paths import PROJECT_ROOT
from cudastack.core.credentials import split_userinfo
from cudastack.core.errors import UsageError
from cudastack.plan.model import Knob, Node, Plan, build_env
from cudastack.plan.graph import (arch_dependent, image_repository, node_kind, node_parents, resolve_skips,
                                  topo_order)
from cudastack.plan.hash import (HASH_FORMAT, UNHASHED_CONTEXT, canonical_json, content_hash, dir_digest,
                                 node_hash_inputs)
from cudastack.plan.render import plan_summary, render_plan
from cudastack.recipes.graph import ancestors, available, stack_differences
from cudastack.recipes.load import COMPILING_METHODS, Component, RecipeSet, Toolchain, load_recipes
from cudastack.plan import costs
from cudastack.plan import rules
from cudastack.plan.rules import Resources, host_resources, nvcc_gencode_flags
from cudastack.plan.sources import cmake_args_knob

__all__ = ["PROJECT_ROOT", "DEFAULT_ARCH", "DEFAULT_PREFIX", "STACKPROBE_DIR", "HASH_FORMAT", "UNHASHED_CONTEXT",
           "PlannedNode", "BuildPlan", "host_resources", "make_plan", "resolve_skips", "canonical_json",
           "content_hash", "dir_digest", "render_plan", "plan_summary", "exists_fn_for_tags", "nvcc_gencode_flags",
           "AOT_BUILDER_DIR", "COMPILING_METHODS"]

DEFAULT_ARCH = "12.0"
DEFAULT_PREFIX = "cudastack"
STACKPROBE_DIR = PROJECT_ROOT / "validate" / "stackprobe"
#: the builder script of method ``aot`` (sent in the build context as ``aot/``; hashed with the node)
AOT_BUILDER_DIR = PROJECT_ROOT / "images" / "flashinfer-aot"


@dataclass
class PlannedNode(Node):
    """A :class:`cudastack.plan.model.Node` plus what the executor needs and the hash must not see:
    ``context``: build-context subfolder -> host path (``src`` for a local source, ``stackprobe``);
    ``env_knobs``: knobs this node contributes to the runtime image's environment;
    ``notes``: lines for the dry-run (arch mapping notes, C10 coverage)."""

    context: dict[str, str] = field(default_factory=dict)
    env_knobs: list[Knob] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parallel_knobs: list[str] = field(default_factory=list)
    wheel_packages: list[str] = field(default_factory=list)
    sdist: dict = field(default_factory=dict)   # {"package", "version", "index", "patches"} to fetch + patch
    # a source the executor fetches or copies, then patches, into the context's src/ (cudastack.plan.sources):
    # {"kind": "url" | "git" | "path", "url", "sha256", "commit", "ref", "path", "subdir", "patches"}
    fetch: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)     # source nodes: what cudastack.plan.costs needs for the dry run
    index_secret: str = ""   # the recipe's index URL when it carries a login: BuildKit secret 'pipindex', never an arg


@dataclass
class BuildPlan(Plan):
    """A :class:`cudastack.plan.model.Plan` plus the builder resources and rule the knobs came from."""

    nodes: list[PlannedNode]  # type: ignore[assignment]  # as Plan's, with what the executor needs
    resources: Resources | None = None
    recipes_dir: str = ""
    prefix: str = DEFAULT_PREFIX
    skipped: list[str] = field(default_factory=list)
    base_image: str = ""           # OS image (pip base) or NVIDIA image (nvidia base)
    os_suite: str = ""
    locked: bool = False           # set by cudastack.lock.apply_lock: locked build args, hashes and tags
    unavailable: dict[str, str] = field(default_factory=dict)   # node -> why this toolchain cannot take it
    stacks: list[str] = field(default_factory=list)   # runtimes whose chains pin different versions (one line each)

    def node(self, name: str) -> PlannedNode:
        return {n.name: n for n in self.nodes}[name]      # KeyError for an unknown name, as Plan.node


# --------------------------------------------------------------------------------------- planning
def _source_spec(c: Component, tc: Toolchain) -> tuple[list[str], dict[str, str]]:
    """PIP_SPECS words and build-context folders of a component's entry for ``tc``."""
    e = c.toolchains[tc.name]
    if e.method == "wheel":
        return list(e.packages), {}
    if e.method == "aot":
        return list(e.packages), {"aot": str(AOT_BUILDER_DIR)}
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


@dataclass
class _NodeParts:
    """What one component contributes to its node before hashing: knobs (with sources), knobs for the runtime
    image's environment, dry-run notes, the parallelism knobs' names, build args, build-context folders,
    PIP_SPECS words and an index URL with a login (a BuildKit secret, never a build arg)."""

    knobs: list[Knob] = field(default_factory=list)
    env_knobs: list[Knob] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parallel: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    specs: list[str] = field(default_factory=list)
    index_secret: str = ""


def _base_parts(tc: Toolchain, bc, base_kind: str) -> _NodeParts:
    """The base node: its build args come from the toolchain's base choice, each also a knob."""
    if bc.kind == "pip":
        args = {"OS_IMAGE": bc.os_image, "CUDA_PIP_SPECS": " ".join(bc.pip_specs),
                "CUDA_VERSION": tc.cuda_version, "CUDA_WHEEL_ROOT": bc.wheel_root}
    else:
        args = {"BASE_IMAGE": bc.image, "CUDA_VERSION": tc.cuda_version}
    knobs = [Knob(k, v, "toolchain", f"toolchains.yaml {tc.name} bases.{base_kind}") for k, v in args.items()]
    return _NodeParts(knobs=knobs, args=args)


def _component_knobs(c: Component, recipes: RecipeSet, tc: Toolchain, target, arch_src: str, res: Resources,
                     max_jobs: int | None, nvcc_threads: int | None, warnings: list[str]) -> _NodeParts:
    """A non-base component's knobs, in the order they override each other: the recipe's knobs (only for a
    build), the arch list mapped onto its arch knob (build or runtime-environment scope), the toolchain entry's
    knobs, then the memory rule's parallelism knobs for a source build. Appends to ``warnings``."""
    e = c.toolchains[tc.name]
    p = _NodeParts()
    p.specs, p.context = _source_spec(c, tc)
    builds = e.method in COMPILING_METHODS or c.kind == "image"
    for k, v in c.knobs.items():
        if builds:
            p.knobs.append(Knob(k, v, "recipe", c.file.name))
        else:
            p.notes.append(f"{k}={v} applies only to a source build (this toolchain uses a {e.method})")
    if c.arch_knob:
        m = rules.map_archs(recipes, tc, c.arch_knob, target)
        if m.knob:
            src = arch_src
            if c.arch_knob.style == "suffixed" and any(not a.suffix for a in target):
                src = "toolchain"
            arch_knob = Knob(m.knob, m.value, src, m.note)
            scope_env = c.arch_knob.scope == "env"
            if scope_env:
                p.env_knobs.append(arch_knob)
            if not scope_env or e.method in COMPILING_METHODS:
                p.knobs.append(arch_knob)
            else:
                p.notes.append(f"{m.knob}={m.value} goes into the runtime image's environment ({m.note})")
        else:
            p.notes.append(f"arch list: {m.note} (case C10: no arch knob to set)")
            if m.uncovered:
                warnings.append(f"{c.name}: its build hard-codes its archs and none covers "
                                f"{', '.join(m.uncovered)} on CUDA {tc.cuda_version}")
    for k, v in e.knobs.items():
        p.knobs = [kn for kn in p.knobs if kn.name != k] + [Knob(k, v, "recipe", f"{c.file.name} toolchains.{tc.name}")]
    if e.method in COMPILING_METHODS:
        assert c.parallelism is not None  # enforced by the loader
        pk = rules.memory_rule(c.parallelism, res, max_jobs, nvcc_threads)
        p.parallel = [k.name for k in pk]
        p.knobs = [kn for kn in p.knobs if kn.name not in p.parallel] + pk
        p.knobs, cm_parallel = cmake_args_knob(c, e, p.knobs, pk)
        p.parallel += cm_parallel
    return p


def _component_build_args(p: _NodeParts, c: Component, tc: Toolchain, parent_tag: str,  # noqa: C901 - reason: one branch per component kind of the Dockerfile contract
                          planned: list[PlannedNode], probe_dir: Path, recipes_components: dict) -> None:
    """Fill ``p.args`` (and the runtime's context and env knobs) for a non-base component, per kind, as the
    Dockerfile contract (:mod:`cudastack.plan.model`) names them. ``planned``: the nodes planned so far (the
    runtime image collects the environment knobs of those in its own image chain; ``recipes_components``: the
    recipes' components, whose ``needs`` give that chain)."""
    e = c.toolchains[tc.name]
    env_text = build_env(p.knobs)
    args = p.args
    args["PARENT_IMAGE"] = parent_tag
    if e.index:
        # the login stays out of the build args (they persist in the image history): see credentials.py
        args["PIP_INDEX_URL"], has_login = split_userinfo(e.index)
        if has_login:
            p.index_secret = e.index
    if c.kind == "image" and e.method == "source":
        args.update({"SOURCE_DIR": "src", "BUILD_ENV": env_text, "BUILD_DEPS": " ".join(e.build_deps)})
    elif c.kind == "image":
        args.update({"PIP_SPECS": " ".join(p.specs), "BUILD_ENV": env_text})
    elif c.kind == "wheels":
        args.update({"METHOD": e.method, "PIP_SPECS": " ".join(p.specs), "BUILD_ENV": env_text})
        if e.build_deps:
            args["BUILD_DEPS"] = " ".join(e.build_deps)
        if "src" in p.context:
            args["SOURCE_DIR"] = "src"   # the local folder (or patched sdist) in the build context
        if e.method == "aot":
            _aot_build_args(p, c, e, tc)     # its patches apply to the installed flashinfer package
        elif e.patches:
            for pt in e.patches:
                p.notes.append(f"patch {pt['file']}: '{pt['replace']}' -> '{pt['with']}'"
                               + (f" ({pt['why']})" if pt.get("why") else ""))
    else:  # runtime
        args.update({"PIP_SPECS": " ".join(p.specs), "WHEEL_NAMES": ""})
        collected: dict[str, Knob] = {}
        chain = set(ancestors(recipes_components, c.name))   # this runtime's own image chain, not another's
        for n in (m for m in planned if m.name in chain):
            for k in n.env_knobs:
                collected[k.name] = k
        for k in p.env_knobs:
            collected[k.name] = k
        p.env_knobs = list(collected.values())
        for k in p.env_knobs:
            args[k.name] = k.value
            if k not in p.knobs:
                p.knobs.append(Knob(k.name, k.value, k.source, k.why + " (runtime environment)"))
        p.context["stackprobe"] = str(probe_dir)
        p.context["wheelhouse"] = ""   # filled by the executor from the wheel nodes


def _aot_build_args(p: _NodeParts, c: Component, e, tc: Toolchain) -> None:
    """Build args and dry-run notes of an ``aot`` node (images/wheels-aot.Dockerfile): the packages that run
    FlashInfer's JIT, the module generators, the patches (JSON) and the jit-cache wheel's local version."""
    arch_list = next((k.value for k in p.knobs if c.arch_knob and k.name == c.arch_knob.knob), "")
    p.args.update({"BUILD_DEPS": " ".join(e.build_deps or e.packages), "AOT_MODULES": " ".join(e.modules),
                   "AOT_PATCHES": json.dumps([dict(pt) for pt in e.patches], separators=(",", ":")),
                   "AOT_LOCAL_VERSION": "cu" + tc.name.replace(".", "")})
    flags = " ".join(nvcc_gencode_flags(arch_list))
    for m in e.modules:
        p.notes.append(f"aot module {m}: nvcc {flags} (FLASHINFER_CUDA_ARCH_LIST={arch_list})")
    p.notes.append(f"aot wheel: flashinfer-jit-cache {' '.join(e.packages)} +{p.args['AOT_LOCAL_VERSION']} "
                   "(loaded by the installed FlashInfer instead of a JIT build)")
    for pt in e.patches:
        p.notes.append(f"patch flashinfer/{pt['file']}: '{pt['replace']}' -> '{pt['with']}'"
                       + (f" ({pt['why']})" if pt.get("why") else ""))


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
    arch_source: str | None = None,
) -> BuildPlan:
    """Make the plan of toolchain ``cuda`` ("13.1") for target ``archs`` (default "12.0").

    ``base``: "pip" | "nvidia" (default: the toolchain's ``default_base``). ``skip``: components to
    leave out (the runtime node drops their wheels). ``max_jobs`` / ``nvcc_threads``: override the
    memory rule. ``resources``: the builder's cores and memory (default: this host). ``prefix``: image
    repository prefix of the tags. ``arch_source``: the source the dry run names for the arch knobs
    (default "cli" when ``archs`` is given, else "default"; a locked build passes "lock"). Everything is checked before anything is built: UsageError (unknown
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
    unavailable = available(recipes.components, tc.name)
    skipped = resolve_skips(recipes, skip, unavailable)
    comps = [c for c in topo_order(recipes.components, tc.name) if c.name not in skipped | set(unavailable)]
    sources = [c for c in comps if c.toolchains[tc.name].method in COMPILING_METHODS]
    rules.check_base(tc, base_kind, sources)
    res = resources or host_resources()
    images = Path(images_dir) if images_dir else PROJECT_ROOT / "images"
    probe_dir = Path(stackprobe_dir) if stackprobe_dir else STACKPROBE_DIR
    bc = tc.bases[base_kind]
    arch_src = arch_source or ("cli" if arch_from_cli else "default")
    warnings: list[str] = []
    nodes: list[PlannedNode] = []
    by_name: dict[str, PlannedNode] = {}
    arch_dep: dict[str, bool] = {}

    for c in comps:
        e = c.toolchains[tc.name]
        kind = node_kind(c, base_kind)
        parents, image_parent = node_parents(c, recipes, skipped | set(unavailable))
        if c.kind == "base":
            p = _base_parts(tc, bc, base_kind)
        else:
            p = _component_knobs(c, recipes, tc, target, arch_src, res, max_jobs, nvcc_threads, warnings)
            _component_build_args(p, c, tc, by_name[image_parent].tag, nodes, probe_dir, recipes.components)

        # an image node built from source (torch) has its own Dockerfile, so the wheel one's hash stays
        dockerfile = images / (f"{kind}-source.Dockerfile" if (c.kind == "image" and e.method == "source")
                               else f"{kind}-aot.Dockerfile" if (c.kind == "wheels" and e.method == "aot")
                               else f"{kind}.Dockerfile")
        try:
            df_text = dockerfile.read_text()
        except OSError:
            df_text = ""
            warnings.append(f"{c.name}: {dockerfile} does not exist yet (the hash will change once it does)")
        inputs = node_hash_inputs(c=c, tc=tc, kind=kind, base_kind=base_kind, base_choice=bc, knobs=p.knobs,
                                  parallel=p.parallel, args=p.args, dockerfile_text=df_text, context=p.context,
                                  image_parent=image_parent, parent_hashes={n: by_name[n].hash for n in parents})
        h = content_hash(inputs)
        arch_dep[c.name] = arch_dependent(c, p.knobs, parents, arch_dep)
        repo = image_repository(prefix, tc.name, base_kind, target, c.name, arch_dep[c.name])
        method = "" if c.kind in ("base", "runtime") else e.method
        wheel_pkgs = [re.split(r"[\[=<>!~ ]", s)[0] for s in p.specs] if c.kind == "wheels" else []
        if method == "aot":
            wheel_pkgs.append("flashinfer-jit-cache")
        node = PlannedNode(
            name=c.name, kind=kind, dockerfile=str(dockerfile.relative_to(PROJECT_ROOT))
            if dockerfile.is_relative_to(PROJECT_ROOT) else str(dockerfile),
            parents=parents, build_args=p.args, knobs=p.knobs, hash=h, tag=f"{repo}:{h[:16]}", method=method,
            memory_gib_per_job=c.parallelism.memory_gib_per_job if (c.parallelism and method in COMPILING_METHODS)
            else 0.0,
            est_disk_gib=c.est_disk_gib, inputs=inputs, context=p.context, env_knobs=p.env_knobs, notes=p.notes,
            parallel_knobs=p.parallel, wheel_packages=wheel_pkgs, index_secret=p.index_secret,
            sdist=({**e.sdist, "index": e.index, "patches": [dict(pt) for pt in e.patches]}
                   if (e.sdist and e.patches and c.kind != "base") else {}),
            fetch=_fetch_spec(e) if "src" in p.context and not (e.sdist and e.patches) else {},
            cost=costs.cost_input(c, e, p.knobs, tc) if (e.method in COMPILING_METHODS and c.kind != "base") else {})
        nodes.append(node)
        by_name[c.name] = node

    return BuildPlan(
        toolchain=tc.name, cuda_version=tc.cuda_version, target_archs=[str(a) for a in target],
        base_kind=base_kind, nodes=nodes, wheelhouse=f"wheelhouse/cu{tc.name}", warnings=warnings,
        resources=res, recipes_dir=str(recipes.dir), prefix=prefix, skipped=sorted(skipped),
        base_image=bc.os_image if bc.kind == "pip" else bc.image, os_suite=bc.os_suite,
        unavailable={n: why for n, why in unavailable.items() if n not in skipped},
        stacks=stack_differences(recipes.components, tc.name))


def exists_fn_for_tags(tags: set[str]) -> Callable[[Node], bool]:
    return lambda n: n.tag in tags
