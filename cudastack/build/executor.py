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
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
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
from stackprobe.api import write_atomic

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


@dataclass
class _Run:
    """One run's state, shared by the phases of :func:`_run_build`."""
    plan: BuildPlan
    state: Path
    engine: Engine
    wheelhouse: Wheelhouse
    say: Say
    bundle: str | None
    builder: Any
    builder_nodes: str
    cache: Any
    run_id: str
    started: datetime
    t_run: float
    builds_before: int
    rec_path: Path
    record: dict[str, Any] = field(default_factory=dict)
    cached: dict[str, bool] = field(default_factory=dict)
    in_cache: dict[str, Any] = field(default_factory=dict)
    cache_refs: dict[str, str | None] = field(default_factory=dict)   # a node's tag -> the node cache's entry of it
    secrets: dict[str, str] = field(default_factory=dict)
    doing: str = "starting"        # what the run is doing outside a node's build, for the account of a stop
    error: StackError | None = None

    def journal(self) -> None:
        """Write the record as it stands (the run journal) to the run's file and to latest, URL logins scrubbed."""
        text = json.dumps(scrub(self.record), indent=2) + "\n"
        write_atomic(self.rec_path, text)
        write_atomic(self.rec_path.parent / f"latest-cu{self.plan.toolchain}.json", text)

    @property
    def logs(self) -> Path:
        """The folder of this run's node logs, ``logs/<run id>``."""
        return self.state / "logs" / self.run_id

    @property
    def ctx_root(self) -> Path:
        """The folder the build contexts are made in."""
        return self.state / "ctx"

    def step(self, i: int) -> str:
        """The progress mark of the ``i``-th node, ``[i/n]``."""
        return f"[{i}/{len(self.plan.nodes)}]"


def _run_build(plan: BuildPlan, *, state_dir: str | Path, ca_bundle: str | None, engine: Engine | None,
               say: Say | None, builder, builder_nodes: str, run_lock: RunLock, cache=None) -> dict:
    """:func:`run_build`'s body, run while this process holds ``run_lock`` (the journal's liveness mark)."""
    run = _prepare(plan, state_dir, ca_bundle, engine, say or _say_default, builder, builder_nodes, cache)
    pull, todo = _plan_sets(run)
    _record_skeleton(run, run_lock)
    if todo or pull:
        # the disk check refuses before the journal exists: a refusal leaves no record a later run could
        # mistake for an interrupted build
        _preflight_disk(run.engine, plan, run.cached, run.state, run.say)
        run.journal()       # before anything expensive: a run killed from here on leaves a "running" record
    try:
        _run_nodes(run, todo, pull)
    except KeyboardInterrupt:         # stopped outside a node's build (between nodes, a pull, a push, the OS image)
        stop.note()
        for entry in run.record["nodes"]:
            if entry["status"] in ("building", "pulling"):
                entry["status"] = "interrupted"
        run.error = BuildInterrupted("interrupted")
    except BaseException as exc:      # a fault outside any node: the journal must not stay "running"
        if run.record["status"] == "running" and run.rec_path.exists():
            run.record.update(status="failed", error=str(exc) or exc.__class__.__name__,
                              finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              duration_s=round(time.monotonic() - run.t_run, 1))
            run.journal()
        raise
    return _finish(run)


def _prepare(plan: BuildPlan, state_dir: str | Path, ca_bundle: str | None, engine: Engine | None, say: Say,
             builder, builder_nodes: str, cache) -> _Run:
    """The run's state (engine, wheelhouse, run id, record path), after recovering what killed runs left."""
    state = Path(state_dir).resolve()
    bundle = resolve_ca_bundle(ca_bundle)
    engine = engine or Engine.connect()
    wheelhouse = Wheelhouse(state / plan.wheelhouse)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")[:-4] + "Z"
    run = _Run(plan=plan, state=state, engine=engine, wheelhouse=wheelhouse, say=say, bundle=bundle, builder=builder,
               builder_nodes=builder_nodes, cache=cache, run_id=run_id, started=datetime.now(timezone.utc),
               t_run=time.monotonic(), builds_before=engine.builds_issued,
               rec_path=state / "records" / f"build-cu{plan.toolchain}-{run_id}.json")
    recover_interrupted(state, plan.toolchain, say)
    remove_stale_exports(wheelhouse.path.parent, say, locks=state / "locks")
    remove_stale_exports(state, say, ".secrets-*", "secret folder(s) of killed runs", locks=state / "locks")
    remove_stale_locks(state)
    return run


