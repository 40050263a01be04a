"""What `invoke build`, `invoke plan` and `invoke bootstrap-base` do: the flags' values in, the plan made (twice: input
errors first, then with the builder's resources), the lock verified, builders and node cache checked, the build run
and recorded."""
from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cudastack.core.errors import StackError, UsageError
from cudastack.jobs.output import json_output
from cudastack.plan.render import plan_summary


def _int(flag: str, value) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"--{flag} {value!r}: give a whole number.") from None


def _sigterm_as_interrupt() -> None:
    """SIGINT and SIGTERM (Ctrl-C, a stopped session or service) become KeyboardInterrupt and are remembered
    (:mod:`cudastack.core.stop`), so the running docker build is cancelled and the run ends "interrupted" (record,
    message, exit 130) wherever it was stopped."""
    from cudastack.core import stop

    stop.install()


def _pairs(flag: str, values) -> dict[str, str]:
    """NAME=VALUE flags (--method, --source) as a dict; UsageError for a value without '='."""
    out = {}
    for v in values or ():
        name, sep, val = str(v).partition("=")
        if not sep or not name or not val:
            raise UsageError(f"--{flag} {v!r}: write NAME=VALUE, e.g. --{flag} "
                             + ("torch=source." if flag == "method" else "sgl-kernel=/path/to/sgl-kernel."))
        out[name] = val
    return out


def only_to_skip(only, skip, recipes) -> list | None:
    """``--skip`` values for ``--only`` (every component that no named node needs); with no ``--only`` the
    given ``skip``. UsageError for an unknown name, or for --only with --skip (say one or the other)."""
    if not only:
        return skip
    from cudastack.plan.graph import only_skips
    from cudastack.recipes.load import load_recipes

    if skip:
        raise UsageError("--only and --skip together: give --only NODE (it leaves out everything NODE does not need) "
                         "or --skip NAME, not both.")
    return only_skips(load_recipes(recipes), only)


def _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes, resources=None, prefix=None, method=None,
          source=None, arch_source=None):
    from cudastack.plan.planner import DEFAULT_PREFIX, make_plan
    from cudastack.recipes.load import load_recipes
    from cudastack.recipes.select import select_methods

    methods, sources = _pairs("method", method), _pairs("source", source)
    if methods or sources:
        recipes = select_methods(load_recipes(recipes), str(cuda), methods, sources)

    prefix = prefix or DEFAULT_PREFIX
    if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", prefix):
        raise UsageError(f"--prefix {prefix!r}: give a Docker repository path in lower case (letters, digits, "
                         "'.', '_', '-', '/'), such as cudastack or cudastack-test.")
    return make_plan(recipes, str(cuda), archs=arch, base=base, skip=skip or (),
                     max_jobs=_int("max-jobs", max_jobs), nvcc_threads=_int("nvcc-threads", nvcc_threads),
                     resources=resources, prefix=prefix, arch_source=arch_source)


def _builder_resources():
    """The builder's cores and memory as a build reads them (the daemon's view when one answers, else this
    host's), so a dry run prints the MAX_JOBS the build will use."""
    from cudastack.build.engine import Engine

    try:
        return Engine.connect().resources()
    except StackError:
        return None   # no daemon: make_plan reads this host, as the engine of a local daemon does


def final_line(record: dict) -> str:
    """The build's last line: the runtime image's tag (the one thing the next command needs), or the last
    node's tag when the plan has no runtime node."""
    nodes = record.get("nodes") or []
    runtime = next((n for n in nodes if n.get("kind") == "runtime"), nodes[-1] if nodes else None)
    if runtime is None:
        return "no image built"
    what = "runtime image" if runtime.get("kind") == "runtime" else f"last image ({runtime['name']})"
    return f"{what}: {runtime['tag']}"


