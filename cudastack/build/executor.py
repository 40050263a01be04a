"""Execute a Plan: skip cached nodes, build the rest with BuildKit, export wheels, write a build record.

For each node in topological order:

* **cached** when its tag exists in the engine (and, for a wheels node, the wheelhouse manifest lists
  that node at the same hash with every wheel file present and matching its sha256; for a runtime node, when
  its image's label ``org.cudastack.wheels`` matches the wheels the wheelhouse lists for its parents by the
  time the runtime is reached, :func:`cudastack.build.context.runtime_wheels_differ`): nothing runs, not
  even a ``docker build``; a no-op rebuild issues none at all.
* **base / image / runtime** nodes: one ``docker build -t <tag>``. BuildKit tags only a finished image,
  so a failing build leaves no tag on a broken image.
* **wheels** nodes: ``--target wheels --output type=local,dest=<tmp>`` exports just the wheel files to a
  temporary folder inside the state dir; their sha256 are computed, each file is moved into the
  wheelhouse with ``os.replace`` (atomic on one filesystem) and the manifest is rewritten atomically;
  only then is the builder stage tagged (``--target builder -t <tag>``, served from BuildKit's cache),
  which marks the node done. A failure anywhere leaves no half-written wheel in the wheelhouse and no tag.

A rerun after a failure resumes from the cached nodes. The OS image of a ``pip`` base is bootstrapped
(mmdebstrap + docker load, reproducible: :mod:`cudastack.osimage.bootstrap`) when its tag is missing.

State folder layout (default ``.stack/``)::

    wheelhouse/cu13.1/*.whl              the wheels (flat: pip install --find-links works)
    wheelhouse/cu13.1/manifest.json      {"nodes": {name: {"hash", "tag", "wheels": {file: sha256}}}}
    logs/<run id>/<node>.log             each node's full BuildKit log
    records/build-cu13.1-<run id>.json   the build record; records/latest-cu13.1.json the newest one

Run journal: the record is written (status "running", with this process's pid, its start time, host and run
lock: an flock held for the run's life, :class:`cudastack.build.journal.RunLock`) before the first docker build and rewritten as each node starts ("building") and ends, so a run killed
outright (SIGKILL, OOM killer, power loss) leaves a record that says how far it got. The next run of that
toolchain finds a "running" record whose process is gone, rewrites it as "interrupted" (the node it was
building too) and says so, and removes the stale ``.export-<node>-p<pid>-*`` folders such runs leave beside
the wheelhouse (a folder whose pid is alive belongs to a build still running and is kept).

Build record (JSON): ``{"format": 1, "run_id", "toolchain", "cuda_version", "archs", "base", "status"
("running" | "ok" | "failed" | "interrupted"), "pid", "host", "proc_start", "lock" (the run lock's path in the
state folder, or null where flock is not offered), "started", "finished" (UTC ISO 8601), "duration_s", "docker_builds" (how many docker
builds were issued), "wheelhouse", "nodes": [{"name", "kind", "method", "hash", "tag", "status" ("built" |
"skipped" | "failed" | "building" | "interrupted" | "not reached"), "duration_s", "image_id", "size_bytes", "log",
"wheels": {file: sha256}, "knobs": {name: value}, "child_pid" (the docker CLI of a node being built), "compiled" (the last ninja counter of a node that did not
finish, e.g. "12/73"), "sdist" (a patched sdist's file, sha256 and patches), "cache"}], "error"}``; with a node cache
also ``"cache"``, ``"cache_failures"`` and node statuses "pulling" / "pulled" (:mod:`cudastack.build.node_cache`).

Where the parts live: the wheelhouse and its manifest in :mod:`cudastack.build.wheelhouse`; build contexts,
sdists, the cached check and locked-build failures in :mod:`cudastack.build.context`; recovery of killed
runs in :mod:`cudastack.build.journal`; the preflight checks (disk, the OS image) and the run loop here.
Every name is importable from this module.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from cudastack.build.context import (WHEELS_LABEL, _ensure_os_image, _make_context, _preflight_disk, cached_map, locked_failure,
                                     runtime_wheels_differ, runtime_wheels_digest)
from cudastack.build.journal import RunLock, _proc_start, recover_interrupted, remove_stale_exports, remove_stale_locks
from cudastack.core.credentials import scrub
from cudastack.build.engine import Engine, _fmt_s, resolve_ca_bundle
from cudastack.registry.cache_parents import cache_reference
from cudastack.build.node_cache import push_node
from cudastack.core import stop
from cudastack.core.errors import BuildError, BuildInterrupted, EnvironmentError_, LockError, StackError
from cudastack.plan.planner import BuildPlan, PlannedNode, render_plan
from cudastack.build.wheelhouse import Wheelhouse
from stackprobe.atomic import write_atomic

RECORD_FORMAT = 1
Say = Callable[[str], None]


def _say_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_build(
    plan: BuildPlan,
    *,
    state_dir: str | Path = ".stack",
    ca_bundle: str | None = None,
    engine: Engine | None = None,
    say: Say | None = None,
    builder=None,
    builder_nodes: str = "source",
    cache=None,
) -> dict:
    """Build ``plan`` (see module doc) and return the build record (also written to the state dir).
    ``builder``: a :class:`cudastack.build.builders.Builder` the nodes ``builder_nodes`` selects ("source" | "all")
    are sent to (``docker buildx build --builder NAME``; see :mod:`cudastack.build.builders`). ``cache``: a
    :class:`cudastack.build.node_cache.NodeCache` (opened, so its registry answered): nodes it holds are pulled instead
    of built (record status "pulled"), nodes built here are pushed to it unless it is read-only; a failed pull
    builds the node, a failed push is reported in ``cache_failures`` and leaves the result as it is.

    Raises EnvironmentError_ (no daemon, no BuildKit path, too little disk) before any build and before the run
    journal is written (a refusal leaves no record), UsageError for a missing --ca-bundle, BuildError when a node
    fails (after writing a record with status "failed"; the error leads with the failing step's first error line,
    then its last lines and the log path), and BuildInterrupted (exit 130) when the run is stopped from outside
    at any point after the journal exists (Ctrl-C, SIGTERM: record status "interrupted", message from
    :func:`interrupted_message`).
    """
    with RunLock(Path(state_dir).resolve()) as run_lock:
        return _run_build(plan, state_dir=state_dir, ca_bundle=ca_bundle, engine=engine, say=say, builder=builder,
                          builder_nodes=builder_nodes, run_lock=run_lock, cache=cache)


def _run_build(plan: BuildPlan, *, state_dir: str | Path, ca_bundle: str | None, engine: Engine | None,  # noqa: C901, PLR0912, PLR0915 - reason: the build orchestrator; its split into named phases is issue 36 item 4, open
               say: Say | None, builder, builder_nodes: str, run_lock: RunLock, cache=None) -> dict:
    """:func:`run_build`'s body, run while this process holds ``run_lock`` (the journal's liveness mark)."""
    say = say or _say_default
    state = Path(state_dir).resolve()
    bundle = resolve_ca_bundle(ca_bundle)
    engine = engine or Engine.connect()
    wheelhouse = Wheelhouse(state / plan.wheelhouse)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")[:-4] + "Z"
    logs = state / "logs" / run_id
    ctx_root = state / "ctx"
    started = datetime.now(timezone.utc)
    t_run = time.monotonic()
    builds_before = engine.builds_issued

    rec_dir = state / "records"
    recover_interrupted(state, plan.toolchain, say)
    remove_stale_exports(wheelhouse.path.parent, say, locks=state / "locks")
    remove_stale_exports(state, say, ".secrets-*", "secret folder(s) of killed runs", locks=state / "locks")
    remove_stale_locks(state)

    cached = cached_map(engine, wheelhouse, plan)
    in_cache = cache.probe_plan(plan, cached, say) if cache is not None else {}
    pull = [n.name for n in plan.nodes if not cached[n.name] and in_cache.get(n.name)]
    todo = [n.name for n in plan.nodes if not cached[n.name] and not in_cache.get(n.name)]
    say(f"cuda {plan.toolchain} ({plan.cuda_version}), base {plan.base_kind}, archs {','.join(plan.target_archs)}: "
        f"{len(plan.nodes)} nodes, {len(plan.nodes) - len(todo) - len(pull)} cached"
        + (f", {len(pull)} in the node cache {cache.prefix}" if cache is not None else "")
        + f", {len(todo)} to build [{engine.buildkit.describe()}]")
    import socket

    record: dict[str, Any] = {
        "format": RECORD_FORMAT, "run_id": run_id, "toolchain": plan.toolchain, "cuda_version": plan.cuda_version,
        "archs": plan.target_archs, "base": plan.base_kind, "base_image": plan.base_image,
        "recipes": plan.recipes_dir, "skipped_components": plan.skipped, "status": "running",
        "pid": os.getpid(), "proc_start": _proc_start(os.getpid()), "host": socket.gethostname(),
        "lock": run_lock.name,
        "started": started.isoformat(timespec="seconds"), "finished": None, "duration_s": None,
        "docker_builds": 0, "wheelhouse": str(wheelhouse.path), "buildkit": engine.buildkit.describe(),
        "nodes": [{"name": node.name, "kind": node.kind, "method": node.method, "hash": node.hash,
                   "plan_hash": (node.inputs or {}).get("plan_hash", node.hash), "tag": node.tag,
                   "status": "not reached", "duration_s": 0.0, "image_id": None, "size_bytes": None, "log": None,
                   "wheels": {}, "knobs": {k.name: k.value for k in node.knobs}} for node in plan.nodes],
        "error": None,
    }
    if cache is not None:
        record["cache"] = {"prefix": cache.prefix, "read_only": cache.read_only}
        record["cache_failures"] = cache.failures
    rec_path = rec_dir / f"build-cu{plan.toolchain}-{run_id}.json"

    def journal() -> None:
        """Write the record as it stands (the run journal), to the run's file and to latest; URL logins are
        scrubbed (credentials.scrub)."""
        text = json.dumps(scrub(record), indent=2) + "\n"
        write_atomic(rec_path, text)
        write_atomic(rec_dir / f"latest-cu{plan.toolchain}.json", text)

    if todo or pull:
        # the disk check refuses before the journal exists: a refusal leaves no record a later run could
        # mistake for an interrupted build
        _preflight_disk(engine, plan, cached, state, say)
        journal()           # before anything expensive: a run killed from here on leaves a "running" record
    error: StackError | None = None
    doing = "starting"             # what the run is doing outside a node's build, for the account of a stop
    try:
        if todo or pull:
            if plan.nodes and plan.nodes[0].name in todo:
                doing = f"making the OS image {plan.base_image} (before the first node)"
                _ensure_os_image(engine, plan, say)
            if bundle:
                say(f"CA bundle for builds: {bundle} (BuildKit secret 'cabundle', never in a layer)")

        secrets = {"cabundle": bundle} if bundle else {}
        cache_refs: dict[str, str | None] = {}     # a node's tag -> the node cache's entry of that very image, or None
        for i, (node, entry) in enumerate(zip(plan.nodes, record["nodes"]), 1):
            if error is not None:
                continue
            doing = f"between nodes (before {node.name})"
            if cached[node.name] and (why := runtime_wheels_differ(engine, wheelhouse, node)):
                say(f"[{i}/{len(plan.nodes)}] {node.name}: {node.tag} exists, but {why}: building it again")
                cached[node.name] = False
            if cached[node.name]:
                doing = f"checking the cached node {node.name}"
                entry["status"] = "skipped"
                info = engine.inspect(node.tag)
                entry["image_id"], entry["size_bytes"] = info["id"], info["size_bytes"]
                if node.kind == "wheels":
                    entry["wheels"] = (wheelhouse.entry(node.name) or {}).get("wheels", {})
                    if (info.get("labels") or {}).get("org.cudastack.builder"):     # a marker (_mark_local)
                        entry["builder"] = info["labels"]["org.cudastack.builder"]
                say(f"[{i}/{len(plan.nodes)}] {node.name}: cached ({node.tag})")
                if cache is not None and not cache.read_only and node.name in in_cache and not in_cache[node.name]:
                    if entry.get("builder"):     # only a marker here: its wheels image is on that builder
                        say(f"warning: [{i}/{len(plan.nodes)}] {node.name}: not pushed to the node cache: this engine "
                            f"holds only a marker of it (built on builder {entry['builder']}); rebuild it there with "
                            "--cache to fill the cache")
                    else:
                        doing = f"pushing {node.name} to the node cache"
                        push_node(cache, node, entry, say, f"[{i}/{len(plan.nodes)}] {node.name}")
                cache_refs[node.tag] = cache_reference(cache, node, entry, in_cache.get(node.name))
                continue
            if in_cache.get(node.name):
                from cudastack.build.node_cache import serve_node

                entry["status"] = "pulling"
                journal()
                try:
                    doing = f"pulling {node.name} from the node cache"
                    if serve_node(cache, node, in_cache[node.name], entry, wheelhouse, say, f"[{i}/{len(plan.nodes)}]"):
                        cache_refs[node.tag] = cache_reference(cache, node, entry, in_cache.get(node.name))
                        journal()
                        continue
                except LockError as exc:
                    error = exc
                    record["error"] = str(exc)
                    journal()
                    continue
            say(f"[{i}/{len(plan.nodes)}] {node.name}: building {node.tag}"
                + (f" ({', '.join(f'{k.name}={k.value}' for k in node.knobs if k.name in node.parallel_knobs)})"
                   if node.parallel_knobs else ""))
            log = logs / f"{node.name}.log"
            entry["log"] = str(log)
            entry["status"] = "building"
            journal()

            def on_child(pid: int, entry=entry) -> None:
                entry["child_pid"] = pid
                journal()

            engine.on_child = on_child
            t0 = time.monotonic()
            tmp_out = None
            ctx = None
            secret_dir = None
            try:
                if node.kind == "base-pip":
                    _ensure_os_image(engine, plan, say)      # a base whose pull failed is built after all
                ctx, extra = _make_context(ctx_root, node, wheelhouse, plan, ca_bundle=bundle, say=say)
                if "_sdist" in extra:
                    entry["sdist"] = extra.pop("_sdist")
                if "_source" in extra:
                    entry["source"] = extra.pop("_source")
                args = dict(node.build_args)
                args.update(extra)
                args = {k: v for k, v in args.items() if not (k == "WHEEL_NAMES" and node.kind != "runtime")}
                labels = {"org.cudastack.node": node.name, "org.cudastack.hash": node.hash,
                          "org.cudastack.toolchain": plan.toolchain}
                if node.kind == "runtime":
                    labels[WHEELS_LABEL] = runtime_wheels_digest(wheelhouse, node)
                node_secrets = dict(secrets)
                if node.index_secret:       # a private index with a login: a BuildKit secret, never a build arg
                    secret_dir = Path(tempfile.mkdtemp(prefix=f".secrets-p{os.getpid()}-", dir=state))   # 0700
                    (secret_dir / "pipindex").touch(mode=0o600)
                    (secret_dir / "pipindex").write_text(node.index_secret)
                    node_secrets["pipindex"] = str(secret_dir / "pipindex")
                common = dict(context=str(ctx), dockerfile=str(_abs_dockerfile(node)), build_args=args,
                              secrets=node_secrets, labels=labels)
                remote = None
                if builder is not None:
                    from cudastack.build.builders import sent

                    if sent(node, builder_nodes):
                        remote = builder.name
                        entry["builder"] = remote
                        common["builder"] = builder
                        say(f"[{i}/{len(plan.nodes)}] {node.name}: on builder {remote} ({builder.driver})")
                        if cache_refs.get(args.get("PARENT_IMAGE", "")):    # the builder pulls it by digest itself
                            entry["parent_from_cache"] = cache_refs[args["PARENT_IMAGE"]]
                            common["build_args"] = {**args, "PARENT_IMAGE": entry["parent_from_cache"]}
                            say(f"[{i}/{len(plan.nodes)}] {node.name}: its parent comes to builder {remote} from the node "
                                f"cache ({entry['parent_from_cache']})")
                if node.kind == "wheels":
                    wheelhouse.path.mkdir(parents=True, exist_ok=True)
                    tmp_out = Path(tempfile.mkdtemp(prefix=f".export-{node.name}-p{os.getpid()}-", dir=wheelhouse.path.parent))
                    engine.build(name=node.name, log_path=log, say=say, target="wheels", output_dir=str(tmp_out), **common)
                    entry["wheels"] = wheelhouse.add(node, tmp_out)
                    if remote:
                        _mark_local(engine, node, ctx_root, args, labels, remote, log, say)
                    else:
                        engine.build(name=f"{node.name} (tag builder)", log_path=log, say=say, target="builder",
                                     tag=node.tag, **common)
                else:
                    engine.build(name=node.name, log_path=log, say=say, tag=node.tag, **common)
                    if remote and not engine.exists(node.tag):
                        raise BuildError(f"Builder {remote} built {node.name} but kept the image in its own engine "
                                         f"({builder.driver} driver, {builder.endpoint}): this engine has no {node.tag}. "
                                         "Use a docker-container, remote or Kubernetes builder (they send the image back "
                                         "with --load), or send only wheels nodes (--builder-nodes source).")
                info = engine.inspect(node.tag)
                entry.update(status="built", image_id=info["id"], size_bytes=info["size_bytes"])
                entry["duration_s"] = round(time.monotonic() - t0, 1)
                size = f", {info['size_bytes'] / 2**30:.2f} GiB" if info["size_bytes"] else ""
                wheels = f", wheels: {', '.join(entry['wheels'])}" if entry["wheels"] else ""
                say(f"[{i}/{len(plan.nodes)}] {node.name}: built in {_fmt_s(entry['duration_s'])}{size}{wheels}")
                if cache is not None and not cache.read_only:
                    journal()
                    if entry.get("builder") and node.kind == "wheels":    # this engine holds only its marker
                        from cudastack.build.builders import push_from_builder

                        push_from_builder(cache, engine, node, entry, common, log, say, f"[{i}/{len(plan.nodes)}] {node.name}")
                    else:
                        doing = f"pushing {node.name} to the node cache"
                        push_node(cache, node, entry, say, f"[{i}/{len(plan.nodes)}] {node.name}")
            except StackError as exc:
                if isinstance(exc, BuildError) and getattr(plan, "locked", False):
                    exc = locked_failure(node.name, log) or exc
                entry["status"] = "failed"
                entry["duration_s"] = round(time.monotonic() - t0, 1)
                if counter := getattr(exc, "counter", ""):
                    entry["compiled"] = counter
                error = exc
                record["error"] = str(exc)
            except KeyboardInterrupt as exc:
                # stopped from outside (Ctrl-C, SIGTERM): record how far the node got, then stop
                stop.note()
                entry["status"] = "interrupted"
                entry["duration_s"] = round(time.monotonic() - t0, 1)
                if counter := getattr(exc, "counter", ""):
                    entry["compiled"] = counter
                error = BuildInterrupted("interrupted")      # its message is written once the record is complete
            finally:
                engine.on_child = None
                entry.pop("child_pid", None)
                if tmp_out is not None:
                    shutil.rmtree(tmp_out, ignore_errors=True)
                if ctx is not None:
                    shutil.rmtree(ctx, ignore_errors=True)
                if secret_dir is not None:
                    shutil.rmtree(secret_dir, ignore_errors=True)
            journal()

    except KeyboardInterrupt:         # stopped outside a node's build (between nodes, a pull, a push, the OS image)
        stop.note()
        for entry in record["nodes"]:
            if entry["status"] in ("building", "pulling"):
                entry["status"] = "interrupted"
        error = BuildInterrupted("interrupted")
    except BaseException as exc:      # a fault outside any node: the journal must not stay "running"
        if record["status"] == "running" and rec_path.exists():
            record.update(status="failed", error=str(exc) or exc.__class__.__name__,
                          finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          duration_s=round(time.monotonic() - t_run, 1))
            journal()
        raise
    if isinstance(error, BuildInterrupted):
        error = BuildInterrupted(interrupted_message(record, rec_path, doing))
        record["error"] = str(error)

    record["docker_builds"] = engine.builds_issued - builds_before
    record["status"] = "interrupted" if isinstance(error, BuildInterrupted) else "failed" if error else "ok"
    record["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["duration_s"] = round(time.monotonic() - t_run, 1)
    journal()
    record["record_path"] = str(rec_path)
    built = [n["name"] for n in record["nodes"] if n["status"] == "built"]
    pulled = [n["name"] for n in record["nodes"] if n["status"] == "pulled"]
    skipped = [n["name"] for n in record["nodes"] if n["status"] == "skipped"]
    n = record["docker_builds"]
    ended = {"ok": "done", "interrupted": "stopped", "failed": "failed"}[record["status"]]
    say(f"{ended} after {_fmt_s(record['duration_s'])}: built {', '.join(built) or 'nothing'}; "
        + (f"pulled from the node cache {', '.join(pulled) or 'nothing'}; " if cache is not None else "")
        + f"already cached {', '.join(skipped) or 'nothing'}; {n} docker build{'s' * (n != 1)}; record {rec_path}")
    if error:
        raise error
    return record


def interrupted_message(record: dict, rec_path: Path, doing: str = "between nodes") -> str:
    """The one account of a run stopped from outside (Ctrl-C, SIGTERM), from its record: where it stopped (the
    node, its time, its ninja counter), what was done before (built, pulled, cached), what was not reached, and
    how to resume. The record's node statuses must be final (an interrupted node reads "interrupted"); ``doing``:
    what the run was doing when no node was being built (``"making the OS image ..."``, ``"pulling X ..."``)."""
    nodes = record.get("nodes") or []
    by = lambda *st: [n["name"] for n in nodes if n.get("status") in st]   # noqa: E731
    stopped = next((n for n in nodes if n.get("status") == "interrupted"), None)
    if stopped is not None:
        where = (f"while building {stopped['name']} after {_fmt_s(stopped.get('duration_s') or 0)}"
                 + (f" (compiled {stopped['compiled']})" if stopped.get("compiled") else ""))
        partial = (f" Nothing half-made was kept: {stopped['name']} has no tag and no wheels in the wheelhouse "
                   f"(its log so far: {stopped.get('log')}).")
    else:
        where, partial = f"while {doing}", ""
    done = [f"built {', '.join(by('built'))}" if by("built") else "built nothing"]
    if by("pulled"):
        done.append(f"pulled {', '.join(by('pulled'))}")
    if by("skipped"):
        done.append(f"already cached {', '.join(by('skipped'))}")
    rest = by("not reached")
    sig = stop.requested() or "SIGINT"
    return (f"Build stopped by {sig} {where}. Done before the stop: {'; '.join(done)}."
            + (f" Not reached: {', '.join(rest)}." if rest else "") + partial
            + " To resume, run the same command again: the finished nodes are cached and skipped"
            + (f", and {stopped['name']} starts again (its compiler cache mount keeps what it compiled)" if stopped else "")
            + f". Record: {rec_path}")


def _mark_local(engine: Engine, node: PlannedNode, ctx_root: Path, args: dict, labels: dict, builder: str,
                log: Path, say: Say) -> None:
    """Tag a wheels node built on another builder as done here: a one-line image FROM its parent with the
    node's labels and ``org.cudastack.builder`` (its wheels are already in the wheelhouse)."""
    from cudastack.build.builders import MARKER_DOCKERFILE

    mctx = ctx_root / f"{node.name}-{node.hash[:16]}-marker"
    shutil.rmtree(mctx, ignore_errors=True)
    mctx.mkdir(parents=True)
    try:
        (mctx / "Dockerfile").write_text(MARKER_DOCKERFILE)
        engine.build(name=f"{node.name} (local tag)", log_path=log, say=say, context=str(mctx),
                     dockerfile=str(mctx / "Dockerfile"), tag=node.tag, labels=labels,
                     build_args={"PARENT_IMAGE": args["PARENT_IMAGE"], "BUILDER": builder})
    finally:
        shutil.rmtree(mctx, ignore_errors=True)