def _plan_sets(run: _Run) -> tuple[list[str], list[str]]:
    """The nodes cached here, those to pull from the node cache and those to build, said in one line."""
    plan = run.plan
    run.cached = cached_map(run.engine, run.wheelhouse, plan)
    run.in_cache = run.cache.probe_plan(plan, run.cached, run.say) if run.cache is not None else {}
    pull = [n.name for n in plan.nodes if not run.cached[n.name] and run.in_cache.get(n.name)]
    todo = [n.name for n in plan.nodes if not run.cached[n.name] and not run.in_cache.get(n.name)]
    run.say(f"cuda {plan.toolchain} ({plan.cuda_version}), base {plan.base_kind}, archs {','.join(plan.target_archs)}: "
            f"{len(plan.nodes)} nodes, {len(plan.nodes) - len(todo) - len(pull)} cached"
            + (f", {len(pull)} in the node cache {run.cache.prefix}" if run.cache is not None else "")
            + f", {len(todo)} to build [{run.engine.buildkit.describe()}]")
    for n in plan.nodes:    # a runtime whose image exists but installed other wheels: say why it is built again
        if n.kind == "runtime" and not run.cached[n.name] and run.engine.exists(n.tag) \
                and (why := runtime_wheels_differ(run.engine, run.wheelhouse, n)):
            run.say(f"{n.name}: {n.tag} exists, but {why}: building it again")
    return pull, todo


def _record_skeleton(run: _Run, run_lock: RunLock) -> None:
    """The build record as the run starts: status "running", every node "not reached"."""
    plan = run.plan
    run.record = {
        "format": RECORD_FORMAT, "run_id": run.run_id, "toolchain": plan.toolchain, "cuda_version": plan.cuda_version,
        "archs": plan.target_archs, "base": plan.base_kind, "base_image": plan.base_image,
        "recipes": plan.recipes_dir, "skipped_components": plan.skipped, "status": "running",
        "pid": os.getpid(), "proc_start": _proc_start(os.getpid()), "host": socket.gethostname(),
        "lock": run_lock.name,
        "started": run.started.isoformat(timespec="seconds"), "finished": None, "duration_s": None,
        "docker_builds": 0, "wheelhouse": str(run.wheelhouse.path), "buildkit": run.engine.buildkit.describe(),
        "nodes": [{"name": node.name, "kind": node.kind, "method": node.method, "hash": node.hash,
                   "plan_hash": (node.inputs or {}).get("plan_hash", node.hash), "tag": node.tag,
                   "status": "not reached", "duration_s": 0.0, "image_id": None, "size_bytes": None, "log": None,
                   "wheels": {}, "knobs": {k.name: k.value for k in node.knobs}} for node in plan.nodes],
        "error": None,
    }
    if run.cache is not None:
        run.record["cache"] = {"prefix": run.cache.prefix, "read_only": run.cache.read_only}
        run.record["cache_failures"] = run.cache.failures


def _run_nodes(run: _Run, todo: list[str], pull: list[str]) -> None:
    """Each node in order: served when cached, else pulled from the node cache, else built; none after a failure."""
    plan = run.plan
    if todo or pull:
        if plan.nodes and plan.nodes[0].name in todo:
            run.doing = f"making the OS image {plan.base_image} (before the first node)"
            _ensure_os_image(run.engine, plan, run.say)
        if run.bundle:
            run.say(f"CA bundle for builds: {run.bundle} (BuildKit secret 'cabundle', never in a layer)")
    run.secrets = {"cabundle": run.bundle} if run.bundle else {}
    for i, (node, entry) in enumerate(zip(plan.nodes, run.record["nodes"]), 1):
        if run.error is not None:
            break
        run.doing = f"between nodes (before {node.name})"
        if run.cached[node.name] and (why := runtime_wheels_differ(run.engine, run.wheelhouse, node)):
            run.say(f"{run.step(i)} {node.name}: {node.tag} exists, but {why}: building it again")
            run.cached[node.name] = False
        if run.cached[node.name]:
            _serve_cached(run, i, node, entry)
        elif not (run.in_cache.get(node.name) and _pull(run, i, node, entry)):
            _build_node(run, i, node, entry)


