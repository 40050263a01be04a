"""Bigger builders: send source nodes (or every node) to a buildx builder the user made, so a torch compile does
not have to run on a laptop. A builder is what ``docker buildx ls`` lists: one made with ``docker buildx create
--name NAME [CONTEXT]`` (docker-container, remote or Kubernetes driver), or a docker context
(``docker context create NAME --docker host=ssh://user@big-host``), which buildx lists as a builder of the
``docker`` driver named after the context; builds go there as ``docker --context NAME buildx build``.

What goes where (``invoke build --builder NAME [--builder-nodes source|all]``):

* a **wheels** node sent to the builder builds its ``wheels`` stage there and exports it with
  ``--output type=local`` back to this client: the wheel lands in the same wheelhouse (sha256 recorded in the
  manifest, build record and lock) as a local build's. The node's local tag, which marks it done, is then a
  one-line image built on the local engine (``FROM`` the parent, the node's labels plus
  ``org.cudastack.builder``): nothing is compiled twice and no builder stage is copied back.
* an **image** node (torch from source) is built there with ``--load``: a docker-container, remote or
  Kubernetes builder sends the image to this client's engine; a builder of the ``docker`` driver keeps it in
  its own engine, which the build then reports as an error unless that engine is this one.

The builder must reach each node's parent image: its engine holds it (``docker`` driver: checked before the
build; load it with ``docker save TAG | docker --context CTX load``), or the parent is in a registry it can
pull from (``invoke push``). Errors (UsageError, exit 2, before any build): no such builder (``docker buildx
inspect NAME`` fails), a ``docker``-driver builder whose engine lacks a parent.

With a node cache (``--cache``, :mod:`cudastack.build.node_cache`) the builder shares it through the node tags: a node
the registry holds is pulled here before anything is sent, so the builder never builds it (nor needs its
parent: :func:`check_parents` leaves such nodes out); an image node built there comes back with ``--load`` and is
pushed from this engine as a local build's; a wheels node built there is pushed by the builder itself
(:func:`push_from_builder`: its ``builder`` stage, which holds ``/wheels``, built again from the builder's own
BuildKit cache with ``--push`` to the node's cache tag), since this engine holds only its marker image.
BuildKit's registry cache (``--cache-to type=registry``) is not used: the ``docker`` driver refuses it ("Cache
export is not supported for the docker driver", buildx 0.13.1 on dockerd 20.10.24, measured), and it would key
layers rather than nodes, so no node could be skipped.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from cudastack.core.errors import UsageError

SCOPES = ("source", "all")


@dataclass(frozen=True)
class Builder:
    """A buildx builder as ``docker buildx inspect NAME`` reports it: ``driver`` (docker, docker-container,
    remote, kubernetes), ``endpoint`` (a docker context name or a URL) and ``status``."""

    name: str
    driver: str
    endpoint: str
    status: str


def inspect_builder(name: str, docker: str = "docker") -> Builder:
    """Look a builder up. UsageError (one paragraph: how to list and create one) when buildx does not know it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise UsageError(f"--builder {name!r}: a buildx builder name (letters, digits, '.', '_', '-').")
    try:
        r = subprocess.run([docker, "buildx", "inspect", name], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--builder {name}: could not ask buildx about it ({exc}).") from None
    if r.returncode != 0:
        known = subprocess.run([docker, "buildx", "ls"], capture_output=True, text=True, timeout=60).stdout
        names = sorted({ln.split()[0].rstrip("*") for ln in known.splitlines()[1:]
                        if ln.strip() and not ln.startswith((" ", "\\", "└", "├"))})
        raise UsageError(
            f"--builder {name}: buildx has no builder of that name ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'not found'}). "
            f"Builders here: {', '.join(names) or 'none'}. Create one first: `docker context create {name} --docker "
            "host=ssh://user@big-host` (a docker engine there; buildx lists the context as a builder), or `docker "
            f"buildx create --name {name} --driver docker-container`; or leave --builder out to build on this engine. "
            "Nothing was built.")
    fields: dict[str, str] = {}
    for ln in r.stdout.splitlines():
        if ":" in ln:
            k, v = ln.split(":", 1)
            fields.setdefault(k.strip(), v.strip())
    return Builder(name, fields.get("Driver", ""), fields.get("Endpoint", ""), fields.get("Status", ""))


def sent(node, scope: str) -> bool:
    """Whether ``node`` goes to the builder under ``scope`` ("source": the nodes that compile, methods source
    and aot; "all": every node but the base, whose OS image is bootstrapped locally)."""
    if scope not in SCOPES:
        raise UsageError(f"--builder-nodes {scope}: use 'source' (the nodes that compile: source and aot builds) or 'all'.")
    if node.kind.startswith("base"):
        return False
    from cudastack.recipes.load import COMPILING_METHODS

    return scope == "all" or node.method in COMPILING_METHODS


def _image_on_context(docker: str, context: str, tag: str) -> bool:
    r = subprocess.run([docker, "--context", context, "image", "inspect", tag], capture_output=True, text=True,
                       timeout=60)
    return r.returncode == 0


def check_parents(builder: Builder, plan, scope: str, local_context: str = "", docker: str = "docker",
                  served: frozenset | set = frozenset(), pullable: frozenset | set = frozenset()) -> list[str]:
    """Before any build: for a ``docker``-driver builder on another engine, each sent node's parent image must
    be there (or be built there by this run). ``served``: names of nodes that will not be built at all (cached
    here, or in the node cache): they send nothing. ``pullable``: names of nodes the node cache holds: a sent
    child gets such a parent as ``PARENT_IMAGE=HOST/PREFIX/<repo>@sha256:...`` and the builder pulls it itself
    (:func:`cudastack.build.executor.run_build`). Returns notes for the dry run / log; raises UsageError listing the
    missing parents and how to load them."""
    nodes = [n for n in plan.nodes if sent(n, scope) and n.name not in served]
    if not nodes:
        return [f"builder {builder.name}: no node of this plan is sent (--builder-nodes {scope})"]
    if builder.driver != "docker" or not builder.endpoint or builder.endpoint == (local_context or "default"):
        return [f"builder {builder.name} ({builder.driver}): the parent images must be pullable by it (a registry: "
                "`invoke push`) unless its engine already holds them"]
    sent_names = {n.name for n in nodes}
    missing = []
    from_cache = sorted({n.parents[0] for n in nodes if n.parents and n.parents[0] in pullable} - sent_names)
    for n in nodes:
        parent = n.parents[0] if n.parents else ""
        if parent and parent not in sent_names and parent not in pullable:
            tag = plan.node(parent).tag
            if not _image_on_context(docker, builder.endpoint, tag):
                missing.append(tag)
    if missing:
        raise UsageError(
            f"--builder {builder.name}: it builds on the engine of context '{builder.endpoint}' (driver docker), "
            f"which does not hold the parent image(s) {', '.join(sorted(set(missing)))}. Load them there first "
            f"(`docker save TAG | docker --context {builder.endpoint} load`), push them to a registry it pulls from, "
            "or send every node (--builder-nodes all). Nothing was built.")
    notes = [f"builder {builder.name} (docker driver, context {builder.endpoint}): parents present there"
             + (f"; {', '.join(from_cache)} pulled there from the node cache by digest" if from_cache else "")]
    return notes


MARKER_DOCKERFILE = """ARG PARENT_IMAGE
FROM ${PARENT_IMAGE}
ARG BUILDER
LABEL org.cudastack.builder="${BUILDER}"
"""


def push_from_builder(cache, engine, node, entry: dict, build_kwargs: dict, log, say, label: str) -> None:
    """Push ``node`` (a wheels node just built on ``build_kwargs["builder"]``) to the node ``cache`` from that
    builder (module doc) and record it in the build record's ``entry["cache"]`` (``"by"``: the builder); the
    digest is read back from the registry. A failure is reported as :func:`cudastack.build.node_cache.push_node`'s is
    (warning, ``entry["cache"]``, the cache's failures) and never changes the node's own result."""
    import time

    from cudastack.core.errors import RegistryError, StackError
    from cudastack.registry.client import parse_reference

    bx = build_kwargs["builder"]
    target = cache.target(node)
    t0 = time.monotonic()
    try:
        engine.build(name=f"{node.name} (push from {bx.name})", log_path=log, say=say, target="builder", tag=target,
                     push=True, **build_kwargs)
        digest = cache.probe(node)
        if not digest:
            raise RegistryError(f"builder {bx.name} pushed {target}, but the registry does not serve it")
    except StackError as exc:
        entry["cache"] = {"status": "push failed", "error": str(exc), "by": bx.name}
        cache.failures.append({"node": node.name, "op": "push", "error": str(exc)})
        say(f"warning: {label}: pushing it to the node cache from builder {bx.name} failed; the build's result "
            f"stands: {exc}")
        return
    finally:
        if bx.driver == "docker":          # that engine keeps the pushed name: drop it (its tag is what marks done)
            subprocess.run([engine.buildkit.docker, "--context", bx.endpoint or bx.name, "image", "rm", target],
                           capture_output=True, timeout=120)
    pinned = parse_reference(target).with_digest(digest).pinned()
    entry["cache"] = {"status": "pushed", "reference": pinned, "digest": digest, "by": bx.name,
                      "push_s": round(time.monotonic() - t0, 1)}
    say(f"{label}: pushed to the node cache as {pinned} by builder {bx.name}")
