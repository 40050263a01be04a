"""What a move to a newer release would change, in the validation suite's words: the candidate set laid out as a
site (:mod:`cudastack.radar.sitefetch`) and read by the suite's own static tier (:mod:`stackprobe.site`), old set
against new.

For one component of one image chain (:class:`cudastack.radar.checks.Checker`), :func:`candidate` makes the set a
move gives:

* a newer engine (vllm, sglang) with what it pins: each stack component its ``Requires-Dist`` excludes moves to the
  newest release it admits; where no release on the index matches (vllm 0.34.0 pins ``flashinfer-python==0.7.3``,
  which PyPI lacks) the set is a what-if with the component's newest release, and the break is stated;
* a newer library under the engine that would take it; where the engine's pin (or another component's) excludes
  it, the set is a what-if that breaks that pin, stated.

:func:`move_text` runs the tier on the chain's pinned set and on each candidate and says, per engine and path, old
status -> new status with the deciding line (the new verdict's cause), then what the move costs beyond the
statuses (:func:`stackprobe.site.move_costs`: an ahead-of-time module to rebuild, a tune cache to redo), and the
pins it breaks. A tier run is cached under ``<cache>/siteruns/`` by the site's file hashes, the question asked and a
digest of the suite's sources, so a second radar reads no file and runs no reader.

What a site cannot answer is said where the user reads: arch coverage of a compiled wheel needs its binaries (a
kernel wheel's coverage is read by :func:`cudastack.radar.gates.kernel_gates` from the whole file, the one
download the radar makes); torch's CUDA build comes from its ``Requires-Dist``, its arch list is not read.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from cudastack.core.errors import StackError
from cudastack.pkgindex.client import atomic_write
from cudastack.radar.checks import Checker, KERNELS
from cudastack.radar.sitefetch import SOURCE_DISTS, lay_out
from stackprobe import api as sp

#: components a site leaves out: built from source (no wheel to lay out) or data-only wheels no reader opens
NOT_LAID_OUT = {"flash-attn", "flashinfer-cubin", "cuda-toolkit"}
_CAUSE = 260            # characters of a deciding line kept in the table (the JSON keeps it whole)


@dataclass
class Candidate:
    """A set of releases to lay out: ``versions`` (canonical name -> version), the pins the set breaks (each one
    sentence) and notes (what could not be laid out)."""

    versions: dict[str, str]
    breaks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def base_set(ck: Checker) -> dict[str, str]:
    """The chain's pinned releases that a site holds (canonical name -> version)."""
    return {n: p.version for n, p in ck.pins.items() if n in ck.stack and n not in NOT_LAID_OUT
            and p.method == "wheel"}


def _newest_matching(ck: Checker, dep: str, spec) -> Version | None:
    for v in reversed(ck.index.project(dep).versions()):
        if spec.contains(v, prereleases=True) and ck.file_for(dep, v) is not None:
            return v
    return None


def _newest_installable(ck: Checker, dep: str) -> Version | None:
    return next((v for v in reversed(ck.index.project(dep).versions()) if ck.file_for(dep, v) is not None), None)


def candidate(ck: Checker, name: str, v: Version) -> Candidate:
    """The set a move of ``name`` to ``v`` gives in ``ck``'s chain (see the module docstring)."""
    name = canonicalize_name(name)
    c = Candidate(dict(base_set(ck)))
    c.versions[name] = str(v)
    own, fn = ck.requires(name, v)
    if name == ck.engine:
        for dep, r in own.items():
            if dep == name or dep not in c.versions or r.specifier.contains(c.versions[dep], prereleases=True):
                continue
            hit = _newest_matching(ck, dep, r.specifier)
            if hit is not None:
                c.versions[dep] = str(hit)
                continue
            alt = _newest_installable(ck, dep)
            c.breaks.append(f"not installable: {name} {v} Requires-Dist `{r}` and no {dep} release on {ck.index.url} "
                            f"matches; what-if read with {dep} {alt}" if alt else
                            f"not installable: {name} {v} Requires-Dist `{r}` and {dep} has no release to read")
            if alt is not None:
                c.versions[dep] = str(alt)
        return c
    eng = ck.pins.get(ck.engine)
    if eng is not None:
        ereqs, efn = ck.requires(ck.engine, Version(eng.version))
        pin = ereqs.get(name)
        if pin is not None and not pin.specifier.contains(v, prereleases=True):
            c.breaks.append(f"what-if: breaks {ck.engine} {eng.version}'s pin `{pin}` ({efn} METADATA)")
    for dep, r in own.items():
        if dep != name and dep in c.versions and not r.specifier.contains(c.versions[dep], prereleases=True):
            c.breaks.append(f"what-if: {name} {v} Requires-Dist `{r}` ({fn}), the chain has {dep} {c.versions[dep]}")
    return c


