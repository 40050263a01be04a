"""Invoke tasks (registry): lock, push, pull, cluster-job, bake. Thin: parse flags, call the package, map
StackError to its exit code."""
from __future__ import annotations

import sys

from invoke import Exit, task

from cudastack.core.errors import LockError, StackError, UsageError

_PLAN_HELP = {
    "cuda": "CUDA toolchain, as named in recipes/toolchains.yaml (e.g. 13.1, 12.8).",
    "arch": "Target arch list (e.g. 12.0, 12.0a, 9.0;12.0). Default 12.0.",
    "base": "Base image kind: 'pip' or 'nvidia'. Default: the toolchain's default_base.",
    "skip": "Leave a component out (repeatable), as for `invoke build`.",
    "recipes": "Recipes folder. Default: the project's recipes/.",
    "lockfiles": "Folder of the lockfiles (<toolchain>.lock.yaml). Default: the project's lockfiles/.",
}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fail(exc: StackError):
    raise Exit(f"error: {exc}", code=exc.exit_code)


def _plan(cuda, arch, base, skip, recipes):
    from cudastack.plan.planner import make_plan

    return make_plan(recipes, str(cuda), archs=arch, base=base, skip=skip or ())


def _node(plan, name):
    try:
        return plan.node(name)
    except KeyError:
        raise UsageError(f"--node {name!r} is not in the plan; nodes: {', '.join(n.name for n in plan.nodes)}.") from None


@task(help={**_PLAN_HELP,
            "python": "Interpreter whose pip (>= 22.2) resolves; its major.minor must equal the images' Python "
                      "(default: this one).",
            "glibc": "glibc version of the images (2.N) for the manylinux platform tags; default: asked of the "
                     "local OS image, else known from the base's distribution.",
            "find_links": "Extra folder of distributions pip may use (repeatable).",
            "resolver": "Resolver of the pip installs: 'uv' (uv pip compile for the target platform and Python; "
                        "the default) or 'pip' (pip's installation report). Both pin the same closures on the "
                        "12.8 and 13.1 plans (results/resolver/).",
            "node": "Refresh only this node's entry (repeatable); every other node keeps the existing lock's entry "
                    "byte for byte, and each kept entry a fresh resolution would have moved is reported."},
      iterable=["skip", "find_links", "node"], auto_shortflags=False)
def lock(c, cuda="13.1", arch=None, base=None, skip=None, recipes=None, lockfiles=None, python=None, glibc=None,
         find_links=None, resolver=None, node=None):
    """Pin every input of the plan into lockfiles/<toolchain>.lock.yaml.

    Base image, OS snapshot, every pip package's closure with sha256, sdists and git commits; written
    atomically."""
    from cudastack import lock as L
    from cudastack.lock.resolve_uv import choose_resolver

    try:
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
        print(L.summary(lk))
        print(f"wrote {path}")
    except StackError as exc:
        _fail(exc)


@task(help={**_PLAN_HELP,
            "registry": "Where to push: HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000/cudastack or "
                        "registry.example.com/ml. Credentials come from the Docker credential store (docker login).",
            "node": "Node to push (default runtime).",
            "all_nodes": "Push every image node of the plan (base, torch, ..., runtime), not only --node."},
      iterable=["skip"], auto_shortflags=False)
def push(c, cuda="13.1", registry=None, node="runtime", all_nodes=False, arch=None, base=None, skip=None,
         recipes=None, lockfiles=None):
    """Push the locked build's images and record their digests in the lockfile.

    Reads the digest the registry reports (through the engine), checks it against the local image and records
    registry/name@sha256:... and registry#name@sha256:... in the lockfile."""
    from cudastack import lock as L
    from cudastack.registry import client as R

    try:
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
    except StackError as exc:
        _fail(exc)


@task(help={"cuda": _PLAN_HELP["cuda"], "lockfiles": _PLAN_HELP["lockfiles"],
            "node": "Node whose pushed image to pull (default runtime)."}, auto_shortflags=False)
def pull(c, cuda="13.1", node="runtime", lockfiles=None):
    """Pull the image the lockfile records by digest (the only mode: a cluster runs what was validated) and verify it (registry digest, RepoDigests, image id)."""
    from cudastack import lock as L

    try:
        path = L.lock_path(str(cuda), lockfiles)
        image = L.pull_locked(path, node=node, progress=_say)
        print(f"{image.attrs.get('RepoDigests')[0] if image.attrs.get('RepoDigests') else image.id} -> {image.id}")
    except StackError as exc:
        _fail(exc)


