"""Execute a Plan: skip cached nodes, build the rest with BuildKit, export wheels, write a build record.

For each node in topological order:

* **cached** when its tag exists in the engine (and, for a wheels node, the wheelhouse manifest lists
  that node at the same hash with every wheel file present and matching its sha256): nothing runs, not
  even a ``docker build``; a no-op rebuild issues none at all.
* **base / image / runtime** nodes: one ``docker build -t <tag>``. BuildKit tags only a finished image,
  so a failing build leaves no tag on a broken image.
* **wheels** nodes: ``--target wheels --output type=local,dest=<tmp>`` exports just the wheel files to a
  temporary folder inside the state dir; their sha256 are computed, each file is moved into the
  wheelhouse with ``os.replace`` (atomic on one filesystem) and the manifest is rewritten atomically;
  only then is the builder stage tagged (``--target builder -t <tag>``, served from BuildKit's cache),
  which marks the node done. A failure anywhere leaves no half-written wheel in the wheelhouse and no tag.

A rerun after a failure resumes from the cached nodes. The OS image of a ``pip`` base is bootstrapped
(debootstrap + docker import, :mod:`cudastack.bootstrap`) when its tag is missing.

State folder layout (default ``.stack/``)::

    wheelhouse/cu13.1/*.whl              the wheels (flat: pip install --find-links works)
    wheelhouse/cu13.1/manifest.json      {"nodes": {name: {"hash", "tag", "wheels": {file: sha256}}}}
    logs/<run id>/<node>.log             each node's full BuildKit log
    records/build-cu13.1-<run id>.json   the build record; records/latest-cu13.1.json the newest one

Run journal: the record is written (status "running", with this process's pid, its start time and host)
before the first docker build and rewritten as each node starts ("building") and ends, so a run killed
outright (SIGKILL, OOM killer, power loss) leaves a record that says how far it got. The next run of that
toolchain finds a "running" record whose process is gone, rewrites it as "interrupted" (the node it was
building too) and says so, and removes the stale ``.export-<node>-p<pid>-*`` folders such runs leave beside
the wheelhouse (a folder whose pid is alive belongs to a build still running and is kept).

Build record (JSON): ``{"format": 1, "run_id", "toolchain", "cuda_version", "archs", "base", "status"
("running" | "ok" | "failed" | "interrupted"), "pid", "host", "proc_start", "started", "finished" (UTC ISO 8601), "duration_s", "docker_builds" (how many docker
builds were issued), "wheelhouse", "nodes": [{"name", "kind", "method", "hash", "tag", "status" ("built" |
"skipped" | "failed" | "building" | "interrupted" | "not reached"), "duration_s", "image_id", "size_bytes", "log",
"wheels": {file: sha256}, "knobs": {name: value}, "child_pid" (the docker CLI of a node being built), "compiled" (the last ninja counter of a node that did not
finish, e.g. "12/73"), "sdist" (a patched sdist's file, sha256 and patches)}], "error"}``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from cudastack.credentials import redact, scrub
from cudastack.engine import Engine, _fmt_s, resolve_ca_bundle
from cudastack.errors import BuildError, EnvironmentError_, LockError, StackError
from cudastack.plan import BuildPlan, PlannedNode, render_plan
from stackprobe.atomic import write_atomic

RECORD_FORMAT = 1
DISK_MARGIN_GIB = 2.0
Say = Callable[[str], None]
_CTX_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".pytest_cache", ".git")


def _say_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Wheelhouse:
    """One toolchain's wheelhouse folder and its manifest (see module doc)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest_path = self.path / "manifest.json"

    def manifest(self) -> dict:
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError):
            return {"nodes": {}}
        data.setdefault("nodes", {})
        return data

    def entry(self, node: str) -> dict | None:
        return self.manifest()["nodes"].get(node)

    def has(self, node: PlannedNode, verify: bool = False) -> bool:
        """Whether the manifest lists ``node`` at its hash with all wheels present (and, with ``verify``,
        matching their recorded sha256)."""
        e = self.entry(node.name)
        if not e or e.get("hash") != node.hash or not e.get("wheels"):
            return False
        for fname, digest in e["wheels"].items():
            p = self.path / fname
            if not p.is_file():
                return False
            if verify and sha256_file(p) != digest:
                return False
        return True

    def add(self, node: PlannedNode, exported: Path) -> dict[str, str]:
        """Move the wheels found under ``exported`` into the wheelhouse (atomically per file) and record
        them under ``node`` in the manifest (atomically). Returns {file name: sha256}."""
        wheels = sorted(p for p in exported.rglob("*.whl") if p.is_file())
        if not wheels:
            raise BuildError(f"Building {node.name} exported no wheel (looked in {exported}); see its log.")
        self.path.mkdir(parents=True, exist_ok=True)
        digests = {p.name: sha256_file(p) for p in wheels}
        for p in wheels:
            os.replace(p, self.path / p.name)
        m = self.manifest()
        # a file name now owned by this node is no longer another node's
        for other, e in m["nodes"].items():
            if other != node.name:
                e["wheels"] = {f: d for f, d in e.get("wheels", {}).items() if f not in digests}
        m["nodes"][node.name] = {"hash": node.hash, "tag": node.tag, "wheels": digests,
                                 "exported": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_atomic(self.manifest_path, json.dumps(m, indent=2, sort_keys=True) + "\n")
        return digests


PYPI_SIMPLE = "https://pypi.org/simple"


def fetch_sdist(package: str, version: str, cache_dir: Path, *, index: str = "", ca_bundle: str | None = None,
                say: Say | None = None) -> tuple[Path, str]:
    """Download the sdist of ``package==version`` from a PEP 691 simple index (default PyPI) into
    ``cache_dir`` (kept; verified against the index's sha256 each time). Returns (path, sha256).
    Raises BuildError when the index has no such sdist or the download does not match its hash."""
    import re as _re

    import requests
    from packaging.utils import canonicalize_name

    base = (index or PYPI_SIMPLE).rstrip("/")
    url = f"{base}/{canonicalize_name(package)}/"
    shown = redact(base)           # messages name the index without its login
    verify = ca_bundle or True
    try:
        r = requests.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60, verify=verify)
        r.raise_for_status()
        files = r.json()["files"]
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise BuildError(f"Could not list {package} on {shown} ({exc.__class__.__name__}: {scrub(str(exc))}); check the network "
                         "or the recipe's index.") from exc
    name_pat = "[-_.]".join(_re.escape(part) for part in _re.split(r"[-_.]+", canonicalize_name(package)))
    pat = _re.compile(name_pat + "-" + _re.escape(version) + r"\.(tar\.gz|zip)$", _re.IGNORECASE)
    found = [f for f in files if pat.match(f["filename"])]
    if not found:
        raise BuildError(f"{shown} has no sdist of {package}=={version}; fix the recipe's sdist pin.")
    f = found[0]
    want = f.get("hashes", {}).get("sha256", "")
    dest = cache_dir / f["filename"]
    if dest.is_file() and (not want or sha256_file(dest) == want):
        return dest, sha256_file(dest)
    cache_dir.mkdir(parents=True, exist_ok=True)
    if say:
        say(f"  fetching {f['filename']} from {shown}")
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with requests.get(f["url"], stream=True, timeout=300, verify=verify) as resp:
            resp.raise_for_status()
            with open(tmp, "wb") as out:
                for chunk in resp.iter_content(1 << 20):
                    out.write(chunk)
        got = sha256_file(tmp)
        if want and got != want:
            raise BuildError(f"{f['filename']}: sha256 {got} does not match the index's {want}; not used.")
        os.replace(tmp, dest)
    except requests.RequestException as exc:
        raise BuildError(f"Downloading {redact(f['url'])} failed: {scrub(str(exc))}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return dest, sha256_file(dest)


def unpack_patched(archive: Path, dest: Path, patches: list[dict]) -> None:
    """Unpack an sdist (its single top folder becomes ``dest``) and apply literal ``patches``
    ({file, replace, with}); a patch that matches nothing raises BuildError naming it."""
    import tarfile
    import zipfile

    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
        tops = list(tmp.iterdir())
        root = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
        for pt in patches:
            target = root / pt["file"]
            if not target.is_file():
                raise BuildError(f"Patch for {archive.name}: {pt['file']} does not exist in the sdist.")
            text = target.read_text()
            n = text.count(pt["replace"])
            if n == 0:
                raise BuildError(f"Patch for {archive.name}: '{pt['replace']}' matches nothing in {pt['file']}; "
                                 "the recipe's patch no longer applies to this version.")
            target.write_text(text.replace(pt["replace"], pt["with"]))
        shutil.move(str(root), str(dest))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def node_cached(engine: Engine, wheelhouse: Wheelhouse, node: PlannedNode) -> bool:
    """A node is cached when its tag exists and, for wheels nodes, the wheelhouse holds its wheels."""
    if not engine.exists(node.tag):
        return False
    if node.kind == "wheels":
        return wheelhouse.has(node)
    return True


def cached_map(engine: Engine, wheelhouse: Wheelhouse, plan: BuildPlan) -> dict[str, bool]:
    return {n.name: node_cached(engine, wheelhouse, n) for n in plan.nodes}


def _make_context(ctx_root: Path, node: PlannedNode, wheelhouse: Wheelhouse, plan: BuildPlan, *,
                  ca_bundle: str | None = None, say: Say | None = None) -> tuple[Path, dict]:
    """A fresh build-context folder for ``node``; returns it and extra build args (WHEEL_NAMES) plus, under
    the key ``_sdist``, what was fetched for a patched sdist."""
    ctx = ctx_root / f"{node.name}-{node.hash[:16]}"
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    extra: dict = {}
    if node.sdist:
        archive, digest = fetch_sdist(node.sdist["package"], node.sdist["version"], ctx_root.parent / "sdists",
                                      index=node.sdist.get("index", ""), ca_bundle=ca_bundle, say=say)
        pinned = node.sdist.get("sha256_locked")
        if pinned is not None and pinned.get(archive.name) != digest:
            raise LockError(
                f"The sdist {archive.name} of node {node.name} has sha256 {digest}, but the lock "
                f"(nodes.{node.name}.sdists) pins "
                + (f"{pinned[archive.name]}" if archive.name in pinned else f"only {', '.join(pinned) or 'nothing'}")
                + ". The index serves another file than the one that was locked: investigate before trusting it; "
                "if the new file is intended, refresh the lock with `invoke lock` and review the diff. "
                "Nothing was built.")
        unpack_patched(archive, ctx / "src", node.sdist.get("patches", []))
        extra["_sdist"] = {"file": archive.name, "sha256": digest, "patches": node.sdist.get("patches", [])}
    fetch = getattr(node, "fetch", None)
    if fetch:
        from cudastack.sources import materialise

        extra["_source"] = materialise(fetch, ctx / "src", ctx_root.parent / "sources", ca_bundle=ca_bundle, say=say)
    for sub, src in node.context.items():
        if sub == "wheelhouse" or not src or (sub == "src" and fetch):
            continue
        shutil.copytree(src, ctx / sub, ignore=_CTX_IGNORE, symlinks=True)
    if node.kind == "runtime":
        wh = ctx / "wheelhouse"
        wh.mkdir()
        names: list[str] = []
        for p in node.parents:
            pn = plan.node(p)
            if pn.kind != "wheels":
                continue
            entry = wheelhouse.entry(p) or {}
            for fname in sorted(entry.get("wheels", {})):
                src = wheelhouse.path / fname
                try:
                    os.link(src, wh / fname)
                except OSError:
                    shutil.copy2(src, wh / fname)
                names.append(fname)
        extra["WHEEL_NAMES"] = " ".join(names)
        if node.build_args.get("PIP_SPECS_LOCKED"):
            extra["WHEELS_LOCKED"] = wheels_locked(node.build_args["PIP_SPECS_LOCKED"], names, wheelhouse, plan, node)
    return ctx, extra


def wheels_locked(closure_text: str, names: list[str], wheelhouse: "Wheelhouse", plan: BuildPlan,
                  node: PlannedNode) -> str:
    """The runtime's ``WHEELS_LOCKED`` build arg: one ``/wheelhouse/<file> --hash=sha256:<digest>`` line per
    wheelhouse wheel whose project the locked closure (``closure_text``: ``name==version --hash=...`` lines)
    does not name, i.e. wheels built from source; the digest is the one recorded when the wheel node exported
    it. Wheels the closure names are installed by ``name==version`` with the lock's hash (pip finds them in
    /wheelhouse through --find-links), so their bytes must be the locked ones."""
    from packaging.utils import canonicalize_name

    in_closure = {canonicalize_name(ln.split("==", 1)[0]) for ln in closure_text.splitlines()
                  if "==" in ln and not ln.lstrip().startswith("#")}
    recorded: dict[str, str] = {}
    for p in node.parents:
        if plan.node(p).kind == "wheels":
            recorded.update((wheelhouse.entry(p) or {}).get("wheels", {}))
    lines = []
    for fname in names:
        if canonicalize_name(fname.split("-", 1)[0]) in in_closure:
            continue
        lines.append(f"/wheelhouse/{fname} --hash=sha256:{recorded[fname]}")
    return "\n".join(lines)


def locked_failure(node: str, log: Path) -> LockError | None:
    """When a locked build's log shows pip's hash-checking refusal, a LockError naming each package whose file
    differs from the lock (:func:`cudastack.lock.explain_pip_hash_failure`), the node and the log; else None.
    BuildKit's plain progress prefixes every line of a step with ``#<step> <seconds>``; it is stripped first."""
    import re

    from cudastack.lock import explain_pip_hash_failure

    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    text = re.sub(r"(?m)^#\d+ \d+\.\d+ ", "", text)
    err = explain_pip_hash_failure(text)
    if err is None:
        return None
    text = str(err)
    return LockError(f"Locked build of {node}: {text[:1].lower()}{text[1:]} Log: {log}")


def _preflight_disk(engine: Engine, plan: BuildPlan, cached: dict[str, bool], state_dir: Path, say: Say) -> float:
    need = sum(n.est_disk_gib for n in plan.nodes if not cached.get(n.name))
    if need <= 0:
        return 0.0
    root, free = engine.root_dir_free_gib()
    checks = [(root, free)]
    state_dir.mkdir(parents=True, exist_ok=True)
    checks.append((str(state_dir), shutil.disk_usage(state_dir).free / 2**30))
    for where, gib in checks:
        if gib is not None and gib < need + DISK_MARGIN_GIB:
            raise EnvironmentError_(
                f"Too little free disk: {where} has {gib:.1f} GiB free, but the {sum(not c for c in cached.values())} "
                f"nodes to build need about {need:g} GiB (+{DISK_MARGIN_GIB:g} GiB margin). Free space "
                "(`docker image prune`, `docker builder prune`) or move the Docker data root / --state-dir.")
    say(f"disk: about {need:g} GiB needed; {root} has "
        f"{'unknown' if free is None else f'{free:.1f} GiB'} free")
    return need


def _ensure_os_image(engine: Engine, plan: BuildPlan, say: Say) -> None:
    if plan.base_kind != "pip" or not plan.base_image:
        return
    base = plan.nodes[0]
    if not base.kind.startswith("base"):
        return
    if engine.exists(plan.base_image):
        return
    from cudastack.bootstrap import bootstrap_os_image

    say(f"OS image {plan.base_image} is missing: bootstrapping Debian {plan.os_suite} (debootstrap + docker import)")
    bootstrap_os_image(plan.os_suite or "bookworm", tag=plan.base_image, progress=lambda s: say(f"  {s}"),
                       docker_cli=engine.buildkit.docker)


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, field 22 of /proc/<pid>/stat: proc(5)), or
    None when no such process exists. With the pid it tells a live process from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _process_alive(pid, start, host) -> bool:
    """Whether the run that wrote a journal (``pid``, ``start``, ``host``) still runs. A journal from another
    host counts as alive (it cannot be checked from here)."""
    import socket

    if host and host != socket.gethostname():
        return True
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = _proc_start(pid)
    if now is None:
        if Path("/proc/self/stat").exists():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return start is None or now == start


