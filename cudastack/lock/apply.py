"""From a lock to a locked build: staleness against the plan (:func:`stale_entries`), hash-checking requirements
and build args, the plan turned into its locked build (:func:`apply_lock`, :func:`prepare_locked_build`), and
pip's hash-checking failure explained (:func:`explain_pip_hash_failure`).

Locked builds install with ``pip install --require-hashes --no-deps -r <requirements>`` (pip's hash-checking
mode: every file must match a listed hash, or pip stops and names the package).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from packaging.utils import canonicalize_name

from cudastack.core.errors import LockError
from cudastack.lock.model import (DEFAULT_INDEX, HASH_MISMATCH_HEADER, Progress, _refresh, load_lock,
                                  lock_command)
from cudastack.lock.pins import describe_hash_check, verify_locked_hashes
from cudastack.lock.pip_resolver import _cert_args, _clean_env, index_args
from cudastack.lock.resolve import _requested_specs, _source_entry, node_installs


def stale_entries(plan, lock: dict, *, client=None) -> list[str]:
    """Every way ``lock`` does not match ``plan``, one line each naming the lock entry (empty: it matches).
    Compares toolchain, node set and kind/method, each pip install's requested specs and index, the sdist/git
    pins, the OS image's current local id (when ``client`` is given) and the base image reference."""
    out = []
    if lock.get("toolchain") != plan.toolchain or lock.get("cuda_version") != plan.cuda_version:
        out.append(f"toolchain: the lock is for CUDA {lock.get('toolchain')} ({lock.get('cuda_version')}), the plan "
                   f"for {plan.toolchain} ({plan.cuda_version})")
    if lock.get("base_kind") and lock.get("base_kind") != plan.base_kind:
        out.append(f"base_kind: the lock pins the '{lock.get('base_kind')}' base, the plan uses '{plan.base_kind}'")
    lnodes = lock.get("nodes") or {}
    for node in plan.nodes:
        e = lnodes.get(node.name)
        if e is None:
            out.append(f"nodes.{node.name}: not in the lock (a new component)")
            continue
        out += (_stale_kind_and_index(node, e) + _stale_installs(node, e) + _stale_sources(node, e)
                + _stale_os_image(node, e, client) + _stale_base_image(plan, node, e))
    skipped = set(getattr(plan, "skipped", []) or [])
    for name in sorted(set(lnodes) - {n.name for n in plan.nodes} - skipped):
        out.append(f"nodes.{name}: in the lock but no longer in the plan")
    return out


def _stale_kind_and_index(node, e: dict) -> list[str]:
    """A node's lock entry against its kind/method and its pip index."""
    out = []
    if e.get("kind") != node.kind or (e.get("method") or "") != (node.method or ""):
        out.append(f"nodes.{node.name}.kind: the lock has {e.get('kind')} {e.get('method') or ''}".rstrip()
                   + f", the plan {node.kind} {node.method or ''}".rstrip())
    index = node.build_args.get("PIP_INDEX_URL", "") or DEFAULT_INDEX
    if e.get("index", DEFAULT_INDEX) != index:
        out.append(f"nodes.{node.name}.index: the lock used {e.get('index')}, the plan uses {index}")
    return out


def _stale_installs(node, e: dict) -> list[str]:
    """A node's locked pip installs against the specs its recipes ask for, one line per install that differs."""
    want = {arg: _requested_specs(i["specs"]) for arg, i in node_installs(node).items()}
    have = {arg: i.get("requested", []) for arg, i in (e.get("installs") or {}).items()}
    return [f"nodes.{node.name}.installs.{arg}.requested: the lock has "
            f"{' '.join(have.get(arg) or []) or 'nothing'}, the recipes ask for "
            f"{' '.join(want.get(arg) or []) or 'nothing'}"
            for arg in sorted(set(want) | set(have)) if want.get(arg) != have.get(arg)]


