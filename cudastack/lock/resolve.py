"""Pinning a whole plan: what each node installs, each install resolved as it happens in its image, the base
pinned, sources pinned (:func:`resolve_lock`), and the lock written keeping still-valid outputs (:func:`lock_plan`).

Each install is resolved as it happens in its image: pip keeps an installed distribution that satisfies a
requirement, so the versions the parent image already holds are passed as constraints wherever they satisfy
every active requirement of the new closure (:func:`cudastack.lock.pip_resolver.kept_pins`); otherwise pip's
newest choice is pinned and a warning notes the replacement.
"""
from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional

from cudastack.lock import cuda_wheels
from cudastack.core.credentials import redact
from cudastack.core.errors import EnvironmentError_, LockError, UsageError
from cudastack.lock.model import (DEFAULT_INDEX, LOCK_VERSION, SEPARATE_PREFIX_INSTALLS, Progress, check_schema,
                                  exclusive, load_lock, write_lock)
from cudastack.lock.pins import git_pin, sdist_pin
from cudastack.lock.pip_resolver import kept_pins, pip_resolve, target_for_plan


_ARG_DEFAULT_RE = re.compile(r"^\s*ARG\s+([A-Z0-9_]*PIP_SPECS)\s*=\s*(\"[^\"]*\"|'[^']*'|\S+)", re.M)


def node_installs(node) -> dict[str, dict]:
    """The pip installs a plan node runs, keyed by the build arg holding the requirements:
    ``{"CUDA_PIP_SPECS": {"specs": [...], "no_deps": False}, ...}``. Build args ending in ``PIP_SPECS`` and
    a source build's ``BUILD_DEPS`` (its build backend, installed with dependencies), plus
    ``ARG X_PIP_SPECS=default`` lines of the node's Dockerfile that the plan does not override.
    Wheel nodes fetch with ``--no-deps``; source nodes (sdist/git/path) are pinned separately."""
    out: dict[str, dict] = {}
    df = (node.inputs or {}).get("dockerfile", "")
    for m in _ARG_DEFAULT_RE.finditer(df or ""):
        name, val = m.group(1), m.group(2).strip("\"'")
        if name not in node.build_args and val.split():
            out[name] = {"specs": val.split(), "no_deps": False}
    for name, val in node.build_args.items():
        if not (name.endswith("PIP_SPECS") or name == "BUILD_DEPS") or not val.split():
            continue
        if node.kind == "wheels" and node.method == "source" and name == "PIP_SPECS":
            continue
        out[name] = {"specs": val.split(), "no_deps": node.kind == "wheels" and name != "BUILD_DEPS"}
    return dict(sorted(out.items()))


def _requested_specs(specs: list[str]) -> list[str]:
    return sorted(specs)


def _source_entry(node) -> dict:
    entry = ((node.inputs or {}).get("recipe") or {}).get("toolchain_entry") or {}
    return entry if isinstance(entry, dict) else {}