def _serve_cached(run: _Run, i: int, node: PlannedNode, entry: dict) -> None:
    """A cached node: recorded "skipped" with its image, pushed to a node cache that lacks it."""
    run.doing = f"checking the cached node {node.name}"
    entry["status"] = "skipped"
    info = run.engine.inspect(node.tag)
    entry["image_id"], entry["size_bytes"] = info["id"], info["size_bytes"]
    if node.kind == "wheels":
        entry["wheels"] = (run.wheelhouse.entry(node.name) or {}).get("wheels", {})
        if (info.get("labels") or {}).get("org.cudastack.builder"):     # a marker (_mark_local)
            entry["builder"] = info["labels"]["org.cudastack.builder"]
    run.say(f"{run.step(i)} {node.name}: cached ({node.tag})")
    cache = run.cache
    if cache is not None and not cache.read_only and node.name in run.in_cache and not run.in_cache[node.name]:
        if entry.get("builder"):     # only a marker here: its wheels image is on that builder
            run.say(f"warning: {run.step(i)} {node.name}: not pushed to the node cache: this engine "
                    f"holds only a marker of it (built on builder {entry['builder']}); rebuild it there with "
                    "--cache to fill the cache")
        else:
            run.doing = f"pushing {node.name} to the node cache"
            push_node(cache, node, entry, run.say, f"{run.step(i)} {node.name}")
    run.cache_refs[node.tag] = cache_reference(cache, node, entry, run.in_cache.get(node.name))


def _pull(run: _Run, i: int, node: PlannedNode, entry: dict) -> bool:
    """Pull a node from the node cache: True when that settled it (pulled, or a LockError), False to build it."""
    from cudastack.build.node_cache import serve_node

    entry["status"] = "pulling"
    run.journal()
    try:
        run.doing = f"pulling {node.name} from the node cache"
        if serve_node(run.cache, node, run.in_cache[node.name], entry, run.wheelhouse, run.say, run.step(i)):
            if why := runtime_wheels_differ(run.engine, run.wheelhouse, node):
                # pulled, but built elsewhere over other wheel bytes than this wheelhouse's: build it here
                run.say(f"{run.step(i)} {node.name}: the node cache's image {why}: building it here")
                return False
            run.cache_refs[node.tag] = cache_reference(run.cache, node, entry, run.in_cache.get(node.name))
            run.journal()
            return True
    except LockError as exc:
        run.error = exc
        run.record["error"] = str(exc)
        run.journal()
        return True
    return False


def _build_node(run: _Run, i: int, node: PlannedNode, entry: dict) -> None:
    """Build one node, journaling its start and end; a failure or a stop is recorded on its entry and in run.error."""
    run.say(f"{run.step(i)} {node.name}: building {node.tag}"
            + (f" ({', '.join(f'{k.name}={k.value}' for k in node.knobs if k.name in node.parallel_knobs)})"
               if node.parallel_knobs else ""))
    log = run.logs / f"{node.name}.log"
    entry["log"] = str(log)
    entry["status"] = "building"
    run.journal()

    def on_child(pid: int) -> None:
        entry["child_pid"] = pid
        run.journal()

    run.engine.on_child = on_child
    t0 = time.monotonic()
    scratch: list[Path] = []      # folders made for this build (context, secrets, export): removed however it ends
    try:
        _build_steps(run, i, node, entry, log, t0, scratch)
    except StackError as exc:
        if isinstance(exc, BuildError) and getattr(run.plan, "locked", False):
            exc = locked_failure(node.name, log) or exc
        _node_ended(entry, "failed", exc, t0)
        run.error = exc
        run.record["error"] = str(exc)
    except KeyboardInterrupt as exc:
        # stopped from outside (Ctrl-C, SIGTERM): record how far the node got, then stop
        stop.note()
        _node_ended(entry, "interrupted", exc, t0)
        _note_tag_at_stop(run.engine, node, entry)
        run.error = BuildInterrupted("interrupted")      # its message is written once the record is complete
    finally:
        run.engine.on_child = None
        entry.pop("child_pid", None)
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)
    run.journal()