def roots(ck: Checker, c: Candidate) -> list[Path]:
    """The site folders of candidate ``c`` (laid out on first use; notes on ``c`` for what has no wheel)."""
    out = []
    for dist, ver in sorted(c.versions.items()):
        f = ck.file_for(dist, Version(ver))
        if f is None or f.kind != "wheel":
            c.notes.append(f"{dist} {ver} not laid out: no wheel for this toolchain's Python")
            continue
        out.append(lay_out(ck.index, f, "py" if dist in SOURCE_DISTS else "meta"))
    return out


def run_site(ck: Checker, c: Candidate, target: str, world_size: int, topology: str) -> dict:
    """The static tier's result (:func:`stackprobe.site.run`) on candidate ``c``, cached (see the module
    docstring). Raises StackError-free :class:`stackprobe.site.SiteError` when the tier cannot run."""
    rs = roots(ck, c)
    toolkit = ".".join(ck.tc.cuda_version.split(".")[:2])
    key = hashlib.sha256(json.dumps([[p.name for p in rs], target, world_size, topology, ck.engine, toolkit,
                                     sp.suite_digest()]).encode()).hexdigest()[:20]
    path = ck.index.cache / "siteruns" / f"{key}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    res = sp.site_run(rs, target, world_size=world_size, topology=topology, engine=ck.engine, toolkit=toolkit)
    res["laid_out"] = [p.name for p in rs]
    atomic_write(path, json.dumps(res, default=str).encode())
    ck.index.stats["tier_runs"] = ck.index.stats.get("tier_runs", 0) + 1
    return res


def _costs(ck: Checker, old_roots: list[Path], new_roots: list[Path]) -> list[str]:
    """:func:`stackprobe.site.move_costs`, cached like a tier run (it reads every FlashInfer source file twice)."""
    key = hashlib.sha256(json.dumps([[p.name for p in old_roots], [p.name for p in new_roots],
                                     sp.suite_digest()]).encode()).hexdigest()[:20]
    path = ck.index.cache / "siteruns" / f"costs-{key}.json"
    if path.is_file():
        try:
            return list(json.loads(path.read_text()))
        except ValueError:
            pass
    costs = sp.move_costs(old_roots, new_roots)
    atomic_write(path, json.dumps(costs).encode())
    return costs


def _cut(text: str) -> str:
    return text if len(text) <= _CAUSE else text[:_CAUSE - 3].rstrip() + "..."


def describe(ck: Checker, name: str, v: Version, label: str, target: str, world_size: int, topology: str,
             base: dict) -> tuple[str, dict]:
    """One move's sentence and its JSON: ``"<v> (<label>): <breaks>; <engine> <path>: <old> -> <new> (<deciding>);
    ...; costs: ..."``. ``base``: the tier's result on the pinned set."""
    c = candidate(ck, name, v)
    new = run_site(ck, c, target, world_size, topology)
    moved = sp.site_changes(base, new)
    old_roots = [ck.index.cache / "site" / n for n in base.get("laid_out", [])]
    new_roots = [ck.index.cache / "site" / n for n in new.get("laid_out", [])]
    costs = _costs(ck, old_roots, new_roots)
    others = {d: x for d, x in c.versions.items() if d != name and base_set(ck).get(d) != x}
    parts = []
    if others:
        parts.append("with " + ", ".join(f"{d} {x}" for d, x in sorted(others.items())))
    parts += c.breaks
    if moved:
        parts += [f"{m['engine']} {m['backend']}: {m['old']} -> {m['new']} ({_cut(m['deciding'])})" for m in moved]
    else:
        parts.append(f"no engine or library status changes ({ck.engine}'s answers read on both sets)")
    if costs:
        parts.append("costs: " + "; ".join(costs))
    parts += c.notes
    detail = {"version": str(v), "label": label, "set": c.versions, "breaks": c.breaks, "changes": moved,
              "costs": costs, "headline": {"old": base.get("headline"), "new": new.get("headline")}, "notes": c.notes}
    return f"{v} ({label}): " + "; ".join(parts), detail


def statuses_of_base(ck: Checker, target: str, world_size: int, topology: str) -> dict:
    """The tier's result on the chain's pinned set."""
    return run_site(ck, Candidate(base_set(ck)), target, world_size, topology)


