"""Invoke tasks (registry): lock, push, pull, cluster-job, bake. Thin: parse flags, call cudastack.jobs.registry."""
from __future__ import annotations

from cudastack.cli.common import stack_task
from cudastack.jobs import registry as jobs

#: the base image kinds (recipes/toolchains.yaml: base.pip / base.nvidia)
BASES = ("pip", "nvidia")

_PLAN_HELP = {
    "cuda": "CUDA toolchain, as named in recipes/toolchains.yaml (e.g. 13.1, 12.8).",
    "arch": "Target arch list (e.g. 12.0, 12.0a, 9.0;12.0). Default 12.0.",
    "base": "Base image kind: 'pip' or 'nvidia'. Default: the toolchain's default_base.",
    "skip": "Leave a component out (repeatable), as for `invoke build`.",
    "recipes": "Recipes folder. Default: the project's recipes/.",
    "lockfiles": "Folder of the lockfiles (<toolchain>.lock.yaml). Default: the project's lockfiles/.",
}


@stack_task(choices={"base": BASES, "resolver": ("pip", "uv")}, help={**_PLAN_HELP,
            "python": "Interpreter whose pip (>= 22.2) resolves; its major.minor must equal the images' Python "
                      "(default: this one).",
            "glibc": "glibc version of the images (2.N) for the manylinux platform tags; default: asked of the "
                     "local OS image, else known from the base's distribution.",
            "find_links": "Extra folder of distributions pip may use (repeatable).",
            "resolver": "Resolver of the pip installs: 'uv' (uv pip compile for the target platform and Python; "
                        "the default) or 'pip' (pip's installation report). Both pin the same closures on the "
                        "12.8 and 13.1 plans (results/resolver/).",
            "json": "Write the new lock (the YAML's content) as JSON to FILE, or to standard output with - (then "
                    "alone there: the human lines go to standard error).",
            "node": "Refresh only this node's entry (repeatable); every other node keeps the existing lock's entry "
                    "byte for byte, and each kept entry a fresh resolution would have moved is reported."},
      iterable=["skip", "find_links", "node"], auto_shortflags=False)
def lock(c, cuda="13.1", arch=None, base=None, skip=None, recipes=None, lockfiles=None, python=None, glibc=None,
         find_links=None, resolver=None, node=None, json=None):
    """Pin every input of the plan into lockfiles/<toolchain>.lock.yaml.

    Base image, OS snapshot, every pip package's closure with sha256, sdists and git commits; written
    atomically."""
    return jobs.lock(cuda=cuda, arch=arch, base=base, skip=skip, recipes=recipes, lockfiles=lockfiles, python=python,
                     glibc=glibc, find_links=find_links, resolver=resolver, node=node, json_out=json)


@stack_task(choices={"base": BASES}, help={**_PLAN_HELP,
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
    return jobs.push(cuda=cuda, registry=registry, node=node, all_nodes=all_nodes, arch=arch, base=base, skip=skip,
                     recipes=recipes, lockfiles=lockfiles)


@stack_task(help={"cuda": _PLAN_HELP["cuda"], "lockfiles": _PLAN_HELP["lockfiles"],
            "node": "Node whose pushed image to pull (default runtime)."}, auto_shortflags=False)
def pull(c, cuda="13.1", node="runtime", lockfiles=None):
    """Pull the image the lockfile records by digest (the only mode: a cluster runs what was validated) and verify it (registry digest, RepoDigests, image id)."""
    return jobs.pull(cuda=cuda, node=node, lockfiles=lockfiles)


@stack_task(choices={"scheduler": ("slurm", "kubernetes")}, ints=["gpus"],
            help={"cuda": _PLAN_HELP["cuda"], "lockfiles": _PLAN_HELP["lockfiles"],
            "scheduler": "Required: slurm (sbatch script with pyxis --container-image) or kubernetes (batch/v1 Job).",
            "gpus": "Required: GPUs per node.",
            "nodes": "Number of nodes to validate (one suite run per node). Default 1.",
            "image": "Image reference with a digest; default: the runtime image the lockfile records as pushed.",
            "output": "File to write. Default: stackprobe-cu<toolchain>.sbatch / .k8s.yaml in the project root.",
            "partition": "Slurm partition.", "account": "Slurm account.",
            "time": "Slurm time limit ([D-]HH:MM:SS). Default 01:00:00.",
            "namespace": "Kubernetes namespace. Default 'default'.",
            "host_path": "Kubernetes: keep the JSON reports in this folder on each node (hostPath); default: "
                         "an emptyDir, the reports are printed to the pod log.",
            "pull_secret": "Kubernetes: name of an imagePullSecret (credentials stay in the cluster).",
            "refuse_loopback": "Refuse a loopback registry (127.0.0.1, localhost) instead of warning: compute nodes "
                               "cannot reach it.",
            "probe_arg": "Argument for `python -m stackprobe` (repeatable), e.g. --probe-arg=--arch "
                         "--probe-arg=12.0. Default: --runtime (static and runtime tiers on the node's GPUs).",
            "server_args": "The serving engine's flags the node's answer is for, one quoted string (as for invoke "
                           "validate), e.g. --server-args \"--enable-symm-mem\"; passed to the suite in the job.",
            "env": "NAME=VALUE of the serving engine the node's answer is for (repeatable), e.g. "
                   "--env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1; passed to the suite in the job."},
      iterable=["probe_arg", "env"], auto_shortflags=False)
def cluster_job(c, cuda="13.1", scheduler=None, gpus=None, nodes=1, image=None, output=None, partition=None,
                account=None, time="01:00:00", namespace="default", host_path=None, pull_secret=None,
                probe_arg=None, lockfiles=None, refuse_loopback=False, server_args="", env=None):
    """Write a Slurm script or Kubernetes Job that validates GPU nodes from the pinned digest.

    The job runs the validation suite in the image pinned by digest on each GPU node and keeps its JSON reports;
    it stops on enroot older than 4.0.0 and warns on (or, with --refuse-loopback, refuses) a loopback registry."""
    return jobs.cluster_job(cuda=cuda, scheduler=scheduler, gpus=gpus, nodes=nodes, image=image, output=output,
                            partition=partition, account=account, time=time, namespace=namespace, host_path=host_path,
                            pull_secret=pull_secret, probe_arg=probe_arg, lockfiles=lockfiles,
                            refuse_loopback=refuse_loopback, server_args=server_args, env=env)


@stack_task(root_defaults=["output", "state_dir"], choices={"base": BASES}, help={**_PLAN_HELP,
            "output": "Bake file to write (JSON). Default: bake/docker-bake.json in the project root; build contexts "
                      "go next to it.",
            "state_dir": "Folder of the local wheelhouse (as for invoke build). Default .stack/ in the project root.",
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
    return jobs.bake(cuda=cuda, output=output, arch=arch, base=base, skip=skip, recipes=recipes, state_dir=state_dir,
                     locked=locked, lockfiles=lockfiles, method=method, source=source, builder=builder, cache=cache,
                     cache_read_only=cache_read_only)


TASKS: list = [lock, push, pull, cluster_job, bake]