@task(help={"cuda": _PLAN_HELP["cuda"], "lockfiles": _PLAN_HELP["lockfiles"],
            "scheduler": "slurm (sbatch script with pyxis --container-image) or kubernetes (batch/v1 Job).",
            "gpus": "GPUs per node.",
            "nodes": "Number of nodes to validate (one suite run per node). Default 1.",
            "image": "Image reference with a digest; default: the runtime image the lockfile records as pushed.",
            "output": "File to write. Default: stackprobe-cu<toolchain>.sbatch / .k8s.yaml.",
            "partition": "Slurm partition.", "account": "Slurm account.",
            "time": "Slurm time limit ([D-]HH:MM:SS). Default 01:00:00.",
            "namespace": "Kubernetes namespace. Default 'default'.",
            "host_path": "Kubernetes: keep the JSON reports in this folder on each node (hostPath); default: "
                         "an emptyDir, the reports are printed to the pod log.",
            "pull_secret": "Kubernetes: name of an imagePullSecret (credentials stay in the cluster).",
            "refuse_loopback": "Refuse a loopback registry (127.0.0.1, localhost) instead of warning: compute nodes "
                               "cannot reach it.",
            "probe_arg": "Argument for `python -m stackprobe` (repeatable), e.g. --probe-arg=--target-arch "
                         "--probe-arg=12.0. Default: --runtime (static and runtime tiers on the node's GPUs).",
            "server_args": "The SGLang server flags the node's answer is for, one quoted string (as for invoke "
                           "validate), e.g. --server-args \"--enable-symm-mem\"; passed to the suite in the job.",
            "env": "NAME=VALUE of the SGLang server the node's answer is for (repeatable), e.g. "
                   "--env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1; passed to the suite in the job."},
      iterable=["probe_arg", "env"], auto_shortflags=False)
def cluster_job(c, cuda="13.1", scheduler=None, gpus=None, nodes=1, image=None, output=None, partition=None,
                account=None, time="01:00:00", namespace="default", host_path=None, pull_secret=None,
                probe_arg=None, lockfiles=None, refuse_loopback=False, server_args="", env=None):
    """Write a Slurm script or Kubernetes Job that validates GPU nodes from the pinned digest.

    The job runs the validation suite in the image pinned by digest on each GPU node and keeps its JSON reports;
    it stops on enroot older than 4.0.0 and warns on (or, with --refuse-loopback, refuses) a loopback registry."""
    from cudastack.registry import cluster
    from cudastack import lock as L
    from cudastack.registry.reference import parse_reference

    try:
        if scheduler not in ("slurm", "kubernetes"):
            raise UsageError("--scheduler must be 'slurm' or 'kubernetes'.")
        if scheduler == "kubernetes":
            cluster.require_kubernetes_validator()      # before any work: the Job is written checked or not at all
        try:
            n_gpus, n_nodes = int(gpus), int(nodes)
        except (TypeError, ValueError):
            raise UsageError("--gpus N (GPUs per node) and --nodes K must be whole numbers.") from None
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
            out = output or f"stackprobe-cu{cuda}.sbatch"
        else:
            job = cluster.kubernetes_job(image, gpus=n_gpus, nodes=n_nodes, toolchain=str(cuda), namespace=namespace,
                                         host_path=host_path, image_pull_secret=pull_secret,
                                         probe_args=probe_arg or ["--runtime"], loopback=loopback,
                                         server_args=str(server_args or ""), env=env or ())
            version = cluster.validate_kubernetes(job)
            _say(f"the Job validates against the Kubernetes {version} schema")
            text = cluster.render_manifest(job)
            out = output or f"stackprobe-cu{cuda}.k8s.yaml"
        cluster.write_job(out, text)
        print(out)
    except StackError as exc:
        _fail(exc)


@task(help={**_PLAN_HELP,
            "output": "Bake file to write (JSON). Default: bake/docker-bake.json; build contexts go next to it.",
            "state_dir": "Folder of the local wheelhouse (as for invoke build). Default .stack/",
            "locked": "Add the lockfile's hash-checking build args to every target (verifies the lock first).",
            "method": "As for invoke build: --method torch=source puts the source build in the bake file.",
            "source": "As for invoke build: --source NAME=DIR, a local source folder for a source build.",
            "builder": "The buildx builder that will run the file: checked now (an unknown one is an error), and "
                       "the command to run printed.",
            "cache": "A registry node cache, REGISTRY[:PORT]/PREFIX (default: $CUDASTACK_NODE_CACHE): the nodes it "
                     "holds get no target (their children build FROM them by digest), and every other node a "
                     "'<name>-cache' target that pushes it there, as invoke build --cache does.",
            "cache_read_only": "With --cache: take nodes from the cache, add no push targets."},
      iterable=["skip", "method", "source"], auto_shortflags=False)
def bake(c, cuda="13.1", output="bake/docker-bake.json", arch=None, base=None, skip=None, recipes=None,
         state_dir=".stack", locked=False, lockfiles=None, method=None, source=None, builder=None, cache=None,
         cache_read_only=False):
    """Write the build plan as a buildx bake file for remote BuildKit builders.

    One target per node, parents chained through named contexts; run it with `docker buildx bake -f FILE`."""
    from cudastack.build import bake as B
    from cudastack import lock as L

    try:
        if locked:
            arch, base, skip = L.plan_options(str(cuda), arch, base, skip, lockfiles)
        bx = None
        if builder:
            from cudastack.build.builders import inspect_builder
            bx = inspect_builder(str(builder))      # before anything is written
        if method or source:
            from cudastack.recipes.load import load_recipes
            from cudastack.recipes.select import select_methods
            from cudastack.cli.build import _pairs
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
    except StackError as exc:
        _fail(exc)


TASKS: list = [lock, push, pull, cluster_job, bake]