def check_base_registry(plan, engine) -> None:
    """Before the first build: a base image that neither the engine holds nor a cached base node covers must
    come from its registry (NVIDIA's base from Docker Hub, by default for CUDA 12.8): ping that registry
    (``GET /v2/``) and raise RegistryError (exit 8) suggesting ``--base pip`` when it does not answer. Skipped
    when the daemon has a registry mirror configured (it may pull through the mirror)."""
    from cudastack.core.errors import RegistryError
    from cudastack.registry.client import DOCKER_HUB, parse_reference, ping, registry_url

    if not plan.nodes or plan.base_kind == "pip" or not plan.base_image:
        return
    if engine.exists(plan.nodes[0].tag) or engine.exists(plan.base_image):
        return
    ref = parse_reference(plan.base_image)
    if ref.registry == DOCKER_HUB and (engine.info().get("RegistryConfig") or {}).get("Mirrors"):
        return
    try:
        ping(ref.registry, timeout=15)
    except RegistryError:
        skips = " --skip flash-attn" if plan.toolchain.startswith("12.") else ""
        raise RegistryError(
            f"The base image {plan.base_image} is not on this Docker engine, and its registry {ref.registry} "
            f"does not answer at {registry_url(ref.registry)}/v2/. Build on the pip base instead (an OS image from "
            "mmdebstrap plus PyPI's CUDA toolkit wheels, no registry needed): "
            f"`invoke build --cuda {plan.toolchain} --base pip{skips}`; or load the base image into this engine "
            "first (`docker load`, or a pull through a reachable mirror). Nothing was built.") from None


def preflight(plan, state_dir) -> tuple[list, StackError | None]:
    """The checks a real build makes before its first node, made without building (the dry run's rehearsal):
    a Docker engine answers and a docker client can drive BuildKit (:meth:`cudastack.build.engine.Engine.connect`),
    the disk where the images go (the engine's data root) and where the state goes (``state_dir``) holds the
    nodes to build (:func:`cudastack.build.context.disk_refusal`), and a base image the engine lacks can come from
    its registry (:func:`check_base_registry`). Returns ``(lines, refusal)``: one line per check as the user
    reads it, and the first refusal, the very StackError the build raises (same message, same exit code), or
    None."""
    from pathlib import Path

    from cudastack.build.context import cached_map, disk_refusal
    from cudastack.build.engine import Engine
    from cudastack.build.wheelhouse import Wheelhouse

    try:
        engine = Engine.connect()
    except StackError as exc:
        return [f"Docker engine and BuildKit: REFUSED (exit {exc.exit_code}): {exc}"], exc
    lines = [f"Docker engine and BuildKit: ok ({engine.buildkit.describe()})"]
    state = Path(state_dir).resolve()
    cached = cached_map(engine, Wheelhouse(state / plan.wheelhouse), plan)
    _, report, refusal = disk_refusal(engine, plan, cached, state)
    lines.append(report + (f": REFUSED (exit {refusal.exit_code})" if refusal else ": enough"))
    if refusal is not None:
        return lines, refusal
    base_todo = bool(plan.nodes) and not cached.get(plan.nodes[0].name)
    if plan.base_kind == "pip" and plan.base_image and base_todo and not engine.exists(plan.base_image):
        import os

        from cudastack.core.errors import EnvironmentError_
        from cudastack.osimage.bootstrap import _find_tool
        try:       # what bootstrap_os_image refuses before its download: not root, no mmdebstrap
            if os.geteuid() != 0:
                raise EnvironmentError_(
                    "Bootstrapping an OS image needs root: the bootstrap creates device nodes and chroots into the "
                    "new root filesystem. Run this step as root (e.g. `sudo -E invoke ...`), or pull a Debian image "
                    "from a registry and pass it as the OS image instead.")
            _find_tool(None)
        except StackError as exc:
            return lines + [f"OS image {plan.base_image}: REFUSED (exit {exc.exit_code}): {exc}"], exc
        lines.append(f"OS image {plan.base_image}: not on this engine; the build makes it first with mmdebstrap")
    try:
        check_base_registry(plan, engine)
    except StackError as exc:
        return lines + [f"base image {plan.base_image}: REFUSED (exit {exc.exit_code}): {exc}"], exc
    if plan.base_kind != "pip" and plan.base_image:
        lines.append(f"base image {plan.base_image}: on this engine, or its registry answers")
    return lines, None