def _note_tag_at_stop(engine: Engine, node: PlannedNode, entry: dict) -> None:
    """A stop that arrives while the Docker engine exports the image (after the last RUN step) can come too late:
    the engine finishes on its side and tags the node though the CLI was ended. The node was to be built (no tag
    before), so its tag now means this build made it whole (the tag is the engine's last step); record it, so the
    message says so instead of "no tag", and the next run skips the node."""
    try:
        tagged = bool(node.tag) and engine.exists(node.tag)
    except Exception:                  # noqa: BLE001 - an engine that does not answer: nothing is claimed either way
        entry["tag_at_stop"] = None
        return
    if tagged:
        entry["tag_at_stop"] = node.tag


def _node_ended(entry: dict, status: str, exc: BaseException, t0: float) -> None:
    """Record a node that did not finish: its status, its time and the ninja counter it reached."""
    entry["status"] = status
    entry["duration_s"] = round(time.monotonic() - t0, 1)
    if counter := getattr(exc, "counter", ""):
        entry["compiled"] = counter


def _build_steps(run: _Run, i: int, node: PlannedNode, entry: dict, log: Path, t0: float, scratch: list[Path]) -> None:
    """Make the node's context, build it (here or on the builder), record it "built" and push it to the node cache."""
    if node.kind == "base-pip":
        _ensure_os_image(run.engine, run.plan, run.say)      # a base whose pull failed is built after all
    common, args, labels = _node_inputs(run, node, entry, scratch)
    remote = _send_to_builder(run, i, node, entry, args, common)
    _build_image(run, node, entry, log, common, args, labels, remote, scratch)
    info = run.engine.inspect(node.tag)
    entry.update(status="built", image_id=info["id"], size_bytes=info["size_bytes"])
    entry["duration_s"] = round(time.monotonic() - t0, 1)
    size = f", {info['size_bytes'] / 2**30:.2f} GiB" if info["size_bytes"] else ""
    wheels = f", wheels: {', '.join(entry['wheels'])}" if entry["wheels"] else ""
    run.say(f"{run.step(i)} {node.name}: built in {_fmt_s(entry['duration_s'])}{size}{wheels}")
    if run.cache is not None and not run.cache.read_only:
        run.journal()
        if entry.get("builder") and node.kind == "wheels":    # this engine holds only its marker
            from cudastack.build.builders import push_from_builder

            push_from_builder(run.cache, run.engine, node, entry, common, log, run.say, f"{run.step(i)} {node.name}")
        else:
            run.doing = f"pushing {node.name} to the node cache"
            push_node(run.cache, node, entry, run.say, f"{run.step(i)} {node.name}")


def _node_inputs(run: _Run, node: PlannedNode, entry: dict, scratch: list[Path]) -> tuple[dict, dict, dict]:
    """The node's build context, build args, labels and secrets: ``(common build kwargs, args, labels)``."""
    ctx, extra = _make_context(run.ctx_root, node, run.wheelhouse, run.plan, ca_bundle=run.bundle, say=run.say)
    scratch.append(ctx)
    if "_sdist" in extra:
        entry["sdist"] = extra.pop("_sdist")
    if "_source" in extra:
        entry["source"] = extra.pop("_source")
    args = dict(node.build_args)
    args.update(extra)
    args = {k: v for k, v in args.items() if not (k == "WHEEL_NAMES" and node.kind != "runtime")}
    labels = {"org.cudastack.node": node.name, "org.cudastack.hash": node.hash,
              "org.cudastack.toolchain": run.plan.toolchain}
    if node.kind == "runtime":
        labels[WHEELS_LABEL] = runtime_wheels_digest(run.wheelhouse, node)
    node_secrets = dict(run.secrets)
    if node.index_secret:       # a private index with a login: a BuildKit secret, never a build arg
        secret_dir = Path(tempfile.mkdtemp(prefix=f".secrets-p{os.getpid()}-", dir=run.state))   # 0700
        scratch.append(secret_dir)
        (secret_dir / "pipindex").touch(mode=0o600)
        (secret_dir / "pipindex").write_text(node.index_secret)
        node_secrets["pipindex"] = str(secret_dir / "pipindex")
    common = dict(context=str(ctx), dockerfile=str(_abs_dockerfile(node)), build_args=args,
                  secrets=node_secrets, labels=labels)
    return common, args, labels