def _stale_sources(node, e: dict) -> list[str]:
    """A source-built wheels node's locked sdist, git and source-folder pins against its recipe."""
    src = _source_entry(node) if node.kind == "wheels" and node.method == "source" else {}
    out = []
    if src.get("sdist"):
        sd = src["sdist"]
        pins = [(p.get("name"), p.get("version")) for p in e.get("sdists") or []]
        if (canonicalize_name(sd["package"]), str(sd["version"])) not in pins:
            out.append(f"nodes.{node.name}.sdists: the lock has {pins or 'none'}, the recipe asks for "
                       f"{sd['package']}=={sd['version']}")
    if src.get("git"):
        g = src["git"]
        pins = [(p.get("url"), p.get("commit")) for p in e.get("git") or []]
        if g.get("commit") and (g["url"], g["commit"]) not in pins:
            out.append(f"nodes.{node.name}.git: the lock pins {pins or 'nothing'}, the recipe asks for "
                       f"{g['url']}@{g['commit']}")
    if src.get("path") and e.get("paths"):
        from cudastack.plan.hash import dir_digest
        folder = (getattr(node, "context", {}) or {}).get("src") or src["path"]
        try:
            now = dir_digest(folder)
        except OSError:
            now = "missing"
        if now != e["paths"][0].get("sha256"):
            out.append(f"nodes.{node.name}.paths: the source folder {Path(folder).name} changed since it was "
                       f"locked (sha256 {now[:12]} now, {str(e['paths'][0].get('sha256'))[:12]} locked)")
    return out


def _stale_os_image(node, e: dict, client) -> list[str]:
    """A pip base's locked OS image against the plan's tag and (with ``client``) the image this host holds."""
    if node.kind != "base-pip":
        return []
    tag = node.build_args.get("OS_IMAGE", "")
    rec = e.get("os_image") or {}
    if rec.get("tag") != tag:
        return [f"nodes.{node.name}.os_image.tag: the lock has {rec.get('tag')}, the plan uses {tag}"]
    if client is None:
        return []
    try:
        img = client.images.get(tag)
        current, here_tool = img.id, (img.labels or {}).get("org.cudastack.os.tool", "")
    except Exception:  # noqa: BLE001
        current, here_tool = None, ""
    if current is None:
        return [f"nodes.{node.name}.os_image: {tag} is not on this host (locked id "
                f"{str(rec.get('image_id'))[:19]}); bootstrap it again or load it"]
    if current != rec.get("image_id"):
        locked_tool = rec.get("tool") or rec.get("debootstrap") or "an unrecorded tool"
        return [f"nodes.{node.name}.os_image.image_id: {tag} is now {current[:19]} on this host, the "
                f"lock pins {str(rec.get('image_id'))[:19]} (the OS image was bootstrapped again: "
                f"locked by {locked_tool}, here by {here_tool or 'a tool that left no label'})"]
    return []


def _stale_base_image(plan, node, e: dict) -> list[str]:
    """An NVIDIA base's locked image reference against the plan's (a locked plan may name it by digest)."""
    if node.kind != "base-nvidia":
        return []
    ref = node.build_args.get("BASE_IMAGE", "")
    rec = e.get("base_image") or {}
    if ref not in (rec.get("ref"), rec.get("reference") if getattr(plan, "locked", False) else None):
        return [f"nodes.{node.name}.base_image.ref: the lock has {(e.get('base_image') or {}).get('ref')}, "
                f"the plan uses {ref}"]
    return []


def verify_plan_against_lock(plan, lock: dict, *, client=None, where: str = "the lockfile") -> None:
    """Raise LockError listing every stale entry (see :func:`stale_entries`) and how to refresh the lock."""
    stale = stale_entries(plan, lock, client=client)
    if stale:
        raise LockError(f"{where} does not match the recipes: " + "; ".join(stale) + ". " + _refresh(lock))


