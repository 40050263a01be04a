"""Node hashes: what goes into a plan node's content hash, and the hash itself.

Hash: sha256 over the canonical JSON (sorted keys, no spaces) of the node's inputs (:func:`node_hash_inputs`):
the component's recipe fields for this toolchain, the toolchain and base choice, the output-affecting knobs,
the build args, the Dockerfile's text, a digest of any local files sent in the build context (a ``path``
source; the validation suite for the runtime image is sent but not hashed, :data:`UNHASHED_CONTEXT`) and the
parents' hashes. Parallelism knobs (MAX_JOBS, NVCC_THREADS, ...) are shown and passed but not hashed: they
change how fast a node builds, not what it contains, so the same plan on a builder with other free memory stays
cached. Recipe comments, ``description`` and ``est_disk_gib`` are not hashed either.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from cudastack.core.credentials import scrub
from cudastack.plan.model import Knob, build_env
from cudastack.recipes.load import Component, Toolchain

HASH_FORMAT = 1
# build-context folders that travel with a node but are not part of its content hash (see plan_build)
UNHASHED_CONTEXT = ("stackprobe",)
_SKIP_PARTS = {"__pycache__", ".pytest_cache", "build", "dist", ".git"}


def canonical_json(obj) -> str:
    """The canonical form that is hashed: JSON, sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(inputs: dict) -> str:
    """sha256 hex of :func:`canonical_json` of ``inputs``."""
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def dir_digest(path: str | Path) -> str:
    """sha256 over every file under ``path`` (relative path, mode bit x, content), in sorted order,
    skipping caches (``__pycache__``, build outputs, ``.git``). Used for local build-context folders."""
    root = Path(path)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in _SKIP_PARTS or part.endswith(".egg-info") for part in rel.parts) or p.suffix == ".pyc":
            continue
        if p.is_file() and not p.is_symlink():
            h.update(f"{rel.as_posix()}\0{os.access(p, os.X_OK):d}\0".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
        elif p.is_symlink():
            h.update(f"{rel.as_posix()}\0->{os.readlink(p)}\0".encode())
    return h.hexdigest()


def recipe_view(c: Component, tc: Toolchain) -> dict:
    """The recipe fields of ``c`` that are hashed for toolchain ``tc``: everything but ``description``,
    ``est_disk_gib``, the parallelism budget, the other toolchains' entries, a wheel entry's ``source:`` block and
    the dry run's cost hints (``unit_cost``, ``units_from``, ``units_reference``); an index login is scrubbed."""
    view = {k: v for k, v in c.raw.items() if k not in ("description", "est_disk_gib", "parallelism", "toolchains")}
    entry = c.toolchains[tc.name]
    raw = {k: v for k, v in entry.raw.items()
           if not (k == "source" and entry.method == "wheel") and k not in ("unit_cost", "units_from", "units_reference")}
    # none of these changes the output
    view["toolchain_entry"] = scrub(raw)     # an index login is no input of the image; a wheel entry's unused
    #                                          source block is none either
    if c.parallelism and (entry.method == "source" or c.kind != "image"):
        # which knobs receive the job counts is part of what is built; the budget numbers are not (an image
        # node installing a wheel compiles nothing: its parallelism block is for its source build)
        view["parallelism_knobs"] = [list(c.parallelism.jobs_knobs), list(c.parallelism.threads_knobs)]
    return view


def node_hash_inputs(*, c: Component, tc: Toolchain, kind: str, base_kind: str, base_choice, knobs: list[Knob],
                     parallel: list[str], args: dict[str, str], dockerfile_text: str, context: dict[str, str],
                     image_parent: str, parent_hashes: dict[str, str]) -> dict:
    """The dict whose :func:`content_hash` is the node's hash. Of the build args, ``WHEEL_NAMES`` (filled at
    build time) is left out, ``BUILD_ENV`` is hashed without the parallelism knobs (``parallel``: their names)
    and ``PARENT_IMAGE`` as the parent's name (its hash is in ``parents``: ``parent_hashes``, {name: hash}).
    ``context``: build-context folder -> host path; each hashed folder enters as its :func:`dir_digest`."""
    hashed_args = dict(args)
    hashed_args.pop("WHEEL_NAMES", None)
    if "BUILD_ENV" in hashed_args:
        hashed_args["BUILD_ENV"] = build_env([k for k in knobs if k.name not in parallel])
    if "PARENT_IMAGE" in hashed_args:
        hashed_args["PARENT_IMAGE"] = image_parent   # the parent's hash is hashed below
    # The validation suite's folder is copied into the runtime image (so `python -m stackprobe` works where
    # the checkout is absent, e.g. cluster jobs) but is not an input of the hash: a probe change leaves the
    # stack's tag, lock and push as they are. Reports name the suite that ran by its own digest
    # (stackprobe.report.suite_digest), and `invoke validate` mounts this checkout's suite by default.
    ctx_digest = {k: dir_digest(v) for k, v in context.items() if v and k not in UNHASHED_CONTEXT}
    return {
        "format": HASH_FORMAT,
        "node": c.name,
        "kind": kind,
        "recipe": recipe_view(c, tc),
        "toolchain": {"name": tc.name, "cuda_version": tc.cuda_version, "base": base_kind,
                      "base_choice": dataclasses.asdict(base_choice)},
        "knobs": {k.name: k.value for k in knobs if k.name not in parallel},
        "build_args": hashed_args,
        "dockerfile": dockerfile_text,
        "context": ctx_digest,
        "parents": parent_hashes,
    }
