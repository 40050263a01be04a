"""What locked builds produced and where they went: ``outputs`` (image ids, wheel sha256) and ``pushed``
(registry digests) recorded in the lock, pushes and pulls by digest driven from the lock, an image checked
against the versions the lock pins, and a human summary.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cudastack.core.errors import LockError, UsageError
from cudastack.lock.apply import verify_plan_against_lock
from cudastack.lock.model import (CUDA_WHEELS_PREFIX, SEPARATE_PREFIX_INSTALLS, _refresh, load_lock,
                                  update_lock)

if TYPE_CHECKING:
    from cudastack.registry.client import PushedImage


def record_outputs(path: str | Path, node: str, *, image_id: Optional[str] = None, tag: Optional[str] = None,
                   wheels: Optional[list[dict]] = None) -> dict:
    """Record what a locked build of ``node`` produced: ``outputs.<node>.{image_id, tag, wheels: [{filename,
    sha256}]}``. Raises LockError when the lock has no such node."""
    def fn(lock):
        if node not in lock["nodes"]:
            raise LockError(f"The lock has no node {node}; {_refresh(lock)}")
        out = lock.setdefault("outputs", {}).setdefault(node, {})
        if image_id:
            out["image_id"] = image_id
        if tag:
            out["tag"] = tag
        if wheels is not None:
            out["wheels"] = [{"filename": w["filename"], "sha256": w["sha256"]} for w in wheels]
    return update_lock(path, fn)


def wheel_records(folder: str | Path, names: Optional[Iterable[str]] = None) -> list[dict]:
    """``[{"filename", "sha256"}]`` for the wheels in ``folder`` (all ``*.whl`` or only ``names``)."""
    files = [Path(folder) / n for n in names] if names else sorted(Path(folder).glob("*.whl"))
    return [{"filename": f.name, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in files]


def record_push(path: str | Path, node: str, pushed) -> dict:
    """Record a push of ``node`` (a :class:`cudastack.registry.client.PushedImage`): ``pushed.<node>.{reference,
    enroot, digest, image_id, tag}``. Never records credentials (the PushedImage holds none)."""
    def fn(lock):
        if node not in lock["nodes"]:
            raise LockError(f"The lock has no node {node}; {_refresh(lock)}")
        lock.setdefault("pushed", {})[node] = dict(pushed.as_dict())
    return update_lock(path, fn)


def record_build_outputs(path: str | Path, build_record: dict) -> dict:
    """Record a build record's results (``cudastack.build.executor.run_build``'s dict: ``nodes[].{name, status,
    image_id, tag, plan_hash, wheels: {file: sha256}}``) into ``outputs`` of the lock at ``path``, atomically,
    for every node that was built, found cached or pulled from a node cache (:func:`apply_build_outputs`)."""
    return update_lock(path, lambda lock: apply_build_outputs(lock, build_record))


def apply_build_outputs(lock: dict, build_record: dict) -> None:
    """:func:`record_build_outputs` on a lock dict in memory. The node's ``plan_hash`` becomes the plan hash the
    build used (the lock was verified against that plan: a change that leaves every pin as it was, such as the
    suite's code, needs no relock), so a later relock of the same plan keeps these outputs. A push recorded for
    another image of the node is dropped: it no longer describes what the lock's outputs are.

    A wheels node built on another builder (the record's ``builder``) has only a marker image in this engine
    (:func:`cudastack.build.executor._mark_local`: its id is made here, at this time, and names nothing another machine
    can pull), so its ``image_id`` is not recorded. The lock keeps ``built_on`` (the builder), the wheels'
    sha256 and, when that builder pushed it to a node cache, ``cache_digest``: the manifest digest a pull of the
    node must get (:class:`cudastack.build.node_cache.NodeCache` refuses any other)."""
    for n in build_record.get("nodes", []):
        if n.get("status") not in ("built", "skipped", "pulled") or n.get("name") not in lock["nodes"]:
            continue
        if n.get("plan_hash"):
            lock["nodes"][n["name"]]["plan_hash"] = n["plan_hash"]
        remote = n.get("status") in ("built", "skipped") and n.get("builder") and n.get("kind") == "wheels"
        pushed = (lock.get("pushed") or {}).get(n["name"])
        if pushed and n.get("image_id") and pushed.get("image_id") != n["image_id"]:
            del lock["pushed"][n["name"]]
            if not lock["pushed"]:
                del lock["pushed"]
        out = lock.setdefault("outputs", {}).setdefault(n["name"], {})
        if remote:
            out.pop("image_id", None)
            out["built_on"] = n["builder"]
            cache = n.get("cache") or {}
            if cache.get("status") == "pushed" and cache.get("digest"):
                out["cache_digest"] = cache["digest"]
            elif n.get("status") == "built":
                out.pop("cache_digest", None)
        elif n.get("status") == "built":
            for k in ("built_on", "cache_digest"):
                out.pop(k, None)
        if n.get("image_id") and not remote:
            out["image_id"] = n["image_id"]
        if n.get("tag"):
            out["tag"] = n["tag"]
        if n.get("wheels"):
            out["wheels"] = [{"filename": f, "sha256": d} for f, d in sorted(n["wheels"].items())]


_LIST_SCRIPT = (
    "import importlib.metadata as m, json, os, sys; "
    "ls = lambda paths: sorted({(d.metadata['Name'], d.version) for d in m.distributions(path=paths)}); "
    "print(json.dumps({'env': ls(sys.path), 'prefix': ls([sys.argv[1]]) if os.path.isdir(sys.argv[1]) else []}))"
)


def expected_versions(lock: dict, nodes: Optional[Iterable[str]] = None) -> dict[tuple[str, str], tuple[str, str]]:
    """{(where, canonical name): (version, "node ARG")} of every package the lock's installs put into the image
    made of ``nodes`` (default: all nodes, in lock order); ``where`` is "env" (the image's Python environment)
    or "prefix" (:data:`CUDA_WHEELS_PREFIX`, for :data:`SEPARATE_PREFIX_INSTALLS`). A later install of a name
    in the same place overrides an earlier one."""
    want = {}
    for name, e in lock["nodes"].items():
        if nodes is not None and name not in nodes:
            continue
        for arg, inst in (e.get("installs") or {}).items():
            where = "prefix" if arg in SEPARATE_PREFIX_INSTALLS else "env"
            for p in inst["packages"]:
                want[(where, p["name"])] = (p["version"], f"{name} {arg}")
    return want


def check_image_against_lock(image: str, lock: dict, *, nodes: Optional[Iterable[str]] = None, client=None,
                             python: str = "python") -> list[str]:
    """Run ``image`` once and list every installed Python distribution (``importlib.metadata`` over the
    image's ``sys.path`` and :data:`CUDA_WHEELS_PREFIX`); return one line per locked package that is missing
    or installed at another version (empty: the image holds exactly the locked versions). ``nodes``: the
    plan nodes the image contains (default: all nodes of the lock)."""
    from cudastack.registry.client import docker_client

    client = client or docker_client()
    try:
        out = client.containers.run(image, [python, "-c", _LIST_SCRIPT, CUDA_WHEELS_PREFIX], remove=True,
                                    network_disabled=True, entrypoint=[])
    except Exception as exc:  # noqa: BLE001 - ContainerError, ImageNotFound, APIError
        raise LockError(f"Cannot list the Python packages in {image}: {exc}") from None
    listing = json.loads(out.decode().strip().splitlines()[-1])
    have: dict[tuple[str, str], set[str]] = {}
    for place in ("env", "prefix"):
        for name, version in listing.get(place, []):
            have.setdefault((place, canonicalize_name(name)), set()).add(version)
    problems = []
    for (place, name), (version, where) in sorted(expected_versions(lock, nodes).items()):
        got = have.get((place, name))
        loc = "" if place == "env" else f" under {CUDA_WHEELS_PREFIX}"
        if not got:
            problems.append(f"{name}=={version} ({where}) is not installed{loc}")
        elif version not in got:
            problems.append(f"{name}=={version} ({where}) is installed{loc} as {', '.join(sorted(got))}")
    return problems


def summary(lock: dict) -> str:
    """A short human listing of the lock's entries (for `invoke lock` and the closing notes)."""
    lines = [f"lock for CUDA {lock['toolchain']} ({lock['cuda_version']}), base {lock.get('base_kind')}, "
             f"resolved for Python {lock['resolver']['python_version']} glibc {lock['resolver']['glibc']}"]
    for name, e in lock["nodes"].items():
        lines.append(f"  {name} [{e['kind']}{' ' + e['method'] if e.get('method') else ''}]")
        if e.get("os_image"):
            o = e["os_image"]
            lines.append(f"    os image {o['tag']} {o['image_id']} (mirror {o.get('mirror', '?')} {o.get('suite', '')} "
                         f"Release {o.get('release-date', '?')})")
        if e.get("base_image"):
            lines.append(f"    base image {e['base_image']['reference']}")
        for arg, inst in (e.get("installs") or {}).items():
            req = {canonicalize_name(Requirement(s).name) for s in inst["requested"] if _is_req(s)}
            top = [p for p in inst["packages"] if p["name"] in req]
            lines.append(f"    {arg}: {len(inst['packages'])} packages; requested: "
                         + ", ".join(f"{p['name']}=={p['version']} sha256:{p['sha256'][:12]}" for p in top))
        for sd in e.get("sdists") or []:
            lines.append(f"    sdist {sd['filename']} sha256:{sd['sha256']}")
        for g in e.get("git") or []:
            lines.append(f"    git {g['url']} {g.get('ref', '')} @ {g['commit']}")
        for pth in e.get("paths") or []:
            lines.append(f"    source folder {pth['path']} sha256:{pth['sha256']}")
    for name, o in (lock.get("outputs") or {}).items():
        lines.append(f"  output {name}: image {o.get('image_id', '-')}"
                     + "".join(f"\n    wheel {w['filename']} sha256:{w['sha256']}" for w in o.get("wheels", [])))
    for name, p in (lock.get("pushed") or {}).items():
        lines.append(f"  pushed {name}: {p['reference']}\n    enroot {p['enroot']}")
    return "\n".join(lines)


def _is_req(s: str) -> bool:
    try:
        Requirement(s)
        return True
    except InvalidRequirement:
        return False


def push_locked(plan, lock_path, registry_prefix: str, *, nodes: Optional[list[str]] = None, client=None,
                progress: Callable[[str], None] = lambda s: None) -> dict[str, PushedImage]:
    """Push the images of ``nodes`` (default ["runtime"]) of a locked build and record each push in the lock
    at ``lock_path``. Checks first, before any push: the plan matches the lock (LockError naming stale
    entries), each image exists locally under the tag the locked build recorded (``outputs.<node>.tag``, else the
    plan's tag) and is the image it recorded (``outputs.<node>.image_id``).
    The lock is written only after a push was verified; on any error it stays byte for byte.
    Returns {node: PushedImage}."""
    import docker.errors

    from cudastack.registry.client import docker_client, parse_registry_prefix, ping, push_image, push_target

    parse_registry_prefix(registry_prefix)
    lock = load_lock(lock_path)
    verify_plan_against_lock(plan, lock, where=str(lock_path))
    names = nodes or ["runtime"]
    client = client or docker_client()
    todo = []
    for name in names:
        try:
            node = plan.node(name)
        except KeyError:
            raise UsageError(f"Node {name!r} is not in the plan; nodes: {', '.join(n.name for n in plan.nodes)}.") from None
        if node.kind == "wheels":
            raise UsageError(f"Node {name} exports wheels, not an image; push its consumer (runtime).")
        out_rec = (lock.get("outputs") or {}).get(name) or {}
        tag = out_rec.get("tag") or node.tag      # the locked build's tag (cudastack.lock.apply_lock)
        try:
            image_id = client.images.get(tag).id
        except docker.errors.ImageNotFound:
            raise UsageError(f"No local image {tag} for node {name}; build it first "
                             f"(invoke build --cuda {plan.toolchain} --locked).") from None
        expected = out_rec.get("image_id")
        if expected and expected != image_id:
            raise UsageError(f"The local image {tag} is {image_id[:19]}, but the locked build recorded "
                             f"{expected[:19]}; rebuild with `invoke build --cuda {plan.toolchain} --locked`.")
        todo.append((name, tag, push_target(tag, registry_prefix)))
    ping(parse_registry_prefix(registry_prefix)[0])   # down: fail before any push
    out = {}
    for name, tag, target in todo:
        pushed = push_image(tag, target, client=client, progress=progress)
        record_push(lock_path, name, pushed)
        out[name] = pushed
    return out


def checked_push(rec: dict, node: str, where: str = "the lock") -> dict:
    """``pushed.<node>`` (``{"digest", "reference", "enroot", "image_id", "tag"}``) checked for agreement before
    anything is pulled or written from it: ``reference`` parses as ``registry/name@sha256:<64 hex>``,
    ``digest`` is that reference's digest, and ``enroot`` is its enroot spelling (``registry#name@sha256:...``,
    :meth:`cudastack.registry.reference.ImageReference.enroot`). Returns ``rec``. Raises LockError naming the field that
    disagrees (case C47: an edit to one spelling alone must never pull or schedule with exit 0)."""
    import re

    from cudastack.registry.reference import parse_reference

    fix = (f"the three spellings in pushed.{node} of {where} must name one digest; run `invoke push` again where the "
           "image was built (it rewrites all three), or restore the lockfile from version control")
    try:
        ref = parse_reference(str(rec.get("reference") or ""))
    except UsageError as exc:
        raise LockError(f"pushed.{node}.reference {rec.get('reference')!r} does not parse ({exc}); {fix}.") from None
    if not ref.digest or not re.fullmatch(r"sha256:[0-9a-f]{64}", ref.digest):
        raise LockError(f"pushed.{node}.reference {rec.get('reference')!r} carries no sha256 digest; {fix}.")
    if rec.get("digest") != ref.digest:
        raise LockError(f"pushed.{node}.digest is {rec.get('digest')!r} but pushed.{node}.reference pins "
                        f"{ref.digest}; {fix}.")
    if rec.get("enroot") != ref.enroot():
        raise LockError(f"pushed.{node}.enroot is {rec.get('enroot')!r} but pushed.{node}.reference spells "
                        f"{ref.enroot()} for enroot; {fix}.")
    return rec


def pull_locked(lock_path, *, node: str = "runtime", client=None,
                progress: Callable[[str], None] = lambda s: None):
    """Pull the image the lock at ``lock_path`` records as pushed for ``node`` by digest and verify it
    (:func:`pull_by_digest` against ``pushed.<node>.image_id``). Returns the docker SDK Image."""
    from cudastack.registry.client import pull_by_digest

    lock = load_lock(lock_path)
    rec = (lock.get("pushed") or {}).get(node)
    if not rec:
        raise LockError(f"{lock_path} records no push of node {node}; run `invoke push --cuda "
                         f"{lock.get('toolchain')} --registry ...` where the image was built.")
    checked_push(rec, node, str(lock_path))
    return pull_by_digest(rec["reference"], expected_image_id=rec.get("image_id"), client=client, progress=progress)