def _open_cache(prefix: str, read_only: bool, optional: bool, client):
    """The node cache for ``prefix`` ("" -> None), its registry checked before any work
    (:meth:`cudastack.build.node_cache.NodeCache.open`); ``client`` None: a docker SDK client of the engine (dry run)."""
    if not prefix:
        return None
    from cudastack.build.node_cache import NodeCache

    if client is None:
        from cudastack.core.docker_engine import docker_client

        client = docker_client()
    return NodeCache.open(prefix, client, read_only=read_only, optional=optional,
                          say=lambda m: print(m, file=sys.stderr, flush=True))


@dataclass(frozen=True)
class BuildOptions:
    """`invoke build`'s options, declared once: the task (:mod:`cudastack.cli.build`) makes one of its flags'
    values and passes it to :func:`build`. Each field is the flag of that name (``json_out``: --json); the defaults
    are the task's."""
    cuda: str = "13.1"
    arch: str | None = None
    base: str | None = None
    dry_run: bool = False
    skip: Sequence[str] | None = None
    max_jobs: int | str | None = None
    nvcc_threads: int | str | None = None
    ca_bundle: str | None = None
    recipes: str | None = None
    state_dir: str = ".stack"
    locked: bool = False
    prefix: str | None = None
    lockfiles: str | None = None
    method: Sequence[str] | None = None
    source: Sequence[str] | None = None
    builder: str | None = None
    builder_nodes: str = "source"
    cache: str | None = None
    cache_read_only: bool = False
    cache_optional: bool = False
    only: Sequence[str] | None = None
    json_out: str | None = None


def _locked_say(msg: str) -> None:
    """A locked build's progress line (standard error)."""
    print(f"locked build: {msg}", file=sys.stderr, flush=True)


def _lock_caches(o: BuildOptions, plan) -> list:
    """The folders a locked hash can be checked against when the index is away (sdists, the wheelhouse)."""
    from pathlib import Path

    return [Path(o.state_dir) / "sdists", Path(o.state_dir) / plan.wheelhouse]


def _cache_flag(o: BuildOptions) -> str:
    """The node cache's prefix: --cache, else $CUDASTACK_NODE_CACHE ("" for none; a login in it is refused);
    UsageError for --cache-read-only / --cache-optional without one."""
    from cudastack.build.node_cache import cache_prefix

    prefix_cache = cache_prefix(o.cache)
    if (o.cache_read_only or o.cache_optional) and not prefix_cache:
        raise UsageError("--cache-read-only and --cache-optional need a node cache: add --cache REGISTRY/PREFIX "
                         "or set CUDASTACK_NODE_CACHE.")
    return prefix_cache


def _lock_options(o: BuildOptions) -> tuple[BuildOptions, str | None]:
    """Under --locked, the options not given taken from the lock (its base, archs, skipped components), with the
    arch list's source for the dry run ("lock" when the lock gave it, else None); without --locked, ``o`` as it is."""
    if not o.locked:
        return o, None
    from cudastack import lock as L

    arch, base, skip = L.plan_options(str(o.cuda), o.arch, o.base, o.skip, o.lockfiles)
    return replace(o, arch=arch, base=base, skip=skip), ("lock" if o.arch is None and arch is not None else None)


def _builder(o: BuildOptions):
    """--builder's buildx builder, inspected before any build (an unknown one: one paragraph), or None without
    --builder; UsageError for a bad --builder-nodes or a docker client without buildx."""
    if not o.builder:
        return None
    from cudastack.build.builders import SCOPES, inspect_builder

    if o.builder_nodes not in SCOPES:
        raise UsageError(f"--builder-nodes {o.builder_nodes}: use 'source' (the nodes that compile: source and aot builds) or 'all'.")
    from cudastack.build.engine import find_buildkit

    bk = find_buildkit()
    if bk.mode != "buildx":
        raise UsageError(f"--builder {o.builder} needs the docker buildx plugin, and this client ({bk.docker}, "
                         f"{bk.version}) has none. Install docker-buildx (Debian/Ubuntu package docker-buildx, "
                         "or docker-buildx-plugin from Docker's repository), or build without --builder. "
                         "Nothing was built.")
    return inspect_builder(str(o.builder), docker=bk.docker)


