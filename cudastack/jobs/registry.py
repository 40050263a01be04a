"""What `invoke lock`, `push`, `pull`, `cluster-job` and `bake` do: each flag's value in, the lock, registry and bake
work done, the result printed."""
from __future__ import annotations

import sys

from cudastack.core.errors import LockError, StackError, UsageError
from cudastack.core.paths import PROJECT_ROOT
from cudastack.jobs.output import json_output


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _plan(cuda, arch, base, skip, recipes):
    from cudastack.plan.planner import make_plan

    return make_plan(recipes, str(cuda), archs=arch, base=base, skip=skip or ())


def _node(plan, name):
    try:
        return plan.node(name)
    except KeyError:
        raise UsageError(f"--node {name!r} is not in the plan; nodes: {', '.join(n.name for n in plan.nodes)}.") from None


def lock(*, cuda="13.1", arch=None, base=None, skip=None, recipes=None, lockfiles=None, python=None, glibc=None,
         find_links=None, resolver=None, node=None, json_out=None):
    """`invoke lock`: pin every input of the plan into lockfiles/<toolchain>.lock.yaml. Its flags' values as
    keywords (see :mod:`cudastack.cli.registry`); raises StackError."""
    with json_output(json_out) as box:
        from cudastack import lock as L
        from cudastack.lock.resolve_uv import choose_resolver
        given = (arch, base, skip)
        arch, base, skip = L.plan_options(str(cuda), arch, base, skip, lockfiles)
        filled = [f"--arch {arch}" if arch != given[0] else "", f"--base {base}" if base != given[1] else "",
                  " ".join(f"--skip {s}" for s in skip or []) if skip != given[2] else ""]
        if any(filled):
            _say(f"note: from the existing lockfile: {' '.join(f for f in filled if f)} "
                 "(pass --arch/--base/--skip to change them)")
        plan = _plan(cuda, arch, base, skip, recipes)
        resolve = choose_resolver(resolver)   # an unknown name, or uv not installed: stop before resolving
        client = None
        try:
            from cudastack.registry.client import docker_client
            client = docker_client()
        except StackError as exc:
            if plan.base_kind == "pip":
                raise
            _say(f"note: {exc}")
        target = L.target_for_plan(plan, glibc=glibc, client=client)
        path = L.lock_path(plan.toolchain, lockfiles)
        try:
            before = L.load_lock(path) if path.exists() else {}
        except StackError:
            before = {}
        kept: list[str] = []
        lk = L.lock_plan(plan, path, target=target, python=python or sys.executable, client=client,
                         find_links=find_links or (), progress=_say, resolver=resolve, only=node or (),
                         kept=kept)
        for line in kept:
            _say(f"note: {line}")
        for section in ("outputs", "pushed"):
            dropped = sorted(set(before.get(section) or {}) - set(lk.get(section) or {}))
            if dropped:
                _say(f"note: dropped the recorded {section} of {', '.join(dropped)}: their lock entries changed "
                     f"(pins or plan), so those images are not what this lock describes; rebuild with "
                     f"`invoke build --cuda {plan.toolchain} --locked`"
                     + (" and push again" if section == "pushed" else ""))
        box["data"] = lk
        print(L.summary(lk))
        print(f"wrote {path}")


def push(*, cuda="13.1", registry=None, node="runtime", all_nodes=False, arch=None, base=None, skip=None,
         recipes=None, lockfiles=None):
    """`invoke push`: push the locked build's images and record their digests in the lockfile. Its flags' values as
    keywords (see :mod:`cudastack.cli.registry`); raises StackError."""
    from cudastack import lock as L
    from cudastack.registry import client as R
    if not registry:
        raise UsageError("--registry is required: HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000/cudastack.")
    R.parse_registry_prefix(registry)          # bad input before any work
    arch, base, skip = L.plan_options(str(cuda), arch, base, skip, lockfiles)   # the locked plan's options
    plan = _plan(cuda, arch, base, skip, recipes)
    path = L.lock_path(plan.toolchain, lockfiles)
    names = [n.name for n in plan.nodes if n.kind != "wheels"] if all_nodes else [node]
    for name, pushed in L.push_locked(plan, path, registry, nodes=names, progress=_say).items():
        print(f"{name}: {pushed.reference}")
        print(f"{name}: {pushed.enroot}")


def pull(*, cuda="13.1", node="runtime", lockfiles=None):
    """`invoke pull`: pull the image the lockfile records by digest (the only mode: a cluster runs what was
    validated) and verify it (registry digest, RepoDigests, image id). Its flags' values as keywords (see
    :mod:`cudastack.cli.registry`); raises StackError."""
    from cudastack import lock as L
    path = L.lock_path(str(cuda), lockfiles)
    image = L.pull_locked(path, node=node, progress=_say)
    print(f"{image.attrs.get('RepoDigests')[0] if image.attrs.get('RepoDigests') else image.id} -> {image.id}")


