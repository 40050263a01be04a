"""What a node's ``docker build`` is given: a fresh build-context folder (the recipe's sources, a patched sdist
fetched from a PEP 691 simple index and checked against the lock's sha256, hard links to the parent wheels
nodes' wheels for a runtime), the extra build args (``WHEEL_NAMES``, ``WHEELS_LOCKED``), whether a node is
already cached (its tag exists and, for a wheels node, the wheelhouse lists its wheels), and the LockError a
locked build's log shows when pip refused a file whose hash differs from the lock. The run loop that uses
them is :func:`cudastack.build.executor.run_build`; callers may import these names from :mod:`cudastack.build.executor`.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

from cudastack.core.credentials import redact, scrub
from cudastack.build.engine import Engine
from cudastack.core.errors import BuildError, EnvironmentError_, LockError
from cudastack.plan.planner import BuildPlan, PlannedNode
from cudastack.build.wheelhouse import Wheelhouse, sha256_file

Say = Callable[[str], None]
_CTX_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".pytest_cache", ".git")


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
    from cudastack.plan.sources import unpack

    root = unpack(archive, dest.parent)
    tmp = root if root.name.startswith(".unpack-") else root.parent     # the temporary folder unpack made
    try:
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


#: image label of a runtime node: :func:`runtime_wheels_digest` of the wheelhouse wheels it installed
WHEELS_LABEL = "org.cudastack.wheels"


def runtime_wheels_digest(wheelhouse: Wheelhouse, node: PlannedNode) -> str:
    """sha256 (hex, 64 characters) over the ``file sha256`` lines, sorted, of the wheelhouse wheels ``node`` (a
    runtime) installs: those its wheels parents' manifest entries list now. A runtime image carries it as the
    label :data:`WHEELS_LABEL`; a node's tag is keyed by its inputs, not by its parents' wheel bytes, so a wheels
    node exported again with other bytes (a compile that is not bit-for-bit reproducible, after BuildKit's cache
    was pruned) would otherwise leave a runtime image that installed other wheels than the wheelhouse records."""
    lines = sorted(f"{f} {d}" for p in node.parents for f, d in ((wheelhouse.entry(p) or {}).get("wheels") or {}).items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def runtime_wheels_differ(engine: Engine, wheelhouse: Wheelhouse, node: PlannedNode) -> str:
    """Why the existing runtime image ``node.tag`` cannot be kept ("" when it can): it installed other wheels than
    the wheelhouse lists for its parents now, or it carries no :data:`WHEELS_LABEL` (built before images recorded
    it). Call it once the parents' wheels are in the wheelhouse."""
    if node.kind != "runtime":
        return ""
    got = (engine.inspect(node.tag).get("labels") or {}).get(WHEELS_LABEL)
    if got is None:
        return "its image does not record which wheels it installed (built before images carried that label)"
    if got != runtime_wheels_digest(wheelhouse, node):
        return ("its image installed other wheels than the wheelhouse lists now (a wheels node was exported again "
                "with other bytes)")
    return ""


def node_cached(engine: Engine, wheelhouse: Wheelhouse, node: PlannedNode) -> bool:
    """A node is cached when its tag exists and, for wheels nodes, the wheelhouse holds its wheels."""
    if not engine.exists(node.tag):
        return False
    if node.kind == "wheels":
        return wheelhouse.has(node)
    return True


def cached_map(engine: Engine, wheelhouse: Wheelhouse, plan: BuildPlan) -> dict[str, bool]:
    """{node name: cached}; a runtime whose parents are all cached is cached only when its image installed the wheels
    the wheelhouse lists now (:func:`runtime_wheels_differ`), so the plan, the dry run and the disk check count it
    (a parent exported or built in this run is checked again when the runtime is reached)."""
    out = {n.name: node_cached(engine, wheelhouse, n) for n in plan.nodes}
    for n in plan.nodes:
        if (n.kind == "runtime" and out[n.name] and all(out.get(p, False) for p in n.parents)
                and runtime_wheels_differ(engine, wheelhouse, n)):
            out[n.name] = False
    return out