def _send_to_builder(run: _Run, i: int, node: PlannedNode, entry: dict, args: dict, common: dict) -> str | None:
    """With --builder, route a node it takes there (its parent by digest from the node cache); the builder's name."""
    builder = run.builder
    if builder is None:
        return None
    from cudastack.build.builders import sent

    if not sent(node, run.builder_nodes):
        return None
    entry["builder"] = builder.name
    common["builder"] = builder
    run.say(f"{run.step(i)} {node.name}: on builder {builder.name} ({builder.driver})")
    if run.cache_refs.get(args.get("PARENT_IMAGE", "")):    # the builder pulls it by digest itself
        entry["parent_from_cache"] = run.cache_refs[args["PARENT_IMAGE"]]
        common["build_args"] = {**args, "PARENT_IMAGE": entry["parent_from_cache"]}
        run.say(f"{run.step(i)} {node.name}: its parent comes to builder {builder.name} from the node "
                f"cache ({entry['parent_from_cache']})")
    return builder.name


def _build_image(run: _Run, node: PlannedNode, entry: dict, log: Path, common: dict, args: dict, labels: dict,
                 remote: str | None, scratch: list[Path]) -> None:
    """The docker build(s) of a node: a wheels node exports its wheels into the wheelhouse, then is tagged."""
    engine = run.engine
    if node.kind == "wheels":
        run.wheelhouse.path.mkdir(parents=True, exist_ok=True)
        tmp_out = Path(tempfile.mkdtemp(prefix=f".export-{node.name}-p{os.getpid()}-", dir=run.wheelhouse.path.parent))
        scratch.append(tmp_out)
        engine.build(name=node.name, log_path=log, say=run.say, target="wheels", output_dir=str(tmp_out), **common)
        entry["wheels"] = run.wheelhouse.add(node, tmp_out)
        if remote:
            _mark_local(engine, node, run.ctx_root, args, labels, remote, log, run.say)
        else:
            engine.build(name=f"{node.name} (tag builder)", log_path=log, say=run.say, target="builder",
                         tag=node.tag, **common)
        return
    engine.build(name=node.name, log_path=log, say=run.say, tag=node.tag, **common)
    if remote and not engine.exists(node.tag):
        raise BuildError(f"Builder {remote} built {node.name} but kept the image in its own engine "
                         f"({run.builder.driver} driver, {run.builder.endpoint}): this engine has no {node.tag}. "
                         "Use a docker-container, remote or Kubernetes builder (they send the image back "
                         "with --load), or send only wheels nodes (--builder-nodes source).")


def _finish(run: _Run) -> dict:
    """Complete the record (status, times, docker builds), say how the run ended; raise its error or return it."""
    record, error = run.record, run.error
    if isinstance(error, BuildInterrupted):
        error = BuildInterrupted(interrupted_message(record, run.rec_path, run.doing))
        record["error"] = str(error)
    record["docker_builds"] = run.engine.builds_issued - run.builds_before
    record["status"] = "interrupted" if isinstance(error, BuildInterrupted) else "failed" if error else "ok"
    record["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["duration_s"] = round(time.monotonic() - run.t_run, 1)
    run.journal()
    record["record_path"] = str(run.rec_path)
    built = [n["name"] for n in record["nodes"] if n["status"] == "built"]
    pulled = [n["name"] for n in record["nodes"] if n["status"] == "pulled"]
    skipped = [n["name"] for n in record["nodes"] if n["status"] == "skipped"]
    n = record["docker_builds"]
    ended = {"ok": "done", "interrupted": "stopped", "failed": "failed"}[record["status"]]
    run.say(f"{ended} after {_fmt_s(record['duration_s'])}: built {', '.join(built) or 'nothing'}; "
            + (f"pulled from the node cache {', '.join(pulled) or 'nothing'}; " if run.cache is not None else "")
            + f"already cached {', '.join(skipped) or 'nothing'}; {n} docker build{'s' * (n != 1)}; record {run.rec_path}")
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
        if stopped.get("tag_at_stop"):
            partial = (f" The Docker engine had already finished {stopped['name']} when the stop arrived and tagged "
                       f"it ({stopped['tag_at_stop']}): that image is whole (the tag is the engine's last step) and "
                       f"kept, and the next run skips it (its log: {stopped.get('log')}).")
        elif "tag_at_stop" in stopped:
            partial = (f" Whether the Docker engine tagged {stopped['name']} before the stop took effect was not "
                       f"checked (the engine did not answer); the next run skips it if it did "
                       f"(its log so far: {stopped.get('log')}).")
        else:
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
            + (f", and {stopped['name']} starts again (its compiler cache mount keeps what it compiled)"
               if stopped and not stopped.get("tag_at_stop") else "")
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