def recover_interrupted(state: Path, toolchain: str, say: Say) -> list[dict]:
    """Find runs of ``toolchain`` whose journal says "running" but whose process is gone (killed without a
    chance to write its end), rewrite each record as "interrupted" (the node it was building as well),
    say so, and return them. Records of runs still alive are left alone."""
    rec_dir = state / "records"
    found = []
    for p in sorted(rec_dir.glob(f"build-cu{toolchain}-*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("status") != "running" or _process_alive(rec.get("pid"), rec.get("proc_start"), rec.get("host")):
            continue
        node = next((n for n in rec.get("nodes", []) if n.get("status") == "building"), None)
        if node is not None:
            node["status"] = "interrupted"
        rec["status"] = "interrupted"
        rec["error"] = (f"The build process (pid {rec.get('pid')}) ended without recording an exit (killed: "
                        f"SIGKILL, the OOM killer or a lost machine)"
                        + (f" while building {node['name']}" if node else "") + ".")
        text = json.dumps(rec, indent=2) + "\n"
        write_atomic(p, text)
        latest = rec_dir / f"latest-cu{toolchain}.json"
        try:
            if json.loads(latest.read_text()).get("run_id") == rec.get("run_id"):
                write_atomic(latest, text)
        except (OSError, ValueError):
            pass
        say(f"previous run {rec.get('run_id')} (started {rec.get('started')}) was interrupted"
            + (f" while building {node['name']}" if node else "")
            + f": its process ended without recording an exit; {p} now says so")
        found.append(rec)
    return found


def remove_stale_exports(folder: Path, say: Say, pattern: str = ".export-*",
                         what: str = "export folder(s) of killed runs beside the wheelhouse") -> list[str]:
    """Remove the ``pattern`` folders in ``folder`` (``.export-*`` beside the wheelhouse, ``.secrets-*`` in the
    state folder) that no live build owns: the owner's pid is in the name (``.export-<node>-p<pid>-<random>``);
    folders without one predate that naming and are stale. Returns the names removed."""
    import re as _re

    removed = []
    if not folder.is_dir():
        return removed
    for p in sorted(folder.glob(pattern)):
        m = _re.search(r"-p(\d+)-[^-]*$", p.name)
        if m and (int(m.group(1)) == os.getpid() or _proc_start(int(m.group(1))) is not None):
            continue          # its build is still running
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p.name)
    if removed:
        say(f"removed {len(removed)} stale {what}: {', '.join(removed)}")
    return removed


def run_build(
    plan: BuildPlan,
    *,
    state_dir: str | Path = ".stack",
    ca_bundle: str | None = None,
    engine: Engine | None = None,
    say: Say | None = None,
    builder=None,
    builder_nodes: str = "source",
) -> dict:
    """Build ``plan`` (see module doc) and return the build record (also written to the state dir).
    ``builder``: a :class:`cudastack.builders.Builder` the nodes ``builder_nodes`` selects ("source" | "all")
    are sent to (``docker buildx build --builder NAME``; see :mod:`cudastack.builders`).

    Raises EnvironmentError_ (no daemon, no BuildKit path, too little disk) before any build, UsageError
    for a missing --ca-bundle, and BuildError when a node fails (after writing a record with status
    "failed"; the error carries the failing step's last lines and the log path).
    """
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
    remove_stale_exports(wheelhouse.path.parent, say)
    remove_stale_exports(state, say, ".secrets-*", "secret folder(s) of killed runs")

    cached = cached_map(engine, wheelhouse, plan)
    todo = [n.name for n in plan.nodes if not cached[n.name]]
    say(f"cuda {plan.toolchain} ({plan.cuda_version}), base {plan.base_kind}, archs {','.join(plan.target_archs)}: "
        f"{len(plan.nodes)} nodes, {len(plan.nodes) - len(todo)} cached, {len(todo)} to build "
        f"[{engine.buildkit.describe()}]")
    import socket

    record = {
        "format": RECORD_FORMAT, "run_id": run_id, "toolchain": plan.toolchain, "cuda_version": plan.cuda_version,
        "archs": plan.target_archs, "base": plan.base_kind, "base_image": plan.base_image,
        "recipes": plan.recipes_dir, "skipped_components": plan.skipped, "status": "running",
        "pid": os.getpid(), "proc_start": _proc_start(os.getpid()), "host": socket.gethostname(),
        "started": started.isoformat(timespec="seconds"), "finished": None, "duration_s": None,
        "docker_builds": 0, "wheelhouse": str(wheelhouse.path), "buildkit": engine.buildkit.describe(),
        "nodes": [{"name": node.name, "kind": node.kind, "method": node.method, "hash": node.hash,
                   "plan_hash": (node.inputs or {}).get("plan_hash", node.hash), "tag": node.tag,
                   "status": "not reached", "duration_s": 0.0, "image_id": None, "size_bytes": None, "log": None,
                   "wheels": {}, "knobs": {k.name: k.value for k in node.knobs}} for node in plan.nodes],
        "error": None,
    }
    rec_path = rec_dir / f"build-cu{plan.toolchain}-{run_id}.json"

    def journal() -> None:
        """Write the record as it stands (the run journal), to the run's file and to latest; URL logins are
        scrubbed (credentials.scrub)."""
        text = json.dumps(scrub(record), indent=2) + "\n"
        write_atomic(rec_path, text)
        write_atomic(rec_dir / f"latest-cu{plan.toolchain}.json", text)

    if todo:
        journal()           # before anything expensive: a run killed from here on leaves a "running" record
        _preflight_disk(engine, plan, cached, state, say)
        _ensure_os_image(engine, plan, say)
        if bundle:
            say(f"CA bundle for builds: {bundle} (BuildKit secret 'cabundle', never in a layer)")

    secrets = {"cabundle": bundle} if bundle else {}
    error: StackError | None = None
    for i, (node, entry) in enumerate(zip(plan.nodes, record["nodes"]), 1):
        if error is not None:
            continue
        if cached[node.name]:
            entry["status"] = "skipped"
            info = engine.inspect(node.tag)
            entry["image_id"], entry["size_bytes"] = info["id"], info["size_bytes"]
            if node.kind == "wheels":
                entry["wheels"] = (wheelhouse.entry(node.name) or {}).get("wheels", {})
            say(f"[{i}/{len(plan.nodes)}] {node.name}: cached ({node.tag})")
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
                from cudastack.builders import sent

                if sent(node, builder_nodes):
                    remote = builder.name
                    entry["builder"] = remote
                    common["builder"] = builder
                    say(f"[{i}/{len(plan.nodes)}] {node.name}: on builder {remote} ({builder.driver})")
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
        except StackError as exc:
            if isinstance(exc, BuildError) and getattr(plan, "locked", False):
                exc = locked_failure(node.name, log) or exc
            entry["status"] = "failed"
            entry["duration_s"] = round(time.monotonic() - t0, 1)
            if getattr(exc, "counter", ""):
                entry["compiled"] = exc.counter
            error = exc
            record["error"] = str(exc)
        except KeyboardInterrupt as exc:
            # stopped from outside (Ctrl-C, SIGTERM): record how far the node got, then stop
            entry["status"] = "interrupted"
            entry["duration_s"] = round(time.monotonic() - t0, 1)
            if getattr(exc, "counter", ""):
                entry["compiled"] = exc.counter
            error = BuildError(f"Interrupted while building {node.name} after {_fmt_s(entry['duration_s'])}"
                               + (f" (compiled {entry['compiled']})" if entry.get("compiled") else "")
                               + f"; rerun to resume from the cached nodes. Log: {entry['log']}")
            error.interrupted = True  # type: ignore[attr-defined]
            record["error"] = str(error)
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

    record["docker_builds"] = engine.builds_issued - builds_before
    record["status"] = "failed" if error else "ok"
    if isinstance(error, BuildError) and getattr(error, "interrupted", False):
        record["status"] = "interrupted"
    record["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["duration_s"] = round(time.monotonic() - t_run, 1)
    journal()
    record["record_path"] = str(rec_path)
    built = [n["name"] for n in record["nodes"] if n["status"] == "built"]
    skipped = [n["name"] for n in record["nodes"] if n["status"] == "skipped"]
    say(f"done in {_fmt_s(record['duration_s'])}: built {', '.join(built) or 'nothing'}; "
        f"skipped {', '.join(skipped) or 'nothing'}; {record['docker_builds']} docker builds; record {rec_path}")
    if error:
        raise error
    return record


def _mark_local(engine: Engine, node: PlannedNode, ctx_root: Path, args: dict, labels: dict, builder: str,
                log: Path, say: Say) -> None:
    """Tag a wheels node built on another builder as done here: a one-line image FROM its parent with the
    node's labels and ``org.cudastack.builder`` (its wheels are already in the wheelhouse)."""
    from cudastack.builders import MARKER_DOCKERFILE

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
    from cudastack.plan import PROJECT_ROOT

    p = Path(node.dockerfile)
    p = p if p.is_absolute() else PROJECT_ROOT / p
    if not p.is_file():
        raise EnvironmentError_(f"Dockerfile {p} for node {node.name} (kind {node.kind}) does not exist.")
    return p


def dry_run(plan: BuildPlan, *, state_dir: str | Path = ".stack", engine: Engine | None = None) -> str:
    """The plan's text with each node's cached state when a daemon answers (else 'unknown')."""
    cached = None
    note = ""
    try:
        from cudastack.engine import connect_sdk

        engine = engine or Engine(None, connect_sdk())  # type: ignore[arg-type]  (no builds: no BuildKit needed)
        cached = cached_map(engine, Wheelhouse(Path(state_dir).resolve() / plan.wheelhouse), plan)
    except EnvironmentError_ as exc:
        note = f"\n(no cached state: {exc})"
    return render_plan(plan, cached, state_dir=str(state_dir)) + note