def requirements_text(lock: dict, node: str, arg: str) -> str:
    """A pip requirements file in hash-checking mode for install ``arg`` of ``node``: one
    ``name==version --hash=sha256:...`` line per package of the closure, sorted. Install it with
    ``pip install --require-hashes --no-deps -r FILE`` (plus the node's index options).
    Raises LockError when the lock has no such install."""
    try:
        inst = lock["nodes"][node]["installs"][arg]
    except (KeyError, TypeError):
        raise LockError(f"The lock has no install {arg} for node {node}. {_refresh(lock)}") from None
    lines = [f"# {node} {arg}: {' '.join(inst.get('requested', []))} (cudastack lock, hash-checking mode)"]
    for p in sorted(inst["packages"], key=lambda p: p["name"]):
        lines.append(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}")
    return "\n".join(lines) + "\n"


def locked_build_args(lock: dict, node) -> dict[str, str]:
    """Docker build args a locked build of ``node`` (a plan Node) adds: for each pip install ``X`` (a build arg
    ``X_PIP_SPECS`` or ``BUILD_DEPS``), ``X_LOCKED`` = the hash-checking requirements text
    (:func:`requirements_text`); for an NVIDIA base ``BASE_IMAGE`` = ``name@sha256:...``. Each component
    Dockerfile (images/*.Dockerfile) writes a non-empty ``*_LOCKED`` text to a file and runs
    ``pip install --require-hashes --no-deps -r`` on it (``pip download`` for wheel nodes) instead of the
    unlocked install. Sdists are checked on the host (:func:`locked_sdist_sha256`). Call
    :func:`verify_plan_against_lock` first."""
    e = (lock.get("nodes") or {}).get(node.name)
    if e is None:
        raise LockError(f"The lock has no node {node.name}. {_refresh(lock)}")
    args = {f"{arg}_LOCKED": requirements_text(lock, node.name, arg) for arg in (e.get("installs") or {})}
    if e.get("base_image"):
        args["BASE_IMAGE"] = e["base_image"]["reference"]
    return args


def locked_sdist_sha256(lock: dict, node: str) -> dict[str, str]:
    """{sdist file name: sha256} the lock pins for a source node (empty when it pins none)."""
    return {p["filename"]: p["sha256"] for p in ((lock.get("nodes") or {}).get(node) or {}).get("sdists") or []}


def apply_lock(plan, lock: dict) -> None:
    """Turn ``plan`` (a BuildPlan, verified against ``lock``) into its locked build, in place: each node gets
    its :func:`locked_build_args`, a sdist node the pinned digests (``node.sdist["sha256_locked"]``:
    {file name: sha256}, checked by the executor before unpacking), and a new hash = sha256 over (plan hash, locked args, parents' locked hashes, the pip base's locked OS image id),
    so a locked build never reuses an image an unlocked build made under the plan's tag (same repository,
    tag = the locked hash's first 16 hex digits). ``PARENT_IMAGE`` follows the parents' new tags; the plan
    hash stays in ``node.inputs["plan_hash"]``. Applying twice is a no-op."""
    from cudastack.plan.hash import content_hash

    if getattr(plan, "locked", False):
        return
    new_tags: dict[str, str] = {}
    for node in plan.nodes:
        old_tag = node.tag
        args = locked_build_args(lock, node)
        sd = locked_sdist_sha256(lock, node.name)
        if getattr(node, "sdist", None) and sd:
            node.sdist = dict(node.sdist, sha256_locked=sd)
        parent = node.build_args.get("PARENT_IMAGE")
        if parent in new_tags:
            node.build_args["PARENT_IMAGE"] = new_tags[parent]
        node.build_args.update(args)
        inputs = {"plan_hash": node.hash, "locked_build_args": args, "sdists": sd,
                  "parents": {p: plan.node(p).hash for p in node.parents}}
        os_id = (((lock.get("nodes") or {}).get(node.name) or {}).get("os_image") or {}).get("image_id")
        if os_id:   # the OS image is content too: reproducible since C50, so its id is the same on every builder
            inputs["os_image"] = os_id
        h = content_hash(inputs)
        node.inputs = dict(node.inputs or {}, plan_hash=node.hash)
        node.hash = h
        node.tag = f"{old_tag.rsplit(':', 1)[0]}:{h[:16]}"
        new_tags[old_tag] = node.tag
    plan.locked = True


