"""Invoke tasks (build). Thin: parse flags, call the package, map StackError to its exit code."""
from __future__ import annotations

import sys

from invoke import Exit, task

from cudastack.errors import StackError, UsageError

_HELP = {
    "cuda": "CUDA toolchain to build for, as named in recipes/toolchains.yaml (e.g. 13.1, 12.8).",
    "arch": "Target arch list (compute capabilities, ';'- or ','-separated): 12.0, 12.0a, 12.0f, 9.0;12.0. "
            "Default 12.0 (RTX PRO 6000 Blackwell / RTX 50xx).",
    "base": "Base image: 'pip' (an OS image + PyPI's CUDA toolkit wheels) or 'nvidia' (nvidia/cuda devel image). "
            "Default: the toolchain's default_base (pip for 13.1, nvidia for 12.8).",
    "dry_run": "Print the plan (every node, its hash, cached or not, every knob with its value and source) "
               "and build nothing.",
    "skip": "Leave a component out (repeatable): --skip flash-attn --skip sgl-kernel. The runtime image is "
            "built without its wheels.",
    "max_jobs": "Override MAX_JOBS (compile jobs) of source builds; default from the memory rule.",
    "nvcc_threads": "Override NVCC_THREADS (threads per nvcc job) of source builds; default from the memory rule.",
    "ca_bundle": "CA bundle (PEM) given to builds as the BuildKit secret 'cabundle' for an intercepting HTTPS "
                 "proxy; never stored in a layer. Default: the system bundle where one exists.",
    "recipes": "Recipes folder (toolchains.yaml + one file per component). Default: the project's recipes/.",
    "state_dir": "Folder for the wheelhouse, build logs and build records. Default: .stack/",
    "locked": "Build only what lockfiles/<cuda>.lock.yaml pins (hash-checking pip installs, base digest); the plan "
              "is verified against the lock first, and the build's outputs are recorded into it.",
}


def _int(flag: str, value) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"--{flag} {value!r}: give a whole number.") from None


def _sigterm_as_interrupt() -> None:
    """SIGTERM (a stopped session or service) becomes KeyboardInterrupt, so the running docker build is
    cancelled and the build record says how far it got."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _fail(exc: StackError):
    raise Exit(f"error: {exc}", code=exc.exit_code)


def _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes, resources=None):
    from cudastack.plan import make_plan

    return make_plan(recipes, str(cuda), archs=arch, base=base, skip=skip or (),
                     max_jobs=_int("max-jobs", max_jobs), nvcc_threads=_int("nvcc-threads", nvcc_threads),
                     resources=resources)


@task(help=_HELP, iterable=["skip"], auto_shortflags=False)
def build(c, cuda="13.1", arch=None, base=None, dry_run=False, skip=None, max_jobs=None, nvcc_threads=None,
          ca_bundle=None, recipes=None, state_dir=".stack", locked=False):
    """Build a toolchain's images (base -> torch -> wheels -> runtime) with BuildKit; cached nodes are skipped."""
    from cudastack.build import dry_run as render_dry_run, run_build
    from cudastack.radar import refuse_engine_pin_conflicts

    try:
        if locked:
            from cudastack import lock as L

            # options not given come from the lock (its base, archs, skipped components)
            arch, base, skip = L.plan_options(str(cuda), arch, base, skip)
        if dry_run:
            plan = _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes)
            if locked:
                L.prepare_locked_build(plan, L.lock_path(plan.toolchain))
                print(f"locked build: {L.lock_path(plan.toolchain)} verified against the plan; locked tags below",
                      file=sys.stderr)
            print(render_dry_run(plan, state_dir=state_dir))
            refuse_engine_pin_conflicts(plan, say=lambda m: print(f"WARNING: {m}", file=sys.stderr))
            return
        from cudastack.engine import Engine

        plan = _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes)  # input errors before the daemon
        refuse_engine_pin_conflicts(plan)   # a new toolchain's pins against the engine's (index), before any build
        engine = Engine.connect()
        plan = _plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes, resources=engine.resources())
        for w in plan.warnings:
            print(f"warning: {w}", file=sys.stderr)
        lock_file = None
        if locked:
            lock_file = L.lock_path(plan.toolchain)
            L.prepare_locked_build(plan, lock_file, client=engine.client)
            print(f"locked build: {lock_file} verified against the plan", file=sys.stderr)
        _sigterm_as_interrupt()
        record = run_build(plan, state_dir=state_dir, ca_bundle=ca_bundle, engine=engine)
        if lock_file is not None:
            L.record_build_outputs(lock_file, record)
        print(record["record_path"])
    except StackError as exc:
        _fail(exc)


@task(help={k: _HELP[k] for k in ("cuda", "arch", "base", "skip", "max_jobs", "nvcc_threads", "recipes",
                                  "state_dir")}, iterable=["skip"], auto_shortflags=False)
def plan(c, cuda="13.1", arch=None, base=None, skip=None, max_jobs=None, nvcc_threads=None, recipes=None,
         state_dir=".stack"):
    """Print the build plan (same as build --dry-run)."""
    from cudastack.build import dry_run as render_dry_run

    try:
        print(render_dry_run(_plan(cuda, arch, base, skip, max_jobs, nvcc_threads, recipes), state_dir=state_dir))
    except StackError as exc:
        _fail(exc)


@task(help={"suite": "Debian suite to bootstrap (default bookworm).",
            "mirror": "Debian mirror URL (default http://deb.debian.org/debian).",
            "tag": "Local image tag (default: the tag the toolchains' pip base uses, cudastack/debian:<suite>)."})
def bootstrap_base(c, suite="bookworm", mirror=None, tag=None):
    """Make the OS image of the 'pip' base with debootstrap + docker import (no registry needed)."""
    from cudastack.bootstrap import DEFAULT_MIRROR, bootstrap_os_image

    try:
        image_id = bootstrap_os_image(suite, mirror or DEFAULT_MIRROR, tag or f"cudastack/debian:{suite}",
                                      progress=lambda s: print(s, file=sys.stderr, flush=True))
        print(image_id)
    except StackError as exc:
        _fail(exc)


TASKS: list = [build, plan, bootstrap_base]
