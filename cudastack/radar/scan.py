"""Static scans of released packages, straight from the index: no install, no image, no GPU.

:func:`scan_package` scans a range of a package's releases and finds, per gate, the first release that
lifts it; :func:`render_scan` and :func:`scan_json` report the answer. Reading one release's gates
(choosing its file, unpacking it, the suite's readers, the cache by sha256) lives in
:mod:`cudastack.radar.gates`, whose public names are re-exported here.

:func:`first_lift` finds the first release that lifts a gate by bisection over the ordered releases.
It ASSUMES the gate is monotone over releases (blocked up to some release, admitted from then on); it
scans the two neighbours of the answer (the release before must block, the one after must admit) and
reports any scanned release that contradicts the assumption (``monotone: False``, with the releases).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from cudastack.core.errors import UsageError
from cudastack.pkgindex.client import Index
from cudastack.radar.gates import ReleaseScan, scan_release
from cudastack.plan.rules import parse_target_arch


# ---------------------------------------------------------------------------------- ranges + bisection
def parse_range(text: str | None) -> tuple[Version | None, Version | None]:
    """``"A..B"`` (inclusive), ``"A.."``, ``"..B"`` or ``"A"`` (one release) -> bounds. UsageError otherwise."""
    if not text:
        return None, None
    try:
        if ".." in text:
            a, b = text.split("..", 1)
            return (Version(a) if a else None), (Version(b) if b else None)
        v = Version(text)
        return v, v
    except InvalidVersion:
        raise UsageError(f"--versions {text!r}: write A..B with PEP 440 versions (e.g. 0.6.10..0.7.4), A.. or ..B.") from None


def releases_in_range(index: Index, package: str, lo: Version | None, hi: Version | None,
                      prereleases: bool = False) -> list[Version]:
    """Releases of ``package`` within ``[lo, hi]``, ascending. UsageError when none."""
    vs = [v for v in index.project(package).versions(prereleases)
          if (lo is None or v >= lo) and (hi is None or v <= hi)]
    if not vs:
        raise UsageError(f"{package} has no release between {lo or 'the first'} and {hi or 'the newest'} on "
                         f"{index.url}; widen --versions.")
    return vs


def first_lift(versions: list[Version], admits: Callable[[Version], bool | None]) -> dict:
    """The first release whose gate admits, by bisection over ``versions`` (ascending), assuming the
    gate is monotone (blocked, then admitted for good). ``admits(v)`` scans one release (None counts as
    blocked and is reported). Returns {"first": Version | None, "state": "lifted-in-range" |
    "admitted-throughout" | "never-lifted", "scanned": {version: admits}, "before": Version | None,
    "after": Version | None, "monotone": bool, "contradictions": [versions], "unreadable": [versions]}."""
    seen: dict[Version, bool | None] = {}

    def a(i: int) -> bool:
        v = versions[i]
        if v not in seen:
            seen[v] = admits(v)
        return bool(seen[v])

    n = len(versions)
    out: dict[str, Any] = {"first": None, "before": None, "after": None}
    if not a(n - 1):
        out["state"] = "never-lifted"
    elif a(0):
        out.update(state="admitted-throughout", first=versions[0])
        if n > 1:
            a(1)
    else:
        lo, hi = 0, n - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a(mid):
                hi = mid
            else:
                lo = mid
        out.update(state="lifted-in-range", first=versions[hi], before=versions[lo])
        if hi + 1 < n:
            a(hi + 1)
            out["after"] = versions[hi + 1]
    first = out["first"]
    contra = [v for v, ok in seen.items() if (first is None and ok) or (first is not None and (bool(ok) != (v >= first)))]
    out.update(scanned=dict(sorted(seen.items())), monotone=not contra, contradictions=sorted(contra),
               unreadable=sorted(v for v, ok in seen.items() if ok is None))
    return out


@dataclass
class ScanReport:
    package: str
    target: str
    versions: list[Version]
    scans: dict[Version, ReleaseScan]
    lifts: dict[str, dict]
    mode: str


def scan_package(index: Index, package: str, versions: str | None = None, target_arch: str = "12.0", *,
                 world_size: int = 8, topology: str = "pcie", python: str = "3.11", scan_all: bool = False,
                 prereleases: bool = False, say: Callable[[str], None] = lambda m: None) -> ScanReport:
    """Scan ``package``'s releases in ``versions`` ("A..B") for ``target_arch`` and find, for each gate,
    the first release that lifts it (bisection; every release with ``scan_all``). The gate names come
    from the newest release in range (a gate that exists only in newer files is still found)."""
    target = parse_target_arch(target_arch)
    if topology not in ("pcie", "nvlink"):
        raise UsageError(f"--topology {topology!r}: use pcie or nvlink.")
    lo, hi = parse_range(versions)
    vs = releases_in_range(index, package, lo, hi, prereleases)
    scans: dict[Version, ReleaseScan] = {}

    def get(v: Version) -> ReleaseScan:
        if v not in scans:
            s = scan_release(index, package, v, target, world_size=world_size, topology=topology, python=python)
            say(f"scanned {package} {v} ({s.filename}{', cached' if s.cached else ''})")
            scans[v] = s
        return scans[v]

    if scan_all:
        for v in vs:
            get(v)
    newest = get(vs[-1])
    names = list(newest.gates)
    if len(vs) > 1:
        names += [g for g in get(vs[0]).gates if g not in names]
    lifts = {}
    for name in names:
        def admits(v: Version, name=name) -> bool | None:
            g = get(v).gates.get(name)
            return None if g is None else g.admits
        if scan_all:
            seen = {v: admits(v) for v in vs}
            res = first_lift(vs, lambda v: seen[v])
            first = res["first"]
            contra = [v for v, ok in seen.items() if bool(ok) != (first is not None and v >= first)]
            res.update(scanned=seen, monotone=not contra, contradictions=contra,
                       unreadable=[v for v, ok in seen.items() if ok is None])
        else:
            res = first_lift(vs, admits)
        lifts[name] = res
    return ScanReport(package, target.cc, vs, scans, lifts, "all" if scan_all else "bisection")


def _fmt(value) -> str:
    if isinstance(value, dict) and "level" in value:
        s = f"{value['level']} ({value['libraries']} libraries)"
        if value.get("without"):
            s += f", none for: {', '.join(value['without'][:3])}"
        return s
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def render_scan(rep: ScanReport) -> str:
    """Text report: per gate, the first release that lifts it, its neighbours and the value read."""
    lines = [f"{rep.package}: {len(rep.versions)} releases {rep.versions[0]} .. {rep.versions[-1]}, target {rep.target}, "
             f"{rep.mode} ({len(rep.scans)} scanned, each from its own file)"]
    if rep.mode == "bisection":
        lines.append("Assumption: each gate is monotone over releases (blocked, then admitted for good); the "
                     "neighbours of every answer are scanned to check it.")
    for name, r in rep.lifts.items():
        first = r["first"]
        if r["state"] == "never-lifted":
            g = rep.scans[rep.versions[-1]].gates.get(name)
            head = (f"  {name}: no release in range lifts it; newest {rep.versions[-1]} reads "
                    f"{_fmt(g.value) if g else 'nothing'}")
        elif r["state"] == "admitted-throughout":
            g = rep.scans[first].gates[name]
            head = f"  {name}: already admitted by {first}, the first release in range ({_fmt(g.value)})"
        else:
            g = rep.scans[first].gates[name]
            gb = rep.scans[r["before"]].gates.get(name)
            head = (f"  {name}: first release that lifts it: {first} ({_fmt(g.value)}; {g.where}); "
                    f"{r['before']} before it: {_fmt(gb.value) if gb else 'absent'}")
            if r.get("after") is not None:
                ga = rep.scans[r["after"]].gates.get(name)
                head += f"; {r['after']} after it: {_fmt(ga.value) if ga else 'absent'}"
        lines.append(head)
        if not r["monotone"]:
            lines.append(f"    NOT MONOTONE: {', '.join(map(str, r['contradictions']))} contradict(s) the answer; "
                         f"scan every release with --all to see each one")
        if r["unreadable"]:
            lines.append(f"    unreadable or not applicable in: {', '.join(map(str, r['unreadable']))}")
    if rep.mode == "all":
        lines.append("")
        for v in rep.versions:
            s = rep.scans[v]
            lines.append(f"  {v}: " + "; ".join(f"{k}={'yes' if g.admits else 'no' if g.admits is False else '-'}"
                                                 for k, g in s.gates.items()))
    return "\n".join(lines)


def scan_json(rep: ScanReport) -> dict:
    return {"package": rep.package, "target": rep.target, "mode": rep.mode, "versions": [str(v) for v in rep.versions],
            "lifts": {k: {kk: (str(vv) if isinstance(vv, Version) else
                               {str(a): b for a, b in vv.items()} if isinstance(vv, dict) else
                               [str(x) for x in vv] if isinstance(vv, list) else vv)
                          for kk, vv in r.items()} for k, r in rep.lifts.items()},
            "scans": {str(v): s.to_json() for v, s in rep.scans.items()}}