def resolve_lock(plan, *, target: Optional[dict] = None, python: str = sys.executable, client=None,  # noqa: C901, PLR0912, PLR0915 - reason: the lock's steps in order (target, OS image, pip per node, outputs)
                 find_links: Iterable[str] = (), progress: Progress = lambda s: None,
                 resolver: Optional[Callable[..., list[dict]]] = None) -> dict:
    """Pin every input of ``plan`` (a :class:`cudastack.plan.model.Plan`) and return the lock (a dict; write it
    with :func:`write_lock`). ``target``: see :func:`target_for_plan` (default: asked of the plan's base).
    ``python``: the interpreter whose pip resolves; its ``major.minor`` must equal the target's, because pip
    evaluates environment markers with the running interpreter. ``client``: docker SDK client (for the OS
    image record); ``find_links``: extra local folders of distributions (outputs of an earlier lock are
    merged by :func:`lock_plan`). ``resolver``: a function with :func:`pip_resolve`'s interface and result
    (default pip_resolve; :func:`cudastack.lock.resolve_uv.uv_resolve` resolves with uv, needs no interpreter of the
    target's version, and names itself in ``resolver.tool`` through its ``describe()``).
    Raises LockError / RegistryError / UsageError; nothing is written here."""
    target = target or target_for_plan(plan, client=client)
    proc = subprocess.run([python, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2], pip.__version__)"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise LockError(f"{python} cannot run pip: {proc.stderr.strip()[-300:]}")
    host_py, pip_version = proc.stdout.split()
    resolve = resolver or pip_resolve   # the one resolver hook (uv: cudastack/lock/resolve_uv.py)
    if host_py != target["python_version"] and resolve is pip_resolve:
        raise EnvironmentError_(
            f"The images run Python {target['python_version']} but {python} is Python {host_py}; pip evaluates "
            f"environment markers with the interpreter it runs in. Pass --python /path/to/python{target['python_version']} "
            f"(with pip >= 22.2) to `invoke lock`, or lock a base whose Python is {host_py} (--base; toolchains.yaml "
            "lists each base's python). Nothing was written."
        )
    find_links = [str(f) for f in find_links]
    nodes: dict[str, dict] = {}
    warnings: list[str] = []
    seen: dict[tuple[str, str], tuple[str, str, str]] = {}
    for node in plan.nodes:
        entry: dict = {"kind": node.kind}
        if node.method:
            entry["method"] = node.method
        entry["plan_hash"] = node.hash
        index = getattr(node, "index_secret", "") or node.build_args.get("PIP_INDEX_URL", "")
        extra = node.build_args.get("PIP_EXTRA_INDEX_URL", "")
        entry["index"] = redact(index) or DEFAULT_INDEX
        if node.kind == "base-pip":
            entry["os_image"] = _os_image_record(node.build_args.get("OS_IMAGE", ""), client)
            progress(f"{node.name}: OS image {entry['os_image']['tag']} = {entry['os_image']['image_id'][:19]}")
        elif node.kind == "base-nvidia":
            from cudastack.registry import client as registry
            from cudastack.registry import digest as registry_digest
            ref = node.build_args.get("BASE_IMAGE", "")
            digest = registry_digest.resolve_digest(ref)
            r = registry.parse_reference(ref)
            entry["base_image"] = {"ref": ref, "digest": digest, "reference": r.with_digest(digest).pinned()}
            progress(f"{node.name}: {ref} = {digest}")
        installs = {}
        for arg, inst in node_installs(node).items():
            progress(f"{node.name}: resolving {arg} ({' '.join(inst['specs'])})")
            held = {} if arg in SEPARATE_PREFIX_INSTALLS or inst["no_deps"] else _chain_pins(plan, node, nodes)
            kw = dict(target=target, index=index, extra_index=extra, find_links=find_links, no_deps=inst["no_deps"],
                      python=python, where=f"node {node.name} ({arg})")
            requires: dict = {}
            pkgs = resolve(inst["specs"], requires=requires, **kw)
            keep = kept_pins(held, inst["specs"], pkgs, requires, target) if held else {}
            if keep and any(p["version"] != keep.get(p["name"], p["version"]) for p in pkgs):
                try:
                    pkgs = resolve(inst["specs"], constraints=keep, **kw)
                except LockError:
                    warnings.append(f"{node.name} ({arg}): the versions its parent image holds could not all be "
                                    "kept; pinned the newest resolution instead")
            if not inst["no_deps"]:   # one CUDA release for the toolkit wheels of this environment (C25)
                pkgs, note = cuda_wheels.cohere(pkgs, requires, inst["specs"],
                                                lambda cons: resolve(inst["specs"], constraints={**keep, **cons}, **kw))
                if note:
                    warnings.append(f"{node.name} ({arg}): {note}")
            installs[arg] = {"requested": _requested_specs(inst["specs"]), "no_deps": inst["no_deps"],
                             "packages": pkgs}
            where_key = arg if arg in SEPARATE_PREFIX_INSTALLS else "env"
            chain = _plan_ancestors(plan, node)
            for p in pkgs:
                prev = seen.get((where_key, p["name"]))
                if prev and prev[2] not in chain:   # another image chain (vLLM's torch beside SGLang's)
                    prev = None
                if prev and prev[0] != p["version"]:
                    warnings.append(f"{p['name']}: {prev[1]} installs {prev[0]}, {node.name} ({arg}) installs "
                                    f"{p['version']} on top")
                seen[(where_key, p["name"])] = (p["version"], f"{node.name} ({arg})", node.name)
            progress(f"{node.name}: {arg}: {len(pkgs)} packages pinned")
        if installs:
            entry["installs"] = installs
        if node.kind == "wheels" and node.method == "source":
            src = _source_entry(node)
            if src.get("sdist"):
                sd = src["sdist"]
                entry["sdists"] = [sdist_pin(sd["package"], str(sd["version"]), index=index, find_links=find_links)]
                progress(f"{node.name}: sdist {entry['sdists'][0]['filename']} sha256 {entry['sdists'][0]['sha256'][:12]}")
            elif src.get("git"):
                g = src["git"]
                entry["git"] = [git_pin(g["url"], g.get("ref", ""), g.get("commit", ""))]
            elif node.build_args.get("PIP_SPECS", "").strip() == "./src" or src.get("path"):
                from cudastack.plan.hash import dir_digest
                folder = (getattr(node, "context", {}) or {}).get("src") or src.get("path")
                entry["paths"] = [{"path": Path(folder).name, "sha256": dir_digest(folder)}]
        nodes[node.name] = entry
    lock = {
        "lock_version": LOCK_VERSION,
        "toolchain": plan.toolchain,
        "cuda_version": plan.cuda_version,
        "base_kind": plan.base_kind,
        "target_archs": list(plan.target_archs),
        **({"skipped": list(plan.skipped)} if getattr(plan, "skipped", None) else {}),
        "resolver": {"tool": (resolve.describe() if hasattr(resolve, "describe")
                              else f"pip {pip_version} install --dry-run --report (installation report v1)"),
                     "python_version": target["python_version"], "glibc": target["glibc"],
                     "machine": target["machine"], "implementation": target["implementation"],
                     "resolved_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "nodes": nodes,
    }
    if warnings:
        lock["warnings"] = warnings
    check_schema(lock, "the resolved lock")
    return lock


def _os_image_record(tag: str, client) -> dict:
    if not tag:
        raise LockError("The base-pip node has no OS_IMAGE build arg; the plan is incomplete.")
    try:
        from cudastack.osimage.bootstrap import os_image_record
        rec = os_image_record(tag)
    except UsageError:
        raise LockError(f"The OS image {tag} is not on this host, so its id cannot be pinned. Bootstrap it first "
                        "(invoke bootstrap-base) and lock again.") from None
    return {k: v for k, v in rec.items() if v != "" or k in ("tag", "image_id")}


def _plan_ancestors(plan, node) -> set[str]:
    """``node``'s name and every plan node it needs, directly or not (all parents, wheels nodes included): the
    nodes whose installs can meet this one's in one environment. Two runtimes' chains (SGLang's torch 2.14.1,
    vLLM's 2.14.0) never do."""
    by_name = {n.name: n for n in plan.nodes}
    out, todo = set(), [node.name]
    while todo:
        n = todo.pop()
        if n in out or n not in by_name:
            continue
        out.add(n)
        todo.extend(by_name[n].parents)
    return out


def _chain_pins(plan, node, resolved: dict[str, dict]) -> dict[str, str]:
    """{name: version} the image chain under ``node`` already holds in its Python environment: the installs of
    its image parent and that parent's ancestors (first parent of each node), from ``resolved`` lock entries.
    pip keeps an installed version that satisfies a new requirement, so the node's resolution starts from
    these (as constraints)."""
    pins: dict[str, str] = {}
    chain = []
    cur = node
    while cur.parents:
        parent = next((n for n in plan.nodes if n.name == cur.parents[0]), None)
        if parent is None or parent.kind == "wheels":
            break
        chain.append(parent.name)
        cur = parent
    for name in reversed(chain):
        for arg, inst in (resolved.get(name, {}).get("installs") or {}).items():
            if arg in SEPARATE_PREFIX_INSTALLS or inst.get("no_deps"):
                continue
            pins.update({p["name"]: p["version"] for p in inst["packages"]})
    return pins


def _keep_other_nodes(lock: dict, previous: Optional[dict], only: list[str], path, kept: Optional[list]) -> None:
    """Refresh only the nodes in ``only``: every other node of ``lock`` takes the old lock's entry as it is.
    Raises UsageError for a name that is no node of the plan, LockError when the old lock has no entry to keep
    (nothing is written then). Appends to ``kept`` one line per kept node whose fresh entry differed, and
    merges the old warnings with the fresh ones that name a refreshed node."""
    unknown = [n for n in only if n not in lock["nodes"]]
    if unknown:
        raise UsageError(f"--node {', '.join(unknown)}: not a node of the plan ({', '.join(lock['nodes'])}). "
                         "Name nodes as `invoke plan` lists them.")
    old_nodes = (previous or {}).get("nodes") or {}
    for n in lock["nodes"]:
        if n in only:
            continue
        if n not in old_nodes:
            raise LockError(f"Refreshing only {', '.join(only)}: the existing lock {path} has no entry for node {n} "
                            "to keep. Lock the whole plan (no --node). Nothing was written.")
        if old_nodes[n] != lock["nodes"][n] and kept is not None:
            moved = sorted(k for k in set(old_nodes[n]) | set(lock["nodes"][n])
                           if old_nodes[n].get(k) != lock["nodes"][n].get(k))
            kept.append(f"{n}: kept the old entry; a fresh resolution differs in {', '.join(moved)}")
        lock["nodes"][n] = old_nodes[n]
    old_warnings = list((previous or {}).get("warnings") or [])
    fresh = [w for w in lock.get("warnings") or []
             if any(w.startswith(f"{n} (") or f" {n} (" in w for n in only) and w not in old_warnings]
    lock.pop("warnings", None)
    if old_warnings + fresh:
        lock["warnings"] = old_warnings + fresh


def lock_plan(plan, path: str | Path, *, only: Iterable[str] = (), kept: Optional[list] = None, **kw) -> dict:
    """Resolve ``plan`` and write the lock to ``path`` atomically (the old lock stays byte for byte on any
    error). Keeps outputs/pushed entries of nodes whose lock entry (plan hash, closures, sdists, base) and whose
    ancestors' entries are unchanged, read again just before the write (under :func:`exclusive`), so a push
    recorded while resolving is not lost; a node whose closure moved loses its outputs (they were built from the
    old one). ``only``: node names whose entries are refreshed; every other node keeps the old lock's entry as
    it is (LockError when the old lock has none), and ``kept`` (a list, when given) receives one line per kept
    node whose fresh resolution differed (what a full relock would have moved). Returns the lock."""
    only = list(only)
    lock = resolve_lock(plan, **kw)
    with exclusive(path):
        previous = None
        if Path(path).exists():
            try:
                previous = load_lock(path)
            except LockError:
                previous = None
        if only:
            _keep_other_nodes(lock, previous, only, path, kept)
        if previous:
            same = {n for n, e in lock["nodes"].items() if (previous.get("nodes") or {}).get(n) == e}

            def unchanged(n: str) -> bool:   # the node's entry and every ancestor's are what they were
                node = next((x for x in plan.nodes if x.name == n), None)
                return n in same and node is not None and all(unchanged(p) for p in node.parents)

            kept_out = {n: v for n, v in (previous.get("outputs") or {}).items() if unchanged(n)}
            kept_push = {n: v for n, v in (previous.get("pushed") or {}).items() if n in kept_out}
            if kept_out:
                lock["outputs"] = kept_out
            if kept_push:
                lock["pushed"] = kept_push
        write_lock(path, lock)
    return lock