def _make_context(ctx_root: Path, node: PlannedNode, wheelhouse: Wheelhouse, plan: BuildPlan, *,
                  ca_bundle: str | None = None, say: Say | None = None) -> tuple[Path, dict]:
    """A fresh build-context folder for ``node``; returns it and extra build args (WHEEL_NAMES) plus, under
    the key ``_sdist``, what was fetched for a patched sdist and, under ``_source``, what
    :func:`cudastack.plan.sources.materialise` put into src/ for a url, git or patched path source."""
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
        from cudastack.plan.sources import materialise

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
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    in_closure = {canonicalize_name(Requirement(ln.split()[0]).name) for ln in closure_text.splitlines()
                  if "==" in ln and not ln.lstrip().startswith(("#", "--"))}
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


#: free disk kept beyond the nodes' estimates (GiB) by the pre-flight check
DISK_MARGIN_GIB = 2.0
#: set to 1 to skip the free-disk pre-flight (a data root whose free space this host cannot see, such as a thin pool
#: or a remote engine's; the test suite, whose dry runs plan stacks for another machine): the build and the dry run
#: then say "not checked" instead of comparing
NO_DISK_CHECK = "CUDASTACK_NO_DISK_CHECK"


def _free_gib(path: Path) -> float:
    """Free space (GiB) of the filesystem that holds ``path``, or that will hold it: its nearest existing
    folder is measured, so a state folder not made yet is checked where it will be made."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free / 2**30


def disk_refusal(engine: Engine, plan: BuildPlan, cached: dict[str, bool], state_dir: Path) -> tuple[float, str, "EnvironmentError_ | None"]:
    """The disk check a build makes before its first node, without side effects (the dry run shows it):
    ``(need_gib, report, refusal)``. ``need_gib``: the nodes to build's ``est_disk_gib`` summed; ``report``: one
    line naming each place checked (the engine's data root, where the images go, and the state folder, where
    the wheelhouse and logs go) with its free GiB; ``refusal``: the EnvironmentError_ (exit 5) the build raises
    when either has less than ``need_gib`` + DISK_MARGIN_GIB free, else None."""
    need = sum(n.est_disk_gib for n in plan.nodes if not cached.get(n.name))
    if need <= 0:
        return 0.0, "disk: nothing to build, no space needed", None
    if os.environ.get(NO_DISK_CHECK, "") not in ("", "0"):
        return need, (f"disk: about {need:g} GiB needed; not checked ({NO_DISK_CHECK}={os.environ[NO_DISK_CHECK]}: "
                      "free space is yours to watch)"), None
    root, free = engine.root_dir_free_gib()
    checks = [(root, free), (str(state_dir), _free_gib(state_dir))]
    report = (f"disk: about {need:g} GiB needed (+{DISK_MARGIN_GIB:g} GiB margin); "
              + "; ".join(f"{where} has {'unknown (not on this host)' if gib is None else f'{gib:.1f} GiB'} free"
                          for where, gib in checks))
    for where, gib in checks:
        if gib is not None and gib < need + DISK_MARGIN_GIB:
            return need, report, EnvironmentError_(
                f"Too little free disk: {where} has {gib:.1f} GiB free, but the {sum(not cached.get(n.name) for n in plan.nodes)} "
                f"nodes to build need about {need:g} GiB (+{DISK_MARGIN_GIB:g} GiB margin). Free space "
                "(`docker image prune`, `docker builder prune`) or move the Docker data root / --state-dir.")
    return need, report, None


def _preflight_disk(engine: Engine, plan: BuildPlan, cached: dict[str, bool], state_dir: Path, say: Say) -> float:
    """Refuse (EnvironmentError_, exit 5) a build the disk cannot hold (:func:`disk_refusal`), else say the
    need and the free space; returns the need in GiB."""
    need, report, refusal = disk_refusal(engine, plan, cached, state_dir)
    if refusal is not None:
        raise refusal
    if need > 0:
        state_dir.mkdir(parents=True, exist_ok=True)
        say(report)
    return need


def _ensure_os_image(engine: Engine, plan: BuildPlan, say: Say) -> None:
    if plan.base_kind != "pip" or not plan.base_image:
        return
    base = plan.nodes[0]
    if not base.kind.startswith("base"):
        return
    if engine.exists(plan.base_image):
        return
    from cudastack.osimage.bootstrap import bootstrap_os_image

    say(f"OS image {plan.base_image} is missing: bootstrapping Debian {plan.os_suite} (mmdebstrap + docker load)")
    bootstrap_os_image(plan.os_suite or "bookworm", tag=plan.base_image, progress=lambda s: say(f"  {s}"),
                       docker_cli=engine.buildkit.docker)