def _plan_of(o: BuildOptions, arch_source, resources=None):
    """The plan of ``o`` (:func:`_plan`) with the builder's ``resources`` (None: none read yet)."""
    return _plan(o.cuda, o.arch, o.base, o.skip, o.max_jobs, o.nvcc_threads, o.recipes, resources=resources,
                 prefix=o.prefix, method=o.method, source=o.source, arch_source=arch_source)


def build(opts: BuildOptions) -> None:
    """`invoke build`: build a toolchain's images (base -> torch -> wheels -> runtime) with BuildKit; cached nodes
    are skipped. ``opts``: its flags' values (see :mod:`cudastack.cli.build`); raises StackError."""
    _sigterm_as_interrupt()     # a stop at any point below ends as "interrupted" (exit 130), never as a traceback
    with json_output(opts.json_out) as box:
        o = replace(opts, skip=only_to_skip(opts.only, opts.skip, opts.recipes))
        prefix_cache = _cache_flag(o)
        o, arch_source = _lock_options(o)
        bx = _builder(o)
        if o.dry_run:
            _dry_run_build(o, box, prefix_cache, arch_source, bx)
        else:
            _real_build(o, box, prefix_cache, arch_source, bx)


def _dry_run_build(o: BuildOptions, box: dict, prefix_cache: str, arch_source, bx) -> None:
    """build --dry-run: the plan printed with each node's state, the lock verified, and the build's preflight
    checks rehearsed; raises the refusal the build would stop with."""
    from cudastack.build.executor import dry_run as render_dry_run
    from cudastack.radar.walk import refuse_engine_pin_conflicts

    plan = _plan_of(o, arch_source)   # input errors first
    plan = _plan_of(o, arch_source, resources=_builder_resources())
    node_cache = _open_cache(prefix_cache, o.cache_read_only, o.cache_optional, None)
    if o.locked:
        from cudastack import lock as L

        lock = L.prepare_locked_build(plan, L.lock_path(plan.toolchain, o.lockfiles), say=_locked_say,
                                      cache_dirs=_lock_caches(o, plan))
        _locked_say(f"{L.lock_path(plan.toolchain, o.lockfiles)} verified against the plan; locked tags below")
        if node_cache is not None:
            node_cache.lock = lock
    box["data"] = {"toolchain": plan.toolchain, "dry_run": True, "nodes": plan_summary(plan)}
    print(render_dry_run(plan, state_dir=o.state_dir, cache=node_cache))
    if bx is not None:
        from cudastack.build.builders import sent
        names = [n.name for n in plan.nodes if sent(n, o.builder_nodes)]
        print(f"Builder: {bx.name} ({bx.driver}, {bx.endpoint}) builds: {', '.join(names) or 'nothing'}")
    refuse_engine_pin_conflicts(plan, say=lambda m: print(f"WARNING: {m}", file=sys.stderr))
    lines, refusal = preflight(plan, o.state_dir)
    print("Before its first node the build checks:\n" + "\n".join(f"  {ln}" for ln in lines))
    box["data"]["preflight"] = {"checks": lines, "refusal": str(refusal) if refusal else None,
                                "exit_code": refusal.exit_code if refusal else 0}
    if refusal is not None:
        print(f"The build would stop there, before any work, with exit {refusal.exit_code} and this message:",
              file=sys.stderr)
        raise refusal


