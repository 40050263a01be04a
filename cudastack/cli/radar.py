"""Invoke tasks (upgrade radar). Thin: parse flags, call cudastack.radar.walk / cudastack.radar.scan, map StackError
to its exit code."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from invoke import Exit, task

from cudastack.core.errors import StackError, UsageError

_HELP = {
    "cuda": "Toolchain as named in recipes/toolchains.yaml (e.g. 13.2). Default: every toolchain.",
    "index": "PEP 691 simple index URL (default https://pypi.org/simple, or $CUDASTACK_INDEX).",
    "refresh": "Ask the index again for every project page (pages are otherwise reused for an hour).",
    "recipes": "Recipes folder (toolchains.yaml + one file per component). Default: the project's recipes/.",
    "target_arch": "Target compute capability (default 12.0).",
    "world_size": "Tensor-parallel size the engine gates are read for (default 8).",
    "topology": "GPU interconnect the engine gates are read for: pcie (default) or nvlink.",
    "out": "Folder for the Markdown tables (cu<X>.md) and radar.json. Default: .stack/radar (ignored by git).",
    "no_verdicts": "Skip the scans of newer releases (no downloads; the last column says 'not scanned').",
    "package": "Package to scan, as the index names it (flashinfer-python, sglang, sglang-kernel, ...).",
    "versions": "Releases to scan: A..B (inclusive), A.., ..B or one version. Default: every release.",
    "all": "Scan every release in range (no bisection) and print each one's gates.",
    "python": "Python the picked wheel must install on (default 3.11, the pip base's).",
    "pre": "Include pre-releases.",
    "json_out": "Also write the result as JSON to this file.",
}


def _int(flag: str, value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"--{flag} {value!r}: give a whole number.") from None


def _index(index, refresh):
    from cudastack.pkgindex.client import Index

    return Index(index or None, refresh=bool(refresh))


@task(help={k: _HELP[k] for k in ("cuda", "index", "refresh", "recipes", "target_arch", "world_size", "topology",
                                  "out", "no_verdicts", "json_out")}, auto_shortflags=False)
def outdated(c, cuda=None, index=None, refresh=False, recipes=None, target_arch="12.0", world_size=8, topology="pcie",
             out=".stack/radar", no_verdicts=False, json_out=None):
    """Per component: pinned, newest and newest allowed release, and what holds each back.

    Per toolchain and component: pinned, newest, newest the engine's pins allow, what holds it back, and
    what a move would change in the static verdicts. Writes one Markdown table per toolchain to --out."""
    from cudastack.radar import walk as R
    from cudastack.recipes.load import load_recipes
    from cudastack.pkgindex.client import atomic_write

    try:
        if topology not in ("pcie", "nvlink"):
            raise UsageError(f"--topology {topology!r}: use pcie or nvlink.")
        ws = _int("world-size", world_size)
        rs = load_recipes(recipes)
        ix = _index(index, refresh)
        results = []
        for name, rt in ((n, rt) for n in R.toolchain_names(rs, cuda) for rt in R.runtimes(rs, n)):
            r = R.radar(name, index=ix, recipes=rs, target_arch=str(target_arch), world_size=ws, topology=topology,
                        verdicts=not no_verdicts, say=lambda m: print(m, file=sys.stderr, flush=True),
                        runtime=rt or None)
            results.append(r)
            print(R.render_text(r))
            if out:
                path = Path(out) / R.out_name(r.toolchain, r.runtime)
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, R.render_markdown(r).encode())
                print(f"wrote {path}", file=sys.stderr)
        data = [R.to_json(r) for r in results]
        if out:
            atomic_write((Path(out) / ("radar.json" if not cuda else f"radar-cu{results[0].toolchain}.json")),
                          json.dumps(data, indent=1).encode())
        if json_out:
            atomic_write(Path(json_out), json.dumps(data, indent=1).encode())
        print(f"index: {ix.url} {ix.stats}", file=sys.stderr)
    except StackError as exc:
        raise Exit(f"error: {exc}", code=exc.exit_code)


@task(help={k: _HELP[k] for k in ("package", "versions", "target_arch", "world_size", "topology", "index", "refresh",
                                  "all", "python", "pre", "json_out")}, auto_shortflags=False)
def scan(c, package=None, versions=None, target_arch="12.0", world_size=8, topology="pcie", index=None, refresh=False,
         all=False, python="3.11", pre=False, json_out=None):  # noqa: A002 - the flag is --all
    """Scan a package's releases and print the first release that lifts each static gate.

    Downloads releases (no install), reads the suite's static gates and arch coverage from each release's own
    files, and bisects over the releases for the first one that lifts each gate."""
    from cudastack.radar import scan as S
    from cudastack.pkgindex.client import atomic_write

    try:
        if not package:
            raise UsageError("Give --package NAME (e.g. --package flashinfer-python).")
        ix = _index(index, refresh)
        rep = S.scan_package(ix, package, versions, str(target_arch), world_size=_int("world-size", world_size),
                             topology=topology, python=str(python), scan_all=bool(all), prereleases=bool(pre),
                             say=lambda m: print(m, file=sys.stderr, flush=True))
        print(S.render_scan(rep))
        if json_out:
            atomic_write(Path(json_out), json.dumps(S.scan_json(rep), indent=1, default=str).encode())
        print(f"index: {ix.url} {ix.stats}", file=sys.stderr)
    except StackError as exc:
        raise Exit(f"error: {exc}", code=exc.exit_code)


TASKS = [outdated, scan]