def kernel_coverage(ck: Checker, name: str, pv: Version, v: Version, target, world_size: int, topology: str) -> str:
    """Arch coverage of a compiled kernel wheel moved from ``pv`` to ``v`` (the whole files: metadata cannot decide
    it), as ``"arch coverage <old> -> <new>"`` or "" when unchanged."""
    if name not in KERNELS:
        return ""
    from cudastack.radar.gates import scan_release
    try:
        a = scan_release(ck.index, name, pv, target, world_size=world_size, topology=topology, python=ck.python)
        b = scan_release(ck.index, name, v, target, world_size=world_size, topology=topology, python=ck.python)
    except StackError as e:
        return f"arch coverage not read: {e}"
    out = []
    for g in sorted(set(a.gates) | set(b.gates)):
        ga, gb = a.gates.get(g), b.gates.get(g)
        if ga is None or gb is None or ga.admits != gb.admits:
            out.append(f"{g} {getattr(ga, 'admits', 'absent')} -> {getattr(gb, 'admits', 'absent')}")
    return "; ".join(out)


# ------------------------------------------------------------------------------------ invoke scan: engine answers
def chain_for(recipes, package: str):
    """(toolchain, runtime node) of the newest toolchain whose image chain installs ``package`` (an engine's own
    chain first), or None when no chain does."""
    from cudastack.radar.checks import engine_runtimes, recipe_pins

    name = canonicalize_name(package)
    for tc_name in reversed(list(recipes.toolchains)):
        tc = recipes.toolchain(tc_name)
        rts = engine_runtimes(recipes, tc)
        for rt in sorted(rts, key=lambda r: rts[r] != name):
            if name in recipe_pins(recipes, tc, rt):
                return tc, rt
    return None


def engine_answers(index, recipes, package: str, versions: list[Version], target: str = "12.0", world_size: int = 8,
                   topology: str = "pcie", say=lambda m: None) -> dict:
    """The engine answers for each release of ``package`` in ``versions``, each read on a site: the chain that
    installs it (:func:`chain_for`) with that release moved in (:func:`candidate`: an engine with what it pins, a
    library under its engine as a what-if). Returns ``{"toolchain", "runtime", "engine", "releases": {version:
    {"set", "breaks", "headline", "statuses": {backend: status}}}}``, or ``{"not_read": why}`` when no chain
    installs the package."""
    found = chain_for(recipes, package)
    if found is None:
        return {"not_read": f"no image chain in the recipes installs {package}: no engine reads it"}
    tc, rt = found
    ck = Checker(index, recipes, tc, rt)
    out: dict = {"toolchain": tc.name, "runtime": rt, "engine": ck.engine, "releases": {}}
    for v in versions:
        say(f"reading {package} {v} as a site in {tc.name}'s {ck.engine} chain")
        c = candidate(ck, package, v)
        try:
            res = run_site(ck, c, target, world_size, topology)
        except (StackError, sp.SiteError) as e:
            out["releases"][str(v)] = {"set": c.versions, "breaks": c.breaks, "not_read": str(e)}
            continue
        st = {b: sp.site_status_word(s) for (who, b), s in sp.site_statuses(res).items() if who == ck.engine}
        out["releases"][str(v)] = {"set": c.versions, "breaks": c.breaks, "headline": res["headline"].get(ck.engine),
                                   "statuses": st}
    return out


def render_engine_answers(ans: dict, package: str) -> str:
    """The engine answers of :func:`engine_answers` as text: per release its set, the pins it breaks and each
    backend's status, and where a status moved from the release before."""
    if "not_read" in ans:
        return f"engine answers: not read: {ans['not_read']}"
    lines = [f"engine answers ({ans['engine']}, read on a site of toolchain {ans['toolchain']}'s {ans['runtime']} chain "
             f"with {package} moved in; validate's own readers):"]
    prev: dict = {}
    for v, r in ans["releases"].items():
        lines.append(f"  {package} {v}: set " + ", ".join(f"{d} {x}" for d, x in sorted(r["set"].items())))
        for b in r["breaks"]:
            lines.append(f"    {b}")
        if "not_read" in r:
            lines.append(f"    not read: {r['not_read']}")
            continue
        for b, s in r["statuses"].items():
            moved = f" (was {prev[b]})" if b in prev and prev[b] != s else ""
            lines.append(f"    {b}: {s}{moved}")
        prev = r["statuses"]
    return "\n".join(lines)