def _abs_dockerfile(node: PlannedNode) -> Path:
    from cudastack.plan.planner import PROJECT_ROOT

    p = Path(node.dockerfile)
    p = p if p.is_absolute() else PROJECT_ROOT / p
    if not p.is_file():
        raise EnvironmentError_(f"Dockerfile {p} for node {node.name} (kind {node.kind}) does not exist.")
    return p


def dry_run(plan: BuildPlan, *, state_dir: str | Path = ".stack", engine: Engine | None = None, cache=None) -> str:
    """The plan's text with each node's cached state when a daemon answers (else 'unknown'). A wheels node
    whose image exists but whose wheels this state folder lacks (a fresh checkout) reads "to export": the run
    exports its wheels again from BuildKit's cache, with no compile. With ``cache`` (an opened
    :class:`cudastack.build.node_cache.NodeCache`), a node not cached here that the registry holds reads "in the registry
    cache (sha256:...)". Each node to build or pull gets the time the plan expects each way, from the build
    records under ``<state_dir>/records``, the registry's manifest sizes and the pull rate
    (:mod:`cudastack.plan.cache_estimates`). Raises UsageError for a bad ``CUDASTACK_NODE_CACHE_MIBPS``."""
    cached = None
    note = ""
    export: set[str] = set()
    try:
        from cudastack.core.docker_engine import docker_client

        engine = engine or Engine(None, docker_client())  # type: ignore[arg-type]  # no builds: no BuildKit needed
        cached = cached_map(engine, Wheelhouse(Path(state_dir).resolve() / plan.wheelhouse), plan)
        export = {n.name for n in plan.nodes if n.kind == "wheels" and not cached[n.name] and engine.exists(n.tag)}
    except EnvironmentError_ as exc:
        note = f"\n(no cached state: {exc})"
    remote = cache.probe_plan(plan, cached, _say_default, for_push=False) if cache and cached is not None else {}
    from cudastack.plan import cache_estimates as E

    basis = E.Basis(E.read_history(Path(state_dir) / "records"), measured=E.measured_times(plan.toolchain))
    if cache is not None:
        basis.rate = E.pull_rate(basis.history, cache.prefix.split("/", 1)[0])
        basis.blobs = E.read_blobs(cache, plan, remote)
    return render_plan(plan, cached, state_dir=str(state_dir), export=export, remote=remote,
                       cache_prefix=cache.prefix if cache is not None else "", basis=basis) + note
