"""The build plan as a buildx bake file (``docker-bake.json``), so remote BuildKit builders (e.g. the
Kubernetes driver of ``docker buildx``) build the matrix in parallel.

Format (Docker docs, "Bake file reference", JSON form): ``{"group": {NAME: {"targets": [...]}}, "target":
{NAME: {"context", "dockerfile", "args", "tags", "labels", "target", "output", "secret", "contexts"}}}``.
``contexts`` maps a name used in ``FROM`` to another target (``"target:<name>"``): a node's
``PARENT_IMAGE`` build arg names its parent's tag, and the same tag is mapped to the parent's target, so the
builder chains the targets without a registry in between (buildx "named contexts"). Wheel nodes build their
``wheels`` stage and export it (``output: type=local``) into the wheelhouse folder.

Build contexts are materialised next to the bake file (``<out dir>/ctx/<node>``) with the same layout a local
build uses (``src/``, ``stackprobe/``, ``wheelhouse/``) plus a copy of the node's Dockerfile (bake reads
``dockerfile`` relative to ``context``), so the folder is self-contained and can be shipped to a builder. The runtime node's
``wheelhouse/`` holds the wheels already in the local wheelhouse; on a fresh remote builder, bake the
``wheels`` group first, then run ``invoke bake`` again to refresh the runtime context, then bake ``runtime``.
The CA bundle for an intercepting proxy is passed as the BuildKit secret ``cabundle`` from the file named by
the bake variable ``CUDASTACK_CA_BUNDLE`` (override with the environment variable of the same name; bake
interpolates ``${VAR}`` in JSON files too). A node whose recipe names a private index with a login gets the
secret ``pipindex`` from the environment variable :func:`index_secret_env` names (set it to the index URL with
its login when running bake); the file itself holds the URL without the login.

With a node cache (``invoke bake --cache REGISTRY/PREFIX``, or ``CUDASTACK_NODE_CACHE``; :mod:`cudastack.build.node_cache`)
the file shares the cache through the node tags, as ``invoke build --cache`` does: each node's cache tag is asked
for when the file is written, and a node the registry serves gets no target; its children build ``FROM`` it by
digest (``PARENT_IMAGE=HOST/PREFIX/<repository>@sha256:...``, which any builder that reaches the registry pulls)
instead of through a named context. Each node the file builds gets a second target ``<name>-cache`` in the
default group (unless the cache is read-only) that pushes it to its cache tag (``output: type=registry``): the
same Dockerfile, context and args, so BuildKit serves it from the first build; a wheels node pushes its
``builder`` stage, whose ``/wheels`` a pull exports. A served wheels node's wheels reach the runtime's context only
from the local wheelhouse (``invoke build --cache`` pulls them there).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from cudastack.build.engine import output_spec
from cudastack.core.errors import UsageError
from stackprobe.api import write_atomic

CA_SECRET = "id=cabundle,src=${CUDASTACK_CA_BUNDLE}"   # bake interpolates the variable
_TARGET_RE = re.compile(r"[^A-Za-z0-9_-]")


def target_name(node_name: str) -> str:
    """A bake target name for a node (letters, digits, '_' and '-')."""
    return _TARGET_RE.sub("_", node_name)


def index_secret_env(node_name: str) -> str:
    """The environment variable a bake run reads a node's private index URL (with its login) from:
    ``CUDASTACK_PIP_INDEX_URL_<TARGET>`` (buildx ``--secret id=pipindex,env=VAR``)."""
    return f"CUDASTACK_PIP_INDEX_URL_{target_name(node_name).upper().replace('-', '_')}"


def bake_dict(plan, *, contexts: dict[str, str], dockerfiles: dict[str, str], wheel_outputs: dict[str, str],
              wheel_names: Optional[dict[str, str]] = None, extra_args: Optional[dict[str, dict[str, str]]] = None,
              ca_secret: bool = True, served: Optional[dict[str, str]] = None,
              push_to: Optional[dict[str, str]] = None, labels: Optional[dict[str, dict[str, str]]] = None) -> dict:
    """The bake file as a dict (pure). ``contexts``/``dockerfiles``/``wheel_outputs``: per node name, the
    build-context folder, the Dockerfile path and (wheel nodes) the export folder, all as they should appear
    in the file (relative to the bake file's folder). ``wheel_names``: the runtime node's WHEEL_NAMES.
    ``extra_args``: per node, build args to add (e.g. the
    lock's ``*_LOCKED`` args). ``served``: {node name: its pinned reference in the node cache} for nodes the file
    does not build (children take them by digest); ``push_to``: {node name: its cache tag} for the ``-cache``
    targets (module doc); ``labels``: per node, image labels to add (a runtime's ``org.cudastack.wheels``, the digest of
    the wheelhouse wheels its context holds, :func:`cudastack.build.context.runtime_wheels_digest`)."""
    served, push_to = served or {}, push_to or {}
    targets: dict[str, dict] = {}
    groups: dict[str, list[str]] = {"default": [], "images": [], "wheels": [], "runtime": []}
    by_name = {n.name: n for n in plan.nodes}
    for node in plan.nodes:
        if node.name in served:
            continue
        t = target_name(node.name)
        args = {k: v for k, v in node.build_args.items() if not (k == "WHEEL_NAMES" and node.kind != "runtime")}
        if node.kind == "runtime":
            args["WHEEL_NAMES"] = (wheel_names or {}).get(node.name, "")
        args.update((extra_args or {}).get(node.name, {}))
        entry: dict = {
            "context": contexts[node.name],
            "dockerfile": dockerfiles[node.name],
            "args": args,
            "labels": {"org.cudastack.node": node.name, "org.cudastack.hash": node.hash,
                       "org.cudastack.toolchain": plan.toolchain, **(labels or {}).get(node.name, {})},
        }
        parent_contexts = {}
        for p in node.parents:
            pn = by_name.get(p)
            if pn is not None and pn.kind != "wheels" and args.get("PARENT_IMAGE") == pn.tag:
                if pn.name in served:
                    args["PARENT_IMAGE"] = served[pn.name]
                else:
                    parent_contexts[pn.tag] = f"target:{target_name(pn.name)}"
        if parent_contexts:
            entry["contexts"] = parent_contexts
        if node.kind == "wheels":
            entry["target"] = "wheels"
            entry["output"] = [output_spec(wheel_outputs[node.name])]
            groups["wheels"].append(t)
        else:
            entry["tags"] = [node.tag]
            (groups["runtime"] if node.kind == "runtime" else groups["images"]).append(t)
        if ca_secret:
            entry["secret"] = [CA_SECRET]
        if getattr(node, "index_secret", ""):
            # a private index's login: from the environment of whoever runs bake, never written in this file
            entry.setdefault("secret", []).append(f"id=pipindex,env={index_secret_env(node.name)}")
        targets[t] = entry
        groups["default"].append(t)
        if node.name in push_to:
            push = {k: v for k, v in entry.items() if k not in ("output", "tags", "target")}
            push.update(tags=[push_to[node.name]], output=["type=registry"])
            if node.kind == "wheels":
                push["target"] = "builder"
            targets[f"{t}-cache"] = push
            groups.setdefault("cache", []).append(f"{t}-cache")
            groups["default"].append(f"{t}-cache")
    out = {"group": {g: {"targets": ts} for g, ts in groups.items() if ts}, "target": targets}
    if ca_secret:
        out["variable"] = {"CUDASTACK_CA_BUNDLE": {"default": "/etc/ssl/certs/ca-certificates.crt"}}
    return out


def write_bake(plan, out_path: str | Path, *, state_dir: str | Path = ".stack", lock: Optional[dict] = None,
               ca_secret: bool = True, cache=None) -> dict:
    """Write ``docker-bake.json`` for ``plan`` to ``out_path`` (atomically) and materialise each node's build
    context under ``<out dir>/ctx/<node>``. With ``lock`` (a verified lock), the plan becomes its locked
    build first (:func:`cudastack.lock.apply_lock`: locked build args and tags). ``cache``: an opened
    :class:`cudastack.build.node_cache.NodeCache` (module doc); the nodes it serves are returned under the dict's
    ``"x-cudastack-served"`` key ({node: pinned reference}), which is not written to the file. Returns the bake
    dict. Raises UsageError when ``out_path`` is not a ``.json`` file, RegistryError when the cache cannot be
    read."""
    from cudastack.build.context import WHEELS_LABEL, runtime_wheels_digest
    from cudastack.build.executor import Wheelhouse, _abs_dockerfile, _make_context

    out_path = Path(out_path).resolve()
    if out_path.suffix != ".json":
        raise UsageError(f"--output {out_path}: the bake file must end in .json (docker-bake.json format).")
    root = out_path.parent
    root.mkdir(parents=True, exist_ok=True)
    ctx_root = root / "ctx"
    wheelhouse = Wheelhouse(Path(state_dir).resolve() / plan.wheelhouse)
    contexts, dockerfiles, outputs, extra, names = {}, {}, {}, {}, {}
    node_labels: dict[str, dict[str, str]] = {}
    if lock is not None:
        from cudastack.lock import apply_lock
        apply_lock(plan, lock)       # locked build args, tags and the runtime's WHEELS_LOCKED
    served: dict[str, str] = {}
    push_to: dict[str, str] = {}
    if cache is not None:
        from cudastack.registry.client import parse_reference

        for node in plan.nodes:
            digest = cache.probe(node)
            if digest:
                served[node.name] = parse_reference(cache.target(node)).with_digest(digest).pinned()
            elif not cache.read_only:
                push_to[node.name] = cache.target(node)
    for node in plan.nodes:
        if node.name in served:
            continue
        ctx, made = _make_context(ctx_root, node, wheelhouse, plan)
        made.pop("_source", None)
        if "WHEEL_NAMES" in made:
            names[node.name] = made.pop("WHEEL_NAMES")
        if node.kind == "runtime":      # the wheels its context holds, as `invoke build` labels a runtime it builds
            node_labels[node.name] = {WHEELS_LABEL: runtime_wheels_digest(wheelhouse, node)}
        extra[node.name] = dict(made)
        final = ctx_root / target_name(node.name)
        if final.exists():
            shutil.rmtree(final)
        os.replace(ctx, final)
        shutil.copy2(_abs_dockerfile(node), final / "Dockerfile")   # bake reads `dockerfile` relative to the context
        contexts[node.name] = os.path.relpath(final, root)
        dockerfiles[node.name] = "Dockerfile"
        outputs[node.name] = os.path.relpath(Path(wheelhouse.path) / "export" / target_name(node.name), root)
    data = bake_dict(plan, contexts=contexts, dockerfiles=dockerfiles, wheel_outputs=outputs, wheel_names=names,
                     extra_args=extra, ca_secret=ca_secret, served=served, push_to=push_to, labels=node_labels)
    write_atomic(out_path, json.dumps(data, indent=2) + "\n")
    return {**data, "x-cudastack-served": served} if cache is not None else data