def explain_pip_hash_failure(output: str, lock: Optional[dict] = None) -> Optional[LockError]:
    """Turn pip's hash-checking failure (``THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS
    FILE``, followed by ``name==version from URL:`` / ``Expected sha256 ...`` / ``Got ...`` lines) into a
    LockError that starts "the lock and the index disagree on <package>" and names each package, or None when
    ``output`` holds no such failure. Either side can be the wrong one: the lockfile may have been edited, or
    the index may serve another file than the one that was locked."""
    if HASH_MISMATCH_HEADER not in output:
        return None
    block = output.split(HASH_MISMATCH_HEADER, 1)[1]
    found, names = [], []
    for m in re.finditer(r"^\s+([A-Za-z0-9_.\-\[\],]+==\S+) from (\S+?):?\s*\n\s+Expected sha256 ([0-9a-f]+)\s*\n"
                         r"\s+Got\s+([0-9a-f]+)", block, re.M):
        names.append(m.group(1))
        found.append(f"{m.group(1)} (file {m.group(2).rsplit('/', 1)[-1]}: the lock pins sha256 "
                     f"{m.group(3)[:16]}..., the downloaded file has {m.group(4)[:16]}...)")
    if not found:
        found = [ln.strip() for ln in block.splitlines() if "==" in ln][:5]
        names = [ln.split()[0] for ln in found]
    refresh = lock_command(lock) if lock else "invoke lock --cuda X"
    return LockError(
        f"The lock and the index disagree on {', '.join(names) or 'a package'}: pip's hash-checking mode refused "
        + "; ".join(found) + ". Either the lockfile was changed since it was made (see `git diff lockfiles/`; "
        "`invoke build --locked --dry-run` checks every locked hash against the index) or the index serves another "
        "file than the one that was locked (re-uploaded, tampered with, or a mirror of another build): find out "
        f"which before trusting either. If the index's file is intended, refresh the lock with `{refresh}` and "
        "review the diff. The lockfile was not changed."
    )


def install_locked(lock: dict, node: str, arg: str, *, target_dir: str | Path, python: str = sys.executable,
                   find_links: Iterable[str] = (), timeout: float = 3600) -> list[str]:
    """Install install ``arg`` of ``node`` into ``target_dir`` on this host with pip in hash-checking mode
    (``pip install --require-hashes --no-deps --target DIR -r <requirements>`` from the node's locked index),
    exactly what a locked image build runs inside its Dockerfile. Returns the installed ``name==version``
    list. Raises LockError naming every package whose file no longer matches its locked sha256."""
    e = lock["nodes"].get(node) or {}
    index = e.get("index", DEFAULT_INDEX)
    with tempfile.TemporaryDirectory(prefix="cudastack-locked-") as tmp:
        req = Path(tmp) / f"{arg}.txt"
        req.write_text(requirements_text(lock, node, arg))
        cmd = [python, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps", "--no-cache-dir",
               "--target", str(target_dir), "-r", str(req)] + _cert_args() + index_args(index, "", find_links)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=timeout)
    if proc.returncode != 0:
        err = explain_pip_hash_failure(proc.stdout + proc.stderr, lock)
        if err:
            raise err
        raise LockError(f"The locked install of {node} {arg} failed: {proc.stderr.strip()[-800:]}")
    return [f"{p['name']}=={p['version']}" for p in lock["nodes"][node]["installs"][arg]["packages"]]