def _note_builder_parents(o: BuildOptions, bx, plan, engine, node_cache) -> None:
    """With --builder: a note per sent node whose parent the builder cannot reach; nodes pulled from the node cache
    are never sent, so their parents need not be there."""
    from cudastack.build.builders import check_parents
    served: set = set()
    pullable: set = set()
    if node_cache is not None:
        from pathlib import Path

        from cudastack.build.executor import Wheelhouse, cached_map
        from cudastack.registry.cache_parents import cache_reference
        here = cached_map(engine, Wheelhouse(Path(o.state_dir).resolve() / plan.wheelhouse), plan)
        remote = node_cache.probe_plan(plan, {}, lambda m: print(m, file=sys.stderr), for_push=False)
        held = {n for n, d in remote.items() if d}
        pullable = {n for n in held if not here.get(n)
                    or cache_reference(node_cache, plan.node(n), {}, remote[n])}
        served = {n for n, c in here.items() if c} | held
    for note in check_parents(bx, plan, o.builder_nodes, docker=engine.buildkit.docker, served=served,
                              pullable=pullable):
        print(f"note: {note}", file=sys.stderr)


def _real_build(o: BuildOptions, box: dict, prefix_cache: str, arch_source, bx) -> None:
    """build without --dry-run: the plan made (input errors first, then with the engine's resources), the node
    cache opened and the lock verified before any work, the build run, its outputs recorded into the lock."""
    from cudastack.build.engine import Engine
    from cudastack.build.executor import run_build
    from cudastack.radar.walk import refuse_engine_pin_conflicts

    plan = _plan_of(o, arch_source)  # input errors first
    refuse_engine_pin_conflicts(plan)   # a new toolchain's pins against the engine's (index), before any build
    engine = Engine.connect()
    plan = _plan_of(o, arch_source, resources=engine.resources())
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    node_cache = _open_cache(prefix_cache, o.cache_read_only, o.cache_optional, engine.client)  # before any work
    lock_file = None
    if o.locked:
        from cudastack import lock as L

        lock_file = L.lock_path(plan.toolchain, o.lockfiles)
        lock = L.prepare_locked_build(plan, lock_file, client=engine.client, say=_locked_say,
                                      cache_dirs=_lock_caches(o, plan), cache=node_cache)
        _locked_say(f"{lock_file} verified against the plan")
        if node_cache is not None:
            node_cache.lock = lock
    check_base_registry(plan, engine)
    if bx is not None:
        _note_builder_parents(o, bx, plan, engine, node_cache)
    record = run_build(plan, state_dir=o.state_dir, ca_bundle=o.ca_bundle, engine=engine, builder=bx,
                       builder_nodes=o.builder_nodes, cache=node_cache)
    if lock_file is not None:
        L.record_build_outputs(lock_file, record)
    print(f"record: {record['record_path']}")
    for f in record.get("cache_failures") or []:
        print(f"warning: node cache {f['op']} of {f['node']} failed (the build's result stands): {f['error']}",
              file=sys.stderr)
    box["data"] = record
    print(final_line(record))


def plan(*, cuda="13.1", arch=None, base=None, skip=None, max_jobs=None, nvcc_threads=None, recipes=None,
         state_dir=".stack", method=None, source=None, only=None, json_out=None):
    """`invoke plan`: print the build plan (same as build --dry-run). Its flags' values as keywords (see
    :mod:`cudastack.cli.build`); raises StackError."""
    with json_output(json_out) as box:
        from cudastack.build.executor import dry_run as render_dry_run
        skip = only_to_skip(only, skip, recipes)
        _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes, method=method, source=source)   # input errors first
        planned = _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes, resources=_builder_resources(),
                        method=method, source=source)
        print(render_dry_run(planned, state_dir=state_dir))
        box["data"] = {"toolchain": planned.toolchain, "dry_run": True, "nodes": plan_summary(planned)}


def bootstrap_base(*, suite="bookworm", mirror=None, tag=None):
    """`invoke bootstrap-base`: make the OS image of the 'pip' base with mmdebstrap (reproducible: the same id on
    any machine) + docker load. Its flags' values as keywords (see :mod:`cudastack.cli.build`); raises
    StackError."""
    from cudastack.osimage.bootstrap import DEFAULT_MIRROR, bootstrap_os_image
    image_id = bootstrap_os_image(suite, mirror or DEFAULT_MIRROR, tag or f"cudastack/debian:{suite}",
                                  progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(image_id)
