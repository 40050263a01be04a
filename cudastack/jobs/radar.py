"""What `invoke outdated` and `invoke scan` do: the upgrade radar per toolchain and the release scans, printed and
written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from cudastack.core.errors import UsageError
from cudastack.jobs.output import json_output


def _int(flag: str, value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"--{flag} {value!r}: give a whole number.") from None


def _index(index, refresh):
    from cudastack.pkgindex.client import Index

    return Index(index or None, refresh=bool(refresh))


def outdated(*, cuda=None, index=None, refresh=False, recipes=None, target_arch="12.0", world_size=8, topology="pcie",
             out=".stack/radar", no_verdicts=False, json_out=None):
    """`invoke outdated`: per component: pinned, newest and newest allowed release, and what holds each back. Its
    flags' values as keywords (see :mod:`cudastack.cli.radar`); raises StackError."""
    with json_output(json_out) as box:
        from cudastack.radar import walk as R
        from cudastack.recipes.load import load_recipes
        from cudastack.pkgindex.client import atomic_write
        from cudastack.plan.rules import parse_target_arch
        if topology not in ("pcie", "nvlink"):
            raise UsageError(f"--topology {topology!r}: use pcie or nvlink.")
        ws = _int("world-size", world_size)
        rs = load_recipes(recipes)
        parse_target_arch(target_arch, rs)       # a bad arch: exit 4 before any download
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
        box["data"] = data
        if out:
            atomic_write((Path(out) / ("radar.json" if not cuda else f"radar-cu{results[0].toolchain}.json")),
                          json.dumps(data, indent=1).encode())
        print(f"index: {ix.url} {ix.stats}", file=sys.stderr)


def scan(*, package=None, versions=None, target_arch="12.0", world_size=8, topology="pcie", index=None, refresh=False,
         all=False, python="3.11", pre=False, json_out=None):
    """`invoke scan`: scan a package's releases and print the first release that lifts each static gate, then the engine
    answers per release read on a site (:func:`cudastack.radar.moves.engine_answers`). Its flags' values as keywords (see :mod:`cudastack.cli.radar`); raises StackError."""
    with json_output(json_out) as box:
        from cudastack.plan.rules import parse_target_arch
        from cudastack.radar import scan as S
        parse_target_arch(target_arch)           # a bad arch: exit 4 before any download
        if not package:
            raise UsageError("Give --package NAME (e.g. --package flashinfer-python).")
        ix = _index(index, refresh)
        rep = S.scan_package(ix, package, versions, str(target_arch), world_size=_int("world-size", world_size),
                             topology=topology, python=str(python), scan_all=bool(all), prereleases=bool(pre),
                             say=lambda m: print(m, file=sys.stderr, flush=True))
        print(S.render_scan(rep))
        box["data"] = S.scan_json(rep)
        from cudastack.radar import moves
        from cudastack.recipes.load import load_recipes
        ans = moves.engine_answers(ix, load_recipes(), package, rep.versions, rep.target, _int("world-size", world_size),
                                   topology, say=lambda m: print(m, file=sys.stderr, flush=True))
        print(moves.render_engine_answers(ans, package))
        box["data"]["engine_answers"] = ans
        print(f"index: {ix.url} {ix.stats}", file=sys.stderr)