def cluster_job(*, cuda="13.1", scheduler=None, gpus=None, nodes=1, image=None, output=None, partition=None,
                account=None, time="01:00:00", namespace="default", host_path=None, pull_secret=None,
                probe_arg=None, lockfiles=None, refuse_loopback=False, server_args="", env=None):
    """`invoke cluster-job`: write a Slurm script or Kubernetes Job that validates GPU nodes from the pinned digest.
    Its flags' values as keywords (see :mod:`cudastack.cli.registry`); raises StackError."""
    from cudastack.registry import cluster
    from cudastack import lock as L
    from cudastack.registry.reference import parse_reference
    if scheduler not in ("slurm", "kubernetes"):
        raise UsageError("--scheduler is required: slurm (an sbatch script) or kubernetes (a batch/v1 Job).")
    if scheduler == "kubernetes":
        cluster.require_kubernetes_validator()      # before any work: the Job is written checked or not at all
    try:
        n_gpus, n_nodes = int(gpus), int(nodes)
    except (TypeError, ValueError):
        raise UsageError("--gpus N is required: the GPUs per node the job asks for (e.g. --gpus 8).") from None
    if not image:
        lk = L.load_lock(str(cuda), lockfiles)
        rec = (lk.get("pushed") or {}).get("runtime")
        if not rec:
            raise LockError(f"The lockfile for CUDA {cuda} records no pushed runtime image; run `invoke push "
                            f"--cuda {cuda} --registry ...` or pass --image REGISTRY/NAME@sha256:...")
        image = L.checked_push(rec, "runtime", f"the CUDA {cuda} lockfile")["reference"]
    loopback = "refuse" if refuse_loopback else "warn"
    problem = cluster.loopback_problem(parse_reference(image))
    if problem and not refuse_loopback:
        _say(f"WARNING: {problem}")
    if scheduler == "slurm":
        text = cluster.slurm_script(image, gpus=n_gpus, nodes=n_nodes, toolchain=str(cuda), partition=partition,
                                    account=account, time_limit=time, probe_args=probe_arg or ["--runtime"],
                                    loopback=loopback, server_args=str(server_args or ""), env=env or ())
        out = output or str(PROJECT_ROOT / f"stackprobe-cu{cuda}.sbatch")
    else:
        job = cluster.kubernetes_job(image, gpus=n_gpus, nodes=n_nodes, toolchain=str(cuda), namespace=namespace,
                                     host_path=host_path, image_pull_secret=pull_secret,
                                     probe_args=probe_arg or ["--runtime"], loopback=loopback,
                                     server_args=str(server_args or ""), env=env or ())
        version = cluster.validate_kubernetes(job)
        _say(f"the Job validates against the Kubernetes {version} schema")
        text = cluster.render_manifest(job)
        out = output or str(PROJECT_ROOT / f"stackprobe-cu{cuda}.k8s.yaml")
    cluster.write_job(out, text)
    print(out)


def bake(*, cuda="13.1", output="bake/docker-bake.json", arch=None, base=None, skip=None, recipes=None,
         state_dir=".stack", locked=False, lockfiles=None, method=None, source=None, builder=None, cache=None,
         cache_read_only=False):
    """`invoke bake`: write the build plan as a buildx bake file for remote BuildKit builders. Its flags' values as
    keywords (see :mod:`cudastack.cli.registry`); raises StackError."""
    from cudastack.build import bake as B
    from cudastack import lock as L
    if locked:
        arch, base, skip = L.plan_options(str(cuda), arch, base, skip, lockfiles)
    bx = None
    if builder:
        from cudastack.build.builders import inspect_builder
        bx = inspect_builder(str(builder))      # before anything is written
    if method or source:
        from cudastack.recipes.load import load_recipes
        from cudastack.recipes.select import select_methods
        from cudastack.jobs.build import _pairs
        recipes = select_methods(load_recipes(recipes), str(cuda), _pairs("method", method),
                                 _pairs("source", source))
    plan = _plan(cuda, arch, base, skip, recipes)
    lk = None
    if locked:
        path = L.lock_path(plan.toolchain, lockfiles)
        lk = L.load_lock(path)
        L.verify_plan_against_lock(plan, lk, where=str(path))
    node_cache = None
    from cudastack.build.node_cache import NodeCache, cache_prefix
    prefix = cache_prefix(cache)
    if cache_read_only and not prefix:
        raise UsageError("--cache-read-only needs a node cache: add --cache REGISTRY/PREFIX or set "
                         "CUDASTACK_NODE_CACHE.")
    if prefix:
        from cudastack.core.docker_engine import docker_client
        node_cache = NodeCache.open(prefix, docker_client(), read_only=cache_read_only)
    data = B.write_bake(plan, output, state_dir=state_dir, lock=lk, cache=node_cache)
    for name, ref in (data.get("x-cudastack-served") or {}).items():
        print(f"{name}: in the node cache ({ref}), no target", file=sys.stderr)
    print(output)
    if bx is not None:
        run = (f"docker --context {bx.endpoint} buildx bake" if bx.driver == "docker"
               else f"docker buildx bake --builder {bx.name}")
        print(f"run it on {bx.name} ({bx.driver}): {run} -f {output}")
