"""Invoke tasks (build): build, plan, bootstrap-base. Thin: parse flags, call cudastack.jobs.build."""
from __future__ import annotations

from cudastack.cli.common import stack_task
from cudastack.jobs import build as jobs

#: the base image kinds (recipes/toolchains.yaml: base.pip / base.nvidia)
BASES = ("pip", "nvidia")

_HELP = {
    "json": "Write the result as JSON to FILE, or to standard output with - (then alone there: the human lines go to "
            "standard error).",
    "cuda": "CUDA toolchain to build for, as named in recipes/toolchains.yaml (e.g. 13.1, 12.8).",
    "arch": "Target arch list (compute capabilities, ';'- or ','-separated): 12.0, 12.0a, 12.0f, 9.0;12.0. "
            "Default 12.0 (RTX PRO 6000 Blackwell / RTX 50xx).",
    "base": "Base image: 'pip' (an OS image + PyPI's CUDA toolkit wheels) or 'nvidia' (nvidia/cuda devel image). "
            "Default: the toolchain's default_base (pip for 13.1, nvidia for 12.8).",
    "dry_run": "Print the plan (every node, its hash, cached or not, every knob with its value and source) "
               "and build nothing.",
    "skip": "Leave a component out (repeatable): --skip flash-attn --skip sgl-kernel. The runtime image is "
            "built without its wheels.",
    "only": "Build only this node and what it needs (repeatable): --only vllm builds the vLLM runtime image on its "
            "own torch and the base, and nothing of SGLang's stack. The same as --skip of every other component.",
    "max_jobs": "Override MAX_JOBS (compile jobs) of source builds; default from the memory rule.",
    "nvcc_threads": "Override NVCC_THREADS (threads per nvcc job) of source builds; default from the memory rule.",
    "ca_bundle": "CA bundle (PEM) given to builds as the BuildKit secret 'cabundle' for an intercepting HTTPS "
                 "proxy; never stored in a layer. Default: the system bundle where one exists.",
    "recipes": "Recipes folder (toolchains.yaml + one file per component). Default: the project's recipes/.",
    "state_dir": "Folder for the wheelhouse, build logs and build records. Default: .stack/ in the project root.",
    "lockfiles": "Folder of the lockfiles (<toolchain>.lock.yaml) for --locked. Default: the project's lockfiles/.",
    "prefix": "Repository prefix of every node's image tag (default cudastack: cudastack/cu13.1-pip-sm120-runtime:"
              "<hash>). The tests use cudastack-test.",
    "method": "Choose a component's method for this toolchain (repeatable): --method torch=source --method "
              "sgl-kernel=source builds them from the source block of their recipe (default: the recipe's method).",
    "source": "A local source folder for a source build (repeatable): --source sgl-kernel=~/src/sglang/sgl-kernel "
              "(replaces the recipe's url/git location; its patches still apply).",
    "builder": "Send source nodes to this buildx builder (docker buildx create --name NAME ...); their wheels come "
               "back to the wheelhouse. See --builder-nodes.",
    "builder_nodes": "With --builder: 'source' (default: the nodes that compile, source and aot builds) or 'all' (every node but the base).",
    "cache": "A registry node cache, REGISTRY[:PORT]/PREFIX (default: $CUDASTACK_NODE_CACHE): a node the registry "
             "holds under its hash tag is pulled instead of built (under --locked, checked against the lock); a node "
             "built here is pushed there. The login comes from `docker login`.",
    "cache_read_only": "With --cache: pull from the node cache, never push to it.",
    "cache_optional": "With --cache: when the registry does not answer, warn and build without it (default: stop "
                      "with exit 8 before any work).",
    "locked": "Build only what lockfiles/<cuda>.lock.yaml pins (hash-checking pip installs, base digest); the plan "
              "is verified against the lock first, and the build's outputs are recorded into it.",
}


@stack_task(root_defaults=["state_dir"], choices={"base": BASES, "builder_nodes": ("source", "all")},
            ints=["max_jobs", "nvcc_threads"], help=_HELP, iterable=["skip", "method", "source", "only"], auto_shortflags=False)
def build(c, cuda="13.1", arch=None, base=None, dry_run=False, skip=None, max_jobs=None, nvcc_threads=None,
          ca_bundle=None, recipes=None, state_dir=".stack", locked=False, prefix=None,
          lockfiles=None, method=None, source=None, builder=None, builder_nodes="source", cache=None,
          cache_read_only=False, cache_optional=False, only=None, json=None):
    """Build a toolchain's images (base -> torch -> wheels -> runtime) with BuildKit; cached nodes are skipped."""
    flags = {name: value for name, value in locals().items() if name not in ("c", "json")}   # the parameters only
    return jobs.build(jobs.BuildOptions(**flags, json_out=json))


@stack_task(root_defaults=["state_dir"], choices={"base": BASES}, ints=["max_jobs", "nvcc_threads"],
            help={k: _HELP[k] for k in ("cuda", "arch", "base", "skip", "max_jobs", "nvcc_threads", "recipes",
                                  "state_dir", "method", "source", "only", "json")}, iterable=["skip", "method", "source", "only"],
      auto_shortflags=False)
def plan(c, cuda="13.1", arch=None, base=None, skip=None, max_jobs=None, nvcc_threads=None, recipes=None,
         state_dir=".stack", method=None, source=None, only=None, json=None):
    """Print the build plan (same as build --dry-run)."""
    return jobs.plan(cuda=cuda, arch=arch, base=base, skip=skip, max_jobs=max_jobs, nvcc_threads=nvcc_threads,
                     recipes=recipes, state_dir=state_dir, method=method, source=source, only=only, json_out=json)


@stack_task(help={"suite": "Debian suite to bootstrap (default bookworm).",
            "mirror": "Debian mirror URL (default http://deb.debian.org/debian).",
            "tag": "Local image tag (default: the tag the toolchains' pip base uses, cudastack/debian:<suite>)."})
def bootstrap_base(c, suite="bookworm", mirror=None, tag=None):
    """Make the OS image of the 'pip' base with mmdebstrap (reproducible: the same id on any machine) + docker load."""
    return jobs.bootstrap_base(suite=suite, mirror=mirror, tag=tag)


TASKS: list = [build, plan, bootstrap_base]