def ensure_locked_os_image(plan, lock: dict, client, *, say: Optional[Progress] = None, cache=None) -> None:
    """A fresh builder (case C50): where the pip base's OS image the lock pins is not on this engine, pull it
    from the node ``cache`` when one is given and holds that image id (:func:`cudastack.registry.cache_parents.pull_os_image`:
    any other id is refused), else make it
    again from what the lock recorded (suite, mirror, variant), refusing first when the mirror now serves another
    Release than the locked one (LockError naming both), or when the lock's image was made by a tool that does
    not reproduce (debootstrap: LockError, relock once). The id is then checked by
    :func:`verify_plan_against_lock` like any other. Nothing happens when the image is present."""
    from cudastack.osimage.bootstrap import bootstrap_os_image, is_reproducible

    for node in plan.nodes:
        if node.kind != "base-pip":
            continue
        tag = node.build_args.get("OS_IMAGE", "")
        rec = ((lock.get("nodes") or {}).get(node.name) or {}).get("os_image") or {}
        if not tag or rec.get("tag") != tag:
            continue            # the verification names the mismatch
        try:
            client.images.get(tag)
            continue
        except Exception:  # noqa: BLE001 - absent (or unreadable): made below
            pass
        if cache is not None and rec.get("image_id"):
            from cudastack.registry.cache_parents import pull_os_image

            if pull_os_image(cache, tag, rec["image_id"], (lambda m: say(f"{node.name}: {m}")) if say else (lambda m: None)):
                continue
        tool = rec.get("tool") or rec.get("debootstrap") or ""
        if not is_reproducible(tool):
            raise LockError(
                f"nodes.{node.name}.os_image: {tag} is not on this engine and the lock's image "
                f"({str(rec.get('image_id'))[:19]}) was made by {tool or 'an unrecorded tool'}, which does not "
                "reproduce it on another machine. Relock once (`invoke lock ...`): the OS image is then made with "
                "mmdebstrap, whose id any builder gets again; or load the locked image (`docker save` where it was "
                "made, `docker load` here).")
        if say:
            say(f"{node.name}: OS image {tag} is not here; making it again from the locked Release "
                f"({rec.get('release-date')}, {tool})")
        bootstrap_os_image(rec.get("suite") or "bookworm", rec.get("mirror") or "http://deb.debian.org/debian", tag,
                           progress=(lambda m: say(f"  {m}")) if say else None, variant=rec.get("variant") or "minbase",
                           expect_release_sha256=rec.get("release-sha256") or None)


def prepare_locked_build(plan, path: str | Path, *, client=None, check_hashes: bool = True,
                         cache_dirs: Iterable[str | Path] = (), say: Optional[Progress] = None,
                         cache=None) -> dict:
    """For ``invoke build --locked`` (and its dry run): load the lock at ``path``, verify ``plan`` against it
    (LockError naming every stale entry, before anything is built), check every locked sha256 against the
    index or cached files (:func:`verify_locked_hashes`, with ``check_hashes``) and turn the plan into its
    locked build in place (:func:`apply_lock`: hash-checking build args, pinned sdist digests, locked node
    hashes and tags). ``cache``: a :class:`cudastack.build.node_cache.NodeCache` a missing OS image is pulled from
    first. Never writes the lock. Returns the lock."""
    lock = load_lock(path)
    if client is not None:
        ensure_locked_os_image(plan, lock, client, say=say, cache=cache)
    verify_plan_against_lock(plan, lock, client=client, where=str(path))
    if check_hashes:
        logins = {n.build_args.get("PIP_INDEX_URL", ""): n.index_secret for n in plan.nodes
                  if getattr(n, "index_secret", "")}
        result = verify_locked_hashes(lock, cache_dirs=cache_dirs, where=str(path), logins=logins)
        if say:
            say(describe_hash_check(result))
    apply_lock(plan, lock)
    return lock
